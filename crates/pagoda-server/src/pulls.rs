//! What a client may make the server download (`POST /api/pull`): [`check`] against the
//! operator's [`PullPolicy`], and [`refusal`], the client's view of a failed pull.
//!
//! Off by default (403). When the operator enables it, a client may pull catalog names, and
//! sources the operator listed (`hf`, `pip`, `https://host`, `s3://bucket`); never a local path or
//! `file://`. A URL is judged on the one `url::Url` it parses to — the one the fetcher requests
//! — and every redirect of its download is judged again by the fetcher against the same allow
//! list (pagoda-store's `fetch::url_policy`). Unless the operator allows private addresses, the
//! download itself connects only to public addresses (pagoda-store's address guard, which also
//! covers redirects and DNS).
//!
//! Invariants: a refusal never depends on what exists on the server's disk or network; an
//! error sent back never quotes fetched bytes, store paths or internal errors (those are kept
//! as the error's detail, for the log).

use crate::error::ApiError;
use crate::state::PullPolicy;
use pagoda_store::fetch::url_policy::{self, AllowList};
use pagoda_store::{Source, Store, StoreError};

/// Refuses `name` unless the policy lets a client pull it. `Ok(Some(list))`: a source the
/// client named, whose download (each redirect too) must stay within `list`; `Ok(None)`: a
/// catalog name (the catalog's own sources are the operator's).
///
/// A URL is decided on the `url::Url` [`Source::parse`] made of it, which is the URL the
/// fetcher requests; the fetcher checks every hop against the same list again.
pub fn check(
    policy: &PullPolicy,
    store: &Store,
    name: &str,
) -> Result<Option<AllowList>, ApiError> {
    if !policy.enabled {
        return Err(ApiError::forbidden(
            "pulling models over HTTP is off on this server; run `pagoda pull NAME` where it runs, or start it with --allow-pull",
        ));
    }
    let refuse = |what: &str| {
        ApiError::invalid_param(
            "model",
            format!("{what} cannot be pulled over HTTP on this server; pull a catalog name, or ask the operator to allow the source (--pull-allow-source)"),
        )
        .with_code("source_not_allowed")
    };
    let lower = name.trim().to_ascii_lowercase();
    if lower.starts_with("file:") {
        return Err(refuse("a file:// source"));
    }
    let list = url_allow_list(&policy.allowed_sources).map_err(|e| {
        ApiError::internal(String::new()).with_detail(format!("--pull-allow-source {e}"))
    })?;
    match Source::parse(name) {
        Err(_) => Err(refuse("this source")),
        Ok(None) => {
            if pagoda_store::catalog::lookup_in(store.catalog(), name).is_some() {
                Ok(None)
            } else if pagoda_store::source::looks_like_path(name) {
                Err(refuse("a local path"))
            } else {
                Err(ApiError::model_not_found(name).with_message(format!(
                    "`{name}` is not in the catalog; over HTTP only catalog names (and the sources the operator allows) can be pulled"
                )))
            }
        }
        Ok(Some(Source::Path(_))) => Err(refuse("a local path")),
        Ok(Some(Source::Url(url))) => match url_policy::Url::parse(&url) {
            Ok(parsed) if url_policy::check_hop(&parsed, Some(&list)).is_ok() => Ok(Some(list)),
            _ => Err(refuse("this URL")),
        },
        // `--pull-allow-source s3://bucket` allows that bucket (the host part of the URL).
        Ok(Some(Source::Object(url))) => match url_policy::parse_object_url(&url) {
            Ok(parsed) if list.allows(&parsed) => Ok(Some(list)),
            _ => Err(refuse("this object storage location")),
        },
        Ok(Some(Source::HfFile { .. } | Source::HfRepo { .. })) => {
            allows_kind(&policy.allowed_sources, "hf")
                .map(|()| Some(list))
                .ok_or_else(|| refuse("a Hugging Face source"))
        }
        Ok(Some(Source::Pip(_) | Source::PipFolder { .. })) => {
            allows_kind(&policy.allowed_sources, "pip")
                .map(|()| Some(list))
                .ok_or_else(|| refuse("a pip source"))
        }
    }
}

/// The URL and bucket entries of `--pull-allow-source` (all but `hf` and `pip`) as an
/// [`AllowList`]; `Err` names an entry that is not `scheme://host[:port]`.
pub fn url_allow_list(allowed_sources: &[String]) -> Result<AllowList, String> {
    AllowList::new(
        allowed_sources
            .iter()
            .map(String::as_str)
            .filter(|a| !is_kind(a)),
    )
}

fn is_kind(entry: &str) -> bool {
    entry.eq_ignore_ascii_case("hf") || entry.eq_ignore_ascii_case("pip")
}

fn allows_kind(allowed: &[String], kind: &str) -> Option<()> {
    allowed
        .iter()
        .any(|a| a.eq_ignore_ascii_case(kind))
        .then_some(())
}

/// A failed pull as the client sees it: whose fault, in words that quote nothing fetched.
pub fn refusal(name: &str, e: StoreError) -> ApiError {
    let detail = e.to_string();
    let error = match e {
        StoreError::UnknownModel { .. } | StoreError::InvalidName { .. } => {
            ApiError::model_not_found(name)
        }
        StoreError::InvalidSource { .. } => {
            ApiError::invalid_param("model", format!("`{name}` is not a valid model source"))
        }
        StoreError::NotAModel { .. } => ApiError::invalid_param(
            "model",
            format!("`{name}` is not a model Pagoda can store (not a GGUF file or a Hugging Face folder)"),
        ),
        StoreError::Unloadable { .. } => ApiError::invalid_param(
            "model",
            format!("`{name}` was fetched but is not a model Pagoda can load, so nothing was stored"),
        )
        .with_code("model_load_failed"),
        // The refused location came from the source: it is not quoted back.
        StoreError::UrlRefused { .. } => ApiError::invalid_param(
            "model",
            format!("`{name}` (or a redirect from it) leads to a location this server does not fetch from: only http and https URLs without credentials, on hosts the operator allows, at public addresses unless the operator allows private ones"),
        )
        .with_code("source_not_allowed"),
        StoreError::HttpStatus { status, .. } => ApiError::upstream(format!(
            "the source of `{name}` answered HTTP {status}"
        )),
        StoreError::Network { .. }
        | StoreError::Unreachable { .. }
        | StoreError::Truncated { .. }
        | StoreError::ObjectStore { .. }
        | StoreError::ShaMismatch { .. }
        | StoreError::Pip { .. }
        | StoreError::WheelMember { .. }
        | StoreError::AllSourcesFailed { .. } => ApiError::upstream(format!(
            "`{name}` could not be downloaded (the source is unreachable, refused, or sent something else)"
        )),
        _ => ApiError::internal(String::new()),
    };
    error.with_detail(detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::open(Some(dir.path().join("store"))).expect("store");
        (dir, store)
    }

    fn on(sources: &[&str]) -> PullPolicy {
        PullPolicy {
            enabled: true,
            allowed_sources: sources.iter().map(|s| s.to_string()).collect(),
            allow_private: false,
        }
    }

    #[test]
    fn pulls_are_off_by_default() {
        let (_d, s) = store();
        let e = check(&PullPolicy::default(), &s, "smollm2:135m").expect_err("off");
        assert_eq!(e.status, 403);
    }

    #[test]
    fn catalog_names_only_unless_sources_are_allowed() {
        let (_d, s) = store();
        let p = on(&[]);
        assert!(check(&p, &s, "smollm2:135m").is_ok());
        for refused in [
            "file:///etc/passwd",
            "FILE:/etc/passwd",
            "/etc/passwd",
            "./x.gguf",
            "http://127.0.0.1:9/x.gguf",
            "https://example.com/x.gguf",
            "hf://owner/repo/x.gguf",
            "pip://pkg==1.0/x.gguf",
        ] {
            let e = check(&p, &s, refused).expect_err(refused);
            assert_eq!(e.status, 400, "{refused}");
        }
        assert_eq!(
            check(&p, &s, "no-such-model:7b")
                .expect_err("unknown")
                .status,
            404
        );
    }

    #[test]
    fn allowed_sources_match_scheme_and_host() {
        let (_d, s) = store();
        let p = on(&["https://models.example.com", "https://*.cdn.example", "hf"]);
        assert!(check(&p, &s, "https://models.example.com/a.gguf").is_ok());
        assert!(check(&p, &s, "HTTPS://MODELS.example.com:443/a.gguf").is_ok());
        assert!(check(&p, &s, "https://eu.cdn.example/a.gguf").is_ok());
        assert!(check(&p, &s, "hf://owner/repo/a.gguf").is_ok());
        // A client's URL is held to the list through its redirects; a catalog name is not.
        assert!(check(&p, &s, "https://models.example.com/a.gguf")
            .expect("allowed")
            .is_some());
        assert!(check(&p, &s, "smollm2:135m").expect("catalog").is_none());
        for refused in [
            "http://models.example.com/a.gguf",
            "https://models.example.com.evil.io/a.gguf",
            "https://evil.io/models.example.com/a.gguf",
            "https://evil.io#@models.example.com/a.gguf",
            "https://evil.io\\@models.example.com/a.gguf",
            "https://127.0.0.1:9\\@models.example.com/a.gguf",
            "https://models.example.com@evil.io/a.gguf",
            "https://user@models.example.com/a.gguf",
            "https://models.example.com:8443/a.gguf",
            "https://models.exa\tmple.com/a.gguf",
            "https:/evil.io/a.gguf",
            "https://[::1]/a.gguf",
            "https://cdn.example/a.gguf",
            "pip://pkg==1.0/x.gguf",
            "s3://models/a.gguf",
        ] {
            assert!(check(&p, &s, refused).is_err(), "{refused}");
        }
        // A bucket is allowed by naming it.
        let p = on(&["s3://team-models"]);
        assert!(check(&p, &s, "s3://team-models/qwen/q8.gguf").is_ok());
        assert!(check(&p, &s, "s3://other-bucket/q8.gguf").is_err());
        assert!(check(&p, &s, "gs://team-models/q8.gguf").is_err());
        assert!(check(&p, &s, "s3://other\\@team-models/q8.gguf").is_err());
        assert!(check(&p, &s, "s3://x@team-models/q8.gguf").is_err());
    }

    #[test]
    fn refused_redirects_are_the_clients_400_and_quote_no_location() {
        let e = refusal(
            "https://models.example.com/a.gguf",
            StoreError::UrlRefused {
                url: "https://models.example.com/a.gguf".into(),
                location: "file:".into(),
                reason: "the scheme `file:` is not fetched".into(),
            },
        );
        assert_eq!(e.status, 400);
        assert!(!e.message.contains("file:"), "{}", e.message);
        assert!(e.detail.as_deref().is_some_and(|d| d.contains("file:")));
    }

    #[test]
    fn failed_pulls_quote_nothing_fetched() {
        let e = refusal(
            "https://x/y.gguf",
            StoreError::NotAModel {
                path: "/root/.pagoda/blobs/partial-1".into(),
                reason: "AWS_SECRET=abc".into(),
            },
        );
        assert_eq!(e.status, 400);
        assert!(!e.message.contains("AWS") && !e.message.contains("/root"));
        assert!(e.detail.as_deref().is_some_and(|d| d.contains("/root")));
        let e = refusal(
            "https://x/y.gguf",
            StoreError::Network {
                url: "https://x/y.gguf".into(),
                message: "connection refused".into(),
            },
        );
        assert_eq!(e.status, 502);
        assert!(!e.message.contains("connection refused"));
    }
}
