//! The server's life: readiness, draining on shutdown (in-flight requests finish, new ones
//! are refused), hot reload of a store model to a new version with in-flight requests
//! finishing on the old one, a rollback (`/api/rollback`) picked up the same way, and models
//! loaded on first request.

use crate::harness::{config, golden, start, tiny_llama};
use futures_util::StreamExt;
use pagoda_store::PullOptions;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn shutdown_drains_in_flight_streams_and_refuses_new_work() {
    let s = start(config()).await;
    let r = s
        .post("/v1/completions", json!({"model": tiny_llama(), "prompt": "x", "max_tokens": 40, "ignore_eos": true, "stream": true}))
        .await;
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let _ = stream.next().await;
    let state = s.state.clone();
    let url = s.url("/ready");
    let client = s.client.clone();
    let stopping = tokio::spawn(s.stop());
    // Draining: not ready, and new generation requests are refused.
    for _ in 0..100 {
        if state.draining() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(state.draining());
    if let Ok(r) = client.get(url).send().await {
        assert_eq!(r.status(), 503);
    }
    // The stream in flight still runs to its end.
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.expect("chunk"));
    }
    let text = String::from_utf8(rest).expect("utf-8");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    stopping.await.expect("task").expect("clean stop");
}

#[tokio::test]
async fn a_new_version_in_the_store_is_picked_up_without_a_restart() {
    let mut c = config();
    c.models = vec!["tiny:latest".into()];
    // The model must be in the store before the server starts: pull it from a folder.
    let dir = tempfile::tempdir().expect("dir");
    let store_dir = dir.path().join("store");
    {
        let store = pagoda_store::Store::open(Some(store_dir.clone())).expect("store");
        store
            .pull(
                &golden("tiny-llama").display().to_string(),
                &PullOptions {
                    progress: false,
                    name: Some("tiny:latest".into()),
                    force: false,
                    public_addresses_only: false,
                    allowed_urls: None,
                },
            )
            .expect("pull tiny-llama");
    }
    let s = crate::harness::start_with_store(c, store_dir).await;
    let ps = s.get_json("/api/ps").await;
    let first_digest = ps["models"][0]["digest"]
        .as_str()
        .expect("digest")
        .to_string();
    // A long request starts on the first version.
    let r = s
        .post("/v1/completions", json!({"model": "tiny:latest", "prompt": "x", "max_tokens": 60, "ignore_eos": true, "stream": true}))
        .await;
    let mut old_stream = r.bytes_stream();
    let _ = old_stream.next().await;
    // A new version under the same name (another model folder).
    let store = s.store.clone();
    tokio::task::spawn_blocking(move || {
        store.pull(
            &golden("tiny-qwen2").display().to_string(),
            &PullOptions {
                progress: false,
                name: Some("tiny:latest".into()),
                force: true,
                public_addresses_only: false,
                allowed_urls: None,
            },
        )
    })
    .await
    .expect("task")
    .expect("pull tiny-qwen2");
    let mut switched = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let ps = s.get_json("/api/ps").await;
        if ps["models"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["details"]["family"] == "qwen2"))
        {
            switched = true;
            break;
        }
    }
    assert!(switched, "the new version was not loaded");
    let show: serde_json::Value = s
        .post("/api/show", json!({"model": "tiny:latest"}))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(show["details"]["family"], "qwen2");
    // The request in flight finished on the old version.
    let mut rest = Vec::new();
    while let Some(chunk) = old_stream.next().await {
        rest.extend_from_slice(&chunk.expect("chunk"));
    }
    assert!(String::from_utf8(rest).expect("utf-8").contains("[DONE]"));
    let ps = s.get_json("/api/ps").await;
    assert!(ps["models"]
        .as_array()
        .is_some_and(|m| m.iter().all(|m| m["digest"] != first_digest.as_str())));
    s.stop().await.expect("clean stop");
}

/// `/api/ps`'s family of `tiny:latest` becomes `family` within ten seconds.
async fn serves_family(s: &crate::harness::TestServer, family: &str) -> bool {
    for _ in 0..100 {
        let ps = s.get_json("/api/ps").await;
        if ps["models"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["details"]["family"] == family))
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn a_rollback_is_picked_up_without_a_restart_and_refusals_change_nothing() {
    let mut c = config();
    c.models = vec!["tiny:latest".into()];
    let dir = tempfile::tempdir().expect("dir");
    let store_dir = dir.path().join("store");
    let pull = |store: &pagoda_store::Store, folder: &str| {
        store
            .pull(
                &golden(folder).display().to_string(),
                &PullOptions {
                    name: Some("tiny:latest".into()),
                    force: true,
                    ..PullOptions::default()
                },
            )
            .map(drop)
    };
    {
        let store = pagoda_store::Store::open(Some(store_dir.clone())).expect("store");
        pull(&store, "tiny-llama").expect("pull tiny-llama");
    }
    let s = crate::harness::start_with_store(c, store_dir).await;
    assert!(serves_family(&s, "llama").await);
    // Nothing kept yet: 409, and the model is still served.
    let r = s
        .post("/api/rollback", json!({"model": "tiny:latest"}))
        .await;
    assert_eq!(r.status(), 409);
    let v: serde_json::Value = r.json().await.expect("json");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("no previous version")),
        "{v}"
    );
    // A new version, picked up as before.
    let store = s.store.clone();
    tokio::task::spawn_blocking(move || pull(&store, "tiny-qwen2"))
        .await
        .expect("task")
        .expect("pull tiny-qwen2");
    assert!(
        serves_family(&s, "qwen2").await,
        "the new version was not loaded"
    );
    let loads = s.get_json("/api/ps").await["models"][0]["digest"].clone();

    // Refusals: an unknown model, a digest of no kept version.
    let r = s.post("/api/rollback", json!({"model": "ghost:1"})).await;
    assert_eq!(r.status(), 404);
    let r = s
        .post(
            "/api/rollback",
            json!({"model": "tiny:latest", "digest": "zz"}),
        )
        .await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.expect("json");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("pagoda list --all")),
        "{v}"
    );
    let r = s
        .post("/api/rollback", json!({"model": "tiny:latest", "bogus": 1}))
        .await;
    assert_eq!(r.status(), 400, "unknown fields are refused");
    assert_eq!(s.get_json("/api/ps").await["models"][0]["digest"], loads);

    // The rollback: the previous version is served again, without a restart.
    let r = s
        .post("/api/rollback", json!({"model": "tiny:latest"}))
        .await;
    assert_eq!(r.status(), 200);
    let done: serde_json::Value = r.json().await.expect("json");
    assert_eq!(done["status"], "success");
    assert_eq!(done["model"], "tiny:latest");
    let (from, to) = (
        done["from"].as_str().expect("from").to_string(),
        done["to"].as_str().expect("to").to_string(),
    );
    assert_ne!(from, to);
    assert!(
        serves_family(&s, "llama").await,
        "the rollback was not picked up"
    );
    // And back again, by digest.
    let r = s
        .post(
            "/api/rollback",
            json!({"model": "tiny:latest", "digest": &from[7..19]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(
        serves_family(&s, "qwen2").await,
        "the second rollback was not picked up"
    );
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn models_not_named_at_start_load_on_first_request() {
    let mut c = config();
    c.models = Vec::new();
    let s = start(c).await;
    assert_eq!(
        s.get_json("/api/ps").await["models"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );
    let qwen = golden("tiny-qwen2").display().to_string();
    let r = s.post("/v1/chat/completions", json!({"model": qwen, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})).await;
    assert_eq!(r.status(), 200);
    let ps = s.get_json("/api/ps").await;
    // A path under an allowed directory is known by its canonical form.
    let canonical = std::fs::canonicalize(&qwen).expect("exists");
    assert_eq!(ps["models"][0]["name"], canonical.display().to_string());
    assert!(ps["models"][0]["expires_at"]
        .as_str()
        .is_some_and(|e| !e.starts_with("0001")));
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_memory_budget_evicts_idle_on_demand_models_and_refuses_when_all_are_busy() {
    let mut c = config();
    c.models = Vec::new();
    // One tiny model with its 8 MiB KV pool fits; two do not.
    c.memory_budget = Some(12 << 20);
    let s = start(c).await;
    let qwen = golden("tiny-qwen2").display().to_string();
    let names = |ps: &serde_json::Value| -> Vec<String> {
        ps["models"]
            .as_array()
            .expect("models")
            .iter()
            .filter_map(|m| m["name"].as_str().map(String::from))
            .collect()
    };
    let r = s.post("/v1/chat/completions", json!({"model": tiny_llama(), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})).await;
    assert_eq!(r.status(), 200);
    // The idle on-demand model is evicted to load another.
    let r = s.post("/v1/chat/completions", json!({"model": qwen, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})).await;
    assert_eq!(r.status(), 200);
    let canonical = std::fs::canonicalize(&qwen)
        .expect("exists")
        .display()
        .to_string();
    assert_eq!(names(&s.get_json("/api/ps").await), vec![canonical]);
    // While qwen is busy, loading the other one is refused with 503, not a crash. "Busy" is a
    // stream the client has not finished reading; a tiny model can write its whole stream into
    // the socket's buffers before the second request arrives on a loaded machine, so a 200 here
    // means the busy one had already finished (and qwen was evicted): try again, a few times.
    let mut refused = None;
    for _ in 0..5 {
        let busy = s
            .post("/v1/completions", json!({"model": qwen, "prompt": "x", "max_tokens": 200, "ignore_eos": true, "stream": true}))
            .await;
        assert_eq!(busy.status(), 200);
        let mut busy_stream = busy.bytes_stream();
        let _ = busy_stream.next().await;
        let r = s.post("/v1/chat/completions", json!({"model": tiny_llama(), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})).await;
        let status = r.status();
        let body: serde_json::Value = r.json().await.expect("json");
        while busy_stream.next().await.is_some() {}
        if status == 503 {
            refused = Some(body);
            break;
        }
        assert_eq!(status, 200, "{body}");
    }
    let v = refused.expect("a load while the only model that fits is busy is refused with 503");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("memory")),
        "{v}"
    );
    s.stop().await.expect("clean stop");
}

/// The three tiny models' weights and one full sequence's KV under `c`'s engine settings.
fn sizes(c: &pagoda_server::ServerConfig, models: &[String]) -> Vec<(u64, u64)> {
    models
        .iter()
        .map(|m| {
            let src = pagoda_model::source::open_model(std::path::Path::new(m)).expect("opens");
            let cfg = &src.config;
            let bs = c.engine.block_size;
            let len = c.engine.max_model_len.expect("set").min(cfg.context_length);
            let per_seq = pagoda_model::PagedKvCache::bytes_per_block(cfg, bs, c.engine.kv_dtype)
                * len.div_ceil(bs);
            (src.info.file_size, per_seq as u64)
        })
        .collect()
}

#[tokio::test]
async fn models_named_at_start_share_one_memory_plan_and_are_never_evicted() {
    let models: Vec<String> = ["tiny-llama", "tiny-qwen2", "tiny-qwen3"]
        .iter()
        .map(|m| golden(m).display().to_string())
        .collect();
    let mut c = config();
    c.models = models.clone();
    c.engine.kv_cache_memory = None;
    c.engine.max_model_len = Some(128);
    c.engine.max_num_seqs = 16;
    let sizes = sizes(&c, &models);
    // Room for 4 full sequences each beside the weights: each model alone would take 16
    // (capped at 40 % of the budget), so their default pools cannot all fit.
    let weights: u64 = sizes.iter().map(|s| s.0).sum();
    let budget = weights + sizes.iter().map(|s| 4 * s.1).sum::<u64>();
    let alone: u64 = sizes
        .iter()
        .map(|s| (16 * s.1).min((budget as f64 * 0.4) as u64))
        .sum();
    assert!(weights + alone > budget, "the test's premise");
    c.memory_budget = Some(budget);
    let s = start(c).await;
    let loaded = s.state.registry.loaded();
    assert_eq!(loaded.len(), 3);
    let mut kv_total = 0;
    for m in &loaded {
        assert!(m.pinned, "{}", m.name);
        let layout = m.engine.layout();
        kv_total += layout.bytes as u64;
        // At least one full sequence each.
        assert!(layout.capacity_tokens() >= 128, "{}: {layout:?}", m.name);
    }
    assert!(
        weights + kv_total <= budget,
        "{} > {budget}",
        weights + kv_total
    );
    assert_eq!(s.state.registry.loads(), 3);
    // Each served in turn, twice: no load after start, all three still loaded, ready.
    for _ in 0..2 {
        for m in &models {
            let r = s.post("/v1/chat/completions", json!({"model": m, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})).await;
            assert_eq!(r.status(), 200, "{m}");
        }
    }
    for m in &models {
        let r = s.post("/api/generate", json!({"model": m, "prompt": "hi", "stream": false, "keep_alive": 0, "options": {"num_predict": 2}})).await;
        assert_eq!(r.status(), 200, "{m}");
    }
    assert_eq!(s.state.registry.loads(), 3, "no model was reloaded");
    assert_eq!(s.state.registry.loaded().len(), 3);
    // A keep_alive of 0 does not unload a model named at start, nor does the reaper.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(s.state.registry.loaded().len(), 3);
    let r = s.client.get(s.url("/ready")).send().await.expect("sent");
    assert_eq!(r.status(), 200);
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn models_named_at_start_that_cannot_fit_are_refused_with_each_ones_sizes() {
    let models: Vec<String> = ["tiny-llama", "tiny-qwen2"]
        .iter()
        .map(|m| golden(m).display().to_string())
        .collect();
    let mut c = config();
    c.models = models.clone();
    c.engine.kv_cache_memory = None;
    c.engine.max_model_len = Some(128);
    let sizes = sizes(&c, &models);
    // The weights fit, but not one full sequence of KV for each.
    c.memory_budget = Some(sizes.iter().map(|s| s.0).sum::<u64>() + sizes[0].1);
    let dir = tempfile::tempdir().expect("temp dir");
    let store = std::sync::Arc::new(
        pagoda_store::Store::open(Some(dir.path().join("store"))).expect("store opens"),
    );
    let server = pagoda_server::BoundServer::bind(c, store)
        .await
        .expect("binds");
    let e = server
        .run(std::future::pending())
        .await
        .expect_err("the set cannot fit")
        .to_string();
    for part in [
        "tiny-llama",
        "tiny-qwen2",
        "weights",
        "KV cache",
        "--memory-budget",
        "--max-model-len",
    ] {
        assert!(e.contains(part), "{part} missing from: {e}");
    }
}

#[tokio::test]
async fn a_server_started_with_quantize_serves_the_quantized_model() {
    // `pagoda serve --quantize q8_0`: the preloaded tiny model is quantized at load, answers,
    // and /api/ps reports the new type and the smaller weights.
    let plain = start(config()).await;
    let plain_size = plain.get_json("/api/ps").await["models"][0]["size"]
        .as_u64()
        .expect("size");
    plain.stop().await.expect("clean stop");
    let mut c = config();
    c.load.quantize = Some("q8_0".parse().expect("a target"));
    let s = start(c).await;
    let r = s
        .post(
            "/v1/chat/completions",
            json!({"model": tiny_llama(), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let ps = s.get_json("/api/ps").await;
    let m = &ps["models"][0];
    assert_eq!(m["details"]["quantization_level"], "Q8_0", "{ps}");
    let size = m["size"].as_u64().expect("size");
    assert!(
        size < plain_size,
        "Q8_0 weights ({size}) below F32 ({plain_size})"
    );
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_server_with_quantize_auto_serves_the_best_format_that_fits_the_budget() {
    // `pagoda serve --quantize auto --memory-budget B` with B between what the tiny model
    // needs in f16 and in Q8_0 (weights + KV of one 64-token sequence): it serves Q8_0.
    use pagoda_runtime::quant_choice::{bytes_as, kv_bytes, AutoQuantize};
    let source = pagoda_model::open_model(&golden("tiny-llama")).expect("open");
    let kv = kv_bytes(
        &source.config,
        Some(64),
        1,
        16,
        pagoda_model::KvDtype::F16,
        true,
    )
    .0;
    let need = |t: &str| bytes_as(&source.weights, t.parse().expect("a type")) + kv;
    let mut c = config();
    c.engine.kv_cache_memory = None;
    c.engine.max_num_seqs = 1;
    c.engine.max_model_len = Some(64);
    c.memory_budget = Some((need("f16") + need("q8_0")) / 2);
    c.load.auto_quantize = AutoQuantize::Always;
    let s = start(c).await;
    let r = s
        .post(
            "/v1/chat/completions",
            json!({"model": tiny_llama(), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let ps = s.get_json("/api/ps").await;
    assert_eq!(
        ps["models"][0]["details"]["quantization_level"], "Q8_0",
        "{ps}"
    );
    s.stop().await.expect("clean stop");

    // With no room even for Q4_K the start is refused with the sizes.
    let mut c = config();
    c.engine.kv_cache_memory = None;
    c.engine.max_num_seqs = 1;
    c.engine.max_model_len = Some(64);
    c.memory_budget = Some(kv);
    c.load.auto_quantize = AutoQuantize::Always;
    let dir = tempfile::tempdir().expect("dir");
    let store = std::sync::Arc::new(
        pagoda_store::Store::open(Some(dir.path().join("store"))).expect("store opens"),
    );
    let server = pagoda_server::BoundServer::bind(c, store)
        .await
        .expect("binds");
    let e = server
        .run(std::future::pending())
        .await
        .expect_err("nothing fits")
        .to_string();
    assert!(
        e.contains("no format fits") && e.contains("--memory-budget"),
        "{e}"
    );
}
