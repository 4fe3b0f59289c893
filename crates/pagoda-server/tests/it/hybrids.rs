//! Hybrid models (recurrent state slots beside paged KV) served beside a transformer in one
//! server: requests to all of them at once give each request what it gives alone.

use crate::harness::{config, golden, start};
use serde_json::{json, Value};

/// What a greedy completion returned: its text and each chosen token's logprob.
fn answer(body: &Value) -> (String, Vec<f64>) {
    let choice = &body["choices"][0];
    let text = choice["text"].as_str().expect("text").to_string();
    let logprobs = choice["logprobs"]["token_logprobs"]
        .as_array()
        .expect("token_logprobs")
        .iter()
        .map(|l| l.as_f64().expect("a number"))
        .collect();
    (text, logprobs)
}

/// Two hybrids (Qwen3.5's DeltaNet, LFM2's short convolutions) and a transformer (Llama)
/// loaded together; each prompt is sent alone, then all of them at once (the hybrids'
/// sequences batched with each other's and beside the transformer's in the same process):
/// the same text, and logprobs within float noise.
#[tokio::test]
async fn hybrid_and_transformer_requests_at_once_equal_each_alone() {
    let models: Vec<String> = ["tiny-qwen35", "tiny-lfm2", "tiny-llama"]
        .iter()
        .map(|m| golden(m).display().to_string())
        .collect();
    let mut c = config();
    c.models = models.clone();
    c.engine.kv_cache_memory = Some(16 << 20);
    let s = start(c).await;
    let prompts = [
        "The quick brown fox",
        "Once upon a time in a land far away there lived",
        "1, 2, 3,",
    ];
    let requests: Vec<Value> = models
        .iter()
        .flat_map(|m| {
            prompts.iter().map(move |p| {
                json!({"model": m, "prompt": p, "max_tokens": 12, "temperature": 0,
                       "logprobs": 0, "ignore_eos": true})
            })
        })
        .collect();
    let mut alone = Vec::new();
    for body in &requests {
        let r = s.post("/v1/completions", body.clone()).await;
        assert_eq!(r.status(), 200, "{body}");
        alone.push(answer(&r.json().await.expect("json")));
    }
    let server = &s;
    let together = futures_util::future::join_all(requests.iter().map(|body| async move {
        let r = server.post("/v1/completions", body.clone()).await;
        assert_eq!(r.status(), 200, "{body}");
        answer(&r.json::<Value>().await.expect("json"))
    }))
    .await;
    for ((body, (text, lp)), (text_alone, lp_alone)) in requests.iter().zip(&together).zip(&alone) {
        assert_eq!(text, text_alone, "{body}");
        assert_eq!(lp.len(), 12, "{body}");
        for (a, b) in lp.iter().zip(lp_alone) {
            assert!(
                (a - b).abs() < 1e-4,
                "{body}: logprob {a} batched, {b} alone"
            );
        }
    }
    s.stop().await.expect("clean stop");
}
