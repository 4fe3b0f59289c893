//! One admission: every front end turns its request into one [`Plan`] here — the prompt's
//! tokens, sampling, limits, stops, tools, constraint and priority, as an
//! [`EngineRequest`] the runtime has checked, and what the answer needs (the tools whose
//! calls the output is parsed for, the field a refused constraint is named by).
//!
//! One builder per API shape, each in two steps so that nothing loads a model for a body
//! that is wrong by itself: a `check` that needs no model (returning the body's checked
//! parts, each computed once), then `plan` with the model and its [`Bounds`].
//! - OpenAI chat: [`crate::openai::chat::check`] → [`crate::openai::chat::Checked::plan`];
//! - OpenAI completions: [`crate::openai::completions::check`] →
//!   [`crate::openai::completions::Checked::plan`] (one plan per prompt);
//! - Ollama generate and chat: [`crate::ollama::check_generate`] / [`crate::ollama::check_chat`]
//!   → `plan`;
//! - the CLI's own tools (`run`, `bench`, `eval`, `tune`): [`plain`].
//!
//! Invariants: every builder ends in [`plain`] and so in
//! [`engine_request`](crate::request::engine_request), the one function that checks the
//! range of `max_tokens`, the prompt's length and the sampling knobs against the model and
//! the operator's limits; the engine checks a plan once more, as its own contract, when it
//! is submitted (`EngineHandle::submit`), and not again on its thread.

use crate::request::{engine_request, Bounds, Knobs, RequestError};
use crate::tools::{OutputFormats, OutputParser};
use pagoda_engine::{EngineRequest, SamplingParams};

/// A request admitted: the engine request, checked, and what answering it needs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// What the engine runs: prompt tokens, sampling, `max_tokens`, stops, `n`, priority,
    /// constraint.
    pub request: EngineRequest,
    /// The request field a constraint the engine refuses to compile (at submit) is named by:
    /// the structured-output field, `tools` for a forced call, `format` for Ollama.
    pub constraint_field: Option<&'static str>,
    /// The tools whose calls the output is parsed for; `None`: no calls are parsed.
    pub offered_tools: Option<crate::tools::Offered>,
    /// How the model writes calls and reasoning ([`crate::formats::output_formats`]).
    pub formats: OutputFormats,
}

impl Plan {
    /// Choices the request asks for.
    pub fn n(&self) -> usize {
        self.request.n
    }

    /// Tokens in the prompt.
    pub fn prompt_tokens(&self) -> usize {
        self.request.prompt.len()
    }

    /// The parser of one choice's output, when it is parsed (tools offered, or a model that
    /// reasons); `None`: the output is content as written.
    pub fn output_parser(&self) -> Option<OutputParser> {
        (self.offered_tools.is_some() || self.formats.reasoning.is_some())
            .then(|| OutputParser::with_formats(self.offered_tools.clone(), self.formats))
    }

    /// Sets the output's `formats` (and keeps the control tokens their markers need in the
    /// output's text).
    pub fn set_formats(&mut self, formats: OutputFormats) {
        self.formats = formats;
        self.request.keep_special_tokens =
            crate::formats::keeps_control_tokens(&formats, self.offered_tools.is_some());
    }
}

/// The plan of a prompt already tokenized and knobs already mapped: what the API shapes end
/// in, and what the CLI's own tools call directly (no tools to parse, no named constraint
/// field).
pub fn plain(
    prompt: Vec<u32>,
    base: &SamplingParams,
    knobs: Knobs,
    bounds: &Bounds,
) -> Result<Plan, RequestError> {
    Ok(Plan {
        request: engine_request(prompt, base, knobs, bounds)?,
        constraint_field: None,
        offered_tools: None,
        formats: OutputFormats::default(),
    })
}
