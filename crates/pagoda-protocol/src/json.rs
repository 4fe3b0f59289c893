//! Reading a JSON request body into a wire type with bounded nesting: [`parse_body`].
//!
//! serde_json limits recursion only where it builds values; a field the wire type ignores is
//! skipped with an explicit stack, so `{"x":[[[[...]]]]}` a hundred thousand levels deep is
//! accepted and walked. [`check_depth`] scans the bytes once (strings and escapes skipped)
//! and refuses anything deeper than [`MAX_DEPTH`] before serde sees it.
//!
//! Invariant: [`parse_body`] never panics and never recurses on the input; every refusal is a
//! [`BodyError`] whose message says what to change.

use serde::de::DeserializeOwned;

/// Deepest nesting of arrays and objects a request body may have. Real requests need a
/// handful of levels (a JSON schema for structured output perhaps a dozen or two).
pub const MAX_DEPTH: usize = 64;

/// Why a request body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the request body is empty; send a JSON object")]
    Empty,
    #[error("the request body nests arrays and objects deeper than {limit} levels")]
    TooDeep { limit: usize },
    #[error("the request body is not valid JSON: {0}")]
    Syntax(String),
    #[error("invalid request: {0}")]
    Invalid(String),
}

/// Refuses `bytes` when arrays and objects nest deeper than `limit` (brackets inside strings
/// do not count). Malformed JSON passes when it is shallow: serde reports it afterwards.
pub fn check_depth(bytes: &[u8], limit: usize) -> Result<(), BodyError> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Err(BodyError::TooDeep { limit });
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Parses a request body as `T`: empty bodies, nesting past [`MAX_DEPTH`], syntax errors and
/// shape errors (serde's message names the field and position) each get their own error.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(BodyError::Empty);
    }
    check_depth(bytes, MAX_DEPTH)?;
    serde_json::from_slice(bytes).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            BodyError::Syntax(e.to_string())
        } else {
            BodyError::Invalid(e.to_string())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nested(levels: usize) -> String {
        format!(
            "{{\"model\":\"m\",\"ignored\":{}{}}}",
            "[".repeat(levels),
            "]".repeat(levels)
        )
    }

    #[test]
    fn deep_nesting_inside_an_ignored_field_is_refused() {
        let body = nested(100_000);
        let r: Result<serde_json::Value, _> = parse_body(body.as_bytes());
        assert_eq!(r, Err(BodyError::TooDeep { limit: MAX_DEPTH }));
    }

    #[test]
    fn nesting_up_to_the_limit_parses() {
        // The outer object is one level.
        let body = nested(MAX_DEPTH - 1);
        let v: serde_json::Value = parse_body(body.as_bytes()).expect("within the limit");
        assert_eq!(v["model"], "m");
        assert!(check_depth(nested(MAX_DEPTH).as_bytes(), MAX_DEPTH).is_err());
    }

    #[test]
    fn brackets_and_escaped_quotes_in_strings_do_not_count() {
        let s = format!(
            "{{\"content\":\"{} \\\" {}\"}}",
            "[".repeat(500),
            "{".repeat(500)
        );
        let v: serde_json::Value = parse_body(s.as_bytes()).expect("strings are not nesting");
        assert!(v["content"].as_str().is_some_and(|c| c.contains("\" {")));
    }

    #[test]
    fn empty_syntax_and_shape_errors_are_told_apart() {
        #[derive(serde::Deserialize, Debug)]
        struct Req {
            #[allow(dead_code)]
            model: String,
        }
        assert_eq!(parse_body::<Req>(b"  \n").unwrap_err(), BodyError::Empty);
        assert!(matches!(
            parse_body::<Req>(b"{\"model\":"),
            Err(BodyError::Syntax(_))
        ));
        assert!(matches!(
            parse_body::<Req>(b"{\"model\":3}"),
            Err(BodyError::Invalid(m)) if m.contains("invalid type")
        ));
    }

    proptest! {
        /// The scan agrees with a parser: whatever serde_json reads as a value of depth d,
        /// check_depth accepts at limit d and refuses below it.
        #[test]
        fn depth_scan_matches_the_parsed_depth(v in arb_json()) {
            fn depth(v: &serde_json::Value) -> usize {
                match v {
                    serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
                    serde_json::Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
                    _ => 0,
                }
            }
            let text = serde_json::to_string(&v).expect("serializes");
            let d = depth(&v);
            prop_assert!(check_depth(text.as_bytes(), d).is_ok());
            if d > 0 {
                prop_assert!(check_depth(text.as_bytes(), d - 1).is_err());
            }
        }

        /// Arbitrary bytes never panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_body::<serde_json::Value>(&bytes);
        }
    }

    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i32>().prop_map(serde_json::Value::from),
            "[\\[\\]{}\"\\\\a-z ]{0,8}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(6, 48, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("[a-z\\[{\"]{0,4}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
