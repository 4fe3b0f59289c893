//! Route selection: which target (model version) serves a request for a client-facing model.
//!
//! Order of precedence, as an operator reads the config: the route's rules first (tier, group,
//! header; the first rule whose conditions all hold wins), then a canary rollout (stable vs
//! canary at the rollout's current percent), then a weighted split, then the route's `target`.
//! The answer is a [`Decision`]: the chosen target followed by the route's fallback chain,
//! without repeats.
//!
//! Invariants: user-hash assignment is a pure function of (route, user id), the same in every
//! gateway instance and across restarts, and monotone in the canary percent (a user who sees
//! the canary at 5 % still sees it at 20 %); percent assignment uses a fresh uniform draw.

use axum::http::HeaderMap;

use crate::config::{RouteConfig, RuleConfig, SplitBy, SplitConfig};

/// What the router knows about a request.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    pub tier: Option<&'a str>,
    pub group: Option<&'a str>,
    pub headers: &'a HeaderMap,
    /// The user id for sticky splits: the request's `user` field, the `x-pagoda-user` header,
    /// else the API key's id.
    pub user: &'a str,
    /// A uniform draw in [0, 1) for percent splits (the caller's RNG, so tests can fix it).
    pub draw: f64,
}

/// Why a target was chosen (logged, and a label on metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Rule(usize),
    Stable,
    Canary,
    Split,
    Default,
}

/// The chosen target and what to try after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The chosen target first, then the fallbacks, each once.
    pub chain: Vec<String>,
    pub reason: Reason,
}

impl Decision {
    pub fn target(&self) -> &str {
        &self.chain[0]
    }
}

/// Picks the target for one request. `canary_percent` is the rollout's current canary share
/// (0..=100) when the route has a rollout.
pub fn choose(
    route: &RouteConfig,
    req: &RouteRequest<'_>,
    canary_percent: Option<f64>,
) -> Decision {
    let (first, reason) = pick_first(route, req, canary_percent);
    let mut chain = vec![first];
    for f in &route.fallback {
        if !chain.contains(f) {
            chain.push(f.clone());
        }
    }
    Decision { chain, reason }
}

fn pick_first(
    route: &RouteConfig,
    req: &RouteRequest<'_>,
    canary_percent: Option<f64>,
) -> (String, Reason) {
    if let Some(i) = route.rules.iter().position(|r| rule_matches(r, req)) {
        return (route.rules[i].target.clone(), Reason::Rule(i));
    }
    if let Some(rollout) = &route.rollout {
        let percent = canary_percent.unwrap_or(0.0).clamp(0.0, 100.0);
        let u = unit_for(rollout.by, &route.model, req);
        return if u * 100.0 < percent {
            (rollout.canary.clone(), Reason::Canary)
        } else {
            (rollout.stable.clone(), Reason::Stable)
        };
    }
    if let Some(split) = &route.split {
        if let Some(t) = split_target(split, &route.model, req) {
            return (t, Reason::Split);
        }
    }
    // validate() guarantees one of target/split/rollout; a split with all-zero weights is refused.
    let fallback = route
        .target
        .clone()
        .or_else(|| {
            route
                .split
                .as_ref()
                .and_then(|s| s.weights.keys().next().cloned())
        })
        .unwrap_or_default();
    (fallback, Reason::Default)
}

fn rule_matches(rule: &RuleConfig, req: &RouteRequest<'_>) -> bool {
    let tier_ok = rule.tier.as_deref().is_none_or(|t| req.tier == Some(t));
    let group_ok = rule.group.as_deref().is_none_or(|g| req.group == Some(g));
    let header_ok = rule.header.as_ref().is_none_or(|h| {
        req.headers
            .get(h.name.as_str())
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == h.value)
    });
    tier_ok && group_ok && header_ok
}

fn split_target(split: &SplitConfig, route: &str, req: &RouteRequest<'_>) -> Option<String> {
    let total: f64 = split.weights.values().sum();
    if total <= 0.0 {
        return None;
    }
    let point = unit_for(split.by, route, req) * total;
    let mut acc = 0.0;
    let mut last = None;
    for (target, w) in &split.weights {
        if *w <= 0.0 {
            continue;
        }
        acc += w;
        last = Some(target);
        if point < acc {
            return Some(target.clone());
        }
    }
    last.cloned()
}

fn unit_for(by: SplitBy, route: &str, req: &RouteRequest<'_>) -> f64 {
    match by {
        SplitBy::Percent => req.draw.clamp(0.0, 1.0 - f64::EPSILON),
        SplitBy::User => user_unit(route, req.user),
    }
}

/// Draws for percent splits: a golden-ratio (Weyl) sequence per route instead of independent
/// random numbers, so that over any n requests each side's share is within O(1/n) of its
/// weight (independent draws wander by O(1/sqrt n): ±0.4 points at 10,000 requests for a 20 %
/// side). Each gateway instance starts at a random offset. Routes share one of
/// [`DRAW_SLOTS`] counters by hash; a collision only makes their draws less even.
pub struct SplitDraws {
    offset: f64,
    counters: [std::sync::atomic::AtomicU64; DRAW_SLOTS],
}

pub const DRAW_SLOTS: usize = 64;

impl Default for SplitDraws {
    fn default() -> Self {
        Self::new(rand::random::<f64>())
    }
}

impl SplitDraws {
    pub fn new(offset: f64) -> Self {
        Self {
            offset,
            counters: std::array::from_fn(|_| std::sync::atomic::AtomicU64::new(0)),
        }
    }

    /// The next draw in [0, 1) for `route`.
    pub fn next(&self, route: &str) -> f64 {
        let slot = (user_unit(route, "") * DRAW_SLOTS as f64) as usize % DRAW_SLOTS;
        let n = self.counters[slot].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        const INV_PHI: f64 = 0.618_033_988_749_894_9;
        (self.offset + n as f64 * INV_PHI).fract()
    }
}

/// A stable point in [0, 1) for (route, user): FNV-1a over both, then a 64-bit finaliser so
/// that similar ids spread evenly.
pub fn user_unit(route: &str, user: &str) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in route.bytes().chain([0xff]).chain(user.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    (h >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GatewayConfig;

    fn config() -> GatewayConfig {
        GatewayConfig::parse(
            r#"
[[target]]
name = "full"
replicas = ["http://127.0.0.1:1"]
[[target]]
name = "quant"
replicas = ["http://127.0.0.1:2"]
[[target]]
name = "v2"
replicas = ["http://127.0.0.1:3"]
[[target]]
name = "sorry"
canned_reply = "busy"

[[route]]
model = "chat"
fallback = ["quant", "sorry"]
[[route.rule]]
tier = "premium"
target = "full"
[[route.rule]]
header = { name = "x-pagoda-version", value = "v2" }
target = "v2"
[route.split]
by = "percent"
weights = { full = 25, quant = 75 }

[[route]]
model = "sticky"
[route.split]
by = "user"
weights = { full = 50, quant = 50 }

[[route]]
model = "canary"
[route.rollout]
stable = "full"
canary = "v2"
by = "user"
"#,
            "test",
        )
        .unwrap()
    }

    fn req<'a>(
        headers: &'a HeaderMap,
        tier: Option<&'a str>,
        user: &'a str,
        draw: f64,
    ) -> RouteRequest<'a> {
        RouteRequest {
            tier,
            group: None,
            headers,
            user,
            draw,
        }
    }

    #[test]
    fn rules_win_in_order_and_fallbacks_follow_without_repeats() {
        let c = config();
        let route = c.route("chat").unwrap();
        let h = HeaderMap::new();
        let d = choose(route, &req(&h, Some("premium"), "u", 0.9), None);
        assert_eq!(d.chain, ["full", "quant", "sorry"]);
        assert_eq!(d.reason, Reason::Rule(0));
        let mut h = HeaderMap::new();
        h.insert("x-pagoda-version", "v2".parse().unwrap());
        let d = choose(route, &req(&h, None, "u", 0.9), None);
        assert_eq!(d.target(), "v2");
        // The split target "quant" is also the first fallback: it appears once.
        let h = HeaderMap::new();
        let d = choose(route, &req(&h, None, "u", 0.9), None);
        assert_eq!(d.chain, ["quant", "sorry"]);
        let d = choose(route, &req(&h, None, "u", 0.1), None);
        assert_eq!(d.chain, ["full", "quant", "sorry"]);
    }

    #[test]
    fn a_percent_split_follows_its_weights() {
        let c = config();
        let route = c.route("chat").unwrap();
        let h = HeaderMap::new();
        let n = 10_000;
        let full = (0..n)
            .filter(|i| {
                choose(
                    route,
                    &req(&h, None, "u", (*i as f64 + 0.5) / n as f64),
                    None,
                )
                .target()
                    == "full"
            })
            .count();
        assert_eq!(full, 2500);
    }

    #[test]
    fn user_splits_are_sticky_and_balanced() {
        let c = config();
        let route = c.route("sticky").unwrap();
        let h = HeaderMap::new();
        let mut full = 0;
        for i in 0..10_000 {
            let user = format!("user-{i}");
            let a = choose(route, &req(&h, None, &user, 0.0), None);
            let b = choose(route, &req(&h, None, &user, 0.99), None);
            assert_eq!(
                a.target(),
                b.target(),
                "the draw must not matter for a user split"
            );
            full += usize::from(a.target() == "full");
        }
        assert!((4800..=5200).contains(&full), "{full}");
    }

    #[test]
    fn canary_users_stay_in_the_canary_as_the_percent_grows() {
        let c = config();
        let route = c.route("canary").unwrap();
        let h = HeaderMap::new();
        for i in 0..2000 {
            let user = format!("u{i}");
            let mut was_canary = false;
            for percent in [0.0, 5.0, 20.0, 50.0, 100.0] {
                let d = choose(route, &req(&h, None, &user, 0.5), Some(percent));
                let is_canary = d.target() == "v2";
                assert!(
                    !was_canary || is_canary,
                    "user {user} left the canary at {percent}%"
                );
                if percent == 0.0 {
                    assert!(!is_canary);
                }
                if percent == 100.0 {
                    assert!(is_canary);
                }
                was_canary = is_canary;
            }
        }
    }

    #[test]
    fn split_draws_keep_shares_within_a_tenth_of_a_point() {
        let draws = SplitDraws::new(0.37);
        let n = 10_000;
        let low = (0..n).filter(|_| draws.next("chat") < 0.2).count();
        assert!((1990..=2010).contains(&low), "{low}");
    }

    proptest::proptest! {
        #[test]
        fn user_unit_is_in_range(route in ".{0,20}", user in ".{0,40}") {
            let u = user_unit(&route, &user);
            proptest::prop_assert!((0.0..1.0).contains(&u));
        }
    }
}
