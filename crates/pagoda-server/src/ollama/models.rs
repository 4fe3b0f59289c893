//! Model management the Ollama way: `/api/tags` (the store), `/api/ps` (loaded models),
//! `/api/show`, `/api/pull` (with a progress stream), `/api/delete`, `/api/version`.

use super::{details, line, ndjson, respond};
use crate::clock::rfc3339;
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_protocol::ollama::{
    ListedModel, ModelDetails, ProgressResponse, PsResponse, PullRequest, RunningModel,
    ShowRequest, ShowResponse, TagsResponse, VersionResponse,
};
use pagoda_store::{PullOptions, StoreError};
use std::time::SystemTime;

pub(super) async fn version() -> Json<VersionResponse> {
    Json(VersionResponse {
        version: env!("CARGO_PKG_VERSION").to_string(),
    })
}

pub(super) async fn tags(State(app): State<AppState>) -> Response {
    let result = list_tags(&app).await;
    respond(&app, result)
}

async fn list_tags(app: &AppState) -> Result<Response, ApiError> {
    let store = app.registry.store().clone();
    let listed = tokio::task::spawn_blocking(move || store.list())
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::internal(format!("cannot list the store: {e}")))?;
    let loaded = app.registry.loaded();
    let models = listed
        .into_iter()
        .map(|m| {
            let details = loaded
                .iter()
                .find(|l| l.name == m.name)
                .map(|l| details(&l.loaded.info, &m.format.to_string()))
                .unwrap_or_else(|| ModelDetails {
                    format: m.format.to_string(),
                    ..ModelDetails::default()
                });
            ListedModel {
                model: m.name.clone(),
                name: m.name,
                modified_at: rfc3339(m.modified),
                size: m.size,
                digest: m
                    .digest
                    .to_string()
                    .trim_start_matches("sha256:")
                    .to_string(),
                details,
            }
        })
        .collect();
    Ok(Json(TagsResponse { models }).into_response())
}

pub(super) async fn ps(State(app): State<AppState>) -> Json<PsResponse> {
    let models = app
        .registry
        .loaded()
        .iter()
        .map(|m| RunningModel {
            name: m.name.clone(),
            model: m.name.clone(),
            size: m.resident_bytes(),
            digest: m.version.trim_start_matches("sha256:").to_string(),
            details: details(&m.loaded.info, format_of(&m.loaded.path)),
            // Kept forever: Ollama reports the farthest time it can, not a date in the past.
            expires_at: rfc3339(m.expires_at().unwrap_or_else(far_future)),
            // Everything runs on the CPU.
            size_vram: 0,
        })
        .collect();
    Json(PsResponse { models })
}

/// What `expires_at` says of a model kept loaded forever (as Ollama: ~290 years ahead).
fn far_future() -> SystemTime {
    SystemTime::now() + std::time::Duration::from_secs(290 * 365 * 24 * 3600)
}

fn format_of(path: &std::path::Path) -> &'static str {
    if path.is_dir() {
        "safetensors"
    } else {
        "gguf"
    }
}

pub(super) async fn show(State(app): State<AppState>, body: Body) -> Response {
    let result = run_show(&app, body).await;
    respond(&app, result)
}

async fn run_show(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: ShowRequest = crate::body::json(body, app.body_limits()).await?;
    let name = req.model_name().to_string();
    if name.is_empty() {
        return Err(ApiError::invalid_param("model", "name a model"));
    }
    let lease = app.registry.acquire(&name, None).await?;
    let loaded = &lease.loaded;
    let info = &loaded.info;
    let s = &loaded.default_sampling;
    let mut parameters = format!(
        "temperature {}\ntop_k {}\ntop_p {}\nmin_p {}\nrepeat_penalty {}",
        s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty
    );
    for stop in &loaded.default_stop {
        parameters.push_str(&format!(
            "\nstop {}",
            serde_json::Value::from(stop.as_str())
        ));
    }
    if let Some(n) = loaded.default_max_tokens {
        parameters.push_str(&format!("\nnum_predict {n}"));
    }
    if let Some(n) = loaded.context_limit {
        parameters.push_str(&format!("\nnum_ctx {n}"));
    }
    let mut model_info = serde_json::Map::new();
    let arch = &info.architecture;
    model_info.insert("general.architecture".into(), arch.clone().into());
    model_info.insert(
        "general.parameter_count".into(),
        info.parameter_count.into(),
    );
    model_info.insert(format!("{arch}.context_length"), info.context_length.into());
    // The model's name, not its path in the store: a client learns nothing of the disk.
    let mut modelfile = format!("FROM {}\n", lease.served_name());
    if !loaded.template_source.is_empty() {
        modelfile.push_str(&format!(
            "TEMPLATE \"\"\"{}\"\"\"\n",
            loaded.template_source
        ));
    }
    if let Some(system) = &loaded.default_system {
        modelfile.push_str(&format!("SYSTEM \"\"\"{system}\"\"\"\n"));
    }
    for l in parameters.lines() {
        modelfile.push_str(&format!("PARAMETER {l}\n"));
    }
    for m in &loaded.preset_messages {
        modelfile.push_str(&format!("MESSAGE {} \"\"\"{}\"\"\"\n", m.role, m.content));
    }
    Ok(Json(ShowResponse {
        modelfile,
        parameters,
        template: loaded.template_source.clone(),
        details: details(info, format_of(&loaded.path)),
        model_info,
        capabilities: vec!["completion".into()],
        modified_at: rfc3339(lease.loaded_at),
    })
    .into_response())
}

pub(super) async fn pull(State(app): State<AppState>, body: Body) -> Response {
    let result = run_pull(&app, body).await;
    respond(&app, result)
}

async fn run_pull(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: PullRequest = crate::body::json(body, app.body_limits()).await?;
    let name = req.model_name().to_string();
    if name.is_empty() {
        return Err(ApiError::invalid_param("model", "name a model to pull"));
    }
    let store = app.registry.store().clone();
    let allowed_urls = crate::pulls::check(&app.config.pull, &store, &name)?;
    let public_addresses_only = !app.config.pull.allow_private;
    let job = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || {
            store.pull(
                &name,
                &PullOptions {
                    progress: false,
                    name: None,
                    force: false,
                    public_addresses_only,
                    allowed_urls,
                },
            )
        })
    };
    let status = |s: &str| ProgressResponse {
        status: s.to_string(),
        ..ProgressResponse::default()
    };
    if !req.stream {
        let resolved = job
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| crate::pulls::refusal(&name, e))?;
        drop(resolved);
        return Ok(Json(status("success")).into_response());
    }
    let first = line(&status("pulling manifest"));
    let rest = async move {
        match job.await {
            Ok(Ok(resolved)) => {
                let mut out = String::new();
                if let Some(m) = &resolved.manifest {
                    for f in &m.files {
                        out.push_str(&line(&ProgressResponse {
                            status: format!("pulling {}", f.path),
                            digest: Some(f.digest.to_string()),
                            total: Some(f.size),
                            completed: Some(f.size),
                        }));
                    }
                }
                out.push_str(&line(&status("verifying sha256 digest")));
                out.push_str(&line(&status("writing manifest")));
                out.push_str(&line(&status("success")));
                out
            }
            Ok(Err(e)) => {
                let refusal = crate::pulls::refusal(&name, e);
                // The stream already said 200: the detail goes to the log here.
                tracing::warn!(model = %name, detail = ?refusal.detail, "pull failed");
                line(&pagoda_protocol::ollama::ErrorResponse {
                    error: refusal.message,
                })
            }
            Err(e) => {
                tracing::error!(model = %name, error = %e, "pull task failed");
                line(&pagoda_protocol::ollama::ErrorResponse {
                    error: "the pull failed inside the server; see its log".into(),
                })
            }
        }
    };
    let s =
        futures_util::stream::once(async move { first }).chain(futures_util::stream::once(rest));
    use futures_util::StreamExt as _;
    Ok(ndjson(s))
}

pub(super) async fn remove(State(app): State<AppState>, body: Body) -> Response {
    let result = run_remove(&app, body).await;
    respond(&app, result)
}

async fn run_remove(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: PullRequest = crate::body::json(body, app.body_limits()).await?;
    let name = req.model_name().to_string();
    if name.is_empty() {
        return Err(ApiError::invalid_param("model", "name a model to delete"));
    }
    app.registry.unload(&name);
    let store = app.registry.store().clone();
    let owned = name.clone();
    tokio::task::spawn_blocking(move || store.remove(&owned))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| match e {
            StoreError::NotFound { .. } | StoreError::InvalidName { .. } => {
                ApiError::model_not_found(&name)
            }
            other => ApiError::internal(other.to_string()),
        })?;
    let _ = SystemTime::now();
    Ok(StatusCode::OK.into_response())
}
