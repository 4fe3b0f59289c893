//! Starting a server on an ephemeral port over a temporary store, and small HTTP helpers.

use pagoda_server::{BoundServer, ServerConfig};
use pagoda_store::Store;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name)
}

/// The tiny Llama test model, addressed by path.
pub fn tiny_llama() -> String {
    golden("tiny-llama").display().to_string()
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    pub state: pagoda_server::AppState,
    pub store: Arc<Store>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<Result<(), pagoda_server::ServerError>>>,
    _dir: tempfile::TempDir,
}

/// A config for tests: the tiny model preloaded, a small KV pool, the golden folder allowed
/// for models and adapters named by path.
pub fn config() -> ServerConfig {
    let mut c = ServerConfig {
        host: "127.0.0.1".into(),
        port: 0,
        models: vec![tiny_llama()],
        model_dirs: vec![golden("")],
        reload_interval: Duration::from_millis(200),
        drain_grace: Duration::from_secs(5),
        ..ServerConfig::default()
    };
    c.engine.kv_cache_memory = Some(8 << 20);
    c.engine.max_num_seqs = 16;
    c
}

pub async fn start(config: ServerConfig) -> TestServer {
    let dir = tempfile::tempdir().expect("temp dir");
    let store_dir = dir.path().join("store");
    start_in(config, store_dir, dir).await
}

/// Like [`start`], over an existing store folder.
pub async fn start_with_store(config: ServerConfig, store_dir: PathBuf) -> TestServer {
    let dir = tempfile::tempdir().expect("temp dir");
    start_in(config, store_dir, dir).await
}

/// The validator `pagoda serve` installs (the CLI's `open_store`): the model opens as loading
/// opens it.
pub fn loadable(path: &Path) -> Result<(), String> {
    pagoda_model::validate_model(path)
        .map(drop)
        .map_err(|e| e.to_string())
}

async fn start_in(config: ServerConfig, store_dir: PathBuf, dir: tempfile::TempDir) -> TestServer {
    let store = Arc::new(
        Store::open(Some(store_dir))
            .expect("store opens")
            .with_validator(loadable),
    );
    let server = BoundServer::bind(config, store.clone())
        .await
        .expect("binds");
    let addr = server.local_addr().expect("address");
    let state = server.state().clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    let s = TestServer {
        addr,
        client: reqwest::Client::new(),
        state,
        store,
        shutdown: Some(tx),
        handle: Some(handle),
        _dir: dir,
    };
    s.wait_ready().await;
    s
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn wait_ready(&self) {
        for _ in 0..200 {
            if let Ok(r) = self.client.get(self.url("/ready")).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("server not ready after 10 s");
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        let r = self.client.get(self.url(path)).send().await.expect("sent");
        assert_eq!(r.status(), 200, "GET {path}");
        r.json().await.expect("json body")
    }

    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("sent")
            .text()
            .await
            .expect("text")
    }

    /// Sends the shutdown signal and waits for `run` to return.
    pub async fn stop(mut self) -> Result<(), pagoda_server::ServerError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.handle.take() {
            Some(h) => h.await.expect("server task"),
            None => Ok(()),
        }
    }

    /// KV blocks in use across loaded models (polls until the engines published a step).
    pub async fn wait_kv_empty(&self) -> bool {
        for _ in 0..100 {
            let used: usize = self
                .state
                .registry
                .loaded()
                .iter()
                .map(|m| m.engine.stats().kv_blocks_used)
                .sum();
            if used == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    let mut reader = pagoda_protocol::sse::SseReader::new();
    reader
        .feed(body.as_bytes())
        .into_iter()
        .map(|e| e.data)
        .collect()
}

/// Asserts an OpenAI error body with `status`, returning it.
pub async fn expect_openai_error(r: reqwest::Response, status: u16) -> serde_json::Value {
    assert_eq!(r.status().as_u16(), status);
    let v: serde_json::Value = r.json().await.expect("error body is JSON");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    assert!(v["error"]["type"].is_string(), "{v}");
    assert!(
        v["error"].get("param").is_some() && v["error"].get("code").is_some(),
        "{v}"
    );
    v
}
