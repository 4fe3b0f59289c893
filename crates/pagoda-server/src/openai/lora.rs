//! vLLM's runtime LoRA routes: `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` (plus
//! Pagoda's optional `base_model`) and `POST /v1/unload_lora_adapter {"lora_name"}`. The
//! adapters themselves live in [`Adapters`](crate::adapters::Adapters) on the registry.
//!
//! `lora_path` must lie under a directory the operator allowed (`--allow-model-dir`, as for
//! model paths; see `names.rs`), so a client cannot make the server open other files.
//!
//! Status codes: 200 with a one-line text body on success (as vLLM); 400 for a bad body, a
//! taken name, a path outside the allowed directories (the same answer whether or not it
//! exists), a path that is not a usable PEFT folder or an adapter that does not fit the
//! base (the message says why); 404 for an unknown base model or, on unload, an unknown
//! adapter.

use super::respond;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use pagoda_protocol::openai::{LoadLoraAdapterRequest, UnloadLoraAdapterRequest};
use std::path::PathBuf;

pub(super) async fn load(State(app): State<AppState>, body: Body) -> Response {
    let result = run_load(&app, body).await;
    respond(&app, result)
}

pub(super) async fn unload(State(app): State<AppState>, body: Body) -> Response {
    let result = async {
        let req: UnloadLoraAdapterRequest = crate::body::json(body, app.body_limits()).await?;
        app.registry.adapters.unload(&req.lora_name)?;
        Ok(format!(
            "Success: LoRA adapter '{}' removed successfully.",
            req.lora_name
        )
        .into_response())
    }
    .await;
    respond(&app, result)
}

async fn run_load(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: LoadLoraAdapterRequest = crate::body::json(body, app.body_limits()).await?;
    let base = match req.base_model.as_deref() {
        Some(b) if !b.trim().is_empty() => b.to_string(),
        _ => default_base(app)?,
    };
    // A client names a folder on the server: only under the operator's allowed directories.
    let path = app
        .registry
        .names()
        .allowed_path(&PathBuf::from(&req.lora_path), "lora_path")?;
    load_adapter(app, &req.lora_name, path, &base).await?;
    Ok(format!(
        "Success: LoRA adapter '{}' added successfully.",
        req.lora_name
    )
    .into_response())
}

/// The base an adapter is for when the request names none: the server's first model, else
/// the one loaded model.
fn default_base(app: &AppState) -> Result<String, ApiError> {
    if let Some(first) = app.config.models.first() {
        return Ok(first.clone());
    }
    let loaded = app.registry.loaded();
    match loaded.as_slice() {
        [one] => Ok(one.name.clone()),
        _ => Err(ApiError::invalid_param(
            "base_model",
            "say which model the adapter is for with \"base_model\" (the server was started without a model)",
        )),
    }
}

/// Loads the adapter at `path` as `name` for model `base` (loading the base if needed).
pub(crate) async fn load_adapter(
    app: &AppState,
    name: &str,
    path: PathBuf,
    base: &str,
) -> Result<(), ApiError> {
    crate::adapters::check_name(name)?;
    let lease = app.registry.acquire_base(base, None).await?;
    let model = lease.loaded.model.clone();
    let key = lease.name.clone();
    drop(lease);
    let registry = app.registry.clone();
    let name = name.to_string();
    tokio::task::spawn_blocking(move || registry.adapters.load(&name, &path, &key, &model))
        .await
        .map_err(|e| ApiError::internal(format!("adapter load failed: {e}")))??;
    Ok(())
}
