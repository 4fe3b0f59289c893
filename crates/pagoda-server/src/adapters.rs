//! The LoRA adapters the server holds, by name: loaded at start (`pagoda serve --lora
//! NAME=PATH`) or at run time (`POST /v1/load_lora_adapter`), unloaded by
//! `POST /v1/unload_lora_adapter`, and chosen per request by the model name: the adapter's
//! name alone (vLLM's style) or `base:adapter`.
//!
//! Invariants:
//! - an adapter is listed only after it was opened and shape-checked against its base model;
//! - unloading only forgets the name: requests in flight hold their own
//!   [`LoraWeights`] handle (an `Arc`), so they finish under the adapter they started with;
//! - names are unique; loading a name that is taken is refused (unload it first).

use crate::error::ApiError;
use pagoda_model::arch::{LoraWeights, Model};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

/// One loaded adapter.
#[derive(Debug, Clone)]
pub struct AdapterEntry {
    pub name: String,
    pub path: PathBuf,
    /// The registry key of the base model it was checked against.
    pub base: String,
    pub weights: LoraWeights,
    pub loaded_at: SystemTime,
}

/// The loaded adapters; see the module docs.
#[derive(Debug, Default)]
pub struct Adapters {
    entries: Mutex<BTreeMap<String, AdapterEntry>>,
}

/// Whether `name` can name an adapter: not empty, no `:` or `/` (they separate a base from
/// its adapter), no control characters.
pub fn check_name(name: &str) -> Result<(), ApiError> {
    if name.trim().is_empty()
        || name.contains(':')
        || name.contains('/')
        || name.chars().any(char::is_control)
    {
        return Err(ApiError::invalid_param(
            "lora_name",
            format!("invalid adapter name {name:?}: use letters, digits, `-`, `_` or `.` (no `:` or `/`)"),
        ));
    }
    Ok(())
}

impl Adapters {
    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, AdapterEntry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens the PEFT folder `path` for `model` (the base registered as `base`) under `name`.
    /// Blocking (reads the files): call from a blocking task. 400 for a name that is taken,
    /// a folder that is not a usable adapter, or an adapter that does not fit the base.
    pub fn load(
        &self,
        name: &str,
        path: &Path,
        base: &str,
        model: &Model,
    ) -> Result<AdapterEntry, ApiError> {
        check_name(name)?;
        if self.entries().contains_key(name) {
            return Err(ApiError::invalid_param(
                "lora_name",
                format!("a LoRA adapter named `{name}` is already loaded; unload it first (POST /v1/unload_lora_adapter)"),
            ));
        }
        let weights = LoraWeights::open(name, path, model).map_err(|e| {
            ApiError::invalid_param(
                "lora_path",
                format!("cannot load LoRA adapter `{name}` for base model `{base}`: {e}"),
            )
        })?;
        let entry = AdapterEntry {
            name: name.to_string(),
            path: path.to_path_buf(),
            base: base.to_string(),
            weights,
            loaded_at: SystemTime::now(),
        };
        let mut entries = self.entries();
        if entries.contains_key(name) {
            return Err(ApiError::invalid_param(
                "lora_name",
                format!("a LoRA adapter named `{name}` is already loaded"),
            ));
        }
        entries.insert(name.to_string(), entry.clone());
        tracing::info!(adapter = %name, base = %base, path = %path.display(), rank = entry.weights.rank(), "LoRA adapter loaded");
        Ok(entry)
    }

    /// Forgets `name`; 404 when no such adapter is loaded.
    pub fn unload(&self, name: &str) -> Result<AdapterEntry, ApiError> {
        let removed = self.entries().remove(name);
        match removed {
            Some(e) => {
                tracing::info!(adapter = %name, "LoRA adapter unloaded");
                Ok(e)
            }
            None => Err(self.not_found(name)),
        }
    }

    pub fn get(&self, name: &str) -> Option<AdapterEntry> {
        self.entries().get(name).cloned()
    }

    pub fn list(&self) -> Vec<AdapterEntry> {
        self.entries().values().cloned().collect()
    }

    /// The loaded adapter names, for messages (`none` when there are none).
    pub fn names_for_message(&self) -> String {
        let names: Vec<String> = self.entries().keys().cloned().collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }

    /// 404 model_not_found for an adapter name, listing the loaded ones.
    pub fn not_found(&self, name: &str) -> ApiError {
        ApiError::model_not_found_message(format!(
                "LoRA adapter `{name}` is not loaded (loaded adapters: {}); load it with POST /v1/load_lora_adapter or `pagoda serve --lora {name}=PATH`",
                self.names_for_message()
            ),
        )
    }

    /// What a request's model name asks for: `Some((base, adapter))` when it is an adapter's
    /// name (its own base) or `base:adapter` with a loaded adapter; `None` otherwise.
    pub fn resolve(&self, requested: &str) -> Option<(String, AdapterEntry)> {
        let entries = self.entries();
        if let Some(e) = entries.get(requested) {
            return Some((e.base.clone(), e.clone()));
        }
        let (base, adapter) = requested.rsplit_once(':')?;
        let e = entries.get(adapter)?;
        Some((base.to_string(), e.clone()))
    }

    /// `entry`'s weights for `model` (the base the request got): the loaded ones when they fit
    /// (the usual case), else reopened for it (a base reloaded with another shape, or a
    /// `base:adapter` naming another base). 400 when the adapter does not fit.
    pub fn weights_for(
        entry: &AdapterEntry,
        base: &str,
        model: &Model,
    ) -> Result<LoraWeights, ApiError> {
        if entry.weights.fits(model) {
            return Ok(entry.weights.clone());
        }
        LoraWeights::open(&entry.name, &entry.path, model).map_err(|e| {
            ApiError::invalid_param(
                "model",
                format!(
                    "LoRA adapter `{}` does not fit base model `{base}`: {e}",
                    entry.name
                ),
            )
        })
    }
}
