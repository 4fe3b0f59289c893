//! Behaviour of [`Rollouts`] as the gateway and an operator see it. Time is passed to `tick`
//! explicitly, so nothing sleeps.

use super::stats::VersionStats;
use super::*;
use std::time::{Duration, Instant};

const ROUTE: &str = "chat";

/// A config with one rollout of `canary` against `stable`; `extra` goes into its table.
fn config_with(canary: &str, extra: &str) -> GatewayConfig {
    let text = format!(
        r#"
[[target]]
name = "v1"
replicas = ["http://127.0.0.1:9001"]
[[target]]
name = "v2"
replicas = ["http://127.0.0.1:9002"]
[[target]]
name = "v3"
replicas = ["http://127.0.0.1:9003"]

[[route]]
model = "{ROUTE}"
[route.rollout]
stable = "v1"
canary = "{canary}"
hold_s = 60
min_requests = 50
interval_s = 10
{extra}
"#
    );
    GatewayConfig::parse(&text, "test").unwrap()
}

fn rollouts() -> Rollouts {
    let r = Rollouts::new();
    r.sync(&config_with("v2", ""));
    r
}

fn ok(ms: u64) -> Outcome {
    Outcome {
        ok: true,
        latency: Duration::from_millis(ms),
        ttft: None,
    }
}

fn failed(ms: u64) -> Outcome {
    Outcome {
        ok: false,
        ..ok(ms)
    }
}

/// `n` requests of `version`, every `1/error_every`-th failing (0 = none fail).
fn traffic(r: &Rollouts, version: &str, n: u64, ms: u64, error_every: u64) {
    for i in 0..n {
        let bad = error_every > 0 && i % error_every == 0;
        r.record(ROUTE, version, if bad { failed(ms) } else { ok(ms) });
    }
}

fn healthy_step(r: &Rollouts) {
    traffic(r, "v1", 200, 100, 100);
    traffic(r, "v2", 60, 100, 100);
}

fn state(r: &Rollouts) -> RolloutState {
    r.status_of(ROUTE).unwrap().state
}

fn secs(t0: Instant, s: u64) -> Instant {
    t0 + Duration::from_secs(s)
}

#[test]
fn unknown_route_has_no_percent() {
    let r = rollouts();
    assert_eq!(r.canary_percent("other"), None);
    assert_eq!(r.canary_percent(ROUTE), Some(5.0));
    assert_eq!(r.pair(ROUTE), Some(("v1".into(), "v2".into())));
}

#[test]
fn healthy_canary_walks_all_steps_and_completes() {
    let r = rollouts();
    let t0 = Instant::now();
    let mut seen = vec![r.canary_percent(ROUTE).unwrap()];
    for i in 1..=4u64 {
        healthy_step(&r);
        let events = r.tick(secs(t0, 61 * i));
        assert_eq!(events.len(), 1, "step {i}: {events:?}");
        seen.push(r.canary_percent(ROUTE).unwrap());
    }
    assert_eq!(seen, vec![5.0, 20.0, 50.0, 100.0, 100.0]);
    assert_eq!(state(&r), RolloutState::Completed);
    assert!(
        r.tick(secs(t0, 1000)).is_empty(),
        "completed rollouts do not change"
    );
}

#[test]
fn hundred_percent_step_compares_with_the_previous_stable_stats() {
    let r = rollouts();
    let t0 = Instant::now();
    for i in 1..=3u64 {
        healthy_step(&r);
        r.tick(secs(t0, 61 * i));
    }
    assert_eq!(r.canary_percent(ROUTE), Some(100.0));
    // stable gets nothing at 100 %; the canary goes bad
    traffic(&r, "v2", 20, 100, 2);
    let events = r.tick(secs(t0, 61 * 3 + 10));
    assert!(
        matches!(&events[..], [RolloutEvent::RolledBack { .. }]),
        "{events:?}"
    );
    assert_eq!(r.canary_percent(ROUTE), Some(0.0));
}

#[test]
fn erroring_canary_is_rolled_back_on_the_first_tick_with_enough_requests() {
    let r = rollouts();
    let t0 = Instant::now();
    traffic(&r, "v1", 200, 100, 0);
    traffic(&r, "v2", 9, 100, 3); // 3 of 9 fail, but 9 < 10 requests
    assert!(r.tick(secs(t0, 10)).is_empty());
    assert_eq!(r.canary_percent(ROUTE), Some(5.0));
    traffic(&r, "v2", 1, 100, 0); // 10 requests, 30 % errors
    let events = r.tick(secs(t0, 20));
    let [RolloutEvent::RolledBack { reason, .. }] = &events[..] else {
        panic!("{events:?}");
    };
    assert!(reason.contains("error rate 30.0 %"), "{reason}");
    assert_eq!(r.canary_percent(ROUTE), Some(0.0));
    let status = r.status_of(ROUTE).unwrap();
    assert_eq!(status.reason.as_deref(), Some(reason.as_str()));
    assert!(matches!(status.state, RolloutState::RolledBack { .. }));
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["state"], "rolled_back");
    assert!(json["reason"].as_str().unwrap().contains("error rate"));
    // stays rolled back: no automatic changes, and manual promotion is refused with a hint
    assert!(r.tick(secs(t0, 1000)).is_empty());
    let err = r.promote(ROUTE).unwrap_err();
    assert!(err.to_string().contains("restart"), "{err}");
}

#[test]
fn stable_needs_enough_samples_before_a_comparison() {
    let r = rollouts();
    let t0 = Instant::now();
    traffic(&r, "v1", 5, 100, 0);
    traffic(&r, "v2", 20, 100, 2);
    assert!(r.tick(secs(t0, 10)).is_empty());
    traffic(&r, "v1", 5, 100, 0);
    assert_eq!(r.tick(secs(t0, 20)).len(), 1);
}

#[test]
fn latency_regression_rolls_back_but_small_differences_do_not() {
    // 30 ms vs 10 ms: 3x, but under the 50 ms slack
    let r = rollouts();
    let t0 = Instant::now();
    traffic(&r, "v1", 100, 10, 0);
    traffic(&r, "v2", 20, 30, 0);
    assert!(r.tick(secs(t0, 10)).is_empty());
    assert_eq!(r.canary_percent(ROUTE), Some(5.0));

    // 400 ms vs 100 ms: over ratio 1.5 and over the slack
    let r = rollouts();
    traffic(&r, "v1", 100, 100, 0);
    traffic(&r, "v2", 20, 400, 0);
    let events = r.tick(secs(t0, 10));
    let [RolloutEvent::RolledBack { reason, .. }] = &events[..] else {
        panic!("{events:?}");
    };
    assert!(reason.contains("p99 latency"), "{reason}");
    assert_eq!(r.canary_percent(ROUTE), Some(0.0));

    // 140 ms vs 100 ms: over the slack? no (40 ms); ratio 1.4 < 1.5 anyway
    let r = rollouts();
    traffic(&r, "v1", 100, 100, 0);
    traffic(&r, "v2", 20, 140, 0);
    assert!(r.tick(secs(t0, 10)).is_empty());
}

#[test]
fn ttft_regression_rolls_back() {
    let r = rollouts();
    let t0 = Instant::now();
    let with_ttft = |ms| Outcome {
        ttft: Some(Duration::from_millis(ms)),
        ..ok(500)
    };
    for _ in 0..50 {
        r.record(ROUTE, "v1", with_ttft(100));
    }
    for _ in 0..10 {
        r.record(ROUTE, "v2", with_ttft(300));
    }
    let events = r.tick(secs(t0, 10));
    let [RolloutEvent::RolledBack { reason, .. }] = &events[..] else {
        panic!("{events:?}");
    };
    assert!(reason.contains("TTFT"), "{reason}");
}

#[test]
fn negative_feedback_rolls_back() {
    let r = rollouts();
    let t0 = Instant::now();
    for i in 0..20 {
        let (s, c) = (format!("s{i}"), format!("c{i}"));
        r.remember_response(&s, ROUTE, "v1");
        r.remember_response(&c, ROUTE, "v2");
        r.record(ROUTE, "v1", ok(100));
        r.record(ROUTE, "v2", ok(100));
        r.feedback(&s, i % 10 != 0).unwrap(); // 10 % negative
        r.feedback(&c, i % 2 != 0).unwrap(); // 50 % negative
    }
    let events = r.tick(secs(t0, 10));
    let [RolloutEvent::RolledBack { reason, .. }] = &events[..] else {
        panic!("{events:?}");
    };
    assert!(reason.contains("negative feedback 50.0 %"), "{reason}");
    assert!(reason.contains("10.0 % on stable"), "{reason}");
}

#[test]
fn feedback_for_an_unknown_id_errors() {
    let r = rollouts();
    let err = r.feedback("nope", false).unwrap_err();
    assert_eq!(err, FeedbackError::UnknownResponse("nope".into()));
    assert!(err.to_string().contains("nope"));
}

#[test]
fn oldest_response_ids_are_forgotten() {
    let r = Rollouts::with_response_capacity(2);
    r.sync(&config_with("v2", ""));
    for id in ["a", "b", "c"] {
        r.remember_response(id, ROUTE, "v2");
    }
    assert!(r.feedback("a", true).is_err());
    assert!(r.feedback("c", true).is_ok());
}

#[test]
fn a_second_feedback_replaces_the_first() {
    let r = rollouts();
    r.remember_response("x", ROUTE, "v2");
    r.feedback("x", false).unwrap();
    r.feedback("x", false).unwrap();
    r.feedback("x", true).unwrap();
    let c = r.status_of(ROUTE).unwrap().canary_stats;
    assert_eq!(c.feedback, 1);
    assert_eq!(c.negative_feedback_rate, 0.0);
}

#[test]
fn feedback_on_routes_without_rollout_or_other_versions_is_accepted_not_counted() {
    let r = rollouts();
    r.remember_response("x", "other-route", "v1");
    r.remember_response("y", ROUTE, "v3");
    assert!(r.feedback("x", false).is_ok());
    assert!(r.feedback("y", false).is_ok());
    let s = r.status_of(ROUTE).unwrap();
    assert_eq!(s.canary_stats.feedback + s.stable_stats.feedback, 0);
    r.record(ROUTE, "v3", failed(1));
    r.record("other-route", "v2", failed(1));
    assert_eq!(r.status_of(ROUTE).unwrap().canary_stats.requests, 0);
}

#[test]
fn promotion_needs_both_hold_time_and_min_requests() {
    let r = rollouts();
    let t0 = Instant::now();
    traffic(&r, "v1", 200, 100, 0);
    traffic(&r, "v2", 49, 100, 0);
    assert!(
        r.tick(secs(t0, 61)).is_empty(),
        "held long enough, 49 < 50 requests"
    );
    traffic(&r, "v2", 1, 100, 0);
    assert_eq!(r.tick(secs(t0, 71)).len(), 1);
    assert_eq!(r.canary_percent(ROUTE), Some(20.0));
    // the new step starts at t0+71 with fresh statistics
    assert_eq!(r.status_of(ROUTE).unwrap().canary_stats.requests, 0);
    traffic(&r, "v1", 200, 100, 0);
    traffic(&r, "v2", 500, 100, 0);
    assert!(
        r.tick(secs(t0, 101)).is_empty(),
        "enough requests, 30 s < 60 s hold"
    );
    assert_eq!(r.tick(secs(t0, 132)).len(), 1);
    assert_eq!(r.canary_percent(ROUTE), Some(50.0));
}

#[test]
fn analysis_runs_at_most_once_per_interval() {
    let r = rollouts();
    let t0 = Instant::now();
    traffic(&r, "v1", 200, 100, 0);
    traffic(&r, "v2", 5, 100, 0);
    assert!(r.tick(secs(t0, 100)).is_empty());
    traffic(&r, "v2", 100, 100, 0);
    assert!(
        r.tick(secs(t0, 101)).is_empty(),
        "1 s after the last analysis, interval 10 s"
    );
    assert_eq!(r.tick(secs(t0, 110)).len(), 1);
}

#[test]
fn pause_stops_automatic_changes_and_resume_continues() {
    let r = rollouts();
    let t0 = Instant::now();
    let paused = r.pause(ROUTE).unwrap();
    assert_eq!(paused.state, RolloutState::Paused);
    traffic(&r, "v1", 200, 100, 0);
    traffic(&r, "v2", 100, 100, 2);
    assert!(r.tick(secs(t0, 100)).is_empty(), "no rollback while paused");
    assert_eq!(r.canary_percent(ROUTE), Some(5.0));
    // manual promotion still works and keeps it paused
    let s = r.promote(ROUTE).unwrap();
    assert_eq!((s.canary_percent, s.state), (20.0, RolloutState::Paused));
    assert_eq!(r.resume(ROUTE).unwrap().state, RolloutState::Progressing);
    traffic(&r, "v1", 200, 100, 0);
    traffic(&r, "v2", 100, 100, 2);
    assert_eq!(r.tick(secs(t0, 200)).len(), 1);
    assert_eq!(r.canary_percent(ROUTE), Some(0.0));
    assert!(r.resume(ROUTE).is_err());
}

#[test]
fn manual_promote_goes_to_the_next_step_and_completes() {
    let r = rollouts();
    for expected in [20.0, 50.0, 100.0] {
        assert_eq!(r.promote(ROUTE).unwrap().canary_percent, expected);
    }
    let s = r.promote(ROUTE).unwrap();
    assert_eq!(
        (s.state, s.canary_percent),
        (RolloutState::Completed, 100.0)
    );
    let err = r.promote(ROUTE).unwrap_err();
    assert!(matches!(err, RolloutError::NotProgressing { .. }));
    assert!(err.to_string().contains("completed"), "{err}");
}

#[test]
fn abort_sets_zero_and_restart_begins_again() {
    let r = rollouts();
    r.promote(ROUTE).unwrap();
    let s = r.abort(ROUTE).unwrap();
    assert_eq!((s.state, s.canary_percent), (RolloutState::Aborted, 0.0));
    assert_eq!(r.canary_percent(ROUTE), Some(0.0));
    assert!(r.abort(ROUTE).is_err());
    assert!(r.pause(ROUTE).is_err());
    let s = r.restart(ROUTE).unwrap();
    assert_eq!(
        (s.state, s.step, s.canary_percent),
        (RolloutState::Progressing, 0, 5.0)
    );
}

#[test]
fn admin_actions_on_unknown_routes_say_what_to_do() {
    let r = rollouts();
    for result in [
        r.promote("x"),
        r.pause("x"),
        r.resume("x"),
        r.abort("x"),
        r.restart("x"),
        r.status_of("x"),
    ] {
        let err = result.unwrap_err();
        assert_eq!(err, RolloutError::UnknownRoute("x".into()));
        assert!(err.to_string().contains("add a `rollout`"));
    }
}

#[test]
fn sync_keeps_state_for_the_same_pair_and_resets_for_a_new_canary() {
    let r = rollouts();
    r.promote(ROUTE).unwrap();
    traffic(&r, "v2", 7, 100, 0);
    // same pair, new thresholds and steps: state kept, config taken
    r.sync(&config_with(
        "v2",
        "steps = [10, 20, 100]\n[route.rollout.thresholds]\nmax_error_rate_increase = 0.5",
    ));
    let s = r.status_of(ROUTE).unwrap();
    assert_eq!((s.step, s.canary_percent), (1, 20.0));
    assert_eq!(s.canary_stats.requests, 7);
    assert_eq!(s.steps, vec![10.0, 20.0, 100.0]);
    // new canary: starts over
    r.sync(&config_with("v3", ""));
    let s = r.status_of(ROUTE).unwrap();
    assert_eq!(
        (s.canary.as_str(), s.step, s.canary_percent),
        ("v3", 0, 5.0)
    );
    assert_eq!(s.canary_stats.requests, 0);
    // rollout removed from the config
    let mut without = config_with("v3", "");
    without.routes[0].rollout = None;
    without.routes[0].target = Some("v1".into());
    r.sync(&without);
    assert_eq!(r.canary_percent(ROUTE), None);
    assert!(r.status().is_empty());
}

#[test]
fn a_rollback_survives_a_reload_of_the_same_pair() {
    let r = rollouts();
    r.abort(ROUTE).unwrap();
    r.sync(&config_with("v2", ""));
    assert_eq!(r.canary_percent(ROUTE), Some(0.0));
}

#[test]
fn fewer_steps_on_reload_clamp_the_current_step() {
    let r = rollouts();
    r.promote(ROUTE).unwrap();
    r.promote(ROUTE).unwrap();
    r.sync(&config_with("v2", "steps = [30]"));
    let s = r.status_of(ROUTE).unwrap();
    assert_eq!((s.step, s.canary_percent), (0, 30.0));
}

#[test]
fn rollback_is_visible_to_another_thread_at_once() {
    let r = Arc::new(rollouts());
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Option<f64>>();
    let reader = {
        let r = Arc::clone(&r);
        std::thread::spawn(move || {
            ready_tx.send(r.canary_percent(ROUTE)).unwrap();
            go_rx.recv().unwrap();
            r.canary_percent(ROUTE)
        })
    };
    assert_eq!(ready_rx.recv().unwrap(), Some(5.0));
    traffic(&r, "v1", 100, 100, 0);
    traffic(&r, "v2", 20, 100, 1);
    assert_eq!(r.tick(Instant::now()).len(), 1);
    go_tx.send(()).unwrap();
    assert_eq!(reader.join().unwrap(), Some(0.0));
}

/// The test config with the rollout's `interval_s` set to `secs`.
fn config_with_interval(secs: f64) -> GatewayConfig {
    let mut config = config_with("v2", "");
    if let Some(rollout) = config.routes[0].rollout.as_mut() {
        rollout.interval_s = secs;
    }
    config
}

#[test]
fn analysis_period_is_the_smallest_interval_within_100ms_and_1s() {
    let r = Rollouts::new();
    assert_eq!(r.analysis_period(), Duration::from_secs(1));
    r.sync(&config_with("v2", ""));
    assert_eq!(r.analysis_period(), Duration::from_secs(1));
    r.sync(&config_with_interval(0.5));
    assert_eq!(r.analysis_period(), Duration::from_millis(500));
    r.sync(&config_with_interval(f64::INFINITY));
    assert_eq!(r.analysis_period(), Duration::from_secs(1));
    r.sync(&config_with_interval(0.01));
    assert_eq!(r.analysis_period(), Duration::from_millis(100));
}

#[tokio::test]
async fn spawned_analysis_rolls_back_a_failing_canary_within_one_interval() {
    let r = Arc::new(Rollouts::new());
    r.sync(&config_with_interval(0.1));
    traffic(&r, "v1", 100, 100, 0);
    traffic(&r, "v2", 20, 100, 1);
    let handle = Arc::clone(&r).spawn_analysis();
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(r.canary_percent(ROUTE), Some(0.0));
    handle.abort();
}

#[test]
fn events_serialise_with_their_kind() {
    let e = RolloutEvent::Completed {
        route: ROUTE.into(),
        canary: "v2".into(),
    };
    assert_eq!(serde_json::to_value(&e).unwrap()["event"], "completed");
    assert!(describe(&e).contains("100 %"));
}

/// An admin or analysis action in the property test.
#[derive(Debug, Clone)]
enum Action {
    Good(u64),
    Bad(u64),
    Tick(u64),
    Promote,
    Pause,
    Resume,
    Abort,
    Restart,
}

fn action() -> impl proptest::strategy::Strategy<Value = Action> {
    use proptest::prelude::*;
    prop_oneof![
        (1u64..80).prop_map(Action::Good),
        (1u64..30).prop_map(Action::Bad),
        (1u64..100).prop_map(Action::Tick),
        Just(Action::Promote),
        Just(Action::Pause),
        Just(Action::Resume),
        Just(Action::Abort),
        Just(Action::Restart),
    ]
}

/// The percent the state says the canary gets.
fn expected_percent(s: &RolloutStatus) -> f64 {
    match s.state {
        RolloutState::Progressing | RolloutState::Paused => s.steps[s.step],
        RolloutState::Completed => 100.0,
        RolloutState::RolledBack { .. } | RolloutState::Aborted => 0.0,
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn percent_always_matches_the_state(actions in proptest::collection::vec(action(), 0..40)) {
        let r = rollouts();
        let mut now = Instant::now();
        for a in actions {
            match a {
                Action::Good(n) => {
                    traffic(&r, "v1", n * 4, 100, 0);
                    traffic(&r, "v2", n, 100, 0);
                }
                Action::Bad(n) => traffic(&r, "v2", n, 100, 1),
                Action::Tick(s) => {
                    now += Duration::from_secs(s);
                    r.tick(now);
                }
                Action::Promote => { let _ = r.promote(ROUTE); }
                Action::Pause => { let _ = r.pause(ROUTE); }
                Action::Resume => { let _ = r.resume(ROUTE); }
                Action::Abort => { let _ = r.abort(ROUTE); }
                Action::Restart => { let _ = r.restart(ROUTE); }
            }
            let s = r.status_of(ROUTE).unwrap();
            proptest::prop_assert_eq!(s.canary_percent, expected_percent(&s));
            proptest::prop_assert_eq!(r.canary_percent(ROUTE), Some(s.canary_percent));
            proptest::prop_assert!(s.step < s.steps.len());
            proptest::prop_assert_eq!(s.reason.is_some(),
                matches!(s.state, RolloutState::RolledBack { .. } | RolloutState::Aborted));
        }
    }
}

// --- Shared mode's building blocks (the Redis round trips are tested in tests/it) ---

fn controller() -> Arc<Controller> {
    rollouts().get(ROUTE).unwrap()
}

#[test]
fn a_decision_tried_on_a_fork_leaves_the_controller_as_it_was() {
    let c = controller();
    let fork = c.fork();
    fork.promote(Instant::now()).unwrap();
    assert_eq!(fork.percent(), 20.0);
    assert_eq!(c.percent(), 5.0, "the fork's change is not applied");
    assert_eq!(c.status(Instant::now()).step, 0);
}

#[test]
fn adopting_a_phase_moves_the_percent_and_starts_a_new_window() {
    let c = controller();
    c.record("v2", &ok(5));
    let fork = c.fork();
    fork.promote(Instant::now()).unwrap();
    let phase = fork.phase(1);
    assert!(
        phase.window > c.local_stats().0,
        "a new step is a new window"
    );
    assert!(c.adopt(&phase, Instant::now()));
    assert_eq!(c.percent(), 20.0);
    assert_eq!(c.epoch(), 1);
    let (window, _, canary) = c.local_stats();
    assert_eq!(window, phase.window);
    assert_eq!(canary.requests, 0, "statistics restart with the step");
    // The same or an older epoch changes nothing.
    assert!(!c.adopt(&phase, Instant::now()));
    let mut old = c.phase(0);
    old.state = "aborted".into();
    assert!(!c.adopt(&old, Instant::now()));
    assert_eq!(c.percent(), 20.0);
}

#[test]
fn a_pause_keeps_the_window_and_its_statistics() {
    let c = controller();
    c.record("v2", &ok(5));
    let fork = c.fork();
    fork.pause(Instant::now()).unwrap();
    assert!(c.adopt(&fork.phase(1), Instant::now()));
    assert_eq!(c.status(Instant::now()).state, RolloutState::Paused);
    assert_eq!(c.local_stats().2.requests, 1);
}

#[test]
fn the_fork_analyses_the_other_instances_statistics_too() {
    let c = controller();
    let start = Instant::now();
    // 30 canary requests here and 30 elsewhere: 60 >= min_requests 50 only together.
    traffic_on(&c, "v2", 30);
    traffic_on(&c, "v1", 30);
    let later = start + Duration::from_secs(61);
    assert!(c.fork().tick(later).is_none(), "30 alone are not enough");
    let (window, _, _) = c.local_stats();
    let mut peers = VersionStats::default();
    for _ in 0..30 {
        peers.record(true, Duration::from_millis(5), None);
    }
    c.set_peer_stats(window, peers.clone(), peers);
    let event = c.fork().tick(later);
    assert!(
        matches!(event, Some(RolloutEvent::Promoted { .. })),
        "{event:?}"
    );
    assert_eq!(
        c.status(later).canary_stats.requests,
        60,
        "status shows every instance"
    );
}

fn traffic_on(c: &Controller, version: &str, n: u64) {
    for _ in 0..n {
        c.record(version, &ok(5));
    }
}

#[test]
fn a_phase_in_an_unknown_state_is_not_adopted() {
    let c = controller();
    let mut phase = c.phase(1);
    phase.state = "canarying".into();
    phase.step = 2;
    assert!(!c.adopt(&phase, Instant::now()));
    assert_eq!(c.percent(), 5.0);
    assert_eq!(c.epoch(), 0);
}
