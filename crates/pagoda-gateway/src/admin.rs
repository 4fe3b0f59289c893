//! The operator's API under `/admin`, guarded by the admin key (`Authorization: Bearer ...`):
//! keys (create, list, revoke), rollouts (status and history, promote, pause, resume, abort, restart), usage
//! aggregates for billing, the config in force with the last reload's outcome, an immediate
//! reload, and the replicas' state.
//!
//! Invariants: the admin key is compared by hash and never logged; no response contains a
//! stored key hash; a key's plaintext is returned once, by the create call.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::json;

use crate::error::ApiError;
use crate::keys::{parse_bearer, KeyError, NewKey};
use crate::rollout::{Action, RolloutError};
use crate::state::Gateway;
use crate::usage::UsageQuery;

pub fn router() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/admin/keys", get(list_keys).post(create_key))
        .route("/admin/keys/{id}", delete(revoke_key).get(get_key))
        .route("/admin/rollouts", get(rollouts))
        .route("/admin/rollouts/{route}/{action}", post(rollout_action))
        .route("/admin/usage", get(usage))
        .route("/admin/config", get(config))
        .route("/admin/reload", post(reload))
        .route("/admin/upstreams", get(upstreams))
}

fn admin(gw: &Gateway, headers: &HeaderMap) -> Result<(), ApiError> {
    if !gw.admin_enabled() {
        return Err(ApiError::forbidden(
            "the admin API is disabled: start the gateway with PAGODA_GATEWAY_ADMIN_KEY set (or server.admin_key_env)",
        ));
    }
    let header = headers.get("authorization").and_then(|v| v.to_str().ok());
    let presented = parse_bearer(header).map_err(|_| {
        ApiError::unauthorized("the admin API needs `Authorization: Bearer <admin key>`")
    })?;
    if gw.is_admin(presented) {
        Ok(())
    } else {
        Err(ApiError::unauthorized("not the admin key"))
    }
}

fn key_error(e: KeyError) -> ApiError {
    match e {
        KeyError::NotFound(_) => ApiError::not_found(e.to_string()),
        KeyError::Duplicate(_) | KeyError::Invalid(_) | KeyError::FromConfig(_) => {
            ApiError::bad_request(e.to_string())
        }
        other => ApiError::internal(other.to_string()),
    }
}

type AdminResult = Result<Response, ApiError>;

async fn list_keys(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> AdminResult {
    admin(&gw, &headers)?;
    let keys = gw.keys.list().map_err(key_error)?;
    Ok(Json(json!({"data": keys})).into_response())
}

async fn get_key(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> AdminResult {
    admin(&gw, &headers)?;
    Ok(Json(gw.keys.get(&id).map_err(key_error)?).into_response())
}

async fn create_key(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> AdminResult {
    admin(&gw, &headers)?;
    let new: NewKey = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("bad key request: {e}")))?;
    let config = gw.config();
    if let Some(m) = new.models.iter().find(|m| config.route(m).is_none()) {
        return Err(ApiError::bad_request(format!(
            "model '{m}' is not a route of this gateway"
        )));
    }
    let (record, plaintext) = gw.keys.create(new).map_err(key_error)?;
    tracing::info!(key = %record.name, id = %record.id, "API key created");
    Ok((
        axum::http::StatusCode::CREATED,
        Json(json!({"key": plaintext, "record": record})),
    )
        .into_response())
}

async fn revoke_key(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> AdminResult {
    admin(&gw, &headers)?;
    let record = gw.keys.revoke(&id).map_err(key_error)?;
    tracing::info!(key = %record.name, id = %record.id, "API key revoked");
    Ok(Json(record).into_response())
}

async fn rollouts(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> AdminResult {
    admin(&gw, &headers)?;
    Ok(Json(json!({"data": gw.rollouts.status_with_history().await})).into_response())
}

async fn rollout_action(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path((route, action)): Path<(String, String)>,
) -> AdminResult {
    admin(&gw, &headers)?;
    let Some(action) = Action::parse(&action) else {
        return Err(ApiError::not_found(format!(
            "unknown rollout action '{action}': use promote, pause, resume, abort or restart"
        )));
    };
    match gw.rollouts.act(&route, action).await {
        Ok(status) => Ok(Json(status).into_response()),
        Err(e @ RolloutError::UnknownRoute(_)) => Err(ApiError::not_found(e.to_string())),
        Err(e @ RolloutError::Shared(_)) => Err(ApiError::unavailable(e.to_string())),
        Err(e) => Err(ApiError::conflict(e.to_string())),
    }
}

async fn usage(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> AdminResult {
    admin(&gw, &headers)?;
    let number = |name: &str| -> Result<Option<u64>, ApiError> {
        q.get(name)
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!("`{name}` must be milliseconds since the epoch"))
                })
            })
            .transpose()
    };
    let query = UsageQuery {
        since_ms: number("since_ms")?,
        until_ms: number("until_ms")?,
        key: q.get("key").cloned(),
    };
    gw.usage.flush().await;
    let rows = gw
        .usage
        .aggregate(&query)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(json!({"data": rows, "dropped_records": gw.usage.dropped()})).into_response())
}

async fn config(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> AdminResult {
    admin(&gw, &headers)?;
    let mut config = (*gw.config()).clone();
    config.server.admin_key = config.server.admin_key.map(|_| "<redacted>".into());
    for t in &mut config.targets {
        t.api_key = t.api_key.as_ref().map(|_| "<redacted>".into());
    }
    Ok(Json(json!({"config": config, "reload": gw.reload_status()})).into_response())
}

async fn reload(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> AdminResult {
    admin(&gw, &headers)?;
    match crate::reload::reload_now(&gw) {
        Ok(()) => {
            Ok(Json(json!({"status": "applied", "reload": gw.reload_status()})).into_response())
        }
        Err(reason) => Err(ApiError::bad_request(format!(
            "config rejected, the previous one stays: {reason}"
        ))),
    }
}

#[derive(Serialize)]
struct ReplicaView {
    target: String,
    url: String,
    available: bool,
    outstanding: usize,
    circuit: String,
}

async fn upstreams(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> AdminResult {
    admin(&gw, &headers)?;
    let config = gw.config();
    let mut out = Vec::new();
    for t in &config.targets {
        if let Some(pool) = gw.upstreams.pool(&t.name) {
            for r in pool.replicas() {
                out.push(ReplicaView {
                    target: t.name.clone(),
                    url: r.url.clone(),
                    available: r.is_available(),
                    outstanding: r.outstanding(),
                    circuit: format!("{:?}", r.breaker_state()),
                });
            }
        }
    }
    Ok(Json(json!({"data": out})).into_response())
}
