//! The families' call syntaxes, each a [`BlockSyntax`] for [`MarkedCalls`] (Hermes'
//! `<tool_call>{json}</tool_call>` is [`super::parse`]'s, which also streams arguments):
//! - [`Qwen3Coder`] (Qwen3-Coder, Qwen3.5): `<tool_call>\n<function=NAME>\n<parameter=KEY>\n
//!   VALUE\n</parameter>…</function>\n</tool_call>`. A value that is JSON other than a
//!   string (a number, `true`, an object, …) is that value; any other text is a string (the
//!   parser does not read the tool's schema).
//! - [`Mistral`] (Mistral Small 3.2, Ministral 3): `[TOOL_CALLS]NAME[ARGS]{json}` per call
//!   (an optional `[CALL_ID]id` before `[ARGS]`), or the older `[TOOL_CALLS][{"name": …,
//!   "arguments": {…}}, …]`.
//! - [`LlamaPythonTag`] (Llama 3.1–3.3): `<|python_tag|>` then a JSON call
//!   `{"name": …, "parameters": {…}}` (several `;`-separated) or a built-in tool's
//!   `NAME.call(key="value", …)`. The JSON form without the tag is the bare form
//!   ([`super::bare`]), which the Llama 3 templates teach.
//! - [`Phi4`] (Phi-4-mini): `<|tool_call|>[{"name": …, "arguments": {…}}, …]<|/tool_call|>`.
//! - [`Gemma4`]: `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1,…}<tool_call|>`, its own
//!   value syntax (strings between `<|"|>` markers, bare keys) turned into JSON.
//!
//! The syntax of a model is chosen from its chat template's markup ([`ToolCallFormat::detect`]),
//! as llama.cpp's `common/chat` chooses it.

use super::marked::{json_value_len, BlockSyntax};
use super::parse::{parse_call, ParsedCall};
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
}

impl ToolCallFormat {
    /// The format a chat template's source teaches.
    pub fn detect(template: &str) -> ToolCallFormat {
        if template.contains("<|tool_call>call:") {
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

    /// The block syntax of a marked format; `None` for [`ToolCallFormat::Hermes`].
    pub fn syntax(self) -> Option<Box<dyn BlockSyntax>> {
        match self {
            ToolCallFormat::Hermes => None,
            ToolCallFormat::Qwen3Coder => Some(Box::new(Qwen3Coder)),
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

/// Qwen3-Coder's XML-ish calls.
#[derive(Debug)]
pub struct Qwen3Coder;

impl BlockSyntax for Qwen3Coder {
    fn open(&self) -> &'static str {
        "<tool_call>"
    }
    fn close(&self) -> Option<&'static str> {
        Some("</tool_call>")
    }
    fn parse(&self, body: &str) -> Option<Vec<ParsedCall>> {
        let mut calls = Vec::new();
        let mut rest = body.trim();
        while !rest.is_empty() {
            let after = rest.strip_prefix("<function=")?;
            let (name, inner) = after.split_once('>')?;
            let end = inner.find("</function>")?;
            let mut params = &inner[..end];
            let mut args = Map::new();
            loop {
                params = params.trim_start();
                if params.is_empty() {
                    break;
                }
                let p = params.strip_prefix("<parameter=")?;
                let (key, value) = p.split_once('>')?;
                let close = value.find("</parameter>")?;
                let text = value[..close].strip_prefix('\n').unwrap_or(&value[..close]);
                let text = text.strip_suffix('\n').unwrap_or(text);
                let v = match serde_json::from_str::<Value>(text) {
                    Ok(v) if !v.is_string() => v,
                    _ => Value::String(text.to_string()),
                };
                args.insert(key.trim().to_string(), v);
                params = &value[close + "</parameter>".len()..];
            }
            calls.push(call(name, Value::Object(args))?);
            rest = inner[end + "</function>".len()..].trim_start();
        }
        Some(calls)
    }
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
    fn parse(&self, body: &str) -> Option<Vec<ParsedCall>> {
        let t = body.trim();
        if t.starts_with('{') || t.starts_with('[') {
            let mut calls = Vec::new();
            for part in t.split(';').map(str::trim).filter(|p| !p.is_empty()) {
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
    fn parse(&self, body: &str) -> Option<Vec<ParsedCall>> {
        json_calls(body)
    }
}

/// Gemma 4's `<|tool_call>call:NAME{…}<tool_call|>`.
#[derive(Debug)]
pub struct Gemma4;

const GEMMA_QUOTE: &str = "<|\"|>";
/// Deepest nesting of a Gemma 4 value read.
const GEMMA_DEPTH: usize = 64;

impl BlockSyntax for Gemma4 {
    fn open(&self) -> &'static str {
        "<|tool_call>"
    }
    fn close(&self) -> Option<&'static str> {
        Some("<tool_call|>")
    }
    fn parse(&self, body: &str) -> Option<Vec<ParsedCall>> {
        let rest = body.trim().strip_prefix("call:")?;
        let brace = rest.find('{')?;
        let name = &rest[..brace];
        let mut reader = GemmaReader {
            text: &rest[brace..],
        };
        let args = reader.value(0)?;
        if !reader.text.trim().is_empty() {
            return None;
        }
        Some(vec![call(name, args)?])
    }
}

/// Reads Gemma 4's value syntax.
struct GemmaReader<'a> {
    text: &'a str,
}

impl GemmaReader<'_> {
    fn skip_ws(&mut self) {
        self.text = self.text.trim_start();
    }

    fn eat(&mut self, s: &str) -> bool {
        match self.text.strip_prefix(s) {
            Some(rest) => {
                self.text = rest;
                true
            }
            None => false,
        }
    }

    fn value(&mut self, depth: usize) -> Option<Value> {
        if depth > GEMMA_DEPTH {
            return None;
        }
        self.skip_ws();
        if self.eat(GEMMA_QUOTE) {
            let end = self.text.find(GEMMA_QUOTE)?;
            let s = self.text[..end].to_string();
            self.text = &self.text[end + GEMMA_QUOTE.len()..];
            return Some(Value::String(s));
        }
        if self.eat("{") {
            let mut map = Map::new();
            self.skip_ws();
            if self.eat("}") {
                return Some(Value::Object(map));
            }
            loop {
                self.skip_ws();
                let colon = self.text.find(':')?;
                let key = self.text[..colon].trim();
                if key.is_empty() || key.contains('}') {
                    return None;
                }
                let key = key.strip_prefix(GEMMA_QUOTE).unwrap_or(key);
                let key = key.strip_suffix(GEMMA_QUOTE).unwrap_or(key).to_string();
                self.text = &self.text[colon + 1..];
                let v = self.value(depth + 1)?;
                map.insert(key, v);
                self.skip_ws();
                if self.eat("}") {
                    return Some(Value::Object(map));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        if self.eat("[") {
            let mut items = Vec::new();
            self.skip_ws();
            if self.eat("]") {
                return Some(Value::Array(items));
            }
            loop {
                items.push(self.value(depth + 1)?);
                self.skip_ws();
                if self.eat("]") {
                    return Some(Value::Array(items));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        // A number, boolean or null: up to the next delimiter.
        let end = self.text.find([',', '}', ']']).unwrap_or(self.text.len());
        let raw = self.text[..end].trim();
        self.text = &self.text[end..];
        serde_json::from_str::<Value>(raw)
            .ok()
            .filter(|v| !v.is_object() && !v.is_array() && !v.is_string())
    }
}

#[cfg(test)]
mod tests;
