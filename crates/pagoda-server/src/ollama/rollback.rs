//! `POST /api/rollback {"model": NAME, "digest": optional}`: Pagoda's own route (Ollama has
//! none) over [`Store::rollback`](pagoda_store::Store::rollback), the HTTP form of
//! `pagoda rollback`.
//!
//! Owns the route's answers: 200 `{"status":"success","model","from","to"}` (full digests);
//! 404 for a name not in the store; 409 when no previous version is kept; 400 naming `digest`
//! for a digest that matches no kept version, several, or the current one; 400 naming `model`
//! for a missing or invalid name. Invariants: a refused rollback changes nothing; a served
//! model is not unloaded: the registry's hot reload sees the tag's new version and switches to
//! it, requests in flight finishing on the old one, as after a pull.

use super::respond;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_protocol::ollama::{RollbackRequest, RollbackResponse};
use pagoda_store::StoreError;

pub(super) async fn rollback(State(app): State<AppState>, body: Body) -> Response {
    let result = run_rollback(&app, body).await;
    respond(&app, result)
}

async fn run_rollback(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: RollbackRequest = crate::body::json(body, app.body_limits()).await?;
    let name = req.model.trim().to_string();
    if name.is_empty() {
        return Err(ApiError::invalid_param(
            "model",
            "name the model to roll back in `model`",
        ));
    }
    let store = app.registry.store().clone();
    let (owned, digest) = (name.clone(), req.digest.clone());
    let done = tokio::task::spawn_blocking(move || store.rollback(&owned, digest.as_deref()))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| match e {
            StoreError::NotFound { .. } => ApiError::model_not_found(&name),
            StoreError::InvalidName { .. } => ApiError::invalid_param("model", e.to_string()),
            StoreError::NoPreviousVersion { .. } => {
                ApiError::conflict(e.to_string()).with_param("model")
            }
            StoreError::UnknownVersion { .. }
            | StoreError::AmbiguousVersion { .. }
            | StoreError::VersionIsCurrent { .. } => {
                ApiError::invalid_param("digest", e.to_string())
            }
            other => ApiError::internal(format!("rollback failed: {other}")),
        })?;
    tracing::info!(model = %done.name, from = %done.from, to = %done.to, "rolled back");
    Ok(Json(RollbackResponse {
        status: "success".into(),
        model: done.name.to_string(),
        from: done.from,
        to: done.to,
    })
    .into_response())
}
