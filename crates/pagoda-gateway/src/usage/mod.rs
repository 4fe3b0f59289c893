//! The usage ledger: one row per request, for billing and `GET /admin/usage`.
//!
//! Owns: [`UsageRecord`] (what is recorded), the writer thread that stores records, and the
//! per-key/route/version aggregation ([`UsageLedger::aggregate`], [`UsageLedger::spent_by_key`]).
//! Storage is an embedded SQLite database by default (table `gateway_usage`, WAL mode, busy
//! timeout), or Postgres when configured (the same table, see `postgres.rs`).
//!
//! Invariants:
//! - [`UsageLedger::record`] never blocks and never fails the request: it pushes into a bounded
//!   channel; when the channel is full (the database is slower than the traffic) the record is
//!   dropped and counted in [`UsageLedger::dropped`].
//! - One dedicated thread drains the channel and inserts in batches of up to [`BATCH_MAX`]
//!   records, each batch in one transaction. A batch that fails twice is logged and counted in
//!   [`UsageLedger::failed`]; the thread keeps going. It runs at idle CPU priority while it
//!   keeps up, so a batch never delays request handling, and at normal priority while it has a
//!   backlog (`priority.rs`).
//! - [`UsageLedger::flush`] returns once every record accepted before the call is written (or
//!   failed); the admin API calls it before aggregating.
//! - The ledger stores what it is given: whether a cache hit costs tokens is the caller's
//!   choice of `prompt_tokens`/`completion_tokens` in its record. Aggregates and
//!   [`UsageLedger::spent_by_key`] sum every row, cached or not.
//! - An error row is one with `status >= 400` or an `error` set (a stream that broke after a 200).
//!
//! [`UsageLedger::aggregate`] and [`UsageLedger::spent_by_key`] run a query on the calling
//! thread (blocking I/O): from async code use [`UsageLedger::aggregate_async`] or
//! `spawn_blocking`.

mod postgres;
mod priority;
mod sqlite;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// Records the channel holds before `record` starts dropping.
pub const CHANNEL_CAPACITY: usize = 65_536;
/// Records written per transaction at most.
pub const BATCH_MAX: usize = 512;
/// How long the writer gathers records after the first of a batch before writing it.
pub const GATHER_WINDOW: std::time::Duration = std::time::Duration::from_millis(20);
/// Pause before the one retry of a failed batch.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Why the ledger could not be opened or queried.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("usage ledger (SQLite): {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("usage ledger (Postgres): {0}")]
    Postgres(String),
    #[error("cannot start the usage writer thread: {0}")]
    Thread(std::io::Error),
    #[error("usage query task failed: {0}")]
    Join(String),
}

/// One finished request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// Unix time in milliseconds when the request finished ([`now_ms`]).
    pub ts_ms: u64,
    pub request_id: String,
    pub key_id: String,
    pub key_name: String,
    /// The client-facing model name.
    pub route: String,
    /// The target (model version) that answered, `""` if none.
    pub version: String,
    /// The replica base URL that answered, `""` if none.
    pub replica: String,
    /// HTTP status sent to the client.
    pub status: u16,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Time to first token, for streamed answers.
    pub ttft_ms: Option<f64>,
    pub latency_ms: f64,
    /// Served from the response cache.
    pub cached: bool,
    /// Answered by a fallback target rather than the routed one.
    pub fallback: bool,
    /// Error kind or message when the request failed.
    pub error: Option<String>,
}

/// A filter for [`UsageLedger::aggregate`]; `None` fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageQuery {
    /// Rows with `ts_ms >= since_ms`.
    pub since_ms: Option<u64>,
    /// Rows with `ts_ms < until_ms`.
    pub until_ms: Option<u64>,
    /// Rows whose key id *or* key name equals this.
    pub key: Option<String>,
}

/// Usage of one key on one route and version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    pub key_id: String,
    /// The key's name (the greatest one seen if the key was renamed).
    pub key_name: String,
    pub route: String,
    pub version: String,
    pub requests: u64,
    /// Rows with status >= 400 or an error.
    pub errors: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// Requests answered from the response cache.
    pub cached: u64,
}

/// Unix time in milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// SQL integers are signed: values above `i64::MAX` are clamped (never reached in practice).
pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Negative sums cannot occur; they would read as 0.
pub(crate) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A database the writer thread and the queries use.
trait Store: Send {
    /// Inserts every record in one transaction.
    fn insert_batch(&mut self, recs: &[UsageRecord]) -> Result<(), UsageError>;
    fn aggregate(&mut self, q: &UsageQuery) -> Result<Vec<UsageRow>, UsageError>;
    fn spent_by_key(&mut self) -> Result<HashMap<String, u64>, UsageError>;
}

type SharedStore = Arc<Mutex<Box<dyn Store>>>;

fn shared(store: impl Store + 'static) -> SharedStore {
    Arc::new(Mutex::new(Box::new(store)))
}

fn lock(store: &SharedStore) -> MutexGuard<'_, Box<dyn Store>> {
    // A panic inside a store call leaves at most an uncommitted transaction, which the
    // connection rolls back, so a poisoned lock is still usable.
    store.lock().unwrap_or_else(|e| e.into_inner())
}

/// The ledger: a bounded channel into a writer thread, plus queries.
pub struct UsageLedger {
    tx: SyncSender<UsageRecord>,
    /// The connection queries use: a second one next to the writer's for a database file or
    /// Postgres (a long query does not stall the writer), the writer's own for in-memory.
    store: SharedStore,
    /// The writer thread's CPU priority (raised while `flush` waits).
    writer_priority: Arc<priority::WriterPriority>,
    /// Records accepted into the channel (shared with the writer, which compares it with what
    /// it has written to know its backlog).
    accepted: Arc<AtomicU64>,
    dropped: AtomicU64,
    failed: Arc<AtomicU64>,
    /// Records the writer has processed (written or failed), in channel order.
    processed: watch::Receiver<u64>,
}

impl std::fmt::Debug for UsageLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageLedger")
            .field("accepted", &self.accepted.load(Ordering::Relaxed))
            .field("dropped", &self.dropped.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl UsageLedger {
    /// A ledger in the SQLite file at `path` (created if missing).
    pub fn sqlite(path: &Path) -> Result<Self, UsageError> {
        let writer = sqlite::SqliteStore::open(path)?;
        let reader = sqlite::SqliteStore::open(path)?;
        Self::start(shared(writer), shared(reader), CHANNEL_CAPACITY)
    }

    /// A ledger in a private in-memory SQLite database (tests, or a gateway without storage).
    pub fn in_memory() -> Result<Self, UsageError> {
        let store = shared(sqlite::SqliteStore::in_memory()?);
        Self::start(store.clone(), store, CHANNEL_CAPACITY)
    }

    /// A ledger in Postgres (`postgres://user:pass@host:port/db`, no TLS); the table is
    /// created if missing. Blocking: call before serving, or from `spawn_blocking`.
    pub fn postgres(url: &str) -> Result<Self, UsageError> {
        let writer = postgres::PostgresStore::connect(url)?;
        let reader = postgres::PostgresStore::connect(url)?;
        Self::start(shared(writer), shared(reader), CHANNEL_CAPACITY)
    }

    fn start(writer: SharedStore, store: SharedStore, capacity: usize) -> Result<Self, UsageError> {
        let (tx, rx) = mpsc::sync_channel(capacity);
        let failed = Arc::new(AtomicU64::new(0));
        let (done_tx, done_rx) = watch::channel(0u64);
        let accepted = Arc::new(AtomicU64::new(0));
        let writer_priority = Arc::new(priority::WriterPriority::default());
        let counters = WriterCounters {
            accepted: accepted.clone(),
            failed: failed.clone(),
            priority: writer_priority.clone(),
        };
        std::thread::Builder::new()
            .name("pagoda-usage-writer".into())
            .spawn(move || writer_loop(rx, writer, done_tx, counters))
            .map_err(UsageError::Thread)?;
        Ok(Self {
            tx,
            store,
            writer_priority,
            accepted,
            dropped: AtomicU64::new(0),
            failed,
            processed: done_rx,
        })
    }

    /// Queues a record for writing; never blocks. A full channel drops it (see `dropped`).
    pub fn record(&self, rec: UsageRecord) {
        match self.tx.try_send(rec) {
            Ok(()) => {
                self.accepted.fetch_add(1, Ordering::SeqCst);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(dropped = n, "usage ledger is behind: records dropped");
                }
            }
        }
    }

    /// Records dropped because the channel was full (or the writer had stopped).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Records the database refused (logged), e.g. a disk full or a lock held too long.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Waits until every record accepted before this call is written (or failed).
    /// Returns at once if the writer thread has stopped.
    pub async fn flush(&self) {
        let target = self.accepted.load(Ordering::SeqCst);
        let mut rx = self.processed.clone();
        if *rx.borrow() >= target {
            return;
        }
        let _urgent = self.writer_priority.urgent();
        let _ = rx.wait_for(|&done| done >= target).await;
    }

    /// Usage grouped by key, route and version (blocking: see the module doc).
    pub fn aggregate(&self, q: &UsageQuery) -> Result<Vec<UsageRow>, UsageError> {
        lock(&self.store).aggregate(q)
    }

    /// Total tokens (prompt + completion) per key id over all time (blocking).
    pub fn spent_by_key(&self) -> Result<HashMap<String, u64>, UsageError> {
        lock(&self.store).spent_by_key()
    }

    /// [`UsageLedger::flush`], then [`UsageLedger::aggregate`] on a blocking thread.
    pub async fn aggregate_async(&self, q: UsageQuery) -> Result<Vec<UsageRow>, UsageError> {
        self.flush().await;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || lock(&store).aggregate(&q))
            .await
            .map_err(|e| UsageError::Join(e.to_string()))?
    }

    #[cfg(test)]
    fn with_store<R>(&self, f: impl FnOnce(&mut dyn Store) -> R) -> R {
        f(lock(&self.store).as_mut())
    }
}

/// The ledger's state the writer thread shares: counters it reads (accepted) or bumps
/// (failed), and its CPU priority.
struct WriterCounters {
    accepted: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    priority: Arc<priority::WriterPriority>,
}

/// Drains the channel in batches until every sender is gone, at idle CPU priority unless it
/// has fallen behind (see `priority.rs`).
fn writer_loop(
    rx: Receiver<UsageRecord>,
    store: SharedStore,
    processed: watch::Sender<u64>,
    counters: WriterCounters,
) {
    let mut done = 0u64;
    counters.priority.register_writer();
    while let Ok(first) = rx.recv() {
        let mut batch = Vec::with_capacity(64);
        batch.push(first);
        // Gather for a moment, asleep rather than waiting on the channel: senders then never
        // wake this thread (no futex wake-up and context switch per request on the request
        // path's cores), and one transaction covers a whole GATHER_WINDOW of requests.
        std::thread::sleep(GATHER_WINDOW);
        while batch.len() < BATCH_MAX {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        write_batch(&store, &batch, &counters.failed);
        done += batch.len() as u64;
        processed.send_replace(done);
        let backlog = counters
            .accepted
            .load(Ordering::SeqCst)
            .saturating_sub(done);
        counters.priority.after_batch(backlog);
    }
}

/// Inserts a batch, retrying once after a pause; a second failure drops it (logged).
fn write_batch(store: &SharedStore, batch: &[UsageRecord], failed: &AtomicU64) {
    let first = lock(store).insert_batch(batch);
    let Err(e) = first else { return };
    tracing::warn!(error = %e, records = batch.len(), "usage batch failed; retrying once");
    std::thread::sleep(RETRY_PAUSE);
    if let Err(e) = lock(store).insert_batch(batch) {
        failed.fetch_add(batch.len() as u64, Ordering::Relaxed);
        tracing::error!(error = %e, records = batch.len(), "usage batch lost");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Instant;

    fn rec(key: &str, route: &str, version: &str, status: u16, p: u64, c: u64) -> UsageRecord {
        UsageRecord {
            ts_ms: 1_000,
            request_id: format!("r-{key}-{route}"),
            key_id: format!("id-{key}"),
            key_name: key.into(),
            route: route.into(),
            version: version.into(),
            replica: "http://a:1".into(),
            status,
            prompt_tokens: p,
            completion_tokens: c,
            ttft_ms: Some(12.5),
            latency_ms: 100.0,
            ..UsageRecord::default()
        }
    }

    fn row<'a>(rows: &'a [UsageRow], key: &str, route: &str, version: &str) -> &'a UsageRow {
        rows.iter()
            .find(|r| r.key_name == key && r.route == route && r.version == version)
            .unwrap()
    }

    #[tokio::test]
    async fn aggregation_sums_across_keys_routes_and_versions() {
        let l = UsageLedger::in_memory().unwrap();
        l.record(rec("alice", "chat", "v1", 200, 10, 5));
        l.record(rec("alice", "chat", "v1", 200, 20, 7));
        l.record(rec("alice", "chat", "v2", 502, 3, 0));
        l.record(rec("bob", "chat", "v1", 200, 1, 1));
        let mut cached = rec("bob", "code", "v1", 200, 4, 4);
        cached.cached = true;
        l.record(cached);
        let mut broke = rec("bob", "code", "v1", 200, 2, 2);
        broke.error = Some("stream_broken".into());
        l.record(broke);
        l.flush().await;
        let rows = l.aggregate(&UsageQuery::default()).unwrap();
        assert_eq!(rows.len(), 4);
        let a1 = row(&rows, "alice", "chat", "v1");
        assert_eq!(
            (
                a1.requests,
                a1.errors,
                a1.prompt_tokens,
                a1.completion_tokens
            ),
            (2, 0, 30, 12)
        );
        assert_eq!(a1.total_tokens, 42);
        assert_eq!(a1.key_id, "id-alice");
        let a2 = row(&rows, "alice", "chat", "v2");
        assert_eq!((a2.requests, a2.errors, a2.total_tokens), (1, 1, 3));
        let b2 = row(&rows, "bob", "code", "v1");
        assert_eq!(
            (b2.requests, b2.errors, b2.cached, b2.total_tokens),
            (2, 1, 1, 12)
        );
        let spent = l.spent_by_key().unwrap();
        assert_eq!(spent.get("id-alice"), Some(&45));
        assert_eq!(spent.get("id-bob"), Some(&14));
        assert_eq!(spent.len(), 2);
    }

    #[tokio::test]
    async fn query_filters_by_time_window_and_key() {
        let l = UsageLedger::in_memory().unwrap();
        for (ts, key) in [(100, "a"), (200, "a"), (300, "b"), (400, "a")] {
            let mut r = rec(key, "chat", "v1", 200, 1, 0);
            r.ts_ms = ts;
            l.record(r);
        }
        l.flush().await;
        let q = |since, until, key: Option<&str>| UsageQuery {
            since_ms: since,
            until_ms: until,
            key: key.map(str::to_string),
        };
        let total = |rows: Vec<UsageRow>| rows.iter().map(|r| r.requests).sum::<u64>();
        assert_eq!(total(l.aggregate(&q(Some(200), None, None)).unwrap()), 3);
        assert_eq!(
            total(l.aggregate(&q(None, Some(300), None)).unwrap()),
            2,
            "until is exclusive"
        );
        assert_eq!(
            total(l.aggregate(&q(Some(150), Some(450), Some("a"))).unwrap()),
            2
        );
        assert_eq!(
            total(l.aggregate(&q(None, None, Some("id-b"))).unwrap()),
            1,
            "by key id"
        );
        assert!(l
            .aggregate(&q(None, None, Some("nobody")))
            .unwrap()
            .is_empty());
        assert!(l
            .aggregate(&q(Some(500), Some(100), None))
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn record_never_blocks_when_the_writer_is_slow() {
        let store = shared(sqlite::SqliteStore::in_memory().unwrap());
        let l = UsageLedger::start(store.clone(), store, 4).unwrap();
        // Hold the store: the writer blocks on its first batch, the channel fills up.
        let guard = lock(&l.store);
        let t = Instant::now();
        for i in 0..1000 {
            l.record(rec(&format!("k{i}"), "chat", "v1", 200, 1, 1));
        }
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "record blocked: {:?}",
            t.elapsed()
        );
        let accepted = l.accepted.load(Ordering::SeqCst);
        assert!(l.dropped() > 0);
        assert_eq!(accepted + l.dropped(), 1000);
        assert!(accepted <= 4 + BATCH_MAX as u64);
        drop(guard);
        l.flush().await;
        let rows = l.aggregate(&UsageQuery::default()).unwrap();
        assert_eq!(rows.iter().map(|r| r.requests).sum::<u64>(), accepted);
        assert_eq!(l.failed(), 0);
    }

    #[tokio::test]
    async fn flush_makes_records_visible() {
        let l = UsageLedger::in_memory().unwrap();
        for _ in 0..2000 {
            l.record(rec("a", "chat", "v1", 200, 1, 2));
        }
        l.flush().await;
        let rows = l.aggregate(&UsageQuery::default()).unwrap();
        assert_eq!(rows[0].requests, 2000);
        assert_eq!(rows[0].total_tokens, 6000);
        // aggregate_async flushes first itself.
        l.record(rec("a", "chat", "v1", 200, 1, 2));
        let rows = l.aggregate_async(UsageQuery::default()).await.unwrap();
        assert_eq!(rows[0].requests, 2001);
        // An idle flush returns at once.
        tokio::time::timeout(Duration::from_secs(1), l.flush())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn sqlite_file_uses_wal_and_persists_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.db");
        {
            let l = UsageLedger::sqlite(&path).unwrap();
            let mut r = rec("a", "chat", "v1", 200, 5, 5);
            r.ttft_ms = None;
            r.error = Some("x".into());
            l.record(r);
            l.flush().await;
        }
        let l = UsageLedger::sqlite(&path).unwrap();
        let rows = l.aggregate(&UsageQuery::default()).unwrap();
        assert_eq!(
            (rows[0].requests, rows[0].errors, rows[0].total_tokens),
            (1, 1, 10)
        );
        let store = sqlite::SqliteStore::open(&path).unwrap();
        assert_eq!(store.journal_mode(), "wal");
    }

    #[tokio::test]
    async fn file_ledger_reads_while_another_connection_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.db");
        let l = UsageLedger::sqlite(&path).unwrap();
        l.record(rec("a", "chat", "v1", 200, 1, 1));
        l.flush().await;
        // An open write transaction elsewhere (the key store, say) does not block queries (WAL).
        let mut other = rusqlite::Connection::open(&path).unwrap();
        let tx = other
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        tx.execute("DELETE FROM gateway_usage", []).unwrap();
        let t = Instant::now();
        assert_eq!(l.aggregate(&UsageQuery::default()).unwrap()[0].requests, 1);
        assert!(t.elapsed() < Duration::from_secs(1));
        tx.rollback().unwrap();
    }

    #[test]
    fn ledger_is_shareable_between_tasks() {
        fn is<T: Send + Sync>() {}
        is::<UsageLedger>();
    }

    #[test]
    fn unopenable_path_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = UsageLedger::sqlite(&dir.path().join("missing/dir/gw.db")).unwrap_err();
        assert!(matches!(err, UsageError::Sqlite(_)), "{err}");
    }

    #[tokio::test]
    async fn huge_token_counts_do_not_wrap() {
        let l = UsageLedger::in_memory().unwrap();
        l.record(rec("a", "chat", "v1", 200, u64::MAX, 0));
        l.flush().await;
        let rows = l.aggregate(&UsageQuery::default()).unwrap();
        assert_eq!(rows[0].prompt_tokens, i64::MAX as u64);
        l.with_store(|s| assert_eq!(s.spent_by_key().unwrap()["id-a"], i64::MAX as u64));
    }

    /// The test Postgres URL, or `None` (with a notice) when `PAGODA_TEST_POSTGRES` is unset.
    fn test_postgres() -> Option<String> {
        match std::env::var("PAGODA_TEST_POSTGRES") {
            Ok(u) if !u.is_empty() => Some(u),
            _ => {
                eprintln!("PAGODA_TEST_POSTGRES unset: skipping the Postgres ledger test");
                None
            }
        }
    }

    #[tokio::test]
    async fn postgres_ledger_records_and_aggregates() {
        let Some(url) = test_postgres() else { return };
        let l = UsageLedger::postgres(&url).unwrap();
        // Rows of earlier runs stay in the table: use keys of this run only.
        let run = format!("{}-{}", std::process::id(), now_ms());
        let (a, b) = (format!("a{run}"), format!("b{run}"));
        l.record(rec(&a, "chat", "v1", 200, 10, 5));
        l.record(rec(&a, "chat", "v1", 503, 1, 0));
        let mut c = rec(&a, "chat", "v2", 200, 2, 2);
        c.cached = true;
        c.ttft_ms = None;
        l.record(c);
        l.record(rec(&b, "code", "v1", 200, 7, 7));
        l.flush().await;
        assert_eq!(l.failed(), 0);
        let q = UsageQuery {
            key: Some(a.clone()),
            ..UsageQuery::default()
        };
        let rows = l.aggregate(&q).unwrap();
        assert_eq!(rows.len(), 2);
        let v1 = row(&rows, &a, "chat", "v1");
        assert_eq!(
            (v1.requests, v1.errors, v1.total_tokens, v1.cached),
            (2, 1, 16, 0)
        );
        let v2 = row(&rows, &a, "chat", "v2");
        assert_eq!((v2.requests, v2.cached, v2.total_tokens), (1, 1, 4));
        let windowed = UsageQuery {
            since_ms: Some(2_000),
            ..q.clone()
        };
        assert!(l.aggregate(&windowed).unwrap().is_empty());
        let spent = l.spent_by_key().unwrap();
        assert_eq!(spent[&format!("id-{a}")], 20);
        assert_eq!(spent[&format!("id-{b}")], 14);
        let via_async = l.aggregate_async(q).await.unwrap();
        assert_eq!(via_async, rows);
    }

    #[test]
    fn postgres_unreachable_is_an_error() {
        let err =
            UsageLedger::postgres("postgres://nobody@127.0.0.1:1/x?connect_timeout=1").unwrap_err();
        assert!(matches!(err, UsageError::Postgres(_)), "{err}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn aggregate_totals_equal_the_recorded_sums(
            recs in proptest::collection::vec((0..3u8, 0..2u8, 0..2u8, 0..1000u64, 0..1000u64, any::<bool>()), 0..40)
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let l = UsageLedger::in_memory().unwrap();
            let mut want: HashMap<(String, String, String), (u64, u64, u64)> = HashMap::new();
            for (k, r, v, p, c, err) in &recs {
                let (k, r, v) = (format!("k{k}"), format!("r{r}"), format!("v{v}"));
                l.record(rec(&k, &r, &v, if *err { 500 } else { 200 }, *p, *c));
                let e = want.entry((k, r, v)).or_default();
                e.0 += 1;
                e.1 += p + c;
                e.2 += u64::from(*err);
            }
            rt.block_on(l.flush());
            let rows = l.aggregate(&UsageQuery::default()).unwrap();
            prop_assert_eq!(rows.len(), want.len());
            for row in &rows {
                let w = want[&(row.key_name.clone(), row.route.clone(), row.version.clone())];
                prop_assert_eq!((row.requests, row.total_tokens, row.errors), w);
            }
            let spent: u64 = l.spent_by_key().unwrap().values().sum();
            prop_assert_eq!(spent, recs.iter().map(|r| r.3 + r.4).sum::<u64>());
        }
    }
}
