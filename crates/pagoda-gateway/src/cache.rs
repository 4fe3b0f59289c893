//! Exact-match response cache for deterministic requests.
//!
//! Owns: deciding whether a request may be cached and its key ([`cache_key`]), the stored form
//! of an answer ([`CachedResponse`]), and the backends ([`ResponseCache`]: in memory, Redis, or
//! disabled).
//!
//! Invariants:
//! - Only deterministic requests get a key: `temperature == 0`, or a `seed` is set. A request
//!   without `temperature` runs at the backend default (1.0) and is not cached unless it has a
//!   `seed`; `n > 1` without a seed is not cached.
//! - The key is the SHA-256 of the route model, the key scope and a canonical form of the body
//!   (object keys sorted recursively, integral floats written as integers), so field order and
//!   `0` vs `0.0` do not matter. Cached answers are **shared between all API keys of the same
//!   scope** (the lead passes the key's tier, or `""`: then every key shares the cache).
//! - Left out of the key because they do not change the answer: `model` (the route model is
//!   part of the key instead), `user` (an end-user id for abuse tracking), and `stream_options`
//!   when the request is not streamed. `stream` is part of the key (a streamed answer is stored
//!   as its SSE bytes, a non-streamed one as JSON), and so is `stream_options` of a streamed one
//!   (`include_usage` adds a chunk).
//! - The cache never fails a request: a Redis error or timeout is logged and is a miss (get) or
//!   a skipped store (put). Entries larger than `max_entry_bytes` are not stored.
//! - Memory backend: at most `max_entries` entries and [`MEMORY_MAX_TOTAL_BYTES`] bytes; a
//!   store into a full cache first drops expired entries, then least recently used ones. Every
//!   operation is O(log n).
//!
//! The cache sits in front of routing: a hit may have been answered by any version of the
//! route, so a hit should count for neither side of a canary rollout. A caller serving several
//! endpoints with different answer shapes (chat and text completions) folds the endpoint into
//! `route_model` (e.g. `chat:<model>`), so a body valid for both cannot cross over.
//!
//! Headers: a client sends [`NO_CACHE_HEADER`] (`x-pagoda-cache: no-cache` or `bypass`) to skip
//! both lookup and store. Every response of an enabled cache carries [`CACHE_STATUS_HEADER`]
//! (`x-pagoda-cache-status`): `hit` (served from the cache), `miss` (looked up, not found; the
//! answer may be stored), `bypass` (the client opted out or the request is not deterministic).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use redis::AsyncCommands;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::{CacheBackend, CacheConfig, RedisConfig};

/// Request header a client sets to `no-cache` or `bypass` to skip lookup and store.
pub const NO_CACHE_HEADER: &str = "x-pagoda-cache";
/// Response header telling the client `hit`, `miss` or `bypass`.
pub const CACHE_STATUS_HEADER: &str = "x-pagoda-cache-status";

/// A Redis operation taking longer than this is abandoned (a miss, or a skipped store).
const REDIS_OP_TIMEOUT: Duration = Duration::from_millis(250);
/// Connecting to Redis at startup gives up after this long.
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Memory backend: bytes all entries may hold together (besides `max_entries`), so a full
/// cache of large answers stays bounded (10 000 x 256 KiB would be 2.5 GiB).
pub const MEMORY_MAX_TOTAL_BYTES: usize = 256 * 1024 * 1024;
/// Version byte of the stored encoding; bump when [`CachedResponse::encode`] changes.
const ENCODING_VERSION: u8 = 1;

/// Why the cache could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache.backend = \"redis\" needs a [redis] section")]
    MissingRedis,
    #[error("cannot connect to the cache Redis at {url}: {message}")]
    Redis { url: String, message: String },
}

/// The outcome of a cache lookup, as shown in [`CACHE_STATUS_HEADER`] and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheStatus {
    Hit,
    Miss,
    Bypass,
}

impl CacheStatus {
    /// `hit`, `miss` or `bypass`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "hit",
            CacheStatus::Miss => "miss",
            CacheStatus::Bypass => "bypass",
        }
    }

    /// The value of [`CACHE_STATUS_HEADER`].
    pub fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(self.as_str())
    }
}

/// True when the client asked to skip the cache (`x-pagoda-cache: no-cache` or `bypass`,
/// case-insensitive, also inside a comma-separated list).
pub fn bypass_requested(headers: &HeaderMap) -> bool {
    headers.get_all(NO_CACHE_HEADER).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',').any(|t| {
                let t = t.trim();
                t.eq_ignore_ascii_case("no-cache") || t.eq_ignore_ascii_case("bypass")
            })
        })
    })
}

/// True when the request's answer is fully determined by its body (see the module doc).
fn is_deterministic(body: &serde_json::Map<String, Value>) -> bool {
    let present = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    if present("seed") {
        return true;
    }
    let n_many = body
        .get("n")
        .and_then(Value::as_f64)
        .is_some_and(|n| n > 1.0);
    let temp_zero = body.get("temperature").and_then(Value::as_f64) == Some(0.0);
    temp_zero && !n_many
}

/// The cache key of a request, or `None` when it must not be cached (not deterministic, or the
/// body is not a JSON object). `key_scope` partitions the cache (the key's tier, or `""`).
pub fn cache_key(route_model: &str, key_scope: &str, body: &Value) -> Option<String> {
    let obj = body.as_object()?;
    if !is_deterministic(obj) {
        return None;
    }
    let mut fields = obj.clone();
    let stream = fields
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    fields.remove("model");
    fields.remove("user");
    fields.insert("stream".into(), Value::Bool(stream));
    if !stream {
        fields.remove("stream_options");
    }
    let mut canon = String::new();
    write_canonical(&Value::Object(fields), &mut canon);
    let mut h = Sha256::new();
    h.update(b"pagoda-gw-cache-v1");
    for part in [route_model, key_scope, canon.as_str()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    Some(hex::encode(h.finalize()))
}

/// Writes `v` as JSON with object keys sorted (whatever serde_json's map order is) and
/// integral floats written as integers.
fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, &Value> = m.iter().collect();
            out.push('{');
            for (i, (k, val)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(val, out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, val) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(val, out);
            }
            out.push(']');
        }
        Value::Number(n) if n.is_f64() => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                out.push_str(&(f as i64).to_string())
            }
            _ => out.push_str(&n.to_string()),
        },
        other => out.push_str(&other.to_string()),
    }
}

/// A stored answer (only 200 responses are cached; the caller checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedResponse {
    pub status: u16,
    pub content_type: String,
    /// The JSON body, or the SSE bytes of a streamed answer.
    pub body: Bytes,
}

impl CachedResponse {
    /// Bytes the entry holds (what `max_entry_bytes` limits).
    pub fn size(&self) -> usize {
        self.body.len() + self.content_type.len()
    }

    /// Binary form stored in Redis: version, status, content type length and text, body.
    fn encode(&self) -> Vec<u8> {
        let ct = self.content_type.as_bytes();
        let ct_len = u16::try_from(ct.len()).unwrap_or(u16::MAX);
        let mut out = Vec::with_capacity(5 + ct.len() + self.body.len());
        out.push(ENCODING_VERSION);
        out.extend_from_slice(&self.status.to_be_bytes());
        out.extend_from_slice(&ct_len.to_be_bytes());
        out.extend_from_slice(&ct[..usize::from(ct_len)]);
        out.extend_from_slice(&self.body);
        out
    }

    /// Inverse of [`CachedResponse::encode`]; `None` for anything malformed.
    fn decode(bytes: &[u8]) -> Option<Self> {
        let (&version, rest) = bytes.split_first()?;
        if version != ENCODING_VERSION || rest.len() < 4 {
            return None;
        }
        let status = u16::from_be_bytes([rest[0], rest[1]]);
        let ct_len = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
        let rest = &rest[4..];
        if rest.len() < ct_len {
            return None;
        }
        let content_type = std::str::from_utf8(&rest[..ct_len]).ok()?.to_string();
        Some(Self {
            status,
            content_type,
            body: Bytes::copy_from_slice(&rest[ct_len..]),
        })
    }
}

/// The configured cache backend.
pub enum ResponseCache {
    Memory(MemoryCache),
    Redis(RedisCache),
    Disabled,
}

impl std::fmt::Debug for ResponseCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            ResponseCache::Memory(_) => "Memory",
            ResponseCache::Redis(_) => "Redis",
            ResponseCache::Disabled => "Disabled",
        };
        f.debug_tuple("ResponseCache").field(&kind).finish()
    }
}

impl ResponseCache {
    /// Builds the backend `config` asks for; Redis is connected here (a bad URL or an
    /// unreachable server within 3 s is an error, so a misconfiguration shows at startup).
    pub async fn from_config(
        config: &CacheConfig,
        redis: Option<&RedisConfig>,
    ) -> Result<Self, CacheError> {
        if !config.enabled {
            return Ok(ResponseCache::Disabled);
        }
        let ttl = Duration::from_secs(config.ttl_s);
        match config.backend {
            CacheBackend::Memory => Ok(ResponseCache::Memory(MemoryCache::new(
                config.max_entries,
                ttl,
                config.max_entry_bytes,
            ))),
            CacheBackend::Redis => {
                let rc = redis.ok_or(CacheError::MissingRedis)?;
                let cache = RedisCache::connect(rc, ttl, config.max_entry_bytes).await?;
                Ok(ResponseCache::Redis(cache))
            }
        }
    }

    /// False for [`ResponseCache::Disabled`]: then the caller sends no cache header at all.
    pub fn is_enabled(&self) -> bool {
        !matches!(self, ResponseCache::Disabled)
    }

    /// The stored answer for `key`, if any and not expired. Never fails: errors are misses.
    pub async fn get(&self, key: &str) -> Option<CachedResponse> {
        match self {
            ResponseCache::Memory(m) => m.get(key),
            ResponseCache::Redis(r) => r.get(key).await,
            ResponseCache::Disabled => None,
        }
    }

    /// Stores an answer for the configured TTL (skipped when larger than `max_entry_bytes`).
    /// Never fails: errors are logged.
    pub async fn put(&self, key: &str, resp: &CachedResponse) {
        match self {
            ResponseCache::Memory(m) => m.put(key, resp),
            ResponseCache::Redis(r) => r.put(key, resp).await,
            ResponseCache::Disabled => {}
        }
    }
}

struct MemEntry {
    resp: CachedResponse,
    expires: Instant,
    /// Position in `by_use` (and tie-breaker in `by_expiry`).
    tick: u64,
}

#[derive(Default)]
struct MemInner {
    entries: HashMap<String, MemEntry>,
    /// Last-use tick -> key: the first entry is the least recently used.
    by_use: BTreeMap<u64, String>,
    /// (expiry, insertion tick) -> key: the first entry expires first.
    by_expiry: BTreeMap<(Instant, u64), String>,
    next_tick: u64,
    /// Sum of the entries' sizes.
    bytes: usize,
}

impl MemInner {
    fn tick(&mut self) -> u64 {
        self.next_tick += 1;
        self.next_tick
    }

    fn remove(&mut self, key: &str) -> Option<MemEntry> {
        let e = self.entries.remove(key)?;
        self.bytes -= e.resp.size();
        self.by_use.remove(&e.tick);
        self.by_expiry.remove(&(e.expires, e.tick));
        Some(e)
    }

    /// Drops every expired entry.
    fn purge_expired(&mut self, now: Instant) {
        while let Some((&(exp, _), key)) = self.by_expiry.first_key_value() {
            if exp > now {
                break;
            }
            let key = key.clone();
            self.remove(&key);
        }
    }

    fn evict_lru(&mut self) {
        if let Some((_, key)) = self.by_use.first_key_value() {
            let key = key.clone();
            self.remove(&key);
        }
    }
}

/// In-process cache bounded by entry count, with TTL and LRU eviction.
pub struct MemoryCache {
    inner: Mutex<MemInner>,
    max_entries: usize,
    ttl: Duration,
    max_entry_bytes: usize,
    max_total_bytes: usize,
}

impl MemoryCache {
    /// A cache of at most `max_entries` entries kept for `ttl`, each at most `max_entry_bytes`.
    pub fn new(max_entries: usize, ttl: Duration, max_entry_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(MemInner::default()),
            max_entries,
            ttl,
            max_entry_bytes,
            max_total_bytes: MEMORY_MAX_TOTAL_BYTES,
        }
    }

    /// Sets the bound on all entries' bytes together (default [`MEMORY_MAX_TOTAL_BYTES`]).
    pub fn with_max_total_bytes(mut self, max_total_bytes: usize) -> Self {
        self.max_total_bytes = max_total_bytes;
        self
    }

    /// Bytes all entries hold together.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemInner> {
        // A panic while holding the lock cannot leave the maps inconsistent in a way that
        // breaks later calls worse than a stale entry, so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Entries currently held (expired ones included until purged).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// True when the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entry for `key` unless expired; marks it most recently used.
    pub fn get(&self, key: &str) -> Option<CachedResponse> {
        self.get_at(key, Instant::now())
    }

    fn get_at(&self, key: &str, now: Instant) -> Option<CachedResponse> {
        let mut g = self.lock();
        let (expires, old_tick) = {
            let e = g.entries.get(key)?;
            (e.expires, e.tick)
        };
        if expires <= now {
            g.remove(key);
            return None;
        }
        // Move to the most-recently-used end; `by_expiry` is re-keyed with the new tick so
        // that `remove` finds the entry under (expires, tick).
        let tick = g.tick();
        g.by_use.remove(&old_tick);
        g.by_use.insert(tick, key.to_string());
        g.by_expiry.remove(&(expires, old_tick));
        g.by_expiry.insert((expires, tick), key.to_string());
        let e = g.entries.get_mut(key)?;
        e.tick = tick;
        Some(e.resp.clone())
    }

    /// Stores `resp` under `key` (replacing an older entry) unless too large or the cache holds
    /// no entries at all (`max_entries == 0`).
    pub fn put(&self, key: &str, resp: &CachedResponse) {
        self.put_at(key, resp, Instant::now());
    }

    fn put_at(&self, key: &str, resp: &CachedResponse, now: Instant) {
        let size = resp.size();
        if size > self.max_entry_bytes || size > self.max_total_bytes || self.max_entries == 0 {
            return;
        }
        let mut g = self.lock();
        g.remove(key);
        let full = |g: &MemInner| {
            g.entries.len() >= self.max_entries || g.bytes + size > self.max_total_bytes
        };
        if full(&g) {
            g.purge_expired(now);
        }
        while full(&g) && !g.entries.is_empty() {
            g.evict_lru();
        }
        g.bytes += size;
        let tick = g.tick();
        let expires = now + self.ttl;
        g.by_use.insert(tick, key.to_string());
        g.by_expiry.insert((expires, tick), key.to_string());
        g.entries.insert(
            key.to_string(),
            MemEntry {
                resp: resp.clone(),
                expires,
                tick,
            },
        );
    }
}

/// Cache entries in Redis under `<prefix>:cache:<key>`, expiring through Redis' own TTL.
pub struct RedisCache {
    conn: redis::aio::ConnectionManager,
    prefix: String,
    ttl: Duration,
    max_entry_bytes: usize,
}

impl RedisCache {
    /// Connects (with a reconnecting connection manager).
    pub async fn connect(
        rc: &RedisConfig,
        ttl: Duration,
        max_entry_bytes: usize,
    ) -> Result<Self, CacheError> {
        let err = |message: String| CacheError::Redis {
            url: redact_url(&rc.url),
            message,
        };
        let client = redis::Client::open(rc.url.as_str()).map_err(|e| err(e.to_string()))?;
        let cfg = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(REDIS_CONNECT_TIMEOUT)
            .set_response_timeout(REDIS_OP_TIMEOUT)
            .set_number_of_retries(0)
            .set_max_delay(200);
        let conn = tokio::time::timeout(
            REDIS_CONNECT_TIMEOUT,
            redis::aio::ConnectionManager::new_with_config(client, cfg),
        )
        .await
        .map_err(|_| err("timed out".into()))?
        .map_err(|e| err(e.to_string()))?;
        Ok(Self {
            conn,
            prefix: rc.prefix.clone(),
            ttl,
            max_entry_bytes,
        })
    }

    fn redis_key(&self, key: &str) -> String {
        format!("{}:cache:{key}", self.prefix)
    }

    /// The stored answer, or `None` on a miss, an error, a timeout or a malformed entry.
    pub async fn get(&self, key: &str) -> Option<CachedResponse> {
        let mut conn = self.conn.clone();
        let rk = self.redis_key(key);
        let res = tokio::time::timeout(REDIS_OP_TIMEOUT, conn.get::<_, Option<Vec<u8>>>(&rk)).await;
        match res {
            Ok(Ok(Some(bytes))) => {
                let decoded = CachedResponse::decode(&bytes);
                if decoded.is_none() {
                    tracing::warn!(key = %rk, "malformed response cache entry in Redis; treated as a miss");
                }
                decoded
            }
            Ok(Ok(None)) => None,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "response cache: Redis GET failed; treated as a miss");
                None
            }
            Err(_) => {
                tracing::warn!("response cache: Redis GET timed out; treated as a miss");
                None
            }
        }
    }

    /// Stores `resp` with the TTL (skipped when too large); errors are logged.
    pub async fn put(&self, key: &str, resp: &CachedResponse) {
        if resp.size() > self.max_entry_bytes {
            return;
        }
        let ttl_ms = u64::try_from(self.ttl.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut conn = self.conn.clone();
        let rk = self.redis_key(key);
        let fut = conn.pset_ex::<_, _, ()>(&rk, resp.encode(), ttl_ms);
        match tokio::time::timeout(REDIS_OP_TIMEOUT, fut).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "response cache: Redis SET failed; not stored")
            }
            Err(_) => tracing::warn!("response cache: Redis SET timed out; not stored"),
        }
    }
}

/// `redis://user:secret@host` -> `redis://user:***@host`, for error messages.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn resp(body: &str) -> CachedResponse {
        CachedResponse {
            status: 200,
            content_type: "application/json".into(),
            body: Bytes::from(body.to_string()),
        }
    }

    fn chat(temp: f64, prompt: &str, stream: bool) -> Value {
        json!({"model": "m", "messages": [{"role": "user", "content": prompt}],
               "temperature": temp, "stream": stream})
    }

    #[test]
    fn key_ignores_field_order_and_number_spelling() {
        let a: Value = serde_json::from_str(
            r#"{"model":"m","temperature":0,"messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#,
        )
        .unwrap();
        let b: Value = serde_json::from_str(
            r#"{"max_tokens":5,"messages":[{"content":"hi","role":"user"}],"temperature":0.0,"model":"m"}"#,
        )
        .unwrap();
        assert_eq!(cache_key("m", "", &a), cache_key("m", "", &b));
        assert!(cache_key("m", "", &a).is_some());
    }

    #[test]
    fn key_changes_with_prompt_temperature_stream_route_and_scope() {
        let base = cache_key("m", "", &chat(0.0, "hi", false)).unwrap();
        assert_eq!(base.len(), 64);
        assert_ne!(
            Some(base.clone()),
            cache_key("m", "", &chat(0.0, "ho", false))
        );
        assert_ne!(
            Some(base.clone()),
            cache_key("m", "", &chat(0.0, "hi", true))
        );
        assert_ne!(
            Some(base.clone()),
            cache_key("other", "", &chat(0.0, "hi", false))
        );
        assert_ne!(
            Some(base.clone()),
            cache_key("m", "gold", &chat(0.0, "hi", false))
        );
        let mut seeded = chat(0.7, "hi", false);
        seeded["seed"] = json!(1);
        let k1 = cache_key("m", "", &seeded).unwrap();
        seeded["temperature"] = json!(0.8);
        assert_ne!(Some(k1), cache_key("m", "", &seeded));
    }

    #[test]
    fn key_ignores_user_model_and_unstreamed_stream_options() {
        let a = chat(0.0, "hi", false);
        let mut b = a.clone();
        b["user"] = json!("end-user-7");
        b["model"] = json!("alias");
        b["stream_options"] = json!({"include_usage": true});
        assert_eq!(cache_key("m", "", &a), cache_key("m", "", &b));
        let mut c = a.clone();
        c.as_object_mut().unwrap().remove("stream");
        assert_eq!(
            cache_key("m", "", &a),
            cache_key("m", "", &c),
            "absent stream = false"
        );
        let s = chat(0.0, "hi", true);
        let mut s2 = s.clone();
        s2["stream_options"] = json!({"include_usage": true});
        assert_ne!(cache_key("m", "", &s), cache_key("m", "", &s2));
    }

    #[test]
    fn only_deterministic_requests_get_a_key() {
        assert!(cache_key("m", "", &chat(0.7, "hi", false)).is_none());
        let no_temp = json!({"messages": [], "max_tokens": 3});
        assert!(
            cache_key("m", "", &no_temp).is_none(),
            "default temperature is 1.0"
        );
        let seed_only = json!({"messages": [], "seed": 42});
        assert!(cache_key("m", "", &seed_only).is_some());
        let null_seed = json!({"messages": [], "seed": null, "temperature": 0.5});
        assert!(cache_key("m", "", &null_seed).is_none());
        let many = json!({"messages": [], "temperature": 0, "n": 3});
        assert!(cache_key("m", "", &many).is_none());
        let many_seeded = json!({"messages": [], "temperature": 0, "n": 3, "seed": 1});
        assert!(cache_key("m", "", &many_seeded).is_some());
        let string_temp = json!({"messages": [], "temperature": "0"});
        assert!(cache_key("m", "", &string_temp).is_none());
        assert!(cache_key("m", "", &json!([1, 2])).is_none());
        assert!(cache_key("m", "", &json!(null)).is_none());
    }

    #[test]
    fn bypass_header_values() {
        let mut h = HeaderMap::new();
        assert!(!bypass_requested(&h));
        h.insert(NO_CACHE_HEADER, HeaderValue::from_static("No-Cache"));
        assert!(bypass_requested(&h));
        h.insert(NO_CACHE_HEADER, HeaderValue::from_static("foo, bypass"));
        assert!(bypass_requested(&h));
        h.insert(NO_CACHE_HEADER, HeaderValue::from_static("store"));
        assert!(!bypass_requested(&h));
        assert_eq!(CacheStatus::Hit.header_value(), "hit");
        assert_eq!(CacheStatus::Miss.as_str(), "miss");
        assert_eq!(CacheStatus::Bypass.as_str(), "bypass");
    }

    #[test]
    fn memory_ttl_expiry() {
        let c = MemoryCache::new(10, Duration::from_secs(5), 1024);
        let t0 = Instant::now();
        c.put_at("a", &resp("x"), t0);
        assert_eq!(
            c.get_at("a", t0 + Duration::from_millis(4999)),
            Some(resp("x"))
        );
        assert_eq!(c.get_at("a", t0 + Duration::from_secs(5)), None);
        assert!(c.is_empty(), "an expired entry found by get is dropped");
        // Through the public clock too.
        let short = MemoryCache::new(10, Duration::from_millis(30), 1024);
        short.put("a", &resp("x"));
        std::thread::sleep(Duration::from_millis(50));
        assert!(short.get("a").is_none());
    }

    #[test]
    fn memory_evicts_least_recently_used() {
        let c = MemoryCache::new(2, Duration::from_secs(60), 1024);
        c.put("a", &resp("1"));
        c.put("b", &resp("2"));
        assert!(c.get("a").is_some()); // b is now the least recently used
        c.put("c", &resp("3"));
        assert_eq!(c.len(), 2);
        assert!(c.get("b").is_none());
        assert!(c.get("a").is_some());
        assert!(c.get("c").is_some());
    }

    #[test]
    fn memory_evicts_expired_before_lru() {
        let c = MemoryCache::new(3, Duration::from_secs(10), 1024);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        c.put_at("a", &resp("1"), at(0)); // expires at 10 s
        c.put_at("b", &resp("2"), at(5_000)); // expires at 15 s
        c.put_at("c", &resp("3"), at(6_000)); // expires at 16 s
        assert!(c.get_at("a", at(7_000)).is_some()); // b is now the least recently used
                                                     // At 11 s `a` has expired: it goes first, although `b` is the LRU entry.
        c.put_at("d", &resp("4"), at(11_000));
        assert_eq!(c.len(), 3);
        assert!(c.get_at("b", at(11_000)).is_some());
        assert!(c.get_at("a", at(11_000)).is_none());
        // Nothing expired at 12 s: the LRU entry (`c`, since b was just read) goes.
        c.put_at("e", &resp("5"), at(12_000));
        assert!(c.get_at("c", at(12_000)).is_none());
        for k in ["b", "d", "e"] {
            assert!(c.get_at(k, at(12_000)).is_some(), "{k} kept");
        }
    }

    #[test]
    fn memory_total_bytes_are_bounded() {
        // Entries are 16 bytes of content type + body.
        let c = MemoryCache::new(100, Duration::from_secs(60), 1024).with_max_total_bytes(100);
        for k in ["a", "b", "c", "d", "e"] {
            c.put(k, &resp(&"x".repeat(14))); // 30 bytes each
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.bytes(), 90);
        assert!(c.get("a").is_none() && c.get("b").is_none());
        assert!(c.get("e").is_some());
        c.put("e", &resp("1"));
        assert_eq!(c.bytes(), 60 + 17);
    }

    #[test]
    fn memory_skips_large_entries_and_replaces_same_key() {
        let c = MemoryCache::new(5, Duration::from_secs(60), 20);
        c.put("big", &resp(&"x".repeat(64)));
        assert!(c.get("big").is_none());
        c.put("k", &resp("1"));
        c.put("k", &resp("2"));
        assert_eq!(c.len(), 1);
        assert_eq!(c.get("k"), Some(resp("2")));
        let zero = MemoryCache::new(0, Duration::from_secs(60), 20);
        zero.put("k", &resp("1"));
        assert!(zero.get("k").is_none());
    }

    #[test]
    fn encoding_round_trips_and_rejects_garbage() {
        let r = CachedResponse {
            status: 200,
            content_type: "text/event-stream".into(),
            body: Bytes::from_static(b"data: {}\n\ndata: [DONE]\n\n"),
        };
        assert_eq!(CachedResponse::decode(&r.encode()), Some(r));
        assert_eq!(CachedResponse::decode(&[]), None);
        assert_eq!(CachedResponse::decode(&[9, 0, 200, 0, 0]), None);
        assert_eq!(CachedResponse::decode(&[1, 0, 200, 0, 50, b'a']), None);
    }

    #[test]
    fn redacts_password_in_url() {
        assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
    }

    #[tokio::test]
    async fn disabled_and_memory_from_config() {
        let off = CacheConfig {
            enabled: false,
            ..CacheConfig::default()
        };
        let c = ResponseCache::from_config(&off, None).await.unwrap();
        assert!(!c.is_enabled());
        c.put("k", &resp("1")).await;
        assert!(c.get("k").await.is_none());
        let mem = ResponseCache::from_config(&CacheConfig::default(), None)
            .await
            .unwrap();
        mem.put("k", &resp("1")).await;
        assert_eq!(mem.get("k").await, Some(resp("1")));
        let redis_cfg = CacheConfig {
            backend: CacheBackend::Redis,
            ..CacheConfig::default()
        };
        assert!(matches!(
            ResponseCache::from_config(&redis_cfg, None).await,
            Err(CacheError::MissingRedis)
        ));
    }

    #[tokio::test]
    async fn unreachable_redis_is_a_startup_error() {
        let cfg = CacheConfig {
            backend: CacheBackend::Redis,
            ..CacheConfig::default()
        };
        let rc = RedisConfig {
            url: "redis://127.0.0.1:1".into(),
            prefix: "t".into(),
        };
        assert!(ResponseCache::from_config(&cfg, Some(&rc)).await.is_err());
    }

    /// The test Redis URL, or `None` (with a notice) when unset outside CI.
    fn test_redis() -> Option<String> {
        match std::env::var("PAGODA_TEST_REDIS") {
            Ok(u) if !u.is_empty() => Some(u),
            _ => {
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "PAGODA_TEST_REDIS must be set in CI"
                );
                eprintln!("PAGODA_TEST_REDIS unset: skipping the Redis cache test");
                None
            }
        }
    }

    #[tokio::test]
    async fn redis_round_trip_ttl_and_size_limit() {
        let Some(url) = test_redis() else { return };
        let prefix = format!("pagoda-test-{}", std::process::id());
        let rc = RedisConfig { url, prefix };
        let cfg = CacheConfig {
            backend: CacheBackend::Redis,
            ttl_s: 1,
            max_entry_bytes: 100,
            ..CacheConfig::default()
        };
        let c = ResponseCache::from_config(&cfg, Some(&rc)).await.unwrap();
        let key = cache_key("m", "", &chat(0.0, "redis", false)).unwrap();
        assert!(c.get(&key).await.is_none());
        let r = resp("{\"ok\":true}");
        c.put(&key, &r).await;
        assert_eq!(c.get(&key).await, Some(r));
        c.put("big", &resp(&"x".repeat(200))).await;
        assert!(c.get("big").await.is_none());
        // A short TTL straight through the backend, to keep the test fast.
        let ResponseCache::Redis(inner) = &c else {
            panic!("redis backend")
        };
        let short = RedisCache {
            conn: inner.conn.clone(),
            prefix: inner.prefix.clone(),
            ttl: Duration::from_millis(50),
            max_entry_bytes: 100,
        };
        short.put("short", &resp("1")).await;
        assert!(short.get("short").await.is_some());
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(short.get("short").await.is_none());
    }

    proptest! {
        #[test]
        fn key_is_independent_of_insertion_order(
            fields in proptest::collection::btree_map("[a-z]{1,6}", -1000i64..1000, 0..8),
            rev in any::<bool>(),
        ) {
            let mut a = serde_json::Map::new();
            a.insert("temperature".into(), json!(0));
            let mut b = a.clone();
            for (k, v) in &fields { a.insert(k.clone(), json!(v)); }
            let mut items: Vec<_> = fields.iter().collect();
            if rev { items.reverse(); }
            for (k, v) in items { b.insert(k.clone(), json!(v)); }
            let ka = cache_key("m", "", &Value::Object(a));
            let kb = cache_key("m", "", &Value::Object(b));
            prop_assert_eq!(ka, kb);
        }

        #[test]
        fn memory_indexes_stay_consistent(
            ops in proptest::collection::vec((0..8u8, 0..40usize, 0..3u64, any::<bool>()), 0..60),
        ) {
            let c = MemoryCache::new(4, Duration::from_secs(2), 60).with_max_total_bytes(150);
            let t0 = Instant::now();
            for (i, (k, len, secs, is_get)) in ops.into_iter().enumerate() {
                let now = t0 + Duration::from_secs(secs) + Duration::from_millis(i as u64);
                let key = format!("k{k}");
                if is_get {
                    let _ = c.get_at(&key, now);
                } else {
                    c.put_at(&key, &resp(&"x".repeat(len)), now);
                }
                let g = c.lock();
                prop_assert!(g.entries.len() <= 4);
                prop_assert!(g.bytes <= 150);
                prop_assert_eq!(g.by_use.len(), g.entries.len());
                prop_assert_eq!(g.by_expiry.len(), g.entries.len());
                prop_assert_eq!(g.bytes, g.entries.values().map(|e| e.resp.size()).sum::<usize>());
            }
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = CachedResponse::decode(&bytes);
        }
    }
}
