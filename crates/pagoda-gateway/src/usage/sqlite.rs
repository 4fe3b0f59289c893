//! The SQLite store of the usage ledger (the default): one `gateway_usage` table in the
//! gateway's database file, in WAL mode with a busy timeout, so the key store and other readers
//! share the file with the ledger's writer thread.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use rusqlite::{params, Connection};

use super::{to_i64, to_u64, Store, UsageError, UsageQuery, UsageRecord, UsageRow};

/// How long a statement waits for another connection's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS gateway_usage (
    id INTEGER PRIMARY KEY,
    ts_ms INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    key_name TEXT NOT NULL,
    route TEXT NOT NULL,
    version TEXT NOT NULL,
    replica TEXT NOT NULL,
    status INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    ttft_ms REAL,
    latency_ms REAL NOT NULL,
    cached INTEGER NOT NULL,
    fallback INTEGER NOT NULL,
    error TEXT
);
CREATE INDEX IF NOT EXISTS gateway_usage_ts ON gateway_usage (ts_ms);
CREATE INDEX IF NOT EXISTS gateway_usage_key_ts ON gateway_usage (key_id, ts_ms);
";

const INSERT: &str = "INSERT INTO gateway_usage (ts_ms, request_id, key_id, key_name, route, \
    version, replica, status, prompt_tokens, completion_tokens, ttft_ms, latency_ms, cached, \
    fallback, error) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)";

/// `key` matches the key id or the key name; `until_ms` is exclusive.
const AGGREGATE: &str = "SELECT key_id, MAX(key_name), route, version, COUNT(*),
    COALESCE(SUM(CASE WHEN status >= 400 OR error IS NOT NULL THEN 1 ELSE 0 END), 0),
    COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0),
    COALESCE(SUM(cached), 0)
  FROM gateway_usage
  WHERE (?1 IS NULL OR ts_ms >= ?1) AND (?2 IS NULL OR ts_ms < ?2)
    AND (?3 IS NULL OR key_id = ?3 OR key_name = ?3)
  GROUP BY key_id, route, version
  ORDER BY key_id, route, version";

const SPENT: &str = "SELECT key_id, COALESCE(SUM(prompt_tokens + completion_tokens), 0)
  FROM gateway_usage GROUP BY key_id";

/// A ledger table in one SQLite connection.
pub(super) struct SqliteStore {
    conn: Connection,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and the table.
    pub(super) fn open(path: &Path) -> Result<Self, UsageError> {
        let conn = Connection::open(path)?;
        // `journal_mode` answers with the mode in effect, so it is a query.
        let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Self::init(conn)
    }

    /// A private in-memory database (lost when the ledger is dropped).
    pub(super) fn in_memory() -> Result<Self, UsageError> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> Result<Self, UsageError> {
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self { conn })
    }

    #[cfg(test)]
    pub(super) fn journal_mode(&self) -> String {
        self.conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap_or_default()
    }
}

impl Store for SqliteStore {
    fn insert_batch(&mut self, recs: &[UsageRecord]) -> Result<(), UsageError> {
        let tx = self.conn.transaction()?;
        {
            let mut st = tx.prepare_cached(INSERT)?;
            for r in recs {
                st.execute(params![
                    to_i64(r.ts_ms),
                    r.request_id,
                    r.key_id,
                    r.key_name,
                    r.route,
                    r.version,
                    r.replica,
                    r.status,
                    to_i64(r.prompt_tokens),
                    to_i64(r.completion_tokens),
                    r.ttft_ms,
                    r.latency_ms,
                    r.cached,
                    r.fallback,
                    r.error,
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn aggregate(&mut self, q: &UsageQuery) -> Result<Vec<UsageRow>, UsageError> {
        let mut st = self.conn.prepare_cached(AGGREGATE)?;
        let rows = st.query_map(
            params![q.since_ms.map(to_i64), q.until_ms.map(to_i64), q.key],
            |r| {
                let prompt = to_u64(r.get(6)?);
                let completion = to_u64(r.get(7)?);
                Ok(UsageRow {
                    key_id: r.get(0)?,
                    key_name: r.get(1)?,
                    route: r.get(2)?,
                    version: r.get(3)?,
                    requests: to_u64(r.get(4)?),
                    errors: to_u64(r.get(5)?),
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    total_tokens: prompt.saturating_add(completion),
                    cached: to_u64(r.get(8)?),
                })
            },
        )?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    fn spent_by_key(&mut self) -> Result<HashMap<String, u64>, UsageError> {
        let mut st = self.conn.prepare_cached(SPENT)?;
        let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, to_u64(r.get(1)?))))?;
        Ok(rows.collect::<Result<HashMap<_, _>, _>>()?)
    }
}
