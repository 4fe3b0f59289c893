//! The models the server holds: loaded on first use (or at start), shared by every request
//! through a [`Lease`], unloaded when idle past their keep-alive, evicted to stay inside the
//! memory budget, and swapped for a new version when the store's copy changes (hot reload).
//!
//! Memory: every model's KV pool is sized by [`crate::memory_plan`] — the models named at start
//! together ([`Registry::preload_all`]: their weights are loaded first, then the budget is
//! shared, or the set is refused), a model loaded on demand from the room the others leave
//! (idle on-demand models evicted first, least recently used). Models named at start are
//! *pinned*: never evicted, never unloaded by a keep-alive (only by an explicit unload, after
//! which `/ready` is 503 until they are loaded again).
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
use crate::memory_plan::{self, KvNeed};
use crate::names::{ModelNames, NamedModel};
use pagoda_engine::{EngineConfig, EngineHandle};
use pagoda_model::arch::LoraWeights;
use pagoda_runtime::loader::{self, LoadOptions, LoadedModel};
use pagoda_runtime::quant_choice::{self, FitBudget};
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
    /// Named at start: never evicted or unloaded by a keep-alive.
    pub pinned: bool,
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

    /// Weights plus KV pool (and a hybrid's state slots), the figure the memory budget counts
    /// (the pool is reserved whole but committed by the kernel only as blocks are written).
    pub fn memory_bytes(&self) -> u64 {
        let layout = self.engine.layout();
        let states = layout.states.map_or(0, |s| s.bytes() as u64);
        self.loaded.weights_bytes() + layout.bytes as u64 + states
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
        !self.pinned
            && self.in_flight() == 0
            && a.keep_alive
                .is_some_and(|k| now.saturating_duration_since(a.last_used) >= k)
    }
}

impl Drop for ServedModel {
    fn drop(&mut self) {
        // Joining the engine thread can take a step's time; never block an async worker.
        // Once it has stopped (its thread held the KV pool) and the weights are dropped, the
        // freed memory goes back to the OS (crate::heap).
        let engine = self.engine.clone();
        let name = self.name.clone();
        let weights = Arc::clone(&self.loaded.model);
        let stop = move || {
            engine.shutdown();
            // The handle holds the weights too: let go of it before waiting for the others.
            drop(engine);
            crate::heap::after_unload(weights);
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
                if model.pinned {
                    tracing::debug!(
                        model = %model.name,
                        "keep_alive of the request kept, not applied: a model named at start \
                         (-m) stays loaded until it is unloaded explicitly"
                    );
                }
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
    /// Keys of the models named at start (pinned), once loaded.
    pinned: Mutex<Vec<String>>,
    /// Held while a model's KV is planned and its engine started, so two loads do not plan
    /// against the same room.
    planning: tokio::sync::Mutex<()>,
    /// Models loaded since start (every version, on demand or at start).
    loads: AtomicUsize,
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
        // Unloaded models' memory goes back to the OS (crate::heap).
        crate::heap::configure_allocator();
        Registry {
            names,
            config,
            slots: Mutex::new(HashMap::new()),
            pinned: Mutex::new(Vec::new()),
            planning: tokio::sync::Mutex::new(()),
            loads: AtomicUsize::new(0),
            adapters: Adapters::default(),
        }
    }

    /// Models loaded since start (each version of each model once).
    pub fn loads(&self) -> usize {
        self.loads.load(Ordering::Acquire)
    }

    /// Whether every model named at start is loaded now.
    pub fn pinned_loaded(&self) -> bool {
        let pinned = self
            .pinned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let slots = self.slots();
        pinned
            .iter()
            .all(|k| slots.get(k).is_some_and(|s| s.cell.get().is_some()))
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

    /// Loads the generative models named at start, planned together (module docs): their
    /// weights first, then one KV plan for all of them (or the set is refused), then their
    /// engines. They are pinned. `Err` names the model (or the set) and why.
    pub async fn preload_all(self: &Arc<Self>, names: &[String]) -> Result<(), (String, ApiError)> {
        let mut weighed = Vec::with_capacity(names.len());
        for name in names {
            let this = self.clone();
            let owned = name.clone();
            let target = tokio::task::spawn_blocking(move || this.target(&owned))
                .await
                .map_err(|e| {
                    (
                        name.clone(),
                        ApiError::internal(format!("model lookup failed: {e}")),
                    )
                })?
                .map_err(|e| (name.clone(), e))?;
            let loaded = self
                .load_weights(&target)
                .await
                .map_err(|e| (name.clone(), e))?;
            weighed.push((target, loaded));
        }
        let needs: Vec<KvNeed> = weighed
            .iter()
            .map(|(t, l)| self.kv_need(&t.key, l))
            .collect();
        let plan: Vec<Option<u64>> = match (
            self.config.memory_budget,
            self.config.engine.kv_cache_memory,
        ) {
            // The operator sized every pool: each model gets that, if the set fits.
            (Some(budget), Some(kv)) => {
                let total: u64 = needs.iter().map(|n| n.weights + kv).sum();
                if total > budget {
                    return Err((
                        names.join(", "),
                        ApiError::unavailable(format!(
                            "the models named at start need {:.2} GiB with --kv-cache-memory {:.2} GiB each, over the memory budget of {:.2} GiB; lower --kv-cache-memory, name fewer models, or raise --memory-budget",
                            gib(total),
                            gib(kv),
                            gib(budget)
                        )),
                    ));
                }
                vec![Some(kv); needs.len()]
            }
            (Some(budget), None) => memory_plan::plan_together(budget, &needs)
                .map_err(|m| (names.join(", "), ApiError::unavailable(m)))?
                .into_iter()
                .map(Some)
                .collect(),
            (None, kv) => vec![kv; needs.len()],
        };
        let _planning = self.planning.lock().await;
        for ((target, loaded), kv) in weighed.into_iter().zip(plan) {
            let key = target.key.clone();
            let model = self
                .start(target, loaded, kv, None, true)
                .await
                .map_err(|e| (key.clone(), e))?;
            let cell = OnceCell::new();
            let _ = cell.set(model);
            self.slots().insert(key.clone(), Arc::new(Slot { cell }));
            self.pinned
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(key);
        }
        Ok(())
    }

    /// Reads a model's weights (and tokenizer, template) without starting its engine.
    async fn load_weights(&self, target: &Target) -> Result<LoadedModel, ApiError> {
        let mut options = self.config.load;
        if options.fit.is_none() {
            options.fit = self.fit_budget();
        }
        let resolved = target.resolved.clone();
        let key = target.key.clone();
        tokio::task::spawn_blocking(move || {
            loader::load_with(&resolved, &key, &options)
                .map_err(|e| ApiError::load_failed(&key).with_detail(e.to_string()))
        })
        .await
        .map_err(|e| ApiError::internal(format!("model load failed: {e}")))?
    }

    /// What the automatic quantization choice sizes a model against: the whole memory budget
    /// (each model on its own) and the KV this server's engine settings want.
    fn fit_budget(&self) -> Option<FitBudget> {
        let e = &self.config.engine;
        Some(FitBudget {
            budget: self.config.memory_budget?,
            max_model_len: e.max_model_len,
            max_num_seqs: e.max_num_seqs,
            block_size: e.block_size,
            kv_dtype: e.kv_dtype,
            prefix_caching: e.prefix_caching,
            kv_cache_memory: e.kv_cache_memory,
        })
    }

    /// What `loaded` asks of the memory budget under this server's engine settings (a model
    /// on a GPU keeps its KV there: nothing beyond its weights here).
    fn kv_need(&self, key: &str, loaded: &LoadedModel) -> KvNeed {
        let e = &self.config.engine;
        let (wanted, least) = if loaded.model.gpu_memory().ok().flatten().is_some() {
            (0, 0)
        } else {
            quant_choice::kv_bytes(
                loaded.model.config(),
                e.max_model_len,
                e.max_num_seqs,
                e.block_size,
                e.kv_dtype,
                e.prefix_caching,
            )
        };
        KvNeed {
            name: key.to_string(),
            weights: loaded.weights_bytes(),
            wanted,
            least,
        }
    }

    /// Loads `target` on demand: weights, then a KV pool from the room the loaded models
    /// leave (evicting idle unpinned ones, least recently used first), then its engine.
    async fn load(
        self: &Arc<Self>,
        target: Target,
        keep_alive: KeepAlive,
    ) -> Result<Arc<ServedModel>, ApiError> {
        let loaded = self.load_weights(&target).await?;
        let _planning = self.planning.lock().await;
        let kv = match self.config.engine.kv_cache_memory {
            Some(kv) => {
                let mut need = self.kv_need(&target.key, &loaded);
                (need.wanted, need.least) = (kv, kv);
                self.make_room(&need)?;
                Some(kv)
            }
            None => Some(self.make_room(&self.kv_need(&target.key, &loaded))?),
        };
        // A model named at start that was unloaded explicitly comes back pinned.
        let pinned = self
            .pinned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&target.key);
        let keep_alive = if pinned { None } else { Some(keep_alive) };
        self.start(target, loaded, kv, keep_alive, pinned).await
    }

    /// Starts `loaded`'s engine with a KV pool of `kv` bytes (`None`: the engine's own plan).
    async fn start(
        self: &Arc<Self>,
        target: Target,
        loaded: LoadedModel,
        kv: Option<u64>,
        keep_alive: Option<KeepAlive>,
        pinned: bool,
    ) -> Result<Arc<ServedModel>, ApiError> {
        let mut engine_config = self.config.engine.clone();
        if self.config.memory_budget.is_some() && loaded.model.gpu_memory().ok().flatten().is_none()
        {
            engine_config.kv_cache_memory = kv;
        }
        let key = target.key.clone();
        let started = Instant::now();
        let model = tokio::task::spawn_blocking(move || -> Result<ServedModel, ApiError> {
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
                pinned,
                activity: Mutex::new(Activity {
                    last_used: Instant::now(),
                    keep_alive: keep_alive.flatten(),
                }),
                in_flight: AtomicUsize::new(0),
            })
        })
        .await
        .map_err(|e| ApiError::internal(format!("model load failed: {e}")))??;
        self.loads.fetch_add(1, Ordering::AcqRel);
        tracing::info!(
            model = %key,
            version = %model.version,
            secs = started.elapsed().as_secs_f64(),
            kv_blocks = model.engine.layout().n_blocks,
            kv_mib = model.engine.layout().bytes >> 20,
            pinned,
            "model ready"
        );
        Ok(Arc::new(model))
    }

    /// Evicts idle unpinned models, least recently used first, until `need`'s least fits the
    /// budget; returns its KV bytes. 503 when pinned or busy models leave no room.
    fn make_room(&self, need: &KvNeed) -> Result<u64, ApiError> {
        let Some(budget) = self.config.memory_budget else {
            return Ok(need.wanted);
        };
        let mut loaded = self.loaded();
        loaded.sort_by_key(|m| m.activity().last_used);
        let mut used: u64 = loaded.iter().map(|m| m.memory_bytes()).sum();
        for m in &loaded {
            if memory_plan::plan_one(budget, used, need).is_some() {
                break;
            }
            if m.in_flight() == 0 && !m.pinned {
                tracing::info!(model = %m.name, "evicting an idle model to make room");
                self.remove(&m.name);
                used = used.saturating_sub(m.memory_bytes());
            }
        }
        memory_plan::plan_one(budget, used, need).ok_or_else(|| {
            ApiError::unavailable(format!(
                "not enough memory to load `{}`: it needs {:.2} GiB of weights and at least {:.2} GiB of KV cache, and the loaded models hold {:.2} GiB of the {:.2} GiB budget; retry when on-demand models are idle, lower --max-model-len, or raise --memory-budget",
                need.name,
                gib(need.weights),
                gib(need.least),
                gib(used),
                gib(budget)
            ))
        })
    }

    /// The loaded models (not those still loading).
    pub fn loaded(&self) -> Vec<Arc<ServedModel>> {
        self.slots()
            .values()
            .filter_map(|s| s.cell.get().cloned())
            .collect()
    }

    /// Drops the registry's hold on `key` (requests in flight keep their version). Only an
    /// explicit unload (Ollama's empty request with `keep_alive: 0`, a delete) removes a
    /// pinned model — `/ready` then says so until it is loaded again.
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
            let reloaded = match self.load_weights(&target).await {
                // The new version takes the old one's place in the plan.
                Ok(loaded) => {
                    let kv = Some(
                        old.engine.layout().bytes as u64
                            + old.engine.layout().states.map_or(0, |s| s.bytes() as u64),
                    );
                    self.start(target, loaded, kv, Some(keep), old.pinned).await
                }
                Err(e) => Err(e),
            };
            match reloaded {
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

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
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
