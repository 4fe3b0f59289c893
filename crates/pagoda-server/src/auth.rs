//! API keys on `pagoda serve` itself (`--api-key`, `--api-key-file`), for deployments without
//! the gateway in front: every route but the probes and the chat page's static files needs
//! `Authorization: Bearer KEY` (the page's files hold no data; what the page then asks the
//! API for needs the key like any other client's request); anything else gets 401 in the route's error shape (OpenAI's,
//! Ollama's under `/api`) with `WWW-Authenticate: Bearer`.
//!
//! Invariants: keys are held only as `sha256:` hashes (pagoda-http's [`hash_key`]); a key
//! file holds hashes, never plaintext, so a leaked file reveals no key; with no key
//! configured every request passes, as before. `/health`, `/ready` and `/metrics` stay open
//! so probes and scrapers need no secret (as vLLM's `--api-key` leaves them).

use crate::error::ApiError;
use axum::http::HeaderMap;
use pagoda_http::api_key::{bearer_token, constant_time_eq, hash_key, is_key_hash, BearerError};
use std::path::Path;

/// Paths answered without a key: the probes and the scrape (and the chat page's static files,
/// [`crate::chat_page::is_page_file`]).
const OPEN_PATHS: &[&str] = &["/health", "/ready", "/metrics"];

/// The keys a server accepts, as hashes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ApiKeys {
    hashes: Vec<String>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.hashes.len())
    }
}

/// Why the keys could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    #[error("cannot read the API key file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}, line {line}: expected `sha256:` and 64 hex digits (a key's hash, never the key itself); make one with `pagoda gateway keys hash KEY`"
    )]
    NotAHash { path: String, line: usize },
    #[error("an empty --api-key would admit nobody; give the key, or leave the flag out")]
    EmptyKey,
}

impl ApiKeys {
    /// Keys from plaintexts (`--api-key`, hashed here at once) and key files (`--api-key-file`:
    /// one `sha256:<hex>` per line, then optionally a space and a label; `#` starts a comment
    /// line, blank lines are skipped).
    pub fn new(plaintexts: &[String], files: &[impl AsRef<Path>]) -> Result<ApiKeys, ApiKeyError> {
        let mut hashes = Vec::new();
        for key in plaintexts {
            if key.trim().is_empty() {
                return Err(ApiKeyError::EmptyKey);
            }
            hashes.push(hash_key(key));
        }
        for file in files {
            let path = file.as_ref();
            let text = std::fs::read_to_string(path).map_err(|source| ApiKeyError::Read {
                path: path.display().to_string(),
                source,
            })?;
            hashes.extend(parse_key_file(&text, &path.display().to_string())?);
        }
        hashes.sort();
        hashes.dedup();
        Ok(ApiKeys { hashes })
    }

    /// Whether any key is required.
    pub fn enabled(&self) -> bool {
        !self.hashes.is_empty()
    }

    /// Whether `presented` (a plaintext key) is one of the keys. Every stored hash is
    /// compared, each in constant time.
    pub fn admits(&self, presented: &str) -> bool {
        let h = hash_key(presented);
        self.hashes
            .iter()
            .fold(false, |found, k| constant_time_eq(k, &h) | found)
    }
}

/// The hashes of a key file's text (see [`ApiKeys::new`]); `path` names it in errors.
pub fn parse_key_file(text: &str, path: &str) -> Result<Vec<String>, ApiKeyError> {
    let mut hashes = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let hash = line.split_whitespace().next().unwrap_or_default();
        if !is_key_hash(hash) {
            return Err(ApiKeyError::NotAHash {
                path: path.to_string(),
                line: i + 1,
            });
        }
        hashes.push(hash.to_ascii_lowercase());
    }
    Ok(hashes)
}

/// Whether a request for `path` with `headers` may pass `keys`: `Ok` when no key is
/// configured, the path is open, or a configured key is presented; otherwise the 401 to send
/// (app.rs writes it in the route's shape with `WWW-Authenticate: Bearer`).
pub fn check(keys: &ApiKeys, path: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    if !keys.enabled() || OPEN_PATHS.contains(&path) || crate::chat_page::is_page_file(path) {
        return Ok(());
    }
    let message = match bearer_token(headers) {
        Ok(key) if keys.admits(key) => return Ok(()),
        Ok(_) => "invalid API key",
        Err(BearerError::Missing) => {
            "this server needs an API key: send `Authorization: Bearer <key>` (the key given to `pagoda serve --api-key`)"
        }
        Err(BearerError::Malformed) => "the Authorization header must be `Bearer <key>`",
    };
    Err(ApiError::unauthorized(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_keys_are_hashed_and_admitted() {
        let keys = ApiKeys::new(&["pk-one".into(), "pk-two".into()], &[] as &[&str]).unwrap();
        assert!(keys.enabled());
        assert!(keys.admits("pk-one") && keys.admits("pk-two"));
        assert!(!keys.admits("pk-three") && !keys.admits("") && !keys.admits("pk-one "));
        assert!(!format!("{keys:?}").contains("pk-one"));
        assert!(!ApiKeys::default().enabled());
        assert!(matches!(
            ApiKeys::new(&[" ".into()], &[] as &[&str]),
            Err(ApiKeyError::EmptyKey)
        ));
    }

    #[test]
    fn key_files_hold_hashes_with_labels_and_comments() {
        let h = hash_key("pk-file");
        let text = format!(
            "# team keys\n\n{} alice\n  {h}\n",
            h.to_ascii_uppercase().replace("SHA256", "sha256")
        );
        assert_eq!(parse_key_file(&text, "k").unwrap(), vec![h.clone(), h]);
        let err = parse_key_file("# ok\npk-plaintext\n", "keys.txt").unwrap_err();
        assert_eq!(
            err.to_string().split(':').next().unwrap(),
            "keys.txt, line 2"
        );
    }

    #[test]
    fn check_opens_probes_and_needs_a_key_elsewhere() {
        let keys = ApiKeys::new(&["pk".into()], &[] as &[&str]).unwrap();
        let mut headers = HeaderMap::new();
        for open in OPEN_PATHS {
            assert!(check(&keys, open, &headers).is_ok(), "{open}");
        }
        let e = check(&keys, "/v1/models", &headers).unwrap_err();
        assert_eq!(e.status.as_u16(), 401);
        assert!(e.message.contains("Authorization: Bearer"), "{}", e.message);
        headers.insert("authorization", "Bearer nope".parse().unwrap());
        assert_eq!(
            check(&keys, "/api/tags", &headers).unwrap_err().message,
            "invalid API key"
        );
        headers.insert("authorization", "Bearer pk".parse().unwrap());
        assert!(check(&keys, "/api/tags", &headers).is_ok());
        assert!(check(&ApiKeys::default(), "/v1/models", &HeaderMap::new()).is_ok());
        let none = HeaderMap::new();
        assert!(check(&keys, "/", &none).is_ok() && check(&keys, "/chat/chat.js", &none).is_ok());
        assert!(check(&keys, "/chat/other.js", &none).is_err());
    }

    #[test]
    fn a_missing_key_file_is_an_error_naming_it() {
        let err = ApiKeys::new(&[], &["/nonexistent/keys"]).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/keys"), "{err}");
    }
}
