//! Retry policy: which failed attempts are tried again, where, how soon and how many times.
//!
//! The written policy (what Envoy's `retry_on` says in its config), by *when* an attempt
//! failed ([`verdict`]):
//!
//! | Failure (`FailureKind` label) | The request reached the replica? | Tried again | The replica's breaker |
//! |---|---|---|---|
//! | connect error, refused connection, connect timeout (`connect`) | no | yes: another replica, then the next target | one failure |
//! | no free slot within `queue_timeout_ms` (`queue_timeout`) | no | yes: another replica, then the next target | untouched |
//! | 5xx answer (`upstream_5xx`) | yes, and it answered | yes: another replica, then the next target | one failure |
//! | 429 answer (`upstream_429`) | yes, and it answered | yes: another replica, then the next target | untouched |
//! | the connection closed (reset, EOF) after the request was sent, before a complete answer (`dropped`) | yes, and it may have crashed on it | a *replay*: at most `max_replays` per request | opened at once: the replica is ejected for `open_ms` |
//! | no complete answer before the deadline (`timeout`) | yes (or unknown: counted as yes) | a *replay* | one failure |
//!
//! - "Tried again" is bounded as before: `retry.max_attempts` tries per target, each try
//!   after a target's first waits [`backoff`] and takes one retry from the [`RetryBudget`]
//!   (when it is spent the request moves to the next target at once); after the last target
//!   the request fails.
//! - A replay is a request sent again after a replica dropped it. A request whose crash kills
//!   each replica it reaches must not take the route down, so replays are counted per request
//!   over the whole fallback chain ([`Replays`]): `max_replays` of them (a route's
//!   `max_replays`, else `retry.max_replays`, default 1; 0 never replays). The next dropped
//!   or timed-out attempt ends the request: no other replica gets it (a canned-reply target
//!   still answers) and the client gets 502 `upstream_dropped` (504 when every attempt timed
//!   out), counted in `pagoda_gateway_replays_total{outcome="refused"}`.
//! - A timeout is replay-limited but does not eject: a replica may just be slow on a long
//!   answer; repeated timeouts open its breaker through `failure_threshold`.
//! - Other 4xx answers are the client's: passed through, never tried again.
//! - Streams: a stream is committed at its first chunk. A failure before it is one of the rows
//!   above (a 200 whose body ends or breaks before its first chunk is `dropped`); after it
//!   nothing is tried again: the relay ends with an error event (`stream.rs`).
//!
//! The budget bounds retries to `budget_ratio` of the requests seen in the last
//! [`WINDOW_SECS`] seconds plus `budget_min_per_s` per second, so that when a backend is down
//! the gateway does not multiply its load (a retry storm) — retries beyond the budget fail
//! over to the fallback chain at once instead.
//!
//! Invariants: a request sends at most `max_replays` attempts after drops, so one that every
//! replica drops reaches at most `1 + max_replays` replicas whatever `max_attempts`, the
//! chain's length and the budget say. The budget's counts live in a ring of one-second
//! buckets; a bucket is reset when its second comes round again, so memory is constant and
//! old traffic stops counting after the window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::Rng;

use super::FailureKind;
use crate::config::RetryConfig;

/// What the policy does after one failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The request reached the replica and may have harmed it: trying again is a replay,
    /// limited by [`Replays`].
    pub replay: bool,
    /// What the replica's circuit breaker is told.
    pub breaker: BreakerEffect,
}

/// What a failed attempt does to its replica's circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerEffect {
    /// Not the replica's fault (it is busy, or no attempt was made).
    Nothing,
    /// One failure towards `failure_threshold`.
    Failure,
    /// The circuit opens at once (the replica is ejected for `open_ms`).
    Eject,
}

/// The policy's row for `kind` (the table in the module docs).
pub fn verdict(kind: FailureKind) -> Verdict {
    let (replay, breaker) = match kind {
        FailureKind::Connect | FailureKind::Upstream5xx => (false, BreakerEffect::Failure),
        FailureKind::QueueTimeout | FailureKind::Upstream429 | FailureKind::NoReplica => {
            (false, BreakerEffect::Nothing)
        }
        FailureKind::Dropped => (true, BreakerEffect::Eject),
        FailureKind::Timeout => (true, BreakerEffect::Failure),
    };
    Verdict { replay, breaker }
}

/// One request's replays: its attempts that replicas dropped after they were sent, against
/// its `max_replays`.
#[derive(Debug, Clone, Copy)]
pub struct Replays {
    limit: u32,
    dropped: u32,
    /// The next attempt sent is a replay.
    owed: bool,
}

impl Replays {
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            dropped: 0,
            owed: false,
        }
    }

    /// Notes one dropped attempt; true when the request may still be sent again.
    pub fn note_dropped(&mut self) -> bool {
        self.dropped = self.dropped.saturating_add(1);
        self.owed = !self.spent();
        self.owed
    }

    /// No more replay is allowed: the request must not reach another replica.
    pub fn spent(&self) -> bool {
        self.dropped > self.limit
    }

    /// An attempt is being sent: true when it is a replay (the first one after a drop).
    pub fn sending(&mut self) -> bool {
        std::mem::take(&mut self.owed)
    }
}

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
    fn only_failures_after_the_request_was_sent_are_replays() {
        use BreakerEffect::*;
        let row = |k| {
            let v = verdict(k);
            (v.replay, v.breaker)
        };
        assert_eq!(row(FailureKind::Connect), (false, Failure));
        assert_eq!(row(FailureKind::QueueTimeout), (false, Nothing));
        assert_eq!(row(FailureKind::NoReplica), (false, Nothing));
        assert_eq!(row(FailureKind::Upstream5xx), (false, Failure));
        assert_eq!(row(FailureKind::Upstream429), (false, Nothing));
        assert_eq!(row(FailureKind::Dropped), (true, Eject));
        assert_eq!(row(FailureKind::Timeout), (true, Failure));
    }

    #[test]
    fn replays_stop_after_the_limit() {
        let mut none = Replays::new(0);
        assert!(!none.spent() && !none.sending());
        assert!(!none.note_dropped(), "0: the first drop ends the request");
        assert!(none.spent() && !none.sending());

        let mut one = Replays::new(1);
        assert!(one.note_dropped(), "the default: one replay");
        assert!(!one.spent());
        assert!(one.sending(), "the next attempt is the replay");
        assert!(!one.sending(), "and only that one");
        assert!(!one.note_dropped());
        assert!(one.spent() && !one.sending());

        let mut two = Replays::new(2);
        assert!(two.note_dropped() && two.sending());
        assert!(two.note_dropped() && two.sending());
        assert!(!two.note_dropped());
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
