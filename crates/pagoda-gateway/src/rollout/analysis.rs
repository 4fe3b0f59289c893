//! The canary-versus-stable comparison: is the canary worse beyond a threshold?
//!
//! Owns the sample-size rules. A metric is compared only when both sides have enough samples:
//! requests (error rate, p99 latency) and TTFT samples need [`min_compare_samples`] each side
//! (`max(10, min_requests / 5)`), feedback needs [`MIN_FEEDBACK`] each side. Latency and TTFT
//! regressions count only when the canary's p99 is both `ratio` times the stable's and at least
//! `latency_slack_ms` above it. The result names every failing metric with both values, so the
//! rollback reason tells an operator what happened.

use crate::config::RolloutThresholds;

use super::stats::{LatencyHistogram, VersionStats};

/// Thumbs up/down needed on each side before the negative-feedback rates are compared.
pub const MIN_FEEDBACK: u64 = 5;

/// Requests each side needs in the window before the canary can be judged worse:
/// `max(10, min_requests / 5)`, so a rollback can come well before a promotion could.
pub fn min_compare_samples(min_requests: u64) -> u64 {
    (min_requests / 5).max(10)
}

/// Why the canary is worse than stable (one entry per failing metric); empty when it is not,
/// or when there are not enough samples to say.
pub fn regressions(
    canary: &VersionStats,
    stable: &VersionStats,
    thresholds: &RolloutThresholds,
    min_samples: u64,
) -> Vec<String> {
    let mut out = Vec::new();
    if canary.requests >= min_samples && stable.requests >= min_samples {
        let (c, s) = (canary.error_rate(), stable.error_rate());
        if c - s > thresholds.max_error_rate_increase {
            out.push(format!(
                "error rate {:.1} % on the canary vs {:.1} % on stable (allowed increase {:.1} points)",
                c * 100.0,
                s * 100.0,
                thresholds.max_error_rate_increase * 100.0
            ));
        }
        out.extend(latency_regression(
            "p99 latency",
            &canary.latency,
            &stable.latency,
            thresholds.max_p99_latency_ratio,
            thresholds.latency_slack_ms,
        ));
    }
    if canary.ttft.count() >= min_samples && stable.ttft.count() >= min_samples {
        out.extend(latency_regression(
            "p99 TTFT",
            &canary.ttft,
            &stable.ttft,
            thresholds.max_p99_ttft_ratio,
            thresholds.latency_slack_ms,
        ));
    }
    if canary.feedback_count() >= MIN_FEEDBACK && stable.feedback_count() >= MIN_FEEDBACK {
        let (c, s) = (
            canary.negative_feedback_rate(),
            stable.negative_feedback_rate(),
        );
        if c - s > thresholds.max_negative_feedback_increase {
            out.push(format!(
                "negative feedback {:.1} % on the canary vs {:.1} % on stable (allowed increase {:.1} points)",
                c * 100.0,
                s * 100.0,
                thresholds.max_negative_feedback_increase * 100.0
            ));
        }
    }
    out
}

fn latency_regression(
    what: &str,
    canary: &LatencyHistogram,
    stable: &LatencyHistogram,
    max_ratio: f64,
    slack_ms: f64,
) -> Option<String> {
    let c = canary.quantile_ms(0.99)?;
    let s = stable.quantile_ms(0.99)?;
    let too_slow = c > s * max_ratio && c - s >= slack_ms;
    too_slow.then(|| {
        format!(
            "{what} {c:.0} ms on the canary vs {s:.0} ms on stable (allowed ratio {max_ratio}, slack {slack_ms} ms)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn stats(n: u64, errors: u64, latency_ms: u64, ttft_ms: Option<u64>) -> VersionStats {
        let mut s = VersionStats::default();
        for i in 0..n {
            s.record(
                i >= errors,
                Duration::from_millis(latency_ms),
                ttft_ms.map(Duration::from_millis),
            );
        }
        s
    }

    fn th() -> RolloutThresholds {
        RolloutThresholds::default()
    }

    #[test]
    fn min_compare_samples_has_a_floor_of_ten() {
        assert_eq!(min_compare_samples(0), 10);
        assert_eq!(min_compare_samples(50), 10);
        assert_eq!(min_compare_samples(500), 100);
    }

    #[test]
    fn equal_versions_are_not_regressions() {
        let a = stats(100, 1, 200, Some(50));
        assert!(regressions(&a, &a.clone(), &th(), 10).is_empty());
    }

    #[test]
    fn too_few_samples_are_never_a_regression() {
        let bad = stats(9, 9, 10_000, Some(10_000));
        let good = stats(100, 0, 10, Some(10));
        assert!(regressions(&bad, &good, &th(), 10).is_empty());
        assert!(regressions(&good, &bad, &th(), 10).is_empty());
    }

    #[test]
    fn error_rate_reason_names_both_values() {
        let r = regressions(
            &stats(10, 3, 100, None),
            &stats(100, 0, 100, None),
            &th(),
            10,
        );
        assert_eq!(r.len(), 1);
        assert!(r[0].contains("error rate 30.0 %"), "{}", r[0]);
        assert!(r[0].contains("0.0 % on stable"), "{}", r[0]);
    }

    #[test]
    fn ttft_is_compared_like_latency() {
        let r = regressions(
            &stats(20, 0, 100, Some(400)),
            &stats(20, 0, 100, Some(100)),
            &th(),
            10,
        );
        assert_eq!(r.len(), 1);
        assert!(r[0].starts_with("p99 TTFT"), "{}", r[0]);
        // within the slack: 30 ms vs 10 ms is 3x but only 20 ms apart
        let r = regressions(
            &stats(20, 0, 100, Some(30)),
            &stats(20, 0, 100, Some(10)),
            &th(),
            10,
        );
        assert!(r.is_empty(), "{r:?}");
    }

    #[test]
    fn feedback_needs_some_on_both_sides() {
        let mut canary = stats(20, 0, 100, None);
        let stable = stats(20, 0, 100, None);
        for _ in 0..10 {
            canary.add_feedback(false);
        }
        assert!(regressions(&canary, &stable, &th(), 10).is_empty());
        let mut stable = stable;
        for _ in 0..10 {
            stable.add_feedback(true);
        }
        let r = regressions(&canary, &stable, &th(), 10);
        assert_eq!(r.len(), 1);
        assert!(r[0].starts_with("negative feedback 100.0 %"), "{}", r[0]);
    }
}
