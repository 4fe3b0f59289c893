//! Manifests: `manifests/<name>/<tag>.json`, one per stored model.
//!
//! Owns [`Manifest`], [`ManifestFile`], [`Format`] and [`FileRole`], and their atomic reading and
//! writing. Invariants: a manifest lists every blob its model needs with its size; `total_size`
//! is the sum of those sizes; a manifest file appears by atomic rename, so a reader never sees a
//! half-written one; a GGUF manifest has exactly one file, of role `model`. A derived model
//! (`pagoda create`, `pagoda cp`) names the same blobs as its base and carries its Modelfile
//! layer in `modelfile`; that field is optional, so manifests written before it existed read as
//! plain models and older readers ignore it (the schema version stays 1).

use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::blob::Digest;
use crate::error::{Result, StoreError};
use crate::modelfile::Modelfile;
use crate::name::ModelName;

/// Version of the manifest layout; bumped on incompatible changes.
pub const SCHEMA_VERSION: u32 = 1;

/// How the model's files are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// A single GGUF file.
    Gguf,
    /// A Hugging Face folder: config.json, tokenizer files, safetensors weights.
    HfFolder,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Gguf => "gguf",
            Format::HfFolder => "hf-folder",
        })
    }
}

/// What a file is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileRole {
    /// Weights (the GGUF file, or `*.safetensors`).
    Model,
    /// `config.json` and other configuration.
    Config,
    /// Tokenizer files.
    Tokenizer,
    /// Anything else (README, licence).
    Other,
}

impl FileRole {
    /// Guesses the role of a file in a Hugging Face folder from its relative path.
    pub fn for_hf_path(rel: &str) -> FileRole {
        let file = rel.rsplit('/').next().unwrap_or(rel).to_ascii_lowercase();
        if file.ends_with(".safetensors")
            || file.ends_with(".gguf")
            || file.ends_with(".bin") && file.contains("model")
        {
            FileRole::Model
        } else if file.starts_with("tokenizer")
            || file == "vocab.txt"
            || file == "vocab.json"
            || file == "merges.txt"
            || file == "special_tokens_map.json"
            || file.ends_with(".model")
        {
            FileRole::Tokenizer
        } else if file.ends_with(".json") {
            FileRole::Config
        } else {
            FileRole::Other
        }
    }
}

/// One blob of a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Relative path the file has in the model (`model.safetensors`, `1_Pooling/config.json`, or
    /// the GGUF's original file name).
    pub path: String,
    pub digest: Digest,
    pub size: u64,
    pub role: FileRole,
}

/// The record of one stored model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    /// Name without tag.
    pub name: String,
    pub tag: String,
    /// The source the files came from (its `to_spec()` form).
    pub source: String,
    pub format: Format,
    pub files: Vec<ManifestFile>,
    pub total_size: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// The Modelfile layer of a derived model (`pagoda create`): its base as `from` (a store
    /// name or path), parameters, template, system, messages, license. Applied at load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modelfile: Option<Modelfile>,
}

impl Manifest {
    /// Builds a manifest stamped now.
    pub fn new(
        name: &ModelName,
        source: String,
        format: Format,
        files: Vec<ManifestFile>,
    ) -> Manifest {
        let created = now_secs();
        Manifest {
            schema_version: SCHEMA_VERSION,
            name: name.name().to_string(),
            tag: name.tag().to_string(),
            source,
            format,
            total_size: files.iter().map(|f| f.size).sum(),
            files,
            created,
            modelfile: None,
        }
    }

    /// What identifies this version of the model, for hot reload: the primary file's digest,
    /// or with a Modelfile layer, the sha256 of that digest and the layer, so that a
    /// re-`create` with other parameters over the same weights is a new version too.
    pub fn version(&self) -> String {
        let primary = self
            .primary()
            .map_or_else(|| self.created.to_string(), |f| f.digest.to_string());
        let Some(layer) = &self.modelfile else {
            return primary;
        };
        let layer = serde_json::to_string(layer).unwrap_or_default();
        let mut h = Sha256::new();
        h.update(primary.as_bytes());
        h.update(b"\n");
        h.update(layer.as_bytes());
        format!("sha256:{}", hex::encode(h.finalize()))
    }

    /// The same manifest under another name, stamped now.
    pub fn renamed(&self, name: &ModelName) -> Manifest {
        let mut m = self.clone();
        m.name = name.name().to_string();
        m.tag = name.tag().to_string();
        m.created = now_secs();
        m
    }

    /// `name:tag`.
    pub fn full_name(&self) -> String {
        format!("{}:{}", self.name, self.tag)
    }

    /// The main weights file: the GGUF, or the first safetensors file.
    pub fn primary(&self) -> Option<&ManifestFile> {
        self.files
            .iter()
            .find(|f| f.role == FileRole::Model)
            .or_else(|| self.files.first())
    }

    /// Created time as a `SystemTime`.
    pub fn created_time(&self) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::from_secs(self.created)
    }

    /// Reads and checks a manifest file.
    pub fn read(path: &Path, name: &ModelName) -> Result<Manifest> {
        let text = fs::read_to_string(path).map_err(StoreError::io("read", path))?;
        let corrupt = |message: String| StoreError::CorruptManifest {
            name: name.to_string(),
            path: path.to_path_buf(),
            message,
        };
        let m: Manifest = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
        if m.schema_version > SCHEMA_VERSION {
            return Err(corrupt(format!(
                "schema version {} is newer than this pagoda understands ({SCHEMA_VERSION}); upgrade pagoda",
                m.schema_version
            )));
        }
        if m.files.is_empty() {
            return Err(corrupt("it lists no files".into()));
        }
        for f in &m.files {
            if f.path.is_empty()
                || f.path.starts_with('/')
                || f.path.split('/').any(|s| s == ".." || s.is_empty())
            {
                return Err(corrupt(format!(
                    "file path '{}' is not a safe relative path",
                    f.path
                )));
            }
        }
        Ok(m)
    }

    /// Writes the manifest atomically (temp file + rename).
    pub fn write(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self).map_err(|e| StoreError::Io {
            op: "serialize manifest for",
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        write_atomic(path, json.as_bytes(), ".manifest-")
    }
}

/// Writes `bytes` to `path` through a private temp file (named `prefix…`, one per writer,
/// threads of one process too) renamed into place, so a reader sees the old file or the new
/// one, never a part.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], prefix: &str) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(StoreError::io("create directory", dir))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(prefix)
        .tempfile_in(dir)
        .map_err(StoreError::io("create a temp file in", dir))?;
    std::io::Write::write_all(&mut tmp, bytes)
        .map_err(StoreError::io("write", tmp.path().to_path_buf()))?;
    tmp.persist(path).map_err(|e| StoreError::Io {
        op: "rename into",
        path: path.to_path_buf(),
        source: e.error,
    })?;
    Ok(())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let name = ModelName::parse("a/b:c").unwrap();
        let m = Manifest::new(
            &name,
            "./x.gguf".into(),
            Format::Gguf,
            vec![ManifestFile {
                path: "x.gguf".into(),
                digest: Digest::parse(&"ab".repeat(32)).unwrap(),
                size: 42,
                role: FileRole::Model,
            }],
        );
        let p = dir.path().join(name.manifest_rel_path());
        m.write(&p).unwrap();
        let back = Manifest::read(&p, &name).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.total_size, 42);
        let text = fs::read_to_string(&p).unwrap();
        assert!(text.contains("\"format\": \"gguf\""), "{text}");
        assert!(text.contains("sha256:abab"), "{text}");
    }

    #[test]
    fn old_manifests_without_a_layer_still_read() {
        // A manifest as written before `modelfile` existed.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("old.json");
        let hex = "ab".repeat(32);
        fs::write(
            &p,
            format!(
                r#"{{"schema_version":1,"name":"old","tag":"latest","source":"./x.gguf","format":"gguf",
                "files":[{{"path":"x.gguf","digest":"sha256:{hex}","size":4,"role":"model"}}],
                "total_size":4,"created":1}}"#
            ),
        )
        .unwrap();
        let name = ModelName::parse("old").unwrap();
        let m = Manifest::read(&p, &name).unwrap();
        assert!(m.modelfile.is_none());
        assert_eq!(m.version(), format!("sha256:{hex}"));
        // Written back without a layer, it has no `modelfile` key at all.
        m.write(&p).unwrap();
        assert!(!fs::read_to_string(&p).unwrap().contains("modelfile"));
    }

    #[test]
    fn the_layer_round_trips_and_changes_the_version() {
        let dir = tempfile::tempdir().unwrap();
        let name = ModelName::parse("derived:1").unwrap();
        let file = ManifestFile {
            path: "x.gguf".into(),
            digest: Digest::parse(&"cd".repeat(32)).unwrap(),
            size: 7,
            role: FileRole::Model,
        };
        let mut m = Manifest::new(&name, "./x.gguf".into(), Format::Gguf, vec![file]);
        let plain = m.version();
        m.modelfile = Some(
            Modelfile::parse("FROM base:latest\nPARAMETER temperature 0\nSYSTEM Be brief.\n")
                .unwrap(),
        );
        let p = dir.path().join(name.manifest_rel_path());
        m.write(&p).unwrap();
        let back = Manifest::read(&p, &name).unwrap();
        assert_eq!(back, m);
        let v1 = back.version();
        assert_ne!(v1, plain);
        if let Some(layer) = m.modelfile.as_mut() {
            layer.parameters.temperature = Some(0.5);
        }
        assert_ne!(m.version(), v1, "new parameters, new version");
        assert!(m.version().starts_with("sha256:"));
    }

    #[test]
    fn corrupt_manifest_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        fs::write(&p, "{not json").unwrap();
        let name = ModelName::parse("x").unwrap();
        let e = Manifest::read(&p, &name).unwrap_err().to_string();
        assert!(e.contains("pagoda rm x:latest"), "{e}");
    }

    #[test]
    fn roles() {
        assert_eq!(FileRole::for_hf_path("model.safetensors"), FileRole::Model);
        assert_eq!(FileRole::for_hf_path("tokenizer.json"), FileRole::Tokenizer);
        assert_eq!(FileRole::for_hf_path("config.json"), FileRole::Config);
        assert_eq!(
            FileRole::for_hf_path("1_Pooling/config.json"),
            FileRole::Config
        );
        assert_eq!(FileRole::for_hf_path("README.md"), FileRole::Other);
    }
}
