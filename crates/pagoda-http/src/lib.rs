//! pagoda-http: how Pagoda's two HTTP front doors — `pagoda serve` and `pagoda gateway` —
//! accept connections. [`serve`] runs an axum router over HTTP/1.1 connections under
//! [`ConnectionLimits`]; [`request_id`] holds what both say about `x-request-id`,
//! [`api_key`] how both hash and read API keys, [`browser_guard`] which web pages (`Origin`)
//! and names (`Host`) a local server answers, and [`panics`] how a handler's panic becomes its
//! request's 500.
//!
//! Architecture Invariant: this crate knows nothing of models, routes or wire types; it
//! depends on no other Pagoda crate, so the gateway can use it and still speak to any
//! OpenAI-compatible backend.

#![deny(clippy::unwrap_used)]
pub mod api_key;
pub mod browser_guard;
mod listener;
pub mod panics;
pub mod request_id;

pub use listener::{serve, ConnectionLimits};
