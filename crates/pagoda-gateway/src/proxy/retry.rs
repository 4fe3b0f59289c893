//! Retry policy: exponential backoff with full jitter, and a retry budget.
//!
//! The budget bounds retries to `budget_ratio` of the requests seen in the last
//! [`WINDOW_SECS`] seconds plus `budget_min_per_s` per second, so that when a backend is down
//! the gateway does not multiply its load (a retry storm) — retries beyond the budget fail
//! over to the fallback chain at once instead.
//!
//! Invariant: counts live in a ring of one-second buckets; a bucket is reset when its second
//! comes round again, so memory is constant and old traffic stops counting after the window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::config::RetryConfig;

/// Seconds of traffic the budget looks at.
pub const WINDOW_SECS: usize = 10;

/// The delay before retry number `attempt` (1 = first retry): uniform in [0, min(max, base·2^(attempt-1))].
pub fn backoff(config: &RetryConfig, attempt: u32) -> Duration {
    let exp = config
        .base_backoff_ms
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(20));
    let cap = exp.min(config.max_backoff_ms);
    if cap == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(rand::thread_rng().gen_range(0..=cap))
}

#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    second: u64,
    requests: u64,
    retries: u64,
}

/// Sliding count of requests and retries; shared by all routes of one gateway.
#[derive(Debug)]
pub struct RetryBudget {
    start: Instant,
    buckets: Mutex<[Bucket; WINDOW_SECS]>,
    refused: AtomicU64,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryBudget {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            buckets: Mutex::new([Bucket::default(); WINDOW_SECS]),
            refused: AtomicU64::new(0),
        }
    }

    fn with_bucket<R>(
        &self,
        now: Instant,
        f: impl FnOnce(&mut [Bucket; WINDOW_SECS], usize, u64) -> R,
    ) -> R {
        let second = now.saturating_duration_since(self.start).as_secs();
        let slot = (second % WINDOW_SECS as u64) as usize;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets[slot].second != second {
            buckets[slot] = Bucket {
                second,
                requests: 0,
                retries: 0,
            };
        }
        f(&mut buckets, slot, second)
    }

    /// Counts one client request.
    pub fn record_request(&self, now: Instant) {
        self.with_bucket(now, |b, slot, _| b[slot].requests += 1);
    }

    /// Takes one retry from the budget; false when it is spent.
    pub fn try_retry(&self, config: &RetryConfig, now: Instant) -> bool {
        let allowed = self.with_bucket(now, |b, slot, second| {
            let live = b
                .iter()
                .filter(|x| second.saturating_sub(x.second) < WINDOW_SECS as u64);
            let (requests, retries) =
                live.fold((0u64, 0u64), |(q, r), x| (q + x.requests, r + x.retries));
            let limit = config.budget_ratio * requests as f64
                + config.budget_min_per_s * WINDOW_SECS as f64;
            if (retries as f64) < limit {
                b[slot].retries += 1;
                true
            } else {
                false
            }
        });
        if !allowed {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        allowed
    }

    /// Retries refused since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ratio: f64, min_per_s: f64) -> RetryConfig {
        RetryConfig {
            budget_ratio: ratio,
            budget_min_per_s: min_per_s,
            ..RetryConfig::default()
        }
    }

    #[test]
    fn backoff_grows_and_stays_under_the_cap() {
        let c = RetryConfig {
            base_backoff_ms: 10,
            max_backoff_ms: 100,
            ..RetryConfig::default()
        };
        for _ in 0..200 {
            assert!(backoff(&c, 1) <= Duration::from_millis(10));
            assert!(backoff(&c, 3) <= Duration::from_millis(40));
            assert!(backoff(&c, 30) <= Duration::from_millis(100));
        }
    }

    #[test]
    fn the_budget_allows_a_share_of_recent_requests() {
        let b = RetryBudget::new();
        let now = Instant::now();
        for _ in 0..100 {
            b.record_request(now);
        }
        let c = cfg(0.2, 0.0);
        let allowed = (0..100).filter(|_| b.try_retry(&c, now)).count();
        assert_eq!(allowed, 20);
        assert_eq!(b.refused(), 80);
    }

    #[test]
    fn old_traffic_stops_counting_after_the_window() {
        let b = RetryBudget::new();
        let t0 = Instant::now();
        for _ in 0..100 {
            b.record_request(t0);
        }
        let c = cfg(0.5, 0.0);
        let later = t0 + Duration::from_secs(WINDOW_SECS as u64 + 1);
        assert!(
            !b.try_retry(&c, later),
            "no recent requests, no floor: no retry"
        );
        assert!(b.try_retry(&c, t0));
    }

    #[test]
    fn a_quiet_gateway_still_gets_the_floor() {
        let b = RetryBudget::new();
        let c = cfg(0.0, 1.0);
        let now = Instant::now();
        let allowed = (0..50).filter(|_| b.try_retry(&c, now)).count();
        assert_eq!(allowed, WINDOW_SECS);
    }
}
