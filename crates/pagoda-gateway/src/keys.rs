//! API keys: generation, hashing, storage and authentication.
//!
//! Owns the `api_keys` SQLite table (keys created through the admin API) and the static keys of
//! the config file (held in memory, replaced on reload). Invariants:
//! - a key's plaintext is never stored nor serialized: only `sha256:<hex>` of it is kept, in the
//!   table and in the in-memory map, and [`KeyRecord`] has no field for either;
//! - [`KeyStore::authenticate`] reads the table on every call (one indexed lookup through a
//!   cached prepared statement, a few microseconds), so a key revoked by one gateway process is
//!   refused at once by every other process sharing the SQLite file (WAL mode, busy timeout);
//! - key names are unique across the table and the config file's keys.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pagoda_http::api_key::BearerError;
use rand::distributions::Alphanumeric;
use rand::Rng;
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use crate::config::{KeyLimits, StaticKeyConfig};

/// Length of the random part of a generated key.
const KEY_RANDOM_CHARS: usize = 40;
/// How long a writer waits for another process's lock on the SQLite file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Prefix of the ids of keys declared in the config file.
const STATIC_ID_PREFIX: &str = "cfg:";

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    key_hash TEXT NOT NULL UNIQUE,
    tier TEXT,
    grp TEXT,
    models TEXT NOT NULL,
    rpm INTEGER,
    tpm INTEGER,
    budget_tokens INTEGER,
    revoked INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
)";

const SELECT_COLUMNS: &str =
    "id, name, tier, grp, models, rpm, tpm, budget_tokens, revoked, created_at";

/// Why a key operation failed.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("no API key with id or name '{0}'")]
    NotFound(String),
    #[error("an API key named '{0}' already exists")]
    Duplicate(String),
    #[error("key '{0}' is declared in the config file: remove it there")]
    FromConfig(String),
    #[error("invalid key: {0}")]
    Invalid(String),
    #[error("key store: {0}")]
    Db(#[from] rusqlite::Error),
}

/// Why a request's credentials were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing Authorization header")]
    Missing,
    #[error("Authorization header must be `Bearer <key>`")]
    Malformed,
    #[error("unknown API key")]
    Unknown,
    #[error("API key revoked")]
    Revoked,
    /// The key store could not be read (a server-side failure, not the client's).
    #[error("key store unavailable: {0}")]
    Store(String),
}

/// An API key as the gateway and the admin API see it (never its plaintext nor its hash).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KeyRecord {
    pub id: String,
    pub name: String,
    pub tier: Option<String>,
    pub group: Option<String>,
    /// Client-facing model names the key may use; empty = all.
    pub models: Vec<String>,
    pub limits: KeyLimits,
    pub revoked: bool,
    /// Unix seconds.
    pub created_at: u64,
    /// Declared in the config file (not revocable through the admin API).
    pub from_config: bool,
}

impl KeyRecord {
    /// Whether the key may use the client-facing model `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }

    /// The key's limits, each unset one taken from `defaults` (`[default_limits]`).
    pub fn effective_limits(&self, defaults: &KeyLimits) -> KeyLimits {
        KeyLimits {
            rpm: self.limits.rpm.or(defaults.rpm),
            tpm: self.limits.tpm.or(defaults.tpm),
            budget_tokens: self.limits.budget_tokens.or(defaults.budget_tokens),
        }
    }
}

/// A key to create through the admin API.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NewKey {
    pub name: String,
    #[serde(default)]
    pub tier: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default)]
    pub limits: KeyLimits,
}

pub use pagoda_http::api_key::hash_key;

/// A new random key: `pk-` and 40 alphanumeric characters (about 238 bits).
pub fn generate_key() -> String {
    let random: String = rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(KEY_RANDOM_CHARS)
        .map(char::from)
        .collect();
    format!("pk-{random}")
}

/// The token of an `Authorization: Bearer <token>` header value.
pub fn parse_bearer(header_value: Option<&str>) -> Result<&str, AuthError> {
    pagoda_http::api_key::parse_bearer(header_value).map_err(|e| match e {
        BearerError::Missing => AuthError::Missing,
        BearerError::Malformed => AuthError::Malformed,
    })
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn new_id() -> String {
    let bytes: [u8; 8] = rand::thread_rng().gen();
    format!("key-{}", hex::encode(bytes))
}

fn to_sql_int(value: Option<u64>, what: &str) -> Result<Option<i64>, KeyError> {
    value
        .map(|v| i64::try_from(v).map_err(|_| KeyError::Invalid(format!("{what} is too large"))))
        .transpose()
}

fn from_sql_int(value: Option<i64>) -> Option<u64> {
    value.map(|v| u64::try_from(v).unwrap_or(0))
}

fn record_from_row(row: &Row<'_>) -> rusqlite::Result<KeyRecord> {
    let models_json: String = row.get(4)?;
    let models = serde_json::from_str(&models_json).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(4, rusqlite::types::Type::Text, Box::new(e))
    })?;
    Ok(KeyRecord {
        id: row.get(0)?,
        name: row.get(1)?,
        tier: row.get(2)?,
        group: row.get(3)?,
        models,
        limits: KeyLimits {
            rpm: from_sql_int(row.get(5)?),
            tpm: from_sql_int(row.get(6)?),
            budget_tokens: from_sql_int(row.get(7)?),
        },
        revoked: row.get::<_, i64>(8)? != 0,
        created_at: from_sql_int(row.get(9)?).unwrap_or(0),
        from_config: false,
    })
}

fn static_record(key: &StaticKeyConfig, created_at: u64) -> KeyRecord {
    KeyRecord {
        id: format!("{STATIC_ID_PREFIX}{}", key.name),
        name: key.name.clone(),
        tier: key.tier.clone(),
        group: key.group.clone(),
        models: key.models.clone(),
        limits: key.limits.clone(),
        revoked: false,
        created_at,
        from_config: true,
    }
}

/// API keys: the SQLite table plus the config file's static keys. `Send + Sync`.
pub struct KeyStore {
    conn: Mutex<Connection>,
    /// Static keys by hash.
    statics: RwLock<HashMap<String, KeyRecord>>,
}

impl KeyStore {
    /// Opens (creating if needed) the key table in the SQLite file at `path`.
    pub fn open(path: &Path) -> Result<KeyStore, KeyError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        Self::init(conn)
    }

    /// A store that lives only in memory (tests, throwaway gateways).
    pub fn open_in_memory() -> Result<KeyStore, KeyError> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> Result<KeyStore, KeyError> {
        conn.execute_batch(SCHEMA)?;
        Ok(KeyStore {
            conn: Mutex::new(conn),
            statics: RwLock::new(HashMap::new()),
        })
    }

    fn db(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave the connection half-written (SQLite
        // statements are atomic), so a poisoned lock is safe to reuse.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn statics(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, KeyRecord>> {
        self.statics.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the config file's keys (at start and on every reload).
    pub fn set_static_keys(&self, keys: &[StaticKeyConfig]) {
        let mut statics = self.statics.write().unwrap_or_else(|p| p.into_inner());
        let previous: HashMap<String, u64> = statics
            .values()
            .map(|r| (r.name.clone(), r.created_at))
            .collect();
        let now = now_unix();
        *statics = keys
            .iter()
            .map(|k| {
                let created = previous.get(&k.name).copied().unwrap_or(now);
                (k.key_sha256.to_ascii_lowercase(), static_record(k, created))
            })
            .collect();
    }

    /// Creates a key; returns its record and its plaintext (shown to the operator once).
    pub fn create(&self, new: NewKey) -> Result<(KeyRecord, String), KeyError> {
        let name = new.name.trim().to_string();
        if name.is_empty() {
            return Err(KeyError::Invalid("a key needs a non-empty name".into()));
        }
        if self.statics().values().any(|r| r.name == name) {
            return Err(KeyError::Duplicate(name));
        }
        let plaintext = generate_key();
        let record = KeyRecord {
            id: new_id(),
            name,
            tier: new.tier,
            group: new.group,
            models: new.models,
            limits: new.limits,
            revoked: false,
            created_at: now_unix(),
            from_config: false,
        };
        self.insert(&record, &hash_key(&plaintext))?;
        Ok((record, plaintext))
    }

    fn insert(&self, r: &KeyRecord, key_hash: &str) -> Result<(), KeyError> {
        let models = serde_json::to_string(&r.models)
            .map_err(|e| KeyError::Invalid(format!("models: {e}")))?;
        let created = i64::try_from(r.created_at).unwrap_or(i64::MAX);
        let result = self.db().execute(
            "INSERT INTO api_keys (id, name, key_hash, tier, grp, models, rpm, tpm, budget_tokens,
             revoked, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10)",
            params![
                r.id,
                r.name,
                key_hash,
                r.tier,
                r.group,
                models,
                to_sql_int(r.limits.rpm, "rpm")?,
                to_sql_int(r.limits.tpm, "tpm")?,
                to_sql_int(r.limits.budget_tokens, "budget_tokens")?,
                created,
            ],
        );
        match result {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(KeyError::Duplicate(r.name.clone()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Every key: the config file's first (by name), then the table's (oldest first).
    pub fn list(&self) -> Result<Vec<KeyRecord>, KeyError> {
        let mut out: Vec<KeyRecord> = self.statics().values().cloned().collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        let db = self.db();
        let mut stmt = db.prepare_cached(&format!(
            "SELECT {SELECT_COLUMNS} FROM api_keys ORDER BY created_at, name"
        ))?;
        let rows = stmt.query_map([], record_from_row)?;
        for row in rows {
            out.push(row?);
        }
        Ok(out)
    }

    /// The key with this id or name.
    pub fn get(&self, id_or_name: &str) -> Result<KeyRecord, KeyError> {
        if let Some(r) = self
            .statics()
            .values()
            .find(|r| r.id == id_or_name || r.name == id_or_name)
        {
            return Ok(r.clone());
        }
        self.db()
            .prepare_cached(&format!(
                "SELECT {SELECT_COLUMNS} FROM api_keys WHERE id = ?1 OR name = ?1"
            ))?
            .query_row([id_or_name], record_from_row)
            .optional()?
            .ok_or_else(|| KeyError::NotFound(id_or_name.to_string()))
    }

    /// Revokes a key created through the admin API (config-file keys are removed from the file).
    pub fn revoke(&self, id_or_name: &str) -> Result<KeyRecord, KeyError> {
        let mut record = self.get(id_or_name)?;
        if record.from_config {
            return Err(KeyError::FromConfig(record.name));
        }
        self.db()
            .prepare_cached("UPDATE api_keys SET revoked = 1 WHERE id = ?1")?
            .execute([&record.id])?;
        record.revoked = true;
        Ok(record)
    }

    /// The key whose plaintext is `presented` (the bearer token), if it exists and is live.
    pub fn authenticate(&self, presented: &str) -> Result<KeyRecord, AuthError> {
        let key_hash = hash_key(presented);
        if let Some(r) = self.statics().get(&key_hash) {
            return Ok(r.clone());
        }
        let found = self
            .db()
            .prepare_cached(&format!(
                "SELECT {SELECT_COLUMNS} FROM api_keys WHERE key_hash = ?1"
            ))
            .and_then(|mut stmt| stmt.query_row([&key_hash], record_from_row).optional())
            .map_err(|e| AuthError::Store(e.to_string()))?;
        match found {
            None => Err(AuthError::Unknown),
            Some(r) if r.revoked => Err(AuthError::Revoked),
            Some(r) => Ok(r),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_key(name: &str) -> NewKey {
        NewKey {
            name: name.into(),
            ..NewKey::default()
        }
    }

    fn static_key(name: &str, plaintext: &str) -> StaticKeyConfig {
        StaticKeyConfig {
            name: name.into(),
            key_sha256: hash_key(plaintext),
            tier: Some("gold".into()),
            group: None,
            models: vec!["chat".into()],
            limits: KeyLimits {
                rpm: Some(10),
                ..KeyLimits::default()
            },
        }
    }

    #[test]
    fn hash_is_sha256_hex_and_matches_a_known_vector() {
        assert_eq!(
            hash_key("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn generated_keys_are_prefixed_random_and_alphanumeric() {
        let a = generate_key();
        let b = generate_key();
        assert_ne!(a, b);
        assert_eq!(a.len(), 3 + KEY_RANDOM_CHARS);
        assert!(a.starts_with("pk-"));
        assert!(a[3..].chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn parse_bearer_maps_pagoda_http_verdicts_to_auth_errors() {
        // The parsing itself is pagoda-http's (and tested there); this is the mapping.
        assert_eq!(parse_bearer(Some("Bearer pk-abc")), Ok("pk-abc"));
        assert_eq!(parse_bearer(None), Err(AuthError::Missing));
        assert_eq!(parse_bearer(Some("Basic abc")), Err(AuthError::Malformed));
    }

    #[test]
    fn created_key_authenticates_and_serializes_without_secrets() {
        let store = KeyStore::open_in_memory().unwrap();
        let (record, plaintext) = store
            .create(NewKey {
                name: "alice".into(),
                tier: Some("free".into()),
                models: vec!["chat".into()],
                limits: KeyLimits {
                    rpm: Some(5),
                    tpm: None,
                    budget_tokens: Some(1000),
                },
                ..NewKey::default()
            })
            .unwrap();
        assert_eq!(store.authenticate(&plaintext).unwrap(), record);
        let json = serde_json::to_string(&record).unwrap();
        assert!(!json.contains(&plaintext));
        assert!(!json.contains(&hash_key(&plaintext)[7..]));
        assert!(record.allows_model("chat") && !record.allows_model("code"));
    }

    #[test]
    fn new_key_parses_from_admin_json_and_rejects_unknown_fields() {
        let k: NewKey =
            serde_json::from_str(r#"{"name":"bob","limits":{"rpm":3},"models":["chat"]}"#).unwrap();
        assert_eq!(k.limits.rpm, Some(3));
        assert!(serde_json::from_str::<NewKey>(r#"{"name":"bob","secret":1}"#).is_err());
    }

    #[test]
    fn unknown_and_empty_keys_are_refused() {
        let store = KeyStore::open_in_memory().unwrap();
        store.create(new_key("a")).unwrap();
        assert_eq!(store.authenticate("pk-nope"), Err(AuthError::Unknown));
        assert_eq!(store.authenticate(""), Err(AuthError::Unknown));
    }

    #[test]
    fn names_are_unique_and_non_empty() {
        let store = KeyStore::open_in_memory().unwrap();
        store.set_static_keys(&[static_key("ops", "pk-static")]);
        store.create(new_key("a")).unwrap();
        assert!(matches!(
            store.create(new_key("a")),
            Err(KeyError::Duplicate(_))
        ));
        assert!(matches!(
            store.create(new_key("ops")),
            Err(KeyError::Duplicate(_))
        ));
        assert!(matches!(
            store.create(new_key("  ")),
            Err(KeyError::Invalid(_))
        ));
    }

    #[test]
    fn revoked_key_is_refused_and_listed_as_revoked() {
        let store = KeyStore::open_in_memory().unwrap();
        let (rec, plaintext) = store.create(new_key("a")).unwrap();
        let revoked = store.revoke("a").unwrap();
        assert!(revoked.revoked);
        assert_eq!(store.authenticate(&plaintext), Err(AuthError::Revoked));
        assert!(store.get(&rec.id).unwrap().revoked);
        assert!(matches!(store.revoke("zzz"), Err(KeyError::NotFound(_))));
        assert!(store.list().unwrap()[0].revoked);
    }

    #[test]
    fn static_keys_authenticate_are_listed_and_replaced_on_reload() {
        let store = KeyStore::open_in_memory().unwrap();
        store.set_static_keys(&[static_key("ops", "pk-static")]);
        store.create(new_key("dyn")).unwrap();
        let r = store.authenticate("pk-static").unwrap();
        assert!(r.from_config);
        assert_eq!(r.id, "cfg:ops");
        assert_eq!(r.limits.rpm, Some(10));
        let names: Vec<_> = store.list().unwrap().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["ops", "dyn"]);
        assert!(matches!(store.revoke("ops"), Err(KeyError::FromConfig(_))));
        store.set_static_keys(&[]);
        assert_eq!(store.authenticate("pk-static"), Err(AuthError::Unknown));
    }

    #[test]
    fn effective_limits_fill_unset_fields_from_defaults() {
        let store = KeyStore::open_in_memory().unwrap();
        store.set_static_keys(&[static_key("ops", "pk-static")]);
        let r = store.get("ops").unwrap();
        let defaults = KeyLimits {
            rpm: Some(99),
            tpm: Some(1000),
            budget_tokens: None,
        };
        let eff = r.effective_limits(&defaults);
        assert_eq!(
            (eff.rpm, eff.tpm, eff.budget_tokens),
            (Some(10), Some(1000), None)
        );
    }

    #[test]
    fn revocation_by_one_process_is_seen_at_once_by_another() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.db");
        let a = KeyStore::open(&path).unwrap();
        let b = KeyStore::open(&path).unwrap();
        let (_, plaintext) = a.create(new_key("shared")).unwrap();
        assert!(b.authenticate(&plaintext).is_ok());
        a.revoke("shared").unwrap();
        assert_eq!(b.authenticate(&plaintext), Err(AuthError::Revoked));
        drop((a, b));
        let reopened = KeyStore::open(&path).unwrap();
        assert_eq!(reopened.list().unwrap().len(), 1);
    }

    #[test]
    fn too_large_limits_are_rejected_not_wrapped() {
        let store = KeyStore::open_in_memory().unwrap();
        let mut k = new_key("big");
        k.limits.budget_tokens = Some(u64::MAX);
        assert!(matches!(store.create(k), Err(KeyError::Invalid(_))));
    }

    /// Cost of one authentication against a file-backed store (read through every time).
    #[test]
    #[ignore = "measurement: cargo test -p pagoda-gateway keys::tests::authenticate_cost -- --ignored --nocapture"]
    fn authenticate_cost() {
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::open(&dir.path().join("gw.db")).unwrap();
        for i in 0..1000 {
            store.create(new_key(&format!("k{i}"))).unwrap();
        }
        let (_, plaintext) = store.create(new_key("probe")).unwrap();
        let n = 20_000;
        let start = std::time::Instant::now();
        for _ in 0..n {
            store.authenticate(&plaintext).unwrap();
        }
        eprintln!("authenticate: {:?} per call", start.elapsed() / n);
    }
}
