//! `GET /v1/models` (every model in the store, loaded models given by path, and the loaded
//! LoRA adapters with `parent` = their base model) and
//! `GET /v1/models/{id}`.

use super::respond;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_protocol::openai::{ModelCard, ModelList};
use std::time::UNIX_EPOCH;

pub(super) async fn list(State(app): State<AppState>) -> Response {
    let result = cards(&app)
        .await
        .map(|c| Json(ModelList::new(c)).into_response());
    respond(&app, result)
}

pub(super) async fn one(State(app): State<AppState>, Path(id): Path<String>) -> Response {
    let result = cards(&app).await.and_then(|cards| {
        cards
            .into_iter()
            .find(|c| c.id == id)
            .map(|c| Json(c).into_response())
            .ok_or_else(|| ApiError::model_not_found(&id))
    });
    respond(&app, result)
}

/// Store models (name:tag) and loaded models that are not in the store, the server's default
/// model first.
pub(crate) async fn cards(app: &AppState) -> Result<Vec<ModelCard>, ApiError> {
    let store = app.registry.store().clone();
    let listed = tokio::task::spawn_blocking(move || store.list())
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::internal(format!("cannot list the store: {e}")))?;
    let mut cards: Vec<ModelCard> = listed
        .into_iter()
        .map(|m| {
            let created = m
                .modified
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            ModelCard::new(m.name, created)
        })
        .collect();
    for m in app.registry.loaded() {
        if !cards.iter().any(|c| c.id == m.name) {
            let created = m
                .loaded_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            cards.push(ModelCard::new(m.name.clone(), created));
        }
    }
    for a in app.registry.adapters.list() {
        let created = a
            .loaded_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut card = ModelCard::new(a.name.clone(), created);
        card.root = Some(a.path.display().to_string());
        card.parent = Some(a.base.clone());
        cards.push(card);
    }
    // The model that answers requests naming none comes first: clients (the chat page among
    // them) that take the first entry get a model that chats, not whatever sorts first.
    if let Some(default) = app.config.models.first() {
        if let Some(at) = cards.iter().position(|c| &c.id == default) {
            let card = cards.remove(at);
            cards.insert(0, card);
        }
    }
    Ok(cards)
}
