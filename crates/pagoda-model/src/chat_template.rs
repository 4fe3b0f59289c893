//! Chat templates: a model's Jinja template (from GGUF `tokenizer.chat_template` or
//! `tokenizer_config.json`) rendered with minijinja the way `transformers`'
//! `apply_chat_template` renders it with Python jinja2.
//!
//! What we match from transformers: `trim_blocks` and `lstrip_blocks` on, Python string and
//! dict methods (`.strip()`, `.startswith()`, `.items()`, ... via minijinja-contrib's pycompat),
//! `raise_exception(msg)`, `strftime_now(fmt)`, and a `tojson` filter that writes what Python's
//! `json.dumps(x, ensure_ascii=False)` writes (`", "` and `": "` separators, optional indent).
//! Variables: `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and `tools` (the
//! list of `{"type": "function", "function": {...}}` objects, or none) as
//! `apply_chat_template(tools=...)` passes them. A message may carry `tool_calls` (with
//! `function.arguments` a JSON value, not a string: transformers' templates, Qwen2.5's among
//! them, write it with `| tojson`), `tool_call_id` and `reasoning_content` (an assistant
//! turn's reasoning, which Qwen3's and Gemma 4's templates read); fields that are absent are
//! undefined in the template, as keys missing from a Python dict are. Extra variables (vLLM's
//! `chat_template_kwargs`, e.g. `enable_thinking`) join the context as `apply_chat_template`'s
//! `**kwargs` do ([`ChatTemplate::render_with`]). The real templates of the families Pagoda
//! serves render as transformers renders them: `tests/it/chat_templates.rs` checks them against
//! goldens made by `scripts/golden_templates.py`.
//!
//! Invariant: a template is compiled once, in [`ChatTemplate::new`]; a syntax error is reported
//! there, not at the first request.
//!
//! Limits: a template is input like any other (a GGUF file carries one, `/api/create` takes
//! one from a client), so compiling and rendering are bounded: at most [`MAX_TEMPLATE_BYTES`]
//! of source; a render runs at most [`TEMPLATE_FUEL`] instructions (minijinja's fuel) and
//! writes at most [`MAX_RENDERED_BYTES`]; minijinja's own bounds hold the parser's nesting
//! (150), macro and include recursion (500), `range` (100,000 items) and string repetition
//! (100 MB); [`crate::template_check`] keeps a namespace from ending up inside a namespace
//! (a value that contains itself). Both compiling and rendering run on a thread of their own with a deep stack
//! ([`crate::isolated`]), so recursion or a panic inside minijinja fails the one template or
//! request, with [`ModelError::TemplateLimit`] or [`ModelError::ChatTemplate`]. The memory of
//! intermediate values (a namespace attribute that doubles a string each loop turn allocates
//! gigabytes within its fuel) is bounded by rendering in [`crate::template_sandbox`]'s worker
//! processes, which the `pagoda` binary installs for every command.

use crate::isolated::{run_isolated, DEEP_STACK_BYTES};
use crate::template_sandbox;
use crate::ModelError;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;

/// The template used when a model ships none: ChatML, as `transformers` used to default to.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Largest template source accepted (real models' templates are under 20 KB).
pub const MAX_TEMPLATE_BYTES: usize = 256 * 1024;

/// Instructions one render may run. Measured on the 70 real templates llama.cpp ships
/// (`fuel_of_real_templates`): 100 to 600 for one turn, and for 201 messages with a tool from
/// 5,000 up to 171,000 (Gemma 4's, the costliest: ~850 a message), so this covers ~11,000
/// messages of the costliest template while a template bomb stops within about a second.
pub const TEMPLATE_FUEL: u64 = 10_000_000;

/// Most bytes one render may write (the prompt it makes). Twice the server's default body
/// limit: a template repeats the conversation at most once or twice.
pub const MAX_RENDERED_BYTES: usize = 8 << 20;

/// Extra variables of a render's context, by name ([`ChatTemplate::render_with`]).
pub type TemplateKwargs = serde_json::Map<String, serde_json::Value>;

/// The variables every render sets itself: a template keyword may not be one of them.
pub const RESERVED_TEMPLATE_VARIABLES: [&str; 5] = [
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// One turn of a conversation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// The calls an assistant turn made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<TemplateToolCall>>,
    /// On a `tool` turn: the call this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` turn: the function whose result this is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// On an assistant turn: its reasoning, given apart from `content` (OpenAI
    /// `reasoning_content`, Ollama `thinking`), as Qwen3's and Gemma 4's templates read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }
}

/// A call in an assistant turn, as templates read it: `{"id", "type": "function",
/// "function": {"name", "arguments": <JSON value>}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: TemplateFunctionCall,
}

/// `function` of a [`TemplateToolCall`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateFunctionCall {
    pub name: String,
    pub arguments: serde_json::Value,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl Clone for ChatTemplate {
    fn clone(&self) -> Self {
        // Recompiling a template that compiled once cannot fail.
        Self::new(
            self.source.clone(),
            self.bos_token.clone(),
            self.eos_token.clone(),
        )
        .unwrap_or_else(|_| unreachable!("template compiled before"))
    }
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos_token` / `eos_token` are the texts the template sees.
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<Self, ModelError> {
        if source.len() > MAX_TEMPLATE_BYTES {
            return Err(ModelError::TemplateLimit(format!(
                "the chat template is {} bytes, more than the limit of {MAX_TEMPLATE_BYTES}",
                source.len()
            )));
        }
        crate::template_check::check(&source)
            .map_err(|crate::template_check::Refused(m)| ModelError::TemplateLimit(m))?;
        run_isolated("compiling the chat template", DEEP_STACK_BYTES, || {
            Self::compile(source, bos_token, eos_token)
        })
        .map_err(|e| ModelError::ChatTemplate(e.to_string()))?
    }

    fn compile(source: String, bos_token: String, eos_token: String) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        // No debug info in errors: it quotes the template and the render's variables (a
        // client's messages) back, and its formatting panicked on spans the fuzzer made.
        env.set_debug(false);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_test("iterable", is_iterable);
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| ModelError::ChatTemplate(format!("cannot compile the template: {e}")))?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token,
            eos_token,
        })
    }

    /// The built-in ChatML template.
    pub fn chatml(bos_token: String, eos_token: String) -> Self {
        Self::new(CHATML_TEMPLATE.to_string(), bos_token, eos_token)
            .unwrap_or_else(|_| unreachable!("the built-in template compiles"))
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt`, ends with the assistant's turn opener.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        self.render_with_tools::<()>(messages, None, add_generation_prompt)
    }

    /// [`Self::render_with`] without template keywords.
    pub fn render_with_tools<T: Serialize>(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[T]>,
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        self.render_with(
            messages,
            tools,
            add_generation_prompt,
            &TemplateKwargs::new(),
        )
    }

    /// Renders `messages` with `tools` (each serialized as the template sees it: a struct's
    /// fields keep their order, as a Python dict's keys do) and `kwargs`, extra variables of
    /// the template's context as `apply_chat_template(**kwargs)` passes them (vLLM's
    /// `chat_template_kwargs`: `enable_thinking`, ...). A keyword never replaces `messages`,
    /// `tools`, `add_generation_prompt`, `bos_token` or `eos_token` (callers refuse those
    /// names, [`RESERVED_TEMPLATE_VARIABLES`]).
    /// In a [`crate::template_sandbox`] worker when the binary installed them, else here.
    pub fn render_with<T: Serialize>(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[T]>,
        add_generation_prompt: bool,
        kwargs: &TemplateKwargs,
    ) -> Result<String, ModelError> {
        let tools = tools
            .map(|tools| tools.iter().map(serde_json::to_value).collect())
            .transpose()
            .map_err(|e| ModelError::ChatTemplate(format!("cannot pass the tools: {e}")))?;
        let job = RenderJob {
            source: self.source.as_str().into(),
            bos_token: self.bos_token.as_str().into(),
            eos_token: self.eos_token.as_str().into(),
            messages: messages.into(),
            tools,
            add_generation_prompt,
            kwargs: Cow::Borrowed(kwargs),
        };
        let line = serde_json::to_string(&job)
            .map_err(|e| ModelError::ChatTemplate(format!("cannot pass the messages: {e}")))?;
        match template_sandbox::exchange(&line) {
            Some(Ok(reply)) => serde_json::from_str::<RenderReply>(&reply)
                .map_err(|e| {
                    ModelError::ChatTemplate(format!("a bad answer from the template worker: {e}"))
                })?
                .into_result(),
            Some(Err(stopped)) => Err(ModelError::TemplateLimit(stopped.to_string())),
            None => self.render_in_process(
                messages,
                job.tools.as_deref(),
                add_generation_prompt,
                kwargs,
            ),
        }
    }

    /// Renders in this process, on a deep-stack thread, under fuel and the output limit.
    pub(crate) fn render_in_process<T: Serialize>(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[T]>,
        add_generation_prompt: bool,
        kwargs: &TemplateKwargs,
    ) -> Result<String, ModelError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        let context = minijinja::context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            ..Value::from_serialize(kwargs)
        };
        let rendered = run_isolated("rendering the chat template", DEEP_STACK_BYTES, || {
            let mut out = BoundedOutput::default();
            let result = tmpl.render_captured_to(context, &mut out);
            (result.map(|_| ()), out)
        })
        .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        match rendered {
            (Ok(()), out) => String::from_utf8(out.bytes)
                .map_err(|_| ModelError::ChatTemplate("the template wrote invalid UTF-8".into())),
            (Err(_), out) if out.overflowed => Err(ModelError::TemplateLimit(format!(
                "rendering the chat template wrote more than the limit of {MAX_RENDERED_BYTES} bytes"
            ))),
            (Err(e), _) if e.kind() == ErrorKind::OutOfFuel => Err(ModelError::TemplateLimit(
                format!(
                    "rendering the chat template ran more than the limit of {TEMPLATE_FUEL} instructions"
                ),
            )),
            (Err(e), _) => Err(ModelError::ChatTemplate(e.to_string())),
        }
    }

    /// Renders a short sample conversation (system, user, assistant, user) under the render
    /// limits, so a template that cannot render within them is refused where it is given
    /// (`/api/create`, `pagoda create`) rather than at every request. `Err` only for a limit
    /// ([`ModelError::TemplateLimit`]) or a crash: a template may refuse the sample's roles
    /// (`raise_exception`) and still serve the conversations it was written for.
    pub fn check_limits(&self) -> Result<(), ModelError> {
        let sample = [
            ChatMessage::new("system", "You are helpful."),
            ChatMessage::new("user", "Hello."),
            ChatMessage::new("assistant", "Hi! How can I help?"),
            ChatMessage::new("user", "Tell me a joke."),
        ];
        match self.render(&sample, true) {
            Err(e @ ModelError::TemplateLimit(_)) => Err(e),
            Err(ModelError::ChatTemplate(m)) if m.starts_with("internal error") => {
                Err(ModelError::ChatTemplate(m))
            }
            _ => Ok(()),
        }
    }

    /// Whether the template reads a `tools` variable (Qwen2.5's does; SmolLM2's and the
    /// ChatML fallback do not): then tools are rendered by the template itself.
    pub fn supports_tools(&self) -> bool {
        self.env
            .get_template(NAME)
            .is_ok_and(|t| t.undeclared_variables(false).contains("tools"))
    }
}

/// One render as sent to a [`template_sandbox`] worker.
#[derive(Debug, Serialize, Deserialize)]
struct RenderJob<'a> {
    source: Cow<'a, str>,
    bos_token: Cow<'a, str>,
    eos_token: Cow<'a, str>,
    messages: Cow<'a, [ChatMessage]>,
    /// Each tool as the template sees it (maps keep the order written), or none.
    tools: Option<Vec<serde_json::Value>>,
    add_generation_prompt: bool,
    /// Extra template variables ([`ChatTemplate::render_with`]).
    #[serde(default)]
    kwargs: Cow<'a, TemplateKwargs>,
}

/// A worker's answer to one [`RenderJob`].
#[derive(Debug, Serialize, Deserialize)]
enum RenderReply {
    Rendered(String),
    /// Over a render limit: [`ModelError::TemplateLimit`].
    Limit(String),
    /// Any other failure: [`ModelError::ChatTemplate`].
    Failed(String),
}

impl RenderReply {
    fn from_result(result: Result<String, ModelError>) -> RenderReply {
        match result {
            Ok(text) => RenderReply::Rendered(text),
            Err(ModelError::TemplateLimit(m)) => RenderReply::Limit(m),
            Err(ModelError::ChatTemplate(m)) => RenderReply::Failed(m),
            Err(other) => RenderReply::Failed(other.to_string()),
        }
    }

    fn into_result(self) -> Result<String, ModelError> {
        match self {
            RenderReply::Rendered(text) => Ok(text),
            RenderReply::Limit(m) => Err(ModelError::TemplateLimit(m)),
            RenderReply::Failed(m) => Err(ModelError::ChatTemplate(m)),
        }
    }
}

/// Compiled templates a worker keeps (a server renders with a handful).
const COMPILED_KEPT: usize = 32;

/// The worker's side of [`template_sandbox`]: under the worker's limits, renders each
/// [`RenderJob`] line of `input` and answers on `output`, keeping the templates it compiled.
/// Called by the binary's hidden worker command.
pub fn serve_worker(
    input: impl std::io::BufRead,
    output: impl std::io::Write,
) -> std::io::Result<()> {
    let mut compiled = HashMap::new();
    template_sandbox::serve(input, output, |line| answer_job(&mut compiled, line))
}

type Compiled = HashMap<(String, String, String), ChatTemplate>;

/// The answer line to one job line.
fn answer_job(compiled: &mut Compiled, line: &str) -> String {
    let reply = match serde_json::from_str::<RenderJob<'_>>(line) {
        Ok(job) => RenderReply::from_result(render_job(compiled, job)),
        Err(e) => RenderReply::Failed(format!("the template worker got a bad job: {e}")),
    };
    serde_json::to_string(&reply).unwrap_or_else(|e| {
        format!(
            r#"{{"Failed":"cannot write the answer: {}"}}"#,
            e.to_string().replace('"', "'")
        )
    })
}

fn render_job(compiled: &mut Compiled, job: RenderJob<'_>) -> Result<String, ModelError> {
    let key = (
        job.source.into_owned(),
        job.bos_token.into_owned(),
        job.eos_token.into_owned(),
    );
    if !compiled.contains_key(&key) {
        if compiled.len() >= COMPILED_KEPT {
            compiled.clear();
        }
        let template = ChatTemplate::new(key.0.clone(), key.1.clone(), key.2.clone())?;
        compiled.insert(key.clone(), template);
    }
    let template = compiled
        .get(&key)
        .ok_or_else(|| ModelError::ChatTemplate("the compiled template went missing".into()))?;
    template.render_in_process(
        &job.messages,
        job.tools.as_deref(),
        job.add_generation_prompt,
        &job.kwargs,
    )
}

/// The render's output, refusing to grow past [`MAX_RENDERED_BYTES`].
#[derive(Default)]
struct BoundedOutput {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDERED_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("the rendered prompt is too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Jinja2's `iterable` test: whatever Python can iterate. `None` cannot (minijinja's own
/// test says it can: Qwen3-Coder's `tools is iterable and tools | length > 0` then fails on
/// `tools=None`); an undefined value can (jinja2's `Undefined` iterates as empty).
fn is_iterable(value: &Value) -> bool {
    !value.is_none() && (value.is_undefined() || value.try_iter().is_ok())
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)` with the common `%` codes, in UTC.
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(&fmt, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats Unix time `secs` (UTC) with strftime codes `%Y %m %d %e %H %M %S %B %b %A %a %j %y %%`.
pub(crate) fn strftime(fmt: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{:02}", sod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", sod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", sod % 60)),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `tojson` as transformers defines it: `json.dumps(value, ensure_ascii=False, indent=indent)`.
/// Maps keep the order the template sees them in (a struct's field order, as a Python dict
/// keeps its keys' insertion order), unless `sort_keys`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    python_json(&value, indent, sort_keys.unwrap_or(false), 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn python_json(
    v: &Value,
    indent: Option<usize>,
    sort: bool,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    use minijinja::value::ValueKind;
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                python_json(x, indent, sort, level + 1, out)?;
            }
            newline(out, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for k in v.try_iter()? {
                let item = v.get_item(&k)?;
                let key = k.as_str().map_or_else(|| k.to_string(), str::to_string);
                entries.push((key, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if sort {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (k, x)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                python_json(x, indent, sort, level + 1, out)?;
            }
            newline(out, level);
            out.push('}');
        }
        _ => {
            let json = serde_json::to_value(v)
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
            match json {
                serde_json::Value::Null => out.push_str("null"),
                serde_json::Value::Bool(b) => out.push_str(if b { "true" } else { "false" }),
                serde_json::Value::Number(n) => out.push_str(&n.to_string()),
                serde_json::Value::String(s) => {
                    out.push_str(&serde_json::to_string(&s).unwrap_or_default())
                }
                other => out.push_str(&other.to_string()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job<'a>(source: &'a str, messages: &'a [ChatMessage]) -> RenderJob<'a> {
        RenderJob {
            source: source.into(),
            bos_token: "<s>".into(),
            eos_token: "</s>".into(),
            messages: messages.into(),
            tools: None,
            add_generation_prompt: true,
            kwargs: Cow::Owned(TemplateKwargs::new()),
        }
    }

    /// What a worker answers to `lines` (without the worker's process limits).
    fn worker_answers(lines: &[String]) -> Vec<RenderReply> {
        let input = lines.join("\n");
        let mut out = Vec::new();
        let mut compiled = HashMap::new();
        template_sandbox::answer_lines(input.as_bytes(), &mut out, false, |l| {
            answer_job(&mut compiled, l)
        })
        .unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn a_worker_answers_each_job_as_the_in_process_render_does() {
        let messages = [ChatMessage::new("user", "Hi \"there\"\n")];
        let expected = ChatTemplate::new(CHATML_TEMPLATE.into(), "<s>".into(), "</s>".into())
            .unwrap()
            .render_in_process::<()>(&messages, None, true, &TemplateKwargs::new())
            .unwrap();
        let line = serde_json::to_string(&job(CHATML_TEMPLATE, &messages)).unwrap();
        let replies = worker_answers(&[line.clone(), "not json".into(), line]);
        assert_eq!(replies.len(), 3);
        assert!(matches!(&replies[0], RenderReply::Rendered(t) if *t == expected));
        assert!(matches!(&replies[1], RenderReply::Failed(m) if m.contains("bad job")));
        assert!(matches!(&replies[2], RenderReply::Rendered(t) if *t == expected));
    }

    #[test]
    fn a_worker_reports_limits_and_template_errors_as_the_in_process_render_does() {
        let messages = [ChatMessage::new("user", "x")];
        let bomb =
            "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
        let broken = "{% for m in messages %}";
        let raising = "{{ raise_exception('no system role') }}";
        let replies = worker_answers(&[
            serde_json::to_string(&job(bomb, &messages)).unwrap(),
            serde_json::to_string(&job(broken, &messages)).unwrap(),
            serde_json::to_string(&job(raising, &messages)).unwrap(),
        ]);
        assert!(matches!(&replies[0], RenderReply::Limit(m) if m.contains("instructions")));
        assert!(matches!(&replies[1], RenderReply::Failed(m) if m.contains("compile")));
        assert!(matches!(&replies[2], RenderReply::Failed(m) if m.contains("no system role")));
    }

    #[test]
    fn a_worker_sees_tools_with_their_keys_in_the_order_written() {
        let tools = vec![serde_json::json!({"z": 1, "a": {"y": true, "b": null}})];
        let messages = [ChatMessage::new("user", "x")];
        let mut j = job("{{ tools | tojson }}", &messages);
        j.tools = Some(tools);
        let replies = worker_answers(&[serde_json::to_string(&j).unwrap()]);
        assert!(
            matches!(&replies[0], RenderReply::Rendered(t) if t == r#"[{"z": 1, "a": {"y": true, "b": null}}]"#),
            "{replies:?}"
        );
    }

    fn compile(source: &str) -> Result<ChatTemplate, ModelError> {
        ChatTemplate::new(source.into(), String::new(), String::new())
    }

    #[test]
    fn a_loop_bomb_runs_out_of_fuel() {
        let bomb = compile(
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        )
        .expect("compiles");
        let e = bomb
            .render(&[ChatMessage::new("user", "hi")], true)
            .expect_err("out of fuel");
        assert!(
            matches!(&e, ModelError::TemplateLimit(m) if m.contains("instructions")),
            "{e}"
        );
        assert!(matches!(
            bomb.check_limits(),
            Err(ModelError::TemplateLimit(_))
        ));
    }

    #[test]
    fn output_past_the_limit_stops_the_render() {
        // The issue's template: it writes before it runs out of fuel.
        let bomb = compile(
            "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
        )
        .expect("compiles");
        let e = bomb.render(&[], true).expect_err("too long or out of fuel");
        assert!(matches!(e, ModelError::TemplateLimit(_)), "{e}");
        let wide =
            compile("{% for a in range(100) %}{{ 'y' * 100000 }}{% endfor %}").expect("compiles");
        let e = wide.render(&[], true).expect_err("too long");
        assert!(
            matches!(&e, ModelError::TemplateLimit(m) if m.contains("bytes")),
            "{e}"
        );
    }

    #[test]
    fn recursion_and_size_are_errors_not_crashes() {
        let recursive =
            compile("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").expect("compiles");
        let e = recursive.render(&[], true).expect_err("too deep");
        assert!(
            matches!(
                e,
                ModelError::ChatTemplate(_) | ModelError::TemplateLimit(_)
            ),
            "{e}"
        );
        let deep = format!("{{{{ {}1{} }}}}", "(".repeat(5000), ")".repeat(5000));
        assert!(compile(&deep).is_err());
        let big = "x".repeat(MAX_TEMPLATE_BYTES + 1);
        assert!(matches!(compile(&big), Err(ModelError::TemplateLimit(_))));
    }

    /// Found by the `chat_template` fuzz target: `{% set ns.x = ns %}` then printing `ns.x`
    /// recursed without end and overflowed even the deep stack (an abort).
    #[test]
    fn regression_namespace_holds_itself() {
        let found = include_bytes!(
            "../../../fuzz/seeds/chat_template/regression_namespace_holds_itself.jinja"
        );
        let e = compile(&String::from_utf8_lossy(found)).expect_err("refused");
        assert!(
            matches!(&e, ModelError::TemplateLimit(m) if m.contains("namespace")),
            "{e}"
        );
        let e = compile("{% set ns = namespace(x=0) %}{% set ns.x = ns %}{{ ns.x }}")
            .expect_err("refused");
        assert!(matches!(e, ModelError::TemplateLimit(_)), "{e}");
    }

    /// A namespace attribute wrapped in a list once per loop turn would nest as deep as the
    /// fuel allows, and printing it would recurse that deep (past the deep stack at about a
    /// million levels): refused when the template compiles.
    /// Found by the `chat_template` fuzz target: formatting a render error's debug info (a
    /// source excerpt with a caret line) computed a negative width for a span and panicked.
    /// Errors carry no debug info now.
    #[test]
    fn regression_error_debug_info_span() {
        let found = include_bytes!(
            "../../../fuzz/seeds/chat_template/regression_error_debug_info_span.jinja"
        );
        let t = compile(&String::from_utf8_lossy(found)).expect("compiles");
        let e = t
            .render(&[ChatMessage::new("user", "hi")], true)
            .expect_err("fails at render");
        assert!(matches!(e, ModelError::ChatTemplate(_)), "{e}");
        // A panic caught by `isolated` would say "internal error".
        assert!(!e.to_string().contains("internal error"), "{e}");
    }

    #[test]
    fn a_namespace_wrapped_in_itself_is_refused() {
        for bomb in [
            "{% set ns = namespace(l=[]) %}{% for a in range(1000) %}{% for b in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}{% endfor %}{{ ns.l }}",
            "{% set ns = namespace(l=[]) %}{% set ns.l = {'a': ns.l} %}",
            "{% set ns = namespace(l=[]) %}{% set ns.l = (ns.l, 1) %}",
            "{% set ns = namespace(l=[]) %}{% set ns.l = ns.l | batch(1) %}",
            "{% set ns = namespace(l=[]) %}{% set ns.l = dict(a=ns.l) %}",
        ] {
            let e = compile(bomb).expect_err(bomb);
            assert!(matches!(&e, ModelError::TemplateLimit(m) if m.contains("nest")), "{bomb}: {e}");
        }
    }

    #[test]
    fn real_templates_render_a_long_conversation_well_within_fuel() {
        let t = ChatTemplate::chatml(String::new(), "<|im_end|>".into());
        let conversation: Vec<ChatMessage> = (0..1000)
            .map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, "some words"))
            .collect();
        t.render(&conversation, true).expect("within the limits");
        assert!(t.check_limits().is_ok());
    }

    /// Measures the fuel real templates spend (llama.cpp's `models/templates/*.jinja`, from
    /// the llama-cpp-python sdist): `PAGODA_TEMPLATES_DIR=... cargo test -p pagoda-model
    /// --lib fuel_of_real_templates -- --ignored --nocapture`. The figures are in
    /// docs/serving.md's security model.
    #[test]
    #[ignore = "needs PAGODA_TEMPLATES_DIR"]
    fn fuel_of_real_templates() {
        let dir = std::env::var("PAGODA_TEMPLATES_DIR").expect("PAGODA_TEMPLATES_DIR");
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("dir")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
            .collect();
        entries.sort();
        let tool = serde_json::json!({"type": "function", "function": {"name": "get_weather",
            "description": "Weather in a city", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
        let turns = |n: usize| -> Vec<ChatMessage> {
            let mut m = vec![ChatMessage::new("system", "You are helpful.")];
            for i in 0..n {
                m.push(ChatMessage::new("user", format!("question {i}")));
                m.push(ChatMessage::new("assistant", format!("answer {i}")));
            }
            m.push(ChatMessage::new("user", "last"));
            m
        };
        let mut worst = (0u64, String::new());
        for path in entries {
            let source = std::fs::read_to_string(&path).expect("read");
            let t = match compile(&source) {
                Ok(t) => t,
                Err(e) => {
                    println!("{}: refused: {e}", path.display());
                    assert!(!matches!(e, ModelError::TemplateLimit(_)), "{e}");
                    continue;
                }
            };
            let mut spent = Vec::new();
            for n in [1usize, 100] {
                let tmpl = t.env.get_template(NAME).expect("template");
                let tools = [tool.clone()];
                let ctx = minijinja::context! { messages => turns(n), tools => &tools[..],
                add_generation_prompt => true, bos_token => "<s>", eos_token => "</s>" };
                match tmpl.render_captured(ctx) {
                    Ok(done) => spent.push(done.state().fuel_levels().map_or(0, |f| f.0)),
                    Err(_) => spent.push(0),
                }
            }
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            println!(
                "{name}: 1 turn {} fuel, 100 turns {} fuel",
                spent[0], spent[1]
            );
            if spent[1] > worst.0 {
                worst = (spent[1], name);
            }
        }
        println!("most: {} ({})", worst.0, worst.1);
    }

    #[test]
    fn chatml_fallback_renders() {
        let t = ChatTemplate::chatml(String::new(), "<|im_end|>".into());
        let s = t.render(&[ChatMessage::new("user", "hi")], true).unwrap();
        assert_eq!(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn python_methods_raise_and_tojson() {
        let t = ChatTemplate::new(
            "{% if messages[0].role == 'bad' %}{{ raise_exception('no ' + messages[0].role) }}{% endif %}{{ messages[0].content.strip().upper() }}|{{ messages[0].content.startswith(' a') }}|{{ {'k': [1, 'é<']} | tojson }}".into(),
            "<s>".into(),
            "</s>".into(),
        )
        .unwrap();
        let s = t
            .render(&[ChatMessage::new("user", " ab ")], false)
            .unwrap();
        // Booleans print as Python does.
        assert_eq!(s, "AB|True|{\"k\": [1, \"é<\"]}");
        let e = t
            .render(&[ChatMessage::new("bad", "x")], false)
            .unwrap_err();
        assert!(e.to_string().contains("no bad"), "{e}");
        assert!(ChatTemplate::new("{% for %}".into(), String::new(), String::new()).is_err());
    }

    #[test]
    fn tools_reach_the_template_in_field_order() {
        #[derive(Serialize)]
        struct F {
            name: &'static str,
            description: &'static str,
        }
        #[derive(Serialize)]
        struct T {
            r#type: &'static str,
            function: F,
        }
        let t = ChatTemplate::new(
            "{% for t in tools %}{{ t | tojson }}{% endfor %}|{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}".into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        assert!(t.supports_tools());
        let mut m = ChatMessage::new("assistant", "");
        m.tool_calls = Some(vec![TemplateToolCall {
            id: None,
            kind: "function".into(),
            function: TemplateFunctionCall {
                name: "f".into(),
                arguments: serde_json::json!({"b": 1, "a": [true, null]}),
            },
        }]);
        let tools = [T {
            r#type: "function",
            function: F {
                name: "f",
                description: "d",
            },
        }];
        let s = t.render_with_tools(&[m], Some(&tools), false).unwrap();
        assert_eq!(
            s,
            // Maps keep their insertion order too (minijinja's preserve_order), as Python
            // dicts and transformers' `tojson` (sort_keys=False) do.
            "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\"}}|{\"b\": 1, \"a\": [true, null]}"
        );
        assert!(!ChatTemplate::chatml(String::new(), String::new()).supports_tools());
    }

    #[test]
    fn strftime_known_dates() {
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %A %j", 0),
            "1970-01-01 00:00:00 Thursday 001"
        );
        // 2024-02-29 12:34:56 UTC
        assert_eq!(
            strftime("%d %B %Y %a %b %j", 1_709_210_096),
            "29 February 2024 Thu Feb 060"
        );
    }
}
