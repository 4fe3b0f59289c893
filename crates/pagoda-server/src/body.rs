//! Reading request bodies: at most the configured number of bytes (413 beyond) within the
//! body timeout (408 beyond), then JSON into the wire type through
//! [`pagoda_protocol::json::parse_body`] (400 for an empty body, nesting deeper than
//! `MAX_DEPTH`, or serde's message, which names the field and position).
//!
//! Invariant: a declared Content-Length over the limit is a 413 before any read; the size
//! limit is enforced while reading too (chunked bodies), and the whole read has one deadline,
//! so a huge, endless, trickled or stalled body never holds memory or a connection for long.

use crate::error::ApiError;
use axum::body::Body;
use pagoda_protocol::json::{parse_body, BodyError};
use serde::de::DeserializeOwned;
use std::time::Duration;

/// The limits a body is read under.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub max_bytes: usize,
    /// The whole body must arrive within this time after the handler starts reading it.
    pub timeout: Duration,
}

/// Reads `body` within `limits` and parses it as `T`.
pub async fn json<T: DeserializeOwned>(body: Body, limits: BodyLimits) -> Result<T, ApiError> {
    // A declared Content-Length over the limit is refused before a byte is read (the client
    // would otherwise wait out the body timeout, or send it all for nothing).
    if declared_too_large(&body, limits.max_bytes) {
        return Err(ApiError::body_too_large(limits.max_bytes));
    }
    let bytes =
        match tokio::time::timeout(limits.timeout, axum::body::to_bytes(body, limits.max_bytes))
            .await
        {
            Err(_) => return Err(ApiError::body_timeout(limits.timeout)),
            Ok(Err(_)) => return Err(ApiError::body_too_large(limits.max_bytes)),
            Ok(Ok(bytes)) => bytes,
        };
    parse(&bytes)
}

/// Whether the body's size is known (a Content-Length) to be over `max_bytes`.
fn declared_too_large(body: &Body, max_bytes: usize) -> bool {
    let lower = axum::body::HttpBody::size_hint(body).lower();
    usize::try_from(lower).map_or(true, |n| n > max_bytes)
}

/// Parses JSON bytes as `T`.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    parse_body(bytes).map_err(|e| match e {
        BodyError::TooDeep { .. } => ApiError::invalid(e.to_string()).with_code("too_deep"),
        _ => ApiError::invalid(e.to_string()),
    })
}
