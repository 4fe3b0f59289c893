//! What a client learns about the upstreams behind a route (nothing, unless
//! `server.expose_upstream_details` is on), and the request id every response carries.

use serde_json::{json, Value};

use crate::harness::{key_block, start, TestGateway, ADMIN_KEY};
use crate::stub;

const KEY: &str = "pk-privacy-test-key";
/// The model name the stub backend knows, which clients must never see.
const BACKEND_MODEL: &str = "secret-backend-7b";

/// A route `chat` over a target whose backend calls its model [`BACKEND_MODEL`].
fn alias_over(url: &str, server: &str) -> String {
    format!(
        "{server}\n[[target]]\nname = \"backend\"\nmodel = \"{BACKEND_MODEL}\"\nreplicas = [\"{url}\"]\n[[route]]\nmodel = \"chat\"\ntarget = \"backend\"\n{}",
        key_block("k", KEY, "")
    )
}

fn request_id(r: &reqwest::Response) -> String {
    r.headers()
        .get("x-request-id")
        .unwrap_or_else(|| panic!("no x-request-id on a {} answer", r.status()))
        .to_str()
        .unwrap()
        .to_string()
}

/// Fails when `text` names the backend model or the upstream's address.
fn assert_private(text: &str, upstream_url: &str) {
    let port = upstream_url.rsplit(':').next().unwrap();
    for leak in [BACKEND_MODEL, upstream_url, "127.0.0.1", port] {
        assert!(!text.contains(leak), "{leak:?} leaked: {text}");
    }
}

async fn post_chat(gw: &TestGateway, body: Value, request_id: Option<&str>) -> reqwest::Response {
    let mut req = gw
        .client
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(KEY)
        .json(&body);
    if let Some(id) = request_id {
        req = req.header("x-request-id", id);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn an_alias_names_itself_in_answers_streams_cache_hits_and_passed_through_errors() {
    let backend = stub::start("s").await;
    backend
        .behaviour
        .content_without_model
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let url = backend.url();
    let gw = start(&alias_over(&url, "")).await;

    let r = gw.chat(KEY, "chat", json!({})).await;
    assert_eq!(r.status(), 200);
    request_id(&r);
    let text = r.text().await.unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["model"], "chat");
    assert_eq!(v["choices"][0]["message"]["content"], "from s");
    assert_eq!(v["usage"]["completion_tokens"], stub::COMPLETION_TOKENS);
    assert_private(&text, &url);

    for include_usage in [false, true] {
        let r = gw
            .chat(
                KEY,
                "chat",
                json!({"stream": true, "stream_options": {"include_usage": include_usage}}),
            )
            .await;
        assert_eq!(r.status(), 200);
        request_id(&r);
        let text = r.text().await.unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        let events: Vec<Value> = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(events.len(), 2 + usize::from(include_usage), "{text}");
        assert!(events.iter().all(|e| e["model"] == "chat"), "{text}");
        assert_private(&text, &url);
    }

    // Cached answers were stored as relayed: they name the route too.
    for expected in ["miss", "hit"] {
        let r = gw.chat(KEY, "chat", json!({"temperature": 0})).await;
        assert_eq!(r.headers()["x-pagoda-cache-status"], expected);
        request_id(&r);
        let text = r.text().await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["model"], "chat", "{expected}");
        assert_private(&text, &url);
    }

    // The backend's own 400 is passed through, saying "chat" where it named itself.
    backend.fail_with(400);
    let r = gw.chat(KEY, "chat", json!({})).await;
    assert_eq!(r.status(), 400);
    request_id(&r);
    let text = r.text().await.unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["error"]["message"],
        "stub failure: model `chat` at chat refused the request"
    );
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_private(&text, &url);
}

#[tokio::test]
async fn with_every_replica_down_the_503_names_the_route_and_the_request_id_only() {
    let dead = stub::dead_url().await;
    let config = format!(
        "{}[[target]]\nname = \"sorry\"\ncanned_reply = \"Busy, retry soon.\"\n[[route]]\nmodel = \"chat-soft\"\ntarget = \"backend\"\nfallback = [\"sorry\"]\n",
        alias_over(&dead, "")
    );
    let gw = start(&config).await;
    for stream in [false, true] {
        let id = format!("outage-{stream}");
        let r = post_chat(
            &gw,
            json!({"model": "chat", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}),
            Some(&id),
        )
        .await;
        assert_eq!(r.status(), 503);
        assert_eq!(request_id(&r), id);
        let text = r.text().await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], "upstream_unavailable");
        assert_eq!(
            v["error"]["message"],
            format!("route `chat`: no healthy replica answered; retry later (request id {id})")
        );
        assert_private(&text, &dead);
        assert!(!text.to_lowercase().contains("connect"), "{text}");
        assert!(
            !text.contains("backend"),
            "the target's name leaked: {text}"
        );
    }
    // The ledger keeps the client's ids for both failures.
    let rows = gw.ledger_rows().await;
    assert_eq!(
        rows,
        [
            ("outage-false".to_string(), 503),
            ("outage-true".to_string(), 503)
        ]
    );

    // A canned reply at the end of the chain calls itself by the route too.
    let r = gw.chat(KEY, "chat-soft", json!({})).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], "chat-soft");
    assert_eq!(v["choices"][0]["message"]["content"], "Busy, retry soon.");
}

#[tokio::test]
async fn a_backend_too_slow_for_its_deadline_is_a_504_that_names_the_route() {
    let slow = stub::start("slow").await;
    slow.behaviour
        .delay_ms
        .store(2000, std::sync::atomic::Ordering::SeqCst);
    let config = alias_over(&slow.url(), "").replace(
        "model = \"secret-backend-7b\"",
        "model = \"secret-backend-7b\"\ntimeout_ms = 100",
    );
    let gw = start(&config).await;
    let r = gw.chat(KEY, "chat", json!({})).await;
    assert_eq!(r.status(), 504);
    let id = request_id(&r);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_timeout");
    assert_eq!(
        v["error"]["message"],
        format!("route `chat`: no replica answered in time; retry later (request id {id})")
    );
}

#[tokio::test]
async fn expose_upstream_details_shows_the_backend_model_and_the_failure() {
    let backend = stub::start("s").await;
    let dead = stub::dead_url().await;
    let config = format!(
        "{}[[target]]\nname = \"gone\"\nreplicas = [\"{dead}\"]\n[[route]]\nmodel = \"down\"\ntarget = \"gone\"\n",
        alias_over(&backend.url(), "[server]\nexpose_upstream_details = true")
    );
    let gw = start(&config).await;
    let v: Value = gw.chat(KEY, "chat", json!({})).await.json().await.unwrap();
    assert_eq!(v["model"], BACKEND_MODEL);
    let text = gw
        .chat(KEY, "chat", json!({"stream": true}))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(&format!("\"model\":\"{BACKEND_MODEL}\"")),
        "{text}"
    );

    backend.fail_with(400);
    let v: Value = gw.chat(KEY, "chat", json!({})).await.json().await.unwrap();
    assert_eq!(
        v["error"]["message"],
        format!(
            "stub failure: model `{BACKEND_MODEL}` at {} refused the request",
            backend.url()
        )
    );

    let r = gw.chat(KEY, "down", json!({})).await;
    assert_eq!(r.status(), 503);
    request_id(&r);
    let v: Value = r.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("target 'gone' connect") && message.contains(&dead),
        "{message}"
    );
}

#[tokio::test]
async fn a_client_request_id_is_used_throughout_and_an_unsafe_one_replaced() {
    let backend = stub::start("s").await;
    let gw = start(&alias_over(&backend.url(), "")).await;
    let body = json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]});

    let longest = "x".repeat(128);
    for kept in ["client-abc.1:2_3", longest.as_str()] {
        let r = post_chat(&gw, body.clone(), Some(kept)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(request_id(&r), kept);
        assert_eq!(
            backend.last_request_id().as_deref(),
            Some(kept),
            "sent upstream"
        );
    }
    let too_long = "y".repeat(129);
    let mut replaced = Vec::new();
    for unsafe_id in [too_long.as_str(), "bad id;drop", "a/b"] {
        let r = post_chat(&gw, body.clone(), Some(unsafe_id)).await;
        assert_eq!(r.status(), 200);
        let id = request_id(&r);
        assert_ne!(id, unsafe_id);
        assert!(
            !id.is_empty()
                && id.len() <= 128
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b)),
            "{id:?}"
        );
        assert_eq!(backend.last_request_id(), Some(id.clone()), "sent upstream");
        replaced.push(id);
    }
    let rows: Vec<String> = gw
        .ledger_rows()
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let mut expected = vec!["client-abc.1:2_3".to_string(), longest.clone()];
    expected.extend(replaced);
    assert_eq!(rows, expected, "the ledger rows carry the same ids");
}

#[tokio::test]
async fn a_429_from_the_limits_carries_retry_after_and_a_request_id() {
    let backend = stub::start("s").await;
    let config = alias_over(&backend.url(), "")
        .replace(&key_block("k", KEY, ""), &key_block("k", KEY, "rpm = 1"));
    let gw = start(&config).await;
    assert_eq!(gw.chat(KEY, "chat", json!({})).await.status(), 200);
    let r = post_chat(
        &gw,
        json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}),
        Some("limited-1"),
    )
    .await;
    assert_eq!(r.status(), 429);
    assert_eq!(request_id(&r), "limited-1");
    let after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&after), "Retry-After {after}");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
}

#[tokio::test]
async fn every_response_carries_a_request_id() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let backend = stub::start("s").await;
    let config = alias_over(
        &backend.url(),
        "[server]\nmax_body_bytes = 2000\nbody_timeout_ms = 300",
    )
    .replace(
        "[[route]]\nmodel = \"chat\"",
        "[[route]]\nmodel = \"other\"\ntarget = \"backend\"\n[[route]]\nmodel = \"chat\"",
    ) + &key_block("narrow", "pk-narrow", "models = [\"other\"]");
    let gw = start(&config).await;
    let url = |path: &str| format!("{}{path}", gw.url);
    let chat_body = json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]});
    let c = &gw.client;
    let answers = vec![
        ("answer", 200, gw.chat(KEY, "chat", json!({})).await),
        (
            "stream",
            200,
            gw.chat(KEY, "chat", json!({"stream": true})).await,
        ),
        (
            "not JSON",
            400,
            c.post(url("/v1/chat/completions"))
                .bearer_auth(KEY)
                .body("{")
                .send()
                .await
                .unwrap(),
        ),
        (
            "no key",
            401,
            c.post(url("/v1/chat/completions"))
                .json(&chat_body)
                .send()
                .await
                .unwrap(),
        ),
        (
            "model not allowed",
            403,
            gw.chat("pk-narrow", "chat", json!({})).await,
        ),
        ("unknown model", 404, gw.chat(KEY, "nope", json!({})).await),
        (
            "too large",
            413,
            gw.chat(
                KEY,
                "chat",
                json!({"messages": [{"role": "user", "content": "x".repeat(3000)}]}),
            )
            .await,
        ),
        (
            "unknown path",
            404,
            c.get(url("/v2/nothing")).send().await.unwrap(),
        ),
        (
            "wrong method",
            405,
            c.get(url("/v1/chat/completions")).send().await.unwrap(),
        ),
        (
            "models",
            200,
            c.get(url("/v1/models"))
                .bearer_auth(KEY)
                .send()
                .await
                .unwrap(),
        ),
        (
            "unknown feedback id",
            404,
            c.post(url("/v1/feedback"))
                .bearer_auth(KEY)
                .json(&json!({"response_id": "x", "rating": "up"}))
                .send()
                .await
                .unwrap(),
        ),
        ("health", 200, c.get(url("/health")).send().await.unwrap()),
        ("ready", 200, c.get(url("/ready")).send().await.unwrap()),
        ("metrics", 200, c.get(url("/metrics")).send().await.unwrap()),
        (
            "admin",
            200,
            c.get(url("/admin/keys"))
                .bearer_auth(ADMIN_KEY)
                .send()
                .await
                .unwrap(),
        ),
        (
            "admin without key",
            401,
            c.get(url("/admin/keys")).send().await.unwrap(),
        ),
    ];
    let mut ids = std::collections::HashSet::new();
    for (what, expected, r) in &answers {
        assert_eq!(r.status().as_u16(), *expected, "{what}");
        assert!(ids.insert(request_id(r)), "{what}: a request id was reused");
    }
    let (status, v) = {
        let r = c.get(url("/v2/nothing")).send().await.unwrap();
        (r.status(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(status, 404);
    assert_eq!(
        v["error"]["type"], "not_found_error",
        "unknown paths are OpenAI-shaped"
    );

    // A slow client's 408 is written by the same router.
    let addr = gw.url.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {KEY}\r\nx-request-id: slow-1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"model\""
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), slow.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).to_lowercase();
    assert!(answer.starts_with("http/1.1 408"), "{answer}");
    assert!(answer.contains("\r\nx-request-id: slow-1\r\n"), "{answer}");
}

#[tokio::test]
async fn an_answer_cached_while_details_were_exposed_is_not_served_once_they_are_private() {
    let backend = stub::start("s").await;
    let exposed = alias_over(&backend.url(), "[server]\nexpose_upstream_details = true");
    let gw = start(&exposed).await;
    let deterministic = json!({"temperature": 0});
    let v: Value = gw
        .chat(KEY, "chat", deterministic.clone())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["model"], BACKEND_MODEL);
    let r = gw.chat(KEY, "chat", deterministic.clone()).await;
    assert_eq!(r.headers()["x-pagoda-cache-status"], "hit");

    gw.rewrite(&alias_over(&backend.url(), ""));
    let r = gw.admin_post("/admin/reload", json!({})).await;
    assert_eq!(r.status(), 200);
    let r = gw.chat(KEY, "chat", deterministic.clone()).await;
    assert_eq!(
        r.headers()["x-pagoda-cache-status"],
        "miss",
        "the exposing entry is kept apart"
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], "chat");
    assert_eq!(backend.served(), 2);
}
