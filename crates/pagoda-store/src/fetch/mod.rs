//! Fetchers: turn one [`Source`](crate::source::Source) into verified blobs in the store.
//!
//! Owns [`FetchCtx`] (what every fetcher needs) and [`Fetched`] (what it hands back: the format
//! and the manifest files). Invariant: a fetcher only ever adds blobs through
//! [`BlobWriter`](crate::blob::BlobWriter), so it either returns verified blobs or leaves nothing
//! visible; it never writes manifests (the store does, after a fetch succeeds). Every fetcher
//! reports its bytes through the pull's one [`PullProgress`](crate::progress::PullProgress):
//! [`FetchCtx::promise`] as soon as it knows the whole pull's size,
//! [`begin_file`](crate::progress::PullProgress::begin_file) before a file's first byte,
//! [`finish_file`](crate::progress::PullProgress::finish_file) once its blob is verified.

pub mod address;
pub mod http;
pub mod local;
pub mod object;
pub mod pip;
pub mod url_policy;

use std::path::Path;

use crate::blob::{Blob, BlobWriter, Digest};
use crate::error::{Result, StoreError};
use crate::manifest::{FileRole, Format, ManifestFile};

/// The GGUF file magic.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// What every fetcher needs from the store.
pub struct FetchCtx<'a> {
    pub blobs_dir: &'a Path,
    /// Scratch space on the store's file system (wheels are unpacked here, then deleted).
    pub tmp_dir: &'a Path,
    /// The pull's progress reporter (one bar, or a line per file).
    pub progress: &'a crate::progress::PullProgress,
    /// The model being pulled, for messages.
    pub label: &'a str,
    /// sha256 the single model file must have, where known.
    pub expected: Option<&'a Digest>,
    /// Size in bytes of the whole model, where the catalog knows it (the bar's length).
    pub expected_size: Option<u64>,
    /// Format the catalog promises, where known.
    pub format: Option<Format>,
    /// File name recorded for a single-file model whose source does not name one well.
    pub default_file_name: &'a str,
    pub http: &'a http::HttpConfig,
    pub pip: &'a dyn pip::PipDownloader,
}

impl FetchCtx<'_> {
    /// The pull weighs `bytes` in all, as the source says before the first byte (a listing,
    /// a single file's size); the catalog's size, where it has one, comes first.
    pub fn promise(&self, bytes: u64) {
        if self.expected_size.is_none() {
            self.progress.promise(Some(bytes));
        }
    }
}

/// The result of a successful fetch.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub format: Format,
    pub files: Vec<ManifestFile>,
}

impl Fetched {
    /// A single GGUF file.
    pub fn single_gguf(blob: Blob, file_name: String) -> Fetched {
        Fetched {
            format: Format::Gguf,
            files: vec![ManifestFile {
                path: file_name,
                digest: blob.digest,
                size: blob.size,
                role: FileRole::Model,
            }],
        }
    }
}

/// The manifest entry of one file of a Hugging Face folder, stored as `blob` (its role from
/// its path).
pub fn folder_file(rel: String, blob: Blob) -> ManifestFile {
    ManifestFile {
        role: FileRole::for_hf_path(&rel),
        path: rel,
        digest: blob.digest,
        size: blob.size,
    }
}

/// Finishes a single-file model blob: checks the GGUF magic, then the digest.
///
/// A file that is not GGUF is refused unless the catalog vouches for it by digest.
pub fn finish_single(writer: BlobWriter, ctx: &FetchCtx<'_>, what: &str) -> Result<Blob> {
    if ctx.expected.is_none() && !writer.head().starts_with(GGUF_MAGIC) {
        // Not a model: nothing to resume either.
        writer.discard();
        // Never quote the bytes: a pull made for a client must not read anything back to it.
        return Err(StoreError::NotAModel {
            path: what.into(),
            reason: "the data does not start with the GGUF magic; only GGUF files and Hugging Face folders can be stored".into(),
        });
    }
    writer.finish(ctx.expected, &format!("{} from {what}", ctx.label))
}

/// Name to record for a single file given its source file name.
pub fn gguf_file_name(candidate: &str, fallback: &str) -> String {
    let last = candidate.rsplit('/').next().unwrap_or(candidate);
    // Chunk names like `model.gguf.part03` stand for `model.gguf`.
    let trimmed = match last.rsplit_once(".part") {
        Some((stem, digits))
            if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) =>
        {
            stem
        }
        _ => last,
    };
    if trimmed.to_ascii_lowercase().ends_with(".gguf") && !trimmed.starts_with('.') {
        trimmed.to_string()
    } else {
        fallback.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names() {
        assert_eq!(gguf_file_name("a/b/M.Q4_1.gguf", "x.gguf"), "M.Q4_1.gguf");
        assert_eq!(
            gguf_file_name("d/gemma.gguf.part03", "x.gguf"),
            "gemma.gguf"
        );
        assert_eq!(gguf_file_name("d/part01.bin", "x.gguf"), "x.gguf");
        assert_eq!(gguf_file_name("", "x.gguf"), "x.gguf");
    }
}
