//! Gemma 4's calls, `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1,…}<tool_call|>`: its own
//! value syntax (strings between `<|"|>` markers, bare keys, which may be `<|"|>`-quoted;
//! numbers, `true`, `false`, `null`; objects and lists) translated into JSON as it is
//! written.
//!
//! Streaming: the call starts at `call:NAME{`; each key is sent once its `:` is written,
//! `{`, `[` and `}`, `]` at once, a string's text as it arrives (held back only while it may
//! be the closing `<|"|>`), a scalar once its delimiter comes, and a `,` once the element
//! after it begins (so that what is sent is always the beginning of valid JSON). Reading
//! stops at the first thing that is not this syntax, and at the end of the block the open
//! string, a key with no value (`null`) and the open objects and lists are closed.

use super::super::partial::{escape_json, held_tail, Partial};
use serde_json::Value;

const QUOTE: &str = "<|\"|>";
/// Deepest nesting read.
const MAX_DEPTH: usize = 64;

/// Gemma 4's `<|tool_call>call:NAME{…}<tool_call|>`.
#[derive(Debug)]
pub struct Gemma4;

impl super::BlockSyntax for Gemma4 {
    fn open(&self) -> &'static str {
        "<|tool_call>"
    }
    fn close(&self) -> Option<&'static str> {
        Some("<tool_call|>")
    }
    fn stream(&self, body: &str, end: bool) -> Option<Vec<Partial>> {
        let rest = body.trim_start().strip_prefix("call:")?;
        let brace = rest.find('{')?;
        let name = rest[..brace].trim();
        if name.is_empty() || name.contains(char::is_whitespace) || name.contains('<') {
            return None;
        }
        let start = body.len() - rest.len() + brace;
        let mut w = Writer::default();
        w.read(&body[start..]);
        if end {
            w.close();
        }
        Some(vec![Partial {
            name: name.to_string(),
            arguments: w.out,
            done: end || w.finished.is_some(),
            end: w.finished.map_or(body.len(), |f| start + f),
        }])
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Object,
    List,
}

/// What an open object or list expects next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Its first element or its end.
    FirstOrEnd,
    /// An element (after a `,`: the `,` is sent with it).
    Next,
    /// An object's value (its key was sent).
    Value,
    /// A `,` or its end.
    CommaOrEnd,
}

/// The translation of one call's arguments.
#[derive(Debug, Default)]
struct Writer {
    out: String,
    stack: Vec<(Kind, Expect)>,
    /// Inside a string: its text not sent yet (the tail that may begin `<|"|>`).
    string: Option<String>,
    /// A scalar whose delimiter is not written yet.
    scalar: Option<String>,
    /// Where the arguments object closed in the text read.
    finished: Option<usize>,
}

impl Writer {
    /// Reads `text` (from the arguments' `{`) as far as it decides.
    fn read(&mut self, text: &str) {
        let mut i = 0;
        while i < text.len() && self.finished.is_none() {
            match self.step(&text[i..]) {
                Some(used) => i += used,
                None => break,
            }
            if self.stack.is_empty() {
                self.finished = Some(i);
            }
        }
    }

    /// One token at the start of `text`; `None` when it is not written whole yet or is not
    /// this syntax (reading stops).
    fn step(&mut self, text: &str) -> Option<usize> {
        let lead = text.len() - text.trim_start().len();
        let t = &text[lead..];
        let c = t.chars().next()?;
        let Some(&(kind, expect)) = self.stack.last() else {
            // The arguments object.
            if c != '{' {
                return None;
            }
            self.out.push('{');
            self.stack.push((Kind::Object, Expect::FirstOrEnd));
            return Some(lead + 1);
        };
        match (kind, expect) {
            (_, Expect::CommaOrEnd) | (_, Expect::FirstOrEnd)
                if c == if kind == Kind::Object { '}' } else { ']' } =>
            {
                self.out.push(c);
                self.stack.pop();
                self.after_value();
                Some(lead + 1)
            }
            (_, Expect::CommaOrEnd) if c == ',' => {
                self.set(Expect::Next);
                Some(lead + 1)
            }
            (_, Expect::CommaOrEnd) => None,
            (Kind::Object, Expect::FirstOrEnd | Expect::Next) => {
                let colon = t.find(':')?;
                let key = t[..colon].trim();
                let key = key.strip_prefix(QUOTE).unwrap_or(key);
                let key = key.strip_suffix(QUOTE).unwrap_or(key);
                if key.is_empty() || key.contains(['}', '{', ',']) {
                    return None;
                }
                if expect == Expect::Next {
                    self.out.push(',');
                }
                self.out
                    .push_str(&Value::String(key.to_string()).to_string());
                self.out.push(':');
                self.set(Expect::Value);
                Some(lead + colon + 1)
            }
            (Kind::List, _) | (Kind::Object, Expect::Value) => {
                let comma = kind == Kind::List && expect == Expect::Next;
                self.value(t, comma).map(|used| lead + used)
            }
        }
    }

    fn set(&mut self, expect: Expect) {
        if let Some(top) = self.stack.last_mut() {
            top.1 = expect;
        }
    }

    /// A value ended: its container expects a `,` or its end.
    fn after_value(&mut self) {
        self.set(Expect::CommaOrEnd);
    }

    /// A value at the start of `t` (no leading whitespace); `comma`: a list's `,` is due
    /// before it.
    fn value(&mut self, t: &str, comma: bool) -> Option<usize> {
        let sep = if comma { "," } else { "" };
        if let Some(s) = t.strip_prefix(QUOTE) {
            self.out.push_str(sep);
            self.out.push('"');
            return match s.find(QUOTE) {
                Some(close) => {
                    self.out.push_str(&escape_json(&s[..close]));
                    self.out.push('"');
                    self.after_value();
                    Some(QUOTE.len() + close + QUOTE.len())
                }
                None => {
                    let keep = held_tail(s, QUOTE);
                    self.out.push_str(&escape_json(&s[..s.len() - keep]));
                    self.string = Some(s[s.len() - keep..].to_string());
                    None
                }
            };
        }
        if QUOTE.starts_with(t) {
            return None;
        }
        let c = t.chars().next()?;
        if c == '{' || c == '[' {
            if self.stack.len() >= MAX_DEPTH {
                return None;
            }
            self.out.push_str(sep);
            self.out.push(c);
            let kind = if c == '{' { Kind::Object } else { Kind::List };
            self.stack.push((kind, Expect::FirstOrEnd));
            return Some(1);
        }
        let Some(delimiter) = t.find([',', '}', ']']) else {
            self.scalar = Some(format!("{sep}{t}"));
            return None;
        };
        let v = scalar(&t[..delimiter])?;
        self.out.push_str(sep);
        self.out.push_str(&v);
        self.after_value();
        Some(delimiter)
    }

    /// The end of the block: what is open is closed.
    fn close(&mut self) {
        if self.finished.is_some() {
            return;
        }
        if let Some(rest) = self.string.take() {
            self.out.push_str(&escape_json(&rest));
            self.out.push('"');
            self.after_value();
        } else if let Some(raw) = self.scalar.take() {
            let (sep, raw) = match raw.strip_prefix(',') {
                Some(r) => (",", r),
                None => ("", raw.as_str()),
            };
            let expects_value = matches!(self.stack.last(), Some((Kind::Object, Expect::Value)));
            match scalar(raw) {
                Some(v) => {
                    self.out.push_str(sep);
                    self.out.push_str(&v);
                }
                None if expects_value => self.out.push_str("null"),
                None => {}
            }
            self.after_value();
        }
        if matches!(self.stack.last(), Some((Kind::Object, Expect::Value))) {
            self.out.push_str("null");
        }
        while let Some((kind, _)) = self.stack.pop() {
            self.out.push(if kind == Kind::Object { '}' } else { ']' });
        }
    }
}

/// A number, boolean or null as JSON text.
fn scalar(raw: &str) -> Option<String> {
    serde_json::from_str::<Value>(raw.trim())
        .ok()
        .filter(|v| !v.is_object() && !v.is_array() && !v.is_string())
        .map(|v| v.to_string())
}
