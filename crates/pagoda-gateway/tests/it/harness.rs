//! Starts a gateway in this process on a loopback port from a config text, and talks to it.

use std::path::PathBuf;
use std::sync::Arc;

use pagoda_gateway::config::GatewayConfig;
use pagoda_gateway::keys::hash_key;
use pagoda_gateway::state::Gateway;
use serde_json::{json, Value};

pub const ADMIN_KEY: &str = "admin-secret-for-tests";

/// A `[[key]]` block for the config: name, plaintext key and extra lines (tier, limits).
pub fn key_block(name: &str, key: &str, extra: &str) -> String {
    format!(
        "[[key]]\nname = \"{name}\"\nkey_sha256 = \"{}\"\n{extra}\n",
        hash_key(key)
    )
}

/// The config with the test admin key and a fast reload interval in its `[server]` table.
fn with_admin(config: &str) -> String {
    let server = format!("[server]\nadmin_key = \"{ADMIN_KEY}\"\nreload_interval_ms = 100\n");
    if config.contains("[server]\n") {
        config.replacen("[server]\n", &server, 1)
    } else {
        format!("{server}\n{config}")
    }
}

pub struct TestGateway {
    pub url: String,
    pub gateway: Arc<Gateway>,
    pub config_path: PathBuf,
    _dir: tempfile::TempDir,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    pub client: reqwest::Client,
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Starts a gateway from `config` (the admin key and a fresh SQLite file are added).
pub async fn start(config: &str) -> TestGateway {
    let dir = tempfile::tempdir().unwrap();
    start_in(dir, config).await
}

pub async fn start_in(dir: tempfile::TempDir, config: &str) -> TestGateway {
    let text = with_admin(config);
    let config_path = dir.path().join("gateway.toml");
    std::fs::write(&config_path, &text).unwrap();
    let cfg = GatewayConfig::load(&config_path).unwrap();
    let gateway = Gateway::new(cfg, Some(config_path.clone())).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let gw = gateway.clone();
    tokio::spawn(async move {
        let _ = pagoda_gateway::serve(gw, listener, async {
            let _ = rx.await;
        })
        .await;
    });
    TestGateway {
        url,
        gateway,
        config_path,
        _dir: dir,
        shutdown: Some(tx),
        client: reqwest::Client::new(),
    }
}

impl TestGateway {
    /// Rewrites the config file (the admin key is kept).
    pub fn rewrite(&self, config: &str) {
        let text = with_admin(config);
        let tmp = self.config_path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.config_path).unwrap();
    }

    /// The gateway's Prometheus exposition (`GET /metrics`).
    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn chat(&self, key: &str, model: &str, extra: Value) -> reqwest::Response {
        let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hello"}]});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        self.client
            .post(format!("{}/v1/chat/completions", self.url))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn admin_get(&self, path: &str) -> Value {
        let r = self
            .client
            .get(format!("{}{path}", self.url))
            .bearer_auth(ADMIN_KEY)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.unwrap()
    }

    /// `(request_id, status)` of every ledger row so far, oldest first.
    pub async fn ledger_rows(&self) -> Vec<(String, u16)> {
        self.gateway.usage.flush().await;
        let db = self.config_path.with_file_name("gateway.db");
        let conn = rusqlite::Connection::open(db).unwrap();
        let mut stmt = conn
            .prepare("SELECT request_id, status FROM gateway_usage ORDER BY id")
            .unwrap();
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        rows
    }

    pub async fn admin_post(&self, path: &str, body: Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.url))
            .bearer_auth(ADMIN_KEY)
            .json(&body)
            .send()
            .await
            .unwrap()
    }
}

/// The content of a non-stream chat answer.
pub async fn content(r: reqwest::Response) -> String {
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `PAGODA_TEST_REDIS`, or None (a notice) outside CI; in CI its absence fails the test.
pub fn redis_url() -> Option<String> {
    match std::env::var("PAGODA_TEST_REDIS") {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("PAGODA_TEST_REDIS is not set: .ci/run starts redis-server and sets it")
        }
        _ => {
            eprintln!("skipped: set PAGODA_TEST_REDIS=redis://127.0.0.1:6390 to run this test");
            None
        }
    }
}
