//! `/api/generate` and `/api/chat`: the request's plan (`pagoda_runtime::ollama`: prompt
//! from template, `system`, `raw`, `context` or messages and tools; `options`; `format`),
//! then one object per token as NDJSON (or one object when `stream: false`), ending with
//! `done: true`, the done reason and the counts and durations. An empty prompt (or no
//! messages) only loads the model — or unloads it with `keep_alive: 0` — as Ollama does.

use super::{line, respond};
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
use pagoda_protocol::ollama::{
    ChatRequest, ChatResponse, FinalStats, GenerateRequest, GenerateResponse, Message, ToolCall,
};
use pagoda_runtime::ollama::{self, ollama_call, ollama_piece, ollama_reply, OllamaPiece};
use pagoda_runtime::tools::Piece;
use pagoda_runtime::Plan;
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

async fn run_generate(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: GenerateRequest = crate::body::json(body, app.body_limits()).await?;
    app.admit()?;
    let checked = ollama::check_generate(&req)?;
    let keep = checked.keep_alive;
    let name = app.model_or_default(&req.model).to_string();
    if checked.loads_only() {
        return load_or_unload(app, &name, keep, Kind::Generate).await;
    }
    let (lease, load) = acquire_timed(app, &name, keep).await?;
    let plan = crate::cpu_bound::run(|| checked.plan(&lease.loaded, &app.bounds(&lease)))?;
    run(app, lease, plan, req.stream, Kind::Generate, load).await
}

async fn run_chat(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: ChatRequest = crate::body::json(body, app.body_limits()).await?;
    app.admit()?;
    let checked = ollama::check_chat(&req)?;
    let keep = checked.keep_alive;
    let name = app.model_or_default(&req.model).to_string();
    if checked.loads_only() {
        return load_or_unload(app, &name, keep, Kind::Chat).await;
    }
    let (lease, load) = acquire_timed(app, &name, keep).await?;
    let plan = crate::cpu_bound::run(|| checked.plan(&lease.loaded, &app.bounds(&lease)))?;
    run(app, lease, plan, req.stream, Kind::Chat, load).await
}

/// The lines of parsed pieces: content as message pieces, each call in a message of its own
/// (numbered from `calls_before`, the calls sent before).
fn piece_lines(w: &Writer, pieces: Vec<Piece>, calls_before: &mut usize) -> String {
    let mut out = String::new();
    for p in pieces.into_iter().filter_map(ollama_piece) {
        match p {
            OllamaPiece::Text(c) => out.push_str(&w.piece(c)),
            OllamaPiece::Thinking(t) => out.push_str(&w.thinking(t)),
            OllamaPiece::Call(name, args) => {
                out.push_str(&w.calls(vec![ollama_call(name, args, *calls_before)]));
                *calls_before += 1;
            }
        }
    }
    out
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

/// Submits `plan` and answers with its NDJSON stream, or its one object.
async fn run(
    app: &AppState,
    lease: Lease,
    plan: Plan,
    stream: bool,
    kind: Kind,
    load: Duration,
) -> Result<Response, ApiError> {
    let model = lease.served_name().to_string();
    let prompt = plan.request.prompt.clone();
    let output_parser = plan.output_parser();
    let id = app.request_id("ollama");
    let generation = crate::cpu_bound::run(|| Generation::start(app, lease, plan, id))?;
    let writer = Writer {
        model,
        kind,
        prompt,
        load,
    };
    if stream {
        // The parser, and the calls sent so far.
        let parser = output_parser.map(|p| (p, 0usize));
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
                let (text, thinking, calls) = match output_parser {
                    Some(p) => ollama_reply(p, &text),
                    None => (text, None, None),
                };
                let body = writer.last(text, thinking, calls, reason, usage, &timings, &generated);
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
        self.object(text, None, None, false, None, None, None)
    }

    /// A chunk of reasoning (`thinking`, with empty content, as Ollama streams it).
    fn thinking(&self, thinking: String) -> String {
        self.object(String::new(), Some(thinking), None, false, None, None, None)
    }

    /// A message chunk carrying complete tool calls (as Ollama streams them).
    fn calls(&self, calls: Vec<ToolCall>) -> String {
        self.object(String::new(), None, Some(calls), false, None, None, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn last(
        &self,
        text: String,
        thinking: Option<String>,
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
        self.object(
            text,
            thinking,
            tool_calls,
            true,
            Some(reason),
            Some(stats),
            context,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn object(
        &self,
        text: String,
        thinking: Option<String>,
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
                thinking,
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
                    thinking,
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
    use pagoda_runtime::ollama::ollama_output;
    use pagoda_runtime::tools::OutputParser;
    use serde_json::{json, Value};

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
