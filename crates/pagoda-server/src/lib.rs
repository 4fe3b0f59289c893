//! pagoda-server: the batching engine behind HTTP, so existing clients work unchanged —
//! the OpenAI SDKs, LangChain/LlamaIndex with a base_url, the `ollama` client, curl.
//!
//! Map: [`app`] (router, life cycle, drain), [`openai`] and [`ollama`] (the two APIs),
//! [`generation`] (one request through the engine, shared by both), [`registry`] (loaded
//! models, keep-alive, memory budget, hot reload; [`heap`] gives an unloaded model's memory back to the OS), [`embedders`] (BERT embedding models), [`adapters`] (LoRA adapters served per request),
//! [`metrics`] (Prometheus; [`gpu_metrics`], its GPU gauges through NVML), [`error`] (the one error → status mapping), [`body`] (bounded
//! JSON bodies), [`chat_page`] (`GET /` and its files), [`state`] (configuration and shared state),
//! [`names`] (which model names a client may use), [`request_id`] (`x-request-id` on every response, error details to the log), [`pulls`]
//! (what a client may make the server download), [`auth`] (API keys on the server itself).
//!
//! Loading models, admission (each OpenAI and Ollama body → one checked
//! `pagoda_runtime::Plan`) and engine events → choices are pagoda-runtime's (shared with the
//! CLI); the server adds HTTP: body parsing, admission control (readiness, draining, the
//! queue limit), model leases, streaming frames, status codes and metrics.
//!
//! Architecture Invariant: the server reaches models only through the engine's
//! `EngineHandle` and pagoda-runtime; wire types come from pagoda-protocol.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod adapters;
pub mod app;
pub mod auth;
pub mod body;
pub mod chat_page;
pub mod clock;
mod cpu_bound;
pub mod embedders;
pub mod error;
pub mod generation;
pub mod gpu_metrics;
pub mod heap;
pub mod memory_plan;
pub mod metrics;
pub mod names;
pub mod ollama;
pub mod openai;
pub mod pulls;
pub mod registry;
pub mod request_id;
pub mod state;

pub use app::{shutdown_signal, BoundServer, ServerError};
pub use error::ApiError;
pub use state::{AppState, ServerConfig, DEFAULT_PORT};
