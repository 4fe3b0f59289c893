//! The one error type of pagoda-engine.

use crate::sampling::SamplingError;
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
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
    #[error("the engine has stopped")]
    Stopped,
    #[error("timed out waiting for the engine")]
    Timeout,
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Model(#[from] ModelError),
}
