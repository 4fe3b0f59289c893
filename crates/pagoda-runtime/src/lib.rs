//! pagoda-runtime: the one request path between Pagoda's front ends (the HTTP server, the
//! CLI's `run`, `batch`, `bench`, `eval`, `tune`) and the engine.
//!
//! Map: [`plan`] (one admission: every front end's request becomes one checked [`Plan`], by
//! one builder per API shape), [`openai`] (OpenAI chat/completions bodies → plans, and
//! collected choices → response bodies: what `serve` and `batch` share), [`ollama`]
//! (Ollama generate/chat bodies → plans, and outputs → Ollama's tool calls), [`request`]
//! (knobs → a validated [`EngineRequest`](pagoda_engine::EngineRequest): the one place the
//! ranges of `max_tokens`, the prompt's length and the sampling knobs are checked;
//! [`RequestError`] naming the parameter), [`fields`] (fields a body may carry),
//! [`structured`] (structured-output fields → a constraint), [`tools`] (tool calling:
//! checks, rendering, the forced-call grammar, the output parser), [`loader`] (store name or
//! path → a model ready to serve: weights, tokenizer, chat template, defaults;
//! quantize-at-load; a Modelfile's LoRA), [`quant_choice`] (`--quantize auto`: the best
//! weight format that fits the memory budget), [`collect`] (engine events → choices), [`single`]
//! (one blocking request, text as it comes: `run`, `bench model`, `eval compare`).
//!
//! Architecture Invariant: nothing here knows HTTP; front ends map [`RequestError`] to their
//! own answers (a 400 naming the parameter, a CLI message, a batch output line). The runtime
//! reaches the model only through the engine's `EngineHandle` and the loader. Front ends
//! submit only [`Plan`]s' requests.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod collect;
pub mod fields;
pub mod formats;
pub mod loader;
pub mod ollama;
pub mod openai;
pub mod plan;
pub mod quant_choice;
pub mod request;
pub mod single;
pub mod structured;
pub mod tools;

pub use collect::{collect_blocking, combined_usage, ChoiceOutput, Collector, GenerationFailed};
pub use loader::{LoadError, LoadOptions, LoadedModel, Pull};
pub use plan::Plan;
pub use request::{engine_request, Bounds, Knobs, LengthField, LengthRule, RequestError};
pub use single::{generate, GenerateError, Timings};
