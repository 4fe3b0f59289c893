//! Active health checks: a background task that GETs each replica's health path.
//!
//! Owns the check loop. Every `interval_ms` it reads the *current* pools (so replicas added or
//! removed by a reload are picked up on the next round), checks every replica concurrently with
//! `timeout_ms`, and feeds the result to the replica: `unhealthy_after` consecutive failures mark
//! it down, `healthy_after` consecutive passes mark it up (both read as at least 1). A pass is
//! any 2xx answer; anything else, a timeout or a connection error is a failure. Health is
//! separate from the circuit breaker: a replica takes traffic only when both allow it.
//!
//! The task runs until aborted through its `JoinHandle`; a changed `[health]` section takes
//! effect when the caller aborts it and spawns a new one. `interval_ms = 0` turns checks off
//! (the returned task ends at once and every replica stays healthy).

use std::sync::Arc;
use std::time::Duration;

use super::{Replica, Upstreams};
use crate::config::HealthConfig;

/// Spawns the health-check loop over `upstreams` (see the module docs).
pub fn spawn_health_checks(
    upstreams: Arc<Upstreams>,
    config: HealthConfig,
    client: reqwest::Client,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if config.interval_ms == 0 {
            tracing::info!("active health checks are off (health.interval_ms = 0)");
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_millis(config.interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            check_round(&upstreams, &config, &client).await;
        }
    })
}

/// Checks every replica of every pool once, concurrently.
pub async fn check_round(upstreams: &Upstreams, config: &HealthConfig, client: &reqwest::Client) {
    let replicas: Vec<Arc<Replica>> = upstreams
        .pools()
        .iter()
        .flat_map(|p| p.replicas().iter().cloned())
        .collect();
    let checks = replicas.iter().map(|r| check_one(r, config, client));
    futures_util::future::join_all(checks).await;
}

async fn check_one(replica: &Replica, config: &HealthConfig, client: &reqwest::Client) {
    let url = health_url(&replica.url, &config.path);
    let timeout = Duration::from_millis(config.timeout_ms.max(1));
    let ok = match client.get(&url).timeout(timeout).send().await {
        Ok(resp) => resp.status().is_success(),
        Err(e) => {
            tracing::debug!(%url, error = %e, "health check failed");
            false
        }
    };
    match replica.observe_health(ok, config) {
        Some(true) => {
            tracing::info!(target_name = %replica.target, url = %replica.url, "replica is healthy again")
        }
        Some(false) => {
            tracing::warn!(target_name = %replica.target, url = %replica.url, "replica marked down by health checks")
        }
        None => {}
    }
}

/// `base` + `path` with exactly one `/` between them.
pub fn health_url(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GatewayConfig, TargetConfig};
    use std::sync::atomic::{AtomicBool, Ordering};

    fn upstreams(urls: Vec<String>) -> Arc<Upstreams> {
        Arc::new(Upstreams::new(&config_with(urls)))
    }

    fn config_with(urls: Vec<String>) -> GatewayConfig {
        GatewayConfig {
            targets: vec![TargetConfig {
                name: "t".into(),
                model: None,
                replicas: urls,
                canned_reply: None,
                max_concurrency: 4,
                queue_timeout_ms: 100,
                timeout_ms: 0,
                api_key: None,
                discover: None,
                discover_interval_ms: 5000,
            }],
            ..GatewayConfig::default()
        }
    }

    /// A server whose `/health` answers 200 or 503 as `up` says.
    async fn toggled_server(up: Arc<AtomicBool>) -> String {
        use axum::http::StatusCode;
        let app = axum::Router::new().route(
            "/health",
            axum::routing::get(move || {
                let up = up.clone();
                async move {
                    if up.load(Ordering::SeqCst) {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.ok() });
        format!("http://{addr}")
    }

    /// A client that never goes through a proxy from the environment.
    fn client() -> reqwest::Client {
        reqwest::Client::builder().no_proxy().build().unwrap()
    }

    fn cfg(interval_ms: u64) -> HealthConfig {
        HealthConfig {
            interval_ms,
            path: "/health".into(),
            timeout_ms: 500,
            unhealthy_after: 2,
            healthy_after: 1,
        }
    }

    #[test]
    fn url_joining() {
        assert_eq!(health_url("http://a:1", "/health"), "http://a:1/health");
        assert_eq!(health_url("http://a:1/", "health"), "http://a:1/health");
        assert_eq!(health_url("http://a:1/base/", "/h"), "http://a:1/base/h");
    }

    #[tokio::test]
    async fn rounds_mark_a_replica_down_and_back_up() {
        let up = Arc::new(AtomicBool::new(true));
        let url = toggled_server(up.clone()).await;
        let ups = upstreams(vec![url]);
        let replica = ups.pool("t").unwrap().replicas()[0].clone();
        let (config, client) = (cfg(10), client());

        check_round(&ups, &config, &client).await;
        assert!(replica.is_healthy());
        up.store(false, Ordering::SeqCst);
        check_round(&ups, &config, &client).await;
        assert!(replica.is_healthy(), "one failure is not enough");
        check_round(&ups, &config, &client).await;
        assert!(!replica.is_healthy());
        assert!(ups
            .pool("t")
            .unwrap()
            .pick(&crate::upstream::Pick::LeastOutstanding)
            .is_none());
        up.store(true, Ordering::SeqCst);
        check_round(&ups, &config, &client).await;
        assert!(replica.is_healthy());
        assert!(ups
            .pool("t")
            .unwrap()
            .pick(&crate::upstream::Pick::LeastOutstanding)
            .is_some());
    }

    #[tokio::test]
    async fn unreachable_replica_is_marked_down() {
        // Bind then drop a listener: connections to its port are refused.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let ups = upstreams(vec![url]);
        let (config, client) = (cfg(10), client());
        check_round(&ups, &config, &client).await;
        check_round(&ups, &config, &client).await;
        assert!(!ups.pool("t").unwrap().replicas()[0].is_healthy());
    }

    #[tokio::test]
    async fn spawned_task_runs_rounds_and_sees_reloads() {
        let up = Arc::new(AtomicBool::new(false));
        let url = toggled_server(up.clone()).await;
        let ups = upstreams(vec!["http://127.0.0.1:9/".into()]);
        let task = spawn_health_checks(ups.clone(), cfg(10), client());

        // A replica added by a reload is checked on the next rounds.
        ups.reconcile(&config_with(vec![url]));
        let replica = ups.pool("t").unwrap().replicas()[0].clone();
        wait_until(|| !replica.is_healthy()).await;
        up.store(true, Ordering::SeqCst);
        wait_until(|| replica.is_healthy()).await;
        task.abort();
    }

    #[tokio::test]
    async fn interval_zero_turns_checks_off() {
        let ups = upstreams(vec!["http://127.0.0.1:9".into()]);
        let task = spawn_health_checks(ups.clone(), cfg(0), client());
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .unwrap()
            .unwrap();
        assert!(ups.pool("t").unwrap().replicas()[0].is_healthy());
    }

    async fn wait_until(cond: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
        while !cond() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "condition not reached in time"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
