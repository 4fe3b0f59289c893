//! One request through the engine, blocking, with its text handed over as it is produced:
//! what `pagoda run`, `bench model` and `eval compare` do. They submit to the same
//! [`EngineHandle`] and step loop `serve` runs, so what they measure is what `serve` serves.
//!
//! Invariant: when the caller's `on_text` asks to stop (a closed pipe), the request is
//! aborted in the engine (its KV blocks freed) and the text so far is returned as a choice
//! with [`FinishReason::Abort`](pagoda_engine::FinishReason::Abort).

use crate::collect::{ChoiceOutput, Collector, GenerationFailed};
use pagoda_engine::{EngineError, EngineHandle, EngineRequest, RequestTimings, TokenEvent};
use std::time::Duration;

/// Why a generation did not complete.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The engine refused the request (bad input, or it is shutting down).
    #[error(transparent)]
    Refused(#[from] EngineError),
    /// The engine failed it mid-way (e.g. a numerical fault).
    #[error(transparent)]
    Failed(#[from] GenerationFailed),
}

/// Runs `request` (one choice) to its end, calling `on_text` with each piece of final text;
/// `on_text` returning `false` aborts the request.
pub fn generate(
    engine: &EngineHandle,
    request: EngineRequest,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<ChoiceOutput, GenerateError> {
    let stream = engine.submit(request)?;
    let id = stream.id;
    let mut collector = Collector::new(1);
    let mut listening = true;
    for event in stream {
        if listening {
            let text = match &event {
                TokenEvent::Token { text, .. } | TokenEvent::Finished { text, .. } => text.as_str(),
                TokenEvent::Error { .. } => "",
            };
            if !text.is_empty() && !on_text(text) {
                listening = false;
                engine.abort(id);
            }
        }
        collector.push(event)?;
    }
    let mut choices = collector.finish();
    Ok(choices.swap_remove(0))
}

/// Wall-clock split of one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// From the first step that worked on the request to its first token: the (uncached)
    /// prompt's prefill and the first sample.
    pub prefill: Duration,
    /// Every later token.
    pub decode: Duration,
}

impl Timings {
    /// The split of a finished choice (zero where a phase never happened).
    pub fn of(t: &RequestTimings) -> Self {
        let start = t.first_scheduled.unwrap_or(t.arrived);
        match t.first_token {
            Some(first) => Timings {
                prefill: first.saturating_duration_since(start),
                decode: t.finished.saturating_duration_since(first),
            },
            None => Timings::default(),
        }
    }

    /// Prompt tokens per second over `tokens` prefilled tokens.
    pub fn prefill_tps(&self, tokens: usize) -> f64 {
        tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }

    /// Decode tokens per second over `tokens` tokens after the first.
    pub fn decode_tps(&self, tokens: usize) -> f64 {
        tokens as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

impl ChoiceOutput {
    /// The prefill / decode split of this choice.
    pub fn split(&self) -> Timings {
        self.timings.as_ref().map(Timings::of).unwrap_or_default()
    }
}

/// Context of a one-stream engine when neither the caller nor the model's Modelfile
/// (`num_ctx`) asks for another (capped at the model's own).
pub const DEFAULT_CONTEXT: usize = crate::quant_choice::DEFAULT_CONTEXT;

/// Starts an engine for one stream at a time over `loaded` (see [`engine_config`]), with a
/// context of `requested` tokens, else the Modelfile's `num_ctx`, else [`DEFAULT_CONTEXT`],
/// capped at the model's; returns it with the [`bounds`] of requests to it.
pub fn start(
    loaded: &crate::loader::LoadedModel,
    requested: Option<usize>,
) -> Result<(EngineHandle, crate::request::Bounds), EngineError> {
    let context = requested
        .or(loaded.context_limit)
        .unwrap_or(DEFAULT_CONTEXT)
        .min(loaded.model.config().context_length);
    let engine = EngineHandle::start(
        loaded.model.clone(),
        loaded.tokenizer.clone(),
        engine_config(context),
    )?;
    Ok((engine, bounds(loaded, context)))
}

/// The engine for one conversation or one stream at a time (`run`, `bench model`, `eval
/// compare`): one sequence of up to `context` tokens, prefix caching on so a conversation's
/// earlier turns are reused, everything else as `serve` runs it.
pub fn engine_config(context: usize) -> pagoda_engine::EngineConfig {
    pagoda_engine::EngineConfig {
        max_num_seqs: 1,
        max_model_len: Some(context),
        ..pagoda_engine::EngineConfig::default()
    }
}

/// What a request to [`engine_config`]'s engine may ask for: `context` tokens in all,
/// generation ending at the context rather than refusing (as `llama.cpp` and Ollama do).
pub fn bounds(loaded: &crate::loader::LoadedModel, context: usize) -> crate::request::Bounds {
    crate::request::Bounds::serving(loaded, context, None, pagoda_engine::Policy::Fcfs)
        .with_rule(crate::request::LengthRule::Clamp)
}
