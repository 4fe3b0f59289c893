//! Which models a client may name, and what each name loads: [`ModelNames`].
//!
//! Over HTTP a `model` is a name in the store (`smollm2:135m`), or a path the operator
//! allowed: one named at start (`pagoda serve -m ./my.gguf`, addressed by that spelling), or
//! any model under a directory given with `--allow-model-dir`. Anything else — other paths,
//! `..` tricks, URLs, `hf://` or `pip://` sources — is "not found", with the same body whether
//! or not something exists at that path, so a client learns nothing about the filesystem.
//!
//! Invariants:
//! - paths are canonicalised before they are compared or used as keys, so one file is one
//!   model (one load, one KV pool, one `model_name` label) however it is spelled;
//! - the key of a model (its registry slot and metrics label) is a store name, an operator's
//!   spelling of a pinned path, or the canonical path of a file under an allowed directory —
//!   never text a client chose freely;
//! - nothing here downloads: unknown names are 404, never a pull;
//! - only regular files and directories are models: a FIFO or device under an allowed
//!   directory is the same 404 as a missing file, answered without opening it.

use crate::error::ApiError;
use pagoda_store::{ModelName, ResolvedModel, Store, StoreError};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A name resolved to what to load.
pub struct NamedModel {
    /// The registry key and the name responses and metrics use.
    pub key: String,
    pub resolved: ResolvedModel,
}

/// The naming policy and the store behind it; see the module docs.
pub struct ModelNames {
    store: Arc<Store>,
    /// Paths named at start: (the operator's spelling, its canonical form).
    pinned: Vec<(String, PathBuf)>,
    /// Canonical directories under which clients may name model paths.
    allowed_dirs: Vec<PathBuf>,
}

impl ModelNames {
    /// `startup_models`: what the operator named at start (store names or paths; paths that
    /// exist are pinned). `allowed_dirs`: `--allow-model-dir`; an entry that does not exist
    /// is an error, so a typo never silently allows nothing.
    pub fn new(
        store: Arc<Store>,
        startup_models: &[String],
        allowed_dirs: &[PathBuf],
    ) -> Result<Self, String> {
        let pinned = startup_models
            .iter()
            .filter_map(|m| std::fs::canonicalize(m).ok().map(|c| (m.clone(), c)))
            .collect();
        let allowed_dirs = allowed_dirs
            .iter()
            .map(|d| {
                std::fs::canonicalize(d)
                    .map_err(|e| format!("--allow-model-dir {}: {e}", d.display()))
                    .and_then(|c| {
                        if c.is_dir() {
                            Ok(c)
                        } else {
                            Err(format!(
                                "--allow-model-dir {}: not a directory",
                                d.display()
                            ))
                        }
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ModelNames {
            store,
            pinned,
            allowed_dirs,
        })
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// What `name` loads, or 404 (`model_not_found`, the same body for every unknown name).
    /// Blocking: reads the store and the filesystem.
    pub fn resolve(&self, name: &str) -> Result<NamedModel, ApiError> {
        let name = name.trim();
        if let Some((spelling, canonical)) = self.pinned.iter().find(|(s, _)| s == name) {
            return self.direct(spelling.clone(), canonical.clone(), name);
        }
        if store_name(name).is_some() {
            match self.store.resolve(name) {
                Ok(Some(resolved)) => {
                    let key = resolved
                        .name
                        .as_ref()
                        .map_or_else(|| name.to_string(), ToString::to_string);
                    return Ok(NamedModel { key, resolved });
                }
                Ok(None) | Err(StoreError::InvalidName { .. }) => {}
                Err(e) => {
                    return Err(ApiError::internal(format!(
                        "reading the store for `{name}`: {e}"
                    )))
                }
            }
        }
        let Ok(canonical) = std::fs::canonicalize(name) else {
            return Err(ApiError::model_not_found(name));
        };
        if let Some((spelling, _)) = self.pinned.iter().find(|(_, c)| *c == canonical) {
            return self.direct(spelling.clone(), canonical, name);
        }
        if self.allowed_dirs.iter().any(|d| canonical.starts_with(d)) {
            // A FIFO, socket or device is "not found" like a missing file: never opened
            // (a FIFO would block the open), and no other answer tells them apart.
            if !is_file_or_dir(&canonical) {
                return Err(ApiError::model_not_found(name));
            }
            let key = canonical.display().to_string();
            return self.direct(key, canonical, name);
        }
        Err(ApiError::model_not_found(name))
    }

    /// Whether a path a client sent (a LoRA adapter folder) is under an allowed directory;
    /// its canonical form when it is. The same refusal whether or not the path exists.
    pub fn allowed_path(&self, path: &Path, param: &str) -> Result<PathBuf, ApiError> {
        let refuse = || {
            ApiError::invalid_param(
                param,
                format!(
                    "`{param}` must be under a directory the server allows (pagoda serve --allow-model-dir DIR){}",
                    if self.allowed_dirs.is_empty() {
                        "; this server allows none"
                    } else {
                        ""
                    }
                ),
            )
            .with_code("path_not_allowed")
        };
        let canonical = std::fs::canonicalize(path).map_err(|_| refuse())?;
        if self.allowed_dirs.iter().any(|d| canonical.starts_with(d)) {
            Ok(canonical)
        } else {
            Err(refuse())
        }
    }

    fn direct(&self, key: String, path: PathBuf, asked: &str) -> Result<NamedModel, ApiError> {
        let format = pagoda_store::fetch::local::detect_format(&path).map_err(|e| {
            tracing::warn!(model = %asked, error = %e, "an allowed model path cannot be used");
            ApiError::load_failed(asked)
        })?;
        Ok(NamedModel {
            key,
            resolved: ResolvedModel {
                name: None,
                path,
                format,
                manifest: None,
            },
        })
    }
}

/// Whether `path` (canonical, so no link left) is a regular file or a directory.
fn is_file_or_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() || m.is_dir())
}

/// `name` as a store name, when it is one (`smollm2:135m`, `library/x:tag`).
fn store_name(name: &str) -> Option<ModelName> {
    if pagoda_store::source::looks_like_path(name) {
        return None;
    }
    ModelName::parse(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path, startup: &[String], allowed: &[PathBuf]) -> ModelNames {
        let store = Arc::new(Store::open(Some(dir.join("store"))).expect("store"));
        ModelNames::new(store, startup, allowed).expect("policy")
    }

    fn tiny() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama")
    }

    fn status(r: Result<NamedModel, ApiError>) -> u16 {
        match r {
            Ok(_) => 200,
            Err(e) => e.status.as_u16(),
        }
    }

    #[test]
    fn paths_are_not_found_unless_the_operator_allowed_them() {
        let dir = tempfile::tempdir().expect("tmp");
        let n = names(dir.path(), &[], &[]);
        let tiny = tiny().display().to_string();
        for asked in [
            "/etc/passwd",
            "/root",
            "../../../../etc/passwd",
            tiny.as_str(),
            "https://example.com/x.gguf",
            "hf://a/b/c.gguf",
            "file:///etc/passwd",
        ] {
            let e = n.resolve(asked).err().expect("refused");
            assert_eq!(e.status, 404, "{asked}");
            // The same message shape whether or not the path exists: only the name differs.
            assert_eq!(
                e.message.replace(asked, "X"),
                ApiError::model_not_found("X").message,
                "{asked}"
            );
        }
    }

    #[test]
    fn a_pinned_path_answers_to_every_spelling_under_one_key() {
        let dir = tempfile::tempdir().expect("tmp");
        let spelling = tiny().display().to_string();
        let n = names(dir.path(), std::slice::from_ref(&spelling), &[]);
        let a = n.resolve(&spelling).expect("pinned spelling");
        assert_eq!(a.key, spelling);
        let canonical = std::fs::canonicalize(tiny()).expect("exists");
        let other = format!("{}/../tiny-llama", canonical.display());
        let b = n
            .resolve(&other)
            .expect("another spelling of the pinned file");
        assert_eq!(b.key, spelling, "one file, one key");
        let doubled = format!("/{}", canonical.display());
        assert_eq!(n.resolve(&doubled).expect("//path").key, spelling);
    }

    #[test]
    fn allowed_directories_admit_only_what_is_under_them() {
        let dir = tempfile::tempdir().expect("tmp");
        let golden = tiny().parent().expect("golden").to_path_buf();
        let n = names(dir.path(), &[], std::slice::from_ref(&golden));
        let canonical = std::fs::canonicalize(tiny()).expect("exists");
        let inside = n
            .resolve(&tiny().display().to_string())
            .expect("under the dir");
        assert_eq!(inside.key, canonical.display().to_string());
        let escaped = format!("{}/../../../etc/passwd", golden.display());
        assert_eq!(status(n.resolve(&escaped)), 404);
        assert_eq!(status(n.resolve("/etc/hostname")), 404);
        assert!(n.allowed_path(&tiny(), "lora_path").is_ok());
        let e = n
            .allowed_path(Path::new("/etc"), "lora_path")
            .expect_err("outside");
        let missing = n
            .allowed_path(Path::new("/nonexistent/x"), "lora_path")
            .expect_err("missing");
        assert_eq!(e, missing, "no existence oracle");
    }

    #[test]
    fn a_missing_allowed_directory_is_an_error_at_start() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Arc::new(Store::open(Some(dir.path().join("store"))).expect("store"));
        let err = ModelNames::new(store, &[], &[dir.path().join("nope")])
            .err()
            .expect("refused");
        assert!(err.contains("--allow-model-dir"), "{err}");
    }
}
