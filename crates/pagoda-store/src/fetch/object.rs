//! Object storage: `s3://bucket/key`, `gs://bucket/key`, `az://container/key` (and
//! `azure://`), read with the `object_store` crate and each cloud's usual credentials from
//! the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT` for S3-compatible servers, `AWS_ALLOW_HTTP` for plain HTTP;
//! `GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_APPLICATION_CREDENTIALS`; `AZURE_STORAGE_ACCOUNT_NAME`,
//! `AZURE_STORAGE_ACCOUNT_KEY`, ...; instance and workload identities where the cloud has them).
//!
//! A key is one GGUF file; a key ending in `/` is a Hugging Face folder (the files Pagoda reads
//! under that prefix). Invariants: a single file is resumable — its partial blob is named by a
//! hash of (URL, ETag, size), so a rerun continues it with a ranged read only while the object
//! is unchanged, and the read is conditional on that ETag; every file's size is checked
//! against the listing, the single file's GGUF magic and catalog digest as for any pull.

use std::io::Write;

use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};
use sha2::{Digest as _, Sha256};

use super::http::wanted_in_folder;
use super::{finish_single, folder_file, gguf_file_name, FetchCtx, Fetched};
use crate::blob::{Blob, BlobWriter};
use crate::error::{Result, StoreError};
use crate::manifest::Format;

/// The URL schemes this fetcher reads.
pub const SCHEMES: [&str; 4] = ["s3://", "gs://", "az://", "azure://"];

/// Whether `text` names an object-store location (by scheme, any case).
pub fn is_object_url(text: &str) -> bool {
    let lower = text.trim().to_ascii_lowercase();
    SCHEMES.iter().any(|s| lower.starts_with(s))
}

/// `(bucket, key)` of an object URL; `Err` says what is wrong with it.
///
/// The bucket is the parsed URL's host, which is what the object_store client uses; text
/// whose bucket the parser would read differently (`s3://a\\@b/k`) is refused.
pub fn split_url(url: &str) -> std::result::Result<(String, String), String> {
    let parsed = super::url_policy::parse_object_url(url)?;
    let rest = url
        .trim()
        .split_once("://")
        .map(|(_, r)| r)
        .ok_or("expected scheme://bucket/key")?;
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err("the URL names no bucket".into());
    }
    if parsed.host_str() != Some(bucket) {
        return Err("the bucket name holds characters a URL host cannot".into());
    }
    if key.is_empty() {
        return Err(
            "the URL names no object: give the key of a GGUF file, or a folder ending in '/'"
                .into(),
        );
    }
    if key.split('/').any(|s| s == "." || s == "..") {
        return Err("the key has '.' or '..' segments".into());
    }
    Ok((bucket.to_string(), key.to_string()))
}

fn store_error(url: &str, e: impl std::fmt::Display) -> StoreError {
    store_message(url, e.to_string())
}

/// An object-store failure; a missing object or bucket says so first.
fn object_error(url: &str, e: object_store::Error) -> StoreError {
    match e {
        object_store::Error::NotFound { .. } => store_message(
            url,
            "not found: no such bucket or key (list the bucket to check the key)".into(),
        ),
        other => store_message(url, other.to_string()),
    }
}

fn store_message(url: &str, e: String) -> StoreError {
    StoreError::ObjectStore {
        url: url.to_string(),
        message: format!(
            "{e}; check the bucket and key, and the credentials in the environment (AWS_*, GOOGLE_*, AZURE_*; AWS_ENDPOINT and AWS_ALLOW_HTTP=true for an S3-compatible server)"
        ),
    }
}

/// The client for `url`'s bucket, configured from the environment.
fn open(url: &str) -> Result<Box<dyn ObjectStore>> {
    let lower = url.to_ascii_lowercase();
    let store: Box<dyn ObjectStore> = if lower.starts_with("s3://") {
        Box::new(
            object_store::aws::AmazonS3Builder::from_env()
                .with_url(url)
                .build()
                .map_err(|e| store_error(url, e))?,
        )
    } else if lower.starts_with("gs://") {
        Box::new(
            object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(url)
                .build()
                .map_err(|e| store_error(url, e))?,
        )
    } else {
        Box::new(
            object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(url)
                .build()
                .map_err(|e| store_error(url, e))?,
        )
    };
    Ok(store)
}

/// Pulls the object (a GGUF file) or the folder (a key ending in `/`) at `url`.
pub fn fetch(ctx: &FetchCtx<'_>, url: &str) -> Result<Fetched> {
    let (_, key) = split_url(url).map_err(|reason| StoreError::InvalidSource {
        source_text: url.to_string(),
        reason,
    })?;
    if let Some(allowed) = &ctx.http.allowed_urls {
        // The bucket as the client reads it (`Url::host_str`), held to the client's list.
        let parsed = super::url_policy::parse_object_url(url).map_err(|reason| {
            StoreError::InvalidSource {
                source_text: url.to_string(),
                reason,
            }
        })?;
        if !allowed.allows(&parsed) {
            return Err(StoreError::UrlRefused {
                url: url.to_string(),
                location: super::url_policy::origin_text(&parsed),
                reason: "not a bucket this server allows".into(),
            });
        }
    }
    let store = open(url)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| store_error(url, e))?;
    runtime.block_on(async {
        if key.ends_with('/') {
            fetch_folder(ctx, store.as_ref(), url, &key).await
        } else {
            fetch_file(ctx, store.as_ref(), url, &key).await
        }
    })
}

fn object_path(url: &str, key: &str) -> Result<ObjectPath> {
    ObjectPath::parse(key.trim_end_matches('/')).map_err(|e| StoreError::InvalidSource {
        source_text: url.to_string(),
        reason: e.to_string(),
    })
}

async fn fetch_file(
    ctx: &FetchCtx<'_>,
    store: &dyn ObjectStore,
    url: &str,
    key: &str,
) -> Result<Fetched> {
    let path = object_path(url, key)?;
    let meta = store.head(&path).await.map_err(|e| object_error(url, e))?;
    let file_name = gguf_file_name(key, ctx.default_file_name);
    let blob = download(ctx, store, url, &meta, &file_name, true).await?;
    Ok(Fetched::single_gguf(blob, file_name))
}

async fn fetch_folder(
    ctx: &FetchCtx<'_>,
    store: &dyn ObjectStore,
    url: &str,
    key: &str,
) -> Result<Fetched> {
    let prefix = object_path(url, key)?;
    let mut listing = store.list(Some(&prefix));
    let mut objects: Vec<(String, ObjectMeta)> = Vec::new();
    while let Some(meta) = listing.next().await {
        let meta = meta.map_err(|e| object_error(url, e))?;
        let rel = meta
            .location
            .as_ref()
            .strip_prefix(prefix.as_ref())
            .unwrap_or(meta.location.as_ref())
            .trim_start_matches('/')
            .to_string();
        if wanted_in_folder(&rel) {
            objects.push((rel, meta));
        }
    }
    objects.sort_by(|a, b| a.0.cmp(&b.0));
    if !objects.iter().any(|(rel, _)| rel == "config.json") {
        return Err(StoreError::ObjectStore {
            url: url.to_string(),
            message: "no config.json under this prefix: a folder pull needs a Hugging Face model folder (config.json, tokenizer, *.safetensors); for one GGUF file give its key without the trailing '/'".into(),
        });
    }
    // The listing gives every size before the first byte: the bar's length.
    ctx.promise(objects.iter().map(|(_, meta)| meta.size).sum());
    let mut files = Vec::new();
    for (rel, meta) in &objects {
        let blob = download(ctx, store, url, meta, rel, false).await?;
        files.push(folder_file(rel.clone(), blob));
    }
    Ok(Fetched {
        format: Format::HfFolder,
        files,
    })
}

/// A resume key for one version of one object.
fn resume_key(url: &str, meta: &ObjectMeta) -> String {
    let mut h = Sha256::new();
    h.update(url.as_bytes());
    h.update([0]);
    h.update(meta.location.as_ref().as_bytes());
    h.update([0]);
    h.update(meta.e_tag.as_deref().unwrap_or("").as_bytes());
    h.update(meta.size.to_le_bytes());
    hex::encode(h.finalize())
}

/// Streams one object into a blob; `single` marks the model's one GGUF file (resumable,
/// magic and catalog digest checked).
async fn download(
    ctx: &FetchCtx<'_>,
    store: &dyn ObjectStore,
    url: &str,
    meta: &ObjectMeta,
    file_name: &str,
    single: bool,
) -> Result<Blob> {
    let resumable = if single {
        BlobWriter::resumable_as(ctx.blobs_dir, &resume_key(url, meta))?
    } else {
        None
    };
    let can_resume = resumable.is_some();
    let mut w = match resumable {
        Some(w) => w,
        None => BlobWriter::create(ctx.blobs_dir)?,
    };
    if w.written() > meta.size {
        w.restart()?;
    }
    let offset = w.written();
    if offset > 0 {
        ctx.progress
            .suspend(|| tracing::info!("resuming {file_name} at byte {offset}"));
    }
    if single {
        ctx.promise(meta.size);
    }
    ctx.progress.begin_file();
    ctx.progress.advance(offset);
    let what = format!("{url} ({})", meta.location);
    if offset < meta.size {
        let options = GetOptions {
            range: (offset > 0).then_some(GetRange::Offset(offset)),
            if_match: meta.e_tag.clone(),
            ..Default::default()
        };
        let result = store
            .get_opts(&meta.location, options)
            .await
            .map_err(|e| object_error(&what, e))?;
        let mut stream = result.into_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                let again = if can_resume {
                    "; run the pull again to resume"
                } else {
                    ""
                };
                StoreError::Network {
                    url: what.clone(),
                    message: format!("connection failed after {} bytes: {e}{again}", w.written()),
                }
            })?;
            w.write_all(&chunk).map_err(|e| StoreError::Network {
                url: what.clone(),
                message: format!("cannot write the blob: {e}"),
            })?;
            ctx.progress.advance(chunk.len() as u64);
        }
    }
    if w.written() != meta.size {
        return Err(StoreError::Truncated {
            url: what,
            got: w.written(),
            expected: meta.size,
        });
    }
    let blob = if single {
        finish_single(w, ctx, &what)?
    } else {
        w.finish(None, &what)?
    };
    ctx.progress.finish_file(file_name, blob.size);
    Ok(blob)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::PutPayload;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A GGUF-looking object of `len` bytes in an in-memory bucket.
    fn bucket_with_object(rt: &tokio::runtime::Runtime, len: usize) -> (InMemory, Vec<u8>) {
        let mut data = b"GGUF".to_vec();
        data.extend((0..len - 4).map(|i| (i * 31 % 251) as u8));
        let store = InMemory::new();
        rt.block_on(store.put(
            &ObjectPath::from("m/model.gguf"),
            PutPayload::from(data.clone()),
        ))
        .unwrap();
        (store, data)
    }

    #[test]
    fn an_interrupted_download_resumes_from_its_partial_file() {
        let rt = runtime();
        let (store, data) = bucket_with_object(&rt, 3 << 20);
        let dir = tempfile::tempdir().unwrap();
        let url = "s3://b/m/model.gguf";
        let meta = rt
            .block_on(store.head(&ObjectPath::from("m/model.gguf")))
            .unwrap();
        // An earlier pull got the first 1 MiB and stopped.
        {
            let mut w = BlobWriter::resumable_as(dir.path(), &resume_key(url, &meta))
                .unwrap()
                .unwrap();
            w.write_all(&data[..1 << 20]).unwrap();
        }
        let partial = dir
            .path()
            .join(format!("partial-{}.resume", resume_key(url, &meta)));
        assert_eq!(std::fs::metadata(&partial).unwrap().len(), 1 << 20);
        let http = crate::fetch::http::HttpConfig::from_env();
        let pip = crate::fetch::pip::WheelDir {
            dir: dir.path().to_path_buf(),
        };
        let ctx = FetchCtx {
            blobs_dir: dir.path(),
            tmp_dir: dir.path(),
            progress: &crate::progress::PullProgress::off(),
            label: "test",
            expected: None,
            expected_size: None,
            format: None,
            default_file_name: "model.gguf",
            http: &http,
            pip: &pip,
        };
        let blob = rt
            .block_on(download(&ctx, &store, url, &meta, "model.gguf", true))
            .unwrap();
        assert_eq!(blob.size, data.len() as u64);
        let whole = crate::blob::Digest::parse(&hex::encode(Sha256::digest(&data))).unwrap();
        assert_eq!(
            blob.digest, whole,
            "the resumed blob has the object's bytes"
        );
        assert!(!partial.exists(), "the partial file became the blob");
    }

    #[test]
    fn a_changed_object_does_not_resume_an_old_partial() {
        let rt = runtime();
        let (store, _) = bucket_with_object(&rt, 4096);
        let path = ObjectPath::from("m/model.gguf");
        let before = rt.block_on(store.head(&path)).unwrap();
        rt.block_on(store.put(&path, PutPayload::from(b"GGUF-new".to_vec())))
            .unwrap();
        let after = rt.block_on(store.head(&path)).unwrap();
        let url = "s3://b/m/model.gguf";
        assert_ne!(resume_key(url, &before), resume_key(url, &after));
    }

    #[test]
    fn urls_split_into_bucket_and_key() {
        assert_eq!(
            split_url("s3://models/qwen/q4.gguf").unwrap(),
            ("models".into(), "qwen/q4.gguf".into())
        );
        assert_eq!(
            split_url("gs://b/folder/").unwrap(),
            ("b".into(), "folder/".into())
        );
        assert!(split_url("s3://bucket").unwrap_err().contains("no object"));
        assert!(split_url("s3://bucket/").unwrap_err().contains("no object"));
        assert!(split_url("s3:///key").unwrap_err().contains("no bucket"));
        assert!(split_url("s3://b/a/../k").unwrap_err().contains(".."));
        assert!(is_object_url("S3://b/k") && is_object_url("az://c/k"));
        assert!(!is_object_url("https://b/k"));
    }
}
