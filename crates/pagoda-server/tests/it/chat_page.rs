//! The chat page's files over HTTP: the page and every file it loads are served from the
//! binary with the page's Content-Security-Policy, open without an API key; a name that is
//! not one of them is a 404. (What the page does in a browser is
//! scripts/conformance/chat_page.py's, in headless Chromium.)

use crate::harness::{config, start};
use pagoda_server::auth::ApiKeys;
use pagoda_server::chat_page::CONTENT_SECURITY_POLICY;

#[tokio::test]
async fn the_page_and_its_files_are_served_with_the_policy_and_without_a_key() {
    let mut c = config();
    c.api_keys = ApiKeys::new(&["pk-page".into()], &[] as &[&str]).expect("keys");
    let s = start(c).await;
    let page = s.client.get(s.url("/")).send().await.expect("sent");
    assert_eq!(page.status(), 200);
    let header = |r: &reqwest::Response, name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        header(&page, "content-security-policy"),
        CONTENT_SECURITY_POLICY
    );
    assert!(header(&page, "content-type").starts_with("text/html"));
    let html = page.text().await.expect("body");
    // Every file the page names (src="/..." and href="/...") is served, with its type.
    let files: Vec<&str> = html
        .split(['"', '\''])
        .filter(|s| s.starts_with("/chat/"))
        .collect();
    assert!(files.len() >= 4, "{files:?}");
    for file in files {
        let r = s.client.get(s.url(file)).send().await.expect("sent");
        assert_eq!(r.status(), 200, "{file}");
        let kind = header(&r, "content-type");
        let want = if file.ends_with(".css") {
            "text/css"
        } else {
            "text/javascript"
        };
        assert!(kind.starts_with(want), "{file}: {kind}");
        assert_eq!(header(&r, "x-content-type-options"), "nosniff", "{file}");
        assert_eq!(
            header(&r, "content-security-policy"),
            CONTENT_SECURITY_POLICY,
            "{file}"
        );
        assert!(!r.bytes().await.expect("body").is_empty(), "{file}");
    }
    // Only the page's own files: anything else under /chat/ is the usual 404 (with a key,
    // so it is routing that answers, not the key check).
    let r = s
        .client
        .get(s.url("/chat/vendor/other.js"))
        .bearer_auth("pk-page")
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 404);
    // The API behind the page still needs the key.
    let r = s
        .client
        .get(s.url("/v1/models"))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 401);
    s.stop().await.expect("clean stop");
}
