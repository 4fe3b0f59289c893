//! The request id: one per HTTP request, carried by every response in `x-request-id`.
//!
//! Owns choosing the id and putting it on the response. A client may send its own
//! `x-request-id`; it is kept when it is [`is_acceptable`] (1 to [`MAX_LEN`] characters of
//! `A-Z a-z 0-9 . _ : -`, one header), otherwise the gateway makes one
//! ([`Gateway::next_request_id`]). The id is the request's name everywhere: the log lines that
//! carry the upstream details, the usage ledger row, the `x-request-id` sent upstream (so the
//! model server's log can be joined) and the response.
//!
//! Invariants: [`assign`] wraps the whole router (client API, admin API, health, metrics and
//! the fallback for unknown paths), so every response the router produces — errors included —
//! carries exactly one `x-request-id`, equal to the [`RequestId`] its handler saw; an id that
//! reaches a header or a log line is always acceptable, so it can neither break a header nor
//! forge a log line. A handler's panic becomes that request's 500 here
//! ([`pagoda_http::panics`]), so it too carries its id.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::state::Gateway;

pub use pagoda_http::request_id::{is_acceptable, HEADER as REQUEST_ID_HEADER, MAX_LEN};

/// The id of the request being handled, in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// The client's id, when it sent exactly one acceptable `x-request-id`.
pub fn from_client(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(REQUEST_ID_HEADER).iter();
    let (Some(only), None) = (values.next(), values.next()) else {
        return None;
    };
    only.to_str().ok().filter(|id| is_acceptable(id))
}

/// Middleware: picks the request's id, hands it to the handler as a [`RequestId`] extension
/// and sets `x-request-id` on whatever response comes back.
pub async fn assign(State(gw): State<Arc<Gateway>>, mut request: Request, next: Next) -> Response {
    let id = match from_client(request.headers()) {
        Some(id) => id.to_string(),
        None => gw.next_request_id(),
    };
    let header = HeaderValue::from_str(&id);
    request.extensions_mut().insert(RequestId(id.clone()));
    let path = request.uri().path().to_string();
    // A handler's panic (a bug) is this request's 500 under its id, not a dropped connection.
    let mut response = match pagoda_http::panics::catch(next.run(request)).await {
        Ok(response) => response,
        Err(reason) => {
            tracing::error!(request_id = %id, path = %path, panic = %reason, "request handler panicked");
            crate::error::ApiError::internal(
                "the gateway failed to handle this request; its log has the details under this response's x-request-id",
            )
            .into_response()
        }
    };
    match header {
        Ok(value) => {
            response.headers_mut().insert(REQUEST_ID_HEADER, value);
        }
        // Unreachable: acceptable client ids and the gateway's own are visible ASCII.
        Err(e) => tracing::error!(error = %e, "a request id is not a valid header value"),
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_safe_ids_are_kept_and_others_refused() {
        for ok in ["a", "req-42", "trace:1.2_3", &"x".repeat(MAX_LEN)] {
            assert!(is_acceptable(ok), "{ok:?}");
        }
        for bad in [
            "",
            &"x".repeat(MAX_LEN + 1),
            "has space",
            "new\nline",
            "semi;colon",
            "slash/",
            "é",
        ] {
            assert!(!is_acceptable(bad), "{bad:?}");
        }
    }

    #[test]
    fn only_a_single_acceptable_header_is_taken() {
        let mut h = HeaderMap::new();
        assert_eq!(from_client(&h), None);
        h.insert(REQUEST_ID_HEADER, HeaderValue::from_static("abc-1"));
        assert_eq!(from_client(&h), Some("abc-1"));
        h.append(REQUEST_ID_HEADER, HeaderValue::from_static("abc-2"));
        assert_eq!(from_client(&h), None, "two ids: neither is trusted");
        h.insert(REQUEST_ID_HEADER, HeaderValue::from_static("a b"));
        assert_eq!(from_client(&h), None);
    }
}
