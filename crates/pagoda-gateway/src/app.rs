//! The client-facing HTTP API: `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
//! `/v1/models`, `/v1/feedback`, plus `/metrics`, `/health`, `/ready` and the admin routes.
//!
//! One request, in order: body (size-limited) -> key -> JSON and model -> key's model list ->
//! limits (an estimate is reserved) -> cache -> route -> proxy -> relay -> accounting (the
//! reservation settled on the real usage, ledger row, metrics, rollout statistics).
//!
//! Every response of the router, errors and unknown paths included, carries `x-request-id`
//! (`request_id.rs`); the id names the request in the log, the ledger and upstream. Unless
//! `server.expose_upstream_details` is on, what clients see names the route, never the
//! upstream: relayed answers go through a `privacy::Redaction`, and a failed chain answers
//! with the route and the request id while the details go to the log.
//!
//! Invariants: every admitted request ends in exactly one accounting call (`Ticket::finish`,
//! or `Ticket`'s `Drop` when the client hung up before the answer), whether it was served,
//! cached, failed or abandoned mid-stream; a reservation is settled or released exactly once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body as AxumBody;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

use crate::cache::{cache_key, CacheStatus, CachedResponse, CACHE_STATUS_HEADER, NO_CACHE_HEADER};
use crate::config::{Balance, GatewayConfig, RouteConfig};
use crate::error::ApiError;
use crate::keys::{parse_bearer, AuthError, KeyRecord};
use crate::limits::{LimitError, LimitKind, Reservation};
use crate::metrics::ErrorKind;
use crate::privacy::Redaction;
use crate::proxy::stream::{relay, RelayOptions, StreamTally};
use crate::proxy::{forward, Body, Endpoint, Exhausted, Forward, ForwardContext, Served};
use crate::request_id::RequestId;
use crate::rollout::Outcome;
use crate::route::{choose, RouteRequest};
use crate::state::{now_ms, Gateway};
use crate::upstream::{Pick, PrefixBlocks};
use crate::usage::UsageRecord;

/// Completion tokens assumed for a request that sets no `max_tokens`.
const DEFAULT_COMPLETION_ESTIMATE: u64 = 512;
/// How much of a passed-through upstream error body the log line quotes.
const LOGGED_ERROR_BODY_BYTES: usize = 1024;
/// Part of the cache scope of answers stored with the route's name in them, so that neither
/// an entry stored before (naming the backend) nor one stored while
/// `server.expose_upstream_details` was on is served to a client that must see the route.
const ROUTE_NAMED_SCOPE: &str = ":route-named";

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/v1/feedback", post(feedback))
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .merge(crate::admin::router())
        .fallback(unknown_endpoint)
        .layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            crate::request_id::assign,
        ))
        .with_state(gateway)
}

async fn unknown_endpoint(method: Method, uri: Uri) -> Response {
    ApiError::not_found(format!(
        "no endpoint {method} {} on this gateway (POST /v1/chat/completions, /v1/completions, /v1/embeddings; GET /v1/models)",
        uri.path()
    ))
    .into_response()
}

async fn chat(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    handle(gw, Endpoint::Chat, req).await
}

async fn completions(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    handle(gw, Endpoint::Completions, req).await
}

async fn embeddings(State(gw): State<Arc<Gateway>>, req: Request) -> Response {
    handle(gw, Endpoint::Embeddings, req).await
}

async fn ready(State(gw): State<Arc<Gateway>>) -> Response {
    let config = gw.config();
    let any_up = config.targets.iter().any(|t| {
        t.canned_reply.is_some()
            || gw
                .upstreams
                .pool(&t.name)
                .is_some_and(|p| p.replicas().iter().any(|r| r.is_available()))
    });
    if any_up {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no replica is available").into_response()
    }
}

async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    gw.refresh_gauges();
    (
        [("content-type", "text/plain; version=0.0.4")],
        gw.metrics.render(),
    )
        .into_response()
}

/// The caller's key, from `Authorization: Bearer ...`.
pub(crate) fn authenticate(gw: &Gateway, headers: &HeaderMap) -> Result<KeyRecord, ApiError> {
    let header = headers.get("authorization").and_then(|v| v.to_str().ok());
    let presented = parse_bearer(header).map_err(auth_error)?;
    gw.keys.authenticate(presented).map_err(auth_error)
}

fn auth_error(e: AuthError) -> ApiError {
    match e {
        AuthError::Missing => ApiError::unauthorized(
            "no API key: send `Authorization: Bearer <key>` (an admin creates keys with `pagoda gateway keys create`)",
        ),
        AuthError::Malformed => {
            ApiError::unauthorized("malformed Authorization header: expected `Bearer <key>`")
        }
        AuthError::Unknown => ApiError::unauthorized("invalid API key"),
        AuthError::Revoked => ApiError::unauthorized("this API key has been revoked"),
        AuthError::Store(e) => {
            tracing::error!(error = %e, "key store unavailable");
            ApiError::upstream_unavailable("the gateway cannot check API keys right now; retry shortly")
        }
    }
}

async fn models(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let key = match authenticate(&gw, &headers) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let config = gw.config();
    let data: Vec<Value> = config
        .routes
        .iter()
        .filter(|r| key.allows_model(&r.model))
        .map(|r| serde_json::json!({"id": r.model, "object": "model", "created": 0, "owned_by": "pagoda-gateway"}))
        .collect();
    Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

#[derive(Deserialize)]
struct FeedbackBody {
    response_id: String,
    /// `up` / `down` (also `thumbs_up`, `positive`, ...), or a boolean `positive`.
    #[serde(default)]
    rating: Option<String>,
    #[serde(default)]
    positive: Option<bool>,
}

async fn feedback(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(e) = authenticate(&gw, &headers) {
        return e.into_response();
    }
    let fb: FeedbackBody = match serde_json::from_slice(&body) {
        Ok(f) => f,
        Err(e) => {
            return ApiError::bad_request(format!(
                "feedback must be {{\"response_id\": \"...\", \"rating\": \"up\"|\"down\"}}: {e}"
            ))
            .into_response()
        }
    };
    let positive = match (fb.positive, fb.rating.as_deref()) {
        (Some(p), _) => p,
        (None, Some("up" | "thumbs_up" | "positive" | "good" | "+1")) => true,
        (None, Some("down" | "thumbs_down" | "negative" | "bad" | "-1")) => false,
        _ => return ApiError::bad_request("`rating` must be \"up\" or \"down\"").into_response(),
    };
    match gw.rollouts.feedback(&fb.response_id, positive) {
        Ok(()) => Json(serde_json::json!({"status": "recorded"})).into_response(),
        Err(e) => ApiError::not_found(format!("{e}")).into_response(),
    }
}

/// Tokens charged per chat message for the template's role markers in the estimate.
const MESSAGE_OVERHEAD_TOKENS: u64 = 8;

/// The tokens a request may cost, reserved before it runs. It is meant as an upper bound so
/// that a budget holds exactly: no tokenizer makes more tokens than bytes, each message's
/// template adds a few, and the completion is bounded by `max_tokens` (when the request sets
/// none, [`DEFAULT_COMPLETION_ESTIMATE`] is a guess and the settlement corrects it).
fn estimate_tokens(body: &Value, endpoint: Endpoint) -> u64 {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, Vec::len) as u64;
    let prompt = prompt_text(body).len() as u64 + messages * MESSAGE_OVERHEAD_TOKENS + 1;
    if endpoint == Endpoint::Embeddings {
        return prompt;
    }
    let completion = body
        .get("max_completion_tokens")
        .or_else(|| body.get("max_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_COMPLETION_ESTIMATE);
    let n = body.get("n").and_then(Value::as_u64).unwrap_or(1).max(1);
    prompt + completion * n
}

/// The prompt as one string: chat messages' contents, a completion prompt, embedding input
/// (what token estimates count).
fn prompt_text(body: &Value) -> String {
    joined_prompt(body, false)
}

/// The prompt as prefix-aware routing sees it: as [`prompt_text`], with each message's role
/// before its content — part of what the engine renders (and caches) first, so two
/// conversations differing only in a role do not share a block.
fn routing_text(body: &Value) -> String {
    joined_prompt(body, true)
}

fn joined_prompt(body: &Value, with_roles: bool) -> String {
    fn push(out: &mut String, v: &Value) {
        match v {
            Value::String(s) => out.push_str(s),
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        for m in messages {
            if let Some(role) = m.get("role").and_then(Value::as_str).filter(|_| with_roles) {
                out.push_str(role);
                out.push(':');
            }
            if let Some(c) = m.get("content") {
                push(&mut out, c);
            }
            out.push('\n');
        }
    } else if let Some(p) = body.get("prompt").or_else(|| body.get("input")) {
        push(&mut out, p);
    }
    out
}

/// Everything the accounting needs about one request.
struct Ticket {
    gw: Arc<Gateway>,
    started: Instant,
    request_id: String,
    key: KeyRecord,
    route: String,
    first_choice: Option<String>,
    reservation: Option<Reservation>,
    cache_key: Option<String>,
    finished: bool,
}

/// How a request ended.
struct Ending {
    status: u16,
    version: String,
    replica: String,
    prompt_tokens: u64,
    completion_tokens: u64,
    ttft: Option<Duration>,
    cached: bool,
    fallback: bool,
    error: Option<String>,
    /// For the rollout: did the first-choice target serve it well?
    first_choice_ok: bool,
    response_id: Option<String>,
}

impl Ending {
    /// An ending where no backend's answer was relayed: failed, abandoned or served from cache.
    fn unserved(status: u16, error: Option<String>, first_choice_ok: bool) -> Self {
        Ending {
            status,
            version: String::new(),
            replica: String::new(),
            prompt_tokens: 0,
            completion_tokens: 0,
            ttft: None,
            cached: false,
            fallback: false,
            error,
            first_choice_ok,
            response_id: None,
        }
    }
}

impl Ticket {
    /// Settles limits, writes the ledger row, metrics and rollout statistics.
    fn finish(mut self, end: Ending) {
        self.complete(end);
    }

    /// The accounting itself; runs once (`finished` guards the `Drop` path).
    fn complete(&mut self, end: Ending) {
        if self.finished {
            return;
        }
        self.finished = true;
        let latency = self.started.elapsed();
        let gw = self.gw.clone();
        if let Some(first) = &self.first_choice {
            let served_by_first = end.version == *first;
            gw.rollouts.record(
                &self.route,
                first,
                Outcome {
                    ok: end.first_choice_ok,
                    latency,
                    ttft: if served_by_first { end.ttft } else { None },
                },
            );
            if let (Some(id), true) = (&end.response_id, served_by_first) {
                gw.rollouts.remember_response(id, &self.route, first);
            }
        }
        gw.metrics.observe_request(
            &self.route,
            &end.version,
            end.status,
            latency.as_secs_f64(),
            end.ttft.map(|t| t.as_secs_f64()),
        );
        gw.metrics.record_tokens(
            &self.key.name,
            &self.route,
            &end.version,
            end.prompt_tokens,
            end.completion_tokens,
        );
        gw.usage.record(UsageRecord {
            ts_ms: now_ms(),
            request_id: std::mem::take(&mut self.request_id),
            key_id: self.key.id.clone(),
            key_name: self.key.name.clone(),
            route: self.route.clone(),
            version: end.version,
            replica: end.replica,
            status: end.status,
            prompt_tokens: end.prompt_tokens,
            completion_tokens: end.completion_tokens,
            ttft_ms: end.ttft.map(|d| d.as_secs_f64() * 1000.0),
            latency_ms: latency.as_secs_f64() * 1000.0,
            cached: end.cached,
            fallback: end.fallback,
            error: end.error,
        });
        if let Some(reservation) = self.reservation.take() {
            let spent = end.prompt_tokens + end.completion_tokens;
            let charge = end.status < 400 && !end.cached;
            tokio::spawn(async move {
                let result = if charge {
                    gw.limiter.settle(reservation, spent).await
                } else {
                    gw.limiter.release(reservation).await
                };
                if let Err(e) = result {
                    tracing::error!(error = %e, "cannot settle a token reservation");
                }
            });
        }
    }
}

impl Drop for Ticket {
    /// A request whose handler was dropped before it answered (the client went away while
    /// the gateway waited upstream): its reservation is released and a 499 row recorded; the
    /// rollout does not count it against either version.
    fn drop(&mut self) {
        if self.finished || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.first_choice = None;
        self.complete(Ending::unserved(
            499,
            Some("the client went away before the answer".into()),
            true,
        ));
    }
}

/// Prompt tokens, completion tokens and the response id of a JSON answer.
fn usage_of(v: &Value) -> (u64, u64, Option<String>) {
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap_or(0),
        u["completion_tokens"].as_u64().unwrap_or(0),
        v["id"].as_str().map(str::to_string),
    )
}

async fn handle(gw: Arc<Gateway>, endpoint: Endpoint, req: Request) -> Response {
    let _in_flight = gw.metrics.in_flight();
    let started = Instant::now();
    match handle_inner(gw.clone(), endpoint, req).await {
        Ok(r) => r,
        Err(e) => {
            // Refused before routing (auth, body, limits): counted under an empty route.
            gw.metrics.observe_request(
                "",
                "",
                e.status.as_u16(),
                started.elapsed().as_secs_f64(),
                None,
            );
            e.into_response()
        }
    }
}

async fn handle_inner(
    gw: Arc<Gateway>,
    endpoint: Endpoint,
    req: Request,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let config = gw.config();
    let (parts, body) = req.into_parts();
    let request_id = match parts.extensions.get::<RequestId>() {
        Some(RequestId(id)) => id.clone(),
        None => gw.next_request_id(),
    };
    let headers = parts.headers;
    let key = authenticate(&gw, &headers)
        .inspect_err(|_| gw.metrics.record_error("", "", ErrorKind::Auth))?;
    let mut body = read_json_object(&config, body).await?;
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("`model` is required"))?
        .to_string();
    let route = config
        .route(&model)
        .ok_or_else(|| ApiError::model_not_found(&model))?;
    if !key.allows_model(&model) {
        gw.metrics.record_error(&model, "", ErrorKind::Auth);
        return Err(ApiError::forbidden(format!(
            "this API key may not use the model '{model}'"
        )));
    }
    let stream = endpoint != Endpoint::Embeddings
        && body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    gw.retry_budget.record_request(started);

    // Limits: reserve an estimate now, settle on the real usage at the end.
    let reservation = reserve(&gw, &config, &key, &model, estimate_tokens(&body, endpoint)).await?;
    let mut ticket = Ticket {
        gw: gw.clone(),
        started,
        request_id: request_id.clone(),
        key: key.clone(),
        route: model.clone(),
        first_choice: None,
        reservation,
        cache_key: None,
        finished: false,
    };

    let cache_status =
        match look_up_cache(&gw, &config, endpoint, &headers, &body, &mut ticket).await {
            CacheLookup::Hit(hit) => {
                let response = cached_response(&hit);
                ticket.finish(Ending {
                    cached: true,
                    ..Ending::unserved(hit.status, None, true)
                });
                return Ok(response);
            }
            CacheLookup::Forward(status) => status,
        };

    // Route.
    let user = routing_user(&body, &headers, &key);
    let decision = choose(
        route,
        &RouteRequest {
            tier: key.tier.as_deref(),
            group: key.group.as_deref(),
            headers: &headers,
            user: &user,
            draw: gw.split_draws.next(&model),
        },
        gw.rollouts.canary_percent(&model),
    );
    ticket.first_choice = Some(decision.target().to_string());
    let pick = replica_pick(route, &body);

    // Streams: ask the backend for usage so tokens can be charged; hide it if the client did not ask.
    let client_wants_usage = body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if stream {
        if let Some(obj) = body.as_object_mut() {
            obj.insert(
                "stream_options".into(),
                serde_json::json!({"include_usage": true}),
            );
        }
    }

    let ctx = ForwardContext {
        config: &config,
        upstreams: &gw.upstreams,
        client: &gw.client,
        retry_budget: &gw.retry_budget,
        metrics: &gw.metrics,
    };
    let result = forward(
        &ctx,
        Forward {
            endpoint,
            body,
            stream,
            pick,
            chain: &decision.chain,
            route: &model,
            request_id: &request_id,
            max_replays: route.max_replays(&config.retry),
        },
    )
    .await;
    match result {
        Err(exhausted) => Ok(failed(ticket, &exhausted, &config)),
        Ok(served) => Ok(respond(
            ticket,
            served,
            &config,
            AskedFor {
                stream,
                client_wants_usage,
                cache_status,
            },
        )
        .await),
    }
}

/// The request body, read within the configured size and time limits, as a JSON object.
async fn read_json_object(config: &GatewayConfig, body: AxumBody) -> Result<Value, ApiError> {
    let limit = config.server.max_body_bytes;
    let body_timeout = Duration::from_millis(config.server.body_timeout_ms);
    let bytes = match tokio::time::timeout(body_timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => return Err(ApiError::body_timeout(body_timeout)),
        Ok(Err(_)) => return Err(ApiError::too_large(limit)),
        Ok(Ok(b)) => b,
    };
    let body: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    Ok(body)
}

/// Reserves `estimate` tokens (and one request) against the key's limits: the reservation,
/// none when the limiter's store is down (served anyway: availability first), or the 429
/// that says which limit was reached.
async fn reserve(
    gw: &Gateway,
    config: &GatewayConfig,
    key: &KeyRecord,
    model: &str,
    estimate: u64,
) -> Result<Option<Reservation>, ApiError> {
    let limits = key.effective_limits(&config.default_limits);
    match gw.limiter.admit(&key.id, &limits, estimate).await {
        Ok(r) => Ok(Some(r)),
        Err(LimitError::RateLimited { retry_after, limit }) => {
            let what = match limit {
                LimitKind::Requests => "requests per minute",
                LimitKind::Tokens => "tokens per minute",
            };
            gw.metrics.record_error(model, "", ErrorKind::RateLimited);
            gw.metrics.record_rate_limited(
                &key.name,
                match limit {
                    LimitKind::Requests => "requests",
                    LimitKind::Tokens => "tokens",
                },
            );
            Err(ApiError::rate_limited(
                format!(
                    "rate limit reached for this key ({what}); retry after {:.1} s",
                    retry_after.as_secs_f64()
                ),
                retry_after,
            ))
        }
        Err(LimitError::BudgetExhausted { budget, spent }) => {
            gw.metrics
                .record_error(model, "", ErrorKind::BudgetExceeded);
            gw.metrics.record_rate_limited(&key.name, "budget");
            Err(ApiError::quota_exhausted(format!(
                "this key's token budget is spent ({spent} of {budget} tokens, including requests in flight); ask an admin to raise it"
            )))
        }
        Err(LimitError::ExceedsLimit {
            limit,
            requested,
            max,
        }) => {
            gw.metrics.record_error(model, "", ErrorKind::RateLimited);
            let what = match limit {
                LimitKind::Requests => "requests",
                LimitKind::Tokens => "tokens",
            };
            Err(ApiError::request_over_limit(format!(
                "this request needs {requested} {what} but the key's per-minute limit is {max}: lower max_tokens or shorten the prompt"
            )))
        }
        Err(e) => {
            // The limiter's store is down: serve (availability first) and say so.
            tracing::error!(error = %e, "rate limiter unavailable; admitting without limits");
            Ok(None)
        }
    }
}

/// What the response cache said about a request.
enum CacheLookup {
    /// A stored answer, to serve as it is.
    Hit(CachedResponse),
    /// Go upstream; the cache status the answer will carry (`miss` or `bypass`).
    Forward(&'static str),
}

/// Looks the request up in the response cache (unless it is off or the client opted out),
/// and notes on the ticket the key a fresh answer is stored under.
async fn look_up_cache(
    gw: &Gateway,
    config: &GatewayConfig,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &Value,
    ticket: &mut Ticket,
) -> CacheLookup {
    let bypass = headers
        .get(NO_CACHE_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches!(v, "no-cache" | "bypass" | "no-store"));
    if !config.cache.enabled || bypass {
        if bypass {
            gw.metrics.record_cache(CacheStatus::Bypass);
        }
        return CacheLookup::Forward("bypass");
    }
    // The endpoint is part of the scope: a chat and a text completion never share an entry.
    let scope = format!(
        "{}:{}{}",
        endpoint.path(),
        ticket.key.tier.as_deref().unwrap_or(""),
        if config.server.expose_upstream_details {
            ""
        } else {
            ROUTE_NAMED_SCOPE
        }
    );
    ticket.cache_key = cache_key(&ticket.route, &scope, body);
    let Some(k) = &ticket.cache_key else {
        return CacheLookup::Forward("bypass");
    };
    if let Some(hit) = gw.cache.get(k).await {
        gw.metrics.record_cache(CacheStatus::Hit);
        return CacheLookup::Hit(hit);
    }
    gw.metrics.record_cache(CacheStatus::Miss);
    CacheLookup::Forward("miss")
}

/// Who the request is for, as splits by user see it: the body's `user`, else the
/// `x-pagoda-user` header, else the key's id.
fn routing_user(body: &Value, headers: &HeaderMap, key: &KeyRecord) -> String {
    body.get("user")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            headers
                .get("x-pagoda-user")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_else(|| key.id.clone())
}

/// How the route's `balance` picks a replica for this body.
fn replica_pick(route: &RouteConfig, body: &Value) -> Pick {
    match route.balance() {
        Balance::LeastOutstanding => Pick::LeastOutstanding,
        Balance::RoundRobin => Pick::RoundRobin,
        Balance::Prefix => Pick::Prefix {
            blocks: PrefixBlocks::of(&routing_text(body)),
            slack: route.prefix_load_slack,
        },
    }
}

/// The answer when every target of the chain failed: in terms of the route and the request
/// id, or with the last failure's detail when `server.expose_upstream_details` is on; every
/// attempt's detail goes to the log either way.
fn failed(ticket: Ticket, exhausted: &Exhausted, config: &GatewayConfig) -> Response {
    let gw = ticket.gw.clone();
    for f in &exhausted.failures {
        gw.metrics
            .record_error(&ticket.route, &f.target, f.kind.metric());
    }
    let (route, request_id) = (ticket.route.as_str(), ticket.request_id.as_str());
    let error = match (
        exhausted.all_timeouts(),
        exhausted.replays_spent,
        config.server.expose_upstream_details,
    ) {
        (true, _, true) => ApiError::upstream_timeout(exhausted.summary()),
        (true, _, false) => ApiError::route_timeout(route, request_id),
        (false, true, true) => ApiError::upstream_dropped(exhausted.summary()),
        (false, true, false) => ApiError::route_dropped(route, request_id),
        (false, false, true) => ApiError::upstream_unavailable(exhausted.summary()),
        (false, false, false) => ApiError::route_unavailable(route, request_id),
    };
    tracing::warn!(
        %request_id,
        %route,
        status = error.status.as_u16(),
        detail = %exhausted.detail(),
        "no target of the route could serve the request"
    );
    ticket.finish(Ending::unserved(
        error.status.as_u16(),
        Some(exhausted.summary()),
        false,
    ));
    error.into_response()
}

/// A cached answer (stored as relayed, so already naming the route when it must).
fn cached_response(hit: &CachedResponse) -> Response {
    let mut response = Response::new(AxumBody::from(hit.body.clone()));
    *response.status_mut() = StatusCode::from_u16(hit.status).unwrap_or(StatusCode::OK);
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&hit.content_type) {
        h.insert("content-type", v);
    }
    h.insert(CACHE_STATUS_HEADER, HeaderValue::from_static("hit"));
    response
}

/// What the client asked of the answer's shape and the cache.
struct AskedFor {
    stream: bool,
    client_wants_usage: bool,
    cache_status: &'static str,
}

/// How answers of `served` are rewritten for the client: None when they are relayed as they
/// come (`server.expose_upstream_details`, or a canned reply, which names the route itself).
fn redaction_for(config: &GatewayConfig, route: &str, served: &Served) -> Option<Redaction> {
    if config.server.expose_upstream_details {
        return None;
    }
    let replica = served.replica.as_ref()?;
    let backend_model = config
        .target(&served.target)
        .map_or(served.target.as_str(), |t| t.upstream_model());
    Some(Redaction::new(route, backend_model, Some(&replica.url)))
}

async fn respond(
    ticket: Ticket,
    served: Served,
    config: &GatewayConfig,
    asked: AskedFor,
) -> Response {
    let AskedFor {
        stream,
        client_wants_usage,
        cache_status,
    } = asked;
    let gw = ticket.gw.clone();
    let redaction = redaction_for(config, &ticket.route, &served);
    for f in &served.failures {
        gw.metrics
            .record_error(&ticket.route, &f.target, f.kind.metric());
    }
    let fallback = served.chain_index > 0;
    if fallback {
        if let Some(first) = &ticket.first_choice {
            gw.metrics
                .record_fallback(&ticket.route, first, &served.target);
        }
    }
    let replica = served
        .replica
        .as_ref()
        .map(|r| r.url.clone())
        .unwrap_or_default();
    let first_choice_ok = !fallback && served.status < 500;
    let mut response_headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&served.content_type) {
        response_headers.insert("content-type", v);
    }
    if let Ok(v) = HeaderValue::from_str(&served.target) {
        response_headers.insert("x-pagoda-target", v);
    }
    response_headers.insert(CACHE_STATUS_HEADER, HeaderValue::from_static(cache_status));
    if fallback {
        response_headers.insert("x-pagoda-fallback", HeaderValue::from_static("true"));
    }
    let status = served.status;
    let body = match served.body {
        Body::Full(bytes) | Body::Canned(bytes) if !stream || status != 200 => {
            let parsed = serde_json::from_slice::<Value>(&bytes).ok();
            let (prompt_tokens, completion_tokens, response_id) =
                parsed.as_ref().map(usage_of).unwrap_or_default();
            if status >= 400 {
                let backend_model = config
                    .target(&served.target)
                    .map_or("", |t| t.upstream_model());
                log_passed_through(
                    &ticket,
                    &served.target,
                    backend_model,
                    &replica,
                    status,
                    &bytes,
                );
            }
            let bytes = match &redaction {
                Some(r) => r.rewrite_body(bytes, parsed, status >= 400),
                None => bytes,
            };
            // Only the first choice's real answers are cached: a fallback's or a canned reply
            // would outlive the outage that caused it.
            if status == 200 && !fallback && served.replica.is_some() {
                if let Some(k) = &ticket.cache_key {
                    let entry = CachedResponse {
                        status,
                        content_type: served.content_type.clone(),
                        body: bytes.clone(),
                    };
                    // Stored before answering, so the next identical request hits.
                    gw.cache.put(k, &entry).await;
                }
            }
            ticket.finish(Ending {
                status,
                version: served.target.clone(),
                replica,
                prompt_tokens,
                completion_tokens,
                ttft: None,
                cached: false,
                fallback,
                error: None,
                first_choice_ok,
                response_id,
            });
            AxumBody::from(bytes)
        }
        Body::Canned(bytes) => {
            let ttft = Some(ticket.started.elapsed());
            ticket.finish(Ending {
                status,
                version: served.target.clone(),
                replica,
                prompt_tokens: 0,
                completion_tokens: 0,
                ttft,
                cached: false,
                fallback,
                error: None,
                first_choice_ok,
                response_id: None,
            });
            AxumBody::from(bytes)
        }
        Body::Full(bytes) => {
            // A backend that answered a stream request with plain JSON: pass it on.
            let bytes = match &redaction {
                Some(r) => {
                    let parsed = serde_json::from_slice::<Value>(&bytes).ok();
                    r.rewrite_body(bytes, parsed, false)
                }
                None => bytes,
            };
            ticket.finish(Ending {
                status,
                version: served.target.clone(),
                replica,
                prompt_tokens: 0,
                completion_tokens: 0,
                ttft: None,
                cached: false,
                fallback,
                error: None,
                first_choice_ok,
                response_id: None,
            });
            AxumBody::from(bytes)
        }
        Body::Stream {
            first,
            rest,
            permit,
            idle_timeout,
        } => {
            let options = RelayOptions {
                started: ticket.started,
                idle_timeout,
                strip_usage_chunk: !client_wants_usage,
                copy_limit: if ticket.cache_key.is_some() {
                    config.cache.max_entry_bytes
                } else {
                    0
                },
                request_id: ticket.request_id.clone(),
                route: ticket.route.clone(),
                redaction,
            };
            let version = served.target.clone();
            let content_type = served.content_type.clone();
            let on_end = Box::new(move |tally: StreamTally| {
                finish_stream(ticket, tally, version, replica, fallback, content_type)
            });
            AxumBody::from_stream(relay(first, rest, permit, options, on_end))
        }
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    *response.headers_mut() = response_headers;
    response
}

/// Logs an upstream's error answer that is passed through to the client, with what the client
/// may not see of it: target, backend model, replica and the body as the upstream sent it.
fn log_passed_through(
    ticket: &Ticket,
    target: &str,
    backend_model: &str,
    replica: &str,
    status: u16,
    body: &[u8],
) {
    let quoted = &body[..body.len().min(LOGGED_ERROR_BODY_BYTES)];
    tracing::info!(
        request_id = %ticket.request_id,
        route = %ticket.route,
        target,
        backend_model,
        replica,
        status,
        body = %String::from_utf8_lossy(quoted),
        "upstream error answer passed through to the client"
    );
}

fn finish_stream(
    ticket: Ticket,
    tally: StreamTally,
    version: String,
    replica: String,
    fallback: bool,
    content_type: String,
) {
    let gw = ticket.gw.clone();
    let ok = tally.completed && tally.broken.is_none() && !fallback;
    if let (true, Some(copy), Some(k)) = (ok, tally.copy.clone(), ticket.cache_key.clone()) {
        let entry = CachedResponse {
            status: 200,
            content_type,
            body: bytes::Bytes::from(copy),
        };
        tokio::spawn(async move { gw.cache.put(&k, &entry).await });
    }
    let error = match (&tally.broken, tally.client_gone) {
        (Some(reason), _) => Some(reason.clone()),
        (None, true) => Some("the client went away".to_string()),
        _ => None,
    };
    if tally.broken.is_some() {
        ticket
            .gw
            .metrics
            .record_error(&ticket.route, &version, ErrorKind::StreamBroken);
    }
    let completion_tokens = tally.completion_tokens.unwrap_or(tally.content_chunks);
    ticket.finish(Ending {
        status: if tally.broken.is_some() { 502 } else { 200 },
        version,
        replica,
        prompt_tokens: tally.prompt_tokens.unwrap_or(0),
        completion_tokens,
        ttft: tally.ttft,
        cached: false,
        fallback,
        error,
        first_choice_ok: !fallback && tally.broken.is_none(),
        response_id: tally.response_id,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_cover_prompt_and_requested_completion() {
        let body = serde_json::json!({"messages": [{"role": "user", "content": "x".repeat(400)}], "max_tokens": 50});
        // 400 content bytes + the message separator + 8 template tokens + 1, then max_tokens.
        assert_eq!(estimate_tokens(&body, Endpoint::Chat), 401 + 8 + 1 + 50);
        let body = serde_json::json!({"prompt": "hi", "n": 2});
        assert_eq!(
            estimate_tokens(&body, Endpoint::Completions),
            3 + 2 * DEFAULT_COMPLETION_ESTIMATE
        );
        let body = serde_json::json!({"input": "abcdefgh"});
        assert_eq!(estimate_tokens(&body, Endpoint::Embeddings), 9);
    }
}
