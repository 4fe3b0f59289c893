//! What bad input and heavy or broken clients get: the documented status and error body,
//! and a server that keeps serving with its KV pool returned to empty.

use crate::harness::{config, expect_openai_error, sse_data, start, tiny_llama};
use futures_util::StreamExt;
use serde_json::{json, Value};

#[tokio::test]
async fn bad_requests_get_their_status_and_an_openai_error_body() {
    let s = start(config()).await;
    let m = tiny_llama();
    let chat = "/v1/chat/completions";
    let cases: Vec<(&str, Vec<u8>, u16, Option<&str>)> = vec![
        ("malformed JSON", b"{\"model\": ".to_vec(), 400, None),
        ("not an object", b"[1,2,3]".to_vec(), 400, None),
        ("empty body", Vec::new(), 400, None),
        ("invalid UTF-8", b"{\"model\": \"\xff\xfe\", \"messages\": []}".to_vec(), 400, None),
        ("messages wrong type", json!({"model": m, "messages": "hi"}).to_string().into_bytes(), 400, None),
        ("empty messages", json!({"model": m, "messages": []}).to_string().into_bytes(), 400, Some("messages")),
        ("unknown role", json!({"model": m, "messages": [{"role": "wizard", "content": "x"}]}).to_string().into_bytes(), 400, Some("messages")),
        ("negative max_tokens", json!({"model": m, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}).to_string().into_bytes(), 400, None),
        ("huge max_tokens", json!({"model": m, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1e30}).to_string().into_bytes(), 400, None),
        ("max_tokens over the context", json!({"model": m, "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}).to_string().into_bytes(), 400, Some("max_tokens")),
        ("temperature out of range", json!({"model": m, "messages": [{"role": "user", "content": "x"}], "temperature": 5}).to_string().into_bytes(), 400, Some("temperature")),
        ("n too large", json!({"model": m, "messages": [{"role": "user", "content": "x"}], "n": 1000}).to_string().into_bytes(), 400, Some("n")),
        ("top_p out of range", json!({"model": m, "messages": [{"role": "user", "content": "x"}], "top_p": 0}).to_string().into_bytes(), 400, Some("top_p")),
        ("prompt longer than the context", json!({"model": m, "messages": [{"role": "user", "content": "word ".repeat(2000)}]}).to_string().into_bytes(), 400, None),
        ("unknown model", json!({"model": "no-such-model:1b", "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), 404, Some("model")),
    ];
    for (what, body, status, param) in cases {
        let r = s.post_raw(chat, body).await;
        let v = expect_openai_error(r, status).await;
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{what}: {v}");
        }
    }
    // Unknown fields are refused naming them, never silently ignored (issue 22); `null`
    // asks for nothing and passes.
    let unknown = s
        .post(chat, json!({"model": m, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "frobnicate": true}))
        .await;
    let v = expect_openai_error(unknown, 400).await;
    assert_eq!(v["error"]["param"], "frobnicate", "{v}");
    let ok = s
        .post(chat, json!({"model": m, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "frobnicate": null}))
        .await;
    assert_eq!(ok.status(), 200);
    // A 10 MB body is refused with 413 before it is parsed.
    let big = format!(
        "{{\"model\": \"{m}\", \"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}",
        "a".repeat(10 << 20)
    );
    let r = s.post_raw(chat, big.into_bytes()).await;
    expect_openai_error(r, 413).await;
    // Unknown routes and wrong methods.
    let r = s
        .client
        .get(s.url("/v1/nothing"))
        .send()
        .await
        .expect("sent");
    expect_openai_error(r, 404).await;
    let r = s.client.get(s.url(chat)).send().await.expect("sent");
    expect_openai_error(r, 405).await;
    // Still serving; errors counted by status.
    let after = s
        .post(chat, json!({"model": m, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 2}))
        .await;
    assert_eq!(after.status(), 200);
    let metrics = s.metrics().await;
    for status in ["400", "404", "405", "413"] {
        assert!(
            metrics.contains(&format!(
                "pagoda:request_errors_total{{status=\"{status}\"}}"
            )),
            "{status}"
        );
    }
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_full_queue_answers_429_with_retry_after() {
    let mut c = config();
    c.engine.max_num_seqs = 1;
    c.max_queue = 0;
    let s = start(c).await;
    let body = json!({"model": tiny_llama(), "prompt": "x", "max_tokens": 200, "ignore_eos": true, "stream": true});
    let first = s.post("/v1/completions", body.clone()).await;
    assert_eq!(first.status(), 200);
    let second = s.post("/v1/completions", body).await;
    assert_eq!(
        second.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let v = expect_openai_error(second, 429).await;
    assert_eq!(v["error"]["type"], "rate_limit_error");
    drop(first);
    assert!(s.wait_kv_empty().await);
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn sixty_four_streams_some_dropped_midway_leave_the_pool_empty() {
    let mut c = config();
    c.engine.max_num_seqs = 64;
    c.engine.kv_cache_memory = Some(16 << 20);
    let s = start(c).await;
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let client = s.client.clone();
            let url = s.url("/v1/chat/completions");
            tokio::spawn(async move {
                let body = json!({
                    "model": tiny_llama(),
                    "messages": [{"role": "user", "content": format!("stream number {i}")}],
                    "max_tokens": 24,
                    "ignore_eos": true,
                    "stream": true,
                });
                let r = client.post(url).json(&body).send().await.expect("sent");
                assert_eq!(r.status(), 200);
                let mut bytes = r.bytes_stream();
                if i % 4 == 3 {
                    // Read a little, then hang up.
                    let _ = bytes.next().await;
                    return None;
                }
                let mut all = Vec::new();
                while let Some(chunk) = bytes.next().await {
                    all.extend_from_slice(&chunk.expect("chunk"));
                }
                Some(String::from_utf8(all).expect("utf-8"))
            })
        })
        .collect();
    let mut completed = 0;
    for t in tasks {
        if let Some(body) = t.await.expect("task") {
            let events = sse_data(&body);
            assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
            let chunks: Vec<Value> = events[..events.len() - 1]
                .iter()
                .map(|e| serde_json::from_str(e).expect("JSON chunk"))
                .collect();
            assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
            let finished: Vec<&Value> = chunks
                .iter()
                .filter(|c| c["choices"][0]["finish_reason"] == "length")
                .collect();
            assert_eq!(finished.len(), 1);
            completed += 1;
        }
    }
    assert_eq!(completed, 48);
    assert!(
        s.wait_kv_empty().await,
        "KV blocks still in use after every stream ended"
    );
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_client_that_hangs_up_is_counted_as_an_abort() {
    let s = start(config()).await;
    let abort_line = format!(
        "pagoda:request_success_total{{finished_reason=\"abort\",model_name=\"{}\"}}",
        tiny_llama()
    );
    let count = |metrics: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(abort_line.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let before = count(&s.metrics().await);
    let body = json!({
        "model": tiny_llama(),
        "messages": [{"role": "user", "content": "a long story"}],
        "max_tokens": 150,
        "ignore_eos": true,
        "stream": true,
    });
    let r = s.post("/v1/chat/completions", body).await;
    assert_eq!(r.status(), 200);
    let mut bytes = r.bytes_stream();
    let _ = bytes.next().await;
    drop(bytes);
    assert!(
        s.wait_kv_empty().await,
        "the aborted request's blocks came back"
    );
    let mut after = before;
    for _ in 0..50 {
        after = count(&s.metrics().await);
        if after > before {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(after, before + 1, "{abort_line}");
}
