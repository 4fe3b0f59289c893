//! One replica of a target: its load, concurrency slots, circuit breaker and health.
//!
//! Owns the per-replica counters the balancer reads and the RAII permit the proxy holds while a
//! request waits for or uses a slot. Invariants:
//! - `outstanding` counts requests that hold a [`ReplicaPermit`] *or* wait for one, so the
//!   balancer sees queues; every increment is paired with a decrement in a `Drop`, so the count
//!   returns to 0 also when a waiting future is cancelled.
//! - At most `max_concurrency` permits are out at once (FIFO waiters, tokio's semaphore). When a
//!   reload shrinks the cap below the permits in flight, the difference is recorded as debt and
//!   paid by forgetting permits as they come back, so the cap converges without cancelling
//!   anything; growing the cap first pays debt, then adds permits.
//!
//! Connection pooling: the proxy's single shared `reqwest::Client` keeps one idle-connection pool
//! per scheme+host+port, i.e. one per replica; the slot cap bounds the connections a replica gets.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::breaker::{Breaker, BreakerState};
use super::hash::stable_hash;
use crate::config::{BreakerConfig, HealthConfig};

/// A request waited longer than the target's queue timeout for a replica slot.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("replica {url} stayed at its concurrency cap for {waited_ms} ms")]
pub struct QueueTimeout {
    /// The replica's base URL.
    pub url: String,
    /// How long the request waited.
    pub waited_ms: u64,
}

/// One backend server of a target.
#[derive(Debug)]
pub struct Replica {
    /// Base URL (`http://host:port`); the proxy appends `/v1/...`.
    pub url: String,
    /// The target this replica serves (for logs and metric labels).
    pub target: String,
    /// Stable hash of `url`, the replica's identity in rendezvous hashing.
    pub(crate) url_hash: u64,
    outstanding: AtomicUsize,
    breaker: Breaker,
    healthy: AtomicBool,
    health_fails: AtomicU32,
    health_passes: AtomicU32,
    slots: Arc<Semaphore>,
    max_concurrency: AtomicUsize,
    /// Permits to forget instead of returning (after a reload lowered the cap).
    permit_debt: AtomicUsize,
}

impl Replica {
    /// A healthy replica with a closed breaker and `max_concurrency` free slots.
    pub fn new(target: &str, url: &str, max_concurrency: usize, breaker: BreakerConfig) -> Self {
        let cap = max_concurrency.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            url: url.to_string(),
            target: target.to_string(),
            url_hash: stable_hash(url.as_bytes()),
            outstanding: AtomicUsize::new(0),
            breaker: Breaker::new(breaker),
            healthy: AtomicBool::new(true),
            health_fails: AtomicU32::new(0),
            health_passes: AtomicU32::new(0),
            slots: Arc::new(Semaphore::new(cap)),
            max_concurrency: AtomicUsize::new(cap),
            permit_debt: AtomicUsize::new(0),
        }
    }

    /// Requests in flight on this replica plus those queued for one of its slots.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Healthy (active checks) and the breaker lets traffic through.
    pub fn is_available(&self) -> bool {
        self.is_healthy() && self.breaker.allows()
    }

    /// The last verdict of the active health checks (true until a check says otherwise).
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// A request to this replica succeeded (the breaker resets or closes).
    pub fn record_success(&self) {
        self.breaker.record_success();
    }

    /// A request failed with a 5xx, a timeout or a connection error (see [`Breaker`]).
    pub fn record_failure(&self) {
        self.breaker.record_failure();
    }

    /// The replica dropped a request it had accepted (it likely crashed): its circuit opens
    /// at once, so no other request is sent to it until `open_ms` has passed
    /// ([`Breaker::trip`]).
    pub fn eject(&self) {
        self.breaker.trip();
    }

    /// The circuit breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// The breaker itself (tests and admin views).
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    /// The current concurrency cap.
    pub fn max_concurrency(&self) -> usize {
        self.max_concurrency.load(Ordering::Relaxed)
    }

    /// Claims passage through the breaker (a probe slot when half-open).
    pub(crate) fn try_pass(&self) -> bool {
        self.is_healthy() && self.breaker.try_pass()
    }

    pub(crate) fn set_breaker_config(&self, config: BreakerConfig) {
        self.breaker.set_config(config);
    }

    /// Changes the concurrency cap in place; permits in flight stay valid (see module docs).
    pub(crate) fn set_max_concurrency(&self, new_cap: usize) {
        let new_cap = new_cap.clamp(1, Semaphore::MAX_PERMITS);
        let old = self.max_concurrency.swap(new_cap, Ordering::AcqRel);
        if new_cap > old {
            let grow = new_cap - old;
            let paid = take_up_to(&self.permit_debt, grow);
            self.slots.add_permits(grow - paid);
        } else if new_cap < old {
            let shrink = old - new_cap;
            let forgotten = self.slots.forget_permits(shrink);
            self.permit_debt
                .fetch_add(shrink - forgotten, Ordering::AcqRel);
        }
    }

    /// Feeds one active health check result; returns the new health when it changed.
    pub(crate) fn observe_health(&self, ok: bool, config: &HealthConfig) -> Option<bool> {
        let (streak, reset, needed) = if ok {
            (
                &self.health_passes,
                &self.health_fails,
                config.healthy_after,
            )
        } else {
            (
                &self.health_fails,
                &self.health_passes,
                config.unhealthy_after,
            )
        };
        reset.store(0, Ordering::Relaxed);
        let count = streak.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if self.is_healthy() != ok && count >= needed.max(1) {
            self.healthy.store(ok, Ordering::Relaxed);
            Some(ok)
        } else {
            None
        }
    }

    /// Waits up to `timeout` for one of this replica's slots (FIFO).
    ///
    /// The request counts as outstanding from the call on, also while it waits; the count drops
    /// when the returned permit drops, on timeout, or when this future is cancelled.
    pub async fn acquire(
        self: &Arc<Self>,
        timeout: Duration,
    ) -> Result<ReplicaPermit, QueueTimeout> {
        let waiting = Outstanding::enter(self.clone());
        let slots = self.slots.clone();
        match tokio::time::timeout(timeout, slots.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(ReplicaPermit {
                _slot: SlotPermit {
                    permit: Some(permit),
                    replica: self.clone(),
                },
                _outstanding: waiting,
            }),
            // The semaphore is never closed; treat it like a full queue if it ever were.
            Ok(Err(_)) | Err(_) => Err(QueueTimeout {
                url: self.url.clone(),
                waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            }),
        }
    }

    /// Gives a slot back, or forgets it while the replica owes permits after a cap decrease.
    fn release(&self, permit: OwnedSemaphorePermit) {
        if take_up_to(&self.permit_debt, 1) == 1 {
            permit.forget();
        }
        // Otherwise dropping `permit` returns it to the semaphore.
    }
}

/// Subtracts up to `want` from `counter` atomically; returns how much was taken.
fn take_up_to(counter: &AtomicUsize, want: usize) -> usize {
    let mut taken = 0;
    let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |have| {
        taken = have.min(want);
        Some(have - taken)
    });
    taken
}

/// Counts one outstanding request while alive.
#[derive(Debug)]
struct Outstanding(Arc<Replica>);

impl Outstanding {
    fn enter(replica: Arc<Replica>) -> Self {
        replica.outstanding.fetch_add(1, Ordering::Relaxed);
        Self(replica)
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct SlotPermit {
    permit: Option<OwnedSemaphorePermit>,
    replica: Arc<Replica>,
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.replica.release(permit);
        }
    }
}

/// One of a replica's concurrency slots, held for the length of an upstream request (RAII).
#[derive(Debug)]
pub struct ReplicaPermit {
    _slot: SlotPermit,
    _outstanding: Outstanding,
}

impl ReplicaPermit {
    /// The replica this permit belongs to.
    pub fn replica(&self) -> &Arc<Replica> {
        &self._outstanding.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(cap: usize) -> Arc<Replica> {
        Arc::new(Replica::new(
            "t",
            "http://a:1",
            cap,
            BreakerConfig::default(),
        ))
    }

    #[tokio::test]
    async fn acquire_times_out_when_the_cap_is_full() {
        let r = replica(1);
        let held = r.acquire(Duration::from_millis(10)).await.unwrap();
        assert_eq!(r.outstanding(), 1);
        let err = r.acquire(Duration::from_millis(20)).await.unwrap_err();
        assert_eq!(err.url, "http://a:1");
        assert_eq!(r.outstanding(), 1, "the timed-out waiter no longer counts");
        drop(held);
        assert_eq!(r.outstanding(), 0);
        let again = r.acquire(Duration::from_millis(10)).await;
        assert!(again.is_ok(), "the slot came back");
    }

    #[tokio::test]
    async fn waiters_count_as_outstanding_and_cancelled_waits_release() {
        let r = replica(1);
        let held = r.acquire(Duration::from_millis(10)).await.unwrap();
        let r2 = r.clone();
        let waiter = tokio::spawn(async move { r2.acquire(Duration::from_secs(10)).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            r.outstanding(),
            2,
            "the queued request is visible to the balancer"
        );
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(r.outstanding(), 1);

        // Cancelled by an outer timeout rather than the queue timeout.
        let cancelled = tokio::time::timeout(
            Duration::from_millis(10),
            r.acquire(Duration::from_secs(10)),
        )
        .await;
        assert!(cancelled.is_err());
        assert_eq!(r.outstanding(), 1);
        drop(held);
        assert_eq!(r.outstanding(), 0);
    }

    #[tokio::test]
    async fn waiters_are_served_fifo_when_a_slot_frees() {
        let r = replica(1);
        let held = r.acquire(Duration::from_millis(10)).await.unwrap();
        let r2 = r.clone();
        let waiter =
            tokio::spawn(async move { r2.acquire(Duration::from_secs(5)).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(held);
        assert!(waiter.await.unwrap().is_ok());
        assert_eq!(r.outstanding(), 0);
    }

    #[tokio::test]
    async fn shrinking_the_cap_converges_without_cancelling() {
        let r = replica(3);
        let a = r.acquire(Duration::from_millis(10)).await.unwrap();
        let b = r.acquire(Duration::from_millis(10)).await.unwrap();
        r.set_max_concurrency(1);
        assert_eq!(r.max_concurrency(), 1);
        // Two in flight, cap 1: no new slot until both came back and one was forgotten.
        assert!(r.acquire(Duration::from_millis(5)).await.is_err());
        drop(a);
        assert!(r.acquire(Duration::from_millis(5)).await.is_err());
        drop(b);
        let c = r.acquire(Duration::from_millis(5)).await.unwrap();
        assert!(
            r.acquire(Duration::from_millis(5)).await.is_err(),
            "cap is 1"
        );
        drop(c);
        r.set_max_concurrency(2);
        let _d = r.acquire(Duration::from_millis(5)).await.unwrap();
        let _e = r.acquire(Duration::from_millis(5)).await.unwrap();
        assert!(
            r.acquire(Duration::from_millis(5)).await.is_err(),
            "cap is 2"
        );
    }

    #[tokio::test]
    async fn growing_the_cap_pays_debt_first() {
        let r = replica(2);
        let a = r.acquire(Duration::from_millis(10)).await.unwrap();
        let b = r.acquire(Duration::from_millis(10)).await.unwrap();
        r.set_max_concurrency(1); // debt 1
        r.set_max_concurrency(3); // pays the debt, adds 1
        drop(a);
        drop(b);
        let _p: Vec<_> =
            futures_util::future::join_all((0..3).map(|_| r.acquire(Duration::from_millis(5))))
                .await
                .into_iter()
                .map(|p| p.unwrap())
                .collect();
        assert!(
            r.acquire(Duration::from_millis(5)).await.is_err(),
            "cap is 3"
        );
    }

    #[test]
    fn health_flips_after_the_configured_streaks() {
        let r = replica(1);
        let cfg = HealthConfig {
            unhealthy_after: 2,
            healthy_after: 2,
            ..HealthConfig::default()
        };
        assert_eq!(r.observe_health(false, &cfg), None);
        assert!(r.is_available());
        assert_eq!(r.observe_health(false, &cfg), Some(false));
        assert!(!r.is_available());
        assert_eq!(r.observe_health(true, &cfg), None);
        assert_eq!(r.observe_health(false, &cfg), None);
        assert_eq!(r.observe_health(true, &cfg), None);
        assert_eq!(r.observe_health(true, &cfg), Some(true));
        assert!(r.is_available());
    }

    #[test]
    fn a_down_replica_does_not_pass() {
        let r = replica(1);
        let cfg = HealthConfig {
            unhealthy_after: 1,
            ..HealthConfig::default()
        };
        r.observe_health(false, &cfg);
        assert!(!r.try_pass());
    }
}
