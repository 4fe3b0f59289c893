//! The store's validation hook: [`ModelValidator`], asked whether a model's files load before
//! a manifest lists them ([`Store::with_validator`](crate::Store::with_validator)).
//!
//! The store knows nothing of model contents (the crate's invariant), so the check is
//! handed in by whoever opens the store: the CLI and the server install one that opens the
//! files as loading does (`pagoda_model::validate_model`). Without one the store checks only
//! what it always has (the GGUF magic, `config.json`, sha256).
//!
//! Invariant: a validator only reads the path it is given, which holds the files exactly as
//! they will be served (a GGUF blob, or a Hugging Face folder laid out under the files' real
//! names); its `Err` is the reason, which the store puts in
//! [`StoreError::Unloadable`](crate::StoreError::Unloadable).

use std::path::Path;

/// Says whether the model at a path can be loaded.
pub trait ModelValidator: Send + Sync {
    /// `path` is a GGUF file or a Hugging Face folder; `Err` says why it cannot be loaded
    /// (naming the file and the key or tensor at fault, where the reader knows them).
    fn validate(&self, path: &Path) -> Result<(), String>;
}

impl<F> ModelValidator for F
where
    F: Fn(&Path) -> Result<(), String> + Send + Sync,
{
    fn validate(&self, path: &Path) -> Result<(), String> {
        self(path)
    }
}
