//! Per-version statistics of one rollout step: request and error counts, latency and TTFT
//! histograms, thumbs up/down counts.
//!
//! Latencies go into a log-bucket histogram ([`LatencyHistogram`]): bucket `i` holds values in
//! `[BASE^i, BASE^(i+1))` microseconds with `BASE = 1.02`, so a reported quantile (the geometric
//! middle of its bucket) is within about 1 % of a value that was recorded, whatever the number of
//! samples. Values from 0 to 1 µs share bucket 0; values above about an hour share the last one.
//! Recording is O(1) and the memory is fixed (a few KiB per histogram). Invariant: `count` equals
//! the sum of the buckets.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Growth factor between neighbouring buckets (2 % wide buckets: about 1 % error at the middle).
const BASE: f64 = 1.02;
/// Buckets up to `BASE^BUCKETS` µs (about 1.4 hours).
const BUCKETS: usize = 1150;

/// A fixed-size log-bucket histogram of durations.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    buckets: Vec<u64>,
    count: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            buckets: vec![0; BUCKETS],
            count: 0,
        }
    }
}

impl LatencyHistogram {
    /// Adds one duration.
    pub fn record(&mut self, value: Duration) {
        let idx = bucket_of(value);
        self.buckets[idx] += 1;
        self.count += 1;
    }

    /// Adds every duration `other` recorded.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine += theirs;
        }
        self.count += other.count;
    }

    /// The non-empty buckets as `(index, count)`, the compact form shared through Redis.
    pub fn sparse(&self) -> Vec<(u32, u64)> {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (i as u32, *n))
            .collect()
    }

    /// The histogram of [`LatencyHistogram::sparse`]'s output; indices beyond the last bucket
    /// count into the last one.
    pub fn from_sparse(entries: &[(u32, u64)]) -> Self {
        let mut h = Self::default();
        for &(i, n) in entries {
            let idx = (i as usize).min(BUCKETS - 1);
            h.buckets[idx] = h.buckets[idx].saturating_add(n);
            h.count = h.count.saturating_add(n);
        }
        h
    }

    /// Number of recorded durations.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The `q` quantile (0..=1) in milliseconds, `None` when empty. Accuracy: about 1 %.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (idx, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(bucket_middle_us(idx) / 1000.0);
            }
        }
        Some(bucket_middle_us(BUCKETS - 1) / 1000.0)
    }
}

fn bucket_of(value: Duration) -> usize {
    let us = value.as_secs_f64() * 1e6;
    if us < 1.0 {
        return 0;
    }
    let idx = (us.ln() / BASE.ln()).floor();
    (idx as usize).min(BUCKETS - 1)
}

/// The geometric middle of bucket `idx`, in µs (bucket 0 reports 1 µs).
fn bucket_middle_us(idx: usize) -> f64 {
    if idx == 0 {
        return 1.0;
    }
    BASE.powf(idx as f64 + 0.5)
}

/// Everything recorded for one version during one step.
#[derive(Debug, Clone, Default)]
pub struct VersionStats {
    pub requests: u64,
    pub errors: u64,
    pub latency: LatencyHistogram,
    pub ttft: LatencyHistogram,
    pub positive_feedback: u64,
    pub negative_feedback: u64,
}

impl VersionStats {
    /// Adds one finished request.
    pub fn record(&mut self, ok: bool, latency: Duration, ttft: Option<Duration>) {
        self.requests += 1;
        if !ok {
            self.errors += 1;
        }
        self.latency.record(latency);
        if let Some(t) = ttft {
            self.ttft.record(t);
        }
    }

    /// Adds everything `other` recorded (another gateway instance's share of the step).
    pub fn merge(&mut self, other: &VersionStats) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.latency.merge(&other.latency);
        self.ttft.merge(&other.ttft);
        self.positive_feedback += other.positive_feedback;
        self.negative_feedback += other.negative_feedback;
    }

    /// Adds one thumbs up (`true`) or down.
    pub fn add_feedback(&mut self, positive: bool) {
        if positive {
            self.positive_feedback += 1;
        } else {
            self.negative_feedback += 1;
        }
    }

    /// Takes back a feedback counted earlier (when the same response is rated again).
    pub fn remove_feedback(&mut self, positive: bool) {
        let slot = if positive {
            &mut self.positive_feedback
        } else {
            &mut self.negative_feedback
        };
        *slot = slot.saturating_sub(1);
    }

    /// Errors over requests; 0 without requests.
    pub fn error_rate(&self) -> f64 {
        ratio(self.errors, self.requests)
    }

    /// Number of feedbacks (up and down).
    pub fn feedback_count(&self) -> u64 {
        self.positive_feedback + self.negative_feedback
    }

    /// Thumbs down over all feedbacks; 0 without feedback.
    pub fn negative_feedback_rate(&self) -> f64 {
        ratio(self.negative_feedback, self.feedback_count())
    }

    /// The admin API's view of these statistics.
    pub fn summary(&self) -> StatsSummary {
        StatsSummary {
            requests: self.requests,
            errors: self.errors,
            error_rate: self.error_rate(),
            p99_latency_ms: self.latency.quantile_ms(0.99),
            ttft_samples: self.ttft.count(),
            p99_ttft_ms: self.ttft.quantile_ms(0.99),
            feedback: self.feedback_count(),
            negative_feedback_rate: self.negative_feedback_rate(),
        }
    }
}

/// [`VersionStats`] as JSON, histograms sparse: what one gateway instance publishes of its
/// share of a rollout step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    pub requests: u64,
    pub errors: u64,
    pub latency: Vec<(u32, u64)>,
    pub ttft: Vec<(u32, u64)>,
    pub positive_feedback: u64,
    pub negative_feedback: u64,
}

impl From<&VersionStats> for StatsSnapshot {
    fn from(s: &VersionStats) -> Self {
        Self {
            requests: s.requests,
            errors: s.errors,
            latency: s.latency.sparse(),
            ttft: s.ttft.sparse(),
            positive_feedback: s.positive_feedback,
            negative_feedback: s.negative_feedback,
        }
    }
}

impl From<&StatsSnapshot> for VersionStats {
    fn from(s: &StatsSnapshot) -> Self {
        Self {
            requests: s.requests,
            errors: s.errors.min(s.requests),
            latency: LatencyHistogram::from_sparse(&s.latency),
            ttft: LatencyHistogram::from_sparse(&s.ttft),
            positive_feedback: s.positive_feedback,
            negative_feedback: s.negative_feedback,
        }
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// One version's statistics in the current step, as the admin API shows them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatsSummary {
    pub requests: u64,
    pub errors: u64,
    /// 0..1
    pub error_rate: f64,
    /// `None` before the first request; about 1 % accurate.
    pub p99_latency_ms: Option<f64>,
    /// Requests that reported a time to first token (streams).
    pub ttft_samples: u64,
    pub p99_ttft_ms: Option<f64>,
    /// Thumbs up and down received.
    pub feedback: u64,
    /// 0..1
    pub negative_feedback_rate: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn empty_histogram_has_no_quantile() {
        assert_eq!(LatencyHistogram::default().quantile_ms(0.99), None);
    }

    #[test]
    fn p99_of_uniform_latencies_is_near_the_99th_value() {
        let mut h = LatencyHistogram::default();
        for ms in 1..=1000u64 {
            h.record(Duration::from_millis(ms));
        }
        let p99 = h.quantile_ms(0.99).unwrap();
        assert!((p99 - 990.0).abs() / 990.0 < 0.015, "p99 {p99}");
        assert_eq!(h.count(), 1000);
    }

    #[test]
    fn zero_and_huge_values_are_kept() {
        let mut h = LatencyHistogram::default();
        h.record(Duration::ZERO);
        h.record(Duration::from_secs(100_000));
        assert_eq!(h.count(), 2);
        assert!(h.quantile_ms(1.0).unwrap() > 1_000_000.0);
        assert!(h.quantile_ms(0.0).unwrap() < 0.01);
    }

    #[test]
    fn rates_and_feedback_replacement() {
        let mut s = VersionStats::default();
        assert_eq!(s.error_rate(), 0.0);
        s.record(true, Duration::from_millis(5), None);
        s.record(
            false,
            Duration::from_millis(5),
            Some(Duration::from_millis(1)),
        );
        assert_eq!(s.error_rate(), 0.5);
        assert_eq!(s.ttft.count(), 1);
        s.add_feedback(false);
        s.remove_feedback(false);
        s.add_feedback(true);
        s.remove_feedback(false); // nothing to take back: stays at 0
        assert_eq!(s.negative_feedback, 0);
        assert_eq!(s.positive_feedback, 1);
        assert_eq!(s.negative_feedback_rate(), 0.0);
    }

    #[test]
    fn merged_snapshots_equal_one_instance_recording_everything() {
        let mut all = VersionStats::default();
        let mut a = VersionStats::default();
        let mut b = VersionStats::default();
        for i in 0..200u64 {
            let (ok, latency) = (i % 7 != 0, Duration::from_millis(1 + i * 3));
            let ttft = (i % 2 == 0).then(|| Duration::from_micros(500 + i));
            all.record(ok, latency, ttft);
            if i % 3 == 0 { &mut a } else { &mut b }.record(ok, latency, ttft);
        }
        a.add_feedback(false);
        all.add_feedback(false);
        let json = serde_json::to_string(&StatsSnapshot::from(&b)).unwrap();
        let b_back: VersionStats = (&serde_json::from_str::<StatsSnapshot>(&json).unwrap()).into();
        a.merge(&b_back);
        assert_eq!(a.summary(), all.summary());
        assert_eq!(a.latency.sparse(), all.latency.sparse());
        assert_eq!(a.ttft.sparse(), all.ttft.sparse());
    }

    proptest! {
        #[test]
        fn quantile_is_within_two_percent_of_a_recorded_value(
            values in proptest::collection::vec(1u64..10_000_000, 1..300),
            q in 0.0f64..=1.0,
        ) {
            let mut h = LatencyHistogram::default();
            for v in &values {
                h.record(Duration::from_micros(*v));
            }
            let mut sorted = values.clone();
            sorted.sort_unstable();
            let rank = ((q * values.len() as f64).ceil() as usize).max(1);
            let exact_ms = sorted[rank - 1] as f64 / 1000.0;
            let got = h.quantile_ms(q).unwrap();
            prop_assert!((got - exact_ms).abs() <= exact_ms * 0.02 + 0.001,
                "q {} exact {} got {}", q, exact_ms, got);
        }
    }
}
