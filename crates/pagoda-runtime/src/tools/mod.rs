//! Tool calling, shared by the OpenAI and Ollama chat routes: the request's tools checked
//! ([`ToolSet`]), the conversation (tools, assistant `tool_calls`, `tool` results) rendered
//! into the prompt ([`encode_prompt`]), the grammar that forces a call ([`forced_call`]), and
//! the output parsed back into calls ([`parse`]).
//!
//! Rendering: a template that reads `tools` (Qwen2.5's) gets them as transformers'
//! `apply_chat_template(tools=...)` passes them, and the history's calls with their
//! `arguments` as JSON values. Any other template gets the fallback: a system-prompt section
//! ([`fallback_system`]) listing the tools as JSON and asking for
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` per call; the history's calls
//! are written into the assistant text in that same form, and `tool` results become user
//! turns (`<tool_response name="...">…</tool_response>`; consecutive results in one turn).
//!
//! Invariants: a request gets tools rendered and its output parsed exactly when it has a
//! [`ToolSet`] (tools present and `tool_choice` not `none`); every refusal is a
//! [`RequestError`] naming the field (`tools`, `tool_choice`, `messages`, `functions`,
//! `function_call`), with the index in its message.

pub mod bare;
mod forced_xml;
pub mod formats;
pub mod marked;
pub mod output;
pub mod parse;
pub mod partial;

use crate::loader::LoadedModel;
use crate::request::RequestError;
use pagoda_engine::ConstraintSpec;
use pagoda_model::chat_template::{ChatMessage, TemplateKwargs};
use pagoda_protocol::openai::chat::{Tool, ToolChoice};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

pub use bare::{parse_bare_calls, BareCallGate, Gated};
pub use formats::ToolCallFormat;
pub use output::{parse_output_offered, parse_reply, reasoning_of, OutputFormats, OutputParser};
pub use parse::{parse_output, ParsedCall, ParsedOutput, Piece, ToolCallParser};

/// What `tool_choice` asks for, once the tools are known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// The model decides (rendered and parsed, not forced).
    Auto,
    /// At least one call, of any of the tools.
    Required,
    /// A call of this function.
    Named(String),
}

/// A request's checked tools: each has a `function` with a valid, unique name and object
/// parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSet {
    pub tools: Vec<Tool>,
    pub choice: Choice,
    /// More than one call allowed (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl ToolSet {
    /// Whether `tool_choice` forces a call (`required` or a named function): the output is
    /// then constrained by [`forced_call`]'s grammar.
    pub fn forces_a_call(&self) -> bool {
        !matches!(self.choice, Choice::Auto)
    }

    /// The tools' names: what the output's calls may name ([`OutputParser`]).
    pub fn names(&self) -> Vec<String> {
        self.tools
            .iter()
            .map(|t| function_name(t).to_string())
            .collect()
    }

    /// What the output's parser needs of the tools ([`Offered`]).
    pub fn offered(&self) -> Offered {
        let mut string_params = BTreeMap::new();
        for t in &self.tools {
            let properties = t
                .function
                .as_ref()
                .and_then(|f| f.parameters.as_ref())
                .and_then(|p| p.get("properties"))
                .and_then(Value::as_object);
            let strings: BTreeSet<String> = properties
                .into_iter()
                .flatten()
                .filter(|(_, schema)| string_typed(schema))
                .map(|(k, _)| k.clone())
                .collect();
            if !strings.is_empty() {
                string_params.insert(function_name(t).to_string(), strings);
            }
        }
        Offered {
            names: self.names(),
            string_params,
        }
    }
}

/// Whether a parameter's schema says its value is a string (`"type": "string"`, or a list
/// of types that is `"string"` and perhaps `"null"`).
fn string_typed(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(types)) => {
            types.iter().any(|t| t == "string")
                && types.iter().all(|t| t == "string" || t == "null")
        }
        _ => false,
    }
}

/// The tools whose calls an output is parsed for, as its parser needs them: their names
/// (a bare call must name one), and per function the parameters its schema types as strings
/// (Qwen3-Coder's values are typed by them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offered {
    pub names: Vec<String>,
    pub string_params: BTreeMap<String, BTreeSet<String>>,
}

impl From<Vec<String>> for Offered {
    /// Tools known by name only (no schemas).
    fn from(names: Vec<String>) -> Self {
        Offered {
            names,
            string_params: BTreeMap::new(),
        }
    }
}

/// OpenAI's rule for function names.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks `tools` (the field is named `field` in errors). An empty list is no tools.
pub fn check_tools(tools: &[Tool], field: &'static str) -> Result<(), RequestError> {
    let mut seen = std::collections::HashSet::new();
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(RequestError::param(
                field,
                format!(
                    "{field}[{i}].type `{}` is not supported; use \"function\"",
                    t.kind
                ),
            ));
        }
        let Some(f) = &t.function else {
            return Err(RequestError::param(
                field,
                format!("{field}[{i}].function is missing"),
            ));
        };
        let unknown = t
            .extra
            .iter()
            .map(|(k, v)| (format!("{field}[{i}].{k}"), v))
            .chain(
                f.extra
                    .iter()
                    .map(|(k, v)| (format!("{field}[{i}].function.{k}"), v)),
            )
            .find(|(_, v)| !v.is_null());
        if let Some((key, _)) = unknown {
            return Err(RequestError::param(
                field,
                format!("unknown field `{key}`; this server refuses fields it does not implement rather than ignore them"),
            ));
        }
        let name = f.name.as_deref().unwrap_or_default();
        if name.is_empty() {
            return Err(RequestError::param(
                field,
                format!("{field}[{i}].function.name is missing"),
            ));
        }
        if !valid_name(name) {
            return Err(RequestError::param(
                field,
                format!("{field}[{i}].function.name `{name}` must be 1-64 characters of a-z, A-Z, 0-9, _ and -"),
            ));
        }
        if !seen.insert(name) {
            return Err(RequestError::param(
                field,
                format!("{field}[{i}].function.name `{name}` is given twice; names must be unique"),
            ));
        }
        if let Some(p) = &f.parameters {
            if !p.is_object() {
                return Err(RequestError::param(
                    field,
                    format!("{field}[{i}].function.parameters must be a JSON Schema object"),
                ));
            }
        }
    }
    Ok(())
}

/// The OpenAI request's tool fields → its [`ToolSet`], or `None` when it asks for no tool
/// use (no tools, or `tool_choice: "none"`). The deprecated `functions` / `function_call` are
/// refused by name.
pub fn check_openai(
    tools: Option<&[Tool]>,
    tool_choice: Option<&ToolChoice>,
    parallel: Option<bool>,
    functions: Option<&Value>,
    function_call: Option<&Value>,
) -> Result<Option<ToolSet>, RequestError> {
    for (field, v) in [("functions", functions), ("function_call", function_call)] {
        if v.is_some_and(|v| !v.is_null()) {
            return Err(RequestError::param(
                field,
                format!("`{field}` is deprecated and not supported; send `tools` and `tool_choice` instead"),
            ));
        }
    }
    let tools = tools.unwrap_or_default();
    check_tools(tools, "tools")?;
    let choice = match tool_choice {
        None => {
            if tools.is_empty() {
                None
            } else {
                Some(Choice::Auto)
            }
        }
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => None,
            "auto" if tools.is_empty() => None,
            "auto" => Some(Choice::Auto),
            "required" => Some(Choice::Required),
            other => {
                return Err(RequestError::param(
                    "tool_choice",
                    format!("tool_choice `{other}` is not one of none, auto, required, or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                ))
            }
        },
        Some(ToolChoice::Named(n)) => {
            if n.kind != "function" {
                return Err(RequestError::param(
                    "tool_choice",
                    format!(
                        "tool_choice.type `{}` is not supported; use \"function\"",
                        n.kind
                    ),
                ));
            }
            Some(Choice::Named(n.function.name.clone()))
        }
    };
    let Some(choice) = choice else {
        return Ok(None);
    };
    if tools.is_empty() {
        return Err(RequestError::param(
            "tool_choice",
            "tool_choice asks for a tool call, but the request has no `tools`",
        ));
    }
    if let Choice::Named(name) = &choice {
        if !tools.iter().any(|t| function_name(t) == name) {
            return Err(RequestError::param(
                "tool_choice",
                format!("tool_choice names the function `{name}`, which is not in `tools`"),
            ));
        }
    }
    Ok(Some(ToolSet {
        tools: tools.to_vec(),
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

/// Ollama's `tools` (no `tool_choice` there: the model decides) → its [`ToolSet`], or `None`
/// for none.
pub fn check_ollama(tools: Option<&[Tool]>) -> Result<Option<ToolSet>, RequestError> {
    let tools = tools.unwrap_or_default();
    check_tools(tools, "tools")?;
    Ok((!tools.is_empty()).then(|| ToolSet {
        tools: tools.to_vec(),
        choice: Choice::Auto,
        parallel: true,
    }))
}

/// The name of a checked tool.
fn function_name(t: &Tool) -> &str {
    t.function
        .as_ref()
        .and_then(|f| f.name.as_deref())
        .unwrap_or_default()
}

/// Whether `loaded`'s chat template renders tools itself; otherwise the fallback prompt.
pub fn template_renders_tools(loaded: &LoadedModel) -> bool {
    loaded.chat_template.supports_tools()
}

/// The prompt's token ids: `messages` (with the model's default system message and
/// Modelfile MESSAGE turns) and the tools through the model's template, or the fallback;
/// `kwargs`: extra template variables (`chat_template_kwargs`, the thinking switch).
pub fn encode_prompt(
    loaded: &LoadedModel,
    messages: Vec<ChatMessage>,
    tools: Option<&ToolSet>,
    kwargs: &TemplateKwargs,
) -> Result<Vec<u32>, RequestError> {
    let messages = loaded.with_preset(messages);
    let tools_for_template = if template_renders_tools(loaded) {
        Some(tools.map(|t| t.tools.as_slice()))
    } else {
        None
    };
    let encoded = match tools_for_template {
        Some(tools) => loaded.encode_chat_with(&messages, tools, kwargs),
        None => loaded.encode_chat_with::<()>(&fallback_messages(messages, tools), None, kwargs),
    };
    encoded.map_err(template_error)
}

/// A chat template failure as the client's error: over a template limit, `invalid_template`
/// naming the limit; otherwise the template's own complaint (`raise_exception`) about the
/// messages.
pub fn template_error(e: pagoda_model::ModelError) -> RequestError {
    let limit = matches!(e, pagoda_model::ModelError::TemplateLimit(_));
    let error = RequestError::param("messages", format!("cannot apply the chat template: {e}"));
    if limit {
        error.with_code("invalid_template")
    } else {
        error
    }
}

/// The system-prompt section of the fallback: the tools as JSON, one a line, and the form
/// of a call.
pub fn fallback_system(tools: &[Tool]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query. The functions, as JSON:\n",
    );
    for t in tools {
        s.push_str(&serde_json::to_string(t).unwrap_or_default());
        s.push('\n');
    }
    s.push_str("\nTo call a function, write exactly this for each call, and nothing else:\n<tool_call>{\"name\": <function-name>, \"arguments\": <the arguments as a JSON object>}</tool_call>");
    s
}

/// `messages` for a template that does not know tools: calls as text, results as user turns,
/// and the tools in the system message.
pub fn fallback_messages(messages: Vec<ChatMessage>, tools: Option<&ToolSet>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    let mut previous_was_tool = false;
    for m in messages {
        if m.role == "tool" {
            let name = m.name.as_deref().unwrap_or("tool");
            let text = format!(
                "<tool_response name=\"{name}\">\n{}\n</tool_response>",
                m.content
            );
            match out.last_mut() {
                Some(last) if previous_was_tool => {
                    last.content.push('\n');
                    last.content.push_str(&text);
                }
                _ => out.push(ChatMessage::new("user", text)),
            }
            previous_was_tool = true;
            continue;
        }
        previous_was_tool = false;
        let mut content = m.content;
        for c in m.tool_calls.into_iter().flatten() {
            if !content.is_empty() {
                content.push('\n');
            }
            content.push_str(&format!(
                "{}{{\"name\": {}, \"arguments\": {}}}{}",
                parse::OPEN,
                Value::String(c.function.name),
                c.function.arguments,
                parse::CLOSE
            ));
        }
        out.push(ChatMessage::new(m.role, content));
    }
    if let Some(set) = tools {
        let section = fallback_system(&set.tools);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content.push_str("\n\n");
                first.content.push_str(&section);
            }
            _ => out.insert(0, ChatMessage::new("system", section)),
        }
    }
    out
}

/// Whitespace a forced call may have between two JSON tokens: up to 16 spaces, newlines or
/// tabs (a pretty-printed call's indentation fits; endless padding does not).
pub const FORCED_CALL_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,16}";

/// A forced call's constraint and the format its output is written in (what the output's
/// parser must read it as).
#[derive(Debug, Clone, PartialEq)]
pub struct ForcedCall {
    pub constraint: ConstraintSpec,
    pub format: ToolCallFormat,
}

/// The constraint that forces a call when `tool_choice` is `required` or names a function
/// (`None` for `auto`), in the model's own markup where there is a grammar of it
/// (`format` [`ToolCallFormat::Qwen3Coder`] when the template renders tools:
/// `forced_xml`), else in the JSON form [`forced_json_call`] writes (then parsed as
/// [`ToolCallFormat::Hermes`], whatever the model's format).
pub fn forced_call(
    set: &ToolSet,
    template_tools: bool,
    format: ToolCallFormat,
) -> Option<ForcedCall> {
    let allowed: Vec<&Tool> = match &set.choice {
        Choice::Auto => return None,
        Choice::Required => set.tools.iter().collect(),
        Choice::Named(n) => set.tools.iter().filter(|t| function_name(t) == n).collect(),
    };
    if template_tools && format == ToolCallFormat::Qwen3Coder {
        if let Some(g) = forced_xml::grammar(&allowed, set.parallel) {
            return Some(ForcedCall {
                constraint: ConstraintSpec::Lark(g),
                format,
            });
        }
    }
    Some(ForcedCall {
        constraint: forced_json_call(&allowed, set.parallel, template_tools),
        format: ToolCallFormat::Hermes,
    })
}

/// The first lines of a forced call's Lark grammar: `start` (one call, or with `parallel`
/// one or more a newline apart) and `call`: `open`, one of the `n` rules `fn_0`.., `close`
/// (Lark string contents, already escaped).
fn forced_grammar_head(n: usize, parallel: bool, open: &str, close: &str) -> String {
    let mut g = String::new();
    if parallel {
        g.push_str("start: call (\"\\n\" call)*\n");
    } else {
        g.push_str("start: call\n");
    }
    let alts: Vec<String> = (0..n).map(|i| format!("fn_{i}")).collect();
    g.push_str(&format!(
        "call: \"{open}\" ({}) \"{close}\"\n",
        alts.join(" | ")
    ));
    g
}

/// A Lark grammar of one `<tool_call>` (or, when `parallel`, one or more, a newline apart)
/// whose JSON is `{"name": <that tool's name>, "arguments": <its parameters schema>}`,
/// alternated over `allowed`. `newlines`: the JSON on its own line inside the tags, as
/// Qwen2.5's template writes calls; the fallback prompt asks for no newlines.
fn forced_json_call(allowed: &[&Tool], parallel: bool, newlines: bool) -> ConstraintSpec {
    let nl = if newlines { "\\n" } else { "" };
    let mut g = forced_grammar_head(
        allowed.len(),
        parallel,
        &format!("{}{nl}", parse::OPEN),
        &format!("{nl}{}", parse::CLOSE),
    );
    for (i, t) in allowed.iter().enumerate() {
        let mut params = t
            .function
            .as_ref()
            .and_then(|f| f.parameters.clone())
            .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
        // As a `json_schema` response format is: only the listed keys, unless it says more.
        pagoda_engine::close_objects(&mut params);
        // Written by hand so `name` comes before `arguments`, as the model writes them.
        // Whitespace between tokens is bounded (`FORCED_CALL_WHITESPACE`), so a call always
        // ends: with JSON's unbounded whitespace a model can pad a forced call until
        // `max_tokens` (a random-weight model does, every time).
        g.push_str(&format!(
            "fn_{i}: %json {{\"x-guidance\": {{\"whitespace_pattern\": {}}}, \"type\": \"object\", \"properties\": {{\"name\": {{\"const\": {}}}, \"arguments\": {}}}, \"required\": [\"name\", \"arguments\"], \"additionalProperties\": false}}\n",
            Value::String(FORCED_CALL_WHITESPACE.to_string()),
            Value::String(function_name(t).to_string()),
            params
        ));
    }
    ConstraintSpec::Lark(g)
}

/// A fresh call id: `call_` and 24 random letters and digits.
pub fn call_id() -> String {
    use rand::Rng;
    let suffix: String = rand::thread_rng()
        .sample_iter(&rand::distributions::Alphanumeric)
        .take(24)
        .map(char::from)
        .collect();
    format!("call_{suffix}")
}

#[cfg(test)]
mod tests;
