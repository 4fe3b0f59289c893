//! Forwarding one client request upstream: replica choice, queueing, retries, the fallback
//! chain, and the start of a stream.
//!
//! Carries out the retry policy written in [`retry`] (what is tried again, what a failure does
//! to the replica's circuit breaker), classifying each failed attempt by when it failed:
//! - before the request was sent (connect errors, a full queue) or with an answer (5xx, 429):
//!   retried on another replica of the same target when there is one, with backoff and within
//!   the retry budget, then the next target of the route's fallback chain is tried; a
//!   canned-reply target ends a chain;
//! - after the request was sent, without a complete answer (the connection dropped, or the
//!   deadline passed): sent again at most `max_replays` times for the whole request, and a
//!   dropped connection ejects the replica at once — a request that crashes replicas reaches
//!   at most `1 + max_replays` of them;
//! - other 4xx answers are the client's fault and are passed through (what they say about the
//!   upstream is rewritten by the caller, see `privacy.rs`);
//! - a stream is committed only once its first chunk has arrived, so a backend that fails
//!   before its first byte still falls back (within the policy); after that, `stream.rs` owns
//!   the relay and nothing is retried.
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
use crate::metrics::ReplayOutcome;
use crate::upstream::{Replica, ReplicaPermit, Upstreams};

use self::retry::{backoff, BreakerEffect, Replays, RetryBudget};

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
    /// Times the request may be sent again after a replica dropped it (the route's
    /// `max_replays`; see [`retry`]).
    pub max_replays: u32,
}

/// What failed, as a metrics label and for the error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// No connection (refused, unreachable, connect timeout): the request was not sent.
    Connect,
    /// The request was sent (or may have been) and no complete answer came before the deadline.
    Timeout,
    /// The replica accepted the request, then the connection closed (reset, EOF) before a
    /// complete answer: the request may have crashed it.
    Dropped,
    Upstream5xx,
    Upstream429,
    QueueTimeout,
    NoReplica,
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
            FailureKind::Dropped => "dropped",
        }
    }

    /// The metrics error kind.
    pub fn metric(self) -> crate::metrics::ErrorKind {
        use crate::metrics::ErrorKind as K;
        match self {
            FailureKind::Connect => K::Connect,
            FailureKind::Timeout => K::Timeout,
            FailureKind::Dropped => K::Dropped,
            FailureKind::Upstream5xx => K::Upstream5xx,
            FailureKind::Upstream429 => K::Upstream4xx,
            FailureKind::QueueTimeout => K::QueueTimeout,
            FailureKind::NoReplica => K::NoTarget,
        }
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
    /// Replicas dropped the request more often than its `max_replays` allow, so the rest of
    /// the chain was not tried.
    pub replays_spent: bool,
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
    let mut replays = Replays::new(req.max_replays);
    for (chain_index, target_name) in req.chain.iter().enumerate() {
        let Some(target) = ctx.config.target(target_name) else {
            continue;
        };
        let canned = target.replicas.is_empty() && target.discover.is_none();
        if replays.spent() && !canned {
            continue; // the request must reach no other replica
        }
        if canned {
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
        let attempts = Attempts {
            failures: &mut failures,
            retries: &mut retries,
            replays: &mut replays,
        };
        match try_target(ctx, &req, target, attempts).await {
            Some(mut served) => {
                served.chain_index = chain_index;
                served.retries = retries;
                served.failures = failures;
                return Ok(served);
            }
            None => continue,
        }
    }
    Err(Exhausted {
        failures,
        retries,
        replays_spent: replays.spent(),
    })
}

/// What the attempts of one request have added up to so far, over the chain.
struct Attempts<'a> {
    failures: &'a mut Vec<Failure>,
    retries: &'a mut u32,
    replays: &'a mut Replays,
}

/// Up to `max_attempts` attempts on one target's replicas, fewer when the request's replays
/// are spent.
async fn try_target(
    ctx: &ForwardContext<'_>,
    req: &Forward<'_>,
    target: &TargetConfig,
    attempts: Attempts<'_>,
) -> Option<Served> {
    let Attempts {
        failures,
        retries,
        replays,
    } = attempts;
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
            ctx.metrics.record_retry(&target.name);
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
        if replays.sending() {
            ctx.metrics.record_replay(&target.name, ReplayOutcome::Sent);
        }
        match attempt_once(ctx, req, target, &replica, payload.clone(), timeout, permit).await {
            Ok(served) => {
                if served.status < 500 && served.status != 429 {
                    replica.record_success();
                }
                return Some(served);
            }
            Err((kind, detail)) => {
                let verdict = retry::verdict(kind);
                match verdict.breaker {
                    BreakerEffect::Eject => replica.eject(),
                    BreakerEffect::Failure => replica.record_failure(),
                    BreakerEffect::Nothing => {}
                }
                tracing::debug!(request_id = %req.request_id, target = %target.name, replica = %replica.url, kind = kind.label(), %detail, "attempt failed");
                failures.push(Failure {
                    target: target.name.clone(),
                    model: target.upstream_model().to_string(),
                    replica: replica.url.clone(),
                    kind,
                    detail,
                });
                if verdict.replay && !replays.note_dropped() {
                    tracing::warn!(request_id = %req.request_id, target = %target.name, replica = %replica.url, kind = kind.label(), max_replays = req.max_replays, "a replica dropped the request after it was sent and its replays are spent: no other replica gets it");
                    ctx.metrics
                        .record_replay(&target.name, ReplayOutcome::Refused);
                    return None;
                }
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
        Ok(Err(e)) => return Err(send_failure(&e)),
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
                        FailureKind::Dropped,
                        "the stream ended before its first chunk".into(),
                    ))
                }
                Ok(Some(Err(e))) => {
                    return Err((
                        FailureKind::Dropped,
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
            FailureKind::Dropped,
            format!("reading the body failed: {e}"),
        )),
        Ok(Ok(bytes)) => {
            drop(permit);
            Ok(served(Body::Full(bytes)))
        }
    }
}

/// What a failed `send` (up to the response head) was: a connect error means no byte of the
/// request left; anything else happened once the request was (or may have been) sent, so
/// the replica may have acted on it (see [`retry`]).
fn send_failure(e: &reqwest::Error) -> (FailureKind, String) {
    let kind = if e.is_connect() {
        FailureKind::Connect
    } else if e.is_timeout() {
        FailureKind::Timeout
    } else {
        FailureKind::Dropped
    };
    (kind, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn send_error(url: &str, timeout: Option<Duration>) -> reqwest::Error {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let mut request = client.post(url).body("{\"model\": \"m\"}");
        if let Some(t) = timeout {
            request = request.timeout(t);
        }
        request.send().await.unwrap_err()
    }

    /// A loopback server that reads each request, then closes the connection (`hang`: false)
    /// or keeps it open without answering.
    async fn silent_server(hang: bool) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = conn.read(&mut buf).await;
                    if hang {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn send_failures_are_told_apart_by_whether_the_request_left() {
        let refused = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", listener.local_addr().unwrap())
        };
        let kind = |e: reqwest::Error| send_failure(&e).0;
        assert_eq!(kind(send_error(&refused, None).await), FailureKind::Connect);
        let closes = silent_server(false).await;
        assert_eq!(kind(send_error(&closes, None).await), FailureKind::Dropped);
        let hangs = silent_server(true).await;
        assert_eq!(
            kind(send_error(&hangs, Some(Duration::from_millis(100))).await),
            FailureKind::Timeout
        );
    }
}
