//! Pagoda's model gateway: the one entry point in front of many model servers.
//!
//! A request's path: `app` (body limit, auth with `keys`, limits with `limits`, cache lookup with
//! `cache`) -> `route` (client model name -> target version: rules, splits, `rollout` canary
//! weights) -> `proxy` (replica choice and queueing in `upstream`, retries, fallback chain,
//! streaming relay) -> `usage` ledger, `metrics`, rollout statistics. `reload` swaps validated
//! configs in while requests run; `admin` is the operator's API. `request_id` names every
//! request and response; `privacy` keeps the upstreams behind a route out of what clients see.

pub mod cache;
pub mod config;
pub mod keys;
pub mod limits;
pub mod metrics;
pub mod rollout;
pub mod upstream;
pub mod usage;

pub mod admin;
pub mod app;
pub mod error;
pub mod privacy;
pub mod proxy;
pub mod reload;
pub mod request_id;
pub mod route;
pub mod state;

use std::future::Future;
use std::sync::Arc;

/// Serves the gateway on `listener` until `shutdown` resolves, with its background tasks:
/// active health checks, rollout analysis and config-file watching.
pub async fn serve(
    gateway: Arc<state::Gateway>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let config = gateway.config();
    let tasks = [
        upstream::spawn_health_checks(
            gateway.upstreams.clone(),
            config.health.clone(),
            gateway.client.clone(),
        ),
        gateway.rollouts.clone().spawn_analysis(),
        reload::spawn_watcher(gateway.clone()),
    ];
    let app = app::router(gateway.clone());
    // Small answers must not wait for the client's delayed ACK (Nagle's algorithm).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    for t in tasks {
        t.abort();
    }
    gateway.usage.flush().await;
    result
}
