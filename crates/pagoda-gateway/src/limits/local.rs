//! The in-process limiter: per-key windows and budget counters behind one mutex.
//!
//! Invariant: [`KeyState::admit`] checks budget, requests and tokens and only then records
//! anything, all under the lock, so a refused request consumes nothing and concurrent admits
//! can never reserve past a budget. Counts are lost on restart (the gateway re-seeds `spent`
//! from its usage ledger with [`LocalLimiter::seed_spent`]).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::window::Window;
use super::{LimitError, LimitKind, Reservation};
use crate::config::KeyLimits;

/// One key's limiter state.
#[derive(Debug, Default)]
pub(crate) struct KeyState {
    rpm: Window,
    tpm: Window,
    spent: u64,
    reserved: u64,
    next_id: u64,
}

fn rate_limited(limit: LimitKind) -> impl Fn(u64) -> LimitError {
    move |retry_us| LimitError::RateLimited {
        retry_after: Duration::from_micros(retry_us),
        limit,
    }
}

impl KeyState {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Admits one request estimated at `est` tokens at time `now_us` (nondecreasing), returning
    /// the id of its token-window entry (`None` when the key has no TPM limit).
    pub(crate) fn admit(
        &mut self,
        limits: &KeyLimits,
        est: u64,
        now_us: u64,
    ) -> Result<Option<u64>, LimitError> {
        if let Some(budget) = limits.budget_tokens {
            let committed = self.spent.saturating_add(self.reserved);
            if committed >= budget || committed.saturating_add(est) > budget {
                return Err(LimitError::BudgetExhausted {
                    budget,
                    spent: self.spent,
                });
            }
        }
        if let Some(rpm) = limits.rpm {
            too_large(LimitKind::Requests, 1, rpm)?;
            self.rpm.trim(now_us);
            self.rpm
                .check(now_us, 1, rpm)
                .map_err(rate_limited(LimitKind::Requests))?;
        }
        if let Some(tpm) = limits.tpm {
            too_large(LimitKind::Tokens, est, tpm)?;
            self.tpm.trim(now_us);
            self.tpm
                .check(now_us, est, tpm)
                .map_err(rate_limited(LimitKind::Tokens))?;
        }
        if limits.rpm.is_some() {
            let id = self.next_id();
            self.rpm.push(now_us, 1, id);
        }
        let entry = limits.tpm.map(|_| {
            let id = self.next_id();
            self.tpm.push(now_us, est, id);
            id
        });
        self.reserved = self.reserved.saturating_add(est);
        Ok(entry)
    }

    /// Moves a reservation to spent at its actual size and corrects the token window.
    pub(crate) fn settle(&mut self, est: u64, entry: Option<u64>, actual: u64, now_us: u64) {
        self.reserved = self.reserved.saturating_sub(est);
        self.spent = self.spent.saturating_add(actual);
        let Some(id) = entry else { return };
        if actual < est {
            self.tpm.reduce(id, est - actual);
        } else if actual > est {
            let extra = self.next_id();
            self.tpm.trim(now_us);
            self.tpm.push(now_us, actual - est, extra);
        }
    }

    /// Gives a reservation back whole (the request never reached upstream).
    pub(crate) fn release(&mut self, est: u64, entry: Option<u64>) {
        self.reserved = self.reserved.saturating_sub(est);
        if let Some(id) = entry {
            self.tpm.reduce(id, est);
        }
    }
}

/// Refuses a request that could never fit, whatever the wait.
fn too_large(limit: LimitKind, requested: u64, max: u64) -> Result<(), LimitError> {
    if requested > max {
        return Err(LimitError::ExceedsLimit {
            limit,
            requested,
            max,
        });
    }
    Ok(())
}

/// Limits held in this process only.
#[derive(Debug)]
pub struct LocalLimiter {
    keys: Mutex<HashMap<String, KeyState>>,
    epoch: Instant,
}

impl Default for LocalLimiter {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalLimiter {
    pub fn new() -> Self {
        Self {
            keys: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, KeyState>> {
        // Every KeyState update is a few field writes that cannot panic halfway in a way that
        // breaks an invariant worse than a lost count, so a poisoned lock is reused.
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn admit(
        &self,
        key_id: &str,
        limits: &KeyLimits,
        est: u64,
    ) -> Result<Reservation, LimitError> {
        let now = self.now_us();
        let mut keys = self.keys();
        let state = keys.entry(key_id.to_string()).or_default();
        let entry = state.admit(limits, est, now)?;
        Ok(Reservation::new(key_id, est, entry, 0))
    }

    pub(crate) fn settle(&self, r: Reservation, actual: u64) {
        let now = self.now_us();
        let mut keys = self.keys();
        let state = keys.entry(r.key_id.clone()).or_default();
        state.settle(r.estimated, r.tpm_entry, actual, now);
    }

    pub(crate) fn release(&self, r: Reservation) {
        let mut keys = self.keys();
        keys.entry(r.key_id.clone())
            .or_default()
            .release(r.estimated, r.tpm_entry);
    }

    pub(crate) fn spent(&self, key_id: &str) -> u64 {
        self.keys().get(key_id).map_or(0, |s| s.spent)
    }

    /// Raises the key's spent count to at least `tokens` (it never lowers it).
    pub(crate) fn seed_spent(&self, key_id: &str, tokens: u64) {
        let mut keys = self.keys();
        let state = keys.entry(key_id.to_string()).or_default();
        state.spent = state.spent.max(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::super::window::WINDOW_US;
    use super::*;
    use proptest::prelude::*;

    fn limits(rpm: Option<u64>, tpm: Option<u64>, budget: Option<u64>) -> KeyLimits {
        KeyLimits {
            rpm,
            tpm,
            budget_tokens: budget,
        }
    }

    /// Max number (or cost) admitted in any half-open window of 60 s.
    fn max_in_any_window(admitted: &[(u64, u64)]) -> u64 {
        admitted
            .iter()
            .map(|&(start, _)| {
                admitted
                    .iter()
                    .filter(|&&(t, _)| t >= start && t < start + WINDOW_US)
                    .map(|&(_, c)| c)
                    .sum()
            })
            .max()
            .unwrap_or(0)
    }

    proptest! {
        #[test]
        fn rpm_never_exceeded_in_any_window(
            rpm in 1u64..20,
            gaps in prop::collection::vec(0u64..8_000_000, 1..200),
        ) {
            let mut s = KeyState::default();
            let l = limits(Some(rpm), None, None);
            let mut now = 0;
            let mut admitted = Vec::new();
            for g in gaps {
                now += g;
                if s.admit(&l, 0, now).is_ok() {
                    admitted.push((now, 1));
                }
            }
            prop_assert!(max_in_any_window(&admitted) <= rpm);
        }

        #[test]
        fn steady_arrivals_at_the_rate_are_never_refused(
            rpm in 1u64..500,
            offset in 0u64..1_000_000_000,
        ) {
            let mut s = KeyState::default();
            let l = limits(Some(rpm), None, None);
            for k in 0..(3 * rpm) {
                let t = offset + k * WINDOW_US / rpm;
                prop_assert!(s.admit(&l, 0, t).is_ok(), "arrival {} at {} refused", k, t);
            }
        }

        #[test]
        fn a_full_burst_is_admitted_then_the_next_is_refused(rpm in 1u64..300) {
            let mut s = KeyState::default();
            let l = limits(Some(rpm), None, None);
            for _ in 0..rpm {
                prop_assert!(s.admit(&l, 0, 5).is_ok());
            }
            let refused = s.admit(&l, 0, 5);
            let is_rate_limited = matches!(
                refused,
                Err(LimitError::RateLimited { limit: LimitKind::Requests, .. })
            );
            prop_assert!(is_rate_limited);
        }

        #[test]
        fn tpm_never_exceeded_and_retry_after_is_exact(
            tpm in 1u64..5000,
            reqs in prop::collection::vec((0u64..5_000_000, 0u64..2000), 1..150),
        ) {
            let mut s = KeyState::default();
            let l = limits(None, Some(tpm), None);
            let mut now = 0;
            let mut admitted = Vec::new();
            for (gap, cost) in reqs {
                now += gap;
                match s.admit(&l, cost, now) {
                    Ok(_) => admitted.push((now, cost)),
                    Err(LimitError::ExceedsLimit { .. }) => prop_assert!(cost > tpm),
                    Err(LimitError::RateLimited { retry_after, .. }) => {
                        let retry = u64::try_from(retry_after.as_micros()).unwrap();
                        prop_assert!((1..=WINDOW_US).contains(&retry));
                        // Just before the retry time it still does not fit; at it, it does.
                        let mut probe = s.tpm.clone();
                        probe.trim(now + retry - 1);
                        prop_assert!(retry == 1 || probe.check(now + retry - 1, cost, tpm).is_err());
                        probe.trim(now + retry);
                        prop_assert!(probe.check(now + retry, cost, tpm).is_ok());
                    }
                    Err(e) => prop_assert!(false, "unexpected {e:?}"),
                }
            }
            prop_assert!(max_in_any_window(&admitted) <= tpm);
        }

        #[test]
        fn budget_reservations_never_exceed_the_budget(
            budget in 0u64..10_000,
            reqs in prop::collection::vec((0u64..500, 0u64..600, prop::bool::ANY), 1..100),
        ) {
            let mut s = KeyState::default();
            let l = limits(None, None, Some(budget));
            for (est, actual, settle) in reqs {
                if let Ok(entry) = s.admit(&l, est, 0) {
                    prop_assert!(s.spent + s.reserved <= budget.max(s.spent));
                    if settle {
                        // Actual may exceed the estimate: spent overshoots by at most that much.
                        let before = s.spent + s.reserved;
                        s.settle(est, entry, actual, 0);
                        prop_assert!(s.spent <= before.max(budget) + actual.saturating_sub(est));
                    } else {
                        s.release(est, entry);
                    }
                }
            }
        }
    }

    #[test]
    fn refused_requests_consume_nothing() {
        let mut s = KeyState::default();
        let l = limits(Some(2), Some(100), Some(150));
        s.admit(&l, 60, 0).unwrap();
        // Tokens refuse (60 + 60 > 100): the request count must not move.
        assert!(matches!(
            s.admit(&l, 60, 1),
            Err(LimitError::RateLimited {
                limit: LimitKind::Tokens,
                ..
            })
        ));
        s.admit(&l, 40, 2).unwrap();
        assert_eq!((s.rpm.total(), s.tpm.total(), s.reserved), (2, 100, 100));
        // Budget refuses (100 + 60 > 150): nothing recorded.
        let later = WINDOW_US + 10;
        assert!(matches!(
            s.admit(&l, 60, later),
            Err(LimitError::BudgetExhausted { budget: 150, .. })
        ));
        assert_eq!(s.reserved, 100);
    }

    #[test]
    fn settle_charges_actual_tokens_and_release_refunds() {
        let mut s = KeyState::default();
        let l = limits(None, Some(1000), Some(10_000));
        let e = s.admit(&l, 500, 0).unwrap();
        s.settle(500, e, 200, 1);
        assert_eq!((s.spent, s.reserved, s.tpm.total()), (200, 0, 200));
        let e = s.admit(&l, 300, 2).unwrap();
        s.settle(300, e, 700, 3);
        assert_eq!((s.spent, s.tpm.total()), (900, 900));
        let e = s.admit(&l, 100, 4).unwrap();
        s.release(100, e);
        assert_eq!((s.spent, s.reserved, s.tpm.total()), (900, 0, 900));
    }

    #[test]
    fn exhausted_budget_refuses_even_zero_estimates_and_oversize_is_distinct() {
        let mut s = KeyState::default();
        let l = limits(Some(0), None, None);
        assert!(matches!(
            s.admit(&l, 1, 0),
            Err(LimitError::ExceedsLimit {
                limit: LimitKind::Requests,
                ..
            })
        ));
        let l = limits(None, Some(10), Some(5));
        s.spent = 5;
        assert!(matches!(
            s.admit(&l, 0, 0),
            Err(LimitError::BudgetExhausted { spent: 5, .. })
        ));
        s.spent = 0;
        assert!(matches!(
            s.admit(&l, 11, 0),
            Err(LimitError::BudgetExhausted { .. })
        ));
        let l = limits(None, Some(10), None);
        assert!(matches!(
            s.admit(&l, 11, 0),
            Err(LimitError::ExceedsLimit {
                limit: LimitKind::Tokens,
                requested: 11,
                max: 10
            })
        ));
    }
}
