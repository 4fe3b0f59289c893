//! `GET /v1/models` (every model in the store, loaded models given by path, and the loaded
//! LoRA adapters with `parent` = their base model) and
//! `GET /v1/models/{id}`. Each card says what its model does in `capabilities`
//! (`completion` or `embedding`, as the loader tells them apart), so a client such as the
//! chat page can offer only the models that chat.

use super::respond;
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_protocol::openai::{ModelCard, ModelList};
use pagoda_runtime::loader::{self, ModelKind};
use pagoda_store::{Format, ManifestSummary, Store};
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
    let listed = tokio::task::spawn_blocking(move || {
        store.list().map(|listed| {
            listed
                .into_iter()
                .map(|m| {
                    let kind = kind_of_stored(&store, &m);
                    (m, kind)
                })
                .collect::<Vec<_>>()
        })
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| ApiError::internal(format!("cannot list the store: {e}")))?;
    let mut cards: Vec<ModelCard> = listed
        .into_iter()
        .map(|(m, kind)| {
            let created = m
                .modified
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let mut card = ModelCard::new(m.name, created);
            card.capabilities = kind.map(capabilities);
            card
        })
        .collect();
    // The registry serves generative models only (embedding models are `Embedders`').
    for m in app.registry.loaded() {
        if !cards.iter().any(|c| c.id == m.name) {
            let created = m
                .loaded_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let mut card = ModelCard::new(m.name.clone(), created);
            card.capabilities = Some(capabilities(ModelKind::Generative));
            cards.push(card);
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
        card.capabilities = Some(capabilities(ModelKind::Generative));
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

/// What a stored model is, as loading would decide ([`loader::kind_of`]); `None` when its
/// files cannot be laid out (the card then says nothing rather than guess).
fn kind_of_stored(store: &Store, model: &ManifestSummary) -> Option<ModelKind> {
    match model.format {
        // A sentence encoder is a Hugging Face folder; a GGUF file is always generative here.
        Format::Gguf => Some(ModelKind::Generative),
        Format::HfFolder => match store.resolve(&model.name) {
            Ok(Some(resolved)) => Some(loader::kind_of(&resolved.path)),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(model = %model.name, error = %e, "cannot tell what the model does");
                None
            }
        },
    }
}

/// A card's `capabilities` for a model of `kind`.
fn capabilities(kind: ModelKind) -> Vec<String> {
    let word = match kind {
        ModelKind::Generative => "completion",
        ModelKind::Embedding => "embedding",
    };
    vec![word.to_string()]
}
