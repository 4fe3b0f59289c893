//! Rollout state shared by every gateway instance through Redis, so several instances run one
//! rollout: the same canary percent everywhere, one decision per change, admin actions on any
//! instance, and a restarted instance resuming where the rollout stands.
//!
//! Keys (one Redis Cluster hash tag per rollout, so its scripts touch one slot), with
//! `R = <prefix>:rollout:{<route>|<stable>|<canary>}` — a new stable/canary pair is a new
//! rollout, so instances still on an older config never fight over one record:
//! - `R:phase`, a hash: `epoch` (a counter bumped by every change) and `phase` (the
//!   [`SharedPhase`] JSON). Written only by [`RedisRolloutStore::compare_and_set`]: one Lua
//!   script that writes only when the stored epoch is the one the writer read, so of two
//!   instances deciding at once exactly one change lands and the other adopts it.
//! - `R:stats:<window>`, a hash: each instance's own statistics of that step
//!   ([`StatsSnapshot`] JSON, field = instance id), rewritten whole at every sync (so a retry
//!   never counts twice), expiring a day after the last write. The instance that analyses sums
//!   them.
//! - `R:events`, a list: the last [`HISTORY_LEN`] changes (automatic and operator), oldest
//!   first, appended by the same script as the change.
//!
//! - If Redis loses the data (a restart without persistence), the instances put their last
//!   phase back (`restored` in the history); the statistics of the step start again.
//!
//! Invariants: the request path never waits on Redis (it reads the controller's atomic
//! percent, which [`sync_rollout`] updates every [`SYNC_PERIOD`]); a change is applied
//! locally only after its compare-and-set succeeded. While Redis is unreachable each instance
//! keeps routing by the last phase it read and no automatic decision is made.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, Script};
use serde::{Deserialize, Serialize};

use super::controller::Controller;
pub use super::controller::SharedPhase;
use super::stats::{StatsSnapshot, VersionStats};
use super::RolloutEvent;

/// How often each instance reads the shared phase and publishes its statistics.
pub const SYNC_PERIOD: Duration = Duration::from_millis(250);
/// Changes kept in `R:events`.
pub const HISTORY_LEN: isize = 100;
/// A statistics window nobody wrote for this long is dropped by Redis.
const STATS_TTL_MS: u64 = 24 * 3600 * 1000;
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// One recorded change, as `R:events` holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub unix_ms: u64,
    /// The gateway instance that made the change.
    pub instance: String,
    /// `promoted`, `completed`, `rolled_back`, or the operator's action (`promote`, `pause`,
    /// `resume`, `abort`, `restart`), or `started` / `restored` (stored by the first instance,
    /// or put back after Redis lost it).
    pub change: String,
    pub step: usize,
    pub state: String,
    pub detail: Option<String>,
}

/// Why the shared store failed.
#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    #[error("rollout state in Redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("rollout state in Redis is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// KEYS: phase hash, events list. ARGV: expected epoch, new epoch, phase JSON, event JSON ('' for
/// none), history length. Returns 1 when written, 0 when the stored epoch differs.
const LUA_CAS: &str = r#"
local current = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if current ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'epoch', ARGV[2], 'phase', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('RPUSH', KEYS[2], ARGV[4])
  redis.call('LTRIM', KEYS[2], -tonumber(ARGV[5]), -1)
end
return 1
"#;

/// Rollout phases, statistics and history in Redis.
pub struct RedisRolloutStore {
    conn: ConnectionManager,
    prefix: String,
    /// This gateway instance (the statistics field it writes).
    instance: String,
    cas: Script,
}

impl std::fmt::Debug for RedisRolloutStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRolloutStore")
            .field("prefix", &self.prefix)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl RedisRolloutStore {
    /// Connects to `url`; every key starts with `prefix`; `instance` names this gateway.
    pub async fn connect(url: &str, prefix: &str, instance: &str) -> Result<Self, SharedError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(RESPONSE_TIMEOUT)
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_number_of_retries(0)
            .set_max_delay(100);
        let conn = ConnectionManager::new_with_config(client, config).await?;
        Ok(Self {
            conn,
            prefix: prefix.to_string(),
            instance: instance.to_string(),
            cas: Script::new(LUA_CAS),
        })
    }

    /// This gateway instance's id.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    fn base(&self, c: &Controller) -> String {
        format!(
            "{}:rollout:{{{}|{}|{}}}",
            self.prefix,
            c.route(),
            c.stable(),
            c.canary()
        )
    }

    /// The stored phase of `c`'s rollout, `None` when no instance has stored one.
    pub async fn load(&self, c: &Controller) -> Result<Option<SharedPhase>, SharedError> {
        let mut conn = self.conn.clone();
        let raw: Option<String> = conn
            .hget(format!("{}:phase", self.base(c)), "phase")
            .await?;
        Ok(raw.map(|r| serde_json::from_str(&r)).transpose()?)
    }

    /// Writes `phase` if the stored epoch is `expected` (0: nothing stored yet), appending
    /// `event` to the history in the same step. Returns whether it was written.
    pub async fn compare_and_set(
        &self,
        c: &Controller,
        expected: u64,
        phase: &SharedPhase,
        event: Option<&HistoryEntry>,
    ) -> Result<bool, SharedError> {
        let base = self.base(c);
        let event = match event {
            Some(e) => serde_json::to_string(e)?,
            None => String::new(),
        };
        let mut conn = self.conn.clone();
        let written: i64 = self
            .cas
            .key(format!("{base}:phase"))
            .key(format!("{base}:events"))
            .arg(expected)
            .arg(phase.epoch)
            .arg(serde_json::to_string(phase)?)
            .arg(event)
            .arg(HISTORY_LEN)
            .invoke_async(&mut conn)
            .await?;
        Ok(written == 1)
    }

    /// Publishes this instance's statistics of `window` and returns the sum of the other
    /// instances' (stable, canary) in that window.
    pub async fn exchange_stats(
        &self,
        c: &Controller,
        window: u64,
        stable: &VersionStats,
        canary: &VersionStats,
    ) -> Result<(VersionStats, VersionStats), SharedError> {
        let key = format!("{}:stats:{window}", self.base(c));
        let mine = serde_json::to_string(&InstanceStats {
            stable: stable.into(),
            canary: canary.into(),
        })?;
        let mut conn = self.conn.clone();
        let (_, _, all): ((), (), HashMap<String, String>) = redis::pipe()
            .atomic()
            .hset(&key, &self.instance, mine)
            .pexpire(&key, STATS_TTL_MS as i64)
            .hgetall(&key)
            .query_async(&mut conn)
            .await?;
        let mut peers = (VersionStats::default(), VersionStats::default());
        for (instance, raw) in all {
            if instance == self.instance {
                continue;
            }
            // One instance's unreadable entry (another version's format) is skipped, not fatal.
            let Ok(theirs) = serde_json::from_str::<InstanceStats>(&raw) else {
                tracing::warn!(%instance, "skipping unreadable rollout statistics in Redis");
                continue;
            };
            peers.0.merge(&(&theirs.stable).into());
            peers.1.merge(&(&theirs.canary).into());
        }
        Ok(peers)
    }

    /// The recorded changes of `c`'s rollout, oldest first.
    pub async fn history(&self, c: &Controller) -> Result<Vec<HistoryEntry>, SharedError> {
        let mut conn = self.conn.clone();
        let raw: Vec<String> = conn
            .lrange(format!("{}:events", self.base(c)), 0, -1)
            .await?;
        Ok(raw
            .iter()
            .filter_map(|r| serde_json::from_str(r).ok())
            .collect())
    }

    /// A history entry made by this instance now.
    pub fn entry(&self, change: &str, phase: &SharedPhase, detail: Option<String>) -> HistoryEntry {
        HistoryEntry {
            unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            instance: self.instance.clone(),
            change: change.to_string(),
            step: phase.step,
            state: phase.state.clone(),
            detail,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct InstanceStats {
    stable: StatsSnapshot,
    canary: StatsSnapshot,
}

/// Brings `c` up to date with the shared store: stores its phase if none is stored, adopts the
/// stored one otherwise, trades statistics, and (when the rollout's interval has passed) runs
/// the analysis on the merged statistics, writing a decision by compare-and-set. Returns the
/// decision that this instance made, if any.
pub async fn sync_rollout(
    store: &RedisRolloutStore,
    c: &Controller,
    now: Instant,
) -> Result<Option<RolloutEvent>, SharedError> {
    refresh(store, c, now).await?;
    let (window, stable, canary) = c.local_stats();
    let (peer_stable, peer_canary) = store.exchange_stats(c, window, &stable, &canary).await?;
    c.set_peer_stats(window, peer_stable, peer_canary);
    let fork = c.fork();
    let decision = fork.tick(now);
    c.set_last_analysis(fork.last_analysis());
    let Some(event) = decision else {
        return Ok(None);
    };
    let expected = c.epoch();
    let phase = fork.phase(expected + 1);
    let (change, detail) = describe_event(&event);
    let entry = store.entry(change, &phase, detail);
    if store
        .compare_and_set(c, expected, &phase, Some(&entry))
        .await?
    {
        c.adopt(&phase, now);
        Ok(Some(event))
    } else {
        // Another instance changed the rollout first: take its phase instead.
        refresh(store, c, now).await?;
        Ok(None)
    }
}

/// Reads the stored phase and adopts it, or stores this instance's phase when there is none
/// (the first instance, or a Redis that lost its data: the instances' last phase is put back,
/// at a higher epoch than any of them has seen, so they all adopt it).
pub async fn refresh(
    store: &RedisRolloutStore,
    c: &Controller,
    now: Instant,
) -> Result<(), SharedError> {
    let stored = store.load(c).await?;
    let local = c.epoch();
    let expected = match &stored {
        Some(phase) if phase.epoch >= local => {
            c.adopt(phase, now);
            return Ok(());
        }
        // Older than what this instance adopted: Redis lost or rolled back its data.
        Some(phase) => phase.epoch,
        None => 0,
    };
    let mine = c.phase(local + 1);
    let change = if local == 0 { "started" } else { "restored" };
    let entry = store.entry(change, &mine, None);
    if store
        .compare_and_set(c, expected, &mine, Some(&entry))
        .await?
    {
        c.adopt(&mine, now);
    } else if let Some(phase) = store.load(c).await? {
        c.adopt(&phase, now);
    }
    Ok(())
}

fn describe_event(event: &RolloutEvent) -> (&'static str, Option<String>) {
    match event {
        RolloutEvent::Promoted {
            from_percent,
            to_percent,
            ..
        } => (
            "promoted",
            Some(format!("{from_percent} % -> {to_percent} %")),
        ),
        RolloutEvent::Completed { .. } => ("completed", None),
        RolloutEvent::RolledBack { reason, .. } => ("rolled_back", Some(reason.clone())),
    }
}
