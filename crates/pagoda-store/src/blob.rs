//! Content-addressed blobs: `blobs/sha256-<hex>`.
//!
//! Owns [`Digest`] and [`BlobWriter`]. Invariants: a file named `sha256-<hex>` in `blobs/` always
//! holds exactly the bytes whose sha256 is `<hex>`; it appears only by an atomic rename of a
//! fully written, fsynced and verified `partial-*` file, so an interrupted or failed download
//! leaves no visible blob (only a `partial-*` file, which a dropped writer deletes). Two writers of
//! the same blob each use their own partial file; the second rename replaces identical bytes.
//! A resumable writer (digest known in advance) keeps `partial-<hex>.resume` after a failure so the
//! next pull continues it; it holds `partial-<hex>.lock` while writing, so two processes never
//! append to the same partial file, and its bytes are rehashed before anything is appended.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest as _, Sha256};

use crate::error::{Result, StoreError};

/// A sha256 digest, displayed as `sha256:<hex>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    hex: String,
}

impl Digest {
    /// Parses `sha256:<hex>`, `sha256-<hex>` or a bare 64-digit hex string.
    pub fn parse(text: &str) -> Option<Digest> {
        let hex = text
            .strip_prefix("sha256:")
            .or_else(|| text.strip_prefix("sha256-"))
            .unwrap_or(text)
            .to_ascii_lowercase();
        (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())).then_some(Digest { hex })
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// The first 12 hex digits, the short ID `pagoda list` shows.
    pub fn short(&self) -> &str {
        &self.hex[..12]
    }

    /// The blob's file name in `blobs/`.
    pub fn file_name(&self) -> String {
        format!("sha256-{}", self.hex)
    }

    fn from_hasher(h: Sha256) -> Digest {
        Digest {
            hex: hex::encode(h.finalize()),
        }
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("bad digest '{s}'")))
    }
}

/// A blob that was written and verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub digest: Digest,
    pub size: u64,
    pub path: PathBuf,
}

/// Writes one blob: bytes go to a private partial file and into a sha256 hasher.
///
/// Dropping a writer without [`BlobWriter::finish`] deletes its partial file.
pub struct BlobWriter {
    blobs_dir: PathBuf,
    partial: PathBuf,
    file: Option<BufWriter<File>>,
    hasher: Sha256,
    written: u64,
    head: Vec<u8>,
    /// Resumable writers keep their partial file when dropped unfinished.
    keep_on_drop: bool,
    /// Lock file held by a resumable writer.
    lock: Option<PathBuf>,
}

/// A lock older than this belongs to a crashed pull and may be taken over.
const STALE_LOCK: std::time::Duration = std::time::Duration::from_secs(3600);

const HEAD_LEN: usize = 8;
static PARTIAL_COUNTER: AtomicU64 = AtomicU64::new(0);

impl BlobWriter {
    /// Starts a new partial file in `blobs_dir`.
    pub fn create(blobs_dir: &Path) -> Result<BlobWriter> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let n = PARTIAL_COUNTER.fetch_add(1, Ordering::Relaxed);
        let partial = blobs_dir.join(format!("partial-{}-{nanos:x}-{n}", std::process::id()));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&partial)
            .map_err(StoreError::io("create", &partial))?;
        Ok(BlobWriter {
            blobs_dir: blobs_dir.to_path_buf(),
            partial,
            file: Some(BufWriter::with_capacity(1 << 20, file)),
            hasher: Sha256::new(),
            written: 0,
            head: Vec::with_capacity(HEAD_LEN),
            keep_on_drop: false,
            lock: None,
        })
    }

    /// A writer for a blob whose digest is known, continuing a partial file an earlier pull left.
    ///
    /// `Ok(None)` when another live process is writing the same blob (use [`BlobWriter::create`]).
    /// The bytes already there are hashed first; [`BlobWriter::written`] says how many there are.
    pub fn resumable(blobs_dir: &Path, digest: &Digest) -> Result<Option<BlobWriter>> {
        Self::resumable_as(blobs_dir, digest.hex())
    }

    /// Like [`BlobWriter::resumable`] for a download whose digest is not known in advance:
    /// `key` (hex, e.g. a hash of the object's URL, ETag and size) names the partial file, so
    /// only a pull of the same object version continues it.
    pub fn resumable_as(blobs_dir: &Path, key: &str) -> Result<Option<BlobWriter>> {
        let lock = blobs_dir.join(format!("partial-{key}.lock"));
        let take = |lock: &Path| {
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(lock)
        };
        if take(&lock).is_err() {
            let stale = fs::metadata(&lock)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_LOCK);
            if !stale {
                return Ok(None);
            }
            let _ = fs::remove_file(&lock);
            if take(&lock).is_err() {
                return Ok(None);
            }
        }
        let partial = blobs_dir.join(format!("partial-{key}.resume"));
        let mut writer = BlobWriter {
            blobs_dir: blobs_dir.to_path_buf(),
            partial: partial.clone(),
            file: None,
            hasher: Sha256::new(),
            written: 0,
            head: Vec::with_capacity(HEAD_LEN),
            keep_on_drop: true,
            lock: Some(lock),
        };
        // Rehash what is there (the writer now owns the lock; dropping it on error releases it).
        if partial.exists() {
            let mut f = File::open(&partial).map_err(StoreError::io("open", &partial))?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n =
                    io::Read::read(&mut f, &mut buf).map_err(StoreError::io("read", &partial))?;
                if n == 0 {
                    break;
                }
                writer.account(&buf[..n]);
            }
        }
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&partial)
            .map_err(StoreError::io("open", &partial))?;
        writer.file = Some(BufWriter::with_capacity(1 << 20, file));
        Ok(Some(writer))
    }

    /// Throws away what was written and starts over (a server that ignored a range request).
    pub fn restart(&mut self) -> Result<()> {
        if let Some(f) = self.file.as_mut() {
            f.flush().map_err(StoreError::io("write", &self.partial))?;
            f.get_ref()
                .set_len(0)
                .map_err(StoreError::io("truncate", &self.partial))?;
        }
        self.hasher = Sha256::new();
        self.written = 0;
        self.head.clear();
        Ok(())
    }

    fn account(&mut self, buf: &[u8]) {
        self.hasher.update(buf);
        if self.head.len() < HEAD_LEN {
            let take = (HEAD_LEN - self.head.len()).min(buf.len());
            self.head.extend_from_slice(&buf[..take]);
        }
        self.written += buf.len() as u64;
    }

    /// Drops the writer and its partial file, resumable or not (bytes not worth resuming).
    pub fn discard(mut self) {
        self.keep_on_drop = false;
    }

    /// The first bytes written (up to 8), to check a file's magic before keeping it.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Verifies the digest (when one is expected), then renames the partial file into place.
    ///
    /// `what` names the data in a mismatch error (a model name or URL).
    pub fn finish(mut self, expected: Option<&Digest>, what: &str) -> Result<Blob> {
        let file = self.file.take().ok_or_else(|| StoreError::Io {
            op: "finish",
            path: self.partial.clone(),
            source: io::Error::other("blob writer already finished"),
        })?;
        let file = file.into_inner().map_err(|e| StoreError::Io {
            op: "write",
            path: self.partial.clone(),
            source: e.into_error(),
        })?;
        file.sync_all()
            .map_err(StoreError::io("sync", &self.partial))?;
        drop(file);
        let hasher = std::mem::take(&mut self.hasher);
        let digest = Digest::from_hasher(hasher);
        if let Some(want) = expected {
            if *want != digest {
                // Wrong bytes are never worth resuming: Drop removes the partial file.
                self.keep_on_drop = false;
                return Err(StoreError::ShaMismatch {
                    what: what.to_string(),
                    expected: want.to_string(),
                    actual: digest.to_string(),
                });
            }
        }
        // Blobs are shared by hardlinks into models/: make them read-only so no reader of a
        // materialized folder can change the stored bytes by accident.
        if let Ok(meta) = fs::metadata(&self.partial) {
            let mut perms = meta.permissions();
            perms.set_readonly(true);
            let _ = fs::set_permissions(&self.partial, perms);
        }
        let target = self.blobs_dir.join(digest.file_name());
        fs::rename(&self.partial, &target).map_err(StoreError::io("rename into", &target))?;
        // The partial path no longer exists; Drop's removal is a no-op.
        Ok(Blob {
            digest,
            size: self.written,
            path: target,
        })
    }
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| io::Error::other("blob writer already finished"))?;
        let n = file.write(buf)?;
        self.account(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if let Some(mut f) = self.file.take() {
            let _ = f.flush();
        }
        // After a successful finish the partial path is gone and this fails harmlessly.
        // An empty partial is not worth resuming.
        if !self.keep_on_drop || self.written == 0 {
            let _ = fs::remove_file(&self.partial);
        }
        if let Some(lock) = &self.lock {
            let _ = fs::remove_file(lock);
        }
    }
}

/// Deletes the resumable partial file of `digest` once its blob exists, unless a writer holds it.
pub fn drop_stale_resume(blobs_dir: &Path, digest: &Digest) {
    let lock = blobs_dir.join(format!("partial-{}.lock", digest.hex()));
    if !lock.exists() {
        let _ = fs::remove_file(blobs_dir.join(format!("partial-{}.resume", digest.hex())));
    }
}

/// Hashes a file on disk (used to check blobs and local files).
pub fn hash_file(path: &Path, mut on_progress: impl FnMut(u64)) -> Result<(Digest, u64)> {
    let mut f = File::open(path).map_err(StoreError::io("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = io::Read::read(&mut f, &mut buf).map_err(StoreError::io("read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
        on_progress(n as u64);
    }
    Ok((Digest::from_hasher(hasher), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = BlobWriter::create(dir.path()).unwrap();
        w.write_all(b"hello").unwrap();
        let blob = w.finish(None, "t").unwrap();
        assert_eq!(
            blob.digest.hex(),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(fs::read(&blob.path).unwrap(), b"hello");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn mismatch_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = BlobWriter::create(dir.path()).unwrap();
        w.write_all(b"hello").unwrap();
        let want = Digest::parse(&"0".repeat(64)).unwrap();
        let e = w.finish(Some(&want), "thing").unwrap_err().to_string();
        assert!(e.contains("sha256 mismatch for thing"), "{e}");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn dropped_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = BlobWriter::create(dir.path()).unwrap();
        w.write_all(b"half").unwrap();
        drop(w);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn concurrent_writers_of_the_same_blob() {
        let dir = tempfile::tempdir().unwrap();
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let d = dir.path().to_path_buf();
                std::thread::spawn(move || {
                    let mut w = BlobWriter::create(&d).unwrap();
                    for _ in 0..1000 {
                        w.write_all(b"same bytes ").unwrap();
                    }
                    w.finish(None, "t").unwrap()
                })
            })
            .collect();
        let blobs: Vec<Blob> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(blobs.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        assert_eq!(fs::read(&blobs[0].path).unwrap().len(), 11_000);
    }

    #[test]
    fn resumable_writer_continues_and_locks() {
        let dir = tempfile::tempdir().unwrap();
        let full = b"hello, resumable world".to_vec();
        let digest = {
            let mut w = BlobWriter::create(dir.path()).unwrap();
            w.write_all(&full).unwrap();
            let b = w.finish(None, "t").unwrap();
            fs::remove_file(&b.path).unwrap();
            b.digest
        };
        let mut w = BlobWriter::resumable(dir.path(), &digest).unwrap().unwrap();
        assert_eq!(w.written(), 0);
        // A second writer of the same blob is refused while the first holds the lock.
        assert!(BlobWriter::resumable(dir.path(), &digest)
            .unwrap()
            .is_none());
        w.write_all(&full[..7]).unwrap();
        drop(w); // an interrupted download
        let mut w = BlobWriter::resumable(dir.path(), &digest).unwrap().unwrap();
        assert_eq!(w.written(), 7);
        w.write_all(&full[7..]).unwrap();
        let blob = w.finish(Some(&digest), "t").unwrap();
        assert_eq!(fs::read(&blob.path).unwrap(), full);
        // Only the blob is left: no partial, no lock.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn resumable_writer_with_wrong_bytes_starts_clean_next_time() {
        let dir = tempfile::tempdir().unwrap();
        let digest = Digest::parse(&"ab".repeat(32)).unwrap();
        let mut w = BlobWriter::resumable(dir.path(), &digest).unwrap().unwrap();
        w.write_all(b"garbage").unwrap();
        assert!(w.finish(Some(&digest), "t").is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        let mut w = BlobWriter::resumable(dir.path(), &digest).unwrap().unwrap();
        w.write_all(b"x").unwrap();
        w.restart().unwrap();
        assert_eq!(w.written(), 0);
        assert!(w.head().is_empty());
    }

    #[test]
    fn digest_parsing() {
        let hex = "ab".repeat(32);
        assert!(Digest::parse(&hex).is_some());
        assert!(Digest::parse(&format!("sha256:{hex}")).is_some());
        assert!(Digest::parse(&format!("sha256-{}", hex.to_uppercase())).is_some());
        assert!(Digest::parse("abc").is_none());
        assert!(Digest::parse(&"zz".repeat(32)).is_none());
    }
}
