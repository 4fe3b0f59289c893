//! API keys as both front doors hold them: a key's plaintext is turned into `sha256:<64 hex>`
//! at once and only that form is kept or compared; clients present keys as
//! `Authorization: Bearer KEY`, as OpenAI's clients send them.
//!
//! Invariants: [`hash_key`] is the one place a plaintext becomes a hash; [`is_key_hash`]
//! accepts exactly what [`hash_key`] writes (any letter case of the hex digits).

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};

const PREFIX: &str = "sha256:";

/// `sha256:<64 lowercase hex>` of a key's plaintext: the only form in which keys are stored.
pub fn hash_key(plaintext: &str) -> String {
    format!(
        "{PREFIX}{}",
        hex::encode(Sha256::digest(plaintext.as_bytes()))
    )
}

/// Whether `s` has the form [`hash_key`] writes: `sha256:` and 64 hex digits.
pub fn is_key_hash(s: &str) -> bool {
    s.strip_prefix(PREFIX)
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Why a request's `Authorization` header holds no usable bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BearerError {
    /// No `Authorization` header.
    Missing,
    /// A header that is not `Bearer <token>` (another scheme, no token, spaces in it).
    Malformed,
}

/// The token of an `Authorization: Bearer <token>` header value (the scheme in any case,
/// as RFC 9110 allows).
pub fn parse_bearer(header_value: Option<&str>) -> Result<&str, BearerError> {
    let value = header_value.ok_or(BearerError::Missing)?.trim();
    let (scheme, token) = value.split_once(' ').ok_or(BearerError::Malformed)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer")
        || token.is_empty()
        || token.contains(char::is_whitespace)
    {
        return Err(BearerError::Malformed);
    }
    Ok(token)
}

/// [`parse_bearer`] of a request's headers.
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, BearerError> {
    match headers.get(header::AUTHORIZATION) {
        None => Err(BearerError::Missing),
        Some(v) => parse_bearer(Some(v.to_str().map_err(|_| BearerError::Malformed)?)),
    }
}

/// Whether two strings are equal, in time that depends on their lengths only (for comparing
/// a presented key's hash with the stored ones).
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn hashes_are_sha256_hex_and_recognised() {
        let h = hash_key("pk-test");
        assert!(is_key_hash(&h));
        assert_eq!(h.len(), 7 + 64);
        // The published SHA-256 of the empty string.
        assert_eq!(
            hash_key(""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(is_key_hash(
            &h.to_ascii_uppercase().replace("SHA256:", "sha256:")
        ));
        for bad in [
            "",
            "sha256:",
            "pk-test",
            "sha256:xyz",
            &h[..70],
            &format!("{h}0"),
        ] {
            assert!(!is_key_hash(bad), "{bad:?}");
        }
    }

    #[test]
    fn bearer_tokens_are_read_and_others_refused() {
        assert_eq!(parse_bearer(Some("Bearer pk-abc")), Ok("pk-abc"));
        assert_eq!(parse_bearer(Some("bearer  pk-abc ")), Ok("pk-abc"));
        assert_eq!(parse_bearer(None), Err(BearerError::Missing));
        for bad in ["", "Bearer", "Bearer ", "Basic abc", "pk-abc", "Bearer a b"] {
            assert_eq!(
                parse_bearer(Some(bad)),
                Err(BearerError::Malformed),
                "{bad:?}"
            );
        }
        let mut headers = HeaderMap::new();
        assert_eq!(bearer_token(&headers), Err(BearerError::Missing));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        assert_eq!(bearer_token(&headers), Ok("k"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_bytes(b"Bearer \xff").unwrap(),
        );
        assert_eq!(bearer_token(&headers), Err(BearerError::Malformed));
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq("abc", "abc"));
        assert!(!constant_time_eq("abc", "abd"));
        assert!(!constant_time_eq("abc", "ab"));
        assert!(constant_time_eq("", ""));
    }
}
