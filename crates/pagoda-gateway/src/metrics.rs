//! The gateway's Prometheus metrics: definitions, recording helpers and the text exposition.
//!
//! Owns: one [`prometheus::Registry`] per [`GatewayMetrics`] (never the global registry, so tests
//! and several gateways in one process do not collide) and every metric below. Invariants: all
//! names start with `pagoda_gateway_`; label values are free text escaped by the library; label
//! *sets* are fixed per metric, so dashboards and alert rules can rely on them. Callers keep label
//! cardinality bounded: `key` is the key's *name* (never the secret), `replica` a configured base
//! URL, `route`/`version`/`target` configured names.
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `pagoda_gateway_requests_total` | counter | `route`, `version`, `status` | Finished requests; `status` is the HTTP code sent to the client (`200`, `429`, ...). `version` is the target that answered, `""` when none (auth failure, cache hit before routing). |
//! | `pagoda_gateway_errors_total` | counter | `route`, `version`, `kind` | Failures by [`ErrorKind`] (`upstream_5xx`, `upstream_4xx`, `timeout`, `connect`, `dropped`, `stream_broken`, `rate_limited`, `budget_exceeded`, `auth`, `bad_request`, `queue_timeout`, `no_target`, `internal`). One per failed attempt that the gateway classifies, so retried attempts count too. |
//! | `pagoda_gateway_request_duration_seconds` | histogram | `route`, `version` | Whole-request latency as the client sees it (to the last byte). Buckets 5 ms .. 120 s. |
//! | `pagoda_gateway_ttft_seconds` | histogram | `route`, `version` | Time to the first token (first content byte of a streamed answer). Same buckets. |
//! | `pagoda_gateway_tokens_total` | counter | `key`, `route`, `version`, `kind` | Tokens by key name, client model name, version, `kind` = `prompt` or `completion`. |
//! | `pagoda_gateway_cache_requests_total` | counter | `result` | Response-cache lookups: `hit`, `miss`, `bypass` (client opted out or the request is not deterministic). |
//! | `pagoda_gateway_rate_limited_total` | counter | `key`, `limit` | Requests refused by a limit; `limit` = `rpm`, `tpm`, `budget`, `concurrency`, ... |
//! | `pagoda_gateway_retries_total` | counter | `target` | Retried upstream attempts on a target (not its first attempt), whether the request was served in the end or not. |
//! | `pagoda_gateway_replays_total` | counter | `target`, `outcome` | Requests a replica dropped after they were sent (`proxy/retry.rs`): `sent` (sent again, to this target), `refused` (not sent again: the request's `max_replays` were spent; `target` is where the last drop was). |
//! | `pagoda_gateway_prefix_routes_total` | counter | `target`, `outcome` | Prefix-aware replica choices (every attempt): `longest` (to the replica sent the longest run of the prompt's blocks lately), `spilled` (that replica was past the load bound), `unmatched` (no replica was sent any of them). |
//! | `pagoda_gateway_prefix_blocks_total` | counter | `target`, `kind` | Blocks of 64 characters of those prompts: `prompt` (all, up to 256 per prompt) and `matched` (those the chosen replica was sent lately); matched / prompt estimates the prefix-cache hit rate routing aims for. |
//! | `pagoda_gateway_fallbacks_total` | counter | `route`, `from`, `to` | Requests moved from one target to the next one of the route's fallback chain. |
//! | `pagoda_gateway_circuit_state` | gauge | `target`, `replica` | Circuit breaker: 0 closed, 0.5 half-open, 1 open. |
//! | `pagoda_gateway_canary_weight_percent` | gauge | `route` | Current canary share of a rollout, 0..100. |
//! | `pagoda_gateway_in_flight_requests` | gauge | — | Client requests being served right now. |
//! | `pagoda_gateway_replica_outstanding` | gauge | `target`, `replica` | Upstream requests outstanding (running + queued) at a replica, set periodically. |
//!
//! Alerting hints: error ratio = `rate(errors_total)` / `rate(requests_total)`; p99 latency from
//! `histogram_quantile(0.99, rate(pagoda_gateway_request_duration_seconds_bucket[5m]))`.

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// Histogram buckets (seconds) for request latency and TTFT of LLM serving: 5 ms .. 120 s.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
];

/// The `kind` label of `pagoda_gateway_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The upstream answered 5xx.
    Upstream5xx,
    /// The upstream answered 4xx (other than 429, which is [`ErrorKind::RateLimited`] upstream too).
    Upstream4xx,
    /// An attempt ran past its deadline.
    Timeout,
    /// The upstream could not be reached.
    Connect,
    /// The upstream closed the connection after the request was sent, before a complete answer.
    Dropped,
    /// A streamed answer broke after it started.
    StreamBroken,
    /// Refused by a rate limit (gateway or upstream 429).
    RateLimited,
    /// The key's token budget is spent.
    BudgetExceeded,
    /// Missing, unknown or disabled API key, or a model the key may not use.
    Auth,
    /// The client's request was malformed (body, JSON, unknown model).
    BadRequest,
    /// No replica slot became free within the target's queue timeout.
    QueueTimeout,
    /// No target could serve the request (all down, chain exhausted).
    NoTarget,
    /// A bug or an unexpected gateway-side failure.
    Internal,
}

impl ErrorKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Upstream5xx => "upstream_5xx",
            ErrorKind::Upstream4xx => "upstream_4xx",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Connect => "connect",
            ErrorKind::Dropped => "dropped",
            ErrorKind::StreamBroken => "stream_broken",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::BudgetExceeded => "budget_exceeded",
            ErrorKind::Auth => "auth",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::QueueTimeout => "queue_timeout",
            ErrorKind::NoTarget => "no_target",
            ErrorKind::Internal => "internal",
        }
    }
}

/// The `outcome` label of `pagoda_gateway_replays_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// The request was sent again after a drop.
    Sent,
    /// The request's replays were spent: it was not sent again.
    Refused,
}

impl ReplayOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayOutcome::Sent => "sent",
            ReplayOutcome::Refused => "refused",
        }
    }
}

/// A circuit breaker state as the `pagoda_gateway_circuit_state` gauge shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitLevel {
    Closed,
    HalfOpen,
    Open,
}

impl CircuitLevel {
    /// 0 closed, 0.5 half-open, 1 open.
    pub fn value(self) -> f64 {
        match self {
            CircuitLevel::Closed => 0.0,
            CircuitLevel::HalfOpen => 0.5,
            CircuitLevel::Open => 1.0,
        }
    }
}

/// All gateway metrics, registered in a registry of their own.
pub struct GatewayMetrics {
    registry: Registry,
    requests: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
    ttft: HistogramVec,
    tokens: IntCounterVec,
    cache: IntCounterVec,
    rate_limited: IntCounterVec,
    retries: IntCounterVec,
    replays: IntCounterVec,
    fallbacks: IntCounterVec,
    prefix_routes: IntCounterVec,
    prefix_blocks: IntCounterVec,
    circuit: GaugeVec,
    canary: GaugeVec,
    in_flight: IntGauge,
    outstanding: GaugeVec,
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for GatewayMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayMetrics").finish_non_exhaustive()
    }
}

fn counter(
    reg: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    reg.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
    let g = GaugeVec::new(Opts::new(name, help), labels)?;
    reg.register(Box::new(g.clone()))?;
    Ok(g)
}

fn histogram(
    reg: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<HistogramVec> {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    let h = HistogramVec::new(opts, labels)?;
    reg.register(Box::new(h.clone()))?;
    Ok(h)
}

impl GatewayMetrics {
    /// Creates and registers every metric in a fresh registry.
    pub fn new() -> Self {
        // The definitions are constants: registration fails only on a programming error
        // (a duplicate or malformed name), which the unit tests exercise.
        Self::try_new().expect("gateway metric definitions are valid")
    }

    /// Like [`GatewayMetrics::new`], returning the registration error instead of panicking.
    pub fn try_new() -> prometheus::Result<Self> {
        let r = Registry::new();
        let rv = &["route", "version"];
        let in_flight = IntGauge::new(
            "pagoda_gateway_in_flight_requests",
            "Client requests being served right now",
        )?;
        r.register(Box::new(in_flight.clone()))?;
        Ok(Self {
            requests: counter(
                &r,
                "pagoda_gateway_requests_total",
                "Finished requests by route, version and HTTP status",
                &["route", "version", "status"],
            )?,
            errors: counter(
                &r,
                "pagoda_gateway_errors_total",
                "Failures by route, version and kind",
                &["route", "version", "kind"],
            )?,
            duration: histogram(
                &r,
                "pagoda_gateway_request_duration_seconds",
                "Whole-request latency in seconds",
                rv,
            )?,
            ttft: histogram(
                &r,
                "pagoda_gateway_ttft_seconds",
                "Time to first token in seconds",
                rv,
            )?,
            tokens: counter(
                &r,
                "pagoda_gateway_tokens_total",
                "Tokens by key name, route, version and kind (prompt|completion)",
                &["key", "route", "version", "kind"],
            )?,
            cache: counter(
                &r,
                "pagoda_gateway_cache_requests_total",
                "Response cache lookups by result (hit|miss|bypass)",
                &["result"],
            )?,
            rate_limited: counter(
                &r,
                "pagoda_gateway_rate_limited_total",
                "Requests refused by a limit, by key name and limit kind",
                &["key", "limit"],
            )?,
            retries: counter(
                &r,
                "pagoda_gateway_retries_total",
                "Retried upstream attempts by target",
                &["target"],
            )?,
            replays: counter(
                &r,
                "pagoda_gateway_replays_total",
                "Requests a replica dropped after they were sent, by target and outcome (sent again, refused)",
                &["target", "outcome"],
            )?,
            fallbacks: counter(
                &r,
                "pagoda_gateway_fallbacks_total",
                "Fallbacks by route, from target and to target",
                &["route", "from", "to"],
            )?,
            prefix_routes: counter(
                &r,
                "pagoda_gateway_prefix_routes_total",
                "Prefix-aware replica choices by target and outcome (longest, spilled, unmatched)",
                &["target", "outcome"],
            )?,
            prefix_blocks: counter(
                &r,
                "pagoda_gateway_prefix_blocks_total",
                "Prompt blocks of prefix-aware choices by target: all (prompt) and those the chosen replica was sent lately (matched)",
                &["target", "kind"],
            )?,
            circuit: gauge(
                &r,
                "pagoda_gateway_circuit_state",
                "Circuit breaker state: 0 closed, 0.5 half-open, 1 open",
                &["target", "replica"],
            )?,
            canary: gauge(
                &r,
                "pagoda_gateway_canary_weight_percent",
                "Canary traffic share of a rollout in percent",
                &["route"],
            )?,
            in_flight,
            outstanding: gauge(
                &r,
                "pagoda_gateway_replica_outstanding",
                "Upstream requests outstanding at a replica",
                &["target", "replica"],
            )?,
            registry: r,
        })
    }

    /// The registry, for callers that register metrics of their own next to these.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The Prometheus text exposition of every metric (what `GET /metrics` returns).
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "cannot encode gateway metrics");
            return String::new();
        }
        String::from_utf8(buf)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// The `Content-Type` of [`GatewayMetrics::render`]'s output.
    pub fn content_type(&self) -> &'static str {
        prometheus::TEXT_FORMAT
    }

    /// Records one finished client request: its status, latency and (when known) TTFT.
    pub fn observe_request(
        &self,
        route: &str,
        version: &str,
        status: u16,
        latency_s: f64,
        ttft_s: Option<f64>,
    ) {
        let code = status.to_string();
        self.requests
            .with_label_values(&[route, version, code.as_str()])
            .inc();
        self.duration
            .with_label_values(&[route, version])
            .observe(latency_s);
        if let Some(t) = ttft_s {
            self.ttft.with_label_values(&[route, version]).observe(t);
        }
    }

    /// Counts one classified failure.
    pub fn record_error(&self, route: &str, version: &str, kind: ErrorKind) {
        self.errors
            .with_label_values(&[route, version, kind.as_str()])
            .inc();
    }

    /// Adds a request's prompt and completion tokens; `key` is the key's name.
    pub fn record_tokens(
        &self,
        key: &str,
        route: &str,
        version: &str,
        prompt: u64,
        completion: u64,
    ) {
        self.tokens
            .with_label_values(&[key, route, version, "prompt"])
            .inc_by(prompt);
        self.tokens
            .with_label_values(&[key, route, version, "completion"])
            .inc_by(completion);
    }

    /// Counts one response-cache lookup.
    pub fn record_cache(&self, status: crate::cache::CacheStatus) {
        self.cache.with_label_values(&[status.as_str()]).inc();
    }

    /// Counts one request refused by `limit` (`rpm`, `tpm`, `budget`, `concurrency`, ...).
    pub fn record_rate_limited(&self, key: &str, limit: &str) {
        self.rate_limited.with_label_values(&[key, limit]).inc();
    }

    /// Counts one retried attempt at `target`.
    pub fn record_retry(&self, target: &str) {
        self.retries.with_label_values(&[target]).inc();
    }

    /// Counts one request a replica dropped: sent again to `target`, or refused there.
    pub fn record_replay(&self, target: &str, outcome: ReplayOutcome) {
        self.replays
            .with_label_values(&[target, outcome.as_str()])
            .inc();
    }

    /// Counts one prefix-aware choice at `target`.
    pub fn record_prefix_route(&self, target: &str, routed: &crate::upstream::PrefixRouted) {
        self.prefix_routes
            .with_label_values(&[target, routed.outcome.as_str()])
            .inc();
        self.prefix_blocks
            .with_label_values(&[target, "prompt"])
            .inc_by(routed.prompt_blocks as u64);
        self.prefix_blocks
            .with_label_values(&[target, "matched"])
            .inc_by(routed.matched_blocks as u64);
    }

    /// Counts one move along a route's fallback chain.
    pub fn record_fallback(&self, route: &str, from: &str, to: &str) {
        self.fallbacks.with_label_values(&[route, from, to]).inc();
    }

    /// Sets a replica's circuit breaker gauge.
    pub fn set_circuit_state(&self, target: &str, replica: &str, level: CircuitLevel) {
        self.circuit
            .with_label_values(&[target, replica])
            .set(level.value());
    }

    /// Sets a route's canary share (0..100).
    pub fn set_canary_weight(&self, route: &str, percent: f64) {
        self.canary.with_label_values(&[route]).set(percent);
    }

    /// Sets the outstanding upstream requests of a replica.
    pub fn set_replica_outstanding(&self, target: &str, replica: &str, outstanding: f64) {
        self.outstanding
            .with_label_values(&[target, replica])
            .set(outstanding);
    }

    /// Removes a replica's gauges (after a reload removed it), so stale series disappear.
    pub fn forget_replica(&self, target: &str, replica: &str) {
        let _ = self.circuit.remove_label_values(&[target, replica]);
        let _ = self.outstanding.remove_label_values(&[target, replica]);
    }

    /// Removes a route's canary gauge (rollout finished or route removed).
    pub fn forget_canary(&self, route: &str) {
        let _ = self.canary.remove_label_values(&[route]);
    }

    /// Counts a request in flight until the returned guard is dropped.
    pub fn in_flight(&self) -> InFlightGuard {
        self.in_flight.inc();
        InFlightGuard {
            gauge: self.in_flight.clone(),
        }
    }

    /// The current in-flight count.
    pub fn in_flight_now(&self) -> i64 {
        self.in_flight.get()
    }
}

/// Decrements `pagoda_gateway_in_flight_requests` when dropped (also on panic or cancellation).
#[derive(Debug)]
pub struct InFlightGuard {
    gauge: IntGauge,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheStatus;

    fn all_recorded() -> GatewayMetrics {
        let m = GatewayMetrics::new();
        m.observe_request("chat", "v1", 200, 0.2, Some(0.03));
        m.record_error("chat", "v1", ErrorKind::Upstream5xx);
        m.record_tokens("alice", "chat", "v1", 10, 5);
        m.record_cache(CacheStatus::Hit);
        m.record_cache(CacheStatus::Miss);
        m.record_cache(CacheStatus::Bypass);
        m.record_rate_limited("alice", "rpm");
        m.record_retry("v1");
        m.record_replay("v1", ReplayOutcome::Sent);
        m.record_replay("v1", ReplayOutcome::Refused);
        m.record_replay("v1", ReplayOutcome::Refused);
        m.record_fallback("chat", "v1", "v0");
        m.set_circuit_state("v1", "http://a:1", CircuitLevel::HalfOpen);
        m.set_canary_weight("chat", 20.0);
        m.set_replica_outstanding("v1", "http://a:1", 3.0);
        m
    }

    #[test]
    fn render_contains_every_metric_after_recording() {
        let m = all_recorded();
        let _g = m.in_flight();
        let text = m.render();
        for name in [
            "pagoda_gateway_requests_total{route=\"chat\",status=\"200\",version=\"v1\"} 1",
            "pagoda_gateway_errors_total{kind=\"upstream_5xx\",route=\"chat\",version=\"v1\"} 1",
            "pagoda_gateway_request_duration_seconds_bucket{route=\"chat\",version=\"v1\",le=\"0.25\"} 1",
            "pagoda_gateway_request_duration_seconds_bucket{route=\"chat\",version=\"v1\",le=\"0.1\"} 0",
            "pagoda_gateway_ttft_seconds_count{route=\"chat\",version=\"v1\"} 1",
            "pagoda_gateway_tokens_total{key=\"alice\",kind=\"prompt\",route=\"chat\",version=\"v1\"} 10",
            "pagoda_gateway_tokens_total{key=\"alice\",kind=\"completion\",route=\"chat\",version=\"v1\"} 5",
            "pagoda_gateway_cache_requests_total{result=\"hit\"} 1",
            "pagoda_gateway_cache_requests_total{result=\"miss\"} 1",
            "pagoda_gateway_cache_requests_total{result=\"bypass\"} 1",
            "pagoda_gateway_rate_limited_total{key=\"alice\",limit=\"rpm\"} 1",
            "pagoda_gateway_retries_total{target=\"v1\"} 1",
            "pagoda_gateway_replays_total{outcome=\"sent\",target=\"v1\"} 1",
            "pagoda_gateway_replays_total{outcome=\"refused\",target=\"v1\"} 2",
            "pagoda_gateway_fallbacks_total{from=\"v1\",route=\"chat\",to=\"v0\"} 1",
            "pagoda_gateway_circuit_state{replica=\"http://a:1\",target=\"v1\"} 0.5",
            "pagoda_gateway_canary_weight_percent{route=\"chat\"} 20",
            "pagoda_gateway_in_flight_requests 1",
            "pagoda_gateway_replica_outstanding{replica=\"http://a:1\",target=\"v1\"} 3",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
        assert!(text.contains("le=\"120\""), "buckets reach 120 s");
        assert!(text.contains("le=\"0.005\""), "buckets start at 5 ms");
    }

    #[test]
    fn label_values_are_escaped() {
        let m = GatewayMetrics::new();
        m.record_tokens("we\"ird\\key\nname", "r", "v", 1, 0);
        let text = m.render();
        assert!(
            text.contains(r#"key="we\"ird\\key\nname""#),
            "escaped label missing in\n{text}"
        );
    }

    #[test]
    fn metrics_are_shareable_between_tasks() {
        fn is<T: Send + Sync>() {}
        is::<GatewayMetrics>();
        is::<InFlightGuard>();
    }

    #[test]
    fn in_flight_guard_decrements_on_drop() {
        let m = GatewayMetrics::new();
        let a = m.in_flight();
        let b = m.in_flight();
        assert_eq!(m.in_flight_now(), 2);
        drop(a);
        drop(b);
        assert_eq!(m.in_flight_now(), 0);
    }

    #[test]
    fn several_instances_do_not_collide_and_forget_removes_series() {
        let a = all_recorded();
        let b = GatewayMetrics::new();
        assert!(!b.render().contains("pagoda_gateway_retries_total{"));
        a.forget_replica("v1", "http://a:1");
        a.forget_canary("chat");
        let text = a.render();
        assert!(!text.contains("pagoda_gateway_circuit_state{"));
        assert!(!text.contains("pagoda_gateway_canary_weight_percent{"));
        assert!(!text.contains("pagoda_gateway_replica_outstanding{"));
    }

    #[test]
    fn every_name_has_the_prefix() {
        let m = all_recorded();
        for fam in m.registry().gather() {
            assert!(fam.name().starts_with("pagoda_gateway_"), "{}", fam.name());
        }
        assert_eq!(m.registry().gather().len(), 14);
    }
}
