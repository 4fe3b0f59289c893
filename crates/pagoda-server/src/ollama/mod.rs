//! The Ollama API: `/api/generate`, `/api/chat` (NDJSON streams), `/api/tags`, `/api/show`,
//! `/api/ps`, `/api/pull`, `/api/delete`, `/api/version`, `/api/embed`, and `/api/create` /
//! `/api/copy` (`create.rs`: derived models and second names of models already in the store),
//! and Pagoda's `/api/rollback` (`rollback.rs`: a name back to a version the store kept).
//! Shared here: the NDJSON response and model details; the generation requests' mapping is
//! `pagoda_runtime::ollama`'s.
//!
//! Invariant: errors leave as `{"error": "..."}` with the status the server maps them to.

mod create;
mod embed;
mod generate;
mod models;
mod rollback;

use crate::error::{ApiError, OllamaError};
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use futures_util::{Stream, StreamExt};
use pagoda_protocol::ollama::ModelDetails;
use std::convert::Infallible;

/// The `/api` routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/generate", post(generate::generate))
        .route("/api/chat", post(generate::chat))
        .route("/api/tags", get(models::tags))
        .route("/api/show", post(models::show))
        .route("/api/ps", get(models::ps))
        .route("/api/pull", post(models::pull))
        .route("/api/delete", delete(models::remove))
        .route("/api/create", post(create::create))
        .route("/api/copy", post(create::copy))
        .route("/api/rollback", post(rollback::rollback))
        .route("/api/version", get(models::version))
        .route("/api/embed", post(embed::embed))
        .route("/api/embeddings", post(embed::embeddings))
}

/// Turns a handler's result into a response, counting errors.
pub(crate) fn respond(app: &AppState, result: Result<Response, ApiError>) -> Response {
    match result {
        Ok(r) => r,
        Err(e) => {
            app.metrics.count_error(e.status.as_u16());
            OllamaError(e).into_response()
        }
    }
}

/// A streamed NDJSON response.
pub(crate) fn ndjson(lines: impl Stream<Item = String> + Send + 'static) -> Response {
    let body = Body::from_stream(lines.map(|l| Ok::<_, Infallible>(Bytes::from(l))));
    let mut r = (StatusCode::OK, body).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    r
}

/// One NDJSON line.
pub(crate) fn line<T: serde::Serialize>(value: &T) -> String {
    let mut s = serde_json::to_string(value).unwrap_or_default();
    s.push('\n');
    s
}

/// `details` of a model from its loaded description.
pub(crate) fn details(info: &pagoda_model::source::ModelInfo, format: &str) -> ModelDetails {
    ModelDetails {
        parent_model: String::new(),
        format: format.to_string(),
        family: info.architecture.clone(),
        families: Some(vec![info.architecture.clone()]),
        parameter_size: parameter_size(info.parameter_count),
        quantization_level: info.file_type.clone(),
    }
}

/// `134.5M`, `1.5B`, as Ollama writes parameter counts.
pub(crate) fn parameter_size(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1}M", n / 1e6)
    } else {
        format!("{n}")
    }
}
