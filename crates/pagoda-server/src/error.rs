//! The server's one error type, [`ApiError`], and the one mapping from failures to HTTP
//! status and error bodies: OpenAI's `{"error": {message, type, param, code}}` on `/v1`,
//! Ollama's `{"error": "..."}` on `/api` (through [`OllamaError`]).
//!
//! Invariants: every failure a client can cause is a 4xx with a message that says what to
//! change; 5xx means the server's fault or state (loading, draining), never bad input. What
//! only the operator should see (filesystem paths, the text of an internal failure) is kept in
//! [`ApiError::detail`], which is logged under the request id and never sent.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use pagoda_engine::sampling::SamplingError;
use pagoda_engine::EngineError;
use pagoda_protocol::{ollama, openai::ErrorResponse};

/// A failed request, ready to be written as an error response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's error `type`.
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<String>,
    /// Seconds for a `Retry-After` header (429, 503).
    pub retry_after: Option<u32>,
    /// What went wrong in the operator's terms (paths, internal errors): written to the log
    /// with the request id by the request-id layer, never to the client.
    /// Boxed: the error stays small enough to return by value everywhere.
    pub detail: Option<Box<str>>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
            detail: None,
        }
    }

    /// 409: the request cannot be done in the present state (e.g. nothing to roll back to).
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "invalid_request_error", message)
    }

    /// 400: a parameter is wrong.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the parameter at fault.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(message).with_param(param)
    }

    /// 404: no such model.
    pub fn model_not_found(name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!(
                "model `{name}` not found; {OPENAI_MODEL_LIST} (the operator adds models with `pagoda pull`)"
            ),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// 404 model_not_found with its own message (an unknown LoRA adapter).
    pub fn model_not_found_message(message: String) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
            .with_param("model")
            .with_code("model_not_found")
    }

    /// 404: no such route; an Ollama path (`/api/...`) is pointed at Ollama's routes.
    pub fn route_not_found(path: &str) -> Self {
        let see = if path.starts_with("/api/") {
            "GET /api/tags, POST /api/chat, POST /api/generate"
        } else {
            "GET /v1/models, POST /v1/chat/completions, POST /api/chat"
        };
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("no route {path}; see {see}"),
        )
    }

    /// 405.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method not allowed on this route",
        )
    }

    /// 401: no API key, or not one of the server's (`pagoda serve --api-key`).
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
            .with_code("invalid_api_key")
    }

    /// 403: the server is set up not to do this for clients.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "permission_error", message)
    }

    /// 502: a source the server fetches from (for a pull) failed.
    pub fn upstream(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "server_error", message)
    }

    /// The same error with another message.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    /// 413: the body is over the limit.
    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("request body over {limit} bytes; send less, or raise --max-body-bytes"),
        )
    }

    /// 429: the waiting queue is full.
    pub fn queue_full(limit: usize) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!("the server's queue is full ({limit} requests waiting); retry later"),
        )
        .with_code("queue_full");
        e.retry_after = Some(1);
        e
    }

    /// 503: loading, draining or out of memory for another model.
    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message);
        e.retry_after = Some(1);
        e
    }

    /// 500: the server's fault. `detail` goes to the log only; the client is told where to
    /// look.
    pub fn internal(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "the server failed to handle this request; its log has the details under this response's x-request-id",
        )
        .with_detail(detail)
    }

    /// 500: the engine stopped a generation (its message is the engine's own, which names no
    /// file: a numerical fault, a failed step).
    pub fn generation_failed(message: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("generation failed: {message}"),
        )
    }

    /// 400: the request names a model that exists but cannot be loaded (a broken file, an
    /// unsupported architecture). The reason, which names files, goes to the log only.
    pub fn load_failed(name: &str) -> Self {
        Self::invalid(format!(
            "model `{name}` cannot be loaded; the server's log has the reason under this response's x-request-id (pull it again, or name another model)"
        ))
        .with_param("model")
        .with_code("model_load_failed")
    }

    /// 408: the request body did not arrive in time.
    pub fn body_timeout(after: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s; send it at once (or raise --body-timeout)",
                after.as_secs_f64()
            ),
        )
        .with_code("request_timeout")
    }

    /// Keeps `detail` for the log (see [`ApiError::detail`]).
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into().into_boxed_str());
        self
    }

    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    /// Names `field` as the parameter of an `invalid_constraint` error that names none, and
    /// in front of its message (the engine compiles a constraint without knowing which
    /// request field carried it; Ollama's errors are a message alone).
    pub fn constraint_param(mut self, field: Option<&str>) -> Self {
        if let (Some("invalid_constraint"), None, Some(field)) =
            (self.code.as_deref(), &self.param, field)
        {
            self.message = format!("{field}: {}", self.message);
            self.param = Some(field.to_string());
        }
        self
    }

    pub fn with_code(mut self, code: &str) -> Self {
        self.code = Some(code.to_string());
        self
    }

    /// The OpenAI error body.
    pub fn openai_body(&self) -> ErrorResponse {
        let mut body = ErrorResponse::new(self.kind, self.message.clone());
        body.error.param = self.param.clone();
        body.error.code = self.code.clone();
        body
    }

    fn respond(&self, body: String) -> Response {
        let mut response = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response.extensions_mut().insert(self.clone());
        response
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_string(&self.openai_body()).unwrap_or_default();
        self.respond(body)
    }
}

/// Where a model-not-found message points OpenAI clients, and Ollama clients instead.
const OPENAI_MODEL_LIST: &str = "GET /v1/models lists the models this server has";
const OLLAMA_MODEL_LIST: &str = "GET /api/tags lists the models this server has";

/// An [`ApiError`] written the Ollama way (a model-not-found points at `GET /api/tags`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OllamaError(pub ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let body = serde_json::to_string(&ollama::ErrorResponse {
            error: self.0.message.replace(OPENAI_MODEL_LIST, OLLAMA_MODEL_LIST),
        })
        .unwrap_or_default();
        self.0.respond(body)
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        match e {
            EngineError::PromptTooLong { .. } => ApiError::invalid(message)
                .with_param("messages")
                .with_code("context_length_exceeded"),
            EngineError::PromptExceedsKvCache { .. } => {
                ApiError::invalid(message).with_code("context_length_exceeded")
            }
            EngineError::Sampling(SamplingError::InvalidParameter { name, .. }) => {
                ApiError::invalid_param(name, message)
            }
            EngineError::EmptyPrompt | EngineError::InvalidRequest(_) => ApiError::invalid(message),
            // A schema or grammar llguidance refuses, or one over the documented limits.
            EngineError::InvalidConstraint(_) => {
                ApiError::invalid(message).with_code("invalid_constraint")
            }
            EngineError::Stopped => ApiError::unavailable("the model is shutting down; retry"),
            EngineError::Timeout => {
                ApiError::new(StatusCode::GATEWAY_TIMEOUT, "server_error", message)
            }
            EngineError::InvalidConfig(_) | EngineError::Model(_) => ApiError::internal(message),
            // The model's fault: the message says it produced NaN/inf (likely broken weights
            // or an unsupported quantization) and names no path. A fault mid-generation
            // arrives as that same text in the stream's `Error` event.
            EngineError::NumericalFault { .. } => ApiError::generation_failed(message),
        }
    }
}

impl From<pagoda_runtime::RequestError> for ApiError {
    fn from(e: pagoda_runtime::RequestError) -> Self {
        let mut api = ApiError::invalid(e.message);
        api.param = e.param.map(std::borrow::Cow::into_owned);
        api.code = e.code.map(str::to_string);
        api
    }
}

impl From<pagoda_runtime::GenerationFailed> for ApiError {
    fn from(e: pagoda_runtime::GenerationFailed) -> Self {
        ApiError::generation_failed(e.0)
    }
}

impl From<pagoda_runtime::openai::Aborted> for ApiError {
    fn from(e: pagoda_runtime::openai::Aborted) -> Self {
        ApiError::unavailable(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_client_or_server_status() {
        let too_long: ApiError = EngineError::PromptTooLong {
            prompt_tokens: 10,
            context: 5,
        }
        .into();
        assert_eq!(too_long.status, StatusCode::BAD_REQUEST);
        assert_eq!(too_long.code.as_deref(), Some("context_length_exceeded"));
        let stopped: ApiError = EngineError::Stopped.into();
        assert_eq!(stopped.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(stopped.retry_after, Some(1));
    }

    #[test]
    fn a_numerical_fault_is_a_server_error_that_says_so() {
        let e: ApiError = EngineError::NumericalFault {
            found: pagoda_engine::NonFiniteLogits {
                nan: 320,
                len: 320,
                ..Default::default()
            },
            step: 3,
            position: 17,
        }
        .into();
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        for needle in ["NaN/inf", "broken", "quantization", "step 3 (position 17)"] {
            assert!(e.message.contains(needle), "{needle}: {}", e.message);
        }
    }

    #[test]
    fn ollama_clients_are_pointed_at_ollama_routes() {
        let e = ApiError::model_not_found("nope");
        let body = OllamaError(e.clone()).into_response();
        assert_eq!(body.status(), StatusCode::NOT_FOUND);
        assert!(e.message.contains("GET /v1/models"), "{}", e.message);
        let ollama = e.message.replace(OPENAI_MODEL_LIST, OLLAMA_MODEL_LIST);
        assert!(
            ollama.contains("GET /api/tags") && !ollama.contains("/v1/"),
            "{ollama}"
        );
        assert!(ApiError::route_not_found("/api/nope")
            .message
            .contains("GET /api/tags"));
        assert!(ApiError::route_not_found("/v2/x")
            .message
            .contains("GET /v1/models"));
    }

    #[test]
    fn openai_body_has_every_field() {
        let e = ApiError::model_not_found("nope");
        let v = serde_json::to_value(e.openai_body()).expect("serializes");
        assert_eq!(v["error"]["type"], "not_found_error");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("nope")));
    }
}
