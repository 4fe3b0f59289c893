//! The request id every response carries in `x-request-id`, and the log line that joins an
//! error's private detail to it.
//!
//! A client (or a gateway in front) may send its own `x-request-id`; it is kept when it is
//! short and plain (1-128 of `A-Z a-z 0-9 . _ : -`), otherwise replaced, so a log line never
//! carries a client's arbitrary bytes.
//!
//! The handler runs in a task-local scope holding the id ([`current`]), so a generation's log
//! line carries it beside the response id (`chatcmpl-…`).
//!
//! Invariants: every response leaving the router has exactly one `x-request-id`; an
//! [`ApiError`] with a `detail` is logged once, here, under that id — its detail (paths,
//! internal errors) is never in the body.

use crate::error::ApiError;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

pub use pagoda_http::request_id::{new_id, HEADER};

/// The id of the request being handled (a request extension, for handlers that log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

tokio::task_local! {
    /// The id, for code that runs inside the handler without the request at hand.
    static CURRENT: String;
}

/// The `x-request-id` of the request whose handler is running on this task, if any.
pub fn current() -> Option<String> {
    CURRENT.try_with(Clone::clone).ok()
}

/// The middleware: picks the id, runs the request, logs an error's detail, sets the header.
pub async fn layer(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| pagoda_http::request_id::is_acceptable(v))
        .map_or_else(new_id, str::to_string);
    request.extensions_mut().insert(RequestId(id.clone()));
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let mut response = CURRENT.scope(id.clone(), next.run(request)).await;
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

    #[tokio::test]
    async fn the_current_id_is_known_inside_the_handlers_scope_only() {
        let inside = CURRENT
            .scope("trace-7".to_string(), async { current() })
            .await;
        assert_eq!(inside.as_deref(), Some("trace-7"));
        assert_eq!(current(), None);
    }
}
