//! `/api/generate` and `/api/chat`: prompt building (template, `system`, `raw`, `context`),
//! then one object per token as NDJSON (or one object when `stream: false`), ending with
//! `done: true`, the done reason and the counts and durations. An empty prompt (or no
//! messages) only loads the model — or unloads it with `keep_alive: 0` — as Ollama does.

use super::{keep_alive, knobs, line, respond};
use crate::clock::rfc3339;
use crate::error::ApiError;
use crate::generation::Generation;
use crate::registry::Lease;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_engine::{FinishReason, RequestTimings, TokenEvent, Usage};
use pagoda_model::chat_template::{ChatMessage, TemplateFunctionCall, TemplateToolCall};
use pagoda_protocol::ollama::{
    ChatRequest, ChatResponse, FinalStats, GenerateRequest, GenerateResponse, Message, Options,
    ToolCall, ToolCallFunction,
};
use pagoda_runtime::fields::{check_extra, check_ollama_message, check_ollama_options, Endpoint};
use pagoda_runtime::structured::ollama_format;
use pagoda_runtime::tools::{self, OutputParser, Piece};
use pagoda_runtime::{engine_request, Knobs, LengthRule};
use serde_json::{Map, Value};
use std::time::{Duration, SystemTime};

/// Which endpoint's objects to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Generate,
    Chat,
}

pub(super) async fn generate(State(app): State<AppState>, body: Body) -> Response {
    let result = run_generate(&app, body).await;
    respond(&app, result)
}

pub(super) async fn chat(State(app): State<AppState>, body: Body) -> Response {
    let result = run_chat(&app, body).await;
    respond(&app, result)
}

fn refuse_images(images: bool) -> Result<(), ApiError> {
    if images {
        return Err(ApiError::invalid_param(
            "images",
            "this server's models take text only; leave out `images`",
        ));
    }
    Ok(())
}

async fn run_generate(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: GenerateRequest = crate::body::json(body, app.body_limits()).await?;
    app.admit()?;
    check_extra(Endpoint::OllamaGenerate, &req.extra)?;
    if let Some(o) = &req.options {
        check_ollama_options(&o.extra)?;
    }
    let constraint = ollama_format(req.format.as_ref())?;
    refuse_images(req.images.as_ref().is_some_and(|i| !i.is_empty()))?;
    if req.template.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::invalid_param(
            "template",
            "template overrides are not supported; send `raw: true` with a rendered prompt",
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param("suffix", "suffix is not supported"));
    }
    let keep = keep_alive(req.keep_alive.as_ref())?;
    let name = app.model_or_default(&req.model).to_string();
    if req.prompt.is_empty() && req.context.is_none() {
        return load_or_unload(app, &name, keep, Kind::Generate).await;
    }
    let (lease, load) = acquire_timed(app, &name, keep).await?;
    let loaded = &lease.loaded;
    let mut prompt = Vec::new();
    if let Some(ctx) = &req.context {
        let vocab = loaded.tokenizer.vocab_size();
        if let Some(bad) = ctx.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid_param(
                "context",
                format!("context token {bad} is out of range for a vocabulary of {vocab}"),
            ));
        }
        prompt.extend_from_slice(ctx);
    }
    let turn = if req.raw {
        loaded.encode_rendered(&req.prompt)
    } else {
        let mut messages = Vec::new();
        if let Some(system) = &req.system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", &req.prompt));
        loaded.encode_chat(&loaded.with_preset(messages))
    }
    .map_err(|e| ApiError::invalid_param("prompt", format!("cannot build the prompt: {e}")))?;
    let skip_bos = !prompt.is_empty() && turn.first() == loaded.tokenizer.bos_id().as_ref();
    prompt.extend(turn.into_iter().skip(usize::from(skip_bos)));
    let mut knobs = request_knobs(&lease, req.options.as_ref(), req.priority)?;
    knobs.constraint = constraint;
    run(
        app,
        lease,
        prompt,
        knobs,
        req.stream,
        Kind::Generate,
        load,
        None,
    )
    .await
}

async fn run_chat(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: ChatRequest = crate::body::json(body, app.body_limits()).await?;
    app.admit()?;
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
    let tool_set = tools::check_ollama(req.tools.as_deref())?;
    let keep = keep_alive(req.keep_alive.as_ref())?;
    let name = app.model_or_default(&req.model).to_string();
    if req.messages.is_empty() {
        return load_or_unload(app, &name, keep, Kind::Chat).await;
    }
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| template_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let (lease, load) = acquire_timed(app, &name, keep).await?;
    let prompt = tools::encode_prompt(&lease.loaded, messages, tool_set.as_ref())?;
    let mut knobs = request_knobs(&lease, req.options.as_ref(), req.priority)?;
    knobs.constraint = constraint;
    let offered = tool_set.as_ref().map(|s| s.names());
    run(
        app,
        lease,
        prompt,
        knobs,
        req.stream,
        Kind::Chat,
        load,
        offered,
    )
    .await
}

/// An Ollama message as the chat template takes it: its calls (arguments already objects)
/// and, on a `tool` message, the function's name (`tool_name`, or older clients' `name`).
/// Fields beyond those are checked ([`check_ollama_message`]); `name` on any other role is
/// refused.
fn template_message(i: usize, m: &Message) -> Result<ChatMessage, ApiError> {
    check_ollama_message(i, &m.extra)?;
    let name = m.extra.get("name").filter(|v| !v.is_null());
    if name.is_some() && m.role != "tool" {
        return Err(ApiError::invalid_param(
            &format!("messages[{i}].name"),
            "`name` is read only on tool messages (the function's name; `tool_name` in newer clients)",
        ));
    }
    if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
        return Err(ApiError::invalid_param(
            "messages",
            format!(
                "unknown role `{}`; use system, user, assistant or tool",
                m.role
            ),
        ));
    }
    let mut out = ChatMessage::new(&m.role, &m.content);
    if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
        if m.role != "assistant" {
            return Err(ApiError::invalid_param(
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
            (None, Some(serde_json::Value::String(n))) => Some(n.clone()),
            (None, Some(other)) => {
                return Err(ApiError::invalid_param(
                    &format!("messages[{i}].name"),
                    format!("`name` must be a string, got {other}"),
                ))
            }
            (None, None) => None,
        };
    }
    Ok(out)
}

/// What Ollama sends for a parsed piece.
enum OllamaPiece {
    /// Message content.
    Text(String),
    /// A whole call, its arguments an object.
    Call(String, Map<String, Value>),
}

/// A piece as Ollama sends it, or `None` for the pieces of a streamed call: Ollama sends
/// each call whole, in a message chunk of its own, when it ends. Ollama's `arguments` is an
/// object, so a streamed call whose arguments text is not one (cut off by `num_predict`, or
/// bad JSON the model wrote) is sent as content, verbatim from its `<tool_call>` — not as a
/// call with empty or guessed arguments, which a client would run: nothing the model wrote
/// is lost, and `done_reason: "length"` tells a cut-off one.
fn ollama_piece(p: Piece) -> Option<OllamaPiece> {
    match p {
        Piece::Content(c) => Some(OllamaPiece::Text(c)),
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
fn ollama_call(name: String, arguments: Map<String, Value>, index: usize) -> ToolCall {
    ToolCall {
        function: ToolCallFunction {
            index: Some(index),
            name,
            arguments: Value::Object(arguments),
        },
    }
}

/// The lines of parsed pieces: content as message pieces, each call in a message of its own
/// (numbered from `calls_before`, the calls sent before).
fn piece_lines(w: &Writer, pieces: Vec<Piece>, calls_before: &mut usize) -> String {
    let mut out = String::new();
    for p in pieces.into_iter().filter_map(ollama_piece) {
        match p {
            OllamaPiece::Text(c) => out.push_str(&w.piece(c)),
            OllamaPiece::Call(name, args) => {
                out.push_str(&w.calls(vec![ollama_call(name, args, *calls_before)]));
                *calls_before += 1;
            }
        }
    }
    out
}

/// A whole output as Ollama's message: its content (empty when calls were made and nothing
/// else but whitespace was written) and its calls (of the `offered` tools), as
/// [`piece_lines`] streams them.
fn ollama_output(text: &str, offered: Vec<String>) -> (String, Option<Vec<ToolCall>>) {
    let pieces = OutputParser::new(offered).parse(text);
    let (mut content, mut calls) = (String::new(), Vec::new());
    for piece in pieces.into_iter().filter_map(ollama_piece) {
        match piece {
            OllamaPiece::Text(c) => content.push_str(&c),
            OllamaPiece::Call(name, args) => {
                let index = calls.len();
                calls.push(ollama_call(name, args, index));
            }
        }
    }
    if calls.is_empty() {
        (content, None)
    } else {
        if content.trim().is_empty() {
            content.clear();
        }
        (content, Some(calls))
    }
}

/// A lease on `name` and how long loading it took (zero when it was loaded already).
async fn acquire_timed(
    app: &AppState,
    name: &str,
    keep: Option<crate::registry::KeepAlive>,
) -> Result<(Lease, Duration), ApiError> {
    let loaded_before = app.registry.loaded().iter().any(|m| m.name == name);
    let started = std::time::Instant::now();
    let lease = app.registry.acquire(name, keep).await?;
    let load = if loaded_before {
        Duration::ZERO
    } else {
        started.elapsed()
    };
    Ok((lease, load))
}

/// An empty request: load the model (or unload it when keep_alive is 0).
async fn load_or_unload(
    app: &AppState,
    name: &str,
    keep: Option<crate::registry::KeepAlive>,
    kind: Kind,
) -> Result<Response, ApiError> {
    let reason = if keep == Some(Some(Duration::ZERO)) {
        app.registry.unload(name);
        "unload"
    } else {
        drop(app.registry.acquire(name, keep).await?);
        "load"
    };
    let body = match kind {
        Kind::Generate => serde_json::to_value(GenerateResponse {
            model: name.to_string(),
            created_at: rfc3339(SystemTime::now()),
            done: true,
            done_reason: Some(reason.into()),
            ..GenerateResponse::default()
        }),
        Kind::Chat => serde_json::to_value(ChatResponse {
            model: name.to_string(),
            created_at: rfc3339(SystemTime::now()),
            message: Message {
                role: "assistant".into(),
                ..Message::default()
            },
            done: true,
            done_reason: Some(reason.into()),
            stats: None,
        }),
    }
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(body).into_response())
}

/// The knobs of `options` and `priority`, with the model's Modelfile stops and length.
fn request_knobs(
    lease: &Lease,
    options: Option<&Options>,
    priority: Option<i64>,
) -> Result<Knobs, ApiError> {
    let mut k = knobs(options)?;
    k.priority = priority;
    k.stop = lease.loaded.stops_with(k.stop);
    if options.and_then(|o| o.num_predict).is_none() {
        k.max_tokens = lease.loaded.default_max_tokens;
    }
    Ok(k)
}

// One flat call site per route; the arguments are the request's parts, not a bundle.
#[allow(clippy::too_many_arguments)]
async fn run(
    app: &AppState,
    lease: Lease,
    prompt: Vec<u32>,
    k: Knobs,
    stream: bool,
    kind: Kind,
    load: Duration,
    offered: Option<Vec<String>>,
) -> Result<Response, ApiError> {
    let engine_req = engine_request(
        prompt.clone(),
        &lease.loaded.default_sampling,
        k,
        &app.bounds(&lease, LengthRule::Clamp),
    )?;
    let model = lease.served_name().to_string();
    // Ollama constrains only through `format` (its tools never force a call).
    let generation = Generation::start(app, lease, engine_req, app.request_id("ollama"))
        .map_err(|e| e.constraint_param(Some("format")))?;
    let writer = Writer {
        model,
        kind,
        prompt,
        load,
    };
    if stream {
        // The parser, and the calls sent so far.
        let parser = offered.map(|names| (OutputParser::new(names), 0usize));
        let s = futures_util::stream::unfold(
            Some((generation, writer, Vec::<u32>::new(), parser)),
            |state| async move {
                let (mut g, w, mut generated, mut parser) = state?;
                match g.next().await {
                    Some(TokenEvent::Token { token, text, .. }) => {
                        generated.push(token);
                        let l = match parser.as_mut() {
                            Some((p, sent)) => piece_lines(&w, p.push(&text), sent),
                            None => w.piece(text),
                        };
                        Some((l, Some((g, w, generated, parser))))
                    }
                    Some(TokenEvent::Finished {
                        reason,
                        text,
                        usage,
                        timings,
                        ..
                    }) => {
                        let mut out = String::new();
                        match parser.as_mut() {
                            Some((p, sent)) => {
                                let mut pieces = p.push(&text);
                                pieces.extend(p.finish());
                                out.push_str(&piece_lines(&w, pieces, sent));
                            }
                            None if !text.is_empty() => out.push_str(&w.piece(text)),
                            None => {}
                        }
                        out.push_str(&w.last(
                            String::new(),
                            None,
                            reason,
                            usage,
                            &timings,
                            &generated,
                        ));
                        Some((out, None))
                    }
                    Some(TokenEvent::Error { message }) => Some((
                        line(&pagoda_protocol::ollama::ErrorResponse { error: message }),
                        None,
                    )),
                    None => None,
                }
            },
        );
        return Ok(super::ndjson(s));
    }
    let mut g = generation;
    let (mut text, mut generated) = (String::new(), Vec::new());
    while let Some(ev) = g.next().await {
        match ev {
            TokenEvent::Token { token, text: t, .. } => {
                generated.push(token);
                text.push_str(&t);
            }
            TokenEvent::Finished {
                reason,
                text: t,
                usage,
                timings,
                ..
            } => {
                text.push_str(&t);
                let (text, calls) = if let Some(names) = offered {
                    ollama_output(&text, names)
                } else {
                    (text, None)
                };
                let body = writer.last(text, calls, reason, usage, &timings, &generated);
                return Ok((
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    body.trim_end().to_string(),
                )
                    .into_response());
            }
            TokenEvent::Error { message } => return Err(ApiError::generation_failed(message)),
        }
    }
    Err(ApiError::internal("the generation ended without a result"))
}

/// Writes the objects of one request.
struct Writer {
    model: String,
    kind: Kind,
    prompt: Vec<u32>,
    load: Duration,
}

impl Writer {
    fn piece(&self, text: String) -> String {
        self.object(text, None, false, None, None, None)
    }

    /// A message chunk carrying complete tool calls (as Ollama streams them).
    fn calls(&self, calls: Vec<ToolCall>) -> String {
        self.object(String::new(), Some(calls), false, None, None, None)
    }

    fn last(
        &self,
        text: String,
        tool_calls: Option<Vec<ToolCall>>,
        reason: FinishReason,
        usage: Usage,
        timings: &RequestTimings,
        generated: &[u32],
    ) -> String {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let ttft = timings.ttft().unwrap_or_default();
        let e2e = timings.e2e();
        let stats = FinalStats {
            total_duration: nanos(e2e + self.load),
            load_duration: nanos(self.load),
            prompt_eval_count: usage.prompt_tokens,
            prompt_eval_duration: nanos(ttft),
            eval_count: usage.completion_tokens,
            eval_duration: nanos(e2e.saturating_sub(ttft)),
        };
        let context = (self.kind == Kind::Generate).then(|| {
            let mut c = self.prompt.clone();
            c.extend_from_slice(generated);
            c
        });
        let reason = match reason {
            FinishReason::Length => "length",
            _ => "stop",
        };
        self.object(text, tool_calls, true, Some(reason), Some(stats), context)
    }

    fn object(
        &self,
        text: String,
        tool_calls: Option<Vec<ToolCall>>,
        done: bool,
        reason: Option<&str>,
        stats: Option<FinalStats>,
        context: Option<Vec<u32>>,
    ) -> String {
        let created_at = rfc3339(SystemTime::now());
        match self.kind {
            Kind::Generate => line(&GenerateResponse {
                model: self.model.clone(),
                created_at,
                response: text,
                done,
                done_reason: reason.map(str::to_string),
                context,
                stats,
            }),
            Kind::Chat => line(&ChatResponse {
                model: self.model.clone(),
                created_at,
                message: Message {
                    role: "assistant".into(),
                    content: text,
                    tool_calls,
                    ..Message::default()
                },
                done,
                done_reason: reason.map(str::to_string),
                stats,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ollama_gets_whole_calls_and_cut_off_ones_as_content() {
        let offered = || vec!["f".to_string(), "g".to_string()];
        let (content, calls) = ollama_output(
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}\n</tool_call>\n<tool_call>{\"name\": \"g\", \"parameters\": {}}</tool_call>",
            offered(),
        );
        assert_eq!(content, "");
        let calls = calls.expect("calls");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].function.name, "f");
        assert_eq!(calls[0].function.arguments, json!({"a": [1, 2]}));
        assert_eq!(calls[1].function.index, Some(1));
        assert_eq!(calls[1].function.arguments, json!({}));
        // Cut off (num_predict): the text as written, not a call with made-up arguments.
        let cut = "I'll check. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1,";
        let (content, calls) = ollama_output(cut, offered());
        assert_eq!(calls, None);
        assert_eq!(
            content,
            "I'll check.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1,"
        );
        // Streamed: the call is sent whole, in a chunk of its own, at its end.
        let w = Writer {
            model: "m".into(),
            kind: Kind::Chat,
            prompt: Vec::new(),
            load: Duration::ZERO,
        };
        let mut p = OutputParser::new(offered());
        let mut sent = 0;
        let first = piece_lines(
            &w,
            p.push("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\""),
            &mut sent,
        );
        assert_eq!(first, "");
        let rest = piece_lines(&w, p.push(": 1}}</tool_call>"), &mut sent);
        let v: Value = serde_json::from_str(rest.trim_end()).expect("one line");
        assert_eq!(
            v["message"]["tool_calls"],
            json!([{"function": {"index": 0, "name": "f", "arguments": {"a": 1}}}])
        );
        assert_eq!(sent, 1);
        // A bare call (no markup), as small models write them: a call of an offered tool.
        let (content, calls) =
            ollama_output("{\"name\": \"g\", \"arguments\": {\"x\": 2}}", offered());
        assert_eq!(content, "");
        assert_eq!(
            calls.expect("a call")[0].function.arguments,
            json!({"x": 2})
        );
    }
}
