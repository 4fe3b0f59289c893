//! The embedding models the server holds (BERT sentence encoders such as all-MiniLM-L6-v2):
//! loaded on first use, one load at a time per model, shared by every request.
//!
//! Invariant: an embedding model is never started as a generative engine and vice versa —
//! the loader's [`ModelKind`](pagoda_runtime::loader::ModelKind) decides which registry takes a name.

use crate::error::ApiError;
use crate::names::ModelNames;
use pagoda_model::embedding::EmbeddingModel;
use pagoda_runtime::loader::{self, ModelKind};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};
use tokio::sync::OnceCell;

/// One loaded embedding model.
pub struct ServedEmbedder {
    /// Its key (see [`ModelNames`]): `name:tag`, or an allowed path.
    pub name: String,
    pub model: EmbeddingModel,
    pub loaded_at: SystemTime,
}

/// The loaded embedding models.
pub struct Embedders {
    names: Arc<ModelNames>,
    slots: Mutex<HashMap<String, Arc<OnceCell<Arc<ServedEmbedder>>>>>,
}

impl Embedders {
    pub fn new(names: Arc<ModelNames>) -> Self {
        Embedders {
            names,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The embedding model `name`, loading it if needed; 404 if unknown, 400 if it is a
    /// generative model.
    pub async fn acquire(&self, name: &str) -> Result<Arc<ServedEmbedder>, ApiError> {
        let names = self.names.clone();
        let owned = name.to_string();
        let (key, path) = tokio::task::spawn_blocking(move || {
            names.resolve(&owned).map(|n| (n.key, n.resolved.path))
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
        if loader::kind_of(&path) != ModelKind::Embedding {
            return Err(ApiError::invalid_param(
                "model",
                format!("`{name}` is a text generation model, not an embedding model; use an embedding model such as all-minilm"),
            ));
        }
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.clone())
            .or_default()
            .clone();
        let served = slot
            .get_or_try_init(|| async {
                let started = Instant::now();
                let model = tokio::task::spawn_blocking(move || EmbeddingModel::load(&path))
                    .await
                    .map_err(|e| ApiError::internal(e.to_string()))?
                    .map_err(|e| ApiError::load_failed(&key).with_detail(e.to_string()))?;
                tracing::info!(model = %key, secs = started.elapsed().as_secs_f64(), "embedding model ready");
                Ok::<_, ApiError>(Arc::new(ServedEmbedder {
                    name: key.clone(),
                    model,
                    loaded_at: SystemTime::now(),
                }))
            })
            .await?
            .clone();
        Ok(served)
    }

    /// The loaded embedding models.
    pub fn loaded(&self) -> Vec<Arc<ServedEmbedder>> {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(|s| s.get().cloned())
            .collect()
    }
}
