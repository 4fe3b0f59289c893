//! The OpenAI API's generation endpoints without HTTP: request bodies → prompt and
//! [`Knobs`](crate::Knobs), and collected choices → response bodies. `serve` (which adds
//! HTTP, streaming and model leases) and `pagoda batch` (which reads the same bodies from a
//! file) both go through here, so the same body gives the same output and the same error.
//!
//! Invariant: every check OpenAI documents for a field is made here, once, before anything
//! is submitted; each endpoint's `check` then `plan` is its [`Plan`](crate::plan::Plan)
//! builder, and the ranges the engine also needs are checked in [`crate::request`].

/// The [`Knobs`](crate::Knobs) both OpenAI generation requests spell the same way (the
/// sampling fields, `stop` after the model's Modelfile stops, `n`, vLLM's `ignore_eos` and
/// `priority`, Pagoda's `speculative`) and the `constraint` their `check` found; each
/// endpoint adds its own `logprobs` and `max_tokens`. A macro because the two request types
/// share names, not a type.
macro_rules! shared_knobs {
    ($loaded:expr, $req:expr, $constraint:expr) => {
        $crate::request::Knobs {
            temperature: $req.temperature,
            top_p: $req.top_p,
            top_k: $req.top_k,
            min_p: $req.min_p,
            presence_penalty: $req.presence_penalty,
            frequency_penalty: $req.frequency_penalty,
            repetition_penalty: $req.repetition_penalty,
            seed: $req.seed,
            logit_bias: $req.logit_bias.clone(),
            stop: $loaded.stops_with($req.stop.clone().map(|s| s.into_vec()).unwrap_or_default()),
            n: $req.n.unwrap_or(1),
            ignore_eos: $req.ignore_eos,
            no_speculation: $req.speculative == Some(false),
            priority: $req.priority,
            constraint: $constraint,
            ..$crate::request::Knobs::default()
        }
    };
}

pub mod chat;
pub mod completions;

use crate::request::RequestError;
use pagoda_engine::FinishReason;
use pagoda_model::tokenizer::Tokenizer;
use pagoda_protocol::openai;

/// Most `top_logprobs` (and legacy `logprobs`) OpenAI allows.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Who a response is from: the `id`, `model` and `created` every body carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub id: String,
    pub model: String,
    pub created: u64,
}

/// A choice ended by an abort (the server shutting down), which OpenAI has no finish reason
/// for: the response is an error instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request was aborted (server shutting down)")]
pub struct Aborted;

/// The parameter ranges OpenAI documents (beyond what the engine checks).
pub fn check_ranges(
    temperature: Option<f32>,
    n: Option<usize>,
    top_logprobs: Option<usize>,
) -> Result<(), RequestError> {
    if let Some(t) = temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(RequestError::param(
                "temperature",
                format!("temperature must be in [0, 2], got {t}"),
            ));
        }
    }
    if let Some(n) = n {
        if n == 0 || n > pagoda_engine::engine::MAX_CHOICES {
            return Err(RequestError::param(
                "n",
                format!(
                    "n must be between 1 and {}, got {n}",
                    pagoda_engine::engine::MAX_CHOICES
                ),
            ));
        }
    }
    if let Some(k) = top_logprobs {
        if k > MAX_TOP_LOGPROBS {
            return Err(RequestError::param(
                "top_logprobs",
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
            ));
        }
    }
    Ok(())
}

/// OpenAI's name for an engine finish reason; `None` for an abort (reported as an error).
pub fn finish_reason(reason: FinishReason) -> Option<openai::FinishReason> {
    match reason {
        FinishReason::Stop => Some(openai::FinishReason::Stop),
        FinishReason::Length => Some(openai::FinishReason::Length),
        FinishReason::Abort => None,
    }
}

/// The text of one token as logprobs show it.
pub fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

/// OpenAI's usage object for the engine's counts.
pub fn usage(u: pagoda_engine::Usage) -> openai::Usage {
    openai::Usage::new(u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens)
}

/// The sum of two prompts' usages (the completions API's batch of prompts).
pub fn add_usage(a: openai::Usage, b: openai::Usage) -> openai::Usage {
    let cached = a.prompt_tokens_details.map_or(0, |d| d.cached_tokens)
        + b.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
    openai::Usage::new(
        a.prompt_tokens + b.prompt_tokens,
        a.completion_tokens + b.completion_tokens,
        cached,
    )
}
