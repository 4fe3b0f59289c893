//! The Redis limiter: the same windows and budget counters as `local.rs`, kept in Redis so
//! several gateway instances share them.
//!
//! Invariants: admit, settle and release are each ONE Lua script (atomic in Redis), taking time
//! from `redis.call('TIME')` (the server's clock); every key is under `<prefix>:lim:{<key id>}:`
//! (one hash tag per API key, so a key's state lives in one cluster slot). Window logs are
//! sorted sets (score = time in µs, member = `<id>:<cost>`) with a running sum; they and the
//! sum expire after a minute without writes. Budget counters (`spent`, `reserved`) and the
//! id sequence never expire.

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

/// Window helpers shared by the scripts (Lua 5.1 in Redis).
const LUA_PRELUDE: &str = r#"
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
"#;

/// KEYS: rpm log, tpm log, tpm sum, spent, reserved, id sequence.
/// ARGV: rpm, tpm, budget (each -1 = none), estimate, window µs.
/// Returns {0, tpm entry id (0 = none)} | {1, retry µs} (requests) | {2, retry µs} (tokens)
/// | {3, spent} (budget) | {4, 1 or 2} (request larger than the limit).
const LUA_ADMIT: &str = r#"
local rpm, tpm, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local est, win = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_us()
local horizon = now - win
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
  local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', horizon)
  if #old > 0 then
    local freed = 0
    for _, m in ipairs(old) do freed = freed + cost_of(m) end
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', horizon)
    if redis.call('DECRBY', KEYS[3], freed) < 0 then redis.call('SET', KEYS[3], 0) end
  end
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
if rpm >= 0 then
  redis.call('ZADD', KEYS[1], now, redis.call('INCR', KEYS[6]))
  touch(KEYS[1], win)
end
local entry = 0
if tpm >= 0 then
  entry = redis.call('INCR', KEYS[6])
  if est > 0 then
    redis.call('ZADD', KEYS[2], now, entry .. ':' .. ARGV[4])
    redis.call('INCRBY', KEYS[3], ARGV[4])
  end
  touch(KEYS[2], win)
  touch(KEYS[3], win)
end
redis.call('INCRBY', KEYS[5], ARGV[4])
return {0, entry}
"#;

/// KEYS: as admit. ARGV: estimate, actual, tpm entry id (0 = none), window µs.
const LUA_SETTLE: &str = r#"
local est, actual, win = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
if redis.call('DECRBY', KEYS[5], ARGV[1]) < 0 then redis.call('SET', KEYS[5], 0) end
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
  local extra = actual - est
  redis.call('ZADD', KEYS[2], now_us(), redis.call('INCR', KEYS[6]) .. ':' .. extra)
  redis.call('INCRBY', KEYS[3], extra)
  touch(KEYS[2], win)
  touch(KEYS[3], win)
end
return 0
"#;

/// KEYS: as admit. ARGV: estimate, tpm entry id (0 = none).
const LUA_RELEASE: &str = r#"
if redis.call('DECRBY', KEYS[5], ARGV[1]) < 0 then redis.call('SET', KEYS[5], 0) end
if ARGV[2] ~= '0' then
  if redis.call('ZREM', KEYS[2], ARGV[2] .. ':' .. ARGV[1]) == 1 then
    if redis.call('DECRBY', KEYS[3], ARGV[1]) < 0 then redis.call('SET', KEYS[3], 0) end
  end
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
    v.map_or(-1, |v| i64::try_from(v.min(MAX_LUA_INT)).unwrap_or(i64::MAX))
}

fn retry_after(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(1).max(1))
}

/// Limits kept in Redis, shared by every gateway using the same URL and prefix.
pub struct RedisLimiter {
    conn: ConnectionManager,
    prefix: String,
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
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(backend)?;
        let script = |body: &str| Script::new(&format!("{LUA_PRELUDE}{body}"));
        Ok(Self {
            conn,
            prefix: prefix.to_string(),
            admit: script(LUA_ADMIT),
            settle: script(LUA_SETTLE),
            release: script(LUA_RELEASE),
            seed: script(LUA_SEED),
        })
    }

    /// The six keys of one API key, in the scripts' KEYS order.
    fn keys(&self, key_id: &str) -> [String; 6] {
        let base = format!("{}:lim:{{{key_id}}}", self.prefix);
        ["rpm", "tpm", "tpm_sum", "spent", "reserved", "seq"].map(|k| format!("{base}:{k}"))
    }

    async fn run(&self, script: &Script, key_id: &str, args: &[i64]) -> Result<Vec<i64>, LimitError> {
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
            lua_int(Some(WINDOW_US)),
        ];
        let reply = self.run(&self.admit, key_id, &args).await?;
        let (status, value) = match reply.as_slice() {
            [s, v, ..] => (*s, *v),
            _ => return Err(LimitError::Backend(format!("bad admit reply {reply:?}"))),
        };
        match status {
            0 => Ok(Reservation::new(key_id, est, (value > 0).then(|| value.unsigned_abs()))),
            1 | 2 => Err(LimitError::RateLimited {
                retry_after: retry_after(value),
                limit: if status == 1 { LimitKind::Requests } else { LimitKind::Tokens },
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
            lua_int(Some(WINDOW_US)),
        ];
        self.run_unit(&self.settle, &r.key_id, &args).await
    }

    pub(crate) async fn release(&self, r: Reservation) -> Result<(), LimitError> {
        let args = [
            lua_int(Some(r.estimated)),
            lua_int(Some(r.tpm_entry.unwrap_or(0))),
        ];
        self.run_unit(&self.release, &r.key_id, &args).await
    }

    async fn run_unit(&self, script: &Script, key_id: &str, args: &[i64]) -> Result<(), LimitError> {
        let mut inv = script.prepare_invoke();
        for k in self.keys(key_id) {
            inv.key(k);
        }
        for a in args {
            inv.arg(*a);
        }
        let mut conn = self.conn.clone();
        inv.invoke_async::<i64>(&mut conn).await.map_err(backend)?;
        Ok(())
    }

    pub(crate) async fn spent(&self, key_id: &str) -> Result<u64, LimitError> {
        let [_, _, _, spent, _, _] = self.keys(key_id);
        let mut conn = self.conn.clone();
        let v: Option<u64> = redis::cmd("GET")
            .arg(spent)
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        Ok(v.unwrap_or(0))
    }

    pub(crate) async fn seed_spent(&self, key_id: &str, tokens: u64) -> Result<(), LimitError> {
        let [_, _, _, spent, _, _] = self.keys(key_id);
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
