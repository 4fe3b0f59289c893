//! `POST /v1/completions`: raw prompts (text or token ids, one or a batch; each gets `n`
//! choices, numbered prompt-major), `echo`, legacy logprobs, whole or streamed. Each prompt's
//! plan (checks, prompt, knobs) and the whole response are
//! `pagoda_runtime::openai::completions`'.

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
use pagoda_protocol::openai::completion::{
    CompletionChoice, CompletionLogprobs, CompletionRequest,
};
use pagoda_protocol::openai::Usage;
use pagoda_runtime::combined_usage;
use pagoda_runtime::openai::completions::{self, PromptOutput};
use pagoda_runtime::openai::{add_usage, finish_reason, usage, ResponseHead};
use std::collections::VecDeque;
use std::sync::Arc;

pub(super) async fn handle(State(app): State<AppState>, body: Body) -> Response {
    let result = run(&app, body).await;
    respond(&app, result)
}

async fn run(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: CompletionRequest = crate::body::json(body, app.body_limits()).await?;
    app.admit()?;
    let checked = completions::check(&req)?;
    let n = req.n.unwrap_or(1);
    let model_name = app.model_or_default(&req.model).to_string();
    let mut generations = Vec::with_capacity(checked.inputs.len());
    let mut echoes = Vec::with_capacity(checked.inputs.len());
    let mut tokenizer: Option<Arc<Tokenizer>> = None;
    let mut served_name = model_name.clone();
    let id = app.request_id("cmpl");
    for input in checked.inputs.clone() {
        let lease = app.registry.acquire(&model_name, None).await?;
        let (plan, echo) =
            crate::cpu_bound::run(|| checked.plan(&lease.loaded, &app.bounds(&lease), input))?;
        tokenizer.get_or_insert_with(|| lease.loaded.tokenizer.clone());
        served_name = lease.served_name().to_string();
        echoes.push(if req.echo { echo } else { String::new() });
        generations.push(crate::cpu_bound::run(|| {
            Generation::start(app, lease, plan, id.clone())
        })?);
    }
    let tokenizer = tokenizer.ok_or_else(|| ApiError::internal("no prompt was prepared"))?;
    let head = ResponseHead {
        id,
        model: served_name,
        created: unix_now(),
    };
    let with_logprobs = req.logprobs.is_some();
    if req.stream {
        let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
        return Ok(sse(stream(
            generations,
            echoes,
            head,
            n,
            include_usage,
            with_logprobs,
            tokenizer,
        )));
    }
    let mut prompts = Vec::with_capacity(generations.len());
    for (mut g, echo) in generations.into_iter().zip(echoes) {
        let choices = collect(&mut g, n).await?;
        prompts.push(PromptOutput { echo, choices });
    }
    let response = completions::response(head, prompts, with_logprobs, &tokenizer)?;
    Ok(Json(response).into_response())
}

/// One streamed chunk.
fn piece(
    head: &ResponseHead,
    index: usize,
    text: String,
    logprobs: Option<CompletionLogprobs>,
    finish: Option<pagoda_protocol::openai::FinishReason>,
) -> String {
    frame(&completions::body(
        head,
        vec![CompletionChoice {
            index,
            text,
            logprobs,
            finish_reason: finish,
        }],
        None,
    ))
}

fn stream(
    generations: Vec<Generation>,
    echoes: Vec<String>,
    head: ResponseHead,
    n: usize,
    include_usage: bool,
    with_logprobs: bool,
    tokenizer: Arc<Tokenizer>,
) -> impl futures_util::Stream<Item = String> + Send + 'static {
    let mut pending = VecDeque::new();
    for (p, echo) in echoes.iter().enumerate() {
        if !echo.is_empty() {
            for i in 0..n {
                pending.push_back(piece(&head, p * n + i, echo.clone(), None, None));
            }
        }
    }
    let writer = StreamState {
        head,
        n,
        tokenizer,
        with_logprobs,
        include_usage,
        per_prompt: Vec::new(),
    };
    frames(merge(generations), writer, pending)
}

struct StreamState {
    head: ResponseHead,
    n: usize,
    tokenizer: Arc<Tokenizer>,
    with_logprobs: bool,
    include_usage: bool,
    /// Finished choices' usage, per prompt.
    per_prompt: Vec<(usize, pagoda_engine::Usage)>,
}

impl FrameWriter for StreamState {
    fn on_end(&mut self, out: &mut VecDeque<String>) {
        if self.include_usage {
            let usage = self.total_usage();
            out.push_back(frame(&completions::body(
                &self.head,
                Vec::new(),
                Some(usage),
            )));
        }
    }

    fn on_event(&mut self, p: usize, ev: TokenEvent, out: &mut VecDeque<String>) {
        match ev {
            TokenEvent::Token {
                index,
                text,
                logprob,
                ..
            } => {
                let logprobs = if self.with_logprobs {
                    logprob.map(|lp| completions::legacy_logprobs(&self.tokenizer, &[lp], 0))
                } else {
                    None
                };
                if !text.is_empty() || logprobs.is_some() {
                    out.push_back(piece(&self.head, p * self.n + index, text, logprobs, None));
                }
            }
            TokenEvent::Finished {
                index,
                reason,
                text,
                usage,
                ..
            } => {
                self.per_prompt.push((p, usage));
                match finish_reason(reason) {
                    Some(r) => {
                        out.push_back(piece(&self.head, p * self.n + index, text, None, Some(r)))
                    }
                    None => out.push_back(error_frame("the request was aborted")),
                }
            }
            TokenEvent::Error { message } => out.push_back(error_frame(&message)),
        }
    }
}

impl StreamState {
    fn total_usage(&mut self) -> Usage {
        let mut prompts: Vec<usize> = self.per_prompt.iter().map(|(p, _)| *p).collect();
        prompts.sort_unstable();
        prompts.dedup();
        let mut total = Usage::default();
        for p in prompts {
            let u = usage(combined_usage(
                self.per_prompt
                    .iter()
                    .filter(|(q, _)| *q == p)
                    .map(|(_, u)| *u),
            ));
            total = add_usage(total, u);
        }
        total
    }
}
