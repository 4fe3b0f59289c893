//! Keys, limits, budgets, cache and the usage ledger through a running gateway; bad input and
//! abuse.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::harness::{content, key_block, redis_url, start, ADMIN_KEY};
use crate::stub;

const KEY: &str = "pk-access-test-key";

fn one_target(a: &stub::Stub, extra: &str) -> String {
    format!(
        "{extra}\n[[target]]\nname = \"a\"\nreplicas = [\"{}\"]\n[[route]]\nmodel = \"chat\"\ntarget = \"a\"\n[[route]]\nmodel = \"other\"\ntarget = \"a\"\n",
        a.url()
    )
}

async fn error_of(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn missing_malformed_unknown_and_revoked_keys_get_401() {
    let a = stub::start("a").await;
    let gw = start(&format!(
        "{}{}",
        one_target(&a, ""),
        key_block("k", KEY, "")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", gw.url);
    let body = json!({"model": "chat", "messages": []});
    let (s, v) = error_of(gw.client.post(&url).json(&body).send().await.unwrap()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );
    let (s, _) = error_of(
        gw.client
            .post(&url)
            .header("authorization", "Basic abc")
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 401);
    let (s, _) = error_of(gw.chat("pk-nope", "chat", json!({})).await).await;
    assert_eq!(s, 401);

    // A key made through the admin API works until it is revoked.
    let r = gw
        .admin_post("/admin/keys", json!({"name": "temp", "models": ["chat"]}))
        .await;
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.unwrap();
    let secret = created["key"].as_str().unwrap().to_string();
    assert!(
        !created["record"].to_string().contains("sha256"),
        "no hash in admin answers"
    );
    assert_eq!(
        content(gw.chat(&secret, "chat", json!({})).await).await,
        "from a as a"
    );
    let (s, v) = error_of(gw.chat(&secret, "other", json!({})).await).await;
    assert_eq!(s, 403, "{v}");
    let r = gw
        .client
        .delete(format!("{}/admin/keys/temp", gw.url))
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (s, v) = error_of(gw.chat(&secret, "chat", json!({})).await).await;
    assert_eq!(s, 401);
    assert!(v["error"]["message"].as_str().unwrap().contains("revoked"));
    // The admin API refuses ordinary keys.
    let r = gw
        .client
        .get(format!("{}/admin/keys", gw.url))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn bad_bodies_get_clear_errors() {
    let a = stub::start("a").await;
    let gw = start(&format!(
        "{}{}",
        one_target(&a, "[server]\nmax_body_bytes = 2000"),
        key_block("k", KEY, "")
    ))
    .await;
    let url = format!("{}/v1/chat/completions", gw.url);
    let big = json!({"model": "chat", "messages": [{"role": "user", "content": "x".repeat(5000)}]});
    let (s, v) = error_of(
        gw.client
            .post(&url)
            .bearer_auth(KEY)
            .json(&big)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (413, Some("request_too_large"))
    );
    let (s, _) = error_of(
        gw.client
            .post(&url)
            .bearer_auth(KEY)
            .body("{not json")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 400);
    let (s, v) = error_of(gw.chat(KEY, "no-such-model", json!({})).await).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    let (s, _) = error_of(
        gw.client
            .post(&url)
            .bearer_auth(KEY)
            .json(&json!({"messages": []}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpm_limits_answer_429_with_retry_after_and_a_flood_does_not_starve_other_keys() {
    let a = stub::start("a").await;
    a.behaviour
        .delay_ms
        .store(5, std::sync::atomic::Ordering::SeqCst);
    let config = format!(
        "{}{}{}",
        one_target(&a, ""),
        key_block("flood", KEY, "rpm = 20"),
        key_block("calm", "pk-calm", "")
    );
    let gw = Arc::new(start(&config).await);
    // 300 concurrent requests from one key ...
    let mut flood = Vec::new();
    for _ in 0..300 {
        let gw = gw.clone();
        flood.push(tokio::spawn(async move {
            let r = gw.chat(KEY, "chat", json!({})).await;
            let after = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
            (r.status().as_u16(), after)
        }));
    }
    // ... while another key keeps working, with no error and no long wait.
    for _ in 0..10 {
        let t = std::time::Instant::now();
        assert_eq!(gw.chat("pk-calm", "chat", json!({})).await.status(), 200);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "the calm key waited {:?}",
            t.elapsed()
        );
    }
    let mut ok = 0;
    for t in flood {
        match t.await.unwrap() {
            (200, _) => ok += 1,
            (429, Some(after)) => assert!((1..=60).contains(&after)),
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(ok, 20, "rpm = 20");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_holds_under_concurrency() {
    let a = stub::start("a").await;
    // Each request is estimated at 25 tokens ("hello\n" 6 bytes + 8 template + 1, max_tokens
    // 10), an upper bound of what it costs (15).
    let config = format!(
        "{}{}",
        one_target(&a, ""),
        key_block("b", KEY, "budget_tokens = 100")
    );
    let gw = Arc::new(start(&config).await);
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let gw = gw.clone();
        tasks.push(tokio::spawn(async move {
            gw.chat(KEY, "chat", json!({"max_tokens": 10}))
                .await
                .status()
                .as_u16()
        }));
    }
    let mut served = 0u64;
    for t in tasks {
        served += u64::from(t.await.unwrap() == 200);
    }
    // Reservations never exceed the budget and settle below their estimate: 4 to 6 served.
    assert!((4..=6).contains(&served), "served {served}");
    gw.gateway.usage.flush().await;
    let usage = gw.admin_get("/admin/usage").await;
    let spent: u64 = usage["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["total_tokens"].as_u64().unwrap())
        .sum();
    assert!(spent <= 100, "spent {spent} tokens of a 100 budget");
    assert_eq!(
        spent,
        served * (stub::PROMPT_TOKENS + stub::COMPLETION_TOKENS)
    );
}

#[tokio::test]
async fn deterministic_requests_are_cached_and_the_header_opts_out() {
    let a = stub::start("a").await;
    let gw = start(&format!(
        "{}{}",
        one_target(&a, ""),
        key_block("k", KEY, "")
    ))
    .await;
    let first = gw.chat(KEY, "chat", json!({"temperature": 0})).await;
    assert_eq!(first.headers()["x-pagoda-cache-status"], "miss");
    let first = content(first).await;
    let second = gw.chat(KEY, "chat", json!({"temperature": 0})).await;
    assert_eq!(second.headers()["x-pagoda-cache-status"], "hit");
    assert_eq!(content(second).await, first);
    assert_eq!(a.served(), 1);
    let r = gw
        .client
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(KEY)
        .header("x-pagoda-cache", "no-cache")
        .json(&json!({"model": "chat", "messages": [{"role": "user", "content": "hello"}], "temperature": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-pagoda-cache-status"], "bypass");
    assert_eq!(a.served(), 2);
    // Sampling requests are never cached.
    let r = gw.chat(KEY, "chat", json!({"temperature": 0.8})).await;
    assert_eq!(r.headers()["x-pagoda-cache-status"], "bypass");
}

#[tokio::test]
async fn usage_is_recorded_per_key_and_metrics_are_exported() {
    let a = stub::start("a").await;
    let gw = start(&format!(
        "{}{}{}",
        one_target(&a, ""),
        key_block("k1", KEY, ""),
        key_block("k2", "pk-two", "")
    ))
    .await;
    for _ in 0..3 {
        content(gw.chat(KEY, "chat", json!({})).await).await;
    }
    let text = gw
        .chat("pk-two", "chat", json!({"stream": true}))
        .await
        .text()
        .await
        .unwrap();
    assert!(text.ends_with("[DONE]\n\n"));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let usage = gw.admin_get("/admin/usage").await;
    let rows = usage["data"].as_array().unwrap();
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["key_name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(row("k1")["requests"], 3);
    assert_eq!(row("k1")["prompt_tokens"], 3 * stub::PROMPT_TOKENS);
    assert_eq!(
        row("k2")["completion_tokens"],
        stub::COMPLETION_TOKENS,
        "stream usage comes from the backend's usage chunk"
    );
    let metrics = gw.metrics().await;
    for name in [
        "pagoda_gateway_requests_total",
        "pagoda_gateway_request_duration_seconds",
        "pagoda_gateway_tokens_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_and_budgets_hold_across_two_gateways_sharing_redis() {
    let Some(redis) = redis_url() else { return };
    let a = stub::start("a").await;
    let prefix = format!("it-{}", rand::random::<u32>());
    let shared = format!("[redis]\nurl = \"{redis}\"\nprefix = \"{prefix}\"\n");
    let config = format!(
        "{}{}{}",
        one_target(&a, &shared),
        key_block("rl", KEY, "rpm = 10"),
        key_block("bud", "pk-budget", "budget_tokens = 60")
    );
    let g1 = Arc::new(start(&config).await);
    let g2 = Arc::new(start(&config).await);
    let mut ok = 0;
    for i in 0..30 {
        let gw = if i % 2 == 0 { &g1 } else { &g2 };
        ok += usize::from(gw.chat(KEY, "chat", json!({})).await.status() == 200);
    }
    assert_eq!(ok, 10, "rpm 10 across two instances");

    let mut tasks = Vec::new();
    for i in 0..30 {
        let gw = if i % 2 == 0 { g1.clone() } else { g2.clone() };
        tasks.push(tokio::spawn(async move {
            gw.chat("pk-budget", "chat", json!({"max_tokens": 10}))
                .await
                .status()
                .as_u16()
        }));
    }
    let mut served = 0u64;
    for t in tasks {
        served += u64::from(t.await.unwrap() == 200);
    }
    let spent = served * (stub::PROMPT_TOKENS + stub::COMPLETION_TOKENS);
    assert!(
        served >= 2 && spent <= 60,
        "served {served}, spent {spent} of 60"
    );
}

#[tokio::test]
async fn a_slow_client_gets_408_and_does_not_block_others() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = stub::start("a").await;
    let gw = start(&format!(
        "{}{}",
        one_target(&a, "[server]\nbody_timeout_ms = 300"),
        key_block("k", KEY, "")
    ))
    .await;
    let addr = gw.url.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"model\""
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    // Meanwhile another client is served normally.
    assert_eq!(
        content(gw.chat(KEY, "chat", json!({})).await).await,
        "from a as a"
    );
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), slow.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_gives_its_reservation_back() {
    let a = stub::start("a").await;
    a.behaviour
        .delay_ms
        .store(600, std::sync::atomic::Ordering::SeqCst);
    // The budget holds one request's estimate (25 tokens for this body) and no more.
    let gw = start(&format!(
        "{}{}",
        one_target(&a, ""),
        key_block("k", KEY, "budget_tokens = 30")
    ))
    .await;
    let impatient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(150))
        .build()
        .unwrap();
    let r = impatient
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(KEY)
        .json(&json!({"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 10}))
        .send()
        .await;
    assert!(r.is_err(), "the client gave up");
    a.behaviour
        .delay_ms
        .store(0, std::sync::atomic::Ordering::SeqCst);
    // Once the gateway notices, the reservation is released and the next request fits.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let r = gw.chat(KEY, "chat", json!({"max_tokens": 10})).await;
        if r.status() == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned request's reservation was never released"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn stalled_headers_get_408_and_idle_connections_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = stub::start("a").await;
    let gw = start(&format!(
        "{}{}",
        one_target(&a, "[server]\nheader_timeout_ms = 300"),
        key_block("k", KEY, "")
    ))
    .await;
    let addr = gw.url.trim_start_matches("http://").to_string();
    let read_all = |mut s: tokio::net::TcpStream| async move {
        let mut out = Vec::new();
        let started = std::time::Instant::now();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out))
            .await
            .expect("the gateway closed the connection");
        (
            String::from_utf8_lossy(&out).into_owned(),
            started.elapsed(),
        )
    };
    let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stalled
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let (answer, took) = read_all(stalled).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("x-request-id:"),
        "{answer}"
    );
    assert!(took < std::time::Duration::from_secs(3), "{took:?}");
    let idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (answer, took) = read_all(idle).await;
    assert!(answer.is_empty(), "{answer}");
    assert!(took < std::time::Duration::from_secs(3), "{took:?}");
    // Still serving.
    assert_eq!(
        content(gw.chat(KEY, "chat", json!({})).await).await,
        "from a as a"
    );
}
