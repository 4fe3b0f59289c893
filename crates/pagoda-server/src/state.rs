//! The server's configuration ([`ServerConfig`]) and the state every handler shares
//! ([`AppState`]): the model registry, the metrics, the browser guard, and the ready/draining
//! flags.
//!
//! Invariants: `draining` only goes from false to true; once set, new generation requests get
//! 503 while those in flight finish. Every limit a client could otherwise exhaust (bodies,
//! connections, time, memory for models, what may be named or pulled) has a default here that
//! is on; the operator widens it with a flag (docs/serving.md, "Security model").

use crate::body::BodyLimits;
use crate::clock::unix_now;
use crate::embedders::Embedders;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::registry::{KeepAlive, Registry};
use pagoda_engine::EngineConfig;
use pagoda_http::browser_guard::BrowserGuard;
pub use pagoda_http::browser_guard::BrowserRules;
use pagoda_runtime::loader::LoadOptions;
use pagoda_runtime::request::Bounds;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The port `pagoda serve` listens on by default: one above Ollama's 11434, so both can run.
pub const DEFAULT_PORT: u16 = 11435;

/// Everything `pagoda serve` is started with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Models loaded at start (kept loaded); the first is the default for requests that
    /// name none.
    pub models: Vec<String>,
    pub engine: EngineConfig,
    /// Requests per model allowed to wait beyond the running batch; more get 429.
    pub max_queue: usize,
    /// Largest request body; more gets 413.
    pub max_body_bytes: usize,
    /// Keep-alive of models loaded on demand (`None`: forever).
    pub keep_alive: KeepAlive,
    /// Most bytes all loaded models may take (weights + KV pools); `None`:
    /// [`default_memory_budget`].
    pub memory_budget: Option<u64>,
    /// How long SIGTERM waits for requests in flight.
    pub drain_grace: Duration,
    /// How often the store is checked for new versions of loaded models (hot reload).
    pub reload_interval: Duration,
    /// How models' weights are prepared at load (`--quantize`).
    pub load: LoadOptions,
    /// LoRA adapters (name, PEFT folder) loaded at start for the first model (`--lora`).
    pub loras: Vec<(String, std::path::PathBuf)>,
    /// Directories under which clients may name model files and LoRA folders by path
    /// (`--allow-model-dir`); empty: store names and the models named at start only.
    pub model_dirs: Vec<PathBuf>,
    /// What `POST /api/pull` may fetch (off unless enabled).
    pub pull: PullPolicy,
    /// Per-connection limits.
    pub connections: ConnectionLimits,
    /// Most output tokens per choice (`--max-tokens-limit`); a request without `max_tokens`
    /// gets the smaller of this and the context left. `None`: the context is the limit.
    pub max_tokens_limit: Option<usize>,
    /// Keys every route but the probes needs (`--api-key`, `--api-key-file`); none: open.
    pub api_keys: crate::auth::ApiKeys,
    /// Origins and Host names allowed beyond the defaults (`--allowed-origins`,
    /// `--allowed-hosts`; pagoda-http's `browser_guard` has the rules).
    pub browsers: BrowserRules,
}

/// What clients may make the server download through `POST /api/pull`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullPolicy {
    /// `--allow-pull`: the route answers at all (403 otherwise).
    pub enabled: bool,
    /// Sources a client may name besides catalog names (`--pull-allow-source`): `hf`
    /// (Hugging Face through the configured endpoint), `pip` (PyPI packages), or
    /// `https://HOST` / `http://HOST` (`*.` before a domain allows its subdomains). Local
    /// paths and `file://` never.
    pub allowed_sources: Vec<String>,
    /// `--pull-allow-private`: let sources resolve to loopback, private or link-local
    /// addresses (a mirror on the local network).
    pub allow_private: bool,
}

/// Limits on every HTTP connection: pagoda-http's (headers, connection cap) and the body
/// deadline the handlers read under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A request's headers must arrive within this time of the connection being ready for
    /// them (also how long an idle keep-alive connection stays open).
    pub header_timeout: Duration,
    /// A request's body must arrive within this time of the handler asking for it (408).
    pub body_timeout: Duration,
    /// Connections open at once; more wait in the kernel's backlog until one closes.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        let http = pagoda_http::ConnectionLimits::default();
        ConnectionLimits {
            header_timeout: http.header_timeout,
            body_timeout: Duration::from_secs(30),
            max_connections: http.max_connections,
        }
    }
}

impl ConnectionLimits {
    /// The part the accept loop enforces.
    pub fn accept(&self) -> pagoda_http::ConnectionLimits {
        pagoda_http::ConnectionLimits {
            header_timeout: self.header_timeout,
            max_connections: self.max_connections,
        }
    }
}

/// The memory budget when the operator names none: 90 % of the machine's memory (the rest
/// for the process, the page cache and the system), or none where the machine does not say
/// (pagoda-runtime's, which `pagoda run`'s automatic quantization choice uses too).
pub fn default_memory_budget() -> Option<u64> {
    pagoda_runtime::quant_choice::default_memory_budget()
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: DEFAULT_PORT,
            models: Vec::new(),
            engine: EngineConfig::default(),
            max_queue: 256,
            max_body_bytes: 4 << 20,
            keep_alive: Some(crate::registry::DEFAULT_KEEP_ALIVE),
            memory_budget: None,
            drain_grace: Duration::from_secs(30),
            reload_interval: Duration::from_secs(2),
            load: LoadOptions::default(),
            loras: Vec::new(),
            model_dirs: Vec::new(),
            pull: PullPolicy::default(),
            connections: ConnectionLimits::default(),
            max_tokens_limit: None,
            api_keys: crate::auth::ApiKeys::default(),
            browsers: Default::default(),
        }
    }
}

impl ServerConfig {
    pub fn max_num_seqs_per_model(&self) -> usize {
        self.engine.max_num_seqs
    }

    /// The limits request bodies are read under.
    pub fn body_limits(&self) -> BodyLimits {
        BodyLimits {
            max_bytes: self.max_body_bytes,
            timeout: self.connections.body_timeout,
        }
    }
}

/// Shared by every handler (cheap to clone).
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<ServerConfig>,
    pub registry: Arc<Registry>,
    pub embedders: Arc<Embedders>,
    pub metrics: Arc<Metrics>,
    /// Which web pages and Host names are answered (built from `config.browsers` and the
    /// bound address).
    pub browsers: Arc<BrowserGuard>,
    ready: Arc<AtomicBool>,
    draining: Arc<AtomicBool>,
    next_id: Arc<AtomicU64>,
    pub started: SystemTime,
}

impl AppState {
    pub fn new(
        config: ServerConfig,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        browsers: BrowserGuard,
    ) -> Self {
        let embedders = Arc::new(Embedders::new(registry.names().clone()));
        AppState {
            config: Arc::new(config),
            registry,
            embedders,
            metrics,
            browsers: Arc::new(browsers),
            ready: Arc::new(AtomicBool::new(false)),
            draining: Arc::new(AtomicBool::new(false)),
            next_id: Arc::new(AtomicU64::new(1)),
            started: SystemTime::now(),
        }
    }

    /// Ready: the models named at start are loaded (and still are) and the server is not
    /// draining.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.draining() && self.registry.pinned_loaded()
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Whether a generation may start now: 503 while the models named at start load, or
    /// while draining.
    pub fn admit(&self) -> Result<(), ApiError> {
        if self.draining() {
            return Err(ApiError::unavailable(
                "the server is shutting down; send the request to another replica",
            ));
        }
        if !self.ready.load(Ordering::Acquire) {
            return Err(ApiError::unavailable(
                "the server is still loading its models; retry shortly",
            ));
        }
        Ok(())
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// The limits request bodies are read under.
    pub fn body_limits(&self) -> BodyLimits {
        self.config.body_limits()
    }

    /// A new request id with the given prefix (`chatcmpl`, `cmpl`, ...).
    pub fn request_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let t = unix_now();
        format!("{prefix}-{t:x}{n:06x}")
    }

    /// What a request on `lease`'s model may ask for under this server's limits (the plan
    /// builder of each API shape applies its own length rule).
    pub fn bounds(&self, lease: &crate::registry::Lease) -> Bounds {
        Bounds::serving(
            &lease.loaded,
            lease.engine.layout().max_model_len,
            self.config.max_tokens_limit,
            self.config.engine.policy,
        )
    }

    /// The model a request names, or the default one when it names none.
    pub fn model_or_default<'a>(&'a self, requested: &'a str) -> &'a str {
        if requested.trim().is_empty() {
            self.config.models.first().map_or(requested, String::as_str)
        } else {
            requested
        }
    }
}
