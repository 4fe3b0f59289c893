//! Reading request bodies: at most the configured number of bytes (413 beyond), then JSON
//! into the wire type (400 with serde's message, which names the field and position).
//!
//! Invariant: the limit is enforced while reading, so a huge or endless body never sits in
//! memory whole.

use crate::error::ApiError;
use axum::body::Body;
use serde::de::DeserializeOwned;

/// Reads `body` (up to `limit` bytes) and parses it as `T`.
pub async fn json<T: DeserializeOwned>(body: Body, limit: usize) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::body_too_large(limit))?;
    parse(&bytes)
}

/// Parses JSON bytes as `T`.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid(
            "the request body is empty; send a JSON object",
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "the request body is not valid JSON"
        } else {
            "invalid request"
        };
        ApiError::invalid(format!("{what}: {e}"))
    })
}
