//! pagoda-engine: the serving core of Pagoda.
//!
//! Owns turning logits into tokens ([`sampling`]), ending generations on stop strings and
//! tokens ([`stop`]), and the serving engine — the one generation loop every front end
//! submits to: configuration planning ([`planning`]), the KV block pool with prefix caching
//! ([`block_pool`]), the continuous-batching scheduler ([`scheduler`]), the step runner
//! ([`runner`]), constrained decoding ([`constraint`]: llguidance token masks), speculative decoding ([`speculative`]), the step loop ([`engine`]: propose →
//! schedule → execute → sample → update → emit, the sampling and output processing in modules
//! of their own) and its thread-safe handle ([`handle`]) that streams
//! [`request::TokenEvent`]s.
//!
//! Architecture Invariant: the engine reaches model files only through pagoda-model's
//! `ModelSource`/`Model`; it never parses files or touches weights.

// Library code states its invariants instead of unwrapping: `?`, a proper error, or
// `.expect("<why this cannot fail>")`. Unit tests may unwrap.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod block_pool;
mod choice;
pub mod closed_schema;
pub mod constraint;
pub mod constraint_depth;
pub mod engine;
pub mod error;
mod fault;
pub mod handle;
pub mod memory;
mod output;
pub mod planning;
pub mod request;
pub mod runner;
pub mod sampling;
pub mod scheduler;
pub mod speculative;
pub mod state_pool;
mod step_sampling;
pub mod stop;

pub use block_pool::{BlockHash, BlockId, BlockPool, PoolStats};
pub use closed_schema::close_objects;
pub use constraint::{ConstraintError, Constraints};
pub use engine::{EngineCore, EngineStats};
pub use error::EngineError;
pub use handle::{EngineHandle, RequestStream};
pub use planning::{EngineConfig, KvLayout, StatePlan};
pub use request::{ConstraintSpec, EngineRequest, RequestId, RequestTimings, TokenEvent, Usage};
pub use sampling::{NonFiniteLogits, SampledToken, Sampler, SamplingParams};
pub use scheduler::{BatchingMode, Policy, Scheduler, SchedulerConfig, SeqEnd, SeqId};
pub use speculative::{ProposerConfig, SpecStats, SpeculativeConfig};
pub use stop::{FinishReason, StopMatcher};
