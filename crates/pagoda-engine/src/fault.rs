//! Reporting numerical faults: logits a choice was to sample from held NaN or infinities
//! ([`EngineError::NumericalFault`]). The request fails with that error; this module writes
//! the one `tracing::error!` line about it, naming the first stage of the model that produced
//! a non-finite value when that is cheap to find.
//!
//! Finding the stage means re-running the faulting sequence alone, a stage at a time
//! ([`Model::first_non_finite`]): the batched forward pass keeps no per-layer state to look
//! at afterwards, and checking every layer's output on every step would put a scan of the
//! whole batch's hidden states after each layer on the hot path to serve a rare event. The
//! re-run is an unbatched prefill on the caller's thread (the engine's: every other sequence
//! waits for it) with its own KV cache, so it is bounded: at most [`LOCATE_MAX_TOKENS`]
//! tokens, and an engine does it once, for its first fault short enough (broken weights
//! fault every request the same way; one located fault says where).

use crate::request::RequestId;
use crate::sampling::NonFiniteLogits;
use crate::scheduler::ScheduledChunk;
use crate::EngineError;
use pagoda_model::arch::{Model, NonFiniteStage};
use pagoda_model::{KvDtype, ModelError};

/// Longest sequence re-run to locate a fault: one prefill of this many tokens stalls the
/// engine's other sequences for about as long as admitting a prompt of that size would.
pub(crate) const LOCATE_MAX_TOKENS: usize = 1024;

/// Where a fault's non-finite values first appeared, as far as was looked.
#[derive(Debug)]
pub(crate) enum Located {
    /// The re-run named this stage.
    Stage(NonFiniteStage),
    /// The re-run stayed finite. Batched and solo passes do the same arithmetic per row (up
    /// to summation order), so this points at what the re-run lacks: the request's LoRA
    /// adapter, state of the batch (a KV block written wrongly), or a value on the edge of
    /// overflowing.
    NotReproduced { adapter: bool },
    /// Not re-run: the sequence has more than [`LOCATE_MAX_TOKENS`] tokens.
    TooLong { tokens: usize },
    /// Not re-run; the reason.
    Skipped(&'static str),
    /// The re-run itself failed.
    Failed(ModelError),
}

impl std::fmt::Display for Located {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Located::Stage(stage) => write!(f, "{stage}"),
            Located::NotReproduced { adapter: true } => {
                f.write_str("not reproduced by a solo re-run of the base model (the request's LoRA adapter is a suspect)")
            }
            Located::NotReproduced { adapter: false } => {
                f.write_str("not reproduced by a solo re-run of the sequence")
            }
            Located::TooLong { tokens } => write!(
                f,
                "not searched: the sequence has {tokens} tokens, a re-run at most {LOCATE_MAX_TOKENS}"
            ),
            Located::Skipped(why) => write!(f, "not searched: {why}"),
            Located::Failed(e) => write!(f, "not found: the re-run failed: {e}"),
        }
    }
}

/// Re-runs `tokens` (the faulting row's sequence, its last token the row's input) alone to
/// find the first stage that produced a non-finite value, within [`LOCATE_MAX_TOKENS`].
pub(crate) fn locate(model: &Model, tokens: &[u32], dtype: KvDtype, adapter: bool) -> Located {
    if tokens.len() > LOCATE_MAX_TOKENS {
        return Located::TooLong {
            tokens: tokens.len(),
        };
    }
    match model.first_non_finite(tokens, dtype) {
        Ok(Some(stage)) => Located::Stage(stage),
        Ok(None) => Located::NotReproduced { adapter },
        Err(e) => Located::Failed(e),
    }
}

/// A row of logits a choice was to sample from held NaN or infinities.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fault {
    pub found: NonFiniteLogits,
    /// The output token being chosen (0: the first).
    pub step: usize,
    /// The sequence position whose logits these are (the last token fed).
    pub position: usize,
}

impl Fault {
    pub fn error(&self) -> EngineError {
        EngineError::NumericalFault {
            found: self.found,
            step: self.step,
            position: self.position,
        }
    }

    /// The one log line of the fault.
    pub fn log(&self, request: Option<RequestId>, located: &Located) {
        tracing::error!(
            request_id = request,
            step = self.step,
            position = self.position,
            found = %self.found,
            first_non_finite = %located,
            "non-finite logits (NaN/inf): the request fails with a numerical fault"
        );
    }
}

/// Logs an engine's numerical faults, re-running only the first one it can to locate it.
#[derive(Debug, Default)]
pub(crate) struct FaultReporter {
    /// A fault was located: later ones are only logged.
    located: bool,
}

impl FaultReporter {
    /// Logs `fault` of `request`. Unless this engine located a fault already, first re-runs
    /// the sequence `tokens` gives (see [`row_input`]) to name the stage that went non-finite.
    pub fn report(
        &mut self,
        fault: &Fault,
        request: RequestId,
        model: &Model,
        dtype: KvDtype,
        adapter: bool,
        tokens: impl FnOnce() -> Option<Vec<u32>>,
    ) {
        let located = if self.located {
            Located::Skipped("the engine re-runs only its first faulting sequence")
        } else {
            match tokens() {
                Some(tokens) => {
                    let located = locate(model, &tokens, dtype, adapter);
                    self.located = !matches!(located, Located::TooLong { .. });
                    located
                }
                None => Located::Skipped("the sequence's tokens are not known"),
            }
        };
        fault.log(Some(request), &located);
    }
}

/// The tokens of a sequence whose known tokens are `known`, up to and including the input of
/// `chunk`'s row at `position` (a proposal, when the row verifies one).
pub(crate) fn row_input(
    known: &[u32],
    chunk: &ScheduledChunk,
    position: usize,
) -> Option<Vec<u32>> {
    let mut tokens = known.get(..chunk.start)?.to_vec();
    tokens.extend_from_slice(chunk.tokens.get(..=position.checked_sub(chunk.start)?)?);
    Some(tokens)
}
