//! pagoda-engine: the serving core of Pagoda.
//!
//! Owns turning logits into tokens ([`sampling`]), ending generations on stop strings and
//! tokens ([`stop`]), and the generation loop over a model and its KV cache ([`generate`]).
//! The KV block pool ([`block_pool`]) and the continuous-batching scheduler ([`scheduler`]).
//!
//! Architecture Invariant: the engine reaches model files only through pagoda-model's
//! `ModelSource`/`Model`; it never parses files or touches weights.

pub mod block_pool;
pub mod error;
pub mod generate;
pub mod sampling;
pub mod scheduler;
pub mod stop;

pub use block_pool::{BlockHash, BlockId, BlockPool, PoolStats};
pub use error::EngineError;
pub use generate::{GenerationOutput, GenerationRequest, Generator, Timings, Usage};
pub use sampling::{SampledToken, Sampler, SamplingParams};
pub use scheduler::{BatchingMode, Policy, Scheduler, SchedulerConfig, SeqEnd, SeqId};
pub use stop::{FinishReason, StopMatcher};
