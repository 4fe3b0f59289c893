//! A call block read as far as it is written: the calls of a body so far, each with its name
//! and the part of its arguments (JSON text) already decided ([`Partial`]), which
//! [`super::marked::MarkedCalls`] streams as the body grows. Also the pieces the families'
//! readers share: JSON call objects in a row ([`json_calls_so_far`]), JSON text minified as
//! it comes ([`minify`]), top-level splitting that respects JSON strings
//! ([`split_top_level`]).
//!
//! Invariant (what every [`super::marked::BlockSyntax::stream`] keeps, and what makes the
//! streamed pieces the same for any split of the output): for a body `a` and a longer body
//! `b` that begins with `a`, the calls of `a` are a prefix of the calls of `b` with the same
//! names, the arguments of each call of `a` begin those of the same call of `b`, a call of `a`
//! that is `done` is unchanged in `b` (its `end` too), and every call but the last is `done`;
//! the same holds from `stream(a, false)` to `stream(a, true)` (the end of the block only
//! completes).

use super::parse::{head_keys, parse_call, Head, Scan};

/// One call of a block's body so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partial {
    pub name: String,
    /// The arguments' JSON text decided so far (all of it once `done`).
    pub arguments: String,
    /// The call is whole: its arguments will not grow.
    pub done: bool,
    /// Once `done`: where the call's own text ends in the body.
    pub end: usize,
}

/// `text` without the whitespace outside JSON strings (the text of a prefix of a JSON
/// value minifies to a prefix of the whole value's).
pub fn minify(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            if c == '"' {
                in_string = true;
            }
            out.push(c);
        }
    }
    out
}

/// `text` as the inside of a JSON string (no quotes): a prefix of a text escapes to a
/// prefix of its escape.
pub fn escape_json(text: &str) -> String {
    let quoted = serde_json::Value::String(text.to_string()).to_string();
    quoted[1..quoted.len() - 1].to_string()
}

/// The pieces of `text` between top-level `sep` bytes (outside JSON strings), trimmed, empty
/// ones left out.
pub fn split_top_level(text: &str, sep: u8) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut scan = Scan::default();
    let mut start = 0;
    for (i, b) in text.bytes().enumerate() {
        if b == sep && !scan.in_string {
            parts.push(&text[start..i]);
            start = i + 1;
            continue;
        }
        scan.feed(b);
    }
    parts.push(&text[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The calls of a body of JSON call objects so far: one object, a JSON list of them, or
/// (with `sep`, Llama's `;`) objects `sep`-separated. An object that begins
/// `{"name": …, "arguments"|"parameters": {` streams its arguments (minified) as they are
/// written; any other is taken whole once it closes ([`parse_call`], compact arguments).
/// The reading stops at the first thing that is not a call (what follows is not read).
/// `None` until the first call's name is known.
pub fn json_calls_so_far(body: &str, end: bool, sep: Option<u8>) -> Option<Vec<Partial>> {
    let b = body.as_bytes();
    let mut i = skip_ws(b, 0);
    let list = match b.get(i) {
        Some(b'[') => {
            i += 1;
            true
        }
        Some(b'{') => false,
        _ => return None,
    };
    let sep = if list { Some(b',') } else { sep };
    let mut calls: Vec<Partial> = Vec::new();
    loop {
        i = skip_ws(b, i);
        if !calls.is_empty() {
            match sep {
                Some(s) if b.get(i) == Some(&s) => i = skip_ws(b, i + 1),
                _ => break,
            }
        }
        if b.get(i) != Some(&b'{') {
            break;
        }
        let object = &body[i..];
        match head_keys(object, &["arguments", "parameters"]) {
            Head::Start { name, args_at } => {
                let args = &object[args_at..];
                let mut scan = Scan::default();
                let closed = args.bytes().position(|c| scan.feed(c)).map(|p| p + 1);
                let raw = &args[..closed.unwrap_or(args.len())];
                // The rest of the call object, after its arguments.
                let object_end = closed.and_then(|c| {
                    let mut outer = Scan {
                        depth: 1,
                        ..Scan::default()
                    };
                    args[c..]
                        .bytes()
                        .position(|x| outer.feed(x))
                        .map(|p| i + args_at + c + p + 1)
                });
                let done = end || object_end.is_some();
                calls.push(Partial {
                    name,
                    arguments: minify(raw),
                    done,
                    end: object_end.unwrap_or(body.len()),
                });
                match object_end {
                    Some(e) => i = e,
                    None => break,
                }
            }
            Head::Partial => break,
            Head::No => {
                let Some(len) = json_value_len(object) else {
                    break;
                };
                let Some(call) = parse_call(&object[..len]) else {
                    break;
                };
                i += len;
                calls.push(Partial {
                    name: call.name,
                    arguments: call.arguments,
                    done: true,
                    end: i,
                });
            }
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// The length of the longest tail of `text` that is a proper prefix of `marker`.
pub fn held_tail(text: &str, marker: &str) -> usize {
    crate::formats::reasoning::partial_suffix(text, marker)
}

/// The length of the first JSON value (an object or a list) at the start of `text`, leading
/// whitespace included, once it is whole.
pub fn json_value_len(text: &str) -> Option<usize> {
    let lead = text.len() - text.trim_start().len();
    let rest = &text[lead..];
    if !(rest.starts_with('{') || rest.starts_with('[')) {
        return None;
    }
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, b) in rest.bytes().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(lead + i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minify_keeps_strings() {
        assert_eq!(
            minify("{ \"a b\" : [1, \"x \\\" y\"] }"),
            "{\"a b\":[1,\"x \\\" y\"]}"
        );
    }

    #[test]
    fn split_respects_strings() {
        assert_eq!(
            split_top_level("{\"a\": \"x;y\"}; {\"b\": 1};", b';'),
            vec!["{\"a\": \"x;y\"}", "{\"b\": 1}"]
        );
    }

    #[test]
    fn json_calls_stream_and_take_other_forms_whole() {
        let body = "[{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"arguments\": {}, \"name\": \"b\"}, {\"name\": \"c\", \"arguments\": {\"y\"";
        let calls = json_calls_so_far(body, false, None).unwrap();
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[0].arguments, "{\"x\":1}");
        assert!(calls[0].done);
        assert_eq!(calls[1].name, "b");
        assert_eq!(calls[2].arguments, "{\"y\"");
        assert!(!calls[2].done);
        assert_eq!(json_calls_so_far("[{\"name\": \"a\"", false, None), None);
    }
}
