//! `GET /` and `GET /chat/...`: the chat page, a handful of static files compiled into the
//! binary (`assets/chat/`: the HTML, its script and styles, and the vendored Markdown
//! renderer and HTML sanitiser in `assets/chat/vendor/`, whose README names their versions
//! and licences). No build step, nothing fetched at run time. The page streams from
//! `/v1/chat/completions`, offers the models `/v1/models` says can chat, and keeps
//! conversations in the browser's storage (`assets/chat/chat.js` says how).
//!
//! Invariant: every file here goes out with [`CONTENT_SECURITY_POLICY`]: scripts, styles,
//! images and connections from the server's own origin only, no inline script or style, no
//! frames. The page renders model output only through the sanitiser; the policy is the
//! second wall, so text a model writes cannot run script or make the browser call out even if
//! the sanitiser missed something.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// What the browser may load and run on the chat page.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// One file of the page: where it is served, its type, its bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const JS: &str = "text/javascript; charset=utf-8";

/// The page (`/`) and every file it loads.
const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_str!("../assets/chat/index.html"),
    },
    Asset {
        path: "/chat/chat.js",
        content_type: JS,
        body: include_str!("../assets/chat/chat.js"),
    },
    Asset {
        path: "/chat/chat.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../assets/chat/chat.css"),
    },
    Asset {
        path: "/chat/vendor/marked.umd.js",
        content_type: JS,
        body: include_str!("../assets/chat/vendor/marked.umd.js"),
    },
    Asset {
        path: "/chat/vendor/purify.min.js",
        content_type: JS,
        body: include_str!("../assets/chat/vendor/purify.min.js"),
    },
];

/// The page's routes, one per file (generic over the state, which they do not read).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS.iter().fold(Router::new(), |router, asset| {
        router.route(asset.path, get(move || async move { serve(asset) }))
    })
}

/// Whether `path` is one of the page's files (open without an API key, as the page is).
pub fn is_page_file(path: &str) -> bool {
    ASSETS.iter().any(|a| a.path == path)
}

fn serve(asset: &'static Asset) -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            // Revalidated on each load, so a new binary's page is never mixed with old files.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        asset.body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_every_file_it_names_and_nothing_from_elsewhere() {
        let page = ASSETS[0].body;
        for asset in &ASSETS[1..] {
            assert!(
                page.contains(&format!("\"{}\"", asset.path)),
                "{} is served but the page does not load it",
                asset.path
            );
        }
        // The page's own files name no other origin (the vendored files hold URLs only as
        // strings: XML namespaces, documentation links).
        for asset in &ASSETS[..3] {
            for scheme in ["http://", "https://", "//cdn", "src=\"//"] {
                assert!(
                    !asset.body.contains(scheme),
                    "{} names {scheme}",
                    asset.path
                );
            }
        }
        // No inline script or style: the policy would refuse them.
        assert!(!page.contains("<style") && !page.contains("style="));
        for script in page.split("<script").skip(1) {
            assert!(script.starts_with(" src="), "inline script: {script}");
        }
    }

    #[test]
    fn vendored_files_are_the_released_ones() {
        // The sha256 of each file as its npm release ships it (assets/chat/vendor/README.md);
        // `hash_key` is a plain sha256 of the text.
        let want = [
            (
                "/chat/vendor/marked.umd.js",
                "f8c7f128939415995e2219e8a84bec42fab27f5980d22e361339e6901da5eadf",
            ),
            (
                "/chat/vendor/purify.min.js",
                "f69a46022ab1f53e969c8ebbca98172c8995785a9b3be72ea4a12d25b1a1bf67",
            ),
        ];
        for (path, sha256) in want {
            let asset = ASSETS.iter().find(|a| a.path == path).expect(path);
            assert_eq!(
                pagoda_http::api_key::hash_key(asset.body),
                format!("sha256:{sha256}"),
                "{path} differs from the release named in vendor/README.md"
            );
        }
    }

    #[test]
    fn only_the_page_files_are_open() {
        assert!(is_page_file("/") && is_page_file("/chat/chat.js"));
        assert!(!is_page_file("/chat/") && !is_page_file("/chat/nope.js"));
        assert!(!is_page_file("/v1/models"));
    }
}
