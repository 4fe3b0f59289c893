//! Canary rollouts end to end, and hot reload under load.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{key_block, start};
use crate::stub;

const KEY: &str = "pk-rollout-test-key";

fn config(stable: &stub::Stub, canary: &stub::Stub) -> String {
    format!(
        "[[target]]\nname = \"v1\"\nreplicas = [\"{}\"]\n[[target]]\nname = \"v2\"\nreplicas = [\"{}\"]\n\
         [[route]]\nmodel = \"chat\"\nfallback = [\"v1\"]\n[route.rollout]\nstable = \"v1\"\ncanary = \"v2\"\n\
         steps = [20, 50, 100]\nhold_s = 0.3\nmin_requests = 10\ninterval_s = 0.2\n{}",
        stable.url(),
        canary.url(),
        key_block("k", KEY, "")
    )
}

async fn rollout_state(gw: &crate::harness::TestGateway) -> Value {
    let v = gw.admin_get("/admin/rollouts").await;
    v["data"][0].clone()
}

/// Sends requests from distinct users until `done` says stop or the deadline passes.
async fn drive(
    gw: &Arc<crate::harness::TestGateway>,
    deadline: Duration,
    done: impl Fn(&Value) -> bool,
) -> (Value, usize) {
    let start = Instant::now();
    let mut failures = 0;
    let mut i = 0u64;
    loop {
        for _ in 0..20 {
            i += 1;
            let r = gw.chat(KEY, "chat", json!({"user": format!("u{i}")})).await;
            failures += usize::from(r.status() != 200);
        }
        let state = rollout_state(gw).await;
        if done(&state) || start.elapsed() > deadline {
            return (state, failures);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_canary_reaches_100_percent() {
    let (v1, v2) = (stub::start("v1").await, stub::start("v2").await);
    let gw = Arc::new(start(&config(&v1, &v2)).await);
    let (state, failures) = drive(&gw, Duration::from_secs(20), |s| {
        s["canary_percent"].as_f64() == Some(100.0)
    })
    .await;
    assert_eq!(failures, 0);
    assert_eq!(state["canary_percent"].as_f64(), Some(100.0), "{state}");
    // At 100 % every new request goes to the canary.
    let before = v2.served();
    for i in 0..10 {
        gw.chat(KEY, "chat", json!({"user": format!("late{i}")}))
            .await;
    }
    assert_eq!(v2.served() - before, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_canary_is_rolled_back_within_an_interval_and_stable_keeps_serving() {
    let (v1, v2) = (stub::start("v1").await, stub::start("v2").await);
    let gw = Arc::new(start(&config(&v1, &v2)).await);
    v2.fail_with(500);
    let started = Instant::now();
    let (state, failures) = drive(&gw, Duration::from_secs(10), |s| {
        s["canary_percent"].as_f64() == Some(0.0)
    })
    .await;
    assert_eq!(state["canary_percent"].as_f64(), Some(0.0), "{state}");
    let reason = state.to_string();
    assert!(
        reason.contains("error"),
        "the reason names the error rate: {reason}"
    );
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_eq!(failures, 0, "the fallback to stable served every request");
    // After the rollback, no request reaches the canary.
    let before = v2.served();
    for i in 0..20 {
        assert_eq!(
            gw.chat(KEY, "chat", json!({"user": format!("after{i}")}))
                .await
                .status(),
            200
        );
    }
    assert_eq!(v2.served(), before);
}

/// Polls `/admin/config` until `done` holds (10 s at most); returns the last answer.
async fn wait_for(gw: &crate::harness::TestGateway, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = gw.admin_get("/admin/config").await;
        if done(&c) || Instant::now() > deadline {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_reload_under_load_drops_nothing_and_a_bad_one_is_rejected() {
    let (a, b) = (stub::start("a").await, stub::start("b").await);
    let base = |wa: u32, wb: u32| {
        format!(
            "[[target]]\nname = \"a\"\nreplicas = [\"{}\"]\n[[target]]\nname = \"b\"\nreplicas = [\"{}\"]\n\
             [[route]]\nmodel = \"chat\"\n[route.split]\nweights = {{ a = {wa}, b = {wb} }}\n{}",
            a.url(),
            b.url(),
            key_block("k", KEY, "")
        )
    };
    let gw = Arc::new(start(&base(100, 0)).await);
    let load = {
        let gw = gw.clone();
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..300 {
                statuses.push(gw.chat(KEY, "chat", json!({})).await.status().as_u16());
            }
            statuses
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    gw.rewrite(&base(0, 100));
    wait_for(&gw, |c| c["reload"]["generation"].as_u64() == Some(1)).await;
    let statuses = load.await.unwrap();
    assert!(statuses.iter().all(|s| *s == 200), "dropped during reload");
    let before = b.served();
    gw.chat(KEY, "chat", json!({})).await;
    assert_eq!(b.served(), before + 1, "the new weights apply");

    // An invalid edit is rejected with its reason; the old config keeps serving.
    gw.rewrite(&base(0, 100).replace("name = \"b\"", "name = \"b\"\nbogus = 1"));
    let status = wait_for(&gw, |c| c["reload"]["last_error"].is_string()).await;
    let err = status["reload"]["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(err.contains("bogus"), "{status}");
    assert_eq!(gw.chat(KEY, "chat", json!({})).await.status(), 200);
}
