//! What a client gets when the gateway refuses or fails a request: an HTTP status, an
//! OpenAI-style error body (`{"error": {"message", "type", "param", "code"}}`) and, for rate
//! limits, a `Retry-After` header.
//!
//! Invariant: every refusal made by the gateway itself goes through [`ApiError`], so clients
//! (the official SDKs among them) can parse every error the same way. The messages about
//! failed upstreams that clients see by default ([`ApiError::route_unavailable`],
//! [`ApiError::route_timeout`], [`ApiError::route_dropped`], [`ApiError::stream_cut`]) name the route and the request id,
//! never a replica, a backend model or a connection error (`privacy.rs`).

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use pagoda_protocol::openai::ErrorResponse;

/// A refusal with its status, OpenAI error type and code.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: String,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            message,
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            None,
            message.into(),
        )
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            message.into(),
        )
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            Some("model_not_allowed"),
            message.into(),
        )
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("model_not_found"),
            format!(
                "the model '{model}' does not exist on this gateway (GET /v1/models lists them)"
            ),
        )
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            None,
            message.into(),
        )
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            None,
            message.into(),
        )
    }

    pub fn body_timeout(after: Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            Some("request_timeout"),
            format!(
                "the request body did not arrive within {} ms",
                after.as_millis()
            ),
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("request_too_large"),
            format!("the request body is larger than this gateway's limit of {limit} bytes"),
        )
    }

    pub fn rate_limited(message: impl Into<String>, retry_after: Duration) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                Some("rate_limit_exceeded"),
                message.into(),
            )
        }
    }

    /// A request that can never fit the key's per-minute limit (waiting will not help).
    pub fn request_over_limit(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            Some("request_too_large"),
            message.into(),
        )
    }

    pub fn quota_exhausted(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "insufficient_quota",
            Some("insufficient_quota"),
            message.into(),
        )
    }

    pub fn upstream_unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("upstream_unavailable"),
            message.into(),
        )
    }

    /// A backing service of the gateway itself (Redis) is unreachable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("service_unavailable"),
            message.into(),
        )
    }

    pub fn upstream_timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "server_error",
            Some("upstream_timeout"),
            message.into(),
        )
    }

    /// Every target of `route`'s chain failed (the details are in the log under `request_id`).
    pub fn route_unavailable(route: &str, request_id: &str) -> Self {
        Self::upstream_unavailable(format!(
            "route `{route}`: no healthy replica answered; retry later (request id {request_id})"
        ))
    }

    /// Every attempt on `route`'s chain ran out of time.
    pub fn route_timeout(route: &str, request_id: &str) -> Self {
        Self::upstream_timeout(format!(
            "route `{route}`: no replica answered in time; retry later (request id {request_id})"
        ))
    }

    /// Replicas of `route` dropped the request after it was sent, as often as its
    /// `max_replays` allow: it may be what makes them fail, so no other replica gets it.
    pub fn route_dropped(route: &str, request_id: &str) -> Self {
        Self::upstream_dropped(format!(
            "route `{route}`: a replica failed while handling this request, so it was not sent to more replicas (request id {request_id})"
        ))
    }

    /// The request was stopped after replicas dropped it (see [`ApiError::route_dropped`]);
    /// `message` says more (`server.expose_upstream_details`).
    pub fn upstream_dropped(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            Some("upstream_dropped"),
            message.into(),
        )
    }

    /// A stream of `route` that broke after its first chunk (sent as its last SSE event).
    pub fn stream_cut(route: &str, request_id: &str) -> Self {
        Self::stream_broken(format!(
            "route `{route}`: the answer was cut off; retry the request (request id {request_id})"
        ))
    }

    /// A stream that broke after its first chunk, with `message` saying why.
    pub fn stream_broken(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            Some("stream_broken"),
            message.into(),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            None,
            message.into(),
        )
    }

    /// The JSON body alone (also the payload of an SSE error event).
    pub fn body(&self) -> ErrorResponse {
        let body = ErrorResponse::new(self.kind, self.message.clone());
        match self.code {
            Some(code) => body.with_code(code),
            None => body,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(after) = self.retry_after {
            // Whole seconds, rounded up: "Retry-After: 0" would invite an immediate retry.
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            if let Ok(value) = HeaderValue::from_str(&secs.max(1).to_string()) {
                response.headers_mut().insert("retry-after", value);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_carry_retry_after_in_whole_seconds() {
        let r = ApiError::rate_limited("slow down", Duration::from_millis(1200)).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()["retry-after"], "2");
        let r = ApiError::rate_limited("slow down", Duration::ZERO).into_response();
        assert_eq!(r.headers()["retry-after"], "1");
    }

    #[test]
    fn bodies_are_openai_shaped() {
        let v = serde_json::to_value(ApiError::unauthorized("no key").body()).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["message"], "no key");
    }
}
