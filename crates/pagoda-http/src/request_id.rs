//! `x-request-id`: the header, which client-sent ids are kept, and fresh ids.
//!
//! Invariant: an id that passes [`is_acceptable`] is short and plain (1..=[`MAX_LEN`] of
//! `A-Z a-z 0-9 . _ : -`), so it can neither break a header nor forge a log line.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The request and response header.
pub const HEADER: &str = "x-request-id";
/// The longest client-sent id that is kept.
pub const MAX_LEN: usize = 128;

/// Whether a client-sent id may be used as is.
pub fn is_acceptable(id: &str) -> bool {
    (1..=MAX_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// A fresh id: `req-`, the second of the call and a process-wide counter, in hex.
pub fn new_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("req-{t:x}{n:06x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_short_ids_are_kept_and_others_refused() {
        assert!(is_acceptable("abc-123_x.y:z"));
        assert!(is_acceptable(&"a".repeat(MAX_LEN)));
        assert!(!is_acceptable(""));
        assert!(!is_acceptable(&"a".repeat(MAX_LEN + 1)));
        assert!(!is_acceptable("a b"));
        assert!(!is_acceptable("a\nb"));
        assert!(!is_acceptable("ünï"));
    }

    #[test]
    fn fresh_ids_differ_and_are_acceptable() {
        let (a, b) = (new_id(), new_id());
        assert_ne!(a, b);
        assert!(is_acceptable(&a));
    }
}
