//! The retry policy against replicas that fail at different moments (`proxy/retry.rs`): a
//! request that crashes every replica it reaches costs at most `1 + max_replays` of them,
//! while a replica that refuses connections still fails over to a healthy one.

use serde_json::{json, Value};

use crate::harness::{key_block, start};
use crate::stub;

const KEY: &str = "pk-replay-test-key";

/// Retries are not what limits a poisonous request here: five attempts per target, fast.
const RETRY: &str = "[retry]\nmax_attempts = 5\nbase_backoff_ms = 1\nmax_backoff_ms = 5\n[health]\ninterval_ms = 0\n";

/// The value of the series of `name` whose labels include every one of `labels`, else 0.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_request_that_crashes_replicas_reaches_one_more_than_max_replays() {
    // (route's max_replays, stream, replicas that get the request)
    for (max_replays, stream, reached) in [
        (None, false, 2),
        (None, true, 2),
        (Some(0), false, 1),
        (Some(2), false, 3),
    ] {
        let replicas = [
            stub::crashing().await,
            stub::crashing().await,
            stub::crashing().await,
        ];
        let urls: Vec<String> = replicas.iter().map(|r| format!("\"{}\"", r.url)).collect();
        let config = format!(
            "{RETRY}[[target]]\nname = \"t\"\nreplicas = [{}]\n[[route]]\nmodel = \"chat\"\ntarget = \"t\"\n{}\n{}",
            urls.join(", "),
            max_replays.map_or(String::new(), |n| format!("max_replays = {n}")),
            key_block("k", KEY, "")
        );
        let case = format!("max_replays {max_replays:?}, stream {stream}");
        let gw = start(&config).await;
        let r = gw.chat(KEY, "chat", json!({"stream": stream})).await;
        assert_eq!(r.status(), 502, "{case}");
        let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
        let text = r.text().await.unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["type"], "server_error", "{case}");
        assert_eq!(v["error"]["code"], "upstream_dropped", "{case}");
        assert_eq!(
            v["error"]["message"],
            format!("route `chat`: a replica failed while handling this request, so it was not sent to more replicas (request id {id})"),
            "{case}"
        );
        for replica in &replicas {
            let port = replica.url.rsplit(':').next().unwrap();
            assert!(
                !text.contains("127.0.0.1") && !text.contains(port),
                "{case}: an upstream address leaked: {text}"
            );
        }

        let got: Vec<u64> = replicas.iter().map(stub::Crashing::received).collect();
        assert_eq!(got.iter().sum::<u64>(), reached, "{case}: {got:?}");
        assert!(
            got.iter().all(|n| *n <= 1),
            "{case}: a replica got it twice: {got:?}"
        );
        // Each replica that dropped it is ejected; the others still take traffic.
        let pool = gw.gateway.upstreams.pool("t").unwrap();
        let open = pool
            .replicas()
            .iter()
            .filter(|r| r.breaker_state() == pagoda_gateway::upstream::BreakerState::Open)
            .count();
        assert_eq!(open as u64, reached, "{case}");

        let m = gw.metrics().await;
        let replays = "pagoda_gateway_replays_total";
        let t = "target=\"t\"";
        assert_eq!(
            sample(&m, replays, &[t, "outcome=\"refused\""]),
            1.0,
            "{case}\n{m}"
        );
        assert_eq!(
            sample(&m, replays, &[t, "outcome=\"sent\""]),
            (reached - 1) as f64,
            "{case}\n{m}"
        );
        assert_eq!(
            sample(&m, "pagoda_gateway_errors_total", &["kind=\"dropped\""]),
            reached as f64,
            "{case}\n{m}"
        );
        assert_eq!(
            sample(&m, "pagoda_gateway_retries_total", &[t]),
            (reached - 1) as f64,
            "{case}: retries of a failed request count too\n{m}"
        );
    }
}

#[tokio::test]
async fn replays_are_counted_over_the_fallback_chain_and_a_canned_reply_still_answers() {
    for (max_replays, fallback_reached) in [(1, 1), (0, 0)] {
        let (first, second) = (stub::crashing().await, stub::crashing().await);
        let config = format!(
            "{RETRY}[[target]]\nname = \"t\"\nreplicas = [\"{}\"]\n[[target]]\nname = \"u\"\nreplicas = [\"{}\"]\n[[target]]\nname = \"sorry\"\ncanned_reply = \"Busy.\"\n[[route]]\nmodel = \"chat\"\ntarget = \"t\"\nfallback = [\"u\", \"sorry\"]\nmax_replays = {max_replays}\n{}",
            first.url,
            second.url,
            key_block("k", KEY, "")
        );
        let gw = start(&config).await;
        let r = gw.chat(KEY, "chat", json!({})).await;
        assert_eq!(r.status(), 200, "max_replays {max_replays}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "Busy.");
        assert_eq!(first.received(), 1, "max_replays {max_replays}");
        assert_eq!(
            second.received(),
            fallback_reached,
            "max_replays {max_replays}: the fallback target is one more replica"
        );
    }
}

#[tokio::test]
async fn a_refused_connection_still_fails_over_to_a_healthy_replica() {
    let dead = stub::dead_url().await;
    let good = stub::start("good").await;
    // No replay allowed: a refused connection never carried the request, so it is no replay.
    let config = format!(
        "{RETRY}[[target]]\nname = \"t\"\nreplicas = [\"{dead}\", \"{}\"]\n[[route]]\nmodel = \"chat\"\ntarget = \"t\"\nbalance = \"round_robin\"\nmax_replays = 0\n{}",
        good.url(),
        key_block("k", KEY, "")
    );
    let gw = start(&config).await;
    for _ in 0..6 {
        let r = gw.chat(KEY, "chat", json!({})).await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "from good as t");
    }
    assert_eq!(good.served(), 6);
    let m = gw.metrics().await;
    assert!(
        sample(&m, "pagoda_gateway_errors_total", &["kind=\"connect\""]) >= 1.0,
        "{m}"
    );
    assert!(!m.contains("pagoda_gateway_replays_total{"), "{m}");
}
