//! The Ollama API over HTTP: generate and chat (NDJSON streams and single objects, the
//! final counts, `context` continuation), model listings, load/unload by keep_alive, errors.

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
    let s = start(config()).await;
    let m = tiny_llama();
    let ps = s.get_json("/api/ps").await;
    assert_eq!(ps["models"][0]["name"], m.as_str());
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
