//! The one error type of pagoda-engine.

use crate::sampling::{NonFiniteLogits, SamplingError};
use pagoda_model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt_tokens} tokens but the context holds {context}; shorten it or raise the context size")]
    PromptTooLong {
        prompt_tokens: usize,
        context: usize,
    },
    #[error("the prompt has {prompt_tokens} tokens but the whole KV cache holds {kv_tokens}; raise --kv-cache-memory or shorten the prompt")]
    PromptExceedsKvCache {
        prompt_tokens: usize,
        kv_tokens: usize,
    },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request's constraint (`EngineRequest::constraint`) does not compile or is beyond
    /// the documented limits (`constraint::LIMITS`); the message names the problem.
    #[error("invalid constraint: {0}")]
    InvalidConstraint(String),
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
    #[error("the engine has stopped")]
    Stopped,
    #[error("timed out waiting for the engine")]
    Timeout,
    /// The logits a choice was to sample from held NaN or infinities: the model's arithmetic
    /// broke (broken weights, an unsupported quantization, an overflow), not the request.
    /// `step` is the output token being chosen (0: the first), `position` the sequence
    /// position whose logits these are (the last token fed). The message is meant for
    /// clients too: no path, no internals.
    #[error("numerical fault: the model produced non-finite numbers (NaN/inf) in its logits ({found}) at step {step} (position {position}); its weights are likely broken or their quantization unsupported")]
    NumericalFault {
        found: NonFiniteLogits,
        step: usize,
        position: usize,
    },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Model(#[from] ModelError),
}
