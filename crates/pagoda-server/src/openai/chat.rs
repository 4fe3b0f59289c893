//! `POST /v1/chat/completions`: messages through the model's chat template, then a whole
//! response or an SSE stream of chunks (role first, content and tool call deltas, the finish
//! chunk per choice, an optional usage chunk, `[DONE]`). The request's plan (checks, prompt,
//! knobs, tools, constraint) and the whole response are `pagoda_runtime::openai::chat`'s.

use super::{error_frame, frame, frames, merge, respond, sse, FrameWriter};
use crate::clock::unix_now;
use crate::error::ApiError;
use crate::generation::{collect, Generation};
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_engine::TokenEvent;
use pagoda_model::tokenizer::Tokenizer;
use pagoda_protocol::openai::chat::{
    ChatCompletionChunk, ChatCompletionRequest, ChatLogprobs, ChunkChoice, Delta, ToolCallDelta,
};
use pagoda_protocol::openai::Usage;
use pagoda_runtime::combined_usage;
use pagoda_runtime::openai::{chat, finish_reason, usage, ResponseHead};
use pagoda_runtime::tools::{OutputParser, Piece};
use std::collections::VecDeque;
use std::sync::Arc;

pub(super) async fn handle(State(app): State<AppState>, body: Body) -> Response {
    let result = run(&app, body).await;
    respond(&app, result)
}

async fn run(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = crate::body::json(body, app.body_limits()).await?;
    app.admit()?;
    let checked = chat::check(&req)?;
    let lease = app
        .registry
        .acquire(app.model_or_default(&req.model), None)
        .await?;
    let plan = crate::cpu_bound::run(|| checked.plan(&lease.loaded, &app.bounds(&lease)))?;
    let n = plan.n();
    let offered = plan.offered_tools.clone();
    let formats = plan.formats;
    let parsers: Option<Vec<OutputParser>> = plan
        .output_parser()
        .map(|_| (0..n).filter_map(|_| plan.output_parser()).collect());
    let tokenizer = lease.loaded.tokenizer.clone();
    let head = ResponseHead {
        id: app.request_id("chatcmpl"),
        model: lease.served_name().to_string(),
        created: unix_now(),
    };
    let id = head.id.clone();
    let mut generation = crate::cpu_bound::run(|| Generation::start(app, lease, plan, id))?;
    if req.stream {
        let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
        return Ok(sse(stream(
            generation,
            head,
            n,
            include_usage,
            parsers,
            tokenizer,
        )));
    }
    let choices = collect(&mut generation, n).await?;
    Ok(Json(chat::response(
        head,
        choices,
        req.logprobs,
        offered,
        formats,
        &tokenizer,
    )?)
    .into_response())
}

/// The chunks of a streamed chat completion.
trait Chunks {
    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> String;
    fn delta(
        &self,
        index: usize,
        content: Option<String>,
        logprobs: Option<ChatLogprobs>,
    ) -> String;
    fn tool_delta(
        &self,
        index: usize,
        call: ToolCallDelta,
        logprobs: Option<ChatLogprobs>,
    ) -> String;
    fn reasoning_delta(
        &self,
        index: usize,
        reasoning: String,
        logprobs: Option<ChatLogprobs>,
    ) -> String;
}

impl Chunks for ResponseHead {
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

    fn delta(
        &self,
        index: usize,
        content: Option<String>,
        logprobs: Option<ChatLogprobs>,
    ) -> String {
        self.chunk(
            vec![ChunkChoice {
                index,
                delta: Delta {
                    content,
                    ..Delta::default()
                },
                logprobs,
                finish_reason: None,
            }],
            None,
        )
    }

    fn reasoning_delta(
        &self,
        index: usize,
        reasoning: String,
        logprobs: Option<ChatLogprobs>,
    ) -> String {
        self.chunk(
            vec![ChunkChoice {
                index,
                delta: Delta {
                    reasoning_content: Some(reasoning),
                    ..Delta::default()
                },
                logprobs,
                finish_reason: None,
            }],
            None,
        )
    }

    fn tool_delta(
        &self,
        index: usize,
        call: ToolCallDelta,
        logprobs: Option<ChatLogprobs>,
    ) -> String {
        self.chunk(
            vec![ChunkChoice {
                index,
                delta: Delta {
                    tool_calls: Some(vec![call]),
                    ..Delta::default()
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
    head: ResponseHead,
    n: usize,
    include_usage: bool,
    parsers: Option<Vec<OutputParser>>,
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
                        ..Delta::default()
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
        parsers,
    };
    frames(merge(vec![generation]), writer, pending)
}

struct StreamState {
    head: ResponseHead,
    tokenizer: Arc<Tokenizer>,
    usages: Vec<pagoda_engine::Usage>,
    include_usage: bool,
    /// One output parser per choice when the output is parsed (for calls or reasoning).
    parsers: Option<Vec<OutputParser>>,
}

impl StreamState {
    /// The frames of choice `index`'s new `text`: as content, or through its tool call
    /// parser (`end`: the last text of the choice). A streamed call is sent as OpenAI sends
    /// it: its header (index, id, type, name, `arguments: ""`) when the parser commits to it,
    /// then each piece of its arguments as it is written; a whole call, as its header and
    /// its arguments at once. Calls are numbered in order from 0 per choice. `logprobs` ride
    /// on the first frame, content or call piece (or on a frame of their own when the
    /// parser held the token's text back).
    fn text_frames(
        &mut self,
        index: usize,
        text: String,
        mut logprobs: Option<ChatLogprobs>,
        end: bool,
        out: &mut VecDeque<String>,
    ) {
        let Some(parser) = self.parsers.as_mut().and_then(|p| p.get_mut(index)) else {
            if !text.is_empty() || logprobs.is_some() {
                out.push_back(self.head.delta(index, Some(text), logprobs));
            }
            return;
        };
        let mut pieces = parser.push(&text);
        if end {
            pieces.extend(parser.finish());
        }
        // The number of the next call to start.
        let mut next = parser.calls()
            - pieces
                .iter()
                .filter(|p| matches!(p, Piece::CallStart { .. } | Piece::Call(_)))
                .count();
        for piece in pieces {
            match piece {
                Piece::Content(c) => {
                    out.push_back(self.head.delta(index, Some(c), logprobs.take()))
                }
                Piece::Reasoning(r) => {
                    out.push_back(self.head.reasoning_delta(index, r, logprobs.take()))
                }
                Piece::CallStart { name } => {
                    let d = chat::call_start_delta(name, next);
                    out.push_back(self.head.tool_delta(index, d, logprobs.take()));
                    next += 1;
                }
                Piece::CallArguments(a) => {
                    // The arguments of the call started last.
                    let d = chat::arguments_delta(a, next - 1);
                    out.push_back(self.head.tool_delta(index, d, logprobs.take()));
                }
                // Sent already, piece by piece.
                Piece::CallEnd { .. } => {}
                Piece::Call(c) => {
                    for d in chat::call_deltas(c, next) {
                        out.push_back(self.head.tool_delta(index, d, logprobs.take()));
                    }
                    next += 1;
                }
            }
        }
        if let Some(lp) = logprobs {
            // Held back by the parser: the token's logprobs without content.
            out.push_back(self.head.delta(index, None, Some(lp)));
        }
    }

    /// Whether choice `index` emitted a tool call.
    fn called(&self, index: usize) -> bool {
        self.parsers
            .as_ref()
            .and_then(|p| p.get(index))
            .is_some_and(|p| p.calls() > 0)
    }
}

impl FrameWriter for StreamState {
    fn on_end(&mut self, out: &mut VecDeque<String>) {
        if self.include_usage {
            out.push_back(self.head.chunk(
                Vec::new(),
                Some(usage(combined_usage(self.usages.drain(..)))),
            ));
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
                        content: vec![chat::logprob_entry(&self.tokenizer, &lp)],
                    });
                self.text_frames(index, text, logprobs, false, out);
            }
            TokenEvent::Finished {
                index,
                reason,
                text,
                usage,
                ..
            } => {
                self.text_frames(index, text, None, true, out);
                self.usages.push(usage);
                let called = self.called(index);
                match finish_reason(reason).map(|r| chat::finish_with_calls(r, called)) {
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
