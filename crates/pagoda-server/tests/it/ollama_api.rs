//! The Ollama API over HTTP: generate and chat (NDJSON streams and single objects, the
//! final counts, `context` continuation), model listings, load/unload by keep_alive, errors,
//! and `/api/create` / `/api/copy` (store names only; refusals write nothing).

use crate::harness::{config, start, tiny_llama};
use serde_json::{json, Value};

fn lines(body: &str) -> Vec<Value> {
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

#[tokio::test]
async fn generate_streams_ndjson_and_ends_with_counts_and_context() {
    let s = start(config()).await;
    let m = tiny_llama();
    let r = s
        .post(
            "/api/generate",
            json!({"model": m, "prompt": "hello", "options": {"num_predict": 6, "temperature": 0}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let objs = lines(&r.text().await.expect("body"));
    let last = objs.last().expect("objects");
    assert_eq!(last["done"], true);
    assert!(objs[..objs.len() - 1].iter().all(|o| o["done"] == false));
    assert_eq!(last["eval_count"], 6);
    assert!(last["prompt_eval_count"].as_u64().is_some_and(|n| n > 0));
    assert!(last["total_duration"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(last["done_reason"], "length");
    let context = last["context"].as_array().expect("context").clone();
    let streamed: String = objs.iter().filter_map(|o| o["response"].as_str()).collect();

    let whole: Value = s
        .post("/api/generate", json!({"model": m, "prompt": "hello", "stream": false, "options": {"num_predict": 6, "temperature": 0}}))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(whole["response"].as_str(), Some(streamed.as_str()));
    assert_eq!(whole["context"].as_array(), Some(&context));

    // Continuing from `context` puts the earlier tokens in front of the new turn.
    let next: Value = s
        .post("/api/generate", json!({"model": m, "prompt": "more", "stream": false, "context": context, "options": {"num_predict": 2}}))
        .await
        .json()
        .await
        .expect("json");
    assert!(next["prompt_eval_count"].as_u64() > whole["prompt_eval_count"].as_u64());
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn chat_answers_as_the_assistant_and_matches_its_stream() {
    let s = start(config()).await;
    let body = json!({"model": tiny_llama(), "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 5, "temperature": 0}});
    let objs = lines(
        &s.post("/api/chat", body.clone())
            .await
            .text()
            .await
            .expect("body"),
    );
    assert!(objs.iter().all(|o| o["message"]["role"] == "assistant"));
    let streamed: String = objs
        .iter()
        .filter_map(|o| o["message"]["content"].as_str())
        .collect();
    let mut whole_body = body;
    whole_body["stream"] = json!(false);
    let whole: Value = s
        .post("/api/chat", whole_body)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(
        whole["message"]["content"].as_str(),
        Some(streamed.as_str())
    );
    assert_eq!(whole["done"], true);
    assert!(whole.get("context").is_none());
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn listings_show_version_and_unload_by_keep_alive() {
    // Loaded on demand: a model named at start (-m) is never unloaded by a keep-alive
    // (lifecycle::models_named_at_start_share_one_memory_plan_and_are_never_evicted).
    let mut c = config();
    c.models = Vec::new();
    let s = start(c).await;
    let m = tiny_llama();
    let r: Value = s
        .post("/api/generate", json!({"model": m}))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(r["done_reason"], "load");
    let ps = s.get_json("/api/ps").await;
    // Loaded on demand by path: known by its canonical form.
    let canonical = std::fs::canonicalize(&m).expect("exists");
    assert_eq!(ps["models"][0]["name"], canonical.display().to_string());
    assert!(ps["models"][0]["size"].as_u64().is_some_and(|b| b > 0));
    assert!(s.get_json("/api/tags").await["models"].is_array());
    assert!(s.get_json("/api/version").await["version"].is_string());
    let show: Value = s
        .post("/api/show", json!({"model": m}))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(show["details"]["family"], "llama");
    assert!(show["modelfile"]
        .as_str()
        .is_some_and(|f| f.starts_with("FROM ")));

    // An empty prompt with keep_alive 0 unloads; an empty prompt loads again.
    let r: Value = s
        .post("/api/generate", json!({"model": m, "keep_alive": 0}))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(r["done_reason"], "unload");
    assert_eq!(
        s.get_json("/api/ps").await["models"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );
    let r: Value = s
        .post("/api/generate", json!({"model": m, "keep_alive": "1s"}))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(r["done_reason"], "load");
    assert_eq!(
        s.get_json("/api/ps").await["models"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    // ...and keep_alive 1s lets it go once idle.
    let mut gone = false;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if s.get_json("/api/ps").await["models"]
            .as_array()
            .map(Vec::len)
            == Some(0)
        {
            gone = true;
            break;
        }
    }
    assert!(gone, "model still loaded after its keep_alive");
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn ollama_errors_are_plain_error_strings() {
    let s = start(config()).await;
    let r = s
        .post(
            "/api/chat",
            json!({"model": "missing:7b", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.expect("json");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("missing:7b")),
        "{v}"
    );
    let r = s.post_raw("/api/generate", b"{not json".to_vec()).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    assert!(v["error"].is_string());
    let r = s
        .post(
            "/api/generate",
            json!({"model": tiny_llama(), "prompt": "x", "keep_alive": "soon"}),
        )
        .await;
    assert_eq!(r.status(), 400);
    let r = s
        .client
        .delete(s.url("/api/delete"))
        .json(&json!({"model": "missing:7b"}))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 404);
    s.stop().await.expect("clean stop");
}

// ---- /api/create and /api/copy: derived models of models in the store, nothing else ----

/// Pulls the tiny Llama folder into the server's store as `name`.
pub(crate) async fn stored(s: &crate::harness::TestServer, name: &str) {
    let store = s.store.clone();
    let opts = pagoda_store::PullOptions {
        name: Some(name.to_string()),
        ..Default::default()
    };
    tokio::task::spawn_blocking(move || store.pull(&tiny_llama(), &opts))
        .await
        .expect("task")
        .expect("pull tiny-llama");
}

pub(crate) async fn tag_names(s: &crate::harness::TestServer) -> Vec<String> {
    let tags = s.get_json("/api/tags").await;
    let mut names: Vec<String> = tags["models"]
        .as_array()
        .expect("models")
        .iter()
        .filter_map(|m| m["name"].as_str().map(String::from))
        .collect();
    names.sort();
    names
}

fn blob_count(s: &crate::harness::TestServer) -> usize {
    std::fs::read_dir(s.store.root().join("blobs"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// An Ollama error: `status`, and a body that is exactly `{"error": "..."}` containing `needle`.
async fn expect_ollama_error(r: reqwest::Response, status: u16, needle: &str) {
    assert_eq!(r.status().as_u16(), status);
    let v: Value = r.json().await.expect("json error body");
    let obj = v.as_object().expect("an object");
    assert_eq!(obj.len(), 1, "{v}");
    let e = v["error"].as_str().expect("error string");
    assert!(e.contains(needle), "{e} lacks {needle:?}");
}

#[tokio::test]
async fn copy_then_chat_under_the_new_name() {
    let s = start(config()).await;
    stored(&s, "tiny:1").await;
    let r = s
        .post(
            "/api/copy",
            json!({"source": "tiny:1", "destination": "twin:1"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.expect("body").is_empty());
    let r = s
        .post(
            "/api/chat",
            json!({"model": "twin:1", "messages": [{"role": "user", "content": "hi"}], "stream": false, "options": {"num_predict": 3}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["model"], "twin:1");
    assert_eq!(v["done"], true);
    assert_eq!(tag_names(&s).await, vec!["tiny:1", "twin:1"]);

    // An unknown source: 404 in Ollama's shape; a path or bad field: 400; nothing written.
    let r = s
        .post(
            "/api/copy",
            json!({"source": "ghost:1", "destination": "x:1"}),
        )
        .await;
    expect_ollama_error(r, 404, "ghost:1").await;
    let r = s
        .post(
            "/api/copy",
            json!({"source": tiny_llama(), "destination": "x:1"}),
        )
        .await;
    expect_ollama_error(r, 400, "source").await;
    let r = s
        .post(
            "/api/copy",
            json!({"source": "tiny:1", "destination": "Bad Name!"}),
        )
        .await;
    expect_ollama_error(r, 400, "Bad Name!").await;
    let r = s
        .post(
            "/api/copy",
            json!({"source": "tiny:1", "destination": "x:1", "force": true}),
        )
        .await;
    expect_ollama_error(r, 400, "force").await;
    let r = s.post("/api/copy", json!({"source": "tiny:1"})).await;
    expect_ollama_error(r, 400, "destination").await;
    assert_eq!(tag_names(&s).await, vec!["tiny:1", "twin:1"]);
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn create_with_system_and_parameters_then_show_reflects_them() {
    let s = start(config()).await;
    stored(&s, "tiny:1").await;
    let blobs = blob_count(&s);
    let r = s
        .post(
            "/api/create",
            json!({"model": "pirate:1", "from": "tiny:1", "system": "Talk like a pirate.",
                   "parameters": {"temperature": 0.25, "stop": ["<end>"], "num_ctx": 64},
                   "license": "MIT", "stream": false}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v, json!({"status": "success"}));
    let show: Value = s
        .post("/api/show", json!({"model": "pirate:1"}))
        .await
        .json()
        .await
        .expect("json");
    let modelfile = show["modelfile"].as_str().expect("modelfile");
    assert!(
        modelfile.contains("SYSTEM \"\"\"Talk like a pirate.\"\"\""),
        "{modelfile}"
    );
    let parameters = show["parameters"].as_str().expect("parameters");
    for p in ["temperature 0.25", "stop \"<end>\"", "num_ctx 64"] {
        assert!(parameters.contains(p), "{parameters} lacks {p}");
    }
    assert_eq!(blob_count(&s), blobs, "no weights copied");

    // Streamed by default: status lines ending with success; FROM a derived model inherits.
    let r = s
        .post(
            "/api/create",
            json!({"model": "pirate:2", "from": "pirate:1", "messages": [{"role": "user", "content": "Ahoy"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"].to_str().expect("ascii"),
        "application/x-ndjson"
    );
    let objects = lines(&r.text().await.expect("body"));
    assert!(
        objects.iter().all(|o| o["status"].is_string()),
        "{objects:?}"
    );
    assert_eq!(objects.last(), Some(&json!({"status": "success"})));
    let show: Value = s
        .post("/api/show", json!({"model": "pirate:2"}))
        .await
        .json()
        .await
        .expect("json");
    let modelfile = show["modelfile"].as_str().expect("modelfile");
    assert!(modelfile.contains("Talk like a pirate."), "{modelfile}");
    assert!(
        modelfile.contains("MESSAGE user \"\"\"Ahoy\"\"\""),
        "{modelfile}"
    );

    // The legacy shape: a name and the Modelfile's text.
    let r = s
        .post(
            "/api/create",
            json!({"name": "legacy:1", "modelfile": "FROM tiny:1\nPARAMETER temperature 0\nSYSTEM Old style.\n", "stream": false}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let r = s
        .post(
            "/api/chat",
            json!({"model": "legacy:1", "messages": [{"role": "user", "content": "hi"}], "stream": false, "options": {"num_predict": 2}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let show: Value = s
        .post("/api/show", json!({"model": "legacy:1"}))
        .await
        .json()
        .await
        .expect("json");
    assert!(
        show["modelfile"]
            .as_str()
            .is_some_and(|m| m.contains("Old style.")),
        "{show}"
    );
    // Re-creating a loaded name replaces it: the next request sees the new layer.
    let r = s
        .post(
            "/api/create",
            json!({"model": "legacy:1", "from": "tiny:1", "system": "New style.", "stream": false}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let show: Value = s
        .post("/api/show", json!({"model": "legacy:1"}))
        .await
        .json()
        .await
        .expect("json");
    assert!(
        show["modelfile"]
            .as_str()
            .is_some_and(|m| m.contains("New style.") && !m.contains("Old style.")),
        "{show}"
    );
    assert_eq!(
        tag_names(&s).await,
        vec!["legacy:1", "pirate:1", "pirate:2", "tiny:1"]
    );
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn create_from_a_path_url_or_unknown_name_is_refused_and_writes_nothing() {
    let s = start(config()).await;
    stored(&s, "tiny:1").await;
    let blobs = blob_count(&s);
    let path = tiny_llama();
    for (body, status, needle) in [
        (
            json!({"model": "evil:1", "from": path.clone()}),
            400,
            "from",
        ),
        (
            json!({"model": "evil:1", "from": path.clone(), "stream": true}),
            400,
            "from",
        ),
        (
            json!({"model": "evil:1", "modelfile": format!("FROM {path}\n")}),
            400,
            "from",
        ),
        (
            json!({"model": "evil:1", "from": "http://127.0.0.1:9/m.gguf"}),
            400,
            "from",
        ),
        (
            json!({"model": "evil:1", "modelfile": "FROM tiny:1\nADAPTER ./lora\n"}),
            400,
            "ADAPTER",
        ),
        (
            json!({"model": "evil:1", "from": "tiny:1", "quantize": "q4_0"}),
            400,
            "quantize",
        ),
        (
            json!({"model": "evil:1", "from": "tiny:1", "files": {"m.gguf": "sha256:00"}}),
            400,
            "files",
        ),
        (
            json!({"model": "evil:1", "from": "tiny:1", "bogus": 1}),
            400,
            "bogus",
        ),
        (
            json!({"model": "evil:1", "from": "tiny:1", "template": "{{ .Prompt }}"}),
            400,
            "Go template",
        ),
        (
            json!({"model": "evil:1", "from": "ghost:1"}),
            404,
            "ghost:1",
        ),
        (json!({"from": "tiny:1"}), 400, "model"),
    ] {
        let r = s.post("/api/create", body.clone()).await;
        expect_ollama_error(r, status, needle).await;
    }
    assert_eq!(tag_names(&s).await, vec!["tiny:1"]);
    assert!(!s.store.root().join("manifests/evil").exists());
    assert_eq!(blob_count(&s), blobs);
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_create_or_copy_of_an_unloadable_base_is_refused_and_not_listed() {
    let s = start(config()).await;
    // A broken model put in the store without the check (as in a store filled before it).
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("broken.gguf");
    let mut bytes = b"GGUF\x03\x00\x00\x00".to_vec();
    bytes.extend([0x5a; 256]);
    std::fs::write(&file, bytes).expect("write");
    let unchecked = pagoda_store::Store::open(Some(s.store.root().to_path_buf())).expect("store");
    unchecked
        .pull(
            file.to_str().expect("utf-8"),
            &pagoda_store::PullOptions {
                name: Some("broken:1".into()),
                ..Default::default()
            },
        )
        .expect("stored without the check");
    for stream in [false, true] {
        let r = s
            .post(
                "/api/create",
                json!({"model": "child:1", "from": "broken:1", "system": "hi", "stream": stream}),
            )
            .await;
        expect_ollama_error(r, 400, "cannot be loaded").await;
    }
    let r = s
        .post(
            "/api/copy",
            json!({"source": "broken:1", "destination": "twin:1"}),
        )
        .await;
    expect_ollama_error(r, 400, "broken:1").await;
    assert_eq!(tag_names(&s).await, vec!["broken:1"]);
    assert_eq!(blob_count(&s), 1);
    s.stop().await.expect("clean stop");
}
