//! URL and Hugging Face sources: one file over HTTP(S), streamed to a blob.
//!
//! Owns [`HttpConfig`] (endpoint, token, timeouts) and the download loop. Invariants: the body is
//! streamed straight into a [`BlobWriter`] (never held in memory); a body shorter than its
//! Content-Length, a non-2xx status or a digest mismatch is an error and leaves no blob; the
//! Hugging Face token is only sent to the Hugging Face endpoint.

use std::io;
use std::time::Duration;

use super::{finish_single, gguf_file_name, FetchCtx, Fetched};
use crate::blob::BlobWriter;
use crate::error::{Result, StoreError};
use crate::progress::{bytes_bar, copy_with_progress};

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
        }
    }

    fn agent(&self) -> ureq::Agent {
        ureq::AgentBuilder::new()
            .timeout_connect(self.connect_timeout)
            .timeout_read(self.read_timeout)
            .user_agent(concat!("pagoda/", env!("CARGO_PKG_VERSION")))
            .build()
    }

    /// The download URL of a file in a Hugging Face repo.
    pub fn hf_url(&self, repo: &str, revision: &str, file: &str) -> String {
        format!("{}/{repo}/resolve/{revision}/{file}", self.hf_endpoint)
    }
}

/// Downloads a plain URL.
pub fn fetch_url(ctx: &FetchCtx<'_>, url: &str) -> Result<Fetched> {
    let no_query = url.split(['?', '#']).next().unwrap_or(url);
    let file_name = gguf_file_name(no_query, ctx.default_file_name);
    download(ctx, url, None, "", &file_name)
}

/// Downloads one file of a Hugging Face repo.
pub fn fetch_hf(ctx: &FetchCtx<'_>, repo: &str, file: &str, revision: &str) -> Result<Fetched> {
    let url = ctx.http.hf_url(repo, revision, file);
    let hint = format!(
        "; check that the repo '{repo}' has the file '{file}' at revision '{revision}'{}",
        if ctx.http.hf_token.is_some() {
            ""
        } else {
            ", and set HF_TOKEN for gated or private repos"
        }
    );
    let file_name = gguf_file_name(file, ctx.default_file_name);
    download(ctx, &url, ctx.http.hf_token.as_deref(), &hint, &file_name)
}

fn download(
    ctx: &FetchCtx<'_>,
    url: &str,
    bearer: Option<&str>,
    hint: &str,
    file_name: &str,
) -> Result<Fetched> {
    let mut req = ctx.http.agent().get(url);
    if let Some(token) = bearer {
        req = req.set("Authorization", &format!("Bearer {token}"));
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(status, _)) => {
            let hint = match status {
                401 | 403 => format!("; access denied{hint}"),
                404 => format!("; not found{hint}"),
                _ => hint.to_string(),
            };
            return Err(StoreError::HttpStatus {
                url: url.to_string(),
                status,
                hint,
            });
        }
        Err(ureq::Error::Transport(t)) => {
            return Err(StoreError::Network {
                url: url.to_string(),
                message: match t.message() {
                    Some(m) => format!("{}: {m}", t.kind()),
                    None => t.kind().to_string(),
                },
            })
        }
    };
    let total: Option<u64> = resp
        .header("Content-Length")
        .and_then(|v| v.trim().parse().ok());
    let bar = bytes_bar(ctx.progress, total, format!("pulling {file_name}"));
    let mut w = BlobWriter::create(ctx.blobs_dir)?;
    let mut body = resp.into_reader();
    let copied = copy_with_progress(&mut body, &mut w, &bar);
    bar.finish_and_clear();
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
                message: format!("connection failed after {} bytes: {e}", w.written()),
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
    let blob = finish_single(w, ctx, url)?;
    Ok(Fetched::single_gguf(blob, file_name.to_string()))
}
