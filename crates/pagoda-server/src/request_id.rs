//! The request id every response carries in `x-request-id`, and the log line that joins an
//! error's private detail to it.
//!
//! A client (or a gateway in front) may send its own `x-request-id`; it is kept when it is
//! short and plain (1-128 of `A-Z a-z 0-9 . _ : -`), otherwise replaced, so a log line never
//! carries a client's arbitrary bytes.
//!
//! Invariants: every response leaving the router has exactly one `x-request-id`; an
//! [`ApiError`] with a `detail` is logged once, here, under that id — its detail (paths,
//! internal errors) is never in the body.

use crate::clock::unix_now;
use crate::error::ApiError;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::atomic::{AtomicU64, Ordering};

/// The header's name.
pub const HEADER: &str = "x-request-id";

/// The id of the request being handled (a request extension, for handlers that log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// A fresh id: `req-` then the start second and a counter, in hex.
pub fn new_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("req-{:x}{n:06x}", unix_now())
}

/// A client's id when it is safe to keep.
fn acceptable(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// The middleware: picks the id, runs the request, logs an error's detail, sets the header.
pub async fn layer(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| acceptable(v))
        .map_or_else(new_id, str::to_string);
    request.extensions_mut().insert(RequestId(id.clone()));
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let mut response = next.run(request).await;
    if let Some(e) = response.extensions().get::<ApiError>() {
        if let Some(detail) = &e.detail {
            if e.status.is_server_error() {
                tracing::error!(request_id = %id, %method, %path, status = e.status.as_u16(), %detail, "request failed");
            } else {
                tracing::warn!(request_id = %id, %method, %path, status = e.status.as_u16(), %detail, "request refused");
            }
        }
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_short_ids_are_kept_and_others_replaced() {
        assert!(acceptable("abc-123_x.y:z"));
        assert!(!acceptable(""));
        assert!(!acceptable(&"a".repeat(129)));
        assert!(!acceptable("a b"));
        assert!(!acceptable("a\u{7f}"));
        assert!(!acceptable("ünï"));
    }

    #[test]
    fn fresh_ids_differ() {
        assert_ne!(new_id(), new_id());
        assert!(acceptable(&new_id()));
    }
}
