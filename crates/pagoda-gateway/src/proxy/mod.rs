//! Forwarding one client request upstream: replica choice, queueing, retries, the fallback
//! chain, and the start of a stream.
//!
//! Owns the failure semantics of the gateway:
//! - connection errors, timeouts, 5xx and 429 from a backend are retried (another replica of
//!   the same target when there is one, with backoff and within the retry budget), then the
//!   next target of the route's fallback chain is tried; a canned-reply target ends a chain;
//! - other 4xx answers are the client's fault and are passed through (what they say about the
//!   upstream is rewritten by the caller, see `privacy.rs`);
//! - 5xx, timeouts and connection errors count against the replica's circuit breaker;
//! - a stream is committed only once its first chunk has arrived, so a backend that fails
//!   before its first byte still falls back; after that, `stream.rs` owns the relay.
//!
//! Invariant: every attempt holds a replica permit while it runs (so the replica's outstanding
//! count and concurrency cap see it), and the permit moves into the stream for its lifetime.

pub mod canned;
pub mod retry;
pub mod stream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;

use crate::config::{GatewayConfig, TargetConfig};
use crate::upstream::{Replica, ReplicaPermit, Upstreams};

use self::retry::{backoff, RetryBudget};

/// The API a request is for (the upstream path and the canned-reply shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Embeddings,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
        }
    }
}

/// One request to forward.
#[derive(Debug)]
pub struct Forward<'a> {
    pub endpoint: Endpoint,
    /// The client's body; `model` is replaced per target.
    pub body: Value,
    pub stream: bool,
    /// How each target's replica is chosen (the route's `balance`).
    pub pick: crate::upstream::Pick,
    /// Targets in order: the chosen one, then the fallbacks.
    pub chain: &'a [String],
    /// The client-facing model name (what canned replies call themselves unless
    /// `server.expose_upstream_details` is on).
    pub route: &'a str,
    /// Sent upstream as `x-request-id`, and on the log lines of failed attempts.
    pub request_id: &'a str,
}

/// What failed, as a metrics label and for the error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    Connect,
    Timeout,
    Upstream5xx,
    Upstream429,
    QueueTimeout,
    NoReplica,
    BadBody,
}

impl FailureKind {
    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Connect => "connect",
            FailureKind::Timeout => "timeout",
            FailureKind::Upstream5xx => "upstream_5xx",
            FailureKind::Upstream429 => "upstream_429",
            FailureKind::QueueTimeout => "queue_timeout",
            FailureKind::NoReplica => "no_replica",
            FailureKind::BadBody => "bad_body",
        }
    }

    /// The metrics error kind.
    pub fn metric(self) -> crate::metrics::ErrorKind {
        use crate::metrics::ErrorKind as K;
        match self {
            FailureKind::Connect => K::Connect,
            FailureKind::Timeout => K::Timeout,
            FailureKind::Upstream5xx | FailureKind::BadBody => K::Upstream5xx,
            FailureKind::Upstream429 => K::Upstream4xx,
            FailureKind::QueueTimeout => K::QueueTimeout,
            FailureKind::NoReplica => K::NoTarget,
        }
    }

    /// Whether the replica itself is at fault (counts against its circuit breaker).
    fn blames_replica(self) -> bool {
        matches!(
            self,
            FailureKind::Connect
                | FailureKind::Timeout
                | FailureKind::Upstream5xx
                | FailureKind::BadBody
        )
    }
}

/// One failed attempt, for logs and metrics.
#[derive(Debug, Clone)]
pub struct Failure {
    pub target: String,
    /// The model name the target's backend knows.
    pub model: String,
    pub replica: String,
    pub kind: FailureKind,
    pub detail: String,
}

/// The body of a served answer.
pub enum Body {
    /// A complete (non-stream) answer.
    Full(Bytes),
    /// A stream whose first chunk has arrived; the rest follows from `rest`.
    Stream {
        first: Bytes,
        rest: futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>,
        /// The replica permit, held until the stream ends.
        permit: Option<ReplicaPermit>,
        idle_timeout: Duration,
    },
    /// A canned reply (already in the endpoint's shape; SSE text for streams).
    Canned(Bytes),
}

/// An answer from some target of the chain (or a client error passed through).
pub struct Served {
    pub status: u16,
    pub content_type: String,
    pub body: Body,
    pub target: String,
    pub replica: Option<Arc<Replica>>,
    /// Index of `target` in the chain: > 0 means a fallback served it.
    pub chain_index: usize,
    pub retries: u32,
    pub failures: Vec<Failure>,
}

/// Every target failed.
#[derive(Debug)]
pub struct Exhausted {
    pub failures: Vec<Failure>,
    pub retries: u32,
}

impl Exhausted {
    /// A one-line summary, shown to clients only with `server.expose_upstream_details` (it
    /// may quote a connection error, and so a replica's URL).
    pub fn summary(&self) -> String {
        match self.failures.last() {
            Some(f) => format!(
                "no backend could serve the request ({} attempts; last: target '{}' {}: {})",
                self.failures.len(),
                f.target,
                f.kind.label(),
                f.detail
            ),
            None => "no backend could serve the request".into(),
        }
    }

    /// Every attempt with its target, backend model, replica and error, for the log.
    pub fn detail(&self) -> String {
        if self.failures.is_empty() {
            return "no target of the chain could take the request".into();
        }
        let attempts: Vec<String> = self
            .failures
            .iter()
            .map(|f| {
                format!(
                    "target '{}' (model '{}') replica '{}' {}: {}",
                    f.target,
                    f.model,
                    f.replica,
                    f.kind.label(),
                    f.detail
                )
            })
            .collect();
        format!("{} attempts: {}", attempts.len(), attempts.join("; "))
    }

    pub fn all_timeouts(&self) -> bool {
        !self.failures.is_empty() && self.failures.iter().all(|f| f.kind == FailureKind::Timeout)
    }
}

/// What a forward needs from the gateway.
pub struct ForwardContext<'a> {
    pub config: &'a GatewayConfig,
    pub upstreams: &'a Upstreams,
    pub client: &'a reqwest::Client,
    pub retry_budget: &'a RetryBudget,
    pub metrics: &'a crate::metrics::GatewayMetrics,
}

/// Tries the chain until some target answers.
pub async fn forward(ctx: &ForwardContext<'_>, req: Forward<'_>) -> Result<Served, Exhausted> {
    let mut failures = Vec::new();
    let mut retries = 0u32;
    for (chain_index, target_name) in req.chain.iter().enumerate() {
        let Some(target) = ctx.config.target(target_name) else {
            continue;
        };
        if target.replicas.is_empty() && target.discover.is_none() {
            if let Some(text) = &target.canned_reply {
                let model = if ctx.config.server.expose_upstream_details {
                    target.upstream_model()
                } else {
                    req.route
                };
                if let Some(bytes) =
                    canned::reply(req.endpoint, req.stream, model, text, req.request_id)
                {
                    return Ok(Served {
                        status: 200,
                        content_type: if req.stream {
                            "text/event-stream"
                        } else {
                            "application/json"
                        }
                        .into(),
                        body: Body::Canned(bytes),
                        target: target.name.clone(),
                        replica: None,
                        chain_index,
                        retries,
                        failures,
                    });
                }
            }
            continue;
        }
        match try_target(ctx, &req, target, &mut failures, &mut retries).await {
            Some(mut served) => {
                served.chain_index = chain_index;
                served.retries = retries;
                served.failures = failures;
                return Ok(served);
            }
            None => continue,
        }
    }
    Err(Exhausted { failures, retries })
}

/// Up to `max_attempts` attempts on one target's replicas.
async fn try_target(
    ctx: &ForwardContext<'_>,
    req: &Forward<'_>,
    target: &TargetConfig,
    failures: &mut Vec<Failure>,
    retries: &mut u32,
) -> Option<Served> {
    let pool = ctx.upstreams.pool(&target.name)?;
    let mut body = req.body.clone();
    if let Some(obj) = body.as_object_mut() {
        obj.insert(
            "model".into(),
            Value::String(target.upstream_model().to_string()),
        );
    }
    let payload = Bytes::from(serde_json::to_vec(&body).ok()?);
    let timeout = Duration::from_millis(if target.timeout_ms > 0 {
        target.timeout_ms
    } else {
        ctx.config.server.request_timeout_ms
    });
    let mut tried: Vec<Arc<Replica>> = Vec::new();
    for attempt in 0..ctx.config.retry.max_attempts {
        if attempt > 0 {
            if !ctx
                .retry_budget
                .try_retry(&ctx.config.retry, Instant::now())
            {
                tracing::warn!(request_id = %req.request_id, target = %target.name, "retry budget spent: failing over");
                return None;
            }
            *retries += 1;
            tokio::time::sleep(backoff(&ctx.config.retry, attempt)).await;
        }
        let Some(chosen) = pool.choose(&req.pick, &tried) else {
            failures.push(Failure {
                target: target.name.clone(),
                model: target.upstream_model().to_string(),
                replica: String::new(),
                kind: FailureKind::NoReplica,
                detail: "no healthy replica (all down or circuits open)".into(),
            });
            return None;
        };
        if let Some(routed) = &chosen.prefix {
            ctx.metrics.record_prefix_route(&target.name, routed);
        }
        let replica = chosen.replica;
        tried.push(replica.clone());
        let permit = match pool
            .acquire(&replica, Duration::from_millis(target.queue_timeout_ms))
            .await
        {
            Ok(p) => p,
            Err(_) => {
                failures.push(Failure {
                    target: target.name.clone(),
                    model: target.upstream_model().to_string(),
                    replica: replica.url.clone(),
                    kind: FailureKind::QueueTimeout,
                    detail: format!("no free slot within {} ms", target.queue_timeout_ms),
                });
                continue;
            }
        };
        match attempt_once(ctx, req, target, &replica, payload.clone(), timeout, permit).await {
            Ok(served) => {
                if served.status < 500 && served.status != 429 {
                    replica.record_success();
                }
                return Some(served);
            }
            Err(kind_detail) => {
                let (kind, detail) = kind_detail;
                if kind.blames_replica() {
                    replica.record_failure();
                }
                tracing::debug!(request_id = %req.request_id, target = %target.name, replica = %replica.url, kind = kind.label(), %detail, "attempt failed");
                failures.push(Failure {
                    target: target.name.clone(),
                    model: target.upstream_model().to_string(),
                    replica: replica.url.clone(),
                    kind,
                    detail,
                });
            }
        }
    }
    None
}

async fn attempt_once(
    ctx: &ForwardContext<'_>,
    req: &Forward<'_>,
    target: &TargetConfig,
    replica: &Arc<Replica>,
    payload: Bytes,
    timeout: Duration,
    permit: ReplicaPermit,
) -> Result<Served, (FailureKind, String)> {
    let url = format!(
        "{}{}",
        replica.url.trim_end_matches('/'),
        req.endpoint.path()
    );
    let mut builder = ctx
        .client
        .post(&url)
        .header("content-type", "application/json")
        .header(crate::request_id::REQUEST_ID_HEADER, req.request_id)
        .body(payload);
    if let Some(key) = &target.api_key {
        builder = builder.bearer_auth(key);
    }
    let started = Instant::now();
    let response = match tokio::time::timeout(timeout, builder.send()).await {
        Err(_) => {
            return Err((
                FailureKind::Timeout,
                format!("no response within {} ms", timeout.as_millis()),
            ))
        }
        Ok(Err(e)) if e.is_timeout() => return Err((FailureKind::Timeout, e.to_string())),
        Ok(Err(e)) => return Err((FailureKind::Connect, e.to_string())),
        Ok(Ok(r)) => r,
    };
    let status = response.status().as_u16();
    if status >= 500 {
        return Err((FailureKind::Upstream5xx, format!("HTTP {status}")));
    }
    if status == 429 {
        return Err((
            FailureKind::Upstream429,
            "HTTP 429 (backend overloaded)".into(),
        ));
    }
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let served = |body| Served {
        status,
        content_type: content_type.clone(),
        body,
        target: target.name.clone(),
        replica: Some(replica.clone()),
        chain_index: 0,
        retries: 0,
        failures: Vec::new(),
    };
    let remaining = timeout.saturating_sub(started.elapsed());
    if req.stream && status == 200 {
        let mut rest = response.bytes_stream().boxed();
        loop {
            match tokio::time::timeout(remaining, rest.next()).await {
                Err(_) => {
                    return Err((
                        FailureKind::Timeout,
                        "no first chunk before the deadline".into(),
                    ))
                }
                Ok(None) => {
                    return Err((
                        FailureKind::BadBody,
                        "the stream ended before its first chunk".into(),
                    ))
                }
                Ok(Some(Err(e))) => {
                    return Err((
                        FailureKind::Connect,
                        format!("stream failed before its first chunk: {e}"),
                    ))
                }
                Ok(Some(Ok(chunk))) if chunk.is_empty() => continue,
                Ok(Some(Ok(first))) => {
                    return Ok(served(Body::Stream {
                        first,
                        rest,
                        permit: Some(permit),
                        idle_timeout: timeout,
                    }))
                }
            }
        }
    }
    match tokio::time::timeout(remaining, response.bytes()).await {
        Err(_) => Err((
            FailureKind::Timeout,
            "body not complete before the deadline".into(),
        )),
        Ok(Err(e)) => Err((
            FailureKind::Connect,
            format!("reading the body failed: {e}"),
        )),
        Ok(Ok(bytes)) => {
            drop(permit);
            Ok(served(Body::Full(bytes)))
        }
    }
}
