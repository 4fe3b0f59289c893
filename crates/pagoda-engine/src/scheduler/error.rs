//! Why the scheduler refused a request or an operation. Every message says what to change.

use super::SeqId;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    #[error("the prompt is empty; send at least one token")]
    EmptyPrompt,
    #[error("max_tokens is 0; ask for at least one token")]
    ZeroMaxTokens,
    #[error(
        "the prompt has {prompt_tokens} tokens but the model's context is {max_model_len}; \
         shorten it (at most {} tokens) or raise the context length",
        max_model_len.saturating_sub(1)
    )]
    PromptTooLong {
        prompt_tokens: usize,
        max_model_len: usize,
    },
    #[error(
        "the prompt has {prompt_tokens} tokens but the whole KV cache holds {kv_tokens}; \
         shorten the prompt or give the KV cache more memory"
    )]
    PromptExceedsKvCache {
        prompt_tokens: usize,
        kv_tokens: usize,
    },
    #[error("sequence id {id} is already in the scheduler; use a fresh id")]
    DuplicateId { id: SeqId },
    #[error("no sequence {id} is waiting or running (it may have finished or been aborted)")]
    UnknownSequence { id: SeqId },
    #[error(
        "sequence {id} cannot be forked now: it must be running with every token but its last \
         sampled one computed; fork right after the update that sampled that token"
    )]
    ForkNotReady { id: SeqId },
    #[error("unknown scheduling policy `{0}`; use fcfs, priority or sjf")]
    UnknownPolicy(String),
    #[error("unknown batching mode `{0}`; use continuous or static")]
    UnknownBatchingMode(String),
    #[error("invalid scheduler configuration: {0}")]
    InvalidConfig(String),
}
