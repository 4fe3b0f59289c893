//! `POST /v1/completions`: raw prompts (text or token ids, one or a batch; each gets `n`
//! choices, numbered prompt-major), `echo`, legacy logprobs, whole or streamed.

use super::chat::usage_of;
use super::{
    check_openai_ranges, error_frame, finish_reason, frame, frames, merge, respond, sse,
    token_text, FrameWriter,
};
use crate::clock::unix_now;
use crate::error::ApiError;
use crate::generation::{collect, Generation};
use crate::prepare::{engine_request, Knobs, LengthRule};
use crate::registry::Lease;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_engine::{SampledToken, TokenEvent};
use pagoda_model::tokenizer::Tokenizer;
use pagoda_protocol::openai::completion::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, PromptInput,
    DEFAULT_MAX_TOKENS,
};
use pagoda_protocol::openai::Usage;
use std::collections::VecDeque;
use std::sync::Arc;

/// Most prompts in one request.
const MAX_PROMPTS: usize = 64;

pub(super) async fn handle(State(app): State<AppState>, body: Body) -> Response {
    let result = run(&app, body).await;
    respond(&app, result)
}

async fn run(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: CompletionRequest = crate::body::json(body, app.body_limits()).await?;
    app.admit()?;
    check_openai_ranges(req.temperature, req.n, req.logprobs)?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param("suffix", "suffix is not supported"));
    }
    let n = req.n.unwrap_or(1);
    if req.best_of.is_some_and(|b| b != n && b != 1) {
        return Err(ApiError::invalid_param(
            "best_of",
            "best_of other than n is not supported",
        ));
    }
    if req.echo && req.logprobs.is_some() {
        return Err(ApiError::invalid_param(
            "echo",
            "echo with logprobs (prompt logprobs) is not supported",
        ));
    }
    let inputs = req.prompt.clone().into_inputs();
    if inputs.is_empty() || inputs.len() > MAX_PROMPTS {
        return Err(ApiError::invalid_param(
            "prompt",
            format!(
                "send between 1 and {MAX_PROMPTS} prompts, got {}",
                inputs.len()
            ),
        ));
    }
    let model_name = app.model_or_default(&req.model).to_string();
    let mut generations = Vec::with_capacity(inputs.len());
    let mut echoes = Vec::with_capacity(inputs.len());
    let mut tokenizer: Option<Arc<Tokenizer>> = None;
    let mut served_name = model_name.clone();
    let id = app.request_id("cmpl");
    for input in inputs {
        let lease = app.registry.acquire(&model_name, None).await?;
        let (prompt, echo) = encode(&lease, input)?;
        let engine_req = engine_request(
            prompt,
            &lease.loaded.openai_sampling(),
            knobs(&req, n, &lease),
            lease
                .loaded
                .context_window(lease.engine.layout().max_model_len),
            lease.loaded.tokenizer.vocab_size(),
            LengthRule::Strict,
        )?;
        tokenizer.get_or_insert_with(|| lease.loaded.tokenizer.clone());
        served_name = lease.served_name().to_string();
        echoes.push(if req.echo { echo } else { String::new() });
        generations.push(Generation::start(app, lease, engine_req, id.clone())?);
    }
    let tokenizer = tokenizer.ok_or_else(|| ApiError::internal("no prompt was prepared"))?;
    let head = Head {
        id,
        model: served_name,
        created: unix_now(),
    };
    let with_logprobs = req.logprobs.is_some();
    if req.stream {
        let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
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
    let mut choices = Vec::new();
    let mut usage = Usage::default();
    for (p, mut g) in generations.into_iter().enumerate() {
        let outs = collect(&mut g, n).await?;
        let u = usage_of(outs.iter().map(|c| c.usage));
        usage = add_usage(usage, u);
        for (i, c) in outs.into_iter().enumerate() {
            let finish = finish_reason(c.finish).ok_or_else(|| {
                ApiError::unavailable("the request was aborted (server shutting down)")
            })?;
            choices.push(CompletionChoice {
                index: p * n + i,
                text: format!("{}{}", echoes[p], c.text),
                logprobs: with_logprobs
                    .then(|| legacy_logprobs(&tokenizer, &c.logprobs, echoes[p].len())),
                finish_reason: Some(finish),
            });
        }
    }
    Ok(Json(head.response(choices, Some(usage))).into_response())
}

/// The request's knobs, with the model's Modelfile stop strings in front of its own.
fn knobs(req: &CompletionRequest, n: usize, lease: &Lease) -> Knobs {
    Knobs {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        repetition_penalty: req.repetition_penalty,
        repeat_last_n: None,
        seed: req.seed,
        logprobs: req.logprobs,
        logit_bias: req.logit_bias.clone(),
        stop: lease
            .loaded
            .stops_with(req.stop.clone().map(|s| s.into_vec()).unwrap_or_default()),
        max_tokens: Some(req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
        n,
        ignore_eos: req.ignore_eos,
        no_speculation: req.speculative == Some(false),
    }
}

/// Token ids of a prompt and its text (for `echo`).
fn encode(lease: &Lease, input: PromptInput) -> Result<(Vec<u32>, String), ApiError> {
    let tok = &lease.loaded.tokenizer;
    match input {
        PromptInput::Text(text) => {
            let ids = tok.encode(&text, true).map_err(|e| {
                ApiError::invalid_param("prompt", format!("cannot tokenize the prompt: {e}"))
            })?;
            Ok((ids, text))
        }
        PromptInput::Tokens(ids) => {
            let vocab = tok.vocab_size();
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::invalid_param(
                    "prompt",
                    format!("token id {bad} is out of range for a vocabulary of {vocab}"),
                ));
            }
            let text = tok.decode(&ids, false).unwrap_or_default();
            Ok((ids, text))
        }
    }
}

fn add_usage(a: Usage, b: Usage) -> Usage {
    let cached = a.prompt_tokens_details.map_or(0, |d| d.cached_tokens)
        + b.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
    Usage::new(
        a.prompt_tokens + b.prompt_tokens,
        a.completion_tokens + b.completion_tokens,
        cached,
    )
}

fn legacy_logprobs(
    tokenizer: &Tokenizer,
    lps: &[SampledToken],
    offset: usize,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    let mut at = offset;
    for lp in lps {
        let token = token_text(tokenizer, lp.token);
        out.text_offset.push(at);
        at += token.len();
        out.token_logprobs.push(lp.logprob);
        out.top_logprobs.push(Some(
            lp.top_logprobs
                .iter()
                .map(|t| (token_text(tokenizer, t.token), t.logprob))
                .collect(),
        ));
        out.tokens.push(token);
    }
    out
}

struct Head {
    id: String,
    model: String,
    created: u64,
}

impl Head {
    fn response(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            system_fingerprint: None,
        }
    }

    fn piece(
        &self,
        index: usize,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<pagoda_protocol::openai::FinishReason>,
    ) -> String {
        frame(&self.response(
            vec![CompletionChoice {
                index,
                text,
                logprobs,
                finish_reason: finish,
            }],
            None,
        ))
    }
}

fn stream(
    generations: Vec<Generation>,
    echoes: Vec<String>,
    head: Head,
    n: usize,
    include_usage: bool,
    with_logprobs: bool,
    tokenizer: Arc<Tokenizer>,
) -> impl futures_util::Stream<Item = String> + Send + 'static {
    let mut pending = VecDeque::new();
    for (p, echo) in echoes.iter().enumerate() {
        if !echo.is_empty() {
            for i in 0..n {
                pending.push_back(head.piece(p * n + i, echo.clone(), None, None));
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
    head: Head,
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
            out.push_back(frame(&self.head.response(Vec::new(), Some(usage))));
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
                    logprob.map(|lp| legacy_logprobs(&self.tokenizer, &[lp], 0))
                } else {
                    None
                };
                if !text.is_empty() || logprobs.is_some() {
                    out.push_back(self.head.piece(p * self.n + index, text, logprobs, None));
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
                        out.push_back(self.head.piece(p * self.n + index, text, None, Some(r)))
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
            let u = usage_of(
                self.per_prompt
                    .iter()
                    .filter(|(q, _)| *q == p)
                    .map(|(_, u)| *u),
            );
            total = add_usage(total, u);
        }
        total
    }
}
