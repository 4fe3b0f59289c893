//! pagoda-bench: a load generator for any OpenAI-compatible server (Pagoda, llama-server,
//! vLLM, the Pagoda gateway), behind `pagoda bench serve`.
//!
//! - [`workload`]: what to send — GSM8K chat payloads, a JSONL file of prompts or messages, or
//!   seeded random prompts with given input/output length distributions — as streamed
//!   request bodies ([`workload::RequestSpec`]).
//! - [`runner`]: when to send it — Poisson arrivals at a rate or a fixed concurrency, after a
//!   warm-up, for a request count or a duration — and what each request measured
//!   ([`runner::RequestRecord`]: start, time to first token, inter-token gaps, end, tokens,
//!   error).
//! - [`stats`]: the figures — throughput, TTFT/TPOT/ITL/E2E mean and percentiles, goodput
//!   under an SLA ([`stats::Summary`]).
//! - [`report`]: a Markdown table, a JSON document, and an SVG chart.
//!
//! **Architecture Invariant:** this crate depends on `pagoda-protocol` only among Pagoda's
//! crates: it speaks HTTP, so it measures any OpenAI-compatible backend the same way.
//! It prints nothing; progress goes to the caller's callback.

#![deny(clippy::unwrap_used)]
pub mod report;
pub mod runner;
pub mod stats;
pub mod workload;

pub use runner::{run, Arrival, Limit, Progress, RequestRecord, RunConfig, RunReport};
pub use stats::{Dist, Goodput, Sla, Summary};
pub use workload::{Endpoint, RequestSpec, Workload};

/// Everything that can go wrong in the library; the CLI adds what the user should do.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A data set line that is not a request: the source, its 1-based line and why.
    #[error("{source_name} line {line}: {message}")]
    Dataset {
        source_name: String,
        line: usize,
        message: String,
    },
    /// A setting out of range (named in the message).
    #[error("invalid setting: {0}")]
    Config(String),
    /// The server could not be reached, or answered the probe with an error.
    #[error("cannot reach {url}: {message}")]
    Unreachable { url: String, message: String },
    /// Every warm-up request failed (the first error is given): measuring would only count
    /// errors.
    #[error("all {count} warm-up requests failed; the first: {first}")]
    WarmupFailed { count: usize, first: String },
    /// Writing a report.
    #[error("{0}")]
    Report(String),
}
