//! Rollback by version: [`Store::rollback`] points a tag back to one of its kept versions, and
//! [`Store::list_versions`] lists every tag's current and kept versions (`pagoda list --all`).
//!
//! Owns [`Rollback`] and [`VersionSummary`]. Invariants: a rollback is an install like a pull
//! ([`Store`]'s `install`): the version it replaces is kept in turn (so a rollback of a
//! rollback goes back), the version it restores stops being a kept one, and a server that
//! serves the tag sees a new version of it (its manifest changed) and switches without a
//! restart, as after a pull. A rollback writes nothing unless the version it restores has all
//! its blobs.

use std::time::SystemTime;

use crate::error::{Result, StoreError};
use crate::manifest::{Format, Manifest};
use crate::name::ModelName;
use crate::store::{ResolvedModel, Store};
use crate::versions::{self, short_id as version_short, KeptVersion, Selection};

/// What a rollback did.
#[derive(Debug, Clone)]
pub struct Rollback {
    pub name: ModelName,
    /// The version that was current before (now kept), `sha256:<hex>`.
    pub from: String,
    /// The version that is current now.
    pub to: String,
    /// The model as it resolves now.
    pub model: ResolvedModel,
}

/// One line of `pagoda list --all`: a version of a tag.
#[derive(Debug, Clone)]
pub struct VersionSummary {
    /// `name:tag`.
    pub name: String,
    /// The version's id ([`Manifest::version`]), `sha256:<hex>`.
    pub id: String,
    pub size: u64,
    pub format: Format,
    /// Whether the tag points to it now.
    pub current: bool,
    /// When it became current.
    pub since: SystemTime,
    /// When another version replaced it (`None` for the current one).
    pub until: Option<SystemTime>,
}

impl Store {
    /// Points `name` back to its most recently replaced version, or with `to`, to the kept
    /// version whose digest starts with `to` (`sha256:` optional). The version it replaces is
    /// kept, so rolling back again returns to it.
    ///
    /// Errors: [`StoreError::NotFound`] (no such model), [`StoreError::NoPreviousVersion`],
    /// [`StoreError::UnknownVersion`], [`StoreError::AmbiguousVersion`],
    /// [`StoreError::VersionIsCurrent`], [`StoreError::MissingBlob`] (the kept version's files
    /// are gone: nothing is changed).
    pub fn rollback(&self, name: &str, to: Option<&str>) -> Result<Rollback> {
        let Some(stored) = self.stored_name(name)? else {
            ModelName::parse(name)?;
            return Err(StoreError::NotFound {
                name: name.trim().to_string(),
            });
        };
        let current = Manifest::read(&self.manifest_path(&stored), &stored)?;
        let from = current.version();
        let kept: Vec<KeptVersion> = self
            .versions()
            .list(&stored)?
            .into_iter()
            .filter(|v| v.id() != from)
            .collect();
        let target = match to {
            Some(prefix) if prefix_hex(prefix).is_empty() => {
                return Err(StoreError::UnknownVersion {
                    name: stored.to_string(),
                    digest: prefix.trim().to_string(),
                });
            }
            Some(prefix) if versions::id_hex(&from).starts_with(&prefix_hex(prefix)) => {
                return Err(StoreError::VersionIsCurrent {
                    name: stored.to_string(),
                    digest: prefix.trim().to_string(),
                });
            }
            _ if kept.is_empty() => {
                let why = if self.keep_versions() < 2 {
                    format!(
                        " (the store keeps only the current version: set {}=2 or more to keep previous ones)",
                        versions::KEEP_VERSIONS_ENV
                    )
                } else {
                    String::new()
                };
                return Err(StoreError::NoPreviousVersion {
                    name: stored.to_string(),
                    why,
                });
            }
            None => &kept[0],
            Some(prefix) => versions::select(&kept, prefix).map_err(|why| match why {
                Selection::Unknown => StoreError::UnknownVersion {
                    name: stored.to_string(),
                    digest: prefix.trim().to_string(),
                },
                Selection::Ambiguous(ids) => StoreError::AmbiguousVersion {
                    name: stored.to_string(),
                    digest: prefix.trim().to_string(),
                    matches: ids.iter().map(|id| version_short(id).to_string()).collect(),
                },
            })?,
        };
        // Stamped now: `created` is when a version became current.
        let restored = target.manifest.renamed(&stored);
        self.check_blobs(&stored, &restored)?;
        let to = restored.version();
        let model = self.install(&stored, restored)?;
        tracing::info!(
            "rolled {stored} back from {} to {}",
            version_short(&from),
            version_short(&to)
        );
        Ok(Rollback {
            name: stored,
            from,
            to,
            model,
        })
    }

    /// Every tag's current version and its kept versions, by name, the current one first and
    /// then the most recently replaced. A tag whose kept versions cannot be read is listed
    /// with its current version only (and a warning).
    pub fn list_versions(&self) -> Result<Vec<VersionSummary>> {
        let mut out = Vec::new();
        let versions = self.versions();
        for summary in self.list()? {
            let Ok(name) = ModelName::parse(&summary.name) else {
                continue;
            };
            let Ok(current) = Manifest::read(&self.manifest_path(&name), &name) else {
                continue;
            };
            let id = current.version();
            out.push(VersionSummary {
                name: summary.name.clone(),
                id: id.clone(),
                size: current.total_size,
                format: current.format,
                current: true,
                since: current.created_time(),
                until: None,
            });
            match versions.list(&name) {
                Ok(kept) => {
                    out.extend(
                        kept.into_iter()
                            .filter(|v| v.id() != id)
                            .map(|v| VersionSummary {
                                name: summary.name.clone(),
                                id: v.id(),
                                size: v.manifest.total_size,
                                format: v.manifest.format,
                                current: false,
                                since: v.manifest.created_time(),
                                until: Some(v.replaced_time()),
                            }),
                    )
                }
                Err(e) => tracing::warn!("cannot list the kept versions of {name}: {e}"),
            }
        }
        Ok(out)
    }
}

/// A digest prefix as hex digits, lowercase, without `sha256:`.
fn prefix_hex(prefix: &str) -> String {
    versions::id_hex(prefix.trim()).to_ascii_lowercase()
}
