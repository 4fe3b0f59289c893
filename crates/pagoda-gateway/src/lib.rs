//! Pagoda's model gateway: the one entry point in front of many model servers.
//!
//! A request's path: `app` (body limit, auth with `keys`, limits with `limits`, cache lookup with
//! `cache`) -> `route` (client model name -> target version: rules, splits, `rollout` canary
//! weights) -> `proxy` (replica choice and queueing in `upstream`, retries, fallback chain,
//! streaming relay) -> `usage` ledger, `metrics`, rollout statistics. `reload` swaps validated
//! configs in while requests run; `admin` is the operator's API. `request_id` names every
//! request and response; `privacy` keeps the upstreams behind a route out of what clients see.

#![deny(clippy::unwrap_used)]
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
/// active health checks, rollout analysis, config-file watching and replica discovery.
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
        {
            let forget = gateway.clone();
            upstream::discovery::spawn_discovery(
                gateway.upstreams.clone(),
                Arc::new(upstream::discovery::SystemResolver),
                move |target, url| forget.metrics.forget_replica(target, url),
            )
        },
    ];
    let app = app::router(gateway.clone());
    // Header deadlines (408 to a stalled client, idle keep-alive closed) and a connection cap.
    let limits = pagoda_http::ConnectionLimits {
        header_timeout: std::time::Duration::from_millis(config.server.header_timeout_ms),
        max_connections: config.server.max_connections,
    };
    pagoda_http::serve(listener, app, limits, shutdown).await;
    for t in tasks {
        t.abort();
    }
    gateway.usage.flush().await;
    Ok(())
}
