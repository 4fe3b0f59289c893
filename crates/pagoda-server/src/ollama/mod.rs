//! The Ollama API: `/api/generate`, `/api/chat` (NDJSON streams), `/api/tags`, `/api/show`,
//! `/api/ps`, `/api/pull`, `/api/delete`, `/api/version`, `/api/embed`, and `/api/create` /
//! `/api/copy` (`create.rs`: derived models and second names of models already in the store).
//! Shared here: `options` → [`Knobs`], `keep_alive`, the NDJSON response, and model details.
//!
//! Invariant: errors leave as `{"error": "..."}` with the status the server maps them to.

mod create;
mod embed;
mod generate;
mod models;

use crate::error::{ApiError, OllamaError};
use crate::registry::KeepAlive;
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use futures_util::{Stream, StreamExt};
use pagoda_protocol::ollama::{self, ModelDetails, Options};
use pagoda_runtime::Knobs;
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

/// `options` as generation knobs (`num_predict` < 0: until the context is full); keys beyond
/// the implemented ones are checked by `pagoda_runtime::fields` (accepted runner sizes, else
/// a 400 naming `options.KEY`).
pub(crate) fn knobs(options: Option<&Options>) -> Result<Knobs, ApiError> {
    let mut k = Knobs {
        n: 1,
        ..Knobs::default()
    };
    let Some(o) = options else {
        return Ok(k);
    };
    pagoda_runtime::fields::check_ollama_options(&o.extra)?;
    k.temperature = o.temperature;
    k.top_k = o.top_k;
    k.top_p = o.top_p;
    k.min_p = o.min_p;
    k.repetition_penalty = o.repeat_penalty;
    k.repeat_last_n = o.repeat_last_n;
    k.presence_penalty = o.presence_penalty;
    k.frequency_penalty = o.frequency_penalty;
    k.seed = o.seed.and_then(|s| u64::try_from(s).ok());
    k.stop = o.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    k.max_tokens = match o.num_predict {
        None => None,
        Some(n) if n < 0 => None,
        Some(0) => {
            return Err(ApiError::invalid_param(
                "options.num_predict",
                "num_predict must be positive (or -1 for no limit)",
            ))
        }
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    Ok(k)
}

/// The request's `keep_alive`: `None` when not given.
pub(crate) fn keep_alive(k: Option<&ollama::KeepAlive>) -> Result<Option<KeepAlive>, ApiError> {
    k.map(|k| k.duration())
        .transpose()
        .map_err(|e| ApiError::invalid_param("keep_alive", e.to_string()))
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
