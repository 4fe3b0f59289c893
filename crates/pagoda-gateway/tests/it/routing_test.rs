//! Routing through a real gateway to real (stub) backends: splits, stickiness, rules,
//! fallback, a killed replica, broken streams, canned replies.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;

use crate::harness::{content, key_block, start};
use crate::stub;

const KEY: &str = "pk-routing-test-key";

fn targets(a: &stub::Stub, b: &stub::Stub) -> String {
    format!(
        "[[target]]\nname = \"a\"\nreplicas = [\"{}\"]\n[[target]]\nname = \"b\"\nreplicas = [\"{}\"]\n",
        a.url(),
        b.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percent_split_over_10000_requests_lands_within_a_point() {
    let (a, b) = (stub::start("a").await, stub::start("b").await);
    let config = format!(
        "{}[[route]]\nmodel = \"chat\"\n[route.split]\nby = \"percent\"\nweights = {{ a = 80, b = 20 }}\n{}",
        targets(&a, &b),
        key_block("k", KEY, "")
    );
    let gw = Arc::new(start(&config).await);
    let n = 10_000;
    let mut tasks = Vec::new();
    for w in 0..32 {
        let gw = gw.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for _ in (w..n).step_by(32) {
                let r = gw.chat(KEY, "chat", json!({"temperature": 0.7})).await;
                ok += usize::from(r.status() == 200);
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap();
    }
    assert_eq!(ok, n);
    let share_b = b.served() as f64 / n as f64 * 100.0;
    assert!(
        (share_b - 20.0).abs() <= 1.0,
        "b got {share_b:.2} % of traffic, weight 20 %"
    );
    assert_eq!(a.served() + b.served(), n as u64);
}

#[tokio::test]
async fn user_hash_routing_is_sticky() {
    let (a, b) = (stub::start("a").await, stub::start("b").await);
    let config = format!(
        "{}[[route]]\nmodel = \"chat\"\n[route.split]\nby = \"user\"\nweights = {{ a = 50, b = 50 }}\n{}",
        targets(&a, &b),
        key_block("k", KEY, "")
    );
    let gw = start(&config).await;
    let mut seen: HashMap<String, String> = HashMap::new();
    for round in 0..3 {
        for u in 0..40 {
            let user = format!("user-{u}");
            let text = content(gw.chat(KEY, "chat", json!({"user": user})).await).await;
            let prev = seen.insert(user.clone(), text.clone());
            if round > 0 {
                assert_eq!(prev.as_deref(), Some(text.as_str()), "{user} moved");
            }
        }
    }
    let on_a = seen.values().filter(|t| t.starts_with("from a")).count();
    assert!(
        (8..=32).contains(&on_a),
        "40 users split {on_a}/{}",
        40 - on_a
    );
}

#[tokio::test]
async fn tier_rules_and_version_headers_pick_their_target() {
    let (a, b) = (stub::start("a").await, stub::start("b").await);
    let config = format!(
        "{}[[route]]\nmodel = \"chat\"\ntarget = \"a\"\n[[route.rule]]\ntier = \"premium\"\ntarget = \"b\"\n[[route.rule]]\nheader = {{ name = \"x-pagoda-version\", value = \"b\" }}\ntarget = \"b\"\n{}{}",
        targets(&a, &b),
        key_block("basic", KEY, ""),
        key_block("gold", "pk-gold", "tier = \"premium\"")
    );
    let gw = start(&config).await;
    assert_eq!(
        content(gw.chat(KEY, "chat", json!({})).await).await,
        "from a as a"
    );
    assert_eq!(
        content(gw.chat("pk-gold", "chat", json!({})).await).await,
        "from b as b"
    );
    let r = gw
        .client
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth(KEY)
        .header("x-pagoda-version", "b")
        .json(&json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-pagoda-target"], "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_replica_mid_load_loses_no_request() {
    let (r1, mut r2, small) = (
        stub::start("r1").await,
        stub::start("r2").await,
        stub::start("small").await,
    );
    let config = format!(
        "[health]\ninterval_ms = 200\n[[target]]\nname = \"big\"\nreplicas = [\"{}\", \"{}\"]\n[[target]]\nname = \"small\"\nreplicas = [\"{}\"]\n[[route]]\nmodel = \"chat\"\ntarget = \"big\"\nfallback = [\"small\"]\n{}",
        r1.url(),
        r2.url(),
        small.url(),
        key_block("k", KEY, "")
    );
    let gw = Arc::new(start(&config).await);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let gw = gw.clone();
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..60 {
                statuses.push(gw.chat(KEY, "chat", json!({})).await.status().as_u16());
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            statuses
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    r2.kill();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert_eq!(all.len(), 480);
    assert!(
        all.iter().all(|s| *s == 200),
        "lost requests: {:?}",
        all.iter().filter(|s| **s != 200).count()
    );
    assert!(r1.served() > 0);
}

#[tokio::test]
async fn errors_fall_back_along_the_chain_to_the_canned_reply() {
    let (a, b) = (stub::start("a").await, stub::start("b").await);
    let config = format!(
        "{}[[target]]\nname = \"sorry\"\ncanned_reply = \"We are busy; please try again.\"\n[[route]]\nmodel = \"chat\"\ntarget = \"a\"\nfallback = [\"b\", \"sorry\"]\n{}",
        targets(&a, &b),
        key_block("k", KEY, "")
    );
    let gw = start(&config).await;
    a.fail_with(500);
    let r = gw.chat(KEY, "chat", json!({})).await;
    assert_eq!(r.headers()["x-pagoda-fallback"], "true");
    assert_eq!(content(r).await, "from b as b");
    b.fail_with(429);
    assert_eq!(
        content(gw.chat(KEY, "chat", json!({})).await).await,
        "We are busy; please try again."
    );
    // A client error is the client's: passed through, no fallback.
    a.fail_with(400);
    let r = gw.chat(KEY, "chat", json!({})).await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn with_no_fallback_an_outage_is_a_clear_503() {
    let a = stub::start("a").await;
    let config = format!(
        "[[target]]\nname = \"a\"\nreplicas = [\"{}\"]\n[[route]]\nmodel = \"chat\"\ntarget = \"a\"\n{}",
        a.url(),
        key_block("k", KEY, "")
    );
    let gw = start(&config).await;
    a.fail_with(503);
    let r = gw.chat(KEY, "chat", json!({})).await;
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_unavailable");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("route `chat`: no healthy replica answered; retry later (request id "),
        "{v}"
    );
}

#[tokio::test]
async fn streams_relay_and_a_cut_stream_ends_with_an_error_event() {
    let a = stub::start("a").await;
    let config = format!(
        "[[target]]\nname = \"a\"\nreplicas = [\"{}\"]\n[[route]]\nmodel = \"chat\"\ntarget = \"a\"\n{}",
        a.url(),
        key_block("k", KEY, "")
    );
    let gw = start(&config).await;
    let text = gw
        .chat(KEY, "chat", json!({"stream": true}))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("from ") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    assert!(
        !text.contains("\"usage\""),
        "usage chunk shown to a client that did not ask: {text}"
    );
    let text = gw
        .chat(
            KEY,
            "chat",
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        )
        .await
        .text()
        .await
        .unwrap();
    assert!(text.contains("\"usage\""), "{text}");

    a.behaviour
        .cut_streams
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let text = gw
        .chat(KEY, "chat", json!({"stream": true}))
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        !text.contains("[DONE]"),
        "a cut stream must not end cleanly: {text}"
    );
    assert!(text.contains("stream_broken"), "{text}");
}

#[tokio::test]
async fn a_target_found_in_dns_serves_through_the_discovered_replica() {
    // getaddrinfo answers an address literal itself: the discovery path (config → lookup →
    // pool → request) without a DNS server. Name resolution is covered by the unit tests.
    let a = stub::start("a").await;
    let port = a.url().rsplit(':').next().unwrap().to_string();
    let config = format!(
        "[[target]]\nname = \"a\"\ndiscover = \"http://127.0.0.1:{port}\"\ndiscover_interval_ms = 100\n[[route]]\nmodel = \"chat\"\ntarget = \"a\"\n{}",
        key_block("k", KEY, "")
    );
    let gw = start(&config).await;
    let mut found = false;
    for _ in 0..50 {
        let pool = gw
            .gateway
            .upstreams
            .pool("a")
            .expect("a discovering target has a pool");
        if pool.replicas().iter().any(|r| r.url == a.url()) {
            found = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(found, "the replica was discovered");
    assert_eq!(
        content(gw.chat(KEY, "chat", json!({})).await).await,
        "from a as a"
    );
    assert_eq!(a.served(), 1);
}

fn three_replicas(a: &stub::Stub, b: &stub::Stub, c: &stub::Stub, balance: &str) -> String {
    format!(
        "[[target]]\nname = \"t\"\nreplicas = [\"{}\", \"{}\", \"{}\"]\n[[route]]\nmodel = \"chat\"\ntarget = \"t\"\nbalance = \"{balance}\"\n{}",
        a.url(),
        b.url(),
        c.url(),
        key_block("k", KEY, "")
    )
}

#[tokio::test]
async fn prefix_balance_keeps_a_conversation_on_one_replica_and_spreads_others() {
    let (a, b, c) = (
        stub::start("a").await,
        stub::start("b").await,
        stub::start("c").await,
    );
    let gw = start(&three_replicas(&a, &b, &c, "prefix")).await;
    let served = || [a.served(), b.served(), c.served()];
    // Eight conversations, each with its own long system prompt and three turns: every turn
    // of a conversation lands where its first turn did.
    let mut homes = Vec::new();
    for conv in 0..8 {
        let system = format!("You are assistant number {conv}. ").repeat(12);
        let mut messages = vec![json!({"role": "system", "content": system})];
        let mut home = None;
        for turn in 0..3 {
            messages.push(json!({"role": "user", "content": format!("question {turn}")}));
            let before = served();
            let r = gw.chat(KEY, "chat", json!({"messages": messages})).await;
            assert_eq!(r.status(), 200);
            let after = served();
            let went = (0..3).find(|&i| after[i] > before[i]).unwrap();
            assert_eq!(
                *home.get_or_insert(went),
                went,
                "conversation {conv} turn {turn}"
            );
            messages.push(json!({"role": "assistant", "content": "answer"}));
        }
        homes.push(home.unwrap());
    }
    // Different prompts do not all pile onto one replica.
    let used: std::collections::HashSet<_> = homes.iter().collect();
    assert!(used.len() >= 2, "{homes:?}");
    // The metrics tell how the choices went: each first turn unmatched, each later turn to
    // its longest match, none spilled (one request at a time).
    let metrics = gw.metrics().await;
    let sample = |name: &str, label: &str| -> f64 {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!("{name}{{"))
                    && l.contains(label)
                    && l.contains("target=\"t\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let routes = "pagoda_gateway_prefix_routes_total";
    assert_eq!(sample(routes, "outcome=\"unmatched\""), 8.0, "{metrics}");
    assert_eq!(sample(routes, "outcome=\"longest\""), 16.0, "{metrics}");
    assert_eq!(sample(routes, "outcome=\"spilled\""), 0.0, "{metrics}");
    let blocks = "pagoda_gateway_prefix_blocks_total";
    let (matched, prompt) = (
        sample(blocks, "kind=\"matched\""),
        sample(blocks, "kind=\"prompt\""),
    );
    assert!(
        matched > 0.0 && matched < prompt,
        "matched {matched} of {prompt}"
    );
}

#[tokio::test]
async fn round_robin_balance_takes_turns() {
    let (a, b, c) = (
        stub::start("a").await,
        stub::start("b").await,
        stub::start("c").await,
    );
    let gw = start(&three_replicas(&a, &b, &c, "round_robin")).await;
    for _ in 0..9 {
        assert_eq!(gw.chat(KEY, "chat", json!({})).await.status(), 200);
    }
    assert_eq!([a.served(), b.served(), c.served()], [3, 3, 3]);
}

#[tokio::test]
async fn a_discovered_replica_that_leaves_on_reload_leaves_the_metrics() {
    let (a, b) = (stub::start("a").await, stub::start("b").await);
    let b_port = b.url().rsplit(':').next().unwrap().to_string();
    let config = |discover: bool| {
        format!(
            "[[target]]\nname = \"t\"\nreplicas = [\"{}\"]\n{}[[route]]\nmodel = \"chat\"\ntarget = \"t\"\n{}",
            a.url(),
            if discover {
                format!("discover = \"http://127.0.0.1:{b_port}\"\ndiscover_interval_ms = 100\n")
            } else {
                String::new()
            },
            key_block("k", KEY, "")
        )
    };
    let gw = start(&config(true)).await;
    let series = |url: &str| format!("pagoda_gateway_replica_outstanding{{replica=\"{url}\"");
    let mut text = String::new();
    for _ in 0..50 {
        gw.gateway.refresh_gauges();
        text = gw.gateway.metrics.render();
        if text.contains(&series(&b.url())) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        text.contains(&series(&a.url())) && text.contains(&series(&b.url())),
        "{text}"
    );
    let static_only = pagoda_gateway::config::GatewayConfig::parse(&config(false), "test").unwrap();
    gw.gateway.apply(static_only);
    gw.gateway.refresh_gauges();
    let text = gw.gateway.metrics.render();
    assert!(text.contains(&series(&a.url())), "{text}");
    assert!(
        !text.contains(&series(&b.url())),
        "the discovered replica's series stayed: {text}"
    );
}
