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
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Model(#[from] ModelError),
}
