//! The output side of one choice of a request: its sampler, the incremental detokenizer and
//! the stop-string matcher, turning sampled tokens into final text pieces.
//!
//! Invariants: text is released only once it is valid UTF-8 and cannot be the start of a stop
//! string; an EOS or stop token is never part of the output; after [`Choice::accept`] reports
//! an end, the choice accepts nothing more; a row of logits holding NaN or infinities is never
//! sampled from (the caller gets what was found instead); a constrained choice samples only
//! tokens its grammar allows and its matcher has consumed exactly its kept tokens
//! ([`crate::constraint`]).

use crate::constraint::ChoiceConstraint;
use crate::sampling::{NonFiniteLogits, SampledToken, Sampler, SamplingParams};
use crate::stop::{FinishReason, StopMatcher};
use pagoda_model::tokenizer::{IncrementalDecoder, Tokenizer};
use pagoda_model::ModelError;

/// Why a row could not be sampled.
#[derive(Debug)]
pub(crate) enum SampleError {
    /// The row held NaN or infinities (nothing was sampled).
    NonFinite(NonFiniteLogits),
    /// The choice's constraint failed to compute its mask.
    Constraint(String),
}

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
    /// The grammar the output must match, if any.
    constraint: Option<ChoiceConstraint>,
}

impl Choice {
    pub fn new(
        params: SamplingParams,
        stops: Vec<String>,
        end_tokens: Vec<u32>,
        constraint: Option<ChoiceConstraint>,
        keep_special_tokens: bool,
    ) -> Self {
        Choice {
            sampler: Sampler::new(params),
            decoder: IncrementalDecoder::with_special_tokens(keep_special_tokens),
            stops: StopMatcher::new(stops),
            end_tokens,
            generated: Vec::new(),
            stop_string_hit: false,
            constraint,
        }
    }

    /// Samples the next token from one row of logits (modified in place); `Err` when the row
    /// holds NaN or infinities (a numerical fault: nothing is sampled) or the constraint's
    /// mask could not be computed.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        prompt: &[u32],
    ) -> Result<SampledToken, SampleError> {
        Self::sample_masked(
            &mut self.sampler,
            self.constraint.as_mut(),
            logits,
            prompt,
            &self.generated,
        )
    }

    fn sample_masked(
        sampler: &mut Sampler,
        constraint: Option<&mut ChoiceConstraint>,
        logits: &mut [f32],
        prompt: &[u32],
        history: &[u32],
    ) -> Result<SampledToken, SampleError> {
        let Some(constraint) = constraint else {
            return sampler
                .try_sample(logits, prompt, history)
                .map_err(SampleError::NonFinite);
        };
        let mut failed = None;
        let pick = sampler
            .try_sample_masked(logits, prompt, history, |row| {
                if let Err(e) = constraint.apply(row) {
                    failed = Some(e);
                }
            })
            .map_err(SampleError::NonFinite)?;
        match failed {
            Some(e) => Err(SampleError::Constraint(e)),
            None => Ok(pick),
        }
    }

    /// The choice's constraint, if it has one (to compute its mask ahead of sampling).
    pub fn constraint_mut(&mut self) -> Option<&mut ChoiceConstraint> {
        self.constraint.as_mut()
    }

    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Samples the token after `pending` (sampled this step, not yet accepted): penalties see
    /// them as generated. Speculative verification samples several rows in one step.
    pub fn sample_after(
        &mut self,
        logits: &mut [f32],
        prompt: &[u32],
        pending: &[u32],
    ) -> Result<SampledToken, SampleError> {
        if pending.is_empty() {
            return self.sample(logits, prompt);
        }
        // Constrained requests never carry proposals, so only the first row of a chunk is
        // ever sampled under a mask (the matcher is at the state before `pending`).
        let mut history = self.generated.clone();
        history.extend_from_slice(pending);
        Self::sample_masked(&mut self.sampler, None, logits, prompt, &history)
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

    /// Takes a sampled token into the output. `Err`: detokenizing failed, or the constraint
    /// refused the token (the message says which).
    pub fn accept(&mut self, token: u32, tokenizer: &Tokenizer) -> Result<Accepted, String> {
        let complete = match self.constraint.as_mut() {
            Some(c) => c.consume(token)?,
            None => false,
        };
        let ends = self.end_tokens.contains(&token)
            || self
                .constraint
                .as_ref()
                .is_some_and(|c| c.is_end_token(token));
        if ends {
            return Ok(Accepted {
                text: String::new(),
                ended: Some(FinishReason::Stop),
                kept: false,
            });
        }
        self.generated.push(token);
        let piece = self
            .decoder
            .push(tokenizer, token)
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        let outcome = self.stops.push(&piece);
        if outcome.stopped {
            self.stop_string_hit = true;
        }
        Ok(Accepted {
            text: outcome.emit,
            // A complete grammar ends the choice: nothing but its end could follow.
            ended: (outcome.stopped || complete).then_some(FinishReason::Stop),
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
