//! LoRA adapters over HTTP on the tiny Llama with the peft adapters of
//! tests/golden/tiny-llama-lora: `--lora` at start, `model: "adapter"` and `"base:adapter"`
//! on the OpenAI and Ollama routes, /v1/models listing adapters with their parent, and vLLM's
//! load/unload routes with their status codes (a request in flight survives its adapter's
//! unload).

use crate::harness::{config, expect_openai_error, golden, start, tiny_llama};
use serde_json::json;

async fn complete(s: &crate::harness::TestServer, model: &str) -> (String, String) {
    let r = s
        .post(
            "/v1/completions",
            json!({"model": model, "prompt": "ab ab", "max_tokens": 8, "temperature": 0, "ignore_eos": true}),
        )
        .await;
    assert_eq!(r.status(), 200, "model {model}");
    let v: serde_json::Value = r.json().await.unwrap();
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        v["model"].as_str().unwrap().to_string(),
    )
}

/// `pagoda:lora_requests_info`'s running adapters and max_lora, checking that exactly one
/// series is exported, that nothing waits, and that its value is a current unix time.
async fn lora_info(s: &crate::harness::TestServer) -> (String, String) {
    let text = s.metrics().await;
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("pagoda:lora_requests_info{"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    let (labels, value) = lines[0].rsplit_once(' ').unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let value: f64 = value.parse().unwrap();
    assert!((now - value).abs() < 60.0, "{value} is not now ({now})");
    let label = |name: &str| {
        let start = labels.find(&format!("{name}=\"")).expect(name) + name.len() + 2;
        let end = start + labels[start..].find('"').unwrap();
        labels[start..end].to_string()
    };
    assert_eq!(label("waiting_lora_adapters"), "");
    (label("running_lora_adapters"), label("max_lora"))
}

#[tokio::test]
async fn adapters_are_chosen_by_model_name_and_loaded_and_unloaded_at_run_time() {
    let mut c = config();
    c.loras = vec![("alpha".into(), golden("tiny-llama-lora/alpha"))];
    // The other crate's golden adapters too (one made for another base model).
    c.model_dirs.push(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../pagoda-model/tests/golden"),
    );
    let s = start(c).await;
    let base = tiny_llama();

    // Listed with its parent.
    let models = s.get_json("/v1/models").await;
    let card = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "alpha")
        .cloned()
        .expect("alpha listed");
    assert_eq!(card["parent"], base.as_str());

    // Both spellings select the adapter; the base differs.
    let (plain, _) = complete(&s, &base).await;
    let (by_name, model) = complete(&s, "alpha").await;
    assert_eq!(model, "alpha");
    let (by_pair, _) = complete(&s, &format!("{base}:alpha")).await;
    assert_eq!(by_name, by_pair);
    assert_ne!(by_name, plain, "the adapter changes the output");

    // Ollama's route too.
    let r = s
        .post(
            "/api/generate",
            json!({"model": "alpha", "prompt": "ab ab", "raw": true, "stream": false,
                   "options": {"temperature": 0, "num_predict": 8}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["model"], "alpha");

    // Runtime load: good, duplicate, bad path, another base's adapter.
    let load = |name: &str, path: std::path::PathBuf| json!({"lora_name": name, "lora_path": path.display().to_string()});
    let r = s
        .post(
            "/v1/load_lora_adapter",
            load("beta", golden("tiny-llama-lora/beta")),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let (beta, _) = complete(&s, "beta").await;
    assert_ne!(beta, plain);
    // The Gateway API Inference Extension's LoRA metric lists what this replica holds.
    assert_eq!(lora_info(&s).await, ("alpha,beta".into(), "2".into()));
    let r = s
        .post(
            "/v1/load_lora_adapter",
            load("beta", golden("tiny-llama-lora/beta")),
        )
        .await;
    let v = expect_openai_error(r, 400).await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already loaded"),
        "{v}"
    );
    let r = s
        .post(
            "/v1/load_lora_adapter",
            load("gamma", golden("no-such-adapter")),
        )
        .await;
    // A missing folder gets the same answer as one outside the allowed directories.
    let v = expect_openai_error(r, 400).await;
    assert_eq!(v["error"]["code"], "path_not_allowed", "{v}");
    let r = s
        .post("/v1/load_lora_adapter", load("gamma", "/etc".into()))
        .await;
    let outside = expect_openai_error(r, 400).await;
    assert_eq!(outside["error"], v["error"], "no existence oracle");
    let r = s
        .post("/v1/load_lora_adapter", load("gamma", golden("tiny-qwen2")))
        .await;
    let v = expect_openai_error(r, 400).await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("adapter_config.json"),
        "{v}"
    );
    let other = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../pagoda-model/tests/golden/lora/adapter");
    let r = s.post("/v1/load_lora_adapter", load("gamma", other)).await;
    let v = expect_openai_error(r, 400).await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("another base model"),
        "{v}"
    );
    let r = s
        .post("/v1/load_lora_adapter", json!({"lora_name": "x"}))
        .await;
    expect_openai_error(r, 400).await;
    let r = s
        .post(
            "/v1/load_lora_adapter",
            load("a:b", golden("tiny-llama-lora/beta")),
        )
        .await;
    expect_openai_error(r, 400).await;

    // Unload: unknown is 404; then requests for it are 404 listing what is loaded.
    let r = s
        .post("/v1/unload_lora_adapter", json!({"lora_name": "nope"}))
        .await;
    expect_openai_error(r, 404).await;
    let r = s
        .post("/v1/unload_lora_adapter", json!({"lora_name": "beta"}))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(lora_info(&s).await, ("alpha".into(), "1".into()));
    for model in ["beta".to_string(), format!("{base}:beta")] {
        let r = s
            .post(
                "/v1/completions",
                json!({"model": model, "prompt": "ab", "max_tokens": 2}),
            )
            .await;
        let v = expect_openai_error(r, 404).await;
        assert_eq!(v["error"]["code"], "model_not_found");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("alpha"),
            "{v}"
        );
    }

    // Unloading while a request streams does not break it.
    let stream = s
        .client
        .post(s.url("/v1/completions"))
        .json(
            &json!({"model": "alpha", "prompt": "ab ab", "max_tokens": 40, "temperature": 0,
                      "ignore_eos": true, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let r = s
        .post("/v1/unload_lora_adapter", json!({"lora_name": "alpha"}))
        .await;
    assert_eq!(r.status(), 200);
    let body = stream.text().await.unwrap();
    let events = crate::harness::sse_data(&body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
    assert!(!body.contains("\"error\""), "{body}");
    assert!(s.wait_kv_empty().await);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_modelfile_adapter_applies_to_every_request() {
    let mut c = config();
    c.loras = vec![("alpha".into(), golden("tiny-llama-lora/alpha"))];
    let s = start(c).await;
    let store = s.store.clone();
    let dir = golden("tiny-llama-lora");
    let base = tiny_llama();
    tokio::task::spawn_blocking(move || {
        let mf =
            pagoda_store::modelfile::Modelfile::parse(&format!("FROM {base}\nADAPTER ./alpha\n"))
                .unwrap();
        store
            .create(
                "tuned:1",
                &mf,
                &pagoda_store::CreateOptions {
                    base_dir: Some(dir),
                    progress: false,
                },
            )
            .unwrap();
    })
    .await
    .unwrap();
    let (tuned, model) = complete(&s, "tuned:1").await;
    assert_eq!(model, "tuned:1");
    let (alpha, _) = complete(&s, "alpha").await;
    let (plain, _) = complete(&s, &tiny_llama()).await;
    assert_eq!(tuned, alpha, "the Modelfile's adapter is applied");
    assert_ne!(tuned, plain);
    s.stop().await.unwrap();
}
