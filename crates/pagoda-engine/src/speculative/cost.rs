//! What speculation costs, measured: the target's step time as a line `t(n) = a + b·n` in the
//! step's token count `n` (fitted by least squares over exponentially decayed sums of the
//! steps seen), and the draft model's time per batched forward pass. From them, the costs
//! [`adaptive`](super::adaptive) weighs for a step with `B` decoding sequences: one more
//! verified row costs `b` against a sequence's share `(a + b·B) / B` of a plain step, and a
//! draft pass `d` against the whole step (every sequence shares it).
//!
//! On a CPU a single stream is memory-bound (`a` large, `b` small: extra rows are nearly
//! free); a large batch is compute-bound (`a + b·B ≈ b·B`: a row costs a whole sequence's
//! share), so speculation pays for one stream and not for a full batch — the model lets
//! adaptive `k` find that out instead of guessing.
//!
//! Invariant: costs are finite and >= 0; until enough steps of different sizes were seen the
//! defaults apply.

use super::adaptive::SpecCosts;

/// Weight kept by the old sums per observation.
const DECAY: f64 = 0.97;
/// Relative cost of one more verified row for a lone sequence, until measured.
const DEFAULT_VERIFY: f64 = 0.15;

/// Decayed least-squares fit of step time against tokens, plus the draft's pass time.
#[derive(Debug, Clone, Default)]
pub struct CostModel {
    /// Decayed sums of 1, n, n², t, n·t.
    s0: f64,
    s1: f64,
    s2: f64,
    st: f64,
    snt: f64,
    /// Seconds per draft forward pass (exponential average), if a draft model runs.
    draft_pass: Option<f64>,
    /// Relative cost of a draft pass until measured (0 for prompt lookup).
    draft_default: f64,
}

impl CostModel {
    pub fn new(draft_default: f64) -> Self {
        CostModel {
            draft_default,
            ..CostModel::default()
        }
    }

    /// A target step of `tokens` tokens took `secs`.
    pub fn observe_step(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || !secs.is_finite() || secs < 0.0 {
            return;
        }
        let n = tokens as f64;
        self.s0 = DECAY * self.s0 + 1.0;
        self.s1 = DECAY * self.s1 + n;
        self.s2 = DECAY * self.s2 + n * n;
        self.st = DECAY * self.st + secs;
        self.snt = DECAY * self.snt + n * secs;
    }

    /// A draft forward pass took `secs`.
    pub fn observe_draft_pass(&mut self, secs: f64) {
        if secs.is_finite() && secs >= 0.0 {
            self.draft_pass = Some(self.draft_pass.map_or(secs, |d| 0.8 * d + 0.2 * secs));
        }
    }

    /// `(a, b)` of `t(n) = a + b·n`, once the steps seen vary in size.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let var = self.s0 * self.s2 - self.s1 * self.s1;
        if self.s0 < 3.0 || var <= 1e-9 * self.s0 * self.s2 {
            return None;
        }
        let b = (self.s0 * self.snt - self.s1 * self.st) / var;
        let a = (self.st - b * self.s1) / self.s0;
        Some((a.max(0.0), b.max(0.0)))
    }

    /// Costs for a step with `batch` decoding sequences (see the module docs).
    pub fn costs(&self, batch: usize) -> SpecCosts {
        let batch = batch.max(1) as f64;
        let fitted = self.fit().filter(|&(a, b)| a + b * batch > 0.0);
        match fitted {
            Some((a, b)) => {
                let step = a + b * batch;
                SpecCosts {
                    verify: b * batch / step,
                    draft: self.draft_pass.map_or(self.draft_default, |d| d / step),
                }
            }
            None => SpecCosts {
                verify: (DEFAULT_VERIFY * batch).min(1.0),
                draft: self.draft_default,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(x: f64, y: f64) -> bool {
        (x - y).abs() < 1e-6 * (1.0 + y.abs())
    }

    #[test]
    fn fits_a_line_through_step_times() {
        let mut m = CostModel::new(0.0);
        assert!(m.fit().is_none());
        for i in 0..40 {
            let n = 1 + i % 6;
            m.observe_step(n, 0.050 + 0.002 * n as f64);
        }
        let (a, b) = m.fit().unwrap();
        assert!(close(a, 0.050) && close(b, 0.002), "{a} {b}");
    }

    #[test]
    fn one_stream_verifies_cheaply_a_full_batch_does_not() {
        let mut m = CostModel::new(0.0);
        for i in 0..40 {
            let n = 1 + i % 8;
            m.observe_step(n, 0.050 + 0.002 * n as f64);
        }
        let one = m.costs(1);
        assert!(one.verify < 0.05, "{one:?}");
        let many = m.costs(64);
        assert!(many.verify > 0.7, "{many:?}");
    }

    #[test]
    fn draft_pass_is_relative_to_the_step() {
        let mut m = CostModel::new(0.3);
        assert_eq!(m.costs(1).draft, 0.3);
        for i in 0..10 {
            m.observe_step(1 + i % 2, 0.1 + 0.01 * (i % 2) as f64);
        }
        m.observe_draft_pass(0.022);
        // t(1) = 0.1 s, so a 22 ms pass is 0.22 of a plain step.
        assert!(close(m.costs(1).draft, 0.22), "{:?}", m.costs(1));
    }

    #[test]
    fn same_sized_steps_leave_the_defaults() {
        let mut m = CostModel::new(0.0);
        for _ in 0..50 {
            m.observe_step(1, 0.05);
        }
        assert!(m.fit().is_none());
        assert_eq!(m.costs(1).verify, DEFAULT_VERIFY);
        assert_eq!(m.costs(100).verify, 1.0);
    }
}
