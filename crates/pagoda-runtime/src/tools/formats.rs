//! The families' call syntaxes, each a [`BlockSyntax`] for [`super::marked::MarkedCalls`]
//! (Hermes' `<tool_call>{json}</tool_call>` is [`super::parse`]'s), each streaming a call's
//! arguments as they are written ([`BlockSyntax::stream`]):
//! - [`Qwen3Coder`] (Qwen3-Coder, Qwen3.5): `<tool_call>\n<function=NAME>\n<parameter=KEY>\n
//!   VALUE\n</parameter>…</function>\n</tool_call>`, translated into JSON, values typed by
//!   the tool's schema ([`qwen3coder`]).
//! - [`Mistral`] (Mistral Small 3.2, Ministral 3): `[TOOL_CALLS]NAME[ARGS]{json}` per call
//!   (an optional `[CALL_ID]id` before `[ARGS]`; the call starts once its name is followed
//!   by either), or the older `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`.
//! - [`LlamaPythonTag`] (Llama 3.1–3.3): `<|python_tag|>` then a JSON call
//!   `{"name": …, "parameters": {…}}` (several `;`-separated, a `;` inside a JSON string
//!   being text) or a built-in tool's `NAME.call(key="value", …)` (decided whole). The JSON
//!   form without the tag is the bare form ([`super::bare`]), which the Llama 3 templates
//!   teach.
//! - [`Phi4`] (Phi-4-mini): `<|tool_call|>[{"name": …, "arguments": {…}}, …]<|/tool_call|>`.
//! - [`Gemma4`]: `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1,…}<tool_call|>`, its own
//!   value syntax (strings between `<|"|>` markers, bare keys) translated into JSON
//!   ([`gemma4`]).
//!
//! The JSON forms stream a call whose object begins `{"name": …, "arguments": {` (or
//! `"parameters"`) as written, whitespace outside strings left out; another order is taken
//! whole once its object closes ([`super::partial::json_calls_so_far`]).
//!
//! The syntax of a model is chosen from its chat template's markup ([`ToolCallFormat::detect`]),
//! as llama.cpp's `common/chat` chooses it.

pub mod gemma4;
pub mod qwen3coder;

pub use gemma4::Gemma4;
pub use qwen3coder::Qwen3Coder;

pub use super::marked::BlockSyntax;
use super::parse::{parse_call, ParsedCall, Scan};
use super::partial::json_value_len;
use super::partial::{json_calls_so_far, minify, split_top_level, Partial};
use super::Offered;
use serde_json::{Map, Value};

/// How a model writes its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolCallFormat {
    /// `<tool_call>{"name": …, "arguments": …}</tool_call>` or a bare call object (Qwen2.5,
    /// Qwen3, QwQ, SmolLM3, the fallback prompt).
    #[default]
    Hermes,
    Qwen3Coder,
    /// The bare `{"name": …, "parameters": …}` object, or after `<|python_tag|>`.
    Llama3,
    Mistral,
    Phi4,
    Gemma4,
    /// gpt-oss's harmony messages: a call is a message to `functions.NAME`
    /// ([`crate::formats::harmony`], which parses the whole output, channels included).
    Harmony,
}

impl ToolCallFormat {
    /// The format a chat template's source teaches.
    pub fn detect(template: &str) -> ToolCallFormat {
        if template.contains("<|channel|>commentary") && template.contains("functions.") {
            ToolCallFormat::Harmony
        } else if template.contains("<|tool_call>call:") {
            ToolCallFormat::Gemma4
        } else if template.contains("<tool_call>")
            && template.contains("<function=")
            && template.contains("<parameter=")
        {
            ToolCallFormat::Qwen3Coder
        } else if template.contains("[TOOL_CALLS]") {
            ToolCallFormat::Mistral
        } else if template.contains("<|tool_call|>") {
            ToolCallFormat::Phi4
        } else if template.contains("<|python_tag|>")
            || (template.contains("<|start_header_id|>") && template.contains("\"parameters\""))
        {
            ToolCallFormat::Llama3
        } else {
            ToolCallFormat::Hermes
        }
    }

    /// The block syntax of a marked format, for calls of the `offered` tools; `None` for
    /// [`ToolCallFormat::Hermes`].
    pub fn syntax(self, offered: &Offered) -> Option<Box<dyn BlockSyntax>> {
        match self {
            ToolCallFormat::Hermes | ToolCallFormat::Harmony => None,
            ToolCallFormat::Qwen3Coder => Some(Box::new(Qwen3Coder {
                string_params: offered.string_params.clone(),
            })),
            ToolCallFormat::Llama3 => Some(Box::new(LlamaPythonTag)),
            ToolCallFormat::Mistral => Some(Box::new(Mistral)),
            ToolCallFormat::Phi4 => Some(Box::new(Phi4)),
            ToolCallFormat::Gemma4 => Some(Box::new(Gemma4)),
        }
    }

    /// Whether a whole output that is a bare call object counts as a call ([`super::bare`]).
    pub fn takes_bare_calls(self) -> bool {
        matches!(self, ToolCallFormat::Hermes | ToolCallFormat::Llama3)
    }

    /// Whether the markers are control tokens in the family's vocabulary, which the text of
    /// an output leaves out unless asked to keep them.
    pub fn markers_are_control_tokens(self) -> bool {
        matches!(
            self,
            ToolCallFormat::Llama3
                | ToolCallFormat::Mistral
                | ToolCallFormat::Phi4
                | ToolCallFormat::Gemma4
                | ToolCallFormat::Harmony
        )
    }
}

/// A call from a name and a JSON arguments object.
fn call(name: &str, arguments: Value) -> Option<ParsedCall> {
    let name = name.trim();
    if name.is_empty() || !arguments.is_object() {
        return None;
    }
    Some(ParsedCall {
        name: name.to_string(),
        arguments: serde_json::to_string(&arguments).ok()?,
    })
}

/// A JSON object or list of call objects (`name` and `arguments` or `parameters`).
fn json_calls(body: &str) -> Option<Vec<ParsedCall>> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    let items = match value {
        Value::Array(items) => items,
        o @ Value::Object(_) => vec![o],
        _ => return None,
    };
    items.iter().map(|o| parse_call(&o.to_string())).collect()
}

/// Mistral's `[TOOL_CALLS]`.
#[derive(Debug)]
pub struct Mistral;

impl Mistral {
    /// `(name, where its JSON arguments begin)` of a `NAME[CALL_ID]id[ARGS]` head.
    fn head(body: &str) -> Option<(&str, usize)> {
        let at = body.find("[ARGS]")?;
        let name = body[..at].split("[CALL_ID]").next()?;
        Some((name, at + "[ARGS]".len()))
    }
}

impl BlockSyntax for Mistral {
    fn open(&self) -> &'static str {
        "[TOOL_CALLS]"
    }
    fn close(&self) -> Option<&'static str> {
        None
    }
    fn complete(&self, body: &str) -> Option<usize> {
        let t = body.trim_start();
        if t.starts_with('[') || t.starts_with('{') {
            return json_value_len(body);
        }
        let (_, args_at) = Self::head(body)?;
        Some(args_at + json_value_len(&body[args_at..])?)
    }
    fn stream(&self, body: &str, end: bool) -> Option<Vec<Partial>> {
        let t = body.trim_start();
        if t.starts_with('[') || t.starts_with('{') {
            return json_calls_so_far(body, end, None);
        }
        let named = ["[CALL_ID]", "[ARGS]"]
            .iter()
            .filter_map(|m| body.find(m))
            .min()?;
        let name = body[..named].trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return None;
        }
        let raw = Self::head(body).map_or("", |(_, args_at)| &body[args_at..]);
        let mut arguments = if raw.trim_start().starts_with('{') {
            let mut scan = Scan::default();
            let closed = raw
                .bytes()
                .position(|c| scan.feed(c))
                .map_or(raw.len(), |p| p + 1);
            minify(&raw[..closed])
        } else {
            String::new()
        };
        if end && arguments.is_empty() {
            arguments.push_str("{}");
        }
        Some(vec![Partial {
            name: name.to_string(),
            arguments,
            done: end,
            end: body.len(),
        }])
    }
    fn parse(&self, body: &str) -> Option<Vec<ParsedCall>> {
        let t = body.trim();
        if t.starts_with('[') || t.starts_with('{') {
            return json_calls(t);
        }
        let (name, args_at) = Self::head(t)?;
        if name.contains(char::is_whitespace) {
            return None;
        }
        let args: Value = serde_json::from_str(t[args_at..].trim()).ok()?;
        Some(vec![call(name, args)?])
    }
}

/// Llama 3.x's `<|python_tag|>`.
#[derive(Debug)]
pub struct LlamaPythonTag;

impl BlockSyntax for LlamaPythonTag {
    fn open(&self) -> &'static str {
        "<|python_tag|>"
    }
    fn close(&self) -> Option<&'static str> {
        None
    }
    fn stream(&self, body: &str, end: bool) -> Option<Vec<Partial>> {
        json_calls_so_far(body, end, Some(b';'))
    }
    fn parse(&self, body: &str) -> Option<Vec<ParsedCall>> {
        let t = body.trim();
        if t.starts_with('{') || t.starts_with('[') {
            let mut calls = Vec::new();
            for part in split_top_level(t, b';') {
                calls.extend(json_calls(part)?);
            }
            return Some(calls);
        }
        // A built-in tool: `brave_search.call(query="...")`.
        let (name, args) = t.strip_suffix(')')?.split_once(".call(")?;
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        Some(vec![call(name, python_kwargs(args)?)?])
    }
}

/// `key="text", n=1, flag=True` as a JSON object (string values in single or double
/// quotes, with backslash escapes; other values read as JSON, Python's `True`/`False`/`None`
/// as JSON's).
fn python_kwargs(text: &str) -> Option<Value> {
    let mut args = Map::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (value, tail) = match after.chars().next()? {
            q @ ('"' | '\'') => {
                let mut out = String::new();
                let mut chars = after[1..].char_indices();
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => out.push(chars.next()?.1),
                        c if c == q => {
                            end = Some(i + 2);
                            break;
                        }
                        c => out.push(c),
                    }
                }
                (Value::String(out), &after[end?..])
            }
            _ => {
                let end = after.find(',').unwrap_or(after.len());
                let raw = after[..end].trim();
                let v = match raw {
                    "True" => Value::Bool(true),
                    "False" => Value::Bool(false),
                    "None" => Value::Null,
                    _ => serde_json::from_str(raw).ok()?,
                };
                (v, &after[end..])
            }
        };
        args.insert(key.trim().to_string(), value);
        rest = tail.trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Some(Value::Object(args))
}

/// Phi-4-mini's `<|tool_call|>`.
#[derive(Debug)]
pub struct Phi4;

impl BlockSyntax for Phi4 {
    fn open(&self) -> &'static str {
        "<|tool_call|>"
    }
    fn close(&self) -> Option<&'static str> {
        Some("<|/tool_call|>")
    }
    fn stream(&self, body: &str, end: bool) -> Option<Vec<Partial>> {
        json_calls_so_far(body, end, None)
    }
    fn parse(&self, body: &str) -> Option<Vec<ParsedCall>> {
        json_calls(body)
    }
}

#[cfg(test)]
mod tests;
