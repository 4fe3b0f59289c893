//! A small OpenAI-compatible backend for the gateway's tests: it answers chat completions
//! (JSON or SSE) with its own name, reports usage and the model it was asked for (as real
//! servers do), and can be told to fail, slow down, cut its streams or report itself
//! unhealthy. Like some real servers, its error messages name the model and its own address.
//! It remembers the `x-request-id` it last received. It listens on a real loopback socket.
//! [`crashing`] is a replica that dies on every request: it reads the whole request, then
//! closes the connection without answering.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// Prompt and completion tokens every answer reports.
pub const PROMPT_TOKENS: u64 = 10;
pub const COMPLETION_TOKENS: u64 = 5;

#[derive(Default)]
pub struct Behaviour {
    /// Non-zero: answer every request with this status.
    pub fail_status: AtomicU16,
    pub delay_ms: AtomicU64,
    /// Send one chunk of a stream, then drop the connection.
    pub cut_streams: AtomicBool,
    pub unhealthy: AtomicBool,
    pub served: AtomicU64,
    /// Answer "from <name>" instead of "from <name> as <model>".
    pub content_without_model: AtomicBool,
    /// The `x-request-id` of the last chat request.
    pub last_request_id: Mutex<Option<String>>,
}

pub struct Stub {
    pub addr: SocketAddr,
    pub behaviour: Arc<Behaviour>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Stub {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn served(&self) -> u64 {
        self.behaviour.served.load(Ordering::SeqCst)
    }

    pub fn fail_with(&self, status: u16) {
        self.behaviour.fail_status.store(status, Ordering::SeqCst);
    }

    pub fn last_request_id(&self) -> Option<String> {
        self.behaviour
            .last_request_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops accepting connections (a killed replica).
    pub fn kill(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.kill();
    }
}

struct StubState {
    name: String,
    url: String,
    behaviour: Arc<Behaviour>,
}

/// A replica that reads each whole POST (headers and `content-length` body), counts it and
/// closes the connection without a byte of answer, as a server process that crashed while
/// handling it; it goes on accepting connections, so each request it gets is counted.
pub struct Crashing {
    pub url: String,
    received: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Crashing {
    /// Complete requests received.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }
}

impl Drop for Crashing {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn crashing() -> Crashing {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let received = Arc::new(AtomicU64::new(0));
    let count = received.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + length {
                            if head.starts_with("post ") {
                                count.fetch_add(1, Ordering::SeqCst);
                            }
                            return; // dropping `conn` closes it: no answer
                        }
                    }
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    Crashing {
        url,
        received,
        task,
    }
}

/// A base URL on which nothing listens (a replica that is down).
pub async fn dead_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

pub async fn start(name: &str) -> Stub {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let behaviour = Arc::new(Behaviour::default());
    let state = Arc::new(StubState {
        name: name.to_string(),
        url: format!("http://{addr}"),
        behaviour: behaviour.clone(),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(chat))
        .route("/health", get(health))
        .with_state(state);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await;
    });
    Stub {
        addr,
        behaviour,
        shutdown: Some(tx),
    }
}

async fn health(State(s): State<Arc<StubState>>) -> StatusCode {
    if s.behaviour.unhealthy.load(Ordering::SeqCst) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

fn chunk(id: &str, model: &str, content: &str) -> String {
    let v = json!({"id": id, "object": "chat.completion.chunk", "model": model, "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]});
    format!("data: {v}\n\n")
}

async fn chat(
    State(s): State<Arc<StubState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let b = &s.behaviour;
    *b.last_request_id.lock().unwrap_or_else(|p| p.into_inner()) = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let model = body["model"].as_str().unwrap_or("").to_string();
    let delay = b.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let fail = b.fail_status.load(Ordering::SeqCst);
    if fail != 0 {
        return (
            StatusCode::from_u16(fail).unwrap(),
            Json(json!({"error": {
                "message": format!("stub failure: model `{model}` at {} refused the request", s.url),
                "type": if fail >= 500 { "server_error" } else { "invalid_request_error" }}})),
        )
            .into_response();
    }
    b.served.fetch_add(1, Ordering::SeqCst);
    let n = b.served.load(Ordering::SeqCst);
    let id = format!("chatcmpl-{}-{n}", s.name);
    let content = if b.content_without_model.load(Ordering::SeqCst) {
        format!("from {}", s.name)
    } else {
        format!("from {} as {}", s.name, model)
    };
    let usage = json!({"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS, "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS});
    if !body["stream"].as_bool().unwrap_or(false) {
        return Json(json!({"id": id, "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": usage}))
        .into_response();
    }
    let include_usage = body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let cut = b.cut_streams.load(Ordering::SeqCst);
    let mut parts: Vec<Result<String, std::io::Error>> = vec![
        Ok(chunk(&id, &model, "from ")),
        Ok(chunk(&id, &model, &s.name)),
    ];
    if cut {
        parts.truncate(1);
        parts.push(Err(std::io::Error::other("cut")));
    } else {
        if include_usage {
            parts.push(Ok(format!(
                "data: {}\n\n",
                json!({"id": id, "model": model, "choices": [], "usage": usage})
            )));
        }
        parts.push(Ok("data: [DONE]\n\n".to_string()));
    }
    // The cut comes a moment after the first chunk, so that the chunk reaches the gateway first.
    let stream = futures_util::StreamExt::then(futures_util::stream::iter(parts), |p| async move {
        if p.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        p
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}
