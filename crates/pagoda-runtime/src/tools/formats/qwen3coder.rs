//! Qwen3-Coder's (and Qwen3.5's) calls: `<tool_call>\n<function=NAME>\n<parameter=KEY>\n
//! VALUE\n</parameter>…</function>\n</tool_call>`, several functions to a block allowed,
//! read into JSON arguments as they are written.
//!
//! A value is typed by the tool's JSON schema where it says `"type": "string"`: the text,
//! whatever it looks like. Any other value that is JSON other than a string (a number,
//! `true`, an object, …) is that value, and any other text a string. One newline just inside
//! `<parameter=KEY>` and `</parameter>` is markup.
//!
//! Streaming: the call starts at `<function=NAME>`; `{` and, as each parameter opens,
//! `"KEY":` are sent at once; a string-typed value is sent as its text arrives (held back
//! only while it may be the closing newline or markup), any other value when its
//! `</parameter>` comes; `}` at `</function>`. A block that ends inside a call (cut off, or
//! markup the reader does not know) ends the call there, its open value and object closed.

use super::super::partial::{escape_json, held_tail, Partial};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";

/// Qwen3-Coder's XML-ish calls, with the string-typed parameters of the offered tools.
#[derive(Debug, Default)]
pub struct Qwen3Coder {
    /// Per function, the parameters its schema types as strings.
    pub string_params: BTreeMap<String, BTreeSet<String>>,
}

/// A value's text without the newline just inside each of its markers.
fn trim_value(text: &str) -> &str {
    let text = text.strip_prefix('\n').unwrap_or(text);
    text.strip_suffix('\n').unwrap_or(text)
}

/// A value's JSON text: `text` itself as a string when `string`, else as the module doc says.
fn typed(text: &str, string: bool) -> String {
    let value = match serde_json::from_str::<Value>(text) {
        Ok(v) if !string && !v.is_string() => v,
        _ => Value::String(text.to_string()),
    };
    value.to_string()
}

impl Qwen3Coder {
    fn is_string(&self, function: &str, param: &str) -> bool {
        self.string_params
            .get(function)
            .is_some_and(|p| p.contains(param))
    }

    /// The calls of `body` so far (see the module doc).
    pub fn calls_so_far(&self, body: &str, end: bool) -> Vec<Partial> {
        let mut calls = Vec::new();
        let mut at = 0;
        loop {
            let rest = body[at..].trim_start();
            let Some(after) = rest.strip_prefix(FUNCTION) else {
                break;
            };
            let Some(gt) = after.find('>') else {
                break;
            };
            let name = after[..gt].trim();
            if name.is_empty() || name.contains(['<', '\n']) {
                break;
            }
            let mut pos = body.len() - after.len() + gt + 1;
            let mut args = String::from("{");
            let mut first = true;
            let mut done = false;
            loop {
                let inner = body[pos..].trim_start();
                let inner_at = body.len() - inner.len();
                if inner.starts_with(FUNCTION_END) {
                    pos = inner_at + FUNCTION_END.len();
                    done = true;
                    break;
                }
                let Some(p) = inner.strip_prefix(PARAMETER) else {
                    break;
                };
                let Some(gt) = p.find('>') else {
                    break;
                };
                let key = p[..gt].trim();
                if !first {
                    args.push(',');
                }
                first = false;
                args.push_str(&Value::String(key.to_string()).to_string());
                args.push(':');
                let string = self.is_string(name, key);
                let value_at = inner_at + PARAMETER.len() + gt + 1;
                let value = &body[value_at..];
                if let Some(close) = value.find(PARAMETER_END) {
                    args.push_str(&typed(trim_value(&value[..close]), string));
                    pos = value_at + close + PARAMETER_END.len();
                    continue;
                }
                // The value is still being written.
                if end {
                    args.push_str(&typed(trim_value(value), string));
                } else if string {
                    let text = value.strip_prefix('\n').unwrap_or(value);
                    let mut keep = held_tail(text, PARAMETER_END);
                    if text[..text.len() - keep].ends_with('\n') {
                        keep += 1;
                    }
                    args.push('"');
                    args.push_str(&escape_json(&text[..text.len() - keep]));
                }
                pos = body.len();
                break;
            }
            if done || end {
                args.push('}');
            }
            calls.push(Partial {
                name: name.to_string(),
                arguments: args,
                done: done || end,
                end: if done { pos } else { body.len() },
            });
            if !done {
                break;
            }
            at = pos;
        }
        calls
    }
}

impl super::BlockSyntax for Qwen3Coder {
    fn open(&self) -> &'static str {
        "<tool_call>"
    }
    fn close(&self) -> Option<&'static str> {
        Some("</tool_call>")
    }
    fn stream(&self, body: &str, end: bool) -> Option<Vec<Partial>> {
        let calls = self.calls_so_far(body, end);
        (!calls.is_empty()).then_some(calls)
    }
}
