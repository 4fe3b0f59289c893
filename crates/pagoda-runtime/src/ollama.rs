//! The Ollama API's generation endpoints without HTTP, beside [`crate::openai`]: the
//! `/api/generate` and `/api/chat` [`Plan`] builders ([`check_generate`] / [`check_chat`]
//! without the model, then `plan`: prompt building from `system`, `raw`, `context` or the
//! messages and tools, `options` → [`Knobs`], `format`), and the output's tool calls as
//! Ollama writes them ([`ollama_output`], [`ollama_piece`]).
//!
//! Invariants: every check of a field is made here, once, before anything is submitted, in
//! the order Ollama's clients see them (the body's fields, then `keep_alive`, then the
//! messages; the model's own checks after it is loaded); generation lengths follow
//! [`LengthRule::Clamp`] whatever the caller's [`Bounds`] say; a constraint the engine
//! refuses is named `format` (Ollama's tools never force a call).

use crate::fields::{check_extra, check_ollama_message, check_ollama_options, Endpoint};
use crate::formats;
use crate::loader::LoadedModel;
use crate::plan::{plain, Plan};
use crate::request::{Bounds, Knobs, LengthField, LengthRule, RequestError};
use crate::structured::ollama_format;
use crate::tools::{self, OutputParser, Piece, ToolSet};
use pagoda_engine::ConstraintSpec;
use pagoda_model::chat_template::{ChatMessage, TemplateFunctionCall, TemplateToolCall};
use pagoda_protocol::ollama::{
    self, ChatRequest, GenerateRequest, Message, Options, ToolCall, ToolCallFunction,
};
use serde_json::{Map, Value};
use std::time::Duration;

/// A request's `keep_alive`: `None` when not given, `Some(None)` for "forever".
pub type KeepAlive = Option<Option<Duration>>;

/// An `/api/generate` body checked without the model ([`check_generate`]).
#[derive(Debug)]
pub struct CheckedGenerate<'a> {
    req: &'a GenerateRequest,
    constraint: Option<ConstraintSpec>,
    /// `think`: thinking switched on or off, or left to the template.
    think: Option<formats::Think>,
    /// How long the model stays loaded after this request.
    pub keep_alive: KeepAlive,
}

/// An `/api/chat` body checked without the model ([`check_chat`]).
#[derive(Debug)]
pub struct CheckedChat<'a> {
    req: &'a ChatRequest,
    constraint: Option<ConstraintSpec>,
    tools: Option<ToolSet>,
    messages: Vec<ChatMessage>,
    /// `think`: thinking switched on or off, or left to the template.
    think: Option<formats::Think>,
    /// How long the model stays loaded after this request.
    pub keep_alive: KeepAlive,
}

/// Everything about an `/api/generate` body that can be checked without the model: the
/// first half of its [`Plan`] builder.
pub fn check_generate(req: &GenerateRequest) -> Result<CheckedGenerate<'_>, RequestError> {
    check_extra(Endpoint::OllamaGenerate, &req.extra)?;
    if let Some(o) = &req.options {
        check_ollama_options(&o.extra)?;
    }
    let constraint = ollama_format(req.format.as_ref())?;
    refuse_images(req.images.as_ref().is_some_and(|i| !i.is_empty()))?;
    if req.template.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err(RequestError::param(
            "template",
            "template overrides are not supported; send `raw: true` with a rendered prompt",
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(RequestError::param("suffix", "suffix is not supported"));
    }
    Ok(CheckedGenerate {
        req,
        constraint,
        think: think(req.extra.get("think"))?,
        keep_alive: keep_alive(req.keep_alive.as_ref())?,
    })
}

impl CheckedGenerate<'_> {
    /// An empty request only loads the model (or unloads it with `keep_alive: 0`).
    pub fn loads_only(&self) -> bool {
        self.req.prompt.is_empty() && self.req.context.is_none()
    }

    /// The request's plan on `loaded`: `context` (earlier turns' tokens, checked against
    /// the vocabulary), then the prompt (`raw`, or with `system` through the chat template;
    /// no second BOS after a context), the knobs of `options` and `priority` with the
    /// model's Modelfile stops and length, and `format`'s constraint.
    pub fn plan(self, loaded: &LoadedModel, bounds: &Bounds) -> Result<Plan, RequestError> {
        let req = self.req;
        let mut prompt = Vec::new();
        if let Some(ctx) = &req.context {
            let vocab = loaded.tokenizer.vocab_size();
            if let Some(bad) = ctx.iter().find(|&&t| t as usize >= vocab) {
                return Err(RequestError::param(
                    "context",
                    format!("context token {bad} is out of range for a vocabulary of {vocab}"),
                ));
            }
            prompt.extend_from_slice(ctx);
        }
        let kwargs = formats::think_kwargs(loaded, self.think.as_ref())?;
        let turn = if req.raw {
            loaded.encode_rendered(&req.prompt)
        } else {
            let mut messages = Vec::new();
            if let Some(system) = &req.system {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", &req.prompt));
            loaded.encode_chat_with::<()>(&loaded.with_preset(messages), None, &kwargs)
        }
        .map_err(|e| RequestError::param("prompt", format!("cannot build the prompt: {e}")))?;
        let skip_bos = !prompt.is_empty() && turn.first() == loaded.tokenizer.bos_id().as_ref();
        prompt.extend(turn.into_iter().skip(usize::from(skip_bos)));
        let knobs = request_knobs(loaded, req.options.as_ref(), req.priority, self.constraint);
        finish(prompt, loaded, knobs, bounds, None, false)
    }
}

/// Everything about an `/api/chat` body that can be checked without the model: the first
/// half of its [`Plan`] builder.
pub fn check_chat(req: &ChatRequest) -> Result<CheckedChat<'_>, RequestError> {
    let images = req
        .messages
        .iter()
        .any(|m| m.images.as_ref().is_some_and(|i| !i.is_empty()));
    check_extra(Endpoint::OllamaChat, &req.extra)?;
    if let Some(o) = &req.options {
        check_ollama_options(&o.extra)?;
    }
    let constraint = ollama_format(req.format.as_ref())?;
    refuse_images(images)?;
    let tools = tools::check_ollama(req.tools.as_deref())?;
    let think = think(req.extra.get("think"))?;
    let keep_alive = keep_alive(req.keep_alive.as_ref())?;
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| template_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CheckedChat {
        req,
        constraint,
        tools,
        messages,
        think,
        keep_alive,
    })
}

impl CheckedChat<'_> {
    /// A request without messages only loads the model (or unloads it with
    /// `keep_alive: 0`).
    pub fn loads_only(&self) -> bool {
        self.req.messages.is_empty()
    }

    /// The request's plan on `loaded`: the messages and tools through the model's chat
    /// template (or the fallback prompt), the knobs of `options` and `priority` with the
    /// model's Modelfile stops and length, and `format`'s constraint.
    pub fn plan(self, loaded: &LoadedModel, bounds: &Bounds) -> Result<Plan, RequestError> {
        let req = self.req;
        let kwargs = formats::think_kwargs(loaded, self.think.as_ref())?;
        let prompt = tools::encode_prompt(loaded, self.messages, self.tools.as_ref(), &kwargs)?;
        let knobs = request_knobs(loaded, req.options.as_ref(), req.priority, self.constraint);
        let offered = self.tools.as_ref().map(ToolSet::offered);
        let template_tools = tools::template_renders_tools(loaded);
        finish(prompt, loaded, knobs, bounds, offered, template_tools)
    }
}

/// The plan of an Ollama prompt: the model's defaults (not OpenAI's), lengths
/// [`LengthRule::Clamp`] (generation ends at the context or the ceiling), `format` naming a
/// refused constraint, the output's formats (`template_tools`: the template rendered the
/// tools).
fn finish(
    prompt: Vec<u32>,
    loaded: &LoadedModel,
    knobs: Knobs,
    bounds: &Bounds,
    offered_tools: Option<tools::Offered>,
    template_tools: bool,
) -> Result<Plan, RequestError> {
    let bounds = bounds.with_rule(LengthRule::Clamp);
    let formats = formats::output_formats(loaded, &prompt, template_tools);
    let mut plan = plain(prompt, &loaded.default_sampling, knobs, &bounds)?;
    plan.constraint_field = Some("format");
    plan.offered_tools = offered_tools;
    plan.set_formats(formats);
    Ok(plan)
}

/// Ollama's `think`: `true` or `false`, or an effort level (`"low"`, `"medium"`,
/// `"high"`, for gpt-oss); `null` or absent leaves thinking to the template.
fn think(v: Option<&Value>) -> Result<Option<formats::Think>, RequestError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(formats::Think::Switch(*b))),
        Some(Value::String(e)) if formats::EFFORTS.contains(&e.as_str()) => {
            Ok(Some(formats::Think::Effort(e.clone())))
        }
        Some(other) => Err(RequestError::param(
            "think",
            format!("`think` must be true, false, \"low\", \"medium\" or \"high\", got {other}"),
        )),
    }
}

fn refuse_images(images: bool) -> Result<(), RequestError> {
    if images {
        return Err(RequestError::param(
            "images",
            "this server's models take text only; leave out `images`",
        ));
    }
    Ok(())
}

/// The request's `keep_alive`: `None` when not given.
fn keep_alive(k: Option<&ollama::KeepAlive>) -> Result<KeepAlive, RequestError> {
    k.map(|k| k.duration())
        .transpose()
        .map_err(|e| RequestError::param("keep_alive", e.to_string()))
}

/// `options` as generation knobs (`num_predict` < 0: until the context is full); its keys
/// beyond the implemented ones were checked by the `check_*` functions
/// ([`check_ollama_options`]).
fn knobs(options: Option<&Options>) -> Knobs {
    let mut k = Knobs {
        n: 1,
        ..Knobs::default()
    };
    let Some(o) = options else {
        return k;
    };
    k.temperature = o.temperature;
    k.top_k = o.top_k;
    k.top_p = o.top_p;
    k.min_p = o.min_p;
    k.repetition_penalty = o.repeat_penalty;
    k.repeat_last_n = o.repeat_last_n;
    k.presence_penalty = o.presence_penalty;
    k.frequency_penalty = o.frequency_penalty;
    k.seed = o.seed.and_then(|s| u64::try_from(s).ok());
    k.stop = o.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if o.num_predict.is_some() {
        // 0 is refused where every length is checked (`engine_request`), naming this field.
        k.max_tokens_field = LengthField::NumPredict;
    }
    k.max_tokens = match o.num_predict {
        None => None,
        Some(n) if n < 0 => None,
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    k
}

/// The knobs of `options` and `priority`, with the model's Modelfile stops and length, and
/// the `format` constraint.
fn request_knobs(
    loaded: &LoadedModel,
    options: Option<&Options>,
    priority: Option<i64>,
    constraint: Option<ConstraintSpec>,
) -> Knobs {
    let mut k = knobs(options);
    k.priority = priority;
    k.stop = loaded.stops_with(k.stop);
    if options.and_then(|o| o.num_predict).is_none() {
        k.max_tokens = loaded.default_max_tokens;
    }
    k.constraint = constraint;
    k
}

/// An Ollama message as the chat template takes it: its calls (arguments already objects)
/// and, on a `tool` message, the function's name (`tool_name`, or older clients' `name`).
/// Fields beyond those are checked ([`check_ollama_message`]); `name` on any other role is
/// refused.
fn template_message(i: usize, m: &Message) -> Result<ChatMessage, RequestError> {
    check_ollama_message(i, &m.extra)?;
    let name = m.extra.get("name").filter(|v| !v.is_null());
    if name.is_some() && m.role != "tool" {
        return Err(RequestError::param(
            format!("messages[{i}].name"),
            "`name` is read only on tool messages (the function's name; `tool_name` in newer clients)",
        ));
    }
    if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
        return Err(RequestError::param(
            "messages",
            format!(
                "unknown role `{}`; use system, user, assistant or tool",
                m.role
            ),
        ));
    }
    let mut out = ChatMessage::new(&m.role, &m.content);
    out.reasoning_content = m.thinking.clone().filter(|t| !t.is_empty());
    if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
        if m.role != "assistant" {
            return Err(RequestError::param(
                "messages",
                "only assistant messages carry tool_calls",
            ));
        }
        out.tool_calls = Some(
            calls
                .iter()
                .map(|c| TemplateToolCall {
                    id: None,
                    kind: "function".into(),
                    function: TemplateFunctionCall {
                        name: c.function.name.clone(),
                        arguments: c.function.arguments.clone(),
                    },
                })
                .collect(),
        );
    }
    if m.role == "tool" {
        out.name = match (&m.tool_name, name) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(Value::String(n))) => Some(n.clone()),
            (None, Some(other)) => {
                return Err(RequestError::param(
                    format!("messages[{i}].name"),
                    format!("`name` must be a string, got {other}"),
                ))
            }
            (None, None) => None,
        };
    }
    Ok(out)
}

/// What Ollama sends for a parsed piece.
#[derive(Debug, Clone, PartialEq)]
pub enum OllamaPiece {
    /// Message content.
    Text(String),
    /// Reasoning (`thinking`).
    Thinking(String),
    /// A whole call, its arguments an object.
    Call(String, Map<String, Value>),
}

/// A piece as Ollama sends it, or `None` for the pieces of a streamed call: Ollama sends
/// each call whole, in a message chunk of its own, when it ends. Ollama's `arguments` is an
/// object, so a streamed call whose arguments text is not one (cut off by `num_predict`, or
/// bad JSON the model wrote) is sent as content, verbatim from its `<tool_call>` — not as a
/// call with empty or guessed arguments, which a client would run: nothing the model wrote
/// is lost, and `done_reason: "length"` tells a cut-off one.
pub fn ollama_piece(p: Piece) -> Option<OllamaPiece> {
    match p {
        Piece::Content(c) => Some(OllamaPiece::Text(c)),
        Piece::Reasoning(r) => Some(OllamaPiece::Thinking(r)),
        Piece::CallStart { .. } | Piece::CallArguments(_) => None,
        Piece::Call(c) => Some(match serde_json::from_str(&c.arguments) {
            Ok(args) => OllamaPiece::Call(c.name, args),
            // A whole call's arguments are always an object.
            Err(_) => OllamaPiece::Call(c.name, Map::new()),
        }),
        Piece::CallEnd { call, text } => Some(match serde_json::from_str(&call.arguments) {
            Ok(args) => OllamaPiece::Call(call.name, args),
            Err(_) => OllamaPiece::Text(text),
        }),
    }
}

/// A call as Ollama's `tool_calls` entry, numbered `index`.
pub fn ollama_call(name: String, arguments: Map<String, Value>, index: usize) -> ToolCall {
    ToolCall {
        function: ToolCallFunction {
            index: Some(index),
            name,
            arguments: Value::Object(arguments),
        },
    }
}

/// A whole output as Ollama's message: its content (empty when calls were made and nothing
/// else but whitespace was written) and its calls (of the `offered` tools), as a stream
/// sends them ([`ollama_piece`]).
pub fn ollama_output(text: &str, offered: Vec<String>) -> (String, Option<Vec<ToolCall>>) {
    let (content, _, calls) = ollama_reply(OutputParser::new(offered), text);
    (content, calls)
}

/// A whole output through `parser`: its content (as [`ollama_output`]'s), its reasoning
/// (`thinking`, `None` when it wrote none) and its calls.
pub fn ollama_reply(
    parser: OutputParser,
    text: &str,
) -> (String, Option<String>, Option<Vec<ToolCall>>) {
    let pieces = parser.parse(text);
    let (mut content, mut thinking, mut calls) = (String::new(), None::<String>, Vec::new());
    for piece in pieces.into_iter().filter_map(ollama_piece) {
        match piece {
            OllamaPiece::Text(c) => content.push_str(&c),
            OllamaPiece::Thinking(t) => thinking.get_or_insert_with(String::new).push_str(&t),
            OllamaPiece::Call(name, args) => {
                let index = calls.len();
                calls.push(ollama_call(name, args, index));
            }
        }
    }
    if calls.is_empty() {
        (content, thinking, None)
    } else {
        if content.trim().is_empty() {
            content.clear();
        }
        (content, thinking, Some(calls))
    }
}
