//! The gateway's shared state: the current config (swapped atomically on reload) and the
//! long-lived parts built from it — upstream pools, rollouts, keys, limiter, cache, usage
//! ledger, metrics, the HTTP client and the retry budget.
//!
//! Invariants: the request path reads the config once per request (`config()`), so one
//! request sees one consistent config even while a reload happens; `apply` updates the pools,
//! rollouts and static keys before publishing the new config, so a route never names a target
//! whose pool is missing. Settings that cannot change without a restart (listen address,
//! storage, Redis, cache backend) are kept from the first config and a reload that changes
//! them says so in the log.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::cache::ResponseCache;
use crate::config::GatewayConfig;
use crate::keys::{hash_key, KeyStore};
use crate::limits::Limiter;
use crate::metrics::GatewayMetrics;
use crate::proxy::retry::RetryBudget;
use crate::rollout::shared::RedisRolloutStore;
use crate::rollout::Rollouts;
use crate::upstream::Upstreams;
use crate::usage::UsageLedger;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the key store {path}: {message}")]
    Keys { path: String, message: String },
    #[error("cannot open the usage ledger: {0}")]
    Usage(String),
    #[error("cannot connect to Redis at {url}: {message} (is redis-server running?)")]
    Redis { url: String, message: String },
    #[error("cannot set up the response cache: {0}")]
    Cache(String),
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// The outcome of the last reload, for `GET /admin/config`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReloadStatus {
    pub generation: u64,
    pub last_error: Option<String>,
    pub last_applied_ms: Option<u64>,
}

pub struct Gateway {
    config: ArcSwap<GatewayConfig>,
    pub config_path: Option<PathBuf>,
    pub upstreams: Arc<Upstreams>,
    pub rollouts: Arc<Rollouts>,
    pub keys: KeyStore,
    pub limiter: Limiter,
    pub cache: ResponseCache,
    pub usage: UsageLedger,
    pub metrics: GatewayMetrics,
    pub client: reqwest::Client,
    pub retry_budget: RetryBudget,
    pub split_draws: crate::route::SplitDraws,
    admin_key_hash: Option<String>,
    reload: Mutex<ReloadStatus>,
    next_id: AtomicU64,
    instance: String,
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn storage_path(config_path: Option<&Path>, file: &str) -> PathBuf {
    let p = PathBuf::from(file);
    match config_path.and_then(Path::parent) {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    }
}

impl Gateway {
    /// Builds every part from a validated config. `config_path` anchors relative storage paths
    /// and is the file `reload` watches.
    pub async fn new(
        config: GatewayConfig,
        config_path: Option<PathBuf>,
    ) -> Result<Arc<Self>, StartError> {
        let sqlite = storage_path(config_path.as_deref(), &config.storage.sqlite);
        let keys = if config.storage.sqlite == ":memory:" {
            KeyStore::open_in_memory()
        } else {
            KeyStore::open(&sqlite)
        }
        .map_err(|e| StartError::Keys {
            path: sqlite.display().to_string(),
            message: e.to_string(),
        })?;
        keys.set_static_keys(&config.keys);
        let usage = match (&config.storage.postgres, config.storage.sqlite.as_str()) {
            (Some(url), _) => UsageLedger::postgres(url),
            (None, ":memory:") => UsageLedger::in_memory(),
            (None, _) => UsageLedger::sqlite(&sqlite),
        }
        .map_err(|e| StartError::Usage(e.to_string()))?;
        let limiter = match &config.redis {
            Some(r) => Limiter::redis(&r.url, &r.prefix)
                .await
                .map_err(|e| StartError::Redis {
                    url: r.url.clone(),
                    message: e.to_string(),
                })?,
            None => {
                let limiter = Limiter::local();
                // In-process budgets survive a restart through the ledger.
                if let Ok(spent) = usage.spent_by_key() {
                    for (key, tokens) in spent {
                        if let Err(e) = limiter.seed_spent(&key, tokens).await {
                            tracing::warn!(error = %e, %key, "cannot seed a key's spent tokens");
                        }
                    }
                }
                limiter
            }
        };
        let cache = ResponseCache::from_config(&config.cache, config.redis.as_ref())
            .await
            .map_err(|e| StartError::Cache(e.to_string()))?;
        let client = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1024)
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| StartError::Client(e.to_string()))?;
        let admin_key = config.server.admin_key.clone().or_else(|| {
            config
                .server
                .admin_key_env
                .as_deref()
                .and_then(|v| std::env::var(v).ok())
                .filter(|k| !k.is_empty())
        });
        if admin_key.is_none() {
            tracing::warn!(
                "no admin key configured: the admin API is disabled (set PAGODA_GATEWAY_ADMIN_KEY)"
            );
        }
        let instance = format!("{:08x}", rand::random::<u32>());
        let rollouts = match &config.redis {
            Some(r) => Rollouts::shared(
                RedisRolloutStore::connect(&r.url, &r.prefix, &instance)
                    .await
                    .map_err(|e| StartError::Redis {
                        url: r.url.clone(),
                        message: e.to_string(),
                    })?,
            ),
            None => Rollouts::new(),
        };
        let rollouts = Arc::new(rollouts);
        rollouts.sync(&config);
        // A restarted instance routes by the shared rollout state from its first request.
        if let Err(e) = rollouts.refresh_shared().await {
            tracing::warn!(error = %e, "cannot read the shared rollout state yet; retrying in the background");
        }
        let upstreams = Arc::new(Upstreams::new(&config));
        let metrics = GatewayMetrics::new();
        Ok(Arc::new(Self {
            config: ArcSwap::from_pointee(config),
            config_path,
            upstreams,
            rollouts,
            keys,
            limiter,
            cache,
            usage,
            metrics,
            client,
            retry_budget: RetryBudget::new(),
            split_draws: crate::route::SplitDraws::default(),
            admin_key_hash: admin_key.as_deref().map(hash_key),
            reload: Mutex::new(ReloadStatus::default()),
            next_id: AtomicU64::new(1),
            instance,
        }))
    }

    /// The config in force now.
    pub fn config(&self) -> Arc<GatewayConfig> {
        self.config.load_full()
    }

    /// A request id unique across instances: instance prefix and a counter.
    pub fn next_request_id(&self) -> String {
        format!(
            "{}-{}",
            self.instance,
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Whether `presented` is the admin key.
    pub fn is_admin(&self, presented: &str) -> bool {
        self.admin_key_hash
            .as_deref()
            .is_some_and(|h| pagoda_http::api_key::constant_time_eq(h, &hash_key(presented)))
    }

    pub fn admin_enabled(&self) -> bool {
        self.admin_key_hash.is_some()
    }

    /// Puts a validated config in force (hot reload). Never fails: what needs a restart is
    /// kept and logged.
    pub fn apply(&self, mut new: GatewayConfig) {
        let old = self.config();
        if new.server.listen != old.server.listen
            || new.storage != old.storage
            || new.redis != old.redis
            || new.cache.backend != old.cache.backend
        {
            tracing::warn!("listen, storage, redis and cache.backend changes need a restart; keeping the running ones");
            new.server.listen = old.server.listen.clone();
            new.storage = old.storage.clone();
            new.redis = old.redis.clone();
            new.cache.backend = old.cache.backend;
        }
        self.forget_removed_series(&old, &new);
        let before = self.replica_urls();
        self.upstreams.reconcile(&new);
        // Replicas that left (listed or discovered) take their series with them.
        let after = self.replica_urls();
        for (target, url) in before.difference(&after) {
            self.metrics.forget_replica(target, url);
        }
        self.rollouts.sync(&new);
        self.keys.set_static_keys(&new.keys);
        self.config.store(Arc::new(new));
        let mut status = self.reload.lock().unwrap_or_else(|p| p.into_inner());
        status.generation += 1;
        status.last_error = None;
        status.last_applied_ms = Some(now_ms());
        tracing::info!(generation = status.generation, "gateway config applied");
    }

    /// Drops the gauge series of replicas and canaries the new config no longer has.
    /// Every (target, replica URL) in the pools now.
    fn replica_urls(&self) -> std::collections::HashSet<(String, String)> {
        self.upstreams
            .pools()
            .iter()
            .flat_map(|p| p.replicas().iter().map(|r| (p.name.clone(), r.url.clone())))
            .collect()
    }

    fn forget_removed_series(&self, old: &GatewayConfig, new: &GatewayConfig) {
        for r in &old.routes {
            if r.rollout.is_some()
                && new
                    .route(&r.model)
                    .and_then(|n| n.rollout.as_ref())
                    .is_none()
            {
                self.metrics.forget_canary(&r.model);
            }
        }
    }

    /// Notes a rejected reload (the old config stays).
    pub fn reject(&self, reason: String) {
        tracing::error!(%reason, "config change rejected; the previous config stays in force");
        self.reload
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_error = Some(reason);
    }

    /// Sets the gauges that mirror state kept elsewhere (circuits, queues, canary weights);
    /// called on each `/metrics` scrape.
    pub fn refresh_gauges(&self) {
        use crate::metrics::CircuitLevel;
        use crate::upstream::BreakerState;
        for pool in self.upstreams.pools() {
            for r in pool.replicas() {
                let level = match r.breaker_state() {
                    BreakerState::Closed => CircuitLevel::Closed,
                    BreakerState::HalfOpen => CircuitLevel::HalfOpen,
                    BreakerState::Open => CircuitLevel::Open,
                };
                self.metrics.set_circuit_state(&pool.name, &r.url, level);
                self.metrics
                    .set_replica_outstanding(&pool.name, &r.url, r.outstanding() as f64);
            }
        }
        for status in self.rollouts.status() {
            self.metrics
                .set_canary_weight(&status.route, status.canary_percent);
        }
    }

    pub fn reload_status(&self) -> ReloadStatus {
        self.reload
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
