//! Web pages are kept out unless allowed (pagoda-http's `browser_guard` on `pagoda serve`):
//! a cross-site "simple" request (text/plain or form body, no preflight) gets 403 in the
//! route's error shape and changes nothing; a DNS-rebinding Host gets 403 on a loopback bind;
//! loopback pages, the server's own origin and clients without an Origin are served;
//! `allowed_origins` / `allowed_hosts` widen; preflights from allowed origins get the CORS
//! headers.

use crate::harness::{config, expect_openai_error, start, tiny_llama, TestServer};
use crate::ollama_api::{stored, tag_names};
use pagoda_server::auth::ApiKeys;
use pagoda_server::state::BrowserRules;
use serde_json::{json, Value};

const EVIL: &str = "https://evil.example";

/// A browser's simple POST: `body` as text/plain or form-urlencoded, with `origin`.
async fn simple_post(
    s: &TestServer,
    path: &str,
    body: &Value,
    content_type: &str,
    origin: Option<&str>,
) -> reqwest::Response {
    let mut r = s
        .client
        .post(s.url(path))
        .header("content-type", content_type)
        .body(body.to_string());
    if let Some(o) = origin {
        r = r.header("origin", o);
    }
    r.send().await.expect("sent")
}

fn chat() -> Value {
    json!({"model": tiny_llama(), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
}

fn generate() -> Value {
    json!({"model": tiny_llama(), "prompt": "hi", "stream": false, "options": {"num_predict": 2}})
}

/// An Ollama error body `{"error": "..."}` with `status`, returning the message.
async fn ollama_error(r: reqwest::Response, status: u16) -> String {
    assert_eq!(r.status().as_u16(), status);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
    v["error"].as_str().expect("error string").to_string()
}

#[tokio::test]
async fn cross_site_simple_posts_are_refused_and_change_nothing() {
    let s = start(config()).await;
    stored(&s, "tiny:1").await;
    let copy = json!({"source": "tiny:1", "destination": "stolen:1"});
    for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
        let r = simple_post(&s, "/api/copy", &copy, content_type, Some(EVIL)).await;
        let message = ollama_error(r, 403).await;
        assert!(
            message.contains(EVIL) && message.contains("--allowed-origins"),
            "{message}"
        );
        let message = ollama_error(
            simple_post(&s, "/api/generate", &generate(), content_type, Some(EVIL)).await,
            403,
        )
        .await;
        assert!(message.contains("--allowed-origins"), "{message}");
        let r = simple_post(
            &s,
            "/v1/chat/completions",
            &chat(),
            content_type,
            Some(EVIL),
        )
        .await;
        let v = expect_openai_error(r, 403).await;
        assert_eq!(v["error"]["type"], "permission_error", "{v}");
        assert_eq!(v["error"]["code"], "origin_not_allowed", "{v}");
    }
    assert_eq!(tag_names(&s).await, vec!["tiny:1"]);
    // The same text/plain body without an Origin (curl, an SDK) is served: the refusal above
    // was the Origin's doing.
    let r = simple_post(&s, "/api/copy", &copy, "text/plain", None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(tag_names(&s).await, vec!["stolen:1", "tiny:1"]);
    assert!(
        s.metrics()
            .await
            .contains("pagoda:request_errors_total{status=\"403\"} 6"),
        "the six refusals are counted"
    );
}

#[tokio::test]
async fn loopback_pages_and_the_server_itself_are_served_with_cors_headers() {
    let s = start(config()).await;
    let own = format!("http://{}", s.addr);
    for origin in [
        "http://localhost:3000",
        "http://127.0.0.1",
        "https://[::1]:8443",
        own.as_str(),
        "tauri://localhost",
    ] {
        let r = s
            .client
            .post(s.url("/v1/chat/completions"))
            .header("origin", origin)
            .json(&chat())
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 200, "{origin}");
        let h = r.headers();
        assert_eq!(h["access-control-allow-origin"], origin);
        assert_eq!(h["vary"], "Origin");
        assert!(h["access-control-expose-headers"]
            .to_str()
            .expect("ascii")
            .contains("x-request-id"));
    }
    // No Origin: no CORS headers at all.
    let r = s.post("/v1/chat/completions", chat()).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn a_rebinding_host_is_refused_on_a_loopback_bind() {
    let s = start(config()).await;
    let port = s.addr.port();
    for host in [format!("evil.example:{port}"), "evil.example".into()] {
        let r = s
            .client
            .post(s.url("/api/generate"))
            .header("host", &host)
            .json(&generate())
            .send()
            .await
            .expect("sent");
        let message = ollama_error(r, 403).await;
        assert!(message.contains("--allowed-hosts"), "{message}");
        let r = s
            .client
            .get(s.url("/v1/models"))
            .header("host", &host)
            .send()
            .await
            .expect("sent");
        let v = expect_openai_error(r, 403).await;
        assert_eq!(v["error"]["code"], "host_not_allowed", "{v}");
    }
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "[::1]".into(),
    ] {
        let r = s
            .client
            .get(s.url("/v1/models"))
            .header("host", &host)
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 200, "{host}");
    }
}

#[tokio::test]
async fn allowed_origins_and_hosts_widen_the_defaults() {
    let mut c = config();
    c.browsers = BrowserRules {
        allowed_origins: vec!["https://app.example".into()],
        allowed_hosts: vec!["pagoda.example".into()],
    };
    let s = start(c).await;
    let send = |origin: &'static str, host: &'static str| {
        s.client
            .post(s.url("/v1/chat/completions"))
            .header("origin", origin)
            .header("host", host)
            .header("content-type", "text/plain")
            .body(chat().to_string())
            .send()
    };
    let r = send("https://app.example", "pagoda.example:11435")
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    // The server's own origin under a listed Host name.
    let r = send("http://pagoda.example", "pagoda.example")
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    for (origin, host, code) in [
        (
            "https://other.example",
            "pagoda.example",
            "origin_not_allowed",
        ),
        ("https://app.example", "other.example", "host_not_allowed"),
    ] {
        let v = expect_openai_error(send(origin, host).await.expect("sent"), 403).await;
        assert_eq!(v["error"]["code"], code, "{origin} {host}");
    }

    let mut c = config();
    c.browsers.allowed_origins = vec!["*".into()];
    let s = start(c).await;
    let r = simple_post(
        &s,
        "/v1/chat/completions",
        &chat(),
        "text/plain",
        Some(EVIL),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
}

#[tokio::test]
async fn preflights_from_allowed_origins_get_cors_headers_without_a_key() {
    let mut c = config();
    c.api_keys = ApiKeys::new(&["pk".to_string()], &[] as &[&str]).expect("keys");
    let s = start(c).await;
    let preflight = |origin: &'static str| {
        s.client
            .request(reqwest::Method::OPTIONS, s.url("/v1/chat/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
    };
    let r = preflight("http://localhost:5173").await.expect("sent");
    assert_eq!(r.status(), 204);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "http://localhost:5173");
    assert_eq!(
        h["access-control-allow-headers"],
        "authorization, content-type"
    );
    assert!(h["access-control-allow-methods"]
        .to_str()
        .expect("ascii")
        .contains("POST"));
    assert!(h.get("access-control-max-age").is_some());
    // The request it clears still needs the key, and carries the origin back.
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .header("origin", "http://localhost:5173")
        .bearer_auth("pk")
        .json(&chat())
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:5173"
    );

    let r = preflight(EVIL).await.expect("sent");
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let v = expect_openai_error(r, 403).await;
    assert_eq!(v["error"]["code"], "origin_not_allowed", "{v}");
}
