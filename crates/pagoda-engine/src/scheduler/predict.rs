//! Predicted job length, for shortest-job-first ([`Policy::Sjf`](super::Policy::Sjf)): the
//! prompt tokens a sequence has left to compute plus the output tokens it is expected to
//! generate. The expected output is the request's `max_tokens` when its client chose it, or
//! else this scheduler's running estimate ([`OutputEstimate`]: an exponential moving average
//! of the output lengths of sequences that finished), capped by `max_tokens`.
//!
//! Invariants: the estimate starts at [`DEFAULT_EXPECTED_OUTPUT`] and is always at least 1;
//! it learns only from sequences whose output length was their own (stopped by EOS or a stop
//! string, or cut by a limit the client did not choose), never from aborted sequences or
//! from those cut short by an explicit `max_tokens` (their length says what the client
//! wanted, not how long such outputs run).

use super::sequence::Sequence;
use super::SeqEnd;

/// Expected output tokens before any sequence has finished.
pub const DEFAULT_EXPECTED_OUTPUT: f64 = 256.0;

/// Weight of the newest finished sequence in the average (about the last 20 count).
const SMOOTHING: f64 = 0.1;

/// The running estimate of a sequence's output length. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputEstimate {
    mean: f64,
}

impl Default for OutputEstimate {
    fn default() -> Self {
        OutputEstimate {
            mean: DEFAULT_EXPECTED_OUTPUT,
        }
    }
}

impl OutputEstimate {
    /// Expected output tokens of a sequence without an explicit `max_tokens` (at least 1).
    pub fn tokens(&self) -> f64 {
        self.mean
    }

    /// Learns from a sequence that ended with `end` after generating `generated` tokens, if
    /// its length was its own (see the module docs).
    pub(super) fn observe(&mut self, end: SeqEnd, generated: usize, max_tokens_explicit: bool) {
        let natural = match end {
            SeqEnd::Stopped => true,
            SeqEnd::Length | SeqEnd::ContextFull => !max_tokens_explicit,
            SeqEnd::Aborted => false,
        };
        if natural {
            self.mean += SMOOTHING * (generated as f64 - self.mean);
            self.mean = self.mean.max(1.0);
        }
    }
}

/// Predicted tokens left for `seq` to process: prompt (or recompute) left, plus expected
/// output left.
pub(super) fn predicted_len(seq: &Sequence, estimate: &OutputEstimate) -> f64 {
    let expected_output = if seq.max_tokens_explicit {
        seq.max_tokens as f64
    } else {
        estimate.tokens().min(seq.max_tokens as f64)
    };
    let output_left = (expected_output - seq.generated() as f64).max(0.0);
    seq.to_compute() as f64 + output_left
}
