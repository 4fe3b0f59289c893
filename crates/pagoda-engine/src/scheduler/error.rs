//! Why the scheduler refused a request or an operation. Every message says what to change.

use super::SeqId;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
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
