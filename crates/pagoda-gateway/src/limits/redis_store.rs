//! The Redis limiter: the same windows and budget counters as `local.rs`, kept in Redis so
//! several gateway instances share them.
//!
//! Invariants: admit, settle and release are each ONE Lua script (atomic in Redis), taking time
//! from `redis.call('TIME')` (the server's clock); every key is under `<prefix>:lim:{<key id>}:`
//! (one hash tag per API key, so a key's state lives in one cluster slot). Window logs are
//! sorted sets (score = time in µs, member = `<id>:<cost>`) with a running sum; they and the
//! sum expire after a minute without writes. `spent` and the id sequence never expire.
//! Reserved tokens are leases (a sorted set scored by deadline, plus their sum): a reservation
//! neither settled nor released within [`RESERVATION_LEASE`] (its gateway crashed) is given
//! back by the next admit, and a late settle or release does not give it back twice.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use super::window::WINDOW_US;
use super::{LimitError, LimitKind, Reservation};
use crate::config::KeyLimits;

/// Largest count passed to Lua (its numbers are doubles: exact up to 2^53).
const MAX_LUA_INT: u64 = 1 << 53;
/// How long one Redis command may take before the limiter reports the backend failed.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long a reservation holds its tokens if never settled (longer than any request lives).
pub const RESERVATION_LEASE: Duration = Duration::from_secs(30 * 60);

/// Window helpers shared by the scripts (Lua 5.1 in Redis).
const LUA_PRELUDE: &str = r#"
-- Replicate effects, not the script (needed before Redis 5 to write after TIME; a no-op since).
if redis.replicate_commands then redis.replicate_commands() end
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function num(key)
  return tonumber(redis.call('GET', key) or '0') or 0
end
local function cost_of(member)
  return tonumber(string.match(member, ':(%d+)$')) or 0
end
local function touch(key, win)
  redis.call('PEXPIRE', key, math.floor(win / 1000) + 1000)
end
-- Drops the members of log `zkey` scored <= `upto` and takes their costs off `sum_key`.
local function expire_entries(zkey, sum_key, upto)
  local old = redis.call('ZRANGEBYSCORE', zkey, '-inf', upto)
  if #old == 0 then return end
  local freed = 0
  for _, m in ipairs(old) do freed = freed + cost_of(m) end
  redis.call('ZREMRANGEBYSCORE', zkey, '-inf', upto)
  if redis.call('DECRBY', sum_key, freed) < 0 then redis.call('SET', sum_key, 0) end
end
-- Removes `member` from log `zkey` and, if it was there, `cost` from `sum_key`.
local function remove_entry(zkey, sum_key, member, cost)
  if redis.call('ZREM', zkey, member) == 1 then
    if redis.call('DECRBY', sum_key, cost) < 0 then redis.call('SET', sum_key, 0) end
  end
end
"#;

/// KEYS: rpm log, tpm log, tpm sum, spent, reserved sum, id sequence, leases.
/// ARGV: rpm, tpm, budget (each -1 = none), estimate, window µs, lease µs.
/// Returns {0, id, 1 if tpm-tracked else 0} | {1, retry µs} (requests) | {2, retry µs}
/// (tokens) | {3, spent} (budget) | {4, 1 or 2} (request larger than the limit).
const LUA_ADMIT: &str = r#"
local rpm, tpm, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local est, win, lease = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_us()
local horizon = now - win
expire_entries(KEYS[7], KEYS[5], now)
local spent = num(KEYS[4])
if budget >= 0 then
  local committed = spent + num(KEYS[5])
  if committed >= budget or committed + est > budget then return {3, spent} end
end
if rpm >= 0 then
  if rpm < 1 then return {4, 1} end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', horizon)
  local n = redis.call('ZCARD', KEYS[1])
  if n + 1 > rpm then
    local e = redis.call('ZRANGE', KEYS[1], n - rpm, n - rpm, 'WITHSCORES')
    return {1, math.max(1, tonumber(e[2]) + win - now)}
  end
end
if tpm >= 0 then
  if est > tpm then return {4, 2} end
  expire_entries(KEYS[2], KEYS[3], horizon)
  local total = num(KEYS[3])
  if total + est > tpm then
    local entries = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
    local remaining = total
    for i = 1, #entries, 2 do
      remaining = remaining - cost_of(entries[i])
      if remaining + est <= tpm then
        return {2, math.max(1, tonumber(entries[i + 1]) + win - now)}
      end
    end
    return {2, win}
  end
end
local id = redis.call('INCR', KEYS[6])
local member = id .. ':' .. ARGV[4]
if rpm >= 0 then
  redis.call('ZADD', KEYS[1], now, id)
  touch(KEYS[1], win)
end
if tpm >= 0 then
  if est > 0 then
    redis.call('ZADD', KEYS[2], now, member)
    redis.call('INCRBY', KEYS[3], ARGV[4])
  end
  touch(KEYS[2], win)
  touch(KEYS[3], win)
end
redis.call('ZADD', KEYS[7], now + lease, member)
redis.call('INCRBY', KEYS[5], ARGV[4])
touch(KEYS[7], lease + win)
touch(KEYS[5], lease + win)
return {0, id, tpm >= 0 and 1 or 0}
"#;

/// KEYS: as admit. ARGV: estimate, actual, tpm entry id (0 = none), window µs,
/// max(actual - estimate, 0), lease id.
const LUA_SETTLE: &str = r#"
local est, actual, win = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
remove_entry(KEYS[7], KEYS[5], ARGV[6] .. ':' .. ARGV[1], ARGV[1])
redis.call('INCRBY', KEYS[4], ARGV[2])
if ARGV[3] == '0' then return 0 end
if actual < est then
  local member = ARGV[3] .. ':' .. ARGV[1]
  local score = redis.call('ZSCORE', KEYS[2], member)
  if score then
    redis.call('ZREM', KEYS[2], member)
    if actual > 0 then redis.call('ZADD', KEYS[2], score, ARGV[3] .. ':' .. ARGV[2]) end
    if redis.call('DECRBY', KEYS[3], est - actual) < 0 then redis.call('SET', KEYS[3], 0) end
  end
elseif actual > est then
  redis.call('ZADD', KEYS[2], now_us(), redis.call('INCR', KEYS[6]) .. ':' .. ARGV[5])
  redis.call('INCRBY', KEYS[3], ARGV[5])
  touch(KEYS[2], win)
  touch(KEYS[3], win)
end
return 0
"#;

/// KEYS: as admit. ARGV: estimate, tpm entry id (0 = none), lease id.
const LUA_RELEASE: &str = r#"
remove_entry(KEYS[7], KEYS[5], ARGV[3] .. ':' .. ARGV[1], ARGV[1])
if ARGV[2] ~= '0' then
  remove_entry(KEYS[2], KEYS[3], ARGV[2] .. ':' .. ARGV[1], ARGV[1])
end
return 0
"#;

/// KEYS: spent. ARGV: tokens. Raises spent to at least tokens.
const LUA_SEED: &str = r#"
local n = tonumber(ARGV[1])
if num(KEYS[1]) < n then redis.call('SET', KEYS[1], ARGV[1]) end
return 0
"#;

fn backend(e: redis::RedisError) -> LimitError {
    LimitError::Backend(e.to_string())
}

fn lua_int(v: Option<u64>) -> i64 {
    v.map_or(-1, |v| {
        i64::try_from(v.min(MAX_LUA_INT)).unwrap_or(i64::MAX)
    })
}

fn retry_after(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(1).max(1))
}

/// Limits kept in Redis, shared by every gateway using the same URL and prefix.
pub struct RedisLimiter {
    conn: ConnectionManager,
    prefix: String,
    /// Window length in µs ([`WINDOW_US`]; shorter in tests).
    window_us: u64,
    /// Reservation lease in µs ([`RESERVATION_LEASE`]; shorter in tests).
    lease_us: u64,
    admit: Script,
    settle: Script,
    release: Script,
    seed: Script,
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisLimiter {
    /// Connects (reconnecting by itself later) to the Redis at `url`.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, LimitError> {
        let client = redis::Client::open(url).map_err(backend)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(RESPONSE_TIMEOUT)
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_number_of_retries(0)
            .set_max_delay(100);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(backend)?;
        let script = |body: &str| Script::new(&format!("{LUA_PRELUDE}{body}"));
        Ok(Self {
            conn,
            prefix: prefix.to_string(),
            window_us: WINDOW_US,
            lease_us: u64::try_from(RESERVATION_LEASE.as_micros()).unwrap_or(u64::MAX),
            admit: script(LUA_ADMIT),
            settle: script(LUA_SETTLE),
            release: script(LUA_RELEASE),
            seed: script(LUA_SEED),
        })
    }

    /// The seven keys of one API key, in the scripts' KEYS order.
    fn keys(&self, key_id: &str) -> [String; 7] {
        let base = format!("{}:lim:{{{key_id}}}", self.prefix);
        [
            "rpm", "tpm", "tpm_sum", "spent", "reserved", "seq", "leases",
        ]
        .map(|k| format!("{base}:{k}"))
    }

    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        key_id: &str,
        args: &[i64],
    ) -> Result<T, LimitError> {
        let mut inv = script.prepare_invoke();
        for k in self.keys(key_id) {
            inv.key(k);
        }
        for a in args {
            inv.arg(*a);
        }
        let mut conn = self.conn.clone();
        inv.invoke_async(&mut conn).await.map_err(backend)
    }

    pub(crate) async fn admit(
        &self,
        key_id: &str,
        limits: &KeyLimits,
        est: u64,
    ) -> Result<Reservation, LimitError> {
        let est = est.min(MAX_LUA_INT);
        let args = [
            lua_int(limits.rpm),
            lua_int(limits.tpm),
            lua_int(limits.budget_tokens),
            lua_int(Some(est)),
            lua_int(Some(self.window_us)),
            lua_int(Some(self.lease_us)),
        ];
        let reply: Vec<i64> = self.run(&self.admit, key_id, &args).await?;
        let (status, value, tracked) = match reply.as_slice() {
            [s, v] => (*s, *v, 0),
            [s, v, t] => (*s, *v, *t),
            _ => return Err(LimitError::Backend(format!("bad admit reply {reply:?}"))),
        };
        match status {
            0 => {
                let id = value.unsigned_abs();
                Ok(Reservation::new(
                    key_id,
                    est,
                    (tracked == 1).then_some(id),
                    id,
                ))
            }
            1 | 2 => Err(LimitError::RateLimited {
                retry_after: retry_after(value),
                limit: if status == 1 {
                    LimitKind::Requests
                } else {
                    LimitKind::Tokens
                },
            }),
            3 => Err(LimitError::BudgetExhausted {
                budget: limits.budget_tokens.unwrap_or(0),
                spent: value.unsigned_abs(),
            }),
            4 if value == 1 => Err(LimitError::ExceedsLimit {
                limit: LimitKind::Requests,
                requested: 1,
                max: limits.rpm.unwrap_or(0),
            }),
            4 => Err(LimitError::ExceedsLimit {
                limit: LimitKind::Tokens,
                requested: est,
                max: limits.tpm.unwrap_or(0),
            }),
            _ => Err(LimitError::Backend(format!("bad admit reply {reply:?}"))),
        }
    }

    pub(crate) async fn settle(&self, r: Reservation, actual: u64) -> Result<(), LimitError> {
        let args = [
            lua_int(Some(r.estimated)),
            lua_int(Some(actual)),
            lua_int(Some(r.tpm_entry.unwrap_or(0))),
            lua_int(Some(self.window_us)),
            lua_int(Some(actual.saturating_sub(r.estimated))),
            lua_int(Some(r.lease)),
        ];
        self.run::<i64>(&self.settle, &r.key_id, &args).await?;
        Ok(())
    }

    pub(crate) async fn release(&self, r: Reservation) -> Result<(), LimitError> {
        let args = [
            lua_int(Some(r.estimated)),
            lua_int(Some(r.tpm_entry.unwrap_or(0))),
            lua_int(Some(r.lease)),
        ];
        self.run::<i64>(&self.release, &r.key_id, &args).await?;
        Ok(())
    }

    pub(crate) async fn spent(&self, key_id: &str) -> Result<u64, LimitError> {
        let [_, _, _, spent, ..] = self.keys(key_id);
        let mut conn = self.conn.clone();
        let v: Option<u64> = redis::cmd("GET")
            .arg(spent)
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(v.unwrap_or(0))
    }

    pub(crate) async fn seed_spent(&self, key_id: &str, tokens: u64) -> Result<(), LimitError> {
        let [_, _, _, spent, ..] = self.keys(key_id);
        let mut conn = self.conn.clone();
        self.seed
            .key(spent)
            .arg(lua_int(Some(tokens)))
            .invoke_async::<i64>(&mut conn)
            .await
            .map_err(backend)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::concurrent_budget_holds;
    use super::super::Limiter;
    use super::*;
    use std::sync::Arc;

    /// The test Redis from `PAGODA_TEST_REDIS`; without it the test is skipped, except in CI
    /// (`CI=true`) where it fails.
    fn redis_url() -> Option<String> {
        match std::env::var("PAGODA_TEST_REDIS") {
            Ok(url) if !url.is_empty() => Some(url),
            _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("PAGODA_TEST_REDIS is unset in CI: the Redis limiter tests need a Redis")
            }
            _ => {
                eprintln!("PAGODA_TEST_REDIS unset: skipping a Redis limiter test");
                None
            }
        }
    }

    fn unique_prefix() -> String {
        let bytes: [u8; 8] = rand::random();
        format!("pagoda-test-{}", hex::encode(bytes))
    }

    async fn two_limiters(url: &str) -> (Arc<Limiter>, Arc<Limiter>) {
        let prefix = unique_prefix();
        let a = Limiter::redis(url, &prefix).await.unwrap();
        let b = Limiter::redis(url, &prefix).await.unwrap();
        (Arc::new(a), Arc::new(b))
    }

    fn limits(rpm: Option<u64>, tpm: Option<u64>, budget: Option<u64>) -> KeyLimits {
        KeyLimits {
            rpm,
            tpm,
            budget_tokens: budget,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_admits_never_overspend_the_budget() {
        let Some(url) = redis_url() else { return };
        let (a, _) = two_limiters(&url).await;
        concurrent_budget_holds(a, "k").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn rpm_and_budget_hold_across_two_instances() {
        let Some(url) = redis_url() else { return };
        let (a, b) = two_limiters(&url).await;
        for (lim, expected) in [
            (limits(Some(10), None, None), 10),
            (limits(None, None, Some(7 * 50)), 7),
        ] {
            let key = format!("key-{expected}");
            let tasks: Vec<_> = (0..40)
                .map(|i| {
                    let l = if i % 2 == 0 { a.clone() } else { b.clone() };
                    let (lim, key) = (lim.clone(), key.clone());
                    tokio::spawn(async move {
                        match l.admit(&key, &lim, 50).await {
                            Ok(r) => {
                                l.settle(r, 50).await.unwrap();
                                1
                            }
                            Err(
                                LimitError::RateLimited { .. } | LimitError::BudgetExhausted { .. },
                            ) => 0,
                            Err(e) => panic!("unexpected {e:?}"),
                        }
                    })
                })
                .collect();
            let mut admitted = 0;
            for t in tasks {
                admitted += t.await.unwrap();
            }
            assert_eq!(admitted, expected, "{lim:?}");
            assert_eq!(b.spent(&key).await.unwrap(), expected * 50);
        }
    }

    #[tokio::test]
    async fn refusals_consume_nothing_and_report_why() {
        let Some(url) = redis_url() else { return };
        let (l, _) = two_limiters(&url).await;
        let lim = limits(Some(2), Some(100), Some(150));
        let r1 = l.admit("k", &lim, 60).await.unwrap();
        match l.admit("k", &lim, 60).await {
            Err(LimitError::RateLimited {
                limit: LimitKind::Tokens,
                retry_after,
            }) => assert!(
                retry_after > Duration::from_secs(59) && retry_after <= Duration::from_secs(60)
            ),
            other => panic!("expected a token refusal, got {other:?}"),
        }
        // The refused request took no request slot: a second one still fits.
        let r2 = l.admit("k", &lim, 40).await.unwrap();
        assert!(matches!(
            l.admit("k", &lim, 0).await,
            Err(LimitError::RateLimited {
                limit: LimitKind::Requests,
                ..
            })
        ));
        assert!(matches!(
            l.admit("k", &limits(None, None, Some(150)), 60).await,
            Err(LimitError::BudgetExhausted {
                budget: 150,
                spent: 0
            })
        ));
        assert!(matches!(
            l.admit("k", &limits(None, Some(10), None), 11).await,
            Err(LimitError::ExceedsLimit {
                limit: LimitKind::Tokens,
                requested: 11,
                max: 10
            })
        ));
        assert!(matches!(
            l.admit("k", &limits(Some(0), None, None), 1).await,
            Err(LimitError::ExceedsLimit {
                limit: LimitKind::Requests,
                ..
            })
        ));
        l.release(r1).await.unwrap();
        l.settle(r2, 40).await.unwrap();
        assert_eq!(l.spent("k").await.unwrap(), 40);
    }

    #[tokio::test]
    async fn settle_corrects_the_token_window_by_actual_minus_estimate() {
        let Some(url) = redis_url() else { return };
        let (l, _) = two_limiters(&url).await;
        let lim = limits(None, Some(1000), None);
        let r = l.admit("k", &lim, 900).await.unwrap();
        l.settle(r, 100).await.unwrap();
        // 100 used: 900 more fit, 901 do not.
        let r = l.admit("k", &lim, 900).await.unwrap();
        l.release(r).await.unwrap();
        let r = l.admit("k", &lim, 200).await.unwrap();
        l.settle(r, 800).await.unwrap();
        // 900 used now.
        assert!(l.admit("k", &lim, 101).await.is_err());
        let r = l.admit("k", &lim, 100).await.unwrap();
        l.settle(r, 100).await.unwrap();
        assert_eq!(l.spent("k").await.unwrap(), 1000);
    }

    #[tokio::test]
    async fn seed_spent_only_raises_and_only_spent_never_expires() {
        let Some(url) = redis_url() else { return };
        let prefix = unique_prefix();
        let Limiter::Redis(l) = Limiter::redis(&url, &prefix).await.unwrap() else {
            unreachable!()
        };
        l.seed_spent("k", 500).await.unwrap();
        l.seed_spent("k", 200).await.unwrap();
        assert_eq!(l.spent("k").await.unwrap(), 500);
        let r = l
            .admit("k", &limits(Some(5), Some(100), None), 10)
            .await
            .unwrap();
        let [rpm, tpm, sum, spent, reserved, _, leases] = l.keys("k");
        assert!(rpm.starts_with(&format!("{prefix}:lim:{{k}}:")));
        let mut conn = l.conn.clone();
        for (key, expires) in [
            (rpm, true),
            (tpm, true),
            (sum, true),
            (spent, false),
            (reserved, true),
            (leases, true),
        ] {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(ttl > 0, expires, "{key}: {ttl}");
        }
        l.settle(r, 10).await.unwrap();
        assert_eq!(l.spent("k").await.unwrap(), 510);
    }

    /// A limiter whose window is `window_ms` long instead of a minute, to watch it slide.
    async fn short_window(url: &str, window_ms: u64) -> RedisLimiter {
        let mut l = RedisLimiter::connect(url, &unique_prefix()).await.unwrap();
        l.window_us = window_ms * 1000;
        l
    }

    #[tokio::test]
    async fn a_refused_request_fits_after_retry_after() {
        let Some(url) = redis_url() else { return };
        let l = short_window(&url, 300).await;
        for lim in [limits(Some(4), None, None), limits(None, Some(100), None)] {
            let key = format!("{lim:?}");
            for _ in 0..4 {
                let r = l.admit(&key, &lim, 25).await.unwrap();
                l.settle(r, 25).await.unwrap();
            }
            let retry = match l.admit(&key, &lim, 25).await {
                Err(LimitError::RateLimited { retry_after, .. }) => retry_after,
                other => panic!("expected a refusal, got {other:?}"),
            };
            assert!(retry > Duration::from_millis(150) && retry <= Duration::from_millis(300));
            tokio::time::sleep(retry + Duration::from_millis(5)).await;
            let r = l.admit(&key, &lim, 25).await.unwrap();
            l.release(r).await.unwrap();
        }
    }

    #[tokio::test]
    async fn steady_arrivals_just_under_the_rate_are_never_refused() {
        let Some(url) = redis_url() else { return };
        // 5 per 250 ms = one per 50 ms; arrivals every 60 ms leave room for scheduling jitter.
        let l = short_window(&url, 250).await;
        let lim = limits(Some(5), None, None);
        let start = tokio::time::Instant::now();
        for k in 0..10u32 {
            tokio::time::sleep_until(start + Duration::from_millis(60) * k).await;
            let r = l.admit("k", &lim, 0).await.unwrap();
            l.settle(r, 0).await.unwrap();
        }
    }

    #[tokio::test]
    async fn tokens_over_the_estimate_are_charged_when_settled() {
        let Some(url) = redis_url() else { return };
        let l = short_window(&url, 300).await;
        let lim = limits(None, Some(100), None);
        let r = l.admit("k", &lim, 10).await.unwrap();
        l.settle(r, 95).await.unwrap();
        assert!(matches!(
            l.admit("k", &lim, 10).await,
            Err(LimitError::RateLimited {
                limit: LimitKind::Tokens,
                ..
            })
        ));
        tokio::time::sleep(Duration::from_millis(310)).await;
        let r = l.admit("k", &lim, 100).await.unwrap();
        l.release(r).await.unwrap();
    }

    #[tokio::test]
    async fn an_abandoned_reservation_is_given_back_once_after_its_lease() {
        let Some(url) = redis_url() else { return };
        let mut l = RedisLimiter::connect(&url, &unique_prefix()).await.unwrap();
        l.lease_us = 200_000;
        let lim = limits(None, None, Some(100));
        let abandoned = l.admit("k", &lim, 100).await.unwrap();
        assert!(matches!(
            l.admit("k", &lim, 1).await,
            Err(LimitError::BudgetExhausted { .. })
        ));
        tokio::time::sleep(Duration::from_millis(250)).await;
        let live = l.admit("k", &lim, 60).await.unwrap();
        // The late settle charges its tokens but does not give back the lease a second time.
        l.settle(abandoned, 30).await.unwrap();
        assert!(matches!(
            l.admit("k", &lim, 11).await,
            Err(LimitError::BudgetExhausted { spent: 30, .. })
        ));
        l.release(live).await.unwrap();
        let r = l.admit("k", &lim, 70).await.unwrap();
        l.settle(r, 70).await.unwrap();
        assert_eq!(l.spent("k").await.unwrap(), 100);
    }

    /// Round trip of one admit + settle pair against the test Redis.
    #[tokio::test]
    #[ignore = "measurement: PAGODA_TEST_REDIS=... cargo test -p pagoda-gateway redis_cost -- --ignored --nocapture"]
    async fn redis_cost() {
        let Some(url) = redis_url() else { return };
        let l = RedisLimiter::connect(&url, &unique_prefix()).await.unwrap();
        let lim = limits(Some(1_000_000), Some(1_000_000_000), Some(u64::MAX >> 12));
        let n = 2000;
        let start = std::time::Instant::now();
        for _ in 0..n {
            let r = l.admit("k", &lim, 100).await.unwrap();
            l.settle(r, 90).await.unwrap();
        }
        eprintln!("admit + settle: {:?} per pair", start.elapsed() / n);
    }

    #[tokio::test]
    async fn an_unreachable_redis_is_a_backend_error() {
        let err = Limiter::redis("redis://127.0.0.1:1", "p")
            .await
            .unwrap_err();
        assert!(matches!(err, LimitError::Backend(_)), "{err:?}");
        assert!(matches!(
            Limiter::redis("not a url", "p").await,
            Err(LimitError::Backend(_))
        ));
    }
}
