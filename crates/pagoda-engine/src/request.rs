//! What callers hand the engine and what they get back: [`EngineRequest`], the stream of
//! [`TokenEvent`]s of one request, and [`RequestTimings`].
//!
//! Invariant: every request's stream ends with exactly one `Finished` event per choice
//! (`index` `0..n`), or one `Error` event; nothing follows them.

use crate::sampling::{SampledToken, SamplingParams};
use crate::stop::FinishReason;
use pagoda_model::arch::LoraWeights;
use std::time::{Duration, Instant};

/// Identifies a request for [`EngineHandle::abort`](crate::EngineHandle::abort).
pub type RequestId = u64;

/// One generation request, already templated and tokenized.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    /// Prompt token ids (BOS included if the model wants it).
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Most tokens to generate per choice; generation also ends at the model's context length.
    pub max_tokens: usize,
    /// The client chose `max_tokens`; `false` when a front end filled it in from a server
    /// default. Shortest-job-first scheduling predicts the output's length from an explicit
    /// `max_tokens`, and from the engine's running estimate otherwise.
    pub max_tokens_explicit: bool,
    /// Stop strings: a choice ends before the first occurrence, which is not returned.
    pub stop: Vec<String>,
    /// Extra token ids that end a choice (besides the model's EOS tokens).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating through EOS tokens (benchmarks).
    pub ignore_eos: bool,
    /// Scheduling priority under the `priority` policy: higher runs first.
    pub priority: i32,
    /// Choices sampled from the one prompt (`n` in the OpenAI API); they share its KV blocks.
    pub n: usize,
    /// Use speculative decoding when the engine has it (ignored when `n > 1`).
    pub speculative: bool,
    /// A LoRA adapter applied (unmerged) to this request's rows; `None`: the base model. The
    /// handle keeps the adapter alive until the request ends, even if it is unloaded.
    pub adapter: Option<LoraWeights>,
    /// What the output must match, enforced while decoding (a token mask per choice);
    /// `None`: free text.
    pub constraint: Option<ConstraintSpec>,
    /// Keep control tokens (other than the ones that end a choice) in the output's text:
    /// a family whose calls or reasoning are marked by control tokens (Mistral's
    /// `[TOOL_CALLS]`, Gemma 4's `<|tool_call>`) is parsed from them.
    pub keep_special_tokens: bool,
}

/// What a request's output must match (structured output, forced tool calls). Compiled
/// against the model's tokenizer when the request is submitted: a spec that does not compile
/// fails the submit with a message naming the problem.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (OpenAI `response_format: json_object`, Ollama `format: "json"`).
    JsonObject,
    /// JSON that validates against this JSON Schema (OpenAI `json_schema`, Ollama `format:
    /// {schema}`, vLLM `guided_json`).
    JsonSchema(serde_json::Value),
    /// Text matching this regular expression, whole (vLLM `guided_regex`).
    Regex(String),
    /// Exactly one of these strings (vLLM `guided_choice`).
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect, which may embed `%json { schema }` (vLLM
    /// `guided_grammar`; the forced `<tool_call>` of a tool-using model).
    Lark(String),
}

impl EngineRequest {
    /// A request for one choice with the given prompt, sampling and length (chosen by the
    /// client: `max_tokens_explicit`), no stops.
    pub fn new(prompt: Vec<u32>, sampling: SamplingParams, max_tokens: usize) -> Self {
        EngineRequest {
            prompt,
            sampling,
            max_tokens,
            max_tokens_explicit: true,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            priority: 0,
            n: 1,
            speculative: true,
            adapter: None,
            constraint: None,
            keep_special_tokens: false,
        }
    }
}

/// When things happened to one request (all on the engine's monotonic clock).
#[derive(Debug, Clone, Copy)]
pub struct RequestTimings {
    /// Submitted to the engine.
    pub arrived: Instant,
    /// First scheduled into a step (end of queueing).
    pub first_scheduled: Option<Instant>,
    /// First token of this choice sampled.
    pub first_token: Option<Instant>,
    /// This choice finished.
    pub finished: Instant,
}

impl RequestTimings {
    /// Time spent waiting before the first step that worked on the request.
    pub fn queued(&self) -> Duration {
        self.first_scheduled
            .map_or(Duration::ZERO, |t| t.duration_since(self.arrived))
    }

    /// Time to first token, from arrival.
    pub fn ttft(&self) -> Option<Duration> {
        self.first_token.map(|t| t.duration_since(self.arrived))
    }

    /// Mean time per output token after the first, over `completion_tokens` tokens.
    pub fn tpot(&self, completion_tokens: usize) -> Option<Duration> {
        let first = self.first_token?;
        if completion_tokens < 2 {
            return None;
        }
        Some(self.finished.duration_since(first) / (completion_tokens as u32 - 1))
    }

    /// Arrival to finish.
    pub fn e2e(&self) -> Duration {
        self.finished.duration_since(self.arrived)
    }
}

/// What a request's stream yields.
#[derive(Debug, Clone)]
pub enum TokenEvent {
    /// Choice `index` produced `token`. `text` is the text that became final with it (may be
    /// empty while a multi-byte character or a possible stop string is pending).
    Token {
        index: usize,
        token: u32,
        text: String,
        logprob: Option<SampledToken>,
        at: Instant,
    },
    /// Choice `index` ended; `text` is the last text held back until now (may be empty).
    Finished {
        index: usize,
        reason: FinishReason,
        text: String,
        usage: Usage,
        timings: RequestTimings,
    },
    /// The request failed as a whole (bad input found late, or a model fault); nothing follows.
    Error { message: String },
}

/// Token counts of one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was reused from the previous turn.
    pub cached_prompt_tokens: usize,
    pub completion_tokens: usize,
}
