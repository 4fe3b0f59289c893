//! `POST /v1/chat/completions`: messages through the model's chat template, then a whole
//! response or an SSE stream of chunks (role first, content deltas, the finish chunk per
//! choice, an optional usage chunk, `[DONE]`).

use super::{
    check_openai_ranges, error_frame, finish_reason, frame, frames, merge, respond, sse,
    token_text, FrameWriter,
};
use crate::clock::unix_now;
use crate::error::ApiError;
use crate::generation::{collect, Generation};
use crate::prepare::{engine_request, Knobs, LengthRule};
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_engine::{SampledToken, TokenEvent};
use pagoda_model::chat_template::ChatMessage as TemplateMessage;
use pagoda_model::tokenizer::Tokenizer;
use pagoda_protocol::openai::chat::{
    AssistantMessage, ChatChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatLogprobs, ChatTokenLogprob, ChunkChoice, Delta,
};
use pagoda_protocol::openai::{TopLogprob, Usage};
use std::collections::VecDeque;
use std::sync::Arc;

pub(super) async fn handle(State(app): State<AppState>, body: Body) -> Response {
    let result = run(&app, body).await;
    respond(&app, result)
}

async fn run(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = crate::body::json(body, app.body_limits()).await?;
    app.admit()?;
    check_openai_ranges(req.temperature, req.n, req.top_logprobs)?;
    if req.top_logprobs.is_some() && !req.logprobs {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        ));
    }
    if let Some(f) = &req.response_format {
        if f.kind != "text" {
            return Err(ApiError::invalid_param(
                "response_format",
                format!(
                    "response_format `{}` is not supported yet; use text",
                    f.kind
                ),
            ));
        }
    }
    refuse_tools(&req)?;
    let messages = template_messages(&req)?;
    let lease = app
        .registry
        .acquire(app.model_or_default(&req.model), None)
        .await?;
    let loaded = &lease.loaded;
    let prompt = loaded
        .encode_chat(&loaded.with_preset(messages))
        .map_err(|e| {
            ApiError::invalid_param("messages", format!("cannot apply the chat template: {e}"))
        })?;
    let n = req.n.unwrap_or(1);
    let knobs = Knobs {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        repetition_penalty: req.repetition_penalty,
        repeat_last_n: None,
        seed: req.seed,
        logprobs: req.logprobs.then_some(req.top_logprobs.unwrap_or(0)),
        logit_bias: req.logit_bias.clone(),
        stop: loaded.stops_with(req.stop.clone().map(|s| s.into_vec()).unwrap_or_default()),
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        n,
        ignore_eos: req.ignore_eos,
        no_speculation: req.speculative == Some(false),
    };
    let engine_req = engine_request(
        prompt,
        &loaded.openai_sampling(),
        knobs,
        loaded.context_window(lease.engine.layout().max_model_len),
        lease.loaded.tokenizer.vocab_size(),
        LengthRule::Strict,
    )?;
    let tokenizer = lease.loaded.tokenizer.clone();
    let model = lease.served_name().to_string();
    let id = app.request_id("chatcmpl");
    let mut generation = Generation::start(app, lease, engine_req, id.clone())?;
    let head = Head {
        id,
        model,
        created: unix_now(),
    };
    if req.stream {
        let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
        return Ok(sse(stream(generation, head, n, include_usage, tokenizer)));
    }
    let choices = collect(&mut generation, n).await?;
    let usage = usage_of(choices.iter().map(|c| c.usage));
    let choices = choices
        .into_iter()
        .enumerate()
        .map(|(index, c)| {
            let finish = finish_reason(c.finish).ok_or_else(|| {
                ApiError::unavailable("the request was aborted (server shutting down)")
            })?;
            Ok(ChatChoice {
                index,
                message: AssistantMessage {
                    role: "assistant".into(),
                    content: Some(c.text),
                },
                logprobs: req.logprobs.then(|| ChatLogprobs {
                    content: c
                        .logprobs
                        .iter()
                        .map(|lp| logprob_entry(&tokenizer, lp))
                        .collect(),
                }),
                finish_reason: Some(finish),
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Json(ChatCompletionResponse {
        id: head.id,
        object: "chat.completion".into(),
        created: head.created,
        model: head.model,
        choices,
        usage,
        system_fingerprint: None,
    })
    .into_response())
}

/// The request's messages as the chat template takes them.
fn template_messages(req: &ChatCompletionRequest) -> Result<Vec<TemplateMessage>, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must not be empty",
        ));
    }
    req.messages
        .iter()
        .map(|m| {
            let role = match m.role.as_str() {
                "developer" => "system",
                r @ ("system" | "user" | "assistant" | "tool") => r,
                other => {
                    return Err(ApiError::invalid_param(
                        "messages",
                        format!("unknown role `{other}`; use system, user, assistant or tool"),
                    ))
                }
            };
            let text = m
                .text()
                .map_err(|e| ApiError::invalid_param("messages", e))?;
            Ok(TemplateMessage::new(role, text))
        })
        .collect()
}

/// Usage over the choices of one prompt: the prompt once, every choice's completion.
pub(super) fn usage_of(usages: impl Iterator<Item = pagoda_engine::Usage>) -> Usage {
    let (mut prompt, mut cached, mut completion) = (0, 0, 0);
    for u in usages {
        prompt = prompt.max(u.prompt_tokens);
        cached = cached.max(u.cached_prompt_tokens);
        completion += u.completion_tokens;
    }
    Usage::new(prompt, completion, cached)
}

fn logprob_entry(tokenizer: &Tokenizer, lp: &SampledToken) -> ChatTokenLogprob {
    let token = token_text(tokenizer, lp.token);
    ChatTokenLogprob {
        bytes: Some(token.as_bytes().to_vec()),
        token,
        logprob: lp.logprob.unwrap_or(f32::NEG_INFINITY),
        top_logprobs: lp
            .top_logprobs
            .iter()
            .map(|t| {
                let token = token_text(tokenizer, t.token);
                TopLogprob {
                    bytes: Some(token.as_bytes().to_vec()),
                    token,
                    logprob: t.logprob,
                }
            })
            .collect(),
    }
}

struct Head {
    id: String,
    model: String,
    created: u64,
}

impl Head {
    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> String {
        frame(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            system_fingerprint: None,
        })
    }

    fn delta(&self, index: usize, content: String, logprobs: Option<ChatLogprobs>) -> String {
        self.chunk(
            vec![ChunkChoice {
                index,
                delta: Delta {
                    role: None,
                    content: Some(content),
                },
                logprobs,
                finish_reason: None,
            }],
            None,
        )
    }
}

/// The SSE frames of a streamed chat completion.
fn stream(
    generation: Generation,
    head: Head,
    n: usize,
    include_usage: bool,
    tokenizer: Arc<Tokenizer>,
) -> impl futures_util::Stream<Item = String> + Send + 'static {
    let pending: VecDeque<String> = (0..n)
        .map(|index| {
            head.chunk(
                vec![ChunkChoice {
                    index,
                    delta: Delta {
                        role: Some("assistant".into()),
                        content: Some(String::new()),
                    },
                    logprobs: None,
                    finish_reason: None,
                }],
                None,
            )
        })
        .collect();
    let writer = StreamState {
        head,
        tokenizer,
        usages: Vec::new(),
        include_usage,
    };
    frames(merge(vec![generation]), writer, pending)
}

struct StreamState {
    head: Head,
    tokenizer: Arc<Tokenizer>,
    usages: Vec<pagoda_engine::Usage>,
    include_usage: bool,
}

impl FrameWriter for StreamState {
    fn on_end(&mut self, out: &mut VecDeque<String>) {
        if self.include_usage {
            out.push_back(
                self.head
                    .chunk(Vec::new(), Some(usage_of(self.usages.drain(..)))),
            );
        }
    }

    fn on_event(&mut self, _prompt: usize, ev: TokenEvent, out: &mut VecDeque<String>) {
        match ev {
            TokenEvent::Token {
                index,
                text,
                logprob,
                ..
            } => {
                let logprobs = logprob
                    .filter(|lp| lp.logprob.is_some())
                    .map(|lp| ChatLogprobs {
                        content: vec![logprob_entry(&self.tokenizer, &lp)],
                    });
                if !text.is_empty() || logprobs.is_some() {
                    out.push_back(self.head.delta(index, text, logprobs));
                }
            }
            TokenEvent::Finished {
                index,
                reason,
                text,
                usage,
                ..
            } => {
                if !text.is_empty() {
                    out.push_back(self.head.delta(index, text, None));
                }
                self.usages.push(usage);
                match finish_reason(reason) {
                    Some(r) => out.push_back(self.head.chunk(
                        vec![ChunkChoice {
                            index,
                            delta: Delta::default(),
                            logprobs: None,
                            finish_reason: Some(r),
                        }],
                        None,
                    )),
                    None => out.push_back(error_frame("the request was aborted")),
                }
            }
            TokenEvent::Error { message } => out.push_back(error_frame(&message)),
        }
    }
}

/// Tool calling is not implemented yet: a request that asks for it is refused with the field
/// named, never answered as if the tools were not there. A `tool_choice` of `"none"` (or
/// `"auto"` with no tools) asks for nothing and passes.
fn refuse_tools(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    let asks = |v: &Option<serde_json::Value>| match v {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    };
    for (field, value) in [("tools", &req.tools), ("functions", &req.functions)] {
        if asks(value) {
            return Err(ApiError::invalid_param(
                field,
                format!("`{field}` (tool calling) is not supported by this server yet; send the request without it"),
            ));
        }
    }
    for (field, value) in [
        ("tool_choice", &req.tool_choice),
        ("function_call", &req.function_call),
    ] {
        match value.as_ref().and_then(serde_json::Value::as_str) {
            None if value.as_ref().is_none_or(serde_json::Value::is_null) => {}
            Some("none" | "auto") => {}
            _ => {
                return Err(ApiError::invalid_param(
                    field,
                    format!(
                        "`{field}` asks for a tool call, which this server does not support yet"
                    ),
                ))
            }
        }
    }
    Ok(())
}
