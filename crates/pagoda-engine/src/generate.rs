//! The single-sequence generation loop: prefill the prompt in chunks, then sample one token at a
//! time until EOS, a stop token or string, `max_tokens` or the end of the context.
//!
//! Invariants: the KV cache always holds exactly the first `cache.len()` tokens of
//! `self.cached` (so a follow-up prompt that extends the conversation reuses them); text is
//! handed to the caller only once it is valid UTF-8 and cannot be the start of a stop string;
//! logits holding NaN or infinities end the generation with
//! [`EngineError::NumericalFault`] (logged, see [`crate::fault`]) and the cached conversation
//! is forgotten, since its KV may hold the same broken values.

use crate::fault::{self, Fault};
use crate::request::Usage;
use crate::sampling::{NonFiniteLogits, SampledToken, Sampler, SamplingParams};
use crate::stop::{FinishReason, StopMatcher};
use crate::EngineError;
use pagoda_model::arch::{Logits, LoraWeights, Model};
use pagoda_model::tokenizer::{IncrementalDecoder, Tokenizer};
use pagoda_model::KvCache;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tokens fed to one forward pass while prefilling.
const PREFILL_CHUNK: usize = 512;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    /// Prompt token ids (already templated and tokenized, BOS included if the model wants it).
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Most tokens to generate; generation also stops at the end of the context.
    pub max_tokens: usize,
    /// Stop strings: generation ends before the first occurrence, which is not returned.
    pub stop: Vec<String>,
    /// Extra token ids that end generation (besides the model's EOS tokens).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating through EOS tokens (benchmarks).
    pub ignore_eos: bool,
}

impl GenerationRequest {
    /// A request with the given prompt, sampling and length, no stops.
    pub fn new(prompt: Vec<u32>, sampling: SamplingParams, max_tokens: usize) -> Self {
        GenerationRequest {
            prompt,
            sampling,
            max_tokens,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
        }
    }
}

/// Wall-clock split of one generation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// Time to process the (uncached) prompt and sample the first token.
    pub prefill: Duration,
    /// Time for every later token.
    pub decode: Duration,
}

impl Timings {
    /// Prompt tokens per second over `tokens` prefilled tokens.
    pub fn prefill_tps(&self, tokens: usize) -> f64 {
        tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }
    /// Decode tokens per second over `tokens` tokens after the first.
    pub fn decode_tps(&self, tokens: usize) -> f64 {
        tokens as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct GenerationOutput {
    pub text: String,
    pub tokens: Vec<u32>,
    /// One entry per generated token when `sampling.logprobs` was set.
    pub logprobs: Vec<SampledToken>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
}

/// Runs generations for one conversation at a time, keeping its KV cache between turns.
pub struct Generator {
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    cache: KvCache,
    /// Tokens whose keys and values are in `cache` (plus possibly one not yet fed).
    cached: Vec<u32>,
    /// A LoRA adapter applied to every token (a Modelfile ADAPTER); fixed for the generator's
    /// life, so the cached KV always belongs to it.
    adapter: Option<LoraWeights>,
}

impl Generator {
    /// A generator with a KV cache of `context` positions (capped at the model's context).
    pub fn new(model: Arc<Model>, tokenizer: Arc<Tokenizer>, context: usize) -> Self {
        let cache = model.new_cache(context);
        Generator {
            model,
            tokenizer,
            cache,
            cached: Vec::new(),
            adapter: None,
        }
    }

    /// Runs every generation under `adapter` (unmerged LoRA; `None`: the base model).
    pub fn with_adapter(mut self, adapter: Option<LoraWeights>) -> Self {
        self.reset();
        self.adapter = adapter;
        self
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Positions the KV cache can hold.
    pub fn context(&self) -> usize {
        self.cache.capacity()
    }

    /// Forgets the cached conversation.
    pub fn reset(&mut self) {
        self.cache.truncate(0);
        self.cached.clear();
    }

    /// Generates for `req`, calling `on_text` with each piece of text as it becomes final.
    /// `on_text` returns `false` to abort (the output then has [`FinishReason::Abort`]).
    pub fn generate(
        &mut self,
        req: &GenerationRequest,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<GenerationOutput, EngineError> {
        let vocab = self.model.config().vocab_size;
        req.sampling.validate(vocab)?;
        if req.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let context = self.cache.capacity();
        if req.prompt.len() >= context {
            return Err(EngineError::PromptTooLong {
                prompt_tokens: req.prompt.len(),
                context,
            });
        }
        let started = Instant::now();
        let reused = self.reuse_prefix(&req.prompt);
        let mut logits = self.prefill(&req.prompt[reused..])?;

        let mut sampler = Sampler::new(req.sampling.clone());
        let mut decoder = IncrementalDecoder::new();
        let mut stops = StopMatcher::new(req.stop.clone());
        let eos: Vec<u32> = if req.ignore_eos {
            Vec::new()
        } else {
            self.tokenizer.eos_ids().to_vec()
        };
        let mut out = GenerationOutput {
            text: String::new(),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: FinishReason::Length,
            usage: Usage {
                prompt_tokens: req.prompt.len(),
                cached_prompt_tokens: reused,
                completion_tokens: 0,
            },
            timings: Timings::default(),
        };
        let mut decode_started = None;
        let mut stop_string_hit = false;
        let mut emit = |text: &str, out: &mut GenerationOutput| -> bool {
            out.text.push_str(text);
            text.is_empty() || on_text(text)
        };

        while out.tokens.len() < req.max_tokens {
            let sampled = match sampler.try_sample(&mut logits, &req.prompt, &out.tokens) {
                Ok(sampled) => sampled,
                Err(found) => return Err(self.numerical_fault(found, out.tokens.len())),
            };
            if decode_started.is_none() {
                out.timings.prefill = started.elapsed();
                decode_started = Some(Instant::now());
            }
            let tok = sampled.token;
            if req.sampling.logprobs.is_some() {
                out.logprobs.push(sampled);
            }
            if eos.contains(&tok) || req.stop_token_ids.contains(&tok) {
                out.finish_reason = FinishReason::Stop;
                break;
            }
            out.tokens.push(tok);
            let piece = decoder.push(&self.tokenizer, tok)?.unwrap_or_default();
            let outcome = stops.push(&piece);
            if !emit(&outcome.emit, &mut out) {
                out.finish_reason = FinishReason::Abort;
                break;
            }
            if outcome.stopped {
                stop_string_hit = true;
                out.finish_reason = FinishReason::Stop;
                break;
            }
            if out.tokens.len() >= req.max_tokens {
                break;
            }
            if self.cache.len() + 1 >= context {
                // The next token would not fit: the context is full.
                break;
            }
            logits = self.feed(&[tok], Logits::Last)?;
        }
        if out.finish_reason != FinishReason::Abort && !stop_string_hit {
            let mut tail = decoder.finish(&self.tokenizer)?;
            let outcome = stops.push(&tail);
            tail = outcome.emit;
            if !outcome.stopped {
                tail.push_str(&stops.flush());
            } else {
                out.finish_reason = FinishReason::Stop;
            }
            emit(&tail, &mut out);
        }
        out.usage.completion_tokens = out.tokens.len();
        if let Some(d) = decode_started {
            out.timings.decode = d.elapsed();
        }
        Ok(out)
    }

    /// Logs the fault of the logits of the last position fed (`step` output tokens in),
    /// locating the stage that first went non-finite (a re-run of the cached tokens, bounded
    /// as in [`crate::fault`]; a generator serves one caller, so every fault is located),
    /// forgets the conversation and returns the error.
    fn numerical_fault(&mut self, found: NonFiniteLogits, step: usize) -> EngineError {
        let fed = self.cache.len().min(self.cached.len());
        let fault = Fault {
            found,
            step,
            position: fed.saturating_sub(1),
        };
        let located = fault::locate(
            &self.model,
            &self.cached[..fed],
            self.cache.dtype(),
            self.adapter.is_some(),
        );
        fault.log(None, &located);
        self.reset();
        fault.error()
    }

    /// Keeps the longest cached prefix of `prompt` (leaving at least one prompt token to feed,
    /// so there are logits to sample from) and returns its length.
    fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        let common = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(self.cache.len())
            .min(prompt.len() - 1);
        self.cache.truncate(common);
        self.cached.truncate(common);
        common
    }

    /// Feeds the uncached part of the prompt in chunks; returns the last position's logits.
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut logits = Vec::new();
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            logits = self.feed(chunk, Logits::Last)?;
        }
        Ok(logits)
    }

    fn feed(&mut self, tokens: &[u32], which: Logits) -> Result<Vec<f32>, EngineError> {
        let start = self.cache.len();
        let logits = self.model.forward_adapted(
            tokens,
            start,
            &mut self.cache,
            which,
            self.adapter.as_ref(),
        )?;
        self.cached.truncate(start);
        self.cached.extend_from_slice(tokens);
        Ok(logits)
    }

    /// Runs `tokens` from an empty cache and returns logits for every position (evaluation).
    pub fn score(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.reset();
        self.feed(tokens, Logits::All)
    }

    /// Runs `tokens` from an empty cache and returns only the last position's logits
    /// (benchmarks the prefill path exactly as generation uses it).
    pub fn score_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.reset();
        self.prefill(tokens)
    }
}
