//! What speculation costs, measured: the target's step time `t(n)` for each step size `n`
//! (tokens in the step) seen so far, and the draft model's time per batched forward pass.
//! From them, the costs [`adaptive`](super::adaptive) weighs for a step with `B` decoding
//! sequences: `k` more verified rows of one sequence add `t(B + k) - t(B)` against that
//! sequence's share `t(B) / B` of a plain step, and a draft pass `d` counts against the whole
//! step (every sequence shares it).
//!
//! `t(n)` is a table, not a line, because on a CPU it is not one: a single stream is
//! memory-bound, so a second row rides along with the weights read for the first (nearly
//! free), while the rows after it cost compute (on two cores, five rows take about twice one
//! row). A line fitted through both regimes makes the first proposal look dear and the
//! fifth cheap, the opposite of the truth. Sizes not measured yet are interpolated between
//! measured neighbours, and beyond the largest extrapolated along the least-squares line of
//! all steps (or [`DEFAULT_VERIFY`] per row before there is one) — optimistic enough that
//! adaptive `k` tries them, after which they are measured.
//!
//! Invariant: costs are finite, >= 0 and non-decreasing in `k`; with no step measured the
//! defaults apply.

use super::adaptive::SpecCosts;
use super::MAX_SPECULATIVE_TOKENS;

/// Weight kept by the old sums of the line fit per observation.
const DECAY: f64 = 0.97;
/// Weight of the newest step in a size's average.
const ALPHA: f64 = 0.2;
/// Relative cost of one more verified row for a lone sequence, until measured.
const DEFAULT_VERIFY: f64 = 0.15;
/// Step sizes with a table entry (larger steps only feed the line).
const TABLE: usize = 128;

/// Step times per size, a decayed least-squares line over all steps, and the draft's pass
/// time.
#[derive(Debug, Clone)]
pub struct CostModel {
    /// `by_size[n]`: average seconds of a step of `n` tokens, once seen.
    by_size: Vec<Option<f64>>,
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
            by_size: vec![None; TABLE + 1],
            s0: 0.0,
            s1: 0.0,
            s2: 0.0,
            st: 0.0,
            snt: 0.0,
            draft_pass: None,
            draft_default,
        }
    }

    /// A target step of `tokens` tokens took `secs`.
    pub fn observe_step(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || !secs.is_finite() || secs < 0.0 {
            return;
        }
        if let Some(slot) = self.by_size.get_mut(tokens) {
            *slot = Some(slot.map_or(secs, |t| (1.0 - ALPHA) * t + ALPHA * secs));
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

    /// `(a, b)` of the line `t(n) = a + b·n` through all steps, once their sizes vary.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let var = self.s0 * self.s2 - self.s1 * self.s1;
        if self.s0 < 3.0 || var <= 1e-9 * self.s0 * self.s2 {
            return None;
        }
        let b = (self.s0 * self.snt - self.s1 * self.st) / var;
        let a = (self.st - b * self.s1) / self.s0;
        Some((a.max(0.0), b.max(0.0)))
    }

    /// Estimated seconds of a step of `n` tokens, `None` before any step of a size <= `n`
    /// was measured (see the module docs).
    fn step_time(&self, n: usize) -> Option<f64> {
        let measured = |m: usize| self.by_size.get(m).copied().flatten();
        if let Some(t) = measured(n) {
            return Some(t);
        }
        let below = (1..n.min(TABLE + 1))
            .rev()
            .find_map(|m| measured(m).map(|t| (m, t)))?;
        let above = (n + 1..=TABLE).find_map(|m| measured(m).map(|t| (m, t)));
        Some(match above {
            Some((m1, t1)) => {
                let (m0, t0) = below;
                t0 + (t1 - t0).max(0.0) * (n - m0) as f64 / (m1 - m0) as f64
            }
            None => {
                let (m0, t0) = below;
                let slope = self.fit().map_or(DEFAULT_VERIFY * t0, |(_, b)| {
                    b.max(DEFAULT_VERIFY * t0 * 0.1)
                });
                t0 + slope * (n - m0) as f64
            }
        })
    }

    /// Costs for a step with `batch` decoding sequences (see the module docs).
    pub fn costs(&self, batch: usize) -> SpecCosts {
        let batch = batch.max(1);
        let draft_of = |step: f64| {
            self.draft_pass
                .filter(|_| step > 0.0)
                .map_or(self.draft_default, |d| d / step)
        };
        match self.step_time(batch).filter(|&t| t > 0.0) {
            Some(step) => {
                let share = step / batch as f64;
                let mut verify = [0.0; MAX_SPECULATIVE_TOKENS + 1];
                let mut prev = 0.0f64;
                for (k, v) in verify.iter_mut().enumerate().skip(1) {
                    let extra = self.step_time(batch + k).unwrap_or(step) - step;
                    // Non-decreasing: a larger step never costs less than a smaller one.
                    prev = prev.max(extra.max(0.0) / share);
                    *v = prev;
                }
                SpecCosts {
                    verify,
                    draft: draft_of(step),
                }
            }
            None => SpecCosts::linear(self.draft_default, (DEFAULT_VERIFY * batch as f64).min(1.0)),
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
        for i in 0..400 {
            let n = [1, 2, 3, 4, 5, 6, 7, 8, 64, 65, 66][i % 11];
            m.observe_step(n, 0.050 + 0.002 * n as f64);
        }
        let one = m.costs(1);
        assert!(one.verify[1] < 0.05, "{one:?}");
        let many = m.costs(64);
        assert!(many.verify[1] > 0.7, "{many:?}");
    }

    /// The CPU's shape: the second row is free, later rows cost a quarter step each. A line
    /// would charge every row the same; the table keeps the shape.
    #[test]
    fn measured_sizes_keep_a_non_linear_shape() {
        let mut m = CostModel::new(0.0);
        let t = |n: usize| {
            if n <= 2 {
                0.040
            } else {
                0.040 + 0.010 * (n - 2) as f64
            }
        };
        for i in 0..60 {
            let n = [1, 2, 4, 6][i % 4];
            m.observe_step(n, t(n));
        }
        let c = m.costs(1);
        assert!(close(c.verify[1], 0.0), "{c:?}");
        assert!(close(c.verify[3], 0.5), "measured: {c:?}");
        assert!(close(c.verify[2], 0.25), "interpolated: {c:?}");
        assert!(c.verify[8] > c.verify[5], "extrapolated: {c:?}");
        assert!(c.verify.windows(2).all(|w| w[1] >= w[0]), "{c:?}");
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
    fn nothing_measured_leaves_the_defaults() {
        let m = CostModel::new(0.0);
        assert_eq!(m.costs(1).verify[1], DEFAULT_VERIFY);
        assert_eq!(m.costs(100).verify[1], 1.0);
    }

    #[test]
    fn bad_observations_are_ignored() {
        let mut m = CostModel::new(0.0);
        m.observe_step(0, 0.1);
        m.observe_step(1, f64::NAN);
        m.observe_step(2, -1.0);
        m.observe_draft_pass(f64::INFINITY);
        assert_eq!(m.costs(1), CostModel::new(0.0).costs(1));
    }
}
