//! Serving HTTP/1.1 connections with limits on each: [`serve`].
//!
//! axum's own `serve` reads headers without a deadline and accepts without bound. Here every
//! connection runs under [`ConnectionLimits`]:
//! - at most `max_connections` are open; further clients wait in the kernel's backlog;
//! - a request's headers must arrive within `header_timeout` of the connection being ready for
//!   them — for a fresh connection, from accept; for a keep-alive one, from the end of the
//!   previous response, so the same deadline bounds an idle connection. A client that sent
//!   part of its headers gets `408 Request Timeout`; an idle one is closed silently;
//! - the body deadline is the caller's (the server's `body.rs`, the gateway's body reader),
//!   because only a handler knows that it wants a body.
//!
//! Invariants: each connection holds one permit of the semaphore for its whole life, so
//! "every permit back" means "every connection closed"; on shutdown no connection is
//! accepted, each open one finishes the request in flight and is closed (no keep-alive).

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// Limits on every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A request's headers must arrive within this time of the connection being ready for
    /// them (also how long an idle keep-alive connection stays open).
    pub header_timeout: Duration,
    /// Connections open at once; more wait in the kernel's backlog until one closes.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout: Duration::from_secs(10),
            max_connections: 1024,
        }
    }
}

/// The body of the 408 a client that stalled mid-headers gets before its connection closes.
const HEADER_TIMEOUT_BODY: &str = r#"{"error":{"message":"the request headers did not arrive in time; send them at once","type":"invalid_request_error","param":null,"code":"request_timeout"}}"#;

/// The whole 408 response, with its request id.
fn header_timeout_response(request_id: &str) -> String {
    format!(
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nx-request-id: {request_id}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{HEADER_TIMEOUT_BODY}",
        HEADER_TIMEOUT_BODY.len()
    )
}

/// Serves `router` on `listener` until `shutdown` resolves, then stops accepting and returns
/// once every connection has closed (the caller bounds that wait with its grace period).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    // The semaphore holds at most MAX_PERMITS and the final wait asks for a u32 of them.
    let cap = limits
        .max_connections
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let permits = Arc::new(Semaphore::new(cap));
    let (draining_tx, draining_rx) = watch::channel(false);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let builder = Arc::new(builder);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (tcp, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors or a connection reset before accept: wait a
                    // little rather than spin, and keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Streams are many small writes: without TCP_NODELAY, Nagle's algorithm holds a
        // token's event back until the client acknowledges the previous write.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY not set on a connection: {e}");
        }
        let builder = builder.clone();
        let router = router.clone();
        let draining = draining_rx.clone();
        tokio::spawn(async move {
            serve_connection(&builder, tcp, router, draining).await;
            drop(permit);
        });
    }
    let _ = draining_tx.send(true);
    drop(listener);
    // Every permit back = every connection closed.
    let _ = permits
        .acquire_many(u32::try_from(cap).unwrap_or(u32::MAX))
        .await;
}

type BoxedResponse =
    Pin<Box<dyn Future<Output = Result<axum::response::Response, Infallible>> + Send>>;

async fn serve_connection(
    builder: &http1::Builder,
    tcp: TcpStream,
    router: Router,
    mut draining: watch::Receiver<bool>,
) {
    let tower = TowerToHyperService::new(router);
    // Boxed so the connection can be polled without shutting its socket down (to answer 408).
    let service = hyper::service::service_fn(move |req| -> BoxedResponse {
        Box::pin(hyper::service::Service::call(&tower, req))
    });
    let mut conn = builder.serve_connection(TokioIo::new(tcp), service);
    let mut shutting_down = *draining.borrow();
    if shutting_down {
        Pin::new(&mut conn).graceful_shutdown();
    }
    let result = loop {
        tokio::select! {
            r = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => break r,
            changed = draining.changed(), if !shutting_down => {
                shutting_down = true;
                if changed.is_ok() {
                    Pin::new(&mut conn).graceful_shutdown();
                }
            }
        }
    };
    let parts = conn.into_parts();
    let mut io = parts.io.into_inner();
    match result {
        Err(e) if e.is_timeout() && !parts.read_buf.is_empty() => {
            let request_id = crate::request_id::new_id();
            tracing::info!(%request_id, "closing a connection whose request headers stalled (408)");
            let _ = io
                .write_all(header_timeout_response(&request_id).as_bytes())
                .await;
        }
        Err(e) if e.is_timeout() => tracing::trace!("closing an idle connection"),
        Err(e) => tracing::debug!(error = %e, "connection ended with an error"),
        Ok(()) => {}
    }
    let _ = io.shutdown().await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_canned_408_declares_its_body_length() {
        let text = super::header_timeout_response("req-1");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        let declared: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|n| n.parse().ok())
            .expect("content-length");
        assert_eq!(declared, body.len());
        assert!(head.contains("x-request-id: req-1"));
        let v: serde_json::Value = serde_json::from_str(body).expect("json body");
        assert_eq!(v["error"]["code"], "request_timeout");
    }
}
