//! A replica's circuit breaker: passive ejection on errors, with half-open probing.
//!
//! Owns the state machine `Closed -> Open -> HalfOpen -> (Closed | Open)`:
//! - `Closed`: traffic flows; `failure_threshold` consecutive failures open the circuit
//!   (a success resets the count), and so does one [`Breaker::trip`] (a replica that dropped
//!   a connection it had accepted a request on: it has likely crashed). A threshold of 0
//!   disables the breaker (it never opens, not even on a trip).
//! - `Open`: refuses traffic for `open_ms`; after that the next [`Breaker::try_pass`] turns it
//!   half-open.
//! - `HalfOpen`: lets at most `half_open_probes` requests through (0 is read as 1, otherwise the
//!   circuit could never close); one success closes it, one failure reopens it for `open_ms`.
//!
//! Invariants: probes are claimed only through [`Breaker::try_pass`], so concurrent pickers never
//! send more than `half_open_probes` probes per half-open period. A probe that never reports
//! back (its request was dropped before it reached the replica) cannot wedge the circuit: after
//! `open_ms` without a verdict the probe slots are handed out again. Results that arrive while the
//! circuit is open come from requests sent before it opened and are ignored.
//!
//! Every method has an `_at(now)` twin so tests drive time without sleeping.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::BreakerConfig;

/// What a breaker currently lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Traffic flows.
    Closed,
    /// Traffic is refused until the open period ends.
    Open,
    /// A few probe requests may go through to test the replica.
    HalfOpen,
}

impl BreakerState {
    /// The state as a metrics gauge: closed 0, open 1, half-open 0.5.
    pub fn as_gauge(self) -> f64 {
        match self {
            BreakerState::Closed => 0.0,
            BreakerState::Open => 1.0,
            BreakerState::HalfOpen => 0.5,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Inner {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    HalfOpen {
        /// Probes handed out in the current probe window.
        issued: u32,
        /// When the current probe window started (stale probes are re-issued after `open_ms`).
        since: Instant,
    },
}

#[derive(Debug)]
struct Locked {
    config: BreakerConfig,
    state: Inner,
}

/// One replica's circuit breaker (see the module docs for the state machine).
#[derive(Debug)]
pub struct Breaker {
    inner: Mutex<Locked>,
}

impl Breaker {
    /// A closed breaker with `config`.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            inner: Mutex::new(Locked {
                config,
                state: Inner::Closed { failures: 0 },
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Locked> {
        // The critical sections cannot panic half-way; a poisoned lock still holds a valid state.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the thresholds (hot reload); the current state is kept.
    pub fn set_config(&self, config: BreakerConfig) {
        self.lock().config = config;
    }

    /// The state now (an open circuit whose period is over reads as half-open).
    pub fn state(&self) -> BreakerState {
        self.state_at(Instant::now())
    }

    /// [`Breaker::state`] at `now`.
    pub fn state_at(&self, now: Instant) -> BreakerState {
        match self.lock().state {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { until } if now < until => BreakerState::Open,
            Inner::Open { .. } | Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Whether a request would be let through now, without claiming a probe slot.
    pub fn allows(&self) -> bool {
        self.allows_at(Instant::now())
    }

    /// [`Breaker::allows`] at `now`.
    pub fn allows_at(&self, now: Instant) -> bool {
        let locked = self.lock();
        match locked.state {
            Inner::Closed { .. } => true,
            Inner::Open { until } => now >= until,
            Inner::HalfOpen { issued, since } => {
                issued < probes(&locked.config) || probe_window_over(&locked.config, since, now)
            }
        }
    }

    /// Lets one request through if the state allows it, claiming a probe slot when half-open.
    pub fn try_pass(&self) -> bool {
        self.try_pass_at(Instant::now())
    }

    /// [`Breaker::try_pass`] at `now`.
    pub fn try_pass_at(&self, now: Instant) -> bool {
        let mut locked = self.lock();
        let limit = probes(&locked.config);
        let open_over = |since| probe_window_over(&locked.config, since, now);
        let (next, pass) = match locked.state {
            Inner::Closed { failures } => (Inner::Closed { failures }, true),
            Inner::Open { until } if now < until => (Inner::Open { until }, false),
            Inner::Open { .. } => {
                tracing::info!("circuit half-open: probing the replica");
                (
                    Inner::HalfOpen {
                        issued: 1,
                        since: now,
                    },
                    true,
                )
            }
            Inner::HalfOpen { since, .. } if open_over(since) => (
                Inner::HalfOpen {
                    issued: 1,
                    since: now,
                },
                true,
            ),
            Inner::HalfOpen { issued, since } if issued < limit => (
                Inner::HalfOpen {
                    issued: issued + 1,
                    since,
                },
                true,
            ),
            Inner::HalfOpen { issued, since } => (Inner::HalfOpen { issued, since }, false),
        };
        locked.state = next;
        pass
    }

    /// A request succeeded: resets the failure count, or closes a half-open circuit.
    pub fn record_success(&self) {
        let mut locked = self.lock();
        match locked.state {
            Inner::Closed { .. } => locked.state = Inner::Closed { failures: 0 },
            Inner::HalfOpen { .. } => {
                tracing::info!("circuit closed: a probe succeeded");
                locked.state = Inner::Closed { failures: 0 };
            }
            Inner::Open { .. } => {}
        }
    }

    /// A request failed (5xx, timeout, connection error).
    pub fn record_failure(&self) {
        self.record_failure_at(Instant::now());
    }

    /// [`Breaker::record_failure`] at `now`.
    pub fn record_failure_at(&self, now: Instant) {
        let mut locked = self.lock();
        let open_for = Duration::from_millis(locked.config.open_ms);
        let threshold = locked.config.failure_threshold;
        match locked.state {
            Inner::Closed { failures } => {
                let failures = failures.saturating_add(1);
                if threshold > 0 && failures >= threshold {
                    tracing::warn!(failures, "circuit opened after consecutive failures");
                    locked.state = Inner::Open {
                        until: now + open_for,
                    };
                } else {
                    locked.state = Inner::Closed { failures };
                }
            }
            Inner::HalfOpen { .. } => {
                tracing::warn!("circuit reopened: a probe failed");
                locked.state = Inner::Open {
                    until: now + open_for,
                };
            }
            Inner::Open { .. } => {}
        }
    }

    /// Opens the circuit at once, whatever the failure count: the replica dropped a request
    /// it had accepted (see the module docs). A disabled breaker (threshold 0) stays closed.
    pub fn trip(&self) {
        self.trip_at(Instant::now());
    }

    /// [`Breaker::trip`] at `now`.
    pub fn trip_at(&self, now: Instant) {
        let mut locked = self.lock();
        if locked.config.failure_threshold == 0 {
            return;
        }
        if !matches!(locked.state, Inner::Open { until } if now < until) {
            tracing::warn!("circuit opened: the replica dropped a request it had accepted");
        }
        locked.state = Inner::Open {
            until: now + Duration::from_millis(locked.config.open_ms),
        };
    }
}

fn probes(config: &BreakerConfig) -> u32 {
    config.half_open_probes.max(1)
}

fn probe_window_over(config: &BreakerConfig, since: Instant, now: Instant) -> bool {
    now.saturating_duration_since(since) >= Duration::from_millis(config.open_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(threshold: u32, open_ms: u64, probes: u32) -> BreakerConfig {
        BreakerConfig {
            failure_threshold: threshold,
            open_ms,
            half_open_probes: probes,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn opens_after_threshold_consecutive_failures() {
        let b = Breaker::new(cfg(3, 1000, 1));
        let t = Instant::now();
        b.record_failure_at(t);
        b.record_failure_at(t);
        assert_eq!(b.state_at(t), BreakerState::Closed);
        assert!(b.try_pass_at(t));
        b.record_failure_at(t);
        assert_eq!(b.state_at(t), BreakerState::Open);
        assert!(!b.allows_at(t));
        assert!(!b.try_pass_at(t + ms(999)));
    }

    #[test]
    fn a_success_resets_the_consecutive_count() {
        let b = Breaker::new(cfg(2, 1000, 1));
        let t = Instant::now();
        b.record_failure_at(t);
        b.record_success();
        b.record_failure_at(t);
        assert_eq!(b.state_at(t), BreakerState::Closed);
        b.record_failure_at(t);
        assert_eq!(b.state_at(t), BreakerState::Open);
    }

    #[test]
    fn half_opens_after_open_ms_and_closes_on_probe_success() {
        let b = Breaker::new(cfg(1, 100, 1));
        let t = Instant::now();
        b.record_failure_at(t);
        assert_eq!(b.state_at(t + ms(50)), BreakerState::Open);
        assert_eq!(b.state_at(t + ms(100)), BreakerState::HalfOpen);
        assert!(b.try_pass_at(t + ms(100)), "the first probe goes through");
        assert!(!b.try_pass_at(t + ms(101)), "only one probe is allowed");
        assert!(!b.allows_at(t + ms(101)));
        b.record_success();
        assert_eq!(b.state_at(t + ms(102)), BreakerState::Closed);
        assert!(b.try_pass_at(t + ms(102)));
    }

    #[test]
    fn probe_failure_reopens_for_another_period() {
        let b = Breaker::new(cfg(1, 100, 2));
        let t = Instant::now();
        b.record_failure_at(t);
        let t1 = t + ms(100);
        assert!(b.try_pass_at(t1));
        assert!(b.try_pass_at(t1), "two probes are configured");
        assert!(!b.try_pass_at(t1));
        b.record_failure_at(t1 + ms(5));
        assert_eq!(b.state_at(t1 + ms(50)), BreakerState::Open);
        assert!(!b.try_pass_at(t1 + ms(104)));
        assert!(b.try_pass_at(t1 + ms(105)));
    }

    #[test]
    fn a_lost_probe_is_reissued_after_open_ms() {
        let b = Breaker::new(cfg(1, 100, 1));
        let t = Instant::now();
        b.record_failure_at(t);
        assert!(b.try_pass_at(t + ms(100)));
        assert!(!b.try_pass_at(t + ms(150)));
        assert!(
            b.try_pass_at(t + ms(200)),
            "the unanswered probe slot is handed out again"
        );
    }

    #[test]
    fn results_while_open_are_ignored() {
        let b = Breaker::new(cfg(1, 100, 1));
        let t = Instant::now();
        b.record_failure_at(t);
        b.record_success();
        assert_eq!(b.state_at(t + ms(10)), BreakerState::Open);
        b.record_failure_at(t + ms(90));
        assert_eq!(
            b.state_at(t + ms(100)),
            BreakerState::HalfOpen,
            "a late failure does not extend the open period"
        );
    }

    #[test]
    fn zero_threshold_disables_and_zero_probes_means_one() {
        let never = Breaker::new(cfg(0, 100, 1));
        let t = Instant::now();
        for _ in 0..100 {
            never.record_failure_at(t);
        }
        assert_eq!(never.state_at(t), BreakerState::Closed);

        let b = Breaker::new(cfg(1, 10, 0));
        b.record_failure_at(t);
        assert!(b.try_pass_at(t + ms(10)));
        assert!(!b.try_pass_at(t + ms(11)));
    }

    #[test]
    fn a_trip_opens_at_once_from_any_state_unless_disabled() {
        let t = Instant::now();
        let closed = Breaker::new(cfg(5, 100, 1));
        closed.record_failure_at(t);
        closed.trip_at(t);
        assert_eq!(closed.state_at(t), BreakerState::Open);
        assert!(!closed.try_pass_at(t + ms(99)));
        assert!(closed.try_pass_at(t + ms(100)), "half-open after open_ms");
        closed.trip_at(t + ms(100));
        assert_eq!(
            closed.state_at(t + ms(150)),
            BreakerState::Open,
            "a tripped probe reopens"
        );

        let disabled = Breaker::new(cfg(0, 100, 1));
        disabled.trip_at(t);
        assert_eq!(disabled.state_at(t), BreakerState::Closed);
    }

    #[test]
    fn gauge_values() {
        assert_eq!(BreakerState::Closed.as_gauge(), 0.0);
        assert_eq!(BreakerState::Open.as_gauge(), 1.0);
        assert_eq!(BreakerState::HalfOpen.as_gauge(), 0.5);
    }

    #[test]
    fn set_config_keeps_the_state() {
        let b = Breaker::new(cfg(1, 100, 1));
        let t = Instant::now();
        b.record_failure_at(t);
        b.set_config(cfg(10, 100, 1));
        assert_eq!(b.state_at(t), BreakerState::Open);
    }
}
