//! URL and Hugging Face sources: files over HTTP(S), streamed to blobs.
//!
//! Owns [`HttpConfig`] (endpoint, token, timeouts), the download loop, and Hugging Face repo
//! listing (`/api/models/<repo>/revision/<rev>`) used to pull a whole safetensors folder or to pick
//! a GGUF by quantization tag. Invariants: a body is streamed straight into a [`BlobWriter`]
//! (never held in memory); a body shorter than its Content-Length, a non-2xx status or a digest
//! mismatch is an error and leaves no blob; the Hugging Face token is only sent to the Hugging
//! Face endpoint (same scheme, host and port, checked at every hop); redirects are followed
//! here, not by ureq, so every hop passes [`url_policy::check_hop`] (http(s) only, no
//! credentials, the allow list for a client's URL) and, for a client's pull, the
//! public-address guard.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use url::Url;

use super::url_policy::{self, AllowList, MAX_REDIRECTS};
use super::{finish_single, gguf_file_name, FetchCtx, Fetched};
use crate::blob::{Blob, BlobWriter};
use crate::error::{Result, StoreError};
use crate::manifest::Format;
use crate::progress::copy_with_progress;

/// The public Hugging Face Hub.
pub const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";

/// How to reach HTTP sources.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Hugging Face endpoint, without a trailing `/` (env `HF_ENDPOINT`).
    pub hf_endpoint: String,
    /// Bearer token for Hugging Face (env `HF_TOKEN`).
    pub hf_token: Option<String>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// Connect only to public addresses (every hop and redirect; see [`super::address`]).
    pub public_addresses_only: bool,
    /// Where set, every request of a plain URL source (each redirect too) must go to a
    /// location this list allows (a URL a client named; see [`super::url_policy`]).
    pub allowed_urls: Option<AllowList>,
}

impl HttpConfig {
    /// Reads `HF_ENDPOINT` and `HF_TOKEN` (or `HUGGING_FACE_HUB_TOKEN`).
    pub fn from_env() -> HttpConfig {
        let non_empty = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        HttpConfig {
            hf_endpoint: non_empty("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_HF_ENDPOINT.to_string())
                .trim_end_matches('/')
                .to_string(),
            hf_token: non_empty("HF_TOKEN").or_else(|| non_empty("HUGGING_FACE_HUB_TOKEN")),
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(60),
            public_addresses_only: false,
            allowed_urls: None,
        }
    }

    fn agent(&self) -> ureq::Agent {
        let builder = ureq::AgentBuilder::new()
            .timeout_connect(self.connect_timeout)
            .timeout_read(self.read_timeout)
            // Redirects are followed by `get`, which checks each hop first.
            .redirects(0)
            .user_agent(concat!("pagoda/", env!("CARGO_PKG_VERSION")));
        if self.public_addresses_only {
            builder
                .resolver(super::address::public_only_resolver())
                .build()
        } else {
            builder.build()
        }
    }

    /// The download URL of a file in a Hugging Face repo.
    pub fn hf_url(&self, repo: &str, revision: &str, file: &str) -> String {
        format!("{}/{repo}/resolve/{revision}/{file}", self.hf_endpoint)
    }

    /// The API URL listing a repo's files at a revision, with their sizes (`blobs=true`).
    pub fn hf_api_url(&self, repo: &str, revision: &str) -> String {
        format!(
            "{}/api/models/{repo}/revision/{revision}?blobs=true",
            self.hf_endpoint
        )
    }
}

/// Downloads a plain URL.
pub fn fetch_url(ctx: &FetchCtx<'_>, url: &str) -> Result<Fetched> {
    let no_query = url.split(['?', '#']).next().unwrap_or(url);
    let file_name = gguf_file_name(no_query, ctx.default_file_name);
    let target = Target {
        url,
        bearer: None,
        allow: ctx.http.allowed_urls.as_ref(),
    };
    let blob = download(ctx, &target, "", &file_name, true)?;
    Ok(Fetched::single_gguf(blob, file_name))
}

fn hf_hint(ctx: &FetchCtx<'_>, repo: &str, what: &str, revision: &str) -> String {
    format!(
        "; check that the repo '{repo}' has {what} at revision '{revision}'{}",
        if ctx.http.hf_token.is_some() {
            ""
        } else {
            ", and set HF_TOKEN for gated or private repos"
        }
    )
}

/// Downloads one file of a Hugging Face repo.
pub fn fetch_hf(ctx: &FetchCtx<'_>, repo: &str, file: &str, revision: &str) -> Result<Fetched> {
    let url = ctx.http.hf_url(repo, revision, file);
    let hint = hf_hint(ctx, repo, &format!("the file '{file}'"), revision);
    let file_name = gguf_file_name(file, ctx.default_file_name);
    let blob = download(ctx, &Target::hf(ctx, &url), &hint, &file_name, true)?;
    Ok(Fetched::single_gguf(blob, file_name))
}

/// Files of a repo folder that pagoda reads: weights, configs, tokenizer, chat templates.
pub(crate) fn wanted_in_folder(path: &str) -> bool {
    const SKIP_DIRS: [&str; 6] = ["onnx/", "openvino/", "coreml/", "tf/", "flax/", "runs/"];
    let lower = path.to_ascii_lowercase();
    let hidden = lower
        .split('/')
        .any(|s| s.starts_with('.') || s.is_empty() || s == "..");
    if hidden || SKIP_DIRS.iter().any(|d| lower.starts_with(d)) {
        return false;
    }
    [
        ".json",
        ".safetensors",
        ".txt",
        ".model",
        ".jinja",
        ".tiktoken",
    ]
    .iter()
    .any(|ext| lower.ends_with(ext))
}

/// Pulls a whole repo: a safetensors folder, or its only GGUF, or the GGUF whose name holds
/// `select` (a quantization tag like `Q4_K_M`).
pub fn fetch_hf_repo(
    ctx: &FetchCtx<'_>,
    repo: &str,
    revision: &str,
    select: Option<&str>,
) -> Result<Fetched> {
    let (files, sizes) = list_repo(ctx, repo, revision)?;
    let ggufs: Vec<&String> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    let pick = |candidates: Vec<&String>, wanted: &str| -> Result<String> {
        match candidates.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(StoreError::InvalidSource {
                source_text: format!("hf.co/{repo}:{wanted}"),
                reason: format!(
                    "no GGUF file in the repo matches '{wanted}'; it has: {}",
                    list_or_none(&ggufs)
                ),
            }),
            many => Err(StoreError::InvalidSource {
                source_text: format!("hf.co/{repo}:{wanted}"),
                reason: format!(
                    "'{wanted}' matches several files ({}); name one with hf://{repo}/<file>",
                    list_or_none(many)
                ),
            }),
        }
    };
    if let Some(sel) = select {
        let s = sel.to_ascii_lowercase();
        let matching: Vec<&String> = ggufs
            .iter()
            .copied()
            .filter(|f| {
                let name = f.rsplit('/').next().unwrap_or(f).to_ascii_lowercase();
                let stem = name.trim_end_matches(".gguf");
                stem.ends_with(&format!("-{s}"))
                    || stem.ends_with(&format!(".{s}"))
                    || stem.ends_with(&format!("_{s}"))
                    || stem == s
            })
            .collect();
        let file = pick(matching, sel)?;
        return fetch_hf(ctx, repo, &file, revision);
    }
    let has_config = files.iter().any(|f| f == "config.json");
    let has_safetensors = files.iter().any(|f| f.ends_with(".safetensors"));
    if has_config && has_safetensors {
        return fetch_folder(ctx, repo, revision, &files, &sizes);
    }
    if !ggufs.is_empty() {
        let file = pick(ggufs.clone(), "<quantization>")?;
        return fetch_hf(ctx, repo, &file, revision);
    }
    Err(StoreError::InvalidSource {
        source_text: format!("hf://{repo}"),
        reason: format!(
            "the repo has neither GGUF files nor config.json with .safetensors weights (files: {})",
            list_or_none(&files.iter().take(20).collect::<Vec<_>>())
        ),
    })
}

fn list_or_none(items: &[&String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn fetch_folder(
    ctx: &FetchCtx<'_>,
    repo: &str,
    revision: &str,
    files: &[String],
    sizes: &BTreeMap<String, u64>,
) -> Result<Fetched> {
    let wanted: Vec<&String> = files.iter().filter(|f| wanted_in_folder(f)).collect();
    let listed: Option<u64> = wanted.iter().map(|f| sizes.get(*f)).sum();
    if let Some(total) = listed {
        ctx.promise(total);
    }
    let mut out = Vec::new();
    for rel in wanted {
        let url = ctx.http.hf_url(repo, revision, rel);
        let hint = hf_hint(ctx, repo, &format!("the file '{rel}'"), revision);
        let blob = download(ctx, &Target::hf(ctx, &url), &hint, rel, false)?;
        out.push(super::folder_file(rel.clone(), blob));
    }
    Ok(Fetched {
        format: Format::HfFolder,
        files: out,
    })
}

/// File paths of a repo at a revision, from the Hub API, and the sizes it gives for them.
fn list_repo(
    ctx: &FetchCtx<'_>,
    repo: &str,
    revision: &str,
) -> Result<(Vec<String>, BTreeMap<String, u64>)> {
    let url = ctx.http.hf_api_url(repo, revision);
    let resp = get(
        ctx,
        &Target::hf(ctx, &url),
        &hf_hint(ctx, repo, "files", revision),
        None,
    )?;
    let text = resp.into_string().map_err(|e| StoreError::Network {
        url: url.clone(),
        message: format!("reading the repo listing: {e}"),
    })?;
    let body: serde_json::Value = serde_json::from_str(&text).map_err(|e| StoreError::Network {
        url: url.clone(),
        message: format!("the repo listing is not JSON: {e}"),
    })?;
    let siblings = body
        .get("siblings")
        .and_then(|s| s.as_array())
        .ok_or_else(|| StoreError::Network {
            url: url.clone(),
            message: "the repo listing has no 'siblings' array".into(),
        })?;
    let mut files = Vec::new();
    let mut sizes = BTreeMap::new();
    for sibling in siblings {
        let Some(f) = sibling.get("rfilename").and_then(|f| f.as_str()) else {
            continue;
        };
        if f.is_empty() || f.starts_with('/') || f.split('/').any(|s| s == "..") {
            continue;
        }
        if let Some(size) = sibling.get("size").and_then(|s| s.as_u64()) {
            sizes.insert(f.to_string(), size);
        }
        files.push(f.to_string());
    }
    files.sort();
    Ok((files, sizes))
}

/// What one download asks for: the URL, the bearer token for the Hugging Face endpoint, and
/// the allow list its hops are held to.
struct Target<'a> {
    url: &'a str,
    /// Sent only to hops on the Hugging Face endpoint's origin.
    bearer: Option<&'a str>,
    allow: Option<&'a AllowList>,
}

impl<'a> Target<'a> {
    /// A file of the configured Hugging Face endpoint (the operator's, so no allow list).
    fn hf(ctx: &FetchCtx<'a>, url: &'a str) -> Target<'a> {
        Target {
            url,
            bearer: ctx.http.hf_token.as_deref(),
            allow: None,
        }
    }
}

/// GETs `target`, following at most [`MAX_REDIRECTS`] redirects itself: each location is
/// resolved against the current URL and must pass [`url_policy::check_hop`] (and, for a
/// pull made for a client, name no private address literal) before it is requested.
fn get(
    ctx: &FetchCtx<'_>,
    target: &Target<'_>,
    hint: &str,
    range: Option<&str>,
) -> Result<ureq::Response> {
    let first = target.url;
    let refused = |at: &Url, reason: String| StoreError::UrlRefused {
        url: first.to_string(),
        location: url_policy::origin_text(at),
        reason,
    };
    let mut current = Url::parse(first).map_err(|e| StoreError::InvalidSource {
        source_text: first.to_string(),
        reason: format!("not a valid URL ({e})"),
    })?;
    let hf_origin = Url::parse(&ctx.http.hf_endpoint).ok();
    let agent = ctx.http.agent();
    for _ in 0..=MAX_REDIRECTS {
        url_policy::check_hop(&current, target.allow).map_err(|r| refused(&current, r))?;
        if ctx.http.public_addresses_only {
            super::address::check_literal(&current).map_err(|r| refused(&current, r))?;
        }
        let mut req = agent.request_url("GET", &current);
        if let Some(r) = range {
            req = req.set("Range", r);
        }
        let to_hf = hf_origin
            .as_ref()
            .is_some_and(|hf| url_policy::same_origin(hf, &current));
        if let (Some(token), true) = (target.bearer, to_hf) {
            req = req.set("Authorization", &format!("Bearer {token}"));
        }
        let resp = call(req, first, hint)?;
        if !matches!(resp.status(), 301 | 302 | 303 | 307 | 308) {
            if (300..400).contains(&resp.status()) {
                return Err(StoreError::HttpStatus {
                    url: first.to_string(),
                    status: resp.status(),
                    hint: hint.to_string(),
                });
            }
            return Ok(resp);
        }
        let location = resp.header("Location").unwrap_or_default();
        current = current.join(location).map_err(|e| {
            refused(
                &current,
                format!("it redirected to a location that is not a URL ({e})"),
            )
        })?;
    }
    Err(refused(
        &current,
        format!("more than {MAX_REDIRECTS} redirects"),
    ))
}

/// Sends one request; a 4xx/5xx and a transport failure become the store's errors.
fn call(req: ureq::Request, url: &str, hint: &str) -> Result<ureq::Response> {
    match req.call() {
        Ok(r) => Ok(r),
        Err(ureq::Error::Status(status, _)) => {
            let hint = match status {
                401 | 403 => format!("; access denied{hint}"),
                404 => format!("; not found{hint}"),
                _ => hint.to_string(),
            };
            Err(StoreError::HttpStatus {
                url: url.to_string(),
                status,
                hint,
            })
        }
        Err(ureq::Error::Transport(t)) => {
            let message = match t.message() {
                Some(m) => format!("{}: {m}", t.kind()),
                None => t.kind().to_string(),
            };
            let url = url.to_string();
            if unreachable(&t) {
                Err(StoreError::Unreachable { url, message })
            } else {
                Err(StoreError::Network { url, message })
            }
        }
    }
}

/// Whether a transport error means the host cannot be reached from here at all (a name that
/// does not resolve, a connection nothing accepts), as opposed to a failure after it answered
/// or an address the public-address guard refused.
fn unreachable(t: &ureq::Transport) -> bool {
    use std::error::Error as _;
    let refused_by_guard = t
        .source()
        .and_then(|s| s.downcast_ref::<io::Error>())
        .is_some_and(|e| e.kind() == io::ErrorKind::PermissionDenied);
    !refused_by_guard
        && matches!(
            t.kind(),
            ureq::ErrorKind::Dns
                | ureq::ErrorKind::ConnectionFailed
                | ureq::ErrorKind::ProxyConnect
        )
}

/// Streams `url` into a blob. `single` marks the model's one GGUF file (magic and digest checked).
///
/// When the digest is known, the download resumes a partial file an earlier pull left (HTTP
/// `Range`); a server that answers the range with the whole body (200) starts it over.
fn download(
    ctx: &FetchCtx<'_>,
    target: &Target<'_>,
    hint: &str,
    file_name: &str,
    single: bool,
) -> Result<Blob> {
    let resumable = match (single, ctx.expected) {
        (true, Some(d)) => BlobWriter::resumable(ctx.blobs_dir, d)?,
        _ => None,
    };
    let can_resume = resumable.is_some();
    let url = target.url;
    let mut w = match resumable {
        Some(w) => w,
        None => BlobWriter::create(ctx.blobs_dir)?,
    };
    let offset = w.written();
    let range = (offset > 0).then(|| format!("bytes={offset}-"));
    let resp = match get(ctx, target, hint, range.as_deref()) {
        // The partial is already whole (or the server cannot serve the range): start over.
        Err(StoreError::HttpStatus { status: 416, .. }) => {
            w.restart()?;
            get(ctx, target, hint, None)?
        }
        other => other?,
    };
    let resumed = offset > 0 && resp.status() == 206;
    if offset > 0 && !resumed {
        w.restart()?;
    }
    if resumed {
        ctx.progress
            .suspend(|| tracing::info!("resuming {file_name} at byte {offset}"));
    }
    let remaining: Option<u64> = resp
        .header("Content-Length")
        .and_then(|v| v.trim().parse().ok());
    let total = remaining.map(|r| r + w.written());
    if let (true, Some(total)) = (single, total) {
        ctx.promise(total);
    }
    ctx.progress.begin_file();
    ctx.progress.advance(w.written());
    let mut body = resp.into_reader();
    let copied = copy_with_progress(&mut body, &mut w, |n| ctx.progress.advance(n));
    let again = if can_resume {
        "; run the pull again to resume"
    } else {
        ""
    };
    match copied {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(StoreError::Truncated {
                url: url.to_string(),
                got: w.written(),
                expected: total.unwrap_or(0),
            })
        }
        Err(e) => {
            return Err(StoreError::Network {
                url: url.to_string(),
                message: format!("connection failed after {} bytes: {e}{again}", w.written()),
            })
        }
    }
    if let Some(t) = total {
        if w.written() != t {
            return Err(StoreError::Truncated {
                url: url.to_string(),
                got: w.written(),
                expected: t,
            });
        }
    }
    let blob = if single {
        finish_single(w, ctx, url)?
    } else {
        w.finish(None, url)?
    };
    ctx.progress.finish_file(file_name, blob.size);
    Ok(blob)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_file_selection() {
        for yes in [
            "config.json",
            "model-00001-of-00002.safetensors",
            "tokenizer.model",
            "1_Pooling/config.json",
            "vocab.txt",
        ] {
            assert!(wanted_in_folder(yes), "{yes}");
        }
        for no in [
            ".gitattributes",
            "pytorch_model.bin",
            "onnx/model.onnx",
            "onnx/config.json",
            "README.md",
            "a/../b.json",
        ] {
            assert!(!wanted_in_folder(no), "{no}");
        }
    }
}
