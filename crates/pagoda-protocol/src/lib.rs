//! pagoda-protocol: the wire types of Pagoda's HTTP APIs, shared by the server, the gateway
//! and the load generator (which also speak to servers that are not Pagoda).
//!
//! - [`openai`]: `/v1/...` requests, responses, stream chunks and the error body.
//! - [`ollama`]: `/api/...` requests, responses and options.
//! - [`sse`]: Server-Sent Events framing (writing, and an incremental reader for clients).
//! - [`json`]: request bodies into wire types with bounded nesting.
//!
//! Invariant: these types only describe bytes on the wire. Defaults written here are the
//! APIs' documented defaults; validation of ranges and meaning lives in the server, which
//! owns the mapping from errors to HTTP status.

#![deny(clippy::unwrap_used)]
pub mod json;
pub mod ollama;
pub mod openai;
pub mod sse;
