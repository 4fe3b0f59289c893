//! The empirical check behind speculation: tokens per second of recent decode steps that
//! verified proposals against recent ones that did not, per batch size (a step of four
//! sequences is not comparable with a step of one). When speculating is measurably slower
//! (the cost model was wrong: a draft slower than it looked, per-row overhead it does not
//! see), proposals stop, except one probe step every [`PROBE_EVERY`] steps so the comparison
//! stays current. While speculating, one step in [`PLAIN_PROBE_EVERY`] runs without proposals
//! when no plain step was seen meanwhile, so the plain rate is always measured: a proposer
//! that always has something to propose (a draft model) cannot hide a loss.
//!
//! Rates are ratios of averages (average tokens per step over average seconds per step), not
//! averages of per-step rates, which would overweight short lucky steps.
//!
//! Invariant: only pure decode steps are compared (a prefill chunk in the step would make it
//! slower for reasons of its own); until both kinds were seen, speculation is allowed, except
//! for the plain probes that get the missing measurement.

use std::collections::HashMap;

/// Steps between probes while speculation is suppressed.
pub const PROBE_EVERY: u32 = 16;
/// Speculative steps after which, with no plain step seen since, one step runs plain.
pub const PLAIN_PROBE_EVERY: u32 = 24;
/// Speculative steps before the first plain probe of a batch size never seen plain.
const FIRST_PLAIN_PROBE: u32 = 4;
/// Weight of the newest step in the averages.
const ALPHA: f64 = 0.15;
/// Batch sizes tracked separately; larger batches share the last slot.
const MAX_BATCH_SLOT: usize = 16;

/// Exponential averages of tokens and seconds per step.
#[derive(Debug, Clone, Copy, Default)]
struct RateAverage {
    tokens: f64,
    secs: f64,
    seen: bool,
}

impl RateAverage {
    fn observe(&mut self, tokens: f64, secs: f64) {
        if self.seen {
            self.tokens = (1.0 - ALPHA) * self.tokens + ALPHA * tokens;
            self.secs = (1.0 - ALPHA) * self.secs + ALPHA * secs;
        } else {
            (self.tokens, self.secs, self.seen) = (tokens, secs, true);
        }
    }

    fn rate(&self) -> Option<f64> {
        (self.seen && self.secs > 0.0).then(|| self.tokens / self.secs)
    }
}

/// The comparison for one batch size.
#[derive(Debug, Clone, Default)]
struct BatchGuard {
    plain: RateAverage,
    speculative: RateAverage,
    /// Steps without proposals since the last probe while losing.
    since_probe: u32,
    /// Speculative steps since the last plain one.
    since_plain: u32,
}

impl BatchGuard {
    fn losing(&self) -> bool {
        matches!(
            (self.speculative.rate(), self.plain.rate()),
            (Some(s), Some(p)) if s < p
        )
    }

    fn decide(&mut self) -> GuardDecision {
        if self.losing() {
            self.since_probe += 1;
            if self.since_probe >= PROBE_EVERY {
                self.since_probe = 0;
                return GuardDecision::Probe;
            }
            return GuardDecision::Plain;
        }
        self.since_probe = 0;
        let due = if self.plain.seen {
            PLAIN_PROBE_EVERY
        } else {
            FIRST_PLAIN_PROBE
        };
        // A plain probe: the step's observation resets `since_plain`.
        if self.since_plain < due {
            GuardDecision::Speculate
        } else {
            GuardDecision::Plain
        }
    }
}

/// What the guard lets one step do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardDecision {
    /// Propose as the per-sequence controller decides.
    Speculate,
    /// Speculation is losing, but this step probes it: propose at least one token, so the
    /// probe measures something even where the per-sequence controller had turned off.
    Probe,
    /// No proposals this step.
    Plain,
}

impl GuardDecision {
    /// Whether the step may propose.
    pub fn proposes(self) -> bool {
        self != GuardDecision::Plain
    }
}

/// Speculative against plain decode throughput, per batch size.
#[derive(Debug, Clone, Default)]
pub struct ThroughputGuard {
    batches: HashMap<usize, BatchGuard>,
}

impl ThroughputGuard {
    fn slot(&mut self, batch: usize) -> &mut BatchGuard {
        self.batches
            .entry(batch.clamp(1, MAX_BATCH_SLOT))
            .or_default()
    }

    /// A pure decode step of `batch` sequences emitted `tokens` in `secs`, with proposals or
    /// not.
    pub fn observe(&mut self, batch: usize, tokens: usize, secs: f64, speculative: bool) {
        if tokens == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        let g = self.slot(batch);
        if speculative {
            g.speculative.observe(tokens as f64, secs);
            g.since_plain = g.since_plain.saturating_add(1);
        } else {
            g.plain.observe(tokens as f64, secs);
            g.since_plain = 0;
        }
    }

    /// Whether speculating is measured to be slower than not for `batch` sequences.
    pub fn losing(&self, batch: usize) -> bool {
        self.batches
            .get(&batch.clamp(1, MAX_BATCH_SLOT))
            .is_some_and(BatchGuard::losing)
    }

    /// What a step of `batch` decoding sequences may do: speculate unless losing (then probe
    /// one step in [`PROBE_EVERY`]) or a plain probe is due.
    pub fn decide(&mut self, batch: usize) -> GuardDecision {
        self.slot(batch).decide()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `steps` steps of one sequence where a speculative step takes `spec` (tokens,
    /// secs) and a plain one `plain`; returns how many speculated.
    fn run(
        g: &mut ThroughputGuard,
        steps: usize,
        spec: (usize, f64),
        plain: (usize, f64),
    ) -> usize {
        let mut speculated = 0;
        for _ in 0..steps {
            if g.decide(1).proposes() {
                speculated += 1;
                g.observe(1, spec.0, spec.1, true);
            } else {
                g.observe(1, plain.0, plain.1, false);
            }
        }
        speculated
    }

    #[test]
    fn a_proposer_that_always_proposes_is_still_compared_with_plain_steps() {
        let mut g = ThroughputGuard::default();
        // Speculation: 2 tokens per 0.1 s (20 tok/s); plain: 1 per 0.04 s (25 tok/s).
        let first = run(&mut g, FIRST_PLAIN_PROBE as usize + 1, (2, 0.1), (1, 0.04));
        assert_eq!(
            first, FIRST_PLAIN_PROBE as usize,
            "one plain probe after the first steps"
        );
        assert!(g.losing(1));
        let later = run(&mut g, 160, (2, 0.1), (1, 0.04));
        assert_eq!(later, 10, "only the probes speculate while losing");
        let decisions: Vec<GuardDecision> = (0..PROBE_EVERY).map(|_| g.decide(1)).collect();
        assert_eq!(
            decisions
                .iter()
                .filter(|&&d| d == GuardDecision::Probe)
                .count(),
            1,
            "{decisions:?}"
        );
    }

    #[test]
    fn winning_speculation_pays_one_plain_probe_in_a_while() {
        let mut g = ThroughputGuard::default();
        // Speculation: 4 tokens per 0.1 s (40 tok/s) against 25 plain.
        let steps = 10 * PLAIN_PROBE_EVERY as usize;
        let speculated = run(&mut g, steps, (4, 0.1), (1, 0.04));
        assert!(!g.losing(1));
        let plain = steps - speculated;
        assert!((9..=11).contains(&plain), "{plain} plain steps in {steps}");
    }

    #[test]
    fn probes_that_come_out_faster_win_speculation_back() {
        let mut g = ThroughputGuard::default();
        run(&mut g, 40, (2, 0.1), (1, 0.04));
        assert!(g.losing(1));
        // The text turns repetitive: speculation now emits 6 tokens per 0.1 s.
        run(&mut g, 200, (6, 0.1), (1, 0.04));
        assert!(!g.losing(1));
    }

    #[test]
    fn batch_sizes_are_compared_separately() {
        let mut g = ThroughputGuard::default();
        run(&mut g, 40, (2, 0.1), (1, 0.04));
        assert!(g.losing(1));
        assert!(!g.losing(4), "nothing measured for four sequences");
        assert_eq!(g.decide(4), GuardDecision::Speculate);
    }

    #[test]
    fn ignores_empty_or_timeless_steps() {
        let mut g = ThroughputGuard::default();
        g.observe(1, 0, 0.1, true);
        g.observe(1, 1, 0.0, false);
        g.observe(1, 1, f64::NAN, false);
        g.observe(1, 1, -1.0, true);
        assert!(!g.losing(1));
    }
}
