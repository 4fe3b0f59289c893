//! The Postgres store of the usage ledger (when `storage.postgres` is set): the same
//! `gateway_usage` table as SQLite, written by the ledger's writer thread with the synchronous
//! `postgres` client. Plain TCP only (no TLS). A dropped connection is reopened before the next
//! batch or query.
//!
//! The synchronous client runs its own small runtime, which must not be entered from a Tokio
//! worker thread: calls made from inside a runtime run on a scoped helper thread.

use std::collections::HashMap;

use postgres::{Client, NoTls};

use super::{to_i64, to_u64, Store, UsageError, UsageQuery, UsageRecord, UsageRow};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS gateway_usage (
    id BIGSERIAL PRIMARY KEY,
    ts_ms BIGINT NOT NULL,
    request_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    key_name TEXT NOT NULL,
    route TEXT NOT NULL,
    version TEXT NOT NULL,
    replica TEXT NOT NULL,
    status INTEGER NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    ttft_ms DOUBLE PRECISION,
    latency_ms DOUBLE PRECISION NOT NULL,
    cached BOOLEAN NOT NULL,
    fallback BOOLEAN NOT NULL,
    error TEXT
);
CREATE INDEX IF NOT EXISTS gateway_usage_ts ON gateway_usage (ts_ms);
CREATE INDEX IF NOT EXISTS gateway_usage_key_ts ON gateway_usage (key_id, ts_ms);
";

const INSERT: &str = "INSERT INTO gateway_usage (ts_ms, request_id, key_id, key_name, route, \
    version, replica, status, prompt_tokens, completion_tokens, ttft_ms, latency_ms, cached, \
    fallback, error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";

const AGGREGATE: &str = "SELECT key_id, MAX(key_name), route, version, COUNT(*)::BIGINT,
    COALESCE(SUM(CASE WHEN status >= 400 OR error IS NOT NULL THEN 1 ELSE 0 END), 0)::BIGINT,
    COALESCE(SUM(prompt_tokens), 0)::BIGINT, COALESCE(SUM(completion_tokens), 0)::BIGINT,
    COALESCE(SUM(CASE WHEN cached THEN 1 ELSE 0 END), 0)::BIGINT
  FROM gateway_usage
  WHERE ($1::BIGINT IS NULL OR ts_ms >= $1) AND ($2::BIGINT IS NULL OR ts_ms < $2)
    AND ($3::TEXT IS NULL OR key_id = $3 OR key_name = $3)
  GROUP BY key_id, route, version
  ORDER BY key_id, route, version";

const SPENT: &str = "SELECT key_id, COALESCE(SUM(prompt_tokens + completion_tokens), 0)::BIGINT
  FROM gateway_usage GROUP BY key_id";

fn pg(e: postgres::Error) -> UsageError {
    UsageError::Postgres(e.to_string())
}

/// Runs `f` on a scoped helper thread when called from inside a Tokio runtime.
fn off_runtime<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// A ledger table in Postgres.
pub(super) struct PostgresStore {
    url: String,
    /// Always `Some` until dropped (see the `Drop` impl).
    client: Option<Client>,
}

impl PostgresStore {
    /// Connects and creates the table if needed.
    pub(super) fn connect(url: &str) -> Result<Self, UsageError> {
        let client = off_runtime(|| Self::open(url))?;
        Ok(Self {
            url: url.to_string(),
            client: Some(client),
        })
    }

    fn open(url: &str) -> Result<Client, UsageError> {
        let mut client = Client::connect(url, NoTls).map_err(pg)?;
        client.batch_execute(SCHEMA).map_err(pg)?;
        Ok(client)
    }

    /// The client, reconnected first if the connection was lost.
    fn client(&mut self) -> Result<&mut Client, UsageError> {
        let lost = self.client.as_ref().is_none_or(Client::is_closed);
        if lost {
            tracing::warn!("usage ledger: Postgres connection lost; reconnecting");
            self.client = Some(Self::open(&self.url)?);
        }
        self.client
            .as_mut()
            .ok_or_else(|| UsageError::Postgres("no connection".into()))
    }

    fn insert_inner(&mut self, recs: &[UsageRecord]) -> Result<(), UsageError> {
        let mut tx = self.client()?.transaction().map_err(pg)?;
        let st = tx.prepare(INSERT).map_err(pg)?;
        for r in recs {
            tx.execute(
                &st,
                &[
                    &to_i64(r.ts_ms),
                    &r.request_id,
                    &r.key_id,
                    &r.key_name,
                    &r.route,
                    &r.version,
                    &r.replica,
                    &i32::from(r.status),
                    &to_i64(r.prompt_tokens),
                    &to_i64(r.completion_tokens),
                    &r.ttft_ms,
                    &r.latency_ms,
                    &r.cached,
                    &r.fallback,
                    &r.error,
                ],
            )
            .map_err(pg)?;
        }
        tx.commit().map_err(pg)
    }

    fn aggregate_inner(&mut self, q: &UsageQuery) -> Result<Vec<UsageRow>, UsageError> {
        let since = q.since_ms.map(to_i64);
        let until = q.until_ms.map(to_i64);
        let rows = self
            .client()?
            .query(AGGREGATE, &[&since, &until, &q.key])
            .map_err(pg)?;
        rows.iter()
            .map(|r| {
                let prompt = to_u64(r.try_get(6).map_err(pg)?);
                let completion = to_u64(r.try_get(7).map_err(pg)?);
                Ok(UsageRow {
                    key_id: r.try_get(0).map_err(pg)?,
                    key_name: r.try_get(1).map_err(pg)?,
                    route: r.try_get(2).map_err(pg)?,
                    version: r.try_get(3).map_err(pg)?,
                    requests: to_u64(r.try_get(4).map_err(pg)?),
                    errors: to_u64(r.try_get(5).map_err(pg)?),
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    total_tokens: prompt.saturating_add(completion),
                    cached: to_u64(r.try_get(8).map_err(pg)?),
                })
            })
            .collect()
    }

    fn spent_inner(&mut self) -> Result<HashMap<String, u64>, UsageError> {
        let rows = self.client()?.query(SPENT, &[]).map_err(pg)?;
        rows.iter()
            .map(|r| Ok((r.try_get(0).map_err(pg)?, to_u64(r.try_get(1).map_err(pg)?))))
            .collect()
    }
}

impl Drop for PostgresStore {
    /// Closing the client blocks on its runtime, which must happen off any Tokio runtime.
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            off_runtime(move || drop(client));
        }
    }
}

impl Store for PostgresStore {
    fn insert_batch(&mut self, recs: &[UsageRecord]) -> Result<(), UsageError> {
        off_runtime(|| self.insert_inner(recs))
    }

    fn aggregate(&mut self, q: &UsageQuery) -> Result<Vec<UsageRow>, UsageError> {
        off_runtime(|| self.aggregate_inner(q))
    }

    fn spent_by_key(&mut self) -> Result<HashMap<String, u64>, UsageError> {
        off_runtime(|| self.spent_inner())
    }
}
