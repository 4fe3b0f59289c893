//! The empirical check behind speculation: tokens per second of recent decode steps that
//! verified proposals against recent ones that did not. When speculating is measurably slower
//! (the cost model was wrong: a draft slower than it looked, per-row overhead it does not
//! see), proposals stop, except one probe step every [`PROBE_EVERY`] steps so the comparison
//! stays current.
//!
//! Invariant: only pure decode steps are compared (a prefill chunk in the step would make it
//! slower for reasons of its own); until both kinds were seen, speculation is allowed.

/// Steps between probes while speculation is suppressed.
pub const PROBE_EVERY: u32 = 16;
/// Weight of the newest step in the averages.
const ALPHA: f64 = 0.2;

/// Exponential averages of decode throughput with and without proposals.
#[derive(Debug, Clone, Default)]
pub struct ThroughputGuard {
    plain: Option<f64>,
    speculative: Option<f64>,
    since_probe: u32,
}

impl ThroughputGuard {
    /// A pure decode step emitted `tokens` in `secs`, with proposals or not.
    pub fn observe(&mut self, tokens: usize, secs: f64, speculative: bool) {
        if tokens == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        let rate = tokens as f64 / secs;
        let slot = if speculative {
            &mut self.speculative
        } else {
            &mut self.plain
        };
        *slot = Some(slot.map_or(rate, |r| (1.0 - ALPHA) * r + ALPHA * rate));
    }

    /// Whether speculating is measured to be slower than not.
    pub fn losing(&self) -> bool {
        matches!((self.speculative, self.plain), (Some(s), Some(p)) if s < p)
    }

    /// Whether this step may propose: always unless losing, then one step in
    /// [`PROBE_EVERY`].
    pub fn allow(&mut self) -> bool {
        if !self.losing() {
            self.since_probe = 0;
            return true;
        }
        self.since_probe += 1;
        if self.since_probe >= PROBE_EVERY {
            self.since_probe = 0;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_until_speculation_is_measured_slower_then_probes() {
        let mut g = ThroughputGuard::default();
        assert!(g.allow());
        g.observe(3, 0.1, true); // 30 tok/s
        assert!(g.allow(), "no plain step seen yet");
        g.observe(1, 0.02, false); // 50 tok/s
        assert!(g.losing());
        let allowed = (0..PROBE_EVERY).filter(|_| g.allow()).count();
        assert_eq!(allowed, 1, "one probe per window");
        // Probes that come out faster win speculation back.
        for _ in 0..20 {
            g.observe(4, 0.05, true); // 80 tok/s
        }
        assert!(!g.losing());
        assert!(g.allow());
    }

    #[test]
    fn ignores_empty_or_timeless_steps() {
        let mut g = ThroughputGuard::default();
        g.observe(0, 0.1, true);
        g.observe(1, 0.0, false);
        g.observe(1, f64::NAN, false);
        assert!(!g.losing());
    }
}
