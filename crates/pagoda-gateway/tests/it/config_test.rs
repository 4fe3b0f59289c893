//! Config validation: what a bad edit gets.

use pagoda_gateway::config::GatewayConfig;

const GOOD: &str = r#"
[[target]]
name = "small"
replicas = ["http://127.0.0.1:9001"]

[[target]]
name = "big"
replicas = ["http://127.0.0.1:9002", "http://127.0.0.1:9003"]

[[route]]
model = "chat"
target = "small"
fallback = ["small"]
[route.split]
by = "user"
weights = { small = 80, big = 20 }
"#;

#[test]
fn a_good_config_parses() {
    let c = GatewayConfig::parse(GOOD, "test").unwrap();
    assert_eq!(c.targets.len(), 2);
    assert_eq!(
        c.route("chat").unwrap().split.as_ref().unwrap().weights["big"],
        20.0
    );
}

#[test]
fn unknown_targets_and_fields_are_named_in_the_error() {
    let bad = GOOD.replace("fallback = [\"small\"]", "fallback = [\"tiny\"]");
    let e = GatewayConfig::parse(&bad, "test").unwrap_err().to_string();
    assert!(e.contains("'tiny' is not a [[target]]"), "{e}");
    let bad = GOOD.replace("name = \"small\"", "name = \"small\"\nreplica = []");
    let e = GatewayConfig::parse(&bad, "test").unwrap_err().to_string();
    assert!(e.contains("unknown field"), "{e}");
    let bad = GOOD.replace("http://127.0.0.1:9001", "127.0.0.1:9001");
    let e = GatewayConfig::parse(&bad, "test").unwrap_err().to_string();
    assert!(e.contains("must be an http"), "{e}");
}

#[test]
fn discovery_needs_a_url_with_a_dns_name_and_a_sane_interval() {
    let with = |discover: &str, extra: &str| {
        GOOD.replace(
            "replicas = [\"http://127.0.0.1:9001\"]",
            &format!("discover = \"{discover}\"\n{extra}"),
        )
    };
    let c = GatewayConfig::parse(&with("http://pods.ns.svc.cluster.local:11435", ""), "t").unwrap();
    let small = c.target("small").unwrap();
    assert!(small.replicas.is_empty());
    assert_eq!(small.discover_interval_ms, 5000);
    for (discover, extra, needle) in [
        ("pods:11435", "", "scheme must be http or https"),
        ("http://pods:11435/v1", "", "no path"),
        (
            "http://pods:11435",
            "discover_interval_ms = 10",
            "at least 100",
        ),
    ] {
        let e = GatewayConfig::parse(&with(discover, extra), "t")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("target 'small'") && e.contains(needle),
            "{discover}: {e}"
        );
    }
    // Neither replicas nor discover nor a canned reply: said how to fix it.
    let e = GatewayConfig::parse(
        &GOOD.replace("replicas = [\"http://127.0.0.1:9001\"]", ""),
        "t",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("discover = "), "{e}");
}

#[test]
fn the_documented_example_config_is_valid() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/gateway.example.toml"
    );
    let c = GatewayConfig::load(std::path::Path::new(path)).unwrap();
    assert_eq!(
        c.route("coder-next")
            .unwrap()
            .rollout
            .as_ref()
            .unwrap()
            .steps,
        [5.0, 20.0, 50.0, 100.0]
    );
    assert_eq!(c.keys[0].limits.rpm, Some(60));
}

#[test]
fn upstream_details_are_private_unless_the_key_turns_them_on() {
    let c = GatewayConfig::parse(GOOD, "test").unwrap();
    assert!(!c.server.expose_upstream_details, "private by default");
    let on = format!("[server]\nexpose_upstream_details = true\n{GOOD}");
    assert!(
        GatewayConfig::parse(&on, "test")
            .unwrap()
            .server
            .expose_upstream_details
    );
    let bad = format!("[server]\nexpose_upstream_details = \"yes\"\n{GOOD}");
    let e = GatewayConfig::parse(&bad, "test").unwrap_err().to_string();
    assert!(
        e.contains("expose_upstream_details") && e.contains("boolean"),
        "{e}"
    );
}

#[test]
fn balance_is_named_and_the_older_affinity_flag_still_means_prefix() {
    use pagoda_gateway::config::Balance;
    let with = |line: &str| {
        GOOD.replace(
            "target = \"small\"\n",
            &format!("target = \"small\"\n{line}\n"),
        )
    };
    let c = GatewayConfig::parse(GOOD, "t").unwrap();
    assert_eq!(c.route("chat").unwrap().balance(), Balance::Prefix);
    for (line, want) in [
        ("balance = \"least_outstanding\"", Balance::LeastOutstanding),
        ("balance = \"prefix\"", Balance::Prefix),
        ("balance = \"round_robin\"", Balance::RoundRobin),
        ("prefix_affinity = true", Balance::Prefix),
    ] {
        let c = GatewayConfig::parse(&with(line), "t").unwrap();
        assert_eq!(c.route("chat").unwrap().balance(), want, "{line}");
    }
    let e = GatewayConfig::parse(&with("balance = \"random\""), "t")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown variant") && e.contains("round_robin"),
        "{e}"
    );
    let e = GatewayConfig::parse(
        &with("balance = \"round_robin\"\nprefix_affinity = true"),
        "t",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("contradicts"), "{e}");
    // The load slack: for prefix routing only (also when prefix is the default), a count.
    for line in [
        "prefix_load_slack = 3",
        "balance = \"prefix\"\nprefix_load_slack = 0",
    ] {
        let c = GatewayConfig::parse(&with(line), "t").unwrap();
        assert!(
            c.route("chat").unwrap().prefix_load_slack.is_some(),
            "{line}"
        );
    }
    let e = GatewayConfig::parse(
        &with("balance = \"least_outstanding\"\nprefix_load_slack = 3"),
        "t",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("prefix_load_slack") && e.contains("balance = \"prefix\""),
        "{e}"
    );
    let e = GatewayConfig::parse(&with("prefix_load_slack = -1"), "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("prefix_load_slack"), "{e}");
}

#[test]
fn max_replays_defaults_to_one_is_set_per_route_and_bounded() {
    use pagoda_gateway::config::MAX_REPLAYS;
    let with = |retry: &str, route: &str| {
        format!(
            "[retry]\n{retry}\n{}",
            GOOD.replace(
                "target = \"small\"\n",
                &format!("target = \"small\"\n{route}\n")
            )
        )
    };
    let replays = |text: &str| {
        let c = GatewayConfig::parse(text, "t").unwrap();
        c.route("chat").unwrap().max_replays(&c.retry)
    };
    assert_eq!(replays(GOOD), 1, "one replay by default");
    assert_eq!(replays(&with("max_replays = 0", "")), 0);
    assert_eq!(replays(&with("max_replays = 0", "max_replays = 2")), 2);
    assert_eq!(
        replays(&with("", &format!("max_replays = {MAX_REPLAYS}"))),
        MAX_REPLAYS
    );

    let over = MAX_REPLAYS + 1;
    let e = GatewayConfig::parse(&with("", &format!("max_replays = {over}")), "t")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "route 'chat': max_replays = {over} is over {MAX_REPLAYS}"
        )),
        "{e}"
    );
    let e = GatewayConfig::parse(&with(&format!("max_replays = {over}"), ""), "t")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("retry.max_replays = {over} is over {MAX_REPLAYS}")),
        "{e}"
    );
    let e = GatewayConfig::parse(&with("", "max_replays = -1"), "t")
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_replays"), "{e}");
}
