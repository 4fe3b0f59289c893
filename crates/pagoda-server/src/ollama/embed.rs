//! `/api/embed` (a text or a list; `truncate`, default true as in Ollama, cuts inputs to the
//! model's window, false makes an over-long input a 400) and the older `/api/embeddings`
//! (`prompt` → one `embedding`).

use super::respond;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_protocol::ollama::{EmbedInput, EmbedRequest, EmbedResponse};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// The legacy `/api/embeddings` request.
#[derive(Debug, Deserialize)]
struct LegacyRequest {
    model: String,
    #[serde(default)]
    prompt: String,
}

/// The legacy `/api/embeddings` response.
#[derive(Debug, Serialize)]
struct LegacyResponse {
    embedding: Vec<f32>,
}

pub(super) async fn embed(State(app): State<AppState>, body: Body) -> Response {
    let result = run_embed(&app, body).await;
    respond(&app, result)
}

pub(super) async fn embeddings(State(app): State<AppState>, body: Body) -> Response {
    let result = run_legacy(&app, body).await;
    respond(&app, result)
}

async fn run_embed(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let started = Instant::now();
    let req: EmbedRequest = crate::body::json(body, app.body_limits()).await?;
    let texts = match req.input {
        EmbedInput::One(t) => vec![t],
        EmbedInput::Many(v) => v,
    };
    if texts.is_empty() || texts.len() > crate::openai::MAX_EMBEDDING_INPUTS {
        return Err(ApiError::invalid_param(
            "input",
            format!(
                "send between 1 and {} inputs, got {}",
                crate::openai::MAX_EMBEDDING_INPUTS,
                texts.len()
            ),
        ));
    }
    let truncate = req.truncate.unwrap_or(true);
    let (name, vectors, tokens, load) = embed_texts(app, &req.model, texts, truncate).await?;
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    Ok(Json(EmbedResponse {
        model: name,
        embeddings: vectors,
        total_duration: nanos(started.elapsed()),
        load_duration: nanos(load),
        prompt_eval_count: tokens,
    })
    .into_response())
}

async fn run_legacy(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: LegacyRequest = crate::body::json(body, app.body_limits()).await?;
    let (_, mut vectors, _, _) = embed_texts(app, &req.model, vec![req.prompt], true).await?;
    let embedding = vectors.pop().unwrap_or_default();
    Ok(Json(LegacyResponse { embedding }).into_response())
}

/// Embeds `texts` with model `name`: (canonical name, vectors, tokens, load time).
async fn embed_texts(
    app: &AppState,
    name: &str,
    texts: Vec<String>,
    truncate: bool,
) -> Result<(String, Vec<Vec<f32>>, usize, Duration), ApiError> {
    let was_loaded = app.embedders.loaded().iter().any(|m| m.name == name);
    let loading = Instant::now();
    let served = app.embedders.acquire(name).await?;
    let load = if was_loaded {
        Duration::ZERO
    } else {
        loading.elapsed()
    };
    let model = served.clone();
    let embedded = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        model.model.embed(&refs)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::invalid_param("input", e.to_string()))?;
    if !truncate {
        if let Some(i) = embedded.iter().position(|e| e.truncated) {
            return Err(ApiError::invalid_param(
                "input",
                format!(
                    "input {i} is longer than this model's {} tokens and truncate is false",
                    served.model.max_seq_len()
                ),
            ));
        }
    }
    let tokens = embedded.iter().map(|e| e.tokens).sum();
    let vectors = embedded.into_iter().map(|e| e.vector).collect();
    Ok((served.name.clone(), vectors, tokens, load))
}
