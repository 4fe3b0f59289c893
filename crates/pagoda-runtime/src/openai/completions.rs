//! `/v1/completions` bodies: the completions [`Plan`] builder ([`check`] without the model,
//! then [`Checked::plan`] per prompt: text or token ids to token ids and its `echo` text,
//! the knobs), legacy logprobs, and the whole (non-streamed) response. Each
//! prompt gets `n` choices, numbered prompt-major.

use super::{add_usage, check_ranges, finish_reason, token_text, usage, Aborted, ResponseHead};
use crate::collect::{combined_usage, ChoiceOutput};
use crate::fields::{check_extra, check_stream_options, Endpoint};
use crate::loader::LoadedModel;
use crate::plan::{plain, Plan};
use crate::request::{Bounds, Knobs, LengthRule, RequestError};
use crate::structured::openai_constraint_and_field;
use pagoda_engine::{ConstraintSpec, SampledToken};
use pagoda_model::tokenizer::Tokenizer;
use pagoda_protocol::openai::completion::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, PromptInput,
    DEFAULT_MAX_TOKENS,
};
use pagoda_protocol::openai::Usage;

/// Most prompts in one request.
pub const MAX_PROMPTS: usize = 64;

/// A completions body checked without the model: its prompts and its structured-output
/// constraint, each read once ([`check`]); [`Checked::plan`] binds one prompt to a model.
#[derive(Debug)]
pub struct Checked<'a> {
    req: &'a CompletionRequest,
    /// The prompts, each to get `n` choices.
    pub inputs: Vec<PromptInput>,
    /// The structured-output constraint and the field it came from.
    structured: Option<(&'static str, ConstraintSpec)>,
}

/// Everything about `req` that can be checked without the model: the first half of the
/// completions [`Plan`] builder.
pub fn check(req: &CompletionRequest) -> Result<Checked<'_>, RequestError> {
    check_ranges(req.temperature, req.n, req.logprobs)?;
    check_extra(Endpoint::OpenAiCompletions, &req.extra)?;
    if let Some(o) = &req.stream_options {
        check_stream_options(&o.extra)?;
    }
    let structured = openai_constraint_and_field(&req.structured)?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(RequestError::param("suffix", "suffix is not supported"));
    }
    let n = req.n.unwrap_or(1);
    if req.best_of.is_some_and(|b| b != n && b != 1) {
        return Err(RequestError::param(
            "best_of",
            "best_of other than n is not supported",
        ));
    }
    if req.echo && req.logprobs.is_some() {
        return Err(RequestError::param(
            "echo",
            "echo with logprobs (prompt logprobs) is not supported",
        ));
    }
    let inputs = req.prompt.clone().into_inputs();
    if inputs.is_empty() || inputs.len() > MAX_PROMPTS {
        return Err(RequestError::param(
            "prompt",
            format!(
                "send between 1 and {MAX_PROMPTS} prompts, got {}",
                inputs.len()
            ),
        ));
    }
    Ok(Checked {
        req,
        inputs,
        structured,
    })
}

impl Checked<'_> {
    /// The plan of one of the request's prompts on `loaded`, and the prompt's text (what
    /// `echo` puts in front of its choices): the knobs, with the model's Modelfile stop
    /// strings in front of the request's own, and the structured-output constraint; lengths
    /// [`LengthRule::Strict`].
    pub fn plan(
        &self,
        loaded: &LoadedModel,
        bounds: &Bounds,
        input: PromptInput,
    ) -> Result<(Plan, String), RequestError> {
        let req = self.req;
        let (prompt, echo) = encode(loaded, input)?;
        let (constraint_field, constraint) = match &self.structured {
            Some((field, c)) => (Some(*field), Some(c.clone())),
            None => (None, None),
        };
        let knobs = Knobs {
            logprobs: req.logprobs,
            max_tokens: Some(req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
            ..shared_knobs!(loaded, req, constraint)
        };
        let bounds = bounds.with_rule(LengthRule::Strict);
        let mut plan = plain(prompt, &loaded.openai_sampling(), knobs, &bounds)?;
        plan.constraint_field = constraint_field;
        Ok((plan, echo))
    }
}

/// Token ids of a prompt and its text (for `echo`).
fn encode(loaded: &LoadedModel, input: PromptInput) -> Result<(Vec<u32>, String), RequestError> {
    let tok = &loaded.tokenizer;
    match input {
        PromptInput::Text(text) => {
            let ids = tok.encode(&text, true).map_err(|e| {
                RequestError::param("prompt", format!("cannot tokenize the prompt: {e}"))
            })?;
            Ok((ids, text))
        }
        PromptInput::Tokens(ids) => {
            let vocab = tok.vocab_size();
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(RequestError::param(
                    "prompt",
                    format!("token id {bad} is out of range for a vocabulary of {vocab}"),
                ));
            }
            let text = tok.decode(&ids, false).unwrap_or_default();
            Ok((ids, text))
        }
    }
}

/// One prompt's collected choices and the text `echo` puts in front of them.
#[derive(Debug, Clone)]
pub struct PromptOutput {
    pub echo: String,
    pub choices: Vec<ChoiceOutput>,
}

/// The whole response: every prompt's `n` choices, prompt-major, and the usage summed over
/// prompts (each prompt counted once however many choices it had).
pub fn response(
    head: ResponseHead,
    prompts: Vec<PromptOutput>,
    with_logprobs: bool,
    tokenizer: &Tokenizer,
) -> Result<CompletionResponse, Aborted> {
    let mut choices = Vec::new();
    let mut total = Usage::default();
    for (p, out) in prompts.into_iter().enumerate() {
        let n = out.choices.len();
        total = add_usage(
            total,
            usage(combined_usage(out.choices.iter().map(|c| c.usage))),
        );
        for (i, c) in out.choices.into_iter().enumerate() {
            choices.push(CompletionChoice {
                index: p * n + i,
                text: format!("{}{}", out.echo, c.text),
                logprobs: with_logprobs
                    .then(|| legacy_logprobs(tokenizer, &c.logprobs, out.echo.len())),
                finish_reason: Some(finish_reason(c.finish).ok_or(Aborted)?),
            });
        }
    }
    Ok(body(&head, choices, Some(total)))
}

/// A completion body (a whole response, or one streamed chunk).
pub fn body(
    head: &ResponseHead,
    choices: Vec<CompletionChoice>,
    usage: Option<Usage>,
) -> CompletionResponse {
    CompletionResponse {
        id: head.id.clone(),
        object: "text_completion".into(),
        created: head.created,
        model: head.model.clone(),
        choices,
        usage,
        system_fingerprint: None,
    }
}

/// The legacy `logprobs` object of `lps`, text offsets counted from `offset`.
pub fn legacy_logprobs(
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
