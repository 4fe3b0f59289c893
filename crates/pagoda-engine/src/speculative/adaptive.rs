//! How many tokens to propose: per sequence, from how often its proposals were accepted and
//! what a proposal and its verification cost, the `k` that maximises expected tokens per unit
//! of time — 0 (no speculation) when no `k` beats plain decoding.
//!
//! With per-token acceptance probability `a`, a step that proposes `k` tokens yields
//! `E(k) = (1 - a^(k+1)) / (1 - a)` tokens (the accepted prefix plus the one sampled after
//! it) and costs `1 + k * draft + verify(k)` plain decode steps, where `draft` is one draft
//! forward pass and `verify(k)` what `k` more verified rows add, both relative to a plain
//! step (measured: [`super::cost`]). Plain decoding is `E(0) / cost(0) = 1`.
//!
//! Invariants: `k <= max_k`; acceptance is in `[0, 1]` (accepted tokens over accepted
//! tokens plus rejections, both exponentially averaged); a sequence
//! turned off is probed again with `k = 1` every [`PROBE_EVERY`] decode steps, so a
//! sequence whose text starts to repeat gets speculation back.

use super::MAX_SPECULATIVE_TOKENS;

/// Weight of the newest verification in the acceptance averages.
const ALPHA: f64 = 0.3;
/// Decode steps between probes of a sequence whose speculation is off.
pub const PROBE_EVERY: u32 = 8;
/// A `k` must beat plain decoding by this factor to be used (measurement noise).
const MARGIN: f64 = 1.05;

/// Relative costs of speculation, against one plain decode step of the target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecCosts {
    /// One draft forward pass (0 for n-gram lookup).
    pub draft: f64,
    /// `verify[k]`: what `k` more rows in the target's verification pass add to the step
    /// (`verify[0] = 0`, non-decreasing). Not linear on a CPU: a second row is nearly free
    /// while the step is memory-bound, later rows cost compute.
    pub verify: [f64; MAX_SPECULATIVE_TOKENS + 1],
}

impl SpecCosts {
    /// Costs where every verified row adds `per_row`.
    pub fn linear(draft: f64, per_row: f64) -> Self {
        SpecCosts {
            draft,
            verify: std::array::from_fn(|k| k as f64 * per_row.max(0.0)),
        }
    }
}

/// Per-sequence acceptance tracking and the choice of `k`.
#[derive(Debug, Clone)]
pub struct AdaptiveK {
    max_k: usize,
    adaptive: bool,
    /// Exponential averages of accepted tokens and of rejections per verification.
    accepted: f64,
    rejected: f64,
    since_probe: u32,
}

impl AdaptiveK {
    /// Starts optimistic (acceptance 0.7) so that a sequence tries speculation first.
    pub fn new(max_k: usize, adaptive: bool) -> Self {
        AdaptiveK {
            max_k,
            adaptive,
            accepted: 0.7,
            rejected: 0.3,
            since_probe: 0,
        }
    }

    /// Current per-token acceptance estimate: accepted tokens over accepted tokens plus
    /// rejections, both averaged over recent verifications — the maximum-likelihood rate of
    /// the geometric model, where each verification ends at the first rejection or at the
    /// end of the proposal. (An average of per-verification rates would weigh a run of
    /// seven accepted tokens like one of none and underrate text that is copied in bursts.)
    pub fn acceptance(&self) -> f64 {
        let total = self.accepted + self.rejected;
        if total > 0.0 {
            self.accepted / total
        } else {
            0.0
        }
    }

    /// Records a verification: `accepted` of `proposed` tokens taken.
    pub fn observe(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        let rejected = if accepted < proposed { 1.0 } else { 0.0 };
        self.accepted = (1.0 - ALPHA) * self.accepted + ALPHA * accepted.min(proposed) as f64;
        self.rejected = (1.0 - ALPHA) * self.rejected + ALPHA * rejected;
    }

    /// Tokens to propose on a step the throughput guard made a probe: what [`Self::next_k`]
    /// says, but at least 1 (the probe must measure speculation).
    pub fn probe_k(&mut self, costs: SpecCosts) -> usize {
        self.next_k(costs).max(1).min(self.max_k)
    }

    /// Tokens to propose this step.
    pub fn next_k(&mut self, costs: SpecCosts) -> usize {
        if !self.adaptive {
            return self.max_k;
        }
        let k = best_k(self.acceptance(), costs, self.max_k);
        if k > 0 {
            self.since_probe = 0;
            return k;
        }
        self.since_probe += 1;
        if self.since_probe >= PROBE_EVERY {
            self.since_probe = 0;
            return 1.min(self.max_k);
        }
        0
    }
}

/// Expected tokens per step for acceptance `a` and `k` proposals.
pub fn expected_tokens(a: f64, k: usize) -> f64 {
    if a >= 1.0 {
        return (k + 1) as f64;
    }
    (1.0 - a.powi(k as i32 + 1)) / (1.0 - a)
}

/// The `k` in `0..=max_k` with the best expected tokens per cost (0 unless one beats plain
/// decoding by [`MARGIN`]).
pub fn best_k(a: f64, costs: SpecCosts, max_k: usize) -> usize {
    let draft = costs.draft.max(0.0);
    let (mut best, mut best_rate) = (0, MARGIN);
    for k in 1..=max_k.min(MAX_SPECULATIVE_TOKENS) {
        let cost = 1.0 + k as f64 * draft + costs.verify[k].max(0.0);
        let rate = expected_tokens(a, k) / cost;
        if rate > best_rate {
            (best, best_rate) = (k, rate);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram() -> SpecCosts {
        SpecCosts::linear(0.0, 0.1)
    }

    #[test]
    fn expected_tokens_matches_the_geometric_sum() {
        assert!((expected_tokens(0.5, 3) - (1.0 + 0.5 + 0.25 + 0.125)).abs() < 1e-12);
        assert_eq!(expected_tokens(1.0, 4), 5.0);
        assert_eq!(expected_tokens(0.0, 4), 1.0);
    }

    #[test]
    fn high_acceptance_takes_long_proposals_low_turns_off() {
        assert_eq!(best_k(0.95, ngram(), 8), 8);
        assert_eq!(best_k(0.02, ngram(), 8), 0);
        let costly = SpecCosts::linear(0.3, 0.1);
        let k = best_k(0.6, costly, 8);
        assert!((1..8).contains(&k), "k = {k}");
    }

    /// A CPU's costs: the first proposal rides along for free, later ones cost compute. Middling
    /// acceptance takes only the free one; near-certain acceptance pays for more.
    #[test]
    fn a_free_first_row_and_dear_later_rows_shape_k() {
        let mut costs = SpecCosts::linear(0.0, 0.0);
        for k in 2..costs.verify.len() {
            costs.verify[k] = 0.3 * (k - 1) as f64;
        }
        assert_eq!(best_k(0.6, costs, 8), 1);
        assert!(best_k(0.97, costs, 8) >= 4, "{}", best_k(0.97, costs, 8));
        // A draft pass costing 0.4 of a step: one proposal pays at 0.7 acceptance, not at 0.3.
        costs.draft = 0.4;
        assert_eq!(best_k(0.7, costs, 8), 1);
        assert_eq!(best_k(0.3, costs, 8), 0);
    }

    #[test]
    fn rejections_lower_k_until_off_then_probes() {
        let mut a = AdaptiveK::new(6, true);
        assert!(a.next_k(ngram()) > 0);
        for _ in 0..20 {
            a.observe(4, 0);
        }
        assert!(a.acceptance() < 0.05);
        let ks: Vec<usize> = (0..PROBE_EVERY).map(|_| a.next_k(ngram())).collect();
        assert_eq!(ks.iter().filter(|&&k| k > 0).count(), 1, "{ks:?}");
        assert_eq!(*ks.last().unwrap(), 1);
        for _ in 0..10 {
            a.observe(4, 4);
        }
        assert_eq!(a.next_k(ngram()), 6);
    }

    /// Copied text is accepted in bursts: seven of seven, then three of seven is ten tokens
    /// for one rejection (rate 10/11), not the mean of 1.0 and 3/4.
    #[test]
    fn acceptance_counts_tokens_not_verifications() {
        let mut a = AdaptiveK::new(7, true);
        for _ in 0..30 {
            a.observe(7, 7);
            a.observe(7, 3);
        }
        assert!(
            (a.acceptance() - 10.0 / 11.0).abs() < 0.03,
            "{}",
            a.acceptance()
        );
        a.observe(0, 0);
        assert!(a.acceptance() > 0.85, "an empty proposal is no evidence");
    }

    #[test]
    fn fixed_k_ignores_acceptance() {
        let mut a = AdaptiveK::new(3, false);
        a.observe(3, 0);
        a.observe(3, 0);
        assert_eq!(a.next_k(ngram()), 3);
    }
}
