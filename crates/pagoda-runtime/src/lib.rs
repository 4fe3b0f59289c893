//! pagoda-runtime: the one request path between Pagoda's front ends (the HTTP server, the
//! CLI's `run`, `batch`, `bench`, `eval`, `tune`) and the engine.
//!
//! Map: [`loader`] (store name or path → a model ready to serve: weights, tokenizer, chat
//! template, defaults; quantize-at-load; a Modelfile's LoRA), [`request`] (request knobs →
//! a validated [`EngineRequest`](pagoda_engine::EngineRequest), [`RequestError`] naming the
//! parameter), [`openai`] (OpenAI chat/completions bodies → prompt and knobs, and collected
//! choices → response bodies: what `serve` and `batch` share), [`collect`] (engine events →
//! choices), [`single`] (one blocking request, text as it comes: `run`, `bench model`,
//! `eval compare`), [`tools`] (tool calling: checks, rendering, the forced-call grammar, the
//! output parser).
//!
//! Architecture Invariant: nothing here knows HTTP; front ends map [`RequestError`] to their
//! own answers (a 400 naming the parameter, a CLI message, a batch output line). The runtime
//! reaches the model only through the engine's `EngineHandle` and the loader.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod collect;
pub mod fields;
pub mod loader;
pub mod openai;
pub mod request;
pub mod single;
pub mod structured;
pub mod tools;

pub use collect::{collect_blocking, combined_usage, ChoiceOutput, Collector, GenerationFailed};
pub use loader::{LoadError, LoadOptions, LoadedModel, Pull};
pub use request::{engine_request, Bounds, Knobs, LengthRule, RequestError};
pub use single::{generate, GenerateError, Timings};
