//! Kept versions of a tag: `versions/<name>/<tag>/<hex>.json`, the manifests a tag pointed to
//! before it was replaced (a re-pull, `create` or `cp` over it, a rollback), so that
//! `pagoda rollback` has something to go back to.
//!
//! Owns [`KeptVersion`], the on-disk bookkeeping ([`Versions`]), the keep setting
//! ([`keep_versions_from_env`], `PAGODA_KEEP_VERSIONS`) and picking a version by digest prefix
//! ([`select`]). A version is identified by [`Manifest::version`] (the weights' digest, or with
//! a Modelfile layer the digest of both), so its short form is the ID `pagoda list` shows.
//!
//! Invariants: a tag's current manifest is never also one of its kept versions once an
//! install finishes ([`Versions::forget`]); a kept version is written before the manifest that
//! replaces it, so a crash between the two loses nothing; at most `keep - 1` versions are kept
//! per tag (the current one counts as the first), the least recently replaced pruned first;
//! the store's garbage collection counts every blob a kept version names as used, so a kept
//! version can always be rolled back to. The files of a tag are only the `.json` files directly
//! in its folder (a folder there belongs to a longer name, `a/b:c` under `a:b`'s).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::manifest::{write_atomic, Manifest};
use crate::name::ModelName;

/// The environment variable that sets how many versions of a tag are kept.
pub const KEEP_VERSIONS_ENV: &str = "PAGODA_KEEP_VERSIONS";

/// Versions kept per tag by default: the current one and one previous.
pub const DEFAULT_KEEP_VERSIONS: usize = 2;

/// How many versions of a tag to keep (the current one included): `PAGODA_KEEP_VERSIONS`,
/// else [`DEFAULT_KEEP_VERSIONS`]. `1` keeps only the current one (nothing to roll back to).
pub fn keep_versions_from_env() -> Result<usize> {
    match std::env::var(KEEP_VERSIONS_ENV) {
        Ok(v) if !v.trim().is_empty() => parse_keep_versions(&v),
        _ => Ok(DEFAULT_KEEP_VERSIONS),
    }
}

/// Parses a keep setting: a whole number of at least 1.
pub fn parse_keep_versions(text: &str) -> Result<usize> {
    match text.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(StoreError::InvalidSetting {
            setting: KEEP_VERSIONS_ENV,
            value: text.to_string(),
            reason: "it must be a whole number of at least 1 (1 keeps only the current version, 2 the current and one previous)".into(),
        }),
    }
}

/// A manifest a tag pointed to before, with when it stopped being current.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeptVersion {
    /// Seconds since the Unix epoch when another version replaced it (it was current from
    /// `manifest.created` until then).
    pub replaced: u64,
    pub manifest: Manifest,
}

impl KeptVersion {
    /// Its identity ([`Manifest::version`]), `sha256:<hex>`.
    pub fn id(&self) -> String {
        self.manifest.version()
    }

    /// When it stopped being current.
    pub fn replaced_time(&self) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::from_secs(self.replaced)
    }
}

/// The hex digits of a version id (`sha256:<hex>` → `<hex>`).
pub fn id_hex(id: &str) -> &str {
    id.strip_prefix("sha256:").unwrap_or(id)
}

/// The short form of a version id: its first 12 hex digits (the ID `pagoda list` shows).
pub fn short_id(id: &str) -> &str {
    let hex = id_hex(id);
    hex.get(..12).unwrap_or(hex)
}

/// The kept versions under a store's `versions/` folder.
#[derive(Debug, Clone)]
pub struct Versions {
    root: PathBuf,
}

impl Versions {
    /// The bookkeeping under `root` (the store's `versions/`).
    pub fn new(root: PathBuf) -> Versions {
        Versions { root }
    }

    fn dir_of(&self, name: &ModelName) -> PathBuf {
        self.root.join(name.model_dir_rel_path())
    }

    fn file_of(&self, name: &ModelName, id: &str) -> PathBuf {
        self.dir_of(name).join(format!("{}.json", id_hex(id)))
    }

    /// The version files of `name` (only `.json` files directly in its folder).
    fn files(&self, name: &ModelName) -> Result<Vec<PathBuf>> {
        let dir = self.dir_of(name);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StoreError::io("list", &dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(StoreError::io("list", &dir))?;
            let file_name = entry.file_name().to_string_lossy().into_owned();
            let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
            if is_file && !file_name.starts_with('.') && file_name.ends_with(".json") {
                out.push(entry.path());
            }
        }
        Ok(out)
    }

    fn read(path: &Path, name: &ModelName) -> Result<KeptVersion> {
        let text = fs::read_to_string(path).map_err(StoreError::io("read", path))?;
        serde_json::from_str(&text).map_err(|e| StoreError::CorruptManifest {
            name: name.to_string(),
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// The kept versions of `name`, most recently replaced first. An unreadable one is an
    /// error (it may name blobs, so nothing may be decided without it).
    pub fn list(&self, name: &ModelName) -> Result<Vec<KeptVersion>> {
        let mut out = Vec::new();
        for path in self.files(name)? {
            out.push(Self::read(&path, name)?);
        }
        out.sort_by(|a, b| {
            b.replaced
                .cmp(&a.replaced)
                .then_with(|| b.manifest.created.cmp(&a.manifest.created))
        });
        Ok(out)
    }

    /// Keeps `old` as a version of `name`, replaced `now` (a version kept before is updated).
    pub fn keep(&self, name: &ModelName, old: &Manifest, now: u64) -> Result<()> {
        let kept = KeptVersion {
            replaced: now,
            manifest: old.clone(),
        };
        let path = self.file_of(name, &old.version());
        let json = serde_json::to_string_pretty(&kept).map_err(|e| StoreError::Io {
            op: "serialize a kept version for",
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        write_atomic(&path, json.as_bytes(), ".version-")
    }

    /// Drops the kept version `id` of `name` (it became current again); `None` if there was
    /// none.
    pub fn forget(&self, name: &ModelName, id: &str) -> Result<Option<KeptVersion>> {
        let path = self.file_of(name, id);
        if !path.is_file() {
            return Ok(None);
        }
        let kept = Self::read(&path, name).ok();
        remove_file(&path)?;
        self.prune_dirs(name);
        Ok(kept)
    }

    /// Keeps the `previous` most recently replaced versions of `name` and deletes the rest;
    /// returns the manifests deleted (their blobs are the caller's to collect).
    pub fn prune(&self, name: &ModelName, previous: usize) -> Result<Vec<Manifest>> {
        let all = self.list(name)?;
        let mut dropped = Vec::new();
        for v in all.into_iter().skip(previous) {
            remove_file(&self.file_of(name, &v.id()))?;
            dropped.push(v.manifest);
        }
        self.prune_dirs(name);
        Ok(dropped)
    }

    /// Deletes every kept version of `name`; returns their manifests. Unreadable version files
    /// are deleted too (their manifests are then unknown, so their blobs stay).
    pub fn remove_all(&self, name: &ModelName) -> Result<Vec<Manifest>> {
        let mut dropped = Vec::new();
        for path in self.files(name)? {
            match Self::read(&path, name) {
                Ok(v) => dropped.push(v.manifest),
                Err(e) => tracing::warn!("{e}; removing it without collecting its blobs"),
            }
            remove_file(&path)?;
        }
        self.prune_dirs(name);
        Ok(dropped)
    }

    /// Every kept manifest of every tag (for garbage collection). An unreadable one is an
    /// error: the caller must then keep every blob.
    pub fn all_manifests(&self) -> Result<Vec<Manifest>> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(StoreError::io("list", &dir)(e)),
            };
            for entry in entries {
                let entry = entry.map_err(StoreError::io("list", &dir))?;
                let path = entry.path();
                let file_name = entry.file_name().to_string_lossy().into_owned();
                if file_name.starts_with('.') {
                    continue;
                }
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(path);
                } else if file_name.ends_with(".json") {
                    let text = fs::read_to_string(&path).map_err(StoreError::io("read", &path))?;
                    let kept: KeptVersion =
                        serde_json::from_str(&text).map_err(|e| StoreError::CorruptManifest {
                            name: path.display().to_string(),
                            path: path.clone(),
                            message: e.to_string(),
                        })?;
                    out.push(kept.manifest);
                }
            }
        }
        Ok(out)
    }

    /// Removes `name`'s folder and its empty parents, if empty.
    fn prune_dirs(&self, name: &ModelName) {
        let mut dir = Some(self.dir_of(name));
        while let Some(d) = dir {
            if d == self.root || !d.starts_with(&self.root) || fs::remove_dir(&d).is_err() {
                break;
            }
            dir = d.parent().map(Path::to_path_buf);
        }
    }
}

/// Why a digest prefix picks no single kept version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// No kept version's id starts with it.
    Unknown,
    /// Several do (their ids).
    Ambiguous(Vec<String>),
}

/// The kept version whose id starts with `prefix` (hex digits, `sha256:` optional,
/// case-insensitive). An empty prefix matches nothing.
pub fn select<'a>(
    versions: &'a [KeptVersion],
    prefix: &str,
) -> std::result::Result<&'a KeptVersion, Selection> {
    let wanted = id_hex(prefix.trim()).to_ascii_lowercase();
    if wanted.is_empty() {
        return Err(Selection::Unknown);
    }
    let matches: Vec<&KeptVersion> = versions
        .iter()
        .filter(|v| id_hex(&v.id()).starts_with(&wanted))
        .collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(Selection::Unknown),
        many => Err(Selection::Ambiguous(many.iter().map(|v| v.id()).collect())),
    }
}

/// Seconds since the Unix epoch now.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn remove_file(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("delete", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::Digest;
    use crate::manifest::{FileRole, Format, ManifestFile};

    fn manifest(name: &ModelName, seed: u8, created: u64) -> Manifest {
        let mut m = Manifest::new(
            name,
            "./x.gguf".into(),
            Format::Gguf,
            vec![ManifestFile {
                path: "x.gguf".into(),
                digest: Digest::parse(&format!("{seed:02x}").repeat(32)).expect("digest"),
                size: 10,
                role: FileRole::Model,
            }],
        );
        m.created = created;
        m
    }

    #[test]
    fn the_keep_setting_is_checked() {
        assert_eq!(parse_keep_versions("1").ok(), Some(1));
        assert_eq!(parse_keep_versions(" 3 ").ok(), Some(3));
        for bad in ["0", "-1", "two", ""] {
            let e = parse_keep_versions(bad).expect_err(bad).to_string();
            assert!(
                e.contains(KEEP_VERSIONS_ENV) && e.contains("at least 1"),
                "{e}"
            );
        }
    }

    #[test]
    fn keep_list_forget_and_prune_oldest_first() {
        let dir = tempfile::tempdir().expect("dir");
        let v = Versions::new(dir.path().join("versions"));
        let name = ModelName::parse("a:b").expect("name");
        // A longer name's versions live in a folder under a:b's: never a:b's.
        let longer = ModelName::parse("a/b:c").expect("name");
        v.keep(&longer, &manifest(&longer, 9, 1), 1).expect("keep");
        for (seed, when) in [(1u8, 10u64), (2, 30), (3, 20)] {
            v.keep(&name, &manifest(&name, seed, when - 5), when)
                .expect("keep");
        }
        let ids: Vec<String> = v
            .list(&name)
            .expect("list")
            .iter()
            .map(|k| k.id())
            .collect();
        assert_eq!(ids.len(), 3);
        assert!(ids[0].starts_with("sha256:0202"), "{ids:?}");
        assert!(ids[1].starts_with("sha256:0303"), "{ids:?}");
        let dropped = v.prune(&name, 1).expect("prune");
        assert_eq!(dropped.len(), 2);
        let left = v.list(&name).expect("list");
        assert_eq!(left.len(), 1);
        assert!(left[0].id().starts_with("sha256:0202"));
        assert!(v.forget(&name, &left[0].id()).expect("forget").is_some());
        assert!(v.list(&name).expect("list").is_empty());
        assert_eq!(v.list(&longer).expect("list").len(), 1, "a/b:c untouched");
        assert_eq!(v.all_manifests().expect("all").len(), 1);
        assert_eq!(v.remove_all(&longer).expect("remove").len(), 1);
        assert!(v.all_manifests().expect("all").is_empty());
    }

    #[test]
    fn a_digest_prefix_picks_one_version_or_says_why_not() {
        let name = ModelName::parse("m").expect("name");
        let kept: Vec<KeptVersion> = [0xabu8, 0xac, 0x12]
            .into_iter()
            .map(|seed| KeptVersion {
                replaced: 1,
                manifest: manifest(&name, seed, 1),
            })
            .collect();
        let id = |i: usize| kept[i].id();
        assert_eq!(select(&kept, "12").map(KeptVersion::id), Ok(id(2)));
        assert_eq!(select(&kept, "sha256:ABAB").map(KeptVersion::id), Ok(id(0)));
        assert_eq!(
            select(&kept, "a").map(KeptVersion::id),
            Err(Selection::Ambiguous(vec![id(0), id(1)]))
        );
        assert_eq!(
            select(&kept, "ff").map(KeptVersion::id),
            Err(Selection::Unknown)
        );
        assert_eq!(
            select(&kept, "").map(KeptVersion::id),
            Err(Selection::Unknown)
        );
    }
}
