//! Per-key rate limits (requests and tokens per minute) and token budgets, in this process or
//! shared through Redis by several gateway instances.
//!
//! Owns admission: [`Limiter::admit`] checks the budget, the requests-per-minute and the
//! tokens-per-minute limits in one atomic step (one mutex section locally, one Lua script in
//! Redis) and reserves the request's estimated tokens; [`Limiter::settle`] charges the actual
//! tokens when the response ends, [`Limiter::release`] refunds a request that never reached
//! upstream. Invariants:
//! - a refused request consumes nothing;
//! - concurrent admits never reserve past a budget (`spent + reserved + estimate <= budget`), so
//!   with actual == estimate, spent never exceeds the budget (it may by the excess of actual
//!   over estimate of the requests in flight);
//! - in any 60 s window at most `rpm` requests and `tpm` estimated-then-corrected tokens are
//!   admitted; a burst of `rpm` at once is allowed and a steady `rpm / 60` per second is never
//!   refused (an exact sliding-window log, see `window.rs`: a GCRA with burst = rpm would let
//!   up to 2 x rpm through in one minute);
//! - Redis mode uses the Redis server's clock, so instances' clocks do not matter.
//!
//! Every reservation must be settled or released, or its tokens stay reserved (until restart in
//! local mode, for `RESERVATION_LEASE` (30 min) in Redis mode, then given back).

mod local;
mod redis_store;
mod window;

use std::time::Duration;

pub use local::LocalLimiter;
pub use redis_store::RedisLimiter;

use crate::config::KeyLimits;

/// Which per-minute limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LimitKind {
    Requests,
    Tokens,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// Too many requests or tokens in the last minute; retrying after `retry_after` fits.
    #[error("rate limit on {limit:?} reached; retry after {retry_after:?}")]
    RateLimited {
        retry_after: Duration,
        limit: LimitKind,
    },
    /// The key's token budget cannot cover this request.
    #[error("token budget exhausted: {spent} of {budget} tokens spent")]
    BudgetExhausted { budget: u64, spent: u64 },
    /// The request alone is larger than the per-minute limit (or the limit is 0): waiting
    /// will never help.
    #[error("request needs {requested} {limit:?} but the per-minute limit is {max}")]
    ExceedsLimit {
        limit: LimitKind,
        requested: u64,
        max: u64,
    },
    /// The shared store (Redis) failed; the gateway decides to fail open or closed.
    #[error("limiter backend: {0}")]
    Backend(String),
}

/// Tokens reserved by an admitted request; give it to [`Limiter::settle`] or
/// [`Limiter::release`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "settle or release a reservation, or its tokens stay reserved"]
pub struct Reservation {
    key_id: String,
    estimated: u64,
    /// Id of the request's token-window entry; `None` when the key had no TPM limit.
    tpm_entry: Option<u64>,
    /// Id of the Redis lease holding the reserved tokens (0 in local mode).
    lease: u64,
}

impl Reservation {
    fn new(key_id: &str, estimated: u64, tpm_entry: Option<u64>, lease: u64) -> Self {
        Self {
            key_id: key_id.to_string(),
            estimated,
            tpm_entry,
            lease,
        }
    }

    /// The key the reservation was made for.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The tokens reserved.
    pub fn estimated(&self) -> u64 {
        self.estimated
    }
}

/// The gateway's limiter: in-process, or shared through Redis.
#[derive(Debug)]
pub enum Limiter {
    Local(LocalLimiter),
    Redis(Box<RedisLimiter>),
}

impl Limiter {
    /// Limits held in this process.
    pub fn local() -> Limiter {
        Limiter::Local(LocalLimiter::new())
    }

    /// Limits shared through the Redis at `url`, every key under `prefix`.
    pub async fn redis(url: &str, prefix: &str) -> Result<Limiter, LimitError> {
        Ok(Limiter::Redis(Box::new(
            RedisLimiter::connect(url, prefix).await?,
        )))
    }

    /// Admits a request estimated at `estimated_tokens` (prompt + max completion) for `key_id`
    /// under `limits`, reserving those tokens, or says why not (consuming nothing).
    pub async fn admit(
        &self,
        key_id: &str,
        limits: &KeyLimits,
        estimated_tokens: u64,
    ) -> Result<Reservation, LimitError> {
        match self {
            Limiter::Local(l) => l.admit(key_id, limits, estimated_tokens),
            Limiter::Redis(r) => r.admit(key_id, limits, estimated_tokens).await,
        }
    }

    /// Charges the request's `actual_tokens` and drops its reservation; the tokens-per-minute
    /// window is corrected by actual - estimated.
    pub async fn settle(
        &self,
        reservation: Reservation,
        actual_tokens: u64,
    ) -> Result<(), LimitError> {
        match self {
            Limiter::Local(l) => {
                l.settle(reservation, actual_tokens);
                Ok(())
            }
            Limiter::Redis(r) => r.settle(reservation, actual_tokens).await,
        }
    }

    /// Refunds a reservation whole (the request failed before upstream used any tokens).
    pub async fn release(&self, reservation: Reservation) -> Result<(), LimitError> {
        match self {
            Limiter::Local(l) => {
                l.release(reservation);
                Ok(())
            }
            Limiter::Redis(r) => r.release(reservation).await,
        }
    }

    /// Tokens the key has spent (settled requests).
    pub async fn spent(&self, key_id: &str) -> Result<u64, LimitError> {
        match self {
            Limiter::Local(l) => Ok(l.spent(key_id)),
            Limiter::Redis(r) => r.spent(key_id).await,
        }
    }

    /// Raises the key's spent count to at least `tokens` (from the usage ledger at start); it
    /// never lowers it, so seeding a shared Redis that already counts more is harmless.
    pub async fn seed_spent(&self, key_id: &str, tokens: u64) -> Result<(), LimitError> {
        match self {
            Limiter::Local(l) => {
                l.seed_spent(key_id, tokens);
                Ok(())
            }
            Limiter::Redis(r) => r.seed_spent(key_id, tokens).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn budget_only(budget: u64) -> KeyLimits {
        KeyLimits {
            budget_tokens: Some(budget),
            ..KeyLimits::default()
        }
    }

    /// N concurrent admits against a budget for M < N requests: exactly M get through.
    pub(crate) async fn concurrent_budget_holds(limiter: Arc<Limiter>, key: &str) {
        let (n, m, est) = (64u64, 10u64, 100u64);
        let limits = budget_only(m * est);
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (limiter, limits, key) = (limiter.clone(), limits.clone(), key.to_string());
                tokio::spawn(async move {
                    match limiter.admit(&key, &limits, est).await {
                        Ok(r) => {
                            tokio::task::yield_now().await;
                            limiter.settle(r, est).await.unwrap();
                            true
                        }
                        Err(LimitError::BudgetExhausted { .. }) => false,
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                })
            })
            .collect();
        let mut admitted = 0;
        for t in tasks {
            admitted += u64::from(t.await.unwrap());
        }
        assert_eq!(admitted, m);
        assert_eq!(limiter.spent(key).await.unwrap(), m * est);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn local_concurrent_admits_never_overspend_the_budget() {
        concurrent_budget_holds(Arc::new(Limiter::local()), "k").await;
    }

    #[tokio::test]
    async fn local_release_refunds_and_seed_only_raises() {
        let limiter = Limiter::local();
        let limits = budget_only(100);
        let r = limiter.admit("k", &limits, 100).await.unwrap();
        assert!(limiter.admit("k", &limits, 1).await.is_err());
        limiter.release(r).await.unwrap();
        let r = limiter.admit("k", &limits, 100).await.unwrap();
        limiter.settle(r, 40).await.unwrap();
        assert_eq!(limiter.spent("k").await.unwrap(), 40);
        limiter.seed_spent("k", 30).await.unwrap();
        assert_eq!(limiter.spent("k").await.unwrap(), 40);
        limiter.seed_spent("k", 90).await.unwrap();
        assert!(matches!(
            limiter.admit("k", &limits, 20).await,
            Err(LimitError::BudgetExhausted {
                budget: 100,
                spent: 90
            })
        ));
        assert_eq!(limiter.spent("other").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn keys_are_limited_independently() {
        let limiter = Limiter::local();
        let limits = KeyLimits {
            rpm: Some(1),
            ..KeyLimits::default()
        };
        let a = limiter.admit("a", &limits, 0).await.unwrap();
        let b = limiter.admit("b", &limits, 0).await.unwrap();
        assert!(matches!(
            limiter.admit("a", &limits, 0).await,
            Err(LimitError::RateLimited {
                limit: LimitKind::Requests,
                ..
            })
        ));
        limiter.settle(a, 0).await.unwrap();
        limiter.settle(b, 0).await.unwrap();
    }
}
