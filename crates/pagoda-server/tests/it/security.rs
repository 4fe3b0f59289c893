//! What a hostile client can make the server do, against its defaults: name files and URLs
//! as models, pull from loopback or `file://`, stall its headers or body, nest JSON deeply,
//! read paths out of error bodies. Each gets the documented status, no 5xx, no path in any
//! body, an `x-request-id`, and the server keeps serving with only loaded models in /metrics.

use crate::harness::{config, golden, start, tiny_llama};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The server's defaults: no directory allowed, no pulls; the tiny model named at start.
fn defaults() -> pagoda_server::ServerConfig {
    let mut c = config();
    c.model_dirs.clear();
    c
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
}

#[tokio::test]
async fn model_names_never_reach_the_filesystem() {
    let s = start(defaults()).await;
    let tiny_canonical = std::fs::canonicalize(tiny_llama()).expect("exists");
    let other_golden = golden("tiny-qwen2").display().to_string();
    let probes = [
        "/etc/passwd".to_string(),
        "/root".to_string(),
        "../../../../etc/passwd".to_string(),
        "/nonexistent/model.gguf".to_string(),
        other_golden.clone(),
        format!("{}/../tiny-qwen2", tiny_canonical.display()),
        "file:///etc/passwd".to_string(),
        "http://127.0.0.1:1/x.gguf".to_string(),
    ];
    let mut bodies = Vec::new();
    for p in &probes {
        let r = s.post("/v1/chat/completions", chat(p)).await;
        assert_eq!(r.status(), 404, "{p}");
        assert!(r.headers().contains_key("x-request-id"), "{p}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"]["code"], "model_not_found", "{p}");
        let message = v["error"]["message"].as_str().expect("message");
        // The same body whether or not something exists there: only the echoed name differs.
        bodies.push(message.replace(p.as_str(), "NAME"));
        let ollama_body = json!({"model": p, "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 2}});
        let ollama = s.post("/api/chat", ollama_body).await;
        assert_eq!(ollama.status(), 404, "{p}");
        let v: Value = ollama.json().await.expect("json");
        assert!(v["error"].is_string(), "Ollama's shape: {v}");
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "{bodies:?}");
    // The model named at start answers to any spelling of its file, as one model.
    let doubled = format!("/{}", tiny_canonical.display());
    let r = s.post("/v1/chat/completions", chat(&doubled)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(
        v["model"],
        tiny_llama(),
        "reported under the operator's spelling"
    );
    assert_eq!(s.state.registry.loaded().len(), 1, "one file, one model");
    assert!(
        s.state.config.memory_budget.is_some(),
        "loads over HTTP are bounded by default"
    );
    let metrics = s.metrics().await;
    for line in metrics.lines().filter(|l| l.contains("model_name=\"")) {
        assert!(
            line.contains(&format!("model_name=\"{}\"", tiny_llama())),
            "a label from a request: {line}"
        );
    }
}

#[tokio::test]
async fn pulls_over_http_are_off_and_never_touch_loopback_or_files() {
    // A listener that must receive nothing.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    let s = start(defaults()).await;
    let url = format!("http://127.0.0.1:{port}/model.gguf");
    let r = s
        .post("/api/pull", json!({"model": url, "stream": false}))
        .await;
    assert_eq!(r.status(), 403);
    let v: Value = r.json().await.expect("json");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("--allow-pull")),
        "{v}"
    );
    s.stop().await.expect("stops");

    // Enabled, and even with the loopback host listed as a source: the address guard holds.
    let mut c = defaults();
    c.pull.enabled = true;
    c.pull.allowed_sources = vec![format!("http://127.0.0.1:{port}")];
    let s = start(c).await;
    for (name, status) in [
        ("file:///etc/passwd".to_string(), 400),
        ("/etc/passwd".to_string(), 400),
        ("no-such-model:1b".to_string(), 404),
        (url.clone(), 400),
    ] {
        let r = s
            .post("/api/pull", json!({"model": name, "stream": false}))
            .await;
        assert_eq!(r.status().as_u16(), status, "{name}");
        assert!(r.headers().contains_key("x-request-id"));
        let text = r.text().await.expect("body");
        assert!(!text.contains("/etc") || name.contains("/etc"), "{text}");
        assert!(
            !text.contains(&*s.store.root().display().to_string()),
            "{text}"
        );
    }
    assert!(
        listener.accept().is_err(),
        "the loopback listener received a connection"
    );
    assert!(s.store.list().expect("list").is_empty(), "nothing stored");
}

/// A loopback HTTP server for pulls: `/to-file` redirects to `file:///etc/passwd`, `/to-port`
/// to `target` (another loopback port); anything else is 404. Counts the requests it gets.
fn redirecting_source(target: String) -> (u16, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]);
            let location = if head.starts_with("GET /to-file ") {
                Some("file:///etc/passwd")
            } else if head.starts_with("GET /to-port ") {
                Some(target.as_str())
            } else {
                None
            };
            let answer = match location {
                Some(l) => format!(
                    "HTTP/1.1 302 Found\r\nlocation: {l}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                ),
                None => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    .to_string(),
            };
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    (port, served)
}

#[tokio::test]
async fn pull_urls_and_their_redirects_are_judged_as_they_are_fetched() {
    // The port nothing may reach: not on the allow list.
    let forbidden = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let fport = forbidden.local_addr().expect("addr").port();
    forbidden.set_nonblocking(true).expect("nonblocking");
    let (sport, served) = redirecting_source(format!("http://127.0.0.1:{fport}/x.gguf"));
    let mut c = defaults();
    c.pull.enabled = true;
    c.pull.allow_private = true;
    c.pull.allowed_sources = vec![format!("http://127.0.0.1:{sport}")];
    let s = start(c).await;
    // Parser differentials: each names the forbidden port to a URL parser, and none reaches it.
    for name in [
        format!("http://127.0.0.1:{fport}\\@127.0.0.1:{sport}/x.gguf"),
        format!("http://127.0.0.1:{sport}@127.0.0.1:{fport}/x.gguf"),
        format!("http://127.0.0.1:{fport}#@127.0.0.1:{sport}/x.gguf"),
        format!("http:/127.0.0.1:{fport}/x.gguf"),
        format!("HTTP://127.0.0.1:{fport}/x.gguf"),
        format!("http://127.0.0.1:{fport}\t/x.gguf"),
    ] {
        let r = s
            .post("/api/pull", json!({"model": name, "stream": false}))
            .await;
        assert_eq!(r.status(), 400, "{name}");
        let v: Value = r.json().await.expect("json");
        assert!(v["error"].is_string(), "{name}: {v}");
    }
    assert_eq!(
        served.load(Ordering::SeqCst),
        0,
        "refused before connecting"
    );
    // Redirects: to file: (no panic, no read) and to a port the list does not name.
    for path in ["/to-file", "/to-port"] {
        let name = format!("http://127.0.0.1:{sport}{path}");
        let r = s
            .post("/api/pull", json!({"model": name, "stream": false}))
            .await;
        assert_eq!(r.status(), 400, "{path}");
        let v: Value = r.json().await.expect("json");
        let message = v["error"].as_str().expect("Ollama's error shape");
        assert!(message.contains("does not fetch from"), "{path}: {message}");
        assert!(
            !message.contains("passwd") && !message.contains(&format!(":{fport}/")),
            "{message}"
        );
    }
    assert_eq!(
        served.load(Ordering::SeqCst),
        2,
        "each redirect was asked for once"
    );
    assert!(
        forbidden.accept().is_err(),
        "the port off the allow list received a connection"
    );
    assert!(s.store.list().expect("list").is_empty(), "nothing stored");
    // Still serving.
    let r = s.post("/v1/chat/completions", chat(&tiny_llama())).await;
    assert_eq!(r.status(), 200);
}

#[cfg(unix)]
#[tokio::test]
async fn a_fifo_under_an_allowed_directory_is_not_found_at_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let fifo = dir.path().join("model.gguf");
    let c_path = std::ffi::CString::new(fifo.display().to_string()).expect("path");
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0, "mkfifo");
    let mut c = defaults();
    c.model_dirs = vec![dir.path().to_path_buf()];
    let s = start(c).await;
    let missing = dir.path().join("missing.gguf");
    let mut bodies = Vec::new();
    for path in [&fifo, &missing] {
        let name = path.display().to_string();
        let started = Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            s.post("/v1/chat/completions", chat(&name)),
        )
        .await
        .expect("answered, not hung on the FIFO");
        assert!(started.elapsed() < Duration::from_secs(1), "{name}");
        assert_eq!(r.status(), 404, "{name}");
        let text = r.text().await.expect("body");
        bodies.push(text.replace(name.as_str(), "NAME"));
        let ollama = json!({"model": name, "prompt": "hi", "stream": false});
        let r = s.post("/api/generate", ollama).await;
        assert_eq!(r.status(), 404, "{name}");
    }
    assert_eq!(
        bodies[0], bodies[1],
        "a FIFO and a missing file look the same"
    );
}

/// Sends `head` (a request with no body yet), then reads one response (headers and the
/// Content-Length body), without waiting for the server to close.
fn one_response(addr: std::net::SocketAddr, head: &str) -> (String, Duration) {
    let mut tcp = TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let started = Instant::now();
    tcp.write_all(head.as_bytes()).expect("send");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&out).to_string();
        if let Some((headers, body)) = text.split_once("\r\n\r\n") {
            let len = headers
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_string)
                })
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if body.len() >= len {
                return (text, started.elapsed());
            }
        }
        match tcp.read(&mut buf) {
            Ok(0) | Err(_) => return (text, started.elapsed()),
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_over_the_limit_is_413_before_it_is_read() {
    let s = start(defaults()).await;
    let limit = s.state.config.max_body_bytes;
    let addr = s.addr;
    for (path, openai) in [("/v1/chat/completions", true), ("/api/chat", false)] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 100000000000\r\n\r\n"
        );
        let (answer, took) = tokio::task::spawn_blocking(move || one_response(addr, &head))
            .await
            .expect("joined");
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer:?}");
        assert!(took < Duration::from_secs(2), "{path} took {took:?}");
        let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        let v: Value = serde_json::from_str(body).expect("a JSON error body");
        let message = if openai {
            v["error"]["message"].as_str()
        } else {
            v["error"].as_str()
        }
        .unwrap_or_else(|| panic!("{path}: the API's error shape: {v}"));
        assert!(message.contains(&limit.to_string()), "{path}: {message}");
    }
}

/// Sends raw bytes, then reads the whole answer (until the server closes).
fn raw_exchange(addr: std::net::SocketAddr, parts: &[(&[u8], Duration)]) -> (String, Duration) {
    let mut tcp = TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let started = Instant::now();
    for (bytes, pause) in parts {
        if tcp.write_all(bytes).is_err() {
            break;
        }
        std::thread::sleep(*pause);
    }
    let mut out = String::new();
    let mut buf = [0u8; 4096];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
    (out, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_and_trickled_requests_get_408_within_the_timeouts() {
    let mut c = defaults();
    c.connections.header_timeout = Duration::from_millis(800);
    c.connections.body_timeout = Duration::from_millis(800);
    let s = start(c).await;
    let addr = s.addr;
    let stalled_headers = tokio::task::spawn_blocking(move || {
        raw_exchange(
            addr,
            &[(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n",
                Duration::ZERO,
            )],
        )
    });
    let stalled_body = tokio::task::spawn_blocking(move || {
        raw_exchange(
            addr,
            &[(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"mo",
                Duration::ZERO,
            )],
        )
    });
    let trickle: Vec<(&[u8], Duration)> = std::iter::once((
        &b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-length: 40\r\n\r\n"[..],
        Duration::ZERO,
    ))
    .chain((0..40).map(|_| (&b" "[..], Duration::from_millis(100))))
    .collect();
    let trickled = tokio::task::spawn_blocking(move || raw_exchange(addr, &trickle));
    let idle = tokio::task::spawn_blocking(move || raw_exchange(addr, &[]));
    for (what, job) in [
        ("stalled headers", stalled_headers),
        ("stalled body", stalled_body),
        ("trickled body", trickled),
    ] {
        let (answer, took) = job.await.expect("joined");
        assert!(
            answer.starts_with("HTTP/1.1 408"),
            "{what}: {answer:?} after {took:?}"
        );
        assert!(
            answer.to_ascii_lowercase().contains("x-request-id:"),
            "{what}"
        );
        assert!(took < Duration::from_secs(6), "{what} took {took:?}");
    }
    let (answer, took) = idle.await.expect("joined");
    assert!(answer.is_empty(), "an idle connection is closed silently");
    assert!(
        took < Duration::from_secs(6),
        "idle connection held {took:?}"
    );
    // Still serving.
    let r = s.post("/v1/chat/completions", chat(&tiny_llama())).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_one_to_close() {
    let mut c = defaults();
    c.connections.max_connections = 2;
    c.connections.header_timeout = Duration::from_secs(2);
    let s = start(c).await;
    // Two idle connections take both places.
    let a = TcpStream::connect(s.addr).expect("connect");
    let b = TcpStream::connect(s.addr).expect("connect");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let served = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let url = s.url("/health");
    let done = served.clone();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let r = client
            .get(url)
            .send()
            .await
            .expect("answered once a place frees");
        done.fetch_add(1, Ordering::SeqCst);
        (r.status(), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        served.load(Ordering::SeqCst),
        0,
        "a third connection was served"
    );
    drop((a, b));
    let (status, took) = waiting.await.expect("joined");
    assert_eq!(status, 200);
    assert!(took >= Duration::from_millis(500), "{took:?}");
}

#[tokio::test]
async fn every_response_carries_a_request_id_and_5xx_bodies_carry_no_paths() {
    let s = start(defaults()).await;
    let r = s.post("/v1/chat/completions", chat(&tiny_llama())).await;
    let id = r.headers()["x-request-id"]
        .to_str()
        .expect("ascii")
        .to_string();
    assert!(id.starts_with("req-"), "{id}");
    for path in ["/health", "/metrics", "/v1/models", "/nope", "/api/nope"] {
        let r = s.client.get(s.url(path)).send().await.expect("sent");
        assert!(r.headers().contains_key("x-request-id"), "{path}");
    }
    // Ollama routes answer errors in Ollama's shape, unknown ones included.
    let r = s.client.get(s.url("/api/nope")).send().await.expect("sent");
    let v: Value = r.json().await.expect("json");
    assert!(v["error"].is_string(), "{v}");
    // A client's own id is kept when plain, replaced otherwise.
    let r = s
        .client
        .get(s.url("/health"))
        .header("x-request-id", "trace-42")
        .send()
        .await
        .expect("sent");
    assert_eq!(r.headers()["x-request-id"], "trace-42");
    let r = s
        .client
        .get(s.url("/health"))
        .header("x-request-id", "a b")
        .send()
        .await
        .expect("sent");
    assert_ne!(r.headers()["x-request-id"], "a b");
    // Deep nesting inside an unknown field: 400 naming the limit, not a walk of 100k levels.
    let deep = format!(
        "{{\"model\":\"{}\",\"messages\":[{{\"role\":\"user\",\"content\":\"x\"}}],\"x\":{}{}}}",
        tiny_llama(),
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let r = s.post_raw("/v1/chat/completions", deep.into_bytes()).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "too_deep", "{v}");
    // A bad tool is refused with the field named.
    let mut with_tools = chat(&tiny_llama());
    with_tools["tools"] =
        json!([{"type": "function", "function": {"name": "f", "parameters": []}}]);
    let r = s.post("/v1/chat/completions", with_tools).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["param"], "tools");
}

#[tokio::test]
async fn an_unloadable_model_is_the_clients_4xx_and_the_reason_stays_in_the_log() {
    let dir = tempfile::tempdir().expect("tmp");
    let broken = dir.path().join("broken.gguf");
    let seed = golden("").join("../../fuzz/seeds/tiny_llama.gguf");
    let mut bytes = std::fs::read(&seed).expect("the fuzz seed: a valid tiny GGUF");
    // A valid header cut off in its tensor table.
    bytes.truncate(bytes.len() / 3);
    std::fs::write(&broken, bytes).expect("write");
    let mut c = defaults();
    c.model_dirs = vec![dir.path().to_path_buf()];
    let s = start(c).await;
    let r = s
        .post("/v1/chat/completions", chat(&broken.display().to_string()))
        .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "model_load_failed", "{v}");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(message.contains("x-request-id"), "{message}");
    assert!(
        !message.contains("GGUF magic") && !message.contains("tensor"),
        "{message}"
    );
    assert!(s.state.registry.loaded().len() == 1);
}
