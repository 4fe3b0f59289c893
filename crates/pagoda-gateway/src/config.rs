//! The gateway's configuration file (`gateway.toml`): its schema, defaults and validation.
//!
//! Owns: parsing TOML into [`GatewayConfig`] and [`GatewayConfig::validate`], which checks every
//! cross-reference (a route's targets and fallbacks exist, weights are positive, a rollout's
//! stable and canary are different targets, ...). Invariant: a `GatewayConfig` that passed
//! `validate` never makes the request path fail on a missing name; hot reload (`reload.rs`)
//! swaps in only validated configs, so a bad edit leaves the old config serving.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Why a config file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not valid gateway TOML: {message}")]
    Parse { path: String, message: String },
    #[error("invalid gateway config: {0}")]
    Invalid(String),
}

/// The whole file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub storage: StorageConfig,
    /// Shared state for several gateway instances (rate limits, budgets, cache).
    #[serde(default)]
    pub redis: Option<RedisConfig>,
    #[serde(default)]
    pub cache: CacheConfig,
    #[serde(default)]
    pub retry: RetryConfig,
    #[serde(default)]
    pub health: HealthConfig,
    #[serde(default)]
    pub breaker: BreakerConfig,
    /// Limits applied to keys that do not set their own.
    #[serde(default)]
    pub default_limits: KeyLimits,
    /// Model versions, each served by one or more replicas.
    #[serde(default, rename = "target")]
    pub targets: Vec<TargetConfig>,
    /// Client-facing model names.
    #[serde(default, rename = "route")]
    pub routes: Vec<RouteConfig>,
    /// Keys declared in the file (besides those created through the admin API).
    #[serde(default, rename = "key")]
    pub keys: Vec<StaticKeyConfig>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the gateway listens on.
    pub listen: String,
    /// Requests with a larger body get 413.
    pub max_body_bytes: usize,
    /// The admin key in clear; prefer `admin_key_env`.
    pub admin_key: Option<String>,
    /// Name of an environment variable holding the admin key.
    pub admin_key_env: Option<String>,
    /// Whole-request deadline for one upstream attempt, unless a target sets its own.
    pub request_timeout_ms: u64,
    /// How often the config file is checked for changes.
    pub reload_interval_ms: u64,
    /// A client must send its whole body within this time (slow clients get 408).
    pub body_timeout_ms: u64,
    /// A client must send a request's headers within this time of the connection being ready
    /// for them; the same bound closes idle keep-alive connections (read at start).
    pub header_timeout_ms: u64,
    /// Client connections open at once; more wait until one closes (read at start).
    pub max_connections: usize,
    /// Show clients the upstreams behind a route: the backend's own `model` names in relayed
    /// answers and error texts, replica addresses and connection errors in the gateway's 503
    /// and 504 messages. Off by default: clients see the route's name and a request id, the
    /// details go to the log (see `privacy.rs`); turn it on only to debug.
    pub expose_upstream_details: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 4 * 1024 * 1024,
            admin_key: None,
            admin_key_env: Some("PAGODA_GATEWAY_ADMIN_KEY".into()),
            request_timeout_ms: 120_000,
            reload_interval_ms: 1000,
            body_timeout_ms: 30_000,
            header_timeout_ms: 10_000,
            max_connections: 4096,
            expose_upstream_details: false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// SQLite file for API keys and the usage ledger (relative to the config file's folder;
    /// `:memory:` keeps both in memory, for tests).
    pub sqlite: String,
    /// Postgres URL (`postgres://user:pass@host/db`, no TLS) for the usage ledger instead of
    /// SQLite; API keys stay in the SQLite file.
    pub postgres: Option<String>,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            sqlite: "gateway.db".into(),
            postgres: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    pub url: String,
    /// Prefix of every key the gateway writes, so several deployments can share one Redis.
    #[serde(default = "default_redis_prefix")]
    pub prefix: String,
}

fn default_redis_prefix() -> String {
    "pagoda-gw".into()
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum CacheBackend {
    #[default]
    Memory,
    Redis,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    pub enabled: bool,
    pub backend: CacheBackend,
    pub ttl_s: u64,
    /// Memory backend: entries kept before the oldest are evicted.
    pub max_entries: usize,
    /// Responses larger than this are not cached.
    pub max_entry_bytes: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            backend: CacheBackend::Memory,
            ttl_s: 300,
            max_entries: 10_000,
            max_entry_bytes: 256 * 1024,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Attempts per target, the first included (1 = no retry).
    pub max_attempts: u32,
    pub base_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// Retries may add at most this share of the requests of the last 10 s ...
    pub budget_ratio: f64,
    /// ... plus this many retries per second, so a quiet gateway can still retry.
    pub budget_min_per_s: f64,
    /// Times a request is sent again after a replica dropped it once sent (the connection
    /// closed, or the attempt timed out, before a complete answer: the request may be what
    /// crashed the replica), over the whole fallback chain; 0 never sends it again. Routes
    /// may set their own (`max_replays`). At most [`MAX_REPLAYS`].
    pub max_replays: u32,
}

/// The largest `max_replays` accepted: beyond a few replicas, replaying a request that kills
/// replicas is the outage it is meant to prevent.
pub const MAX_REPLAYS: u32 = 10;

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 2,
            base_backoff_ms: 25,
            max_backoff_ms: 1000,
            budget_ratio: 0.2,
            budget_min_per_s: 10.0,
            max_replays: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Active health checks (GET `path` on each replica); 0 turns them off.
    pub interval_ms: u64,
    pub path: String,
    pub timeout_ms: u64,
    /// Consecutive failed checks before a replica is marked down, and passes to bring it back.
    pub unhealthy_after: u32,
    pub healthy_after: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval_ms: 2000,
            path: "/health".into(),
            timeout_ms: 1000,
            unhealthy_after: 2,
            healthy_after: 1,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Consecutive failures (5xx, timeouts, connection errors) that open a replica's circuit.
    pub failure_threshold: u32,
    /// How long an open circuit refuses traffic before letting probes through (half-open).
    pub open_ms: u64,
    /// Probe requests allowed while half-open; one success closes the circuit.
    pub half_open_probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            open_ms: 5000,
            half_open_probes: 1,
        }
    }
}

/// Per-key limits; `None` means unlimited.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KeyLimits {
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
    /// Total tokens (prompt + completion) the key may ever spend.
    pub budget_tokens: Option<u64>,
}

/// One model version and its replicas.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    pub name: String,
    /// Model name sent upstream (the backend's own name); defaults to `name`.
    #[serde(default)]
    pub model: Option<String>,
    /// Base URLs, e.g. `http://10.0.0.5:11434`; `/v1/...` is appended.
    #[serde(default)]
    pub replicas: Vec<String>,
    /// A target with no replicas that answers with this text (the end of a fallback chain).
    #[serde(default)]
    pub canned_reply: Option<String>,
    /// Concurrent requests per replica; more wait in a queue.
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: usize,
    /// How long a request may wait for a replica slot before it fails over.
    #[serde(default = "default_queue_timeout_ms")]
    pub queue_timeout_ms: u64,
    /// Deadline for one upstream attempt (0 = the server's `request_timeout_ms`).
    #[serde(default)]
    pub timeout_ms: u64,
    /// Bearer token the gateway sends upstream.
    #[serde(default)]
    pub api_key: Option<String>,
    /// Replicas found in DNS, besides `replicas`: `http://NAME:PORT` (or `https://`) — every
    /// A/AAAA address of NAME is one replica at PORT, e.g. a Kubernetes headless Service's
    /// ready pods — re-resolved every `discover_interval_ms`; replicas that appear join
    /// balancing, health checks and circuit breaking, those that vanish leave them.
    #[serde(default)]
    pub discover: Option<String>,
    /// How often `discover` is resolved again.
    #[serde(default = "default_discover_interval_ms")]
    pub discover_interval_ms: u64,
}

fn default_discover_interval_ms() -> u64 {
    5000
}

fn default_max_concurrency() -> usize {
    256
}

fn default_queue_timeout_ms() -> u64 {
    5000
}

impl TargetConfig {
    pub fn upstream_model(&self) -> &str {
        self.model.as_deref().unwrap_or(&self.name)
    }
}

/// A client-facing model name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The `model` clients send.
    pub model: String,
    /// Target used when no rule matches and no split or rollout is set.
    #[serde(default)]
    pub target: Option<String>,
    /// Checked in order; the first match picks the target.
    #[serde(default, rename = "rule")]
    pub rules: Vec<RuleConfig>,
    /// Weighted split between targets.
    #[serde(default)]
    pub split: Option<SplitConfig>,
    /// A canary rollout between two targets (takes precedence over `split`).
    #[serde(default)]
    pub rollout: Option<RolloutConfig>,
    /// Targets tried in order when the chosen one fails.
    #[serde(default)]
    pub fallback: Vec<String>,
    /// How a replica of the chosen target is picked: `prefix` (the default: where the longest
    /// part of the prompt was sent lately, bounded by load; see docs/gateway.md),
    /// `least_outstanding` (fewest outstanding requests) or `round_robin`. Unset: see
    /// [`RouteConfig::balance`].
    #[serde(default)]
    pub balance: Option<Balance>,
    /// Older spelling of `balance = "prefix"`.
    #[serde(default)]
    pub prefix_affinity: bool,
    /// With `balance = "prefix"`: how many more outstanding requests than the least loaded
    /// replica the replica holding the longest match may have and still be chosen (unset:
    /// `max(8, 50 %)` of the least loaded one's). Larger favours cache hits over even load.
    #[serde(default)]
    pub prefix_load_slack: Option<usize>,
    /// This route's `retry.max_replays`: times a request a replica dropped after it was sent
    /// is sent again (0: never). Unset: see [`RouteConfig::max_replays`].
    #[serde(default)]
    pub max_replays: Option<u32>,
}

/// A route's replica choice.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    LeastOutstanding,
    RoundRobin,
    /// The default: with nothing in common between prompts it picks as least outstanding
    /// does, and with shared prefixes it cut mean TTFT against both (docs/benchmarks.md).
    #[default]
    Prefix,
}

impl RouteConfig {
    /// The replica choice in force: `balance`, or `prefix` when the older
    /// `prefix_affinity = true` is given or neither is.
    pub fn balance(&self) -> Balance {
        if self.prefix_affinity {
            Balance::Prefix
        } else {
            self.balance.unwrap_or_default()
        }
    }

    /// The replay limit in force: the route's `max_replays`, else `retry.max_replays`.
    pub fn max_replays(&self, retry: &RetryConfig) -> u32 {
        self.max_replays.unwrap_or(retry.max_replays)
    }
}

/// A routing rule: all given conditions must hold.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    #[serde(default)]
    pub tier: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
    /// `{ name = "x-pagoda-version", value = "v2" }`
    #[serde(default)]
    pub header: Option<HeaderMatch>,
    pub target: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    pub name: String,
    pub value: String,
}

/// How a split assigns a request to a side.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SplitBy {
    /// Uniformly at random per request.
    #[default]
    Percent,
    /// By a hash of the user id (`user` field, `x-pagoda-user` header, else the key): sticky.
    User,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SplitConfig {
    #[serde(default)]
    pub by: SplitBy,
    /// Target name -> weight (any positive scale; normalised).
    pub weights: BTreeMap<String, f64>,
}

/// A canary rollout of `canary` against `stable`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RolloutConfig {
    pub stable: String,
    pub canary: String,
    #[serde(default)]
    pub by: SplitBy,
    /// Canary traffic percentages, in order.
    #[serde(default = "default_steps")]
    pub steps: Vec<f64>,
    /// Minimum time at a step before it may be promoted.
    #[serde(default = "default_hold_s")]
    pub hold_s: f64,
    /// Minimum canary requests at a step before it may be promoted.
    #[serde(default = "default_min_requests")]
    pub min_requests: u64,
    /// How often the canary is compared with the stable version.
    #[serde(default = "default_interval_s")]
    pub interval_s: f64,
    #[serde(default)]
    pub thresholds: RolloutThresholds,
}

fn default_steps() -> Vec<f64> {
    vec![5.0, 20.0, 50.0, 100.0]
}
fn default_hold_s() -> f64 {
    60.0
}
fn default_min_requests() -> u64 {
    50
}
fn default_interval_s() -> f64 {
    10.0
}

/// How much worse than stable the canary may be before it is rolled back.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutThresholds {
    /// Canary error rate minus stable error rate (absolute, 0..1).
    pub max_error_rate_increase: f64,
    /// Canary p99 latency over stable p99 latency.
    pub max_p99_latency_ratio: f64,
    /// Canary p99 TTFT over stable p99 TTFT.
    pub max_p99_ttft_ratio: f64,
    /// Canary negative-feedback rate minus stable's (absolute, 0..1).
    pub max_negative_feedback_increase: f64,
    /// Latency differences below this many ms are never a reason to roll back.
    pub latency_slack_ms: f64,
}

impl Default for RolloutThresholds {
    fn default() -> Self {
        Self {
            max_error_rate_increase: 0.02,
            max_p99_latency_ratio: 1.5,
            max_p99_ttft_ratio: 1.5,
            max_negative_feedback_increase: 0.05,
            latency_slack_ms: 50.0,
        }
    }
}

/// A key declared in the config file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StaticKeyConfig {
    pub name: String,
    /// `sha256:<hex>` of the key (what `pagoda gateway keys hash` prints); never the key itself.
    pub key_sha256: String,
    #[serde(default)]
    pub tier: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
    /// Client-facing model names the key may use; empty = all.
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default, flatten)]
    pub limits: KeyLimits,
}

impl GatewayConfig {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates config text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: GatewayConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    pub fn target(&self, name: &str) -> Option<&TargetConfig> {
        self.targets.iter().find(|t| t.name == name)
    }

    pub fn route(&self, model: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.model == model)
    }

    /// Checks every cross-reference and range; the first problem is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.server.max_body_bytes == 0 {
            return bad("server.max_body_bytes must be > 0".into());
        }
        if self.server.header_timeout_ms == 0 || self.server.max_connections == 0 {
            return bad("server.header_timeout_ms and server.max_connections must be > 0".into());
        }
        let mut names = HashSet::new();
        for t in &self.targets {
            if t.name.is_empty() {
                return bad("a [[target]] has an empty name".into());
            }
            if !names.insert(t.name.as_str()) {
                return bad(format!("target '{}' is declared twice", t.name));
            }
            if t.replicas.is_empty() && t.canned_reply.is_none() && t.discover.is_none() {
                return bad(format!(
                    "target '{}' has no replicas, no discover and no canned_reply: give it `replicas = [\"http://host:port\"]` or `discover = \"http://service-name:port\"`",
                    t.name
                ));
            }
            if let Some(d) = &t.discover {
                crate::upstream::discovery::DiscoverySpec::parse(d).map_err(|e| {
                    ConfigError::Invalid(format!("target '{}': discover: {e}", t.name))
                })?;
                if t.discover_interval_ms < 100 {
                    return bad(format!(
                        "target '{}': discover_interval_ms must be at least 100",
                        t.name
                    ));
                }
            }
            for r in &t.replicas {
                if !(r.starts_with("http://") || r.starts_with("https://")) {
                    return bad(format!(
                        "target '{}': replica '{r}' must be an http:// or https:// URL",
                        t.name
                    ));
                }
            }
            if t.max_concurrency == 0 {
                return bad(format!("target '{}': max_concurrency must be > 0", t.name));
            }
        }
        let known = |name: &str, what: &str, route: &str| -> Result<(), ConfigError> {
            if names.contains(name) {
                Ok(())
            } else {
                Err(ConfigError::Invalid(format!(
                    "route '{route}': {what} '{name}' is not a [[target]]"
                )))
            }
        };
        let mut models = HashSet::new();
        for r in &self.routes {
            if !models.insert(r.model.as_str()) {
                return bad(format!("route '{}' is declared twice", r.model));
            }
            if r.target.is_none() && r.split.is_none() && r.rollout.is_none() {
                return bad(format!(
                    "route '{}' needs a `target`, a `split` or a `rollout`",
                    r.model
                ));
            }
            if let Some(other) = r
                .balance
                .filter(|b| r.prefix_affinity && *b != Balance::Prefix)
            {
                return bad(format!(
                    "route '{}': prefix_affinity = true (the older spelling of balance = \"prefix\") contradicts balance = {other:?}; keep one",
                    r.model
                ));
            }
            if r.prefix_load_slack.is_some() && r.balance() != Balance::Prefix {
                return bad(format!(
                    "route '{}': prefix_load_slack applies to balance = \"prefix\" only; set balance = \"prefix\" or remove it",
                    r.model
                ));
            }
            if let Some(n) = r.max_replays.filter(|n| *n > MAX_REPLAYS) {
                return bad(format!(
                    "route '{}': max_replays = {n} is over {MAX_REPLAYS}: a request that crashes replicas would be sent to {} of them",
                    r.model,
                    u64::from(n) + 1
                ));
            }
            if let Some(t) = &r.target {
                known(t, "target", &r.model)?;
            }
            for rule in &r.rules {
                known(&rule.target, "rule target", &r.model)?;
                if rule.tier.is_none() && rule.group.is_none() && rule.header.is_none() {
                    return bad(format!(
                        "route '{}': a rule needs at least one of tier, group, header",
                        r.model
                    ));
                }
            }
            if let Some(split) = &r.split {
                if split.weights.is_empty() {
                    return bad(format!("route '{}': split has no weights", r.model));
                }
                for (t, w) in &split.weights {
                    known(t, "split target", &r.model)?;
                    if !(w.is_finite() && *w >= 0.0) {
                        return bad(format!(
                            "route '{}': weight of '{t}' must be a finite number >= 0",
                            r.model
                        ));
                    }
                }
                if split.weights.values().sum::<f64>() <= 0.0 {
                    return bad(format!("route '{}': split weights sum to 0", r.model));
                }
            }
            if let Some(ro) = &r.rollout {
                known(&ro.stable, "rollout stable", &r.model)?;
                known(&ro.canary, "rollout canary", &r.model)?;
                if ro.stable == ro.canary {
                    return bad(format!(
                        "route '{}': rollout stable and canary are the same target",
                        r.model
                    ));
                }
                if ro.steps.is_empty()
                    || ro
                        .steps
                        .iter()
                        .any(|s| !(s.is_finite() && *s > 0.0 && *s <= 100.0))
                    || ro.steps.windows(2).any(|w| w[0] >= w[1])
                {
                    return bad(format!(
                        "route '{}': rollout steps must increase within (0, 100]",
                        r.model
                    ));
                }
                if !(ro.interval_s > 0.0 && ro.hold_s >= 0.0) {
                    return bad(format!(
                        "route '{}': rollout interval_s must be > 0 and hold_s >= 0",
                        r.model
                    ));
                }
            }
            for f in &r.fallback {
                known(f, "fallback", &r.model)?;
            }
        }
        let mut key_names = HashSet::new();
        for k in &self.keys {
            if !key_names.insert(k.name.as_str()) {
                return bad(format!("key '{}' is declared twice", k.name));
            }
            if !pagoda_http::api_key::is_key_hash(&k.key_sha256) {
                return bad(format!(
                    "key '{}': key_sha256 must be `sha256:` and 64 hex digits (see `pagoda gateway keys hash`)",
                    k.name
                ));
            }
            for m in &k.models {
                if !models.contains(m.as_str()) {
                    return bad(format!("key '{}': model '{m}' is not a [[route]]", k.name));
                }
            }
        }
        if self.cache.backend == CacheBackend::Redis && self.redis.is_none() {
            return bad("cache.backend = \"redis\" needs a [redis] section".into());
        }
        if self.retry.max_attempts == 0 {
            return bad("retry.max_attempts must be >= 1".into());
        }
        if self.retry.max_replays > MAX_REPLAYS {
            return bad(format!(
                "retry.max_replays = {} is over {MAX_REPLAYS}: a request that crashes replicas would be sent to {} of them",
                self.retry.max_replays,
                u64::from(self.retry.max_replays) + 1
            ));
        }
        Ok(())
    }
}
