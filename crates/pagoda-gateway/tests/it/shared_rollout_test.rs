//! Canary rollouts shared by several gateway instances through Redis: one state, one
//! decision per change, admin actions on any instance, a restarted instance resuming.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::harness::{key_block, redis_url, start, TestGateway};
use crate::stub;

const KEY: &str = "pk-shared-rollout-key";

/// Two targets and a route with a rollout of `steps` whose state lives in Redis under a prefix
/// of its own (tests share one Redis).
fn config(redis: &str, prefix: &str, stable: &str, canary: &str, rollout: &str) -> String {
    format!(
        "[redis]\nurl = \"{redis}\"\nprefix = \"{prefix}\"\n\
         [[target]]\nname = \"v1\"\nreplicas = [\"{stable}\"]\n[[target]]\nname = \"v2\"\nreplicas = [\"{canary}\"]\n\
         [[route]]\nmodel = \"chat\"\nfallback = [\"v1\"]\n[route.rollout]\nstable = \"v1\"\ncanary = \"v2\"\n{rollout}\n{}",
        key_block("k", KEY, "")
    )
}

/// A rollout that only an operator moves (the hold is an hour): 10, 50, 100 %.
const HELD: &str = "steps = [10, 50, 100]\nhold_s = 3600\nmin_requests = 10\ninterval_s = 0.2";

fn unique_prefix(test: &str) -> String {
    format!("t-{test}-{:08x}", rand::random::<u32>())
}

async fn state(gw: &TestGateway) -> Value {
    gw.admin_get("/admin/rollouts").await["data"][0].clone()
}

/// Polls `gw`'s rollout until `done` holds or `within` passes; returns the last state and how
/// long it took.
async fn wait_state(
    gw: &TestGateway,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> (Value, Duration) {
    let start = Instant::now();
    loop {
        let s = state(gw).await;
        if done(&s) || start.elapsed() > within {
            return (s, start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn act(gw: &TestGateway, action: &str) -> reqwest::Response {
    gw.admin_post(&format!("/admin/rollouts/chat/{action}"), json!({}))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_action_on_one_instance_reaches_the_other_within_a_second() {
    let Some(redis) = redis_url() else { return };
    let (v1, v2) = (stub::start("v1").await, stub::start("v2").await);
    let prefix = unique_prefix("admin");
    let cfg = config(&redis, &prefix, &v1.url(), &v2.url(), HELD);
    let a = start(&cfg).await;
    let b = start(&cfg).await;
    assert_eq!(state(&a).await["canary_percent"], 10.0);
    assert_eq!(state(&b).await["canary_percent"], 10.0);

    let r = act(&a, "promote").await;
    assert_eq!(r.status(), 200);
    let (s, took) = wait_state(&b, Duration::from_secs(3), |s| s["canary_percent"] == 50.0).await;
    assert_eq!(s["canary_percent"], 50.0, "{s}");
    assert_eq!(s["step"], 1);
    assert!(took < Duration::from_secs(1), "followed after {took:?}");

    // An action on the other instance acts on the same shared state.
    assert_eq!(act(&b, "pause").await.status(), 200);
    let (s, took) = wait_state(&a, Duration::from_secs(3), |s| s["state"] == "paused").await;
    assert_eq!(s["state"], "paused", "{s}");
    assert_eq!(s["canary_percent"], 50.0);
    assert!(took < Duration::from_secs(1), "followed after {took:?}");

    assert_eq!(act(&a, "abort").await.status(), 200);
    let (s, _) = wait_state(&b, Duration::from_secs(3), |s| s["state"] == "aborted").await;
    assert_eq!(s["canary_percent"], 0.0, "{s}");
    // Routing follows the shared state: after the abort nothing reaches the canary through b.
    let before = v2.served();
    for i in 0..10 {
        let r = b.chat(KEY, "chat", json!({"user": format!("u{i}")})).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(v2.served(), before);
    // An action that does not apply to the shared state is refused on either instance.
    let r = act(&b, "promote").await;
    assert_eq!(r.status(), 409);

    // The history names every change and the instance that made it, oldest first.
    let s = state(&a).await;
    let changes: Vec<&str> = s["history"]
        .as_array()
        .expect("history in shared mode")
        .iter()
        .map(|h| h["change"].as_str().unwrap())
        .collect();
    assert_eq!(changes, ["started", "promote", "pause", "abort"], "{s}");

    // restart takes the rollout back to its first step everywhere.
    assert_eq!(act(&b, "restart").await.status(), 200);
    let (s, _) = wait_state(&a, Duration::from_secs(3), |s| s["state"] == "progressing").await;
    assert_eq!(s["canary_percent"], 10.0, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_instance_resumes_where_the_rollout_stands() {
    let Some(redis) = redis_url() else { return };
    let (v1, v2) = (stub::start("v1").await, stub::start("v2").await);
    let prefix = unique_prefix("restart");
    let cfg = config(&redis, &prefix, &v1.url(), &v2.url(), HELD);
    let a = start(&cfg).await;
    assert_eq!(act(&a, "promote").await.status(), 200);
    assert_eq!(act(&a, "promote").await.status(), 200);
    assert_eq!(state(&a).await["canary_percent"], 100.0);
    drop(a);
    // The new instance reads the shared state before its first request: no wait.
    let again = start(&cfg).await;
    let s = state(&again).await;
    assert_eq!(s["step"], 2, "{s}");
    assert_eq!(s["canary_percent"], 100.0, "{s}");
    let before = v2.served();
    for i in 0..5 {
        again
            .chat(KEY, "chat", json!({"user": format!("r{i}")}))
            .await;
    }
    assert_eq!(
        v2.served() - before,
        5,
        "every request goes to the canary at 100 %"
    );

    // A gateway with another canary target in its config runs another rollout, from its first step.
    let v3 = stub::start("v3").await;
    let with_v3 = config(&redis, &prefix, &v1.url(), &v3.url(), HELD).replace("\"v2\"", "\"v3\"");
    let other = start(&with_v3).await;
    assert_eq!(state(&other).await["canary_percent"], 10.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_analysis_counts_every_instance_and_decides_once() {
    let Some(redis) = redis_url() else { return };
    let (v1, v2) = (stub::start("v1").await, stub::start("v2").await);
    let prefix = unique_prefix("analysis");
    // One step at 100 %: every request goes to the canary. It completes after 15 canary
    // requests, which neither instance alone will see.
    let cfg = config(
        &redis,
        &prefix,
        &v1.url(),
        &v2.url(),
        "steps = [100]\nhold_s = 0.2\nmin_requests = 15\ninterval_s = 0.1",
    );
    let a = start(&cfg).await;
    let b = start(&cfg).await;
    for i in 0..10 {
        assert_eq!(
            a.chat(KEY, "chat", json!({"user": format!("a{i}")}))
                .await
                .status(),
            200
        );
    }
    // One instance's 10 requests are not enough, however long it waits.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(state(&a).await["state"], "progressing");
    for i in 0..10 {
        b.chat(KEY, "chat", json!({"user": format!("b{i}")})).await;
    }
    let (s, _) = wait_state(&a, Duration::from_secs(5), |s| s["state"] == "completed").await;
    assert_eq!(s["state"], "completed", "{s}");
    let (s, _) = wait_state(&b, Duration::from_secs(5), |s| s["state"] == "completed").await;
    assert_eq!(s["state"], "completed", "{s}");
    // Both instances analysed the same statistics; exactly one decision was recorded.
    let history = s["history"].as_array().unwrap();
    let completions = history
        .iter()
        .filter(|h| h["change"] == "completed")
        .count();
    assert_eq!(completions, 1, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_redis_loses_the_state_the_instances_put_theirs_back() {
    let Some(redis) = redis_url() else { return };
    let (v1, v2) = (stub::start("v1").await, stub::start("v2").await);
    let prefix = unique_prefix("lost");
    let cfg = config(&redis, &prefix, &v1.url(), &v2.url(), HELD);
    let a = start(&cfg).await;
    let b = start(&cfg).await;
    assert_eq!(act(&a, "promote").await.status(), 200);
    wait_state(&b, Duration::from_secs(3), |s| s["canary_percent"] == 50.0).await;
    // Redis restarts empty: every key of this rollout is gone.
    let client = redis::Client::open(redis.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!keys.is_empty());
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (s, _) = wait_state(&a, Duration::from_secs(3), |s| {
        s["history"].as_array().is_some_and(|h| !h.is_empty())
    })
    .await;
    assert_eq!(s["history"][0]["change"], "restored", "{s}");
    assert_eq!(s["canary_percent"], 50.0);
    // And the restored state is shared again: an action on b reaches a.
    assert_eq!(act(&b, "promote").await.status(), 200);
    let (s, _) = wait_state(&a, Duration::from_secs(3), |s| s["canary_percent"] == 100.0).await;
    assert_eq!(s["canary_percent"], 100.0, "{s}");
}
