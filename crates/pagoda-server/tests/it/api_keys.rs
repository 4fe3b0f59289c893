//! API keys on the server itself (`pagoda serve --api-key`, `--api-key-file`): every API
//! route refuses a request without a configured key with 401 in its own error shape, the
//! probes and the scrape stay open, and the refusals are counted.

use crate::harness::{config, expect_openai_error, start, tiny_llama};
use pagoda_server::auth::ApiKeys;
use serde_json::json;

#[tokio::test]
async fn api_routes_need_a_configured_key_and_probes_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("keys");
    std::fs::write(
        &key_file,
        format!(
            "# hashes only\n{} ci\n",
            pagoda_http::api_key::hash_key("pk-from-file")
        ),
    )
    .unwrap();
    let mut c = config();
    c.api_keys = ApiKeys::new(&["pk-flag".to_string()], &[&key_file]).unwrap();
    let s = start(c).await;
    let chat = json!({"model": tiny_llama(), "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 2});
    let send = |path: &str, auth: Option<&str>| {
        let mut r = s.client.post(s.url(path)).json(&chat);
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.send()
    };

    // Refused: no header, another scheme, a wrong key, a key's hash presented as the key.
    let hash = pagoda_http::api_key::hash_key("pk-flag");
    let wrong = [
        None,
        Some("Basic cGs6ZmxhZw=="),
        Some("Bearer pk-wrong"),
        Some("Bearer"),
        Some(&format!("Bearer {hash}")[..]),
    ];
    for auth in wrong {
        let r = send("/v1/chat/completions", auth).await.unwrap();
        assert_eq!(
            r.headers()
                .get("www-authenticate")
                .map(|v| v.to_str().unwrap()),
            Some("Bearer"),
            "{auth:?}"
        );
        let v = expect_openai_error(r, 401).await;
        assert_eq!(v["error"]["code"], "invalid_api_key", "{auth:?}: {v}");
    }
    // Ollama's routes answer in Ollama's shape; the model list is guarded too.
    let r = s.client.get(s.url("/api/tags")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("API key"), "{v}");
    let r = s.client.get(s.url("/v1/models")).send().await.unwrap();
    assert_eq!(r.status(), 401);

    // Admitted: the flag's key and the file's key, through the OpenAI and Ollama routes.
    for key in ["pk-flag", "pk-from-file"] {
        let r = send("/v1/chat/completions", Some(&format!("Bearer {key}")))
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{key}");
        let r = s
            .client
            .get(s.url("/api/tags"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{key}");
    }

    // Open without a key: liveness, readiness, the scrape, the chat page.
    for path in ["/health", "/ready", "/metrics", "/"] {
        let r = s.client.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let m = s.metrics().await;
    let refused: f64 = m
        .lines()
        .find(|l| l.starts_with("pagoda:request_errors_total{status=\"401\"}"))
        .and_then(|l| l.rsplit_once(' '))
        .map(|(_, v)| v.parse().unwrap())
        .expect("401s counted");
    assert_eq!(refused, (wrong.len() + 2) as f64);
    s.stop().await.unwrap();
}
