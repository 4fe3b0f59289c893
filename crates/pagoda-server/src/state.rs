//! The server's configuration ([`ServerConfig`]) and the state every handler shares
//! ([`AppState`]): the model registry, the metrics, and the ready/draining flags.
//!
//! Invariant: `draining` only goes from false to true; once set, new generation requests get
//! 503 while those in flight finish.

use crate::clock::unix_now;
use crate::embedders::Embedders;
use crate::error::ApiError;
use crate::loader::LoadOptions;
use crate::metrics::Metrics;
use crate::registry::{KeepAlive, Registry};
use pagoda_engine::EngineConfig;
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
    /// Most bytes all loaded models may take (weights + KV pools); `None`: no limit.
    pub memory_budget: Option<u64>,
    /// How long SIGTERM waits for requests in flight.
    pub drain_grace: Duration,
    /// How often the store is checked for new versions of loaded models (hot reload).
    pub reload_interval: Duration,
    /// How models' weights are prepared at load (`--quantize`).
    pub load: LoadOptions,
    /// LoRA adapters (name, PEFT folder) loaded at start for the first model (`--lora`).
    pub loras: Vec<(String, std::path::PathBuf)>,
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
        }
    }
}

impl ServerConfig {
    pub fn max_num_seqs_per_model(&self) -> usize {
        self.engine.max_num_seqs
    }
}

/// Shared by every handler (cheap to clone).
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<ServerConfig>,
    pub registry: Arc<Registry>,
    pub embedders: Arc<Embedders>,
    pub metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    draining: Arc<AtomicBool>,
    next_id: Arc<AtomicU64>,
    pub started: SystemTime,
}

impl AppState {
    pub fn new(config: ServerConfig, registry: Arc<Registry>, metrics: Arc<Metrics>) -> Self {
        let embedders = Arc::new(Embedders::new(registry.store().clone()));
        AppState {
            config: Arc::new(config),
            registry,
            embedders,
            metrics,
            ready: Arc::new(AtomicBool::new(false)),
            draining: Arc::new(AtomicBool::new(false)),
            next_id: Arc::new(AtomicU64::new(1)),
            started: SystemTime::now(),
        }
    }

    /// Ready: the models named at start are loaded and the server is not draining.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.draining()
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

    /// A new request id with the given prefix (`chatcmpl`, `cmpl`, ...).
    pub fn request_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let t = unix_now();
        format!("{prefix}-{t:x}{n:06x}")
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
