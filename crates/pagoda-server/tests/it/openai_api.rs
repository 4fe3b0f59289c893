//! The OpenAI API over HTTP: response shapes, streaming framing, usage, n, logprobs, stop,
//! completions with token prompts and echo, the model list, and the metrics they leave.

use crate::harness::{config, expect_openai_error, sse_data, start, tiny_llama};
use serde_json::{json, Value};

fn chat_body(stream: bool) -> Value {
    json!({
        "model": tiny_llama(),
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": stream,
    })
}

#[tokio::test]
async fn chat_completion_has_the_openai_shape_and_usage() {
    let s = start(config()).await;
    let r = s.post("/v1/chat/completions", chat_body(false)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().is_some_and(|i| i.starts_with("chatcmpl-")));
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"].is_string());
    let finish = v["choices"][0]["finish_reason"].as_str().expect("finish");
    assert!(finish == "length" || finish == "stop");
    let u = &v["usage"];
    let (p, c) = (
        u["prompt_tokens"].as_u64().unwrap_or(0),
        u["completion_tokens"].as_u64().unwrap_or(0),
    );
    assert!(p > 0 && (1..=8).contains(&c), "{u}");
    assert_eq!(u["total_tokens"].as_u64(), Some(p + c));
    // Greedy is deterministic: the same request gives the same text, and its prompt is
    // now found in the prefix cache.
    let again: Value = s
        .post("/v1/chat/completions", chat_body(false))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(again["choices"][0]["message"], v["choices"][0]["message"]);
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn streamed_chat_is_role_then_deltas_then_finish_then_usage_then_done() {
    let s = start(config()).await;
    let whole: Value = s
        .post("/v1/chat/completions", chat_body(false))
        .await
        .json()
        .await
        .expect("json");
    let mut body = chat_body(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = s.post("/v1/chat/completions", body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let events = sse_data(&r.text().await.expect("body"));
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk is JSON"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        text,
        whole["choices"][0]["message"]["content"]
            .as_str()
            .expect("text")
    );
    let finishes: Vec<&Value> = chunks
        .iter()
        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finishes.len(), 1);
    let usage = chunks.last().expect("usage chunk");
    assert_eq!(usage["choices"].as_array().map(Vec::len), Some(0));
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage["usage"][k], whole["usage"][k], "{k}");
    }
    // The same prompt again: its full blocks came from the prefix cache.
    assert!(usage["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0));
    for c in &chunks[..chunks.len() - 1] {
        assert!(c["usage"].is_null(), "usage only on the last chunk: {c}");
        assert_eq!(c["id"], chunks[0]["id"]);
    }
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn n_choices_logprobs_seed_and_stop() {
    let s = start(config()).await;
    let body = json!({
        "model": tiny_llama(),
        "messages": [{"role": "user", "content": "count"}],
        "max_completion_tokens": 6,
        "n": 3,
        "temperature": 1.0,
        "seed": 42,
        "logprobs": true,
        "top_logprobs": 2,
    });
    let a: Value = s
        .post("/v1/chat/completions", body.clone())
        .await
        .json()
        .await
        .expect("json");
    let b: Value = s
        .post("/v1/chat/completions", body)
        .await
        .json()
        .await
        .expect("json");
    let choices = a["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let content = c["logprobs"]["content"].as_array().expect("logprobs");
        assert!(!content.is_empty());
        for t in content {
            assert!(t["logprob"].as_f64().is_some_and(|l| l <= 0.0));
            assert_eq!(t["top_logprobs"].as_array().map(Vec::len), Some(2));
        }
    }
    // The second request finds the prompt in the prefix cache and computes only its tail, a
    // shorter chunk whose attention rounds differently: the same tokens and text, logprobs
    // equal to float precision.
    assert_same_up_to_rounding(&a["choices"], &b["choices"], "a fixed seed repeats");
    assert_eq!(
        a["usage"]["completion_tokens"].as_u64(),
        Some(
            choices
                .iter()
                .map(|c| c["logprobs"]["content"]
                    .as_array()
                    .map_or(0, |v| v.len() as u64))
                .sum()
        )
    );

    // A stop string cuts the text before it and ends with finish_reason stop.
    let plain: Value = s
        .post(
            "/v1/completions",
            json!({"model": tiny_llama(), "prompt": "a b c", "max_tokens": 12, "temperature": 0}),
        )
        .await
        .json()
        .await
        .expect("json");
    let text = plain["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    if let Some(stop) = text
        .chars()
        .skip(2)
        .find(|c| !c.is_whitespace())
        .map(String::from)
    {
        let cut: Value = s
            .post("/v1/completions", json!({"model": tiny_llama(), "prompt": "a b c", "max_tokens": 12, "temperature": 0, "stop": [stop.clone()]}))
            .await
            .json()
            .await
            .expect("json");
        let at = text.find(&stop).expect("stop occurs");
        assert_eq!(cut["choices"][0]["text"].as_str(), Some(&text[..at]));
        assert_eq!(cut["choices"][0]["finish_reason"], "stop");
    }
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn completions_take_token_prompts_batches_and_echo() {
    let s = start(config()).await;
    let v: Value = s
        .post("/v1/completions", json!({"model": tiny_llama(), "prompt": [[5, 6, 7], [8, 9]], "max_tokens": 4, "temperature": 0, "n": 2}))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(v["object"], "text_completion");
    let indices: Vec<u64> = v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .filter_map(|c| c["index"].as_u64())
        .collect();
    assert_eq!(indices, vec![0, 1, 2, 3]);
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["completion_tokens"], 16);

    let echo: Value = s
        .post("/v1/completions", json!({"model": tiny_llama(), "prompt": "hello", "max_tokens": 3, "echo": true, "temperature": 0}))
        .await
        .json()
        .await
        .expect("json");
    assert!(echo["choices"][0]["text"]
        .as_str()
        .is_some_and(|t| t.starts_with("hello")));

    let r = s
        .post("/v1/completions", json!({"model": tiny_llama(), "prompt": "hello", "max_tokens": 3, "stream": true, "logprobs": 1}))
        .await;
    let events = sse_data(&r.text().await.expect("body"));
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).expect("chunk JSON");
        assert_eq!(c["object"], "text_completion");
    }
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn models_list_and_metrics_name_the_model() {
    let s = start(config()).await;
    let list = s.get_json("/v1/models").await;
    assert_eq!(list["object"], "list");
    let card = list["data"]
        .as_array()
        .expect("data")
        .iter()
        .find(|m| m["id"] == tiny_llama())
        .expect("the loaded model is listed");
    // What it does, for clients that offer only models that chat (the chat page).
    assert_eq!(card["capabilities"], json!(["completion"]));
    let r = s
        .client
        .get(s.url("/v1/models/nope:1b"))
        .send()
        .await
        .expect("sent");
    expect_openai_error(r, 404).await;

    assert_eq!(
        s.post("/v1/chat/completions", chat_body(false))
            .await
            .status(),
        200
    );
    let m = s.metrics().await;
    for name in [
        "pagoda:time_to_first_token_seconds_bucket",
        "pagoda:inter_token_latency_seconds_bucket",
        "pagoda:e2e_request_latency_seconds_count",
        "pagoda:request_queue_time_seconds_count",
        "pagoda:num_requests_running",
        "pagoda:num_requests_waiting",
        "pagoda:kv_cache_usage_perc",
        "pagoda:prompt_tokens_total",
        "pagoda:generation_tokens_total",
        "pagoda:num_preemptions_total",
        "pagoda:prefix_cache_queries_total",
        "pagoda:prefix_cache_hits_total",
        "pagoda:request_success_total",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
    ] {
        assert!(m.contains(name), "metric {name} missing:\n{m}");
    }
    let label = format!("model_name=\"{}\"", tiny_llama());
    let line = m
        .lines()
        .find(|l| l.starts_with("pagoda:generation_tokens_total{") && l.contains(&label))
        .expect("generation counter for the model");
    let value: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("value");
    assert!(value >= 1.0, "{line}");
    assert!(m.contains("pagoda:request_success_total{finished_reason="));
    // GPU gauges: present exactly where NVML loads; on a machine without it (CI) absent,
    // and the server still started and serves.
    if pagoda_server::gpu_metrics::NvmlProbe::open().is_ok() {
        assert!(m.contains("pagoda:gpu_memory_total_bytes{gpu=\"0\""), "{m}");
    } else {
        assert!(!m.contains("pagoda:gpu_"), "no NVML, no GPU series:\n{m}");
    }
    s.stop().await.expect("clean stop");
}

/// `a == b` except that numbers may differ by 1e-4 (relative, at least absolute 1e-4).
fn assert_same_up_to_rounding(a: &Value, b: &Value, what: &str) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            assert!(
                (x - y).abs() <= 1e-4 * x.abs().max(1.0),
                "{what}: {x} != {y}"
            );
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{what}: {a} vs {b}");
            for (x, y) in x.iter().zip(y) {
                assert_same_up_to_rounding(x, y, what);
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{what}: {a} vs {b}"
            );
            for (k, x) in x {
                assert_same_up_to_rounding(x, &y[k], what);
            }
        }
        _ => assert_eq!(a, b, "{what}"),
    }
}
