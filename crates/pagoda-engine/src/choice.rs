//! The output side of one choice of a request: its sampler, the incremental detokenizer and
//! the stop-string matcher, turning sampled tokens into final text pieces.
//!
//! Invariants: text is released only once it is valid UTF-8 and cannot be the start of a stop
//! string; an EOS or stop token is never part of the output; after [`Choice::accept`] reports
//! an end, the choice accepts nothing more; a row of logits holding NaN or infinities is never
//! sampled from (the caller gets what was found instead).

use crate::sampling::{NonFiniteLogits, SampledToken, Sampler, SamplingParams};
use crate::stop::{FinishReason, StopMatcher};
use pagoda_model::tokenizer::{IncrementalDecoder, Tokenizer};
use pagoda_model::ModelError;

/// What one accepted token did.
#[derive(Debug)]
pub(crate) struct Accepted {
    /// Text that became final (may be empty).
    pub text: String,
    /// `Some` when this token ended the choice (EOS, stop token or stop string).
    pub ended: Option<FinishReason>,
    /// Whether the token is part of the output (false for EOS / stop tokens).
    pub kept: bool,
}

#[derive(Debug)]
pub(crate) struct Choice {
    sampler: Sampler,
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    /// Tokens that end the choice without being output.
    end_tokens: Vec<u32>,
    /// Output tokens so far.
    generated: Vec<u32>,
    stop_string_hit: bool,
}

impl Choice {
    pub fn new(params: SamplingParams, stops: Vec<String>, end_tokens: Vec<u32>) -> Self {
        Choice {
            sampler: Sampler::new(params),
            decoder: IncrementalDecoder::new(),
            stops: StopMatcher::new(stops),
            end_tokens,
            generated: Vec::new(),
            stop_string_hit: false,
        }
    }

    /// Samples the next token from one row of logits (modified in place); `Err` when the row
    /// holds NaN or infinities (a numerical fault: nothing is sampled).
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        prompt: &[u32],
    ) -> Result<SampledToken, NonFiniteLogits> {
        self.sampler.try_sample(logits, prompt, &self.generated)
    }

    /// Samples the token after `pending` (sampled this step, not yet accepted): penalties see
    /// them as generated. Speculative verification samples several rows in one step.
    pub fn sample_after(
        &mut self,
        logits: &mut [f32],
        prompt: &[u32],
        pending: &[u32],
    ) -> Result<SampledToken, NonFiniteLogits> {
        if pending.is_empty() {
            return self.sample(logits, prompt);
        }
        let mut history = self.generated.clone();
        history.extend_from_slice(pending);
        self.sampler.try_sample(logits, prompt, &history)
    }

    /// The token ends the choice without being output (EOS or a stop token).
    pub fn is_end_token(&self, token: u32) -> bool {
        self.end_tokens.contains(&token)
    }

    pub fn wants_logprobs(&self) -> bool {
        self.sampler.params().logprobs.is_some()
    }

    pub fn generated(&self) -> &[u32] {
        &self.generated
    }

    /// Takes a sampled token into the output.
    pub fn accept(&mut self, token: u32, tokenizer: &Tokenizer) -> Result<Accepted, ModelError> {
        if self.end_tokens.contains(&token) {
            return Ok(Accepted {
                text: String::new(),
                ended: Some(FinishReason::Stop),
                kept: false,
            });
        }
        self.generated.push(token);
        let piece = self.decoder.push(tokenizer, token)?.unwrap_or_default();
        let outcome = self.stops.push(&piece);
        if outcome.stopped {
            self.stop_string_hit = true;
        }
        Ok(Accepted {
            text: outcome.emit,
            ended: outcome.stopped.then_some(FinishReason::Stop),
            kept: true,
        })
    }

    /// The text still held back when the choice ends for `reason`, and the final reason (a
    /// stop string completed by the held-back text turns `Length` into `Stop`).
    pub fn finish(
        &mut self,
        tokenizer: &Tokenizer,
        reason: FinishReason,
    ) -> Result<(String, FinishReason), ModelError> {
        if self.stop_string_hit || reason == FinishReason::Abort {
            return Ok((String::new(), reason));
        }
        let tail = self.decoder.finish(tokenizer)?;
        let outcome = self.stops.push(&tail);
        if outcome.stopped {
            return Ok((outcome.emit, FinishReason::Stop));
        }
        let mut text = outcome.emit;
        text.push_str(&self.stops.flush());
        Ok((text, reason))
    }
}
