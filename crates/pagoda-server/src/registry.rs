//! The models the server holds: loaded on first use (or at start), shared by every request
//! through a [`Lease`], unloaded when idle past their keep-alive, evicted to stay inside the
//! memory budget, and swapped for a new version when the store's copy changes (hot reload).
//!
//! Invariants:
//! - one load per model at a time: concurrent first requests wait on the same load;
//! - a [`Lease`] keeps its [`ServedModel`] (and its engine) alive, so requests in flight
//!   finish on the version they started on, even after a reload or an unload; the engine
//!   stops when the last lease and the registry have let go of it;
//! - a model with requests in flight is never evicted or reaped;
//! - a model name that names a LoRA adapter (`adapter` or `base:adapter`, see
//!   [`Adapters`]) leases the base and carries the adapter's weights in the [`Lease`]; a model
//!   created with a Modelfile ADAPTER carries its own adapter for every request.

use crate::adapters::Adapters;
use crate::error::ApiError;
use crate::names::{ModelNames, NamedModel};
use pagoda_engine::{EngineConfig, EngineHandle};
use pagoda_model::arch::LoraWeights;
use pagoda_runtime::loader::{self, LoadOptions, LoadedModel};
use pagoda_store::Store;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::OnceCell;

/// How long a model stays loaded after its last request (`None`: forever).
pub type KeepAlive = Option<Duration>;

/// Ollama's default keep-alive for models loaded on demand.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(300);

/// One loaded model version with its running engine.
pub struct ServedModel {
    /// The canonical name (`name:tag` from the store, or the path given).
    pub name: String,
    /// What identifies this version: the weights' digest (with a derived model's Modelfile
    /// layer), or size and mtime for a path.
    pub version: String,
    pub loaded: LoadedModel,
    pub engine: EngineHandle,
    pub loaded_at: SystemTime,
    activity: Mutex<Activity>,
    in_flight: AtomicUsize,
}

#[derive(Debug, Clone, Copy)]
struct Activity {
    last_used: Instant,
    keep_alive: KeepAlive,
}

impl ServedModel {
    /// Requests holding a lease on this version now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// When it will be unloaded if no request comes (`None`: never).
    pub fn expires_at(&self) -> Option<SystemTime> {
        let a = *self.activity();
        let keep = a.keep_alive?;
        let idle = a.last_used.elapsed();
        Some(SystemTime::now() + keep.saturating_sub(idle))
    }

    /// Weights plus KV pool, the figure the memory budget counts (the pool is reserved whole
    /// but committed by the kernel only as blocks are written).
    pub fn memory_bytes(&self) -> u64 {
        self.loaded.weights_bytes() + self.engine.layout().bytes as u64
    }

    /// Weights plus the KV blocks in use now: what `/api/ps` reports as the model's size.
    pub fn resident_bytes(&self) -> u64 {
        let layout = self.engine.layout();
        let per_block = layout.bytes / layout.n_blocks.max(1);
        self.loaded.weights_bytes() + (self.engine.stats().kv_blocks_used * per_block) as u64
    }

    fn activity(&self) -> std::sync::MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn idle_expired(&self, now: Instant) -> bool {
        let a = *self.activity();
        self.in_flight() == 0
            && a.keep_alive
                .is_some_and(|k| now.saturating_duration_since(a.last_used) >= k)
    }
}

impl Drop for ServedModel {
    fn drop(&mut self) {
        // Joining the engine thread can take a step's time; never block an async worker.
        let engine = self.engine.clone();
        let name = self.name.clone();
        let stop = move || {
            engine.shutdown();
            tracing::info!(model = %name, "model unloaded");
        };
        // If no thread can be started, stop inline rather than panic in a destructor.
        let spare = self.engine.clone();
        if std::thread::Builder::new()
            .name("pagoda-unload".into())
            .spawn(stop)
            .is_err()
        {
            spare.shutdown();
        }
    }
}

/// A request's hold on a model; see the module invariants.
pub struct Lease {
    model: Arc<ServedModel>,
    /// The LoRA adapter requests on this lease run under (`None`: the base model).
    pub adapter: Option<LoraWeights>,
    /// The model name as the request gave it, when it named an adapter.
    requested: Option<String>,
}

impl Lease {
    fn new(model: Arc<ServedModel>, keep_alive: Option<KeepAlive>) -> Self {
        let adapter = model.loaded.adapter.clone();
        model.in_flight.fetch_add(1, Ordering::AcqRel);
        {
            let mut a = model.activity();
            a.last_used = Instant::now();
            if let Some(k) = keep_alive {
                a.keep_alive = k;
            }
        }
        Lease {
            model,
            adapter,
            requested: None,
        }
    }

    pub fn model(&self) -> &Arc<ServedModel> {
        &self.model
    }

    /// The name responses report: the requested adapter name, else the model's.
    pub fn served_name(&self) -> &str {
        self.requested.as_deref().unwrap_or(&self.model.name)
    }
}

impl std::ops::Deref for Lease {
    type Target = ServedModel;
    fn deref(&self) -> &ServedModel {
        &self.model
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.model.activity().last_used = Instant::now();
        self.model.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Slot {
    cell: OnceCell<Arc<ServedModel>>,
}

/// Settings of the [`Registry`].
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    pub engine: EngineConfig,
    /// Keep-alive of models loaded on demand.
    pub keep_alive: KeepAlive,
    /// Most bytes (weights + KV pools) all loaded models may take; `None`: no limit (the
    /// server always sets one: [`crate::state::default_memory_budget`] unless the operator
    /// names one).
    pub memory_budget: Option<u64>,
    /// How every model's weights are prepared (online quantization).
    pub load: LoadOptions,
}

/// The loaded models; see the module docs.
pub struct Registry {
    names: Arc<ModelNames>,
    config: RegistryConfig,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// LoRA adapters served on the loaded models.
    pub adapters: Adapters,
}

/// A name resolved to what to load.
struct Target {
    key: String,
    version: String,
    resolved: pagoda_store::ResolvedModel,
}

impl Registry {
    pub fn new(names: Arc<ModelNames>, config: RegistryConfig) -> Self {
        Registry {
            names,
            config,
            slots: Mutex::new(HashMap::new()),
            adapters: Adapters::default(),
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        self.names.store()
    }

    /// The naming policy requests are resolved by.
    pub fn names(&self) -> &Arc<ModelNames> {
        &self.names
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What `name` loads (see [`ModelNames`]: store names and operator-allowed paths only).
    fn target(&self, name: &str) -> Result<Target, ApiError> {
        let NamedModel { key, resolved } = self.names.resolve(name)?;
        let version = match &resolved.manifest {
            // The weights' digest, combined with the Modelfile layer of a derived model, so a
            // re-`create` with new parameters is a new version too.
            Some(m) => m.version(),
            None => path_version(&resolved.path),
        };
        Ok(Target {
            key,
            version,
            resolved,
        })
    }

    /// A lease on `name`, loading it first if needed. `keep_alive`: `None` keeps the model's
    /// setting, `Some(k)` sets it (Ollama's per-request `keep_alive`). A name that is a LoRA
    /// adapter's (`adapter` or `base:adapter`) leases the base with the adapter; `base:x` where
    /// the base exists but `x` is no adapter is 404 listing the loaded adapters.
    pub async fn acquire(
        self: &Arc<Self>,
        name: &str,
        keep_alive: Option<KeepAlive>,
    ) -> Result<Lease, ApiError> {
        if let Some((base, entry)) = self.adapters.resolve(name) {
            let mut lease = self.acquire_base(&base, keep_alive).await?;
            lease.adapter = Some(Adapters::weights_for(&entry, &base, &lease.loaded.model)?);
            lease.requested = Some(name.to_string());
            return Ok(lease);
        }
        match self.acquire_base(name, keep_alive).await {
            Err(e) if e.status == axum::http::StatusCode::NOT_FOUND => {
                if let Some((base, adapter)) = name.rsplit_once(':') {
                    let this = self.clone();
                    let base_owned = base.to_string();
                    let base_exists =
                        tokio::task::spawn_blocking(move || this.target(&base_owned).is_ok())
                            .await
                            .unwrap_or(false);
                    if base_exists {
                        return Err(self.adapters.not_found(adapter));
                    }
                }
                let mut e = e;
                if !self.adapters.list().is_empty() {
                    e.message.push_str(&format!(
                        " (loaded LoRA adapters: {})",
                        self.adapters.names_for_message()
                    ));
                }
                Err(e)
            }
            other => other,
        }
    }

    /// A lease on the model `name` itself (no adapter resolution).
    pub async fn acquire_base(
        self: &Arc<Self>,
        name: &str,
        keep_alive: Option<KeepAlive>,
    ) -> Result<Lease, ApiError> {
        let this = self.clone();
        let owned = name.to_string();
        let target = tokio::task::spawn_blocking(move || this.target(&owned))
            .await
            .map_err(|e| ApiError::internal(format!("model lookup failed: {e}")))??;
        if loader::kind_of(&target.resolved.path) == loader::ModelKind::Embedding {
            return Err(ApiError::invalid_param(
                "model",
                format!("`{name}` is an embedding model; use POST /v1/embeddings or /api/embed"),
            ));
        }
        let slot = self
            .slots()
            .entry(target.key.clone())
            .or_insert_with(|| {
                Arc::new(Slot {
                    cell: OnceCell::new(),
                })
            })
            .clone();
        let model = slot
            .cell
            .get_or_try_init(|| self.load(target, self.config.keep_alive))
            .await?
            .clone();
        Ok(Lease::new(model, keep_alive))
    }

    /// Whether `name` is a generative or an embedding model (404 if unknown).
    pub async fn kind(self: &Arc<Self>, name: &str) -> Result<loader::ModelKind, ApiError> {
        let this = self.clone();
        let owned = name.to_string();
        tokio::task::spawn_blocking(move || {
            this.target(&owned)
                .map(|t| loader::kind_of(&t.resolved.path))
        })
        .await
        .map_err(|e| ApiError::internal(format!("model lookup failed: {e}")))?
    }

    /// Loads a model at start: it stays loaded until a request's keep_alive says otherwise.
    pub async fn preload(self: &Arc<Self>, name: &str) -> Result<Arc<ServedModel>, ApiError> {
        let lease = self.acquire(name, Some(None)).await?;
        Ok(lease.model().clone())
    }

    async fn load(
        self: &Arc<Self>,
        target: Target,
        keep_alive: KeepAlive,
    ) -> Result<Arc<ServedModel>, ApiError> {
        self.make_room(&target)?;
        let engine_config = self.config.engine.clone();
        let options = self.config.load;
        let key = target.key.clone();
        let started = Instant::now();
        let model = tokio::task::spawn_blocking(move || -> Result<ServedModel, ApiError> {
            let loaded = loader::load_with(&target.resolved, &target.key, &options)
                .map_err(|e| ApiError::load_failed(&target.key).with_detail(e.to_string()))?;
            let engine = EngineHandle::start(
                loaded.model.clone(),
                loaded.tokenizer.clone(),
                engine_config,
            )
            .map_err(|e| ApiError::unavailable(format!("cannot start the engine: {e}")))?;
            Ok(ServedModel {
                name: target.key,
                version: target.version,
                loaded,
                engine,
                loaded_at: SystemTime::now(),
                activity: Mutex::new(Activity {
                    last_used: Instant::now(),
                    keep_alive,
                }),
                in_flight: AtomicUsize::new(0),
            })
        })
        .await
        .map_err(|e| ApiError::internal(format!("model load failed: {e}")))??;
        tracing::info!(
            model = %key,
            version = %model.version,
            secs = started.elapsed().as_secs_f64(),
            kv_blocks = model.engine.layout().n_blocks,
            "model ready"
        );
        Ok(Arc::new(model))
    }

    /// Evicts idle models, least recently used first, until `target` fits the budget;
    /// 503 when models in use leave no room.
    fn make_room(&self, target: &Target) -> Result<(), ApiError> {
        let Some(budget) = self.config.memory_budget else {
            return Ok(());
        };
        let need = loader::dir_or_file_size(&target.resolved.path) + self.kv_estimate();
        let mut loaded = self.loaded();
        loaded.sort_by_key(|m| m.activity().last_used);
        let mut used: u64 = loaded.iter().map(|m| m.memory_bytes()).sum();
        for m in &loaded {
            if used + need <= budget {
                break;
            }
            if m.in_flight() == 0 {
                tracing::info!(model = %m.name, "evicting an idle model to make room");
                self.remove(&m.name);
                used = used.saturating_sub(m.memory_bytes());
            }
        }
        if used + need > budget {
            return Err(ApiError::unavailable(format!(
                "not enough memory to load `{}`: it needs about {} MiB and models in use hold {} MiB of the {} MiB budget; retry when they are idle, or raise --memory-budget",
                target.key,
                need >> 20,
                used >> 20,
                budget >> 20
            )));
        }
        Ok(())
    }

    /// The KV pool a new model will reserve: `--kv-cache-memory`, or the engine's default
    /// share of the memory available now (an upper bound: the engine caps it at what
    /// `max_num_seqs` full sequences need).
    fn kv_estimate(&self) -> u64 {
        self.config.engine.kv_cache_memory.unwrap_or_else(|| {
            pagoda_engine::memory::available_memory().map_or(0, |m| {
                (m as f64 * pagoda_engine::engine::DEFAULT_KV_FRACTION) as u64
            })
        })
    }

    /// The loaded models (not those still loading).
    pub fn loaded(&self) -> Vec<Arc<ServedModel>> {
        self.slots()
            .values()
            .filter_map(|s| s.cell.get().cloned())
            .collect()
    }

    /// Drops the registry's hold on `key` (requests in flight keep their version).
    pub fn remove(&self, key: &str) -> bool {
        self.slots().remove(key).is_some()
    }

    /// Unloads `name` (any spelling the store resolves) if loaded.
    pub fn unload(&self, name: &str) -> bool {
        match self.target(name) {
            Ok(t) => self.remove(&t.key),
            Err(_) => self.remove(name),
        }
    }

    /// Unloads models idle past their keep-alive; returns their names.
    pub fn reap_idle(&self) -> Vec<String> {
        let now = Instant::now();
        let mut slots = self.slots();
        let expired: Vec<String> = slots
            .iter()
            .filter(|(_, s)| s.cell.get().is_some_and(|m| m.idle_expired(now)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &expired {
            slots.remove(k);
        }
        expired
    }

    /// Hot reload: for every loaded model whose store copy changed (a new pull or create
    /// under the same name), loads the new version and switches new requests to it.
    pub async fn reload_changed(self: &Arc<Self>) -> Vec<String> {
        let mut switched = Vec::new();
        for old in self.loaded() {
            let this = self.clone();
            let name = old.name.clone();
            let Ok(Ok(target)) = tokio::task::spawn_blocking(move || this.target(&name)).await
            else {
                continue;
            };
            if target.version == old.version {
                continue;
            }
            let keep = old.activity().keep_alive;
            let key = target.key.clone();
            match self.load(target, keep).await {
                Ok(new) => {
                    let cell = OnceCell::new();
                    if cell.set(new).is_ok() {
                        self.slots().insert(key.clone(), Arc::new(Slot { cell }));
                        tracing::info!(model = %key, "switched to the new version");
                        switched.push(key);
                    }
                }
                Err(e) => {
                    tracing::warn!(model = %key, error = %e, "reload failed; keeping the loaded version")
                }
            }
        }
        switched
    }
}

/// Size and modification time of a path, as a version stamp.
fn path_version(path: &Path) -> String {
    let meta = std::fs::metadata(path).ok();
    let mtime = meta
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    format!("{}-{mtime}", loader::dir_or_file_size(path))
}
