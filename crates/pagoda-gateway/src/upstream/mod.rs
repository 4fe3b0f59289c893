//! Upstream replicas: which replica of a target serves a request, and how many at once.
//!
//! Owns, per target, the pool of [`Replica`]s with their load counters, concurrency slots and
//! circuit breakers ([`breaker`]), the replica choice ([`balance`]: least outstanding, round
//! robin, and prefix-aware choice over [`prefix_index`] bounded by load), active health checks
//! ([`health`]), hot reload of the replica set ([`Upstreams::reconcile`]), and replicas found
//! in DNS ([`discovery`], [`Upstreams::set_discovered`]).
//!
//! Invariants:
//! - A replica's state (breaker, health, outstanding count, slots) lives in one `Arc<Replica>`
//!   that a reload keeps as long as the target still lists the replica's URL; a request holds
//!   its replica's `Arc` (through its [`ReplicaPermit`]), so a replica removed by a reload
//!   finishes its in-flight requests normally.
//! - Reads on the request path ([`Upstreams::pool`]) are one lock-free `ArcSwap` load and a map
//!   lookup; reloads and discovery changes build a new map and swap it in.
//! - A target's replicas are its configured `replicas` plus, when it has `discover`, the URLs
//!   last discovered for it; a discovering target has a pool even while it has no replica
//!   (requests then fail over as with every replica down).
//! - [`TargetPool::pick`] only returns replicas that are healthy and whose breaker let the
//!   request through (claiming a half-open probe slot); `None` means none is, and the proxy moves
//!   to the next target of the fallback chain.
//!
//! Connection pooling: the proxy uses one shared `reqwest::Client`; reqwest keeps a separate
//! idle-connection pool per scheme+host+port, i.e. per replica, and the per-replica concurrency
//! cap bounds how many connections each replica's pool opens. Build that client with
//! `pool_max_idle_per_host` at least the largest `max_concurrency` so a busy replica's
//! connections are reused rather than reopened.

pub mod balance;
pub mod breaker;
pub mod discovery;
pub mod hash;
pub mod health;
pub mod prefix_index;
pub mod replica;

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

pub use breaker::{Breaker, BreakerState};
pub use health::spawn_health_checks;
pub use prefix_index::{PrefixBlocks, PrefixIndex};
pub use replica::{QueueTimeout, Replica, ReplicaPermit};

use crate::config::{BreakerConfig, GatewayConfig, TargetConfig};

/// How a request picks among a target's available replicas: a route's `balance`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Pick {
    /// The fewest outstanding requests; equals take turns. The default for picks outside a
    /// route (health checks, discovery); a route's own default is prefix-aware
    /// ([`crate::config::RouteConfig::balance`]).
    #[default]
    LeastOutstanding,
    /// Each available replica in turn.
    RoundRobin,
    /// The replica sent the longest leading part of this prompt lately, within the load bound
    /// (see [`balance::by_prefix`]); least outstanding for a prompt under one block.
    Prefix {
        /// The prompt's block keys.
        blocks: PrefixBlocks,
        /// The route's `prefix_load_slack` (`None`: [`balance::affinity_load_bound`]'s).
        slack: Option<usize>,
    },
}

/// A replica chosen for one attempt.
#[derive(Debug, Clone)]
pub struct Chosen {
    pub replica: Arc<Replica>,
    /// How a prefix-aware choice went (`None` for other policies and prompts under a block).
    pub prefix: Option<PrefixRouted>,
}

/// How a prefix-aware choice went, for `pagoda_gateway_prefix_routes_total` and
/// `pagoda_gateway_prefix_blocks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixRouted {
    pub outcome: balance::PrefixOutcome,
    /// Leading blocks of the prompt the chosen replica was sent lately.
    pub matched_blocks: usize,
    /// The prompt's complete blocks (at most [`prefix_index::MAX_BLOCKS`]).
    pub prompt_blocks: usize,
}

/// The replicas of one target, and how a request gets one of them.
#[derive(Debug)]
pub struct TargetPool {
    /// The target's name.
    pub name: String,
    replicas: Vec<Arc<Replica>>,
    queue_timeout: Duration,
    /// What each replica was sent lately (prefix-aware choice); kept across rebuilds.
    prefixes: Arc<PrefixIndex>,
    /// Round robin's turn (also least outstanding's among equally loaded replicas).
    next: AtomicUsize,
}

impl TargetPool {
    /// A pool of fresh replicas for `target`'s configured `replicas`.
    pub fn new(target: &TargetConfig, breaker: &BreakerConfig) -> Self {
        Self::with_replicas(target, &target.replicas, breaker, &HashMap::new(), None)
    }

    /// A pool for `target` of the replicas at `urls` that reuses the replicas of `keep` (by
    /// URL), updating their cap and breaker thresholds, and creates the rest; `prefixes` is
    /// the old pool's index (what left is forgotten), or a new one.
    fn with_replicas(
        target: &TargetConfig,
        urls: &[String],
        breaker: &BreakerConfig,
        keep: &HashMap<&str, &Arc<Replica>>,
        prefixes: Option<Arc<PrefixIndex>>,
    ) -> Self {
        let mut replicas: Vec<Arc<Replica>> = Vec::with_capacity(urls.len());
        for url in urls {
            if replicas.iter().any(|r| &r.url == url) {
                continue; // a URL listed twice is one replica
            }
            let replica = match keep.get(url.as_str()) {
                Some(old) => {
                    old.set_max_concurrency(target.max_concurrency);
                    old.set_breaker_config(breaker.clone());
                    Arc::clone(old)
                }
                None => Arc::new(Replica::new(
                    &target.name,
                    url,
                    target.max_concurrency,
                    breaker.clone(),
                )),
            };
            replicas.push(replica);
        }
        let prefixes = prefixes.unwrap_or_default();
        prefixes.retain(&replicas.iter().map(|r| r.url.as_str()).collect::<Vec<_>>());
        Self {
            name: target.name.clone(),
            replicas,
            queue_timeout: Duration::from_millis(target.queue_timeout_ms),
            prefixes,
            next: AtomicUsize::new(0),
        }
    }

    /// All replicas, in config order.
    pub fn replicas(&self) -> &[Arc<Replica>] {
        &self.replicas
    }

    /// How long a request may wait for a slot (`queue_timeout_ms`).
    pub fn queue_timeout(&self) -> Duration {
        self.queue_timeout
    }

    /// A replica for a new request, chosen as `pick` says. `None` when no replica is healthy
    /// with a breaker that lets the request through.
    pub fn pick(&self, pick: &Pick) -> Option<Arc<Replica>> {
        self.pick_excluding(pick, &[])
    }

    /// Like [`TargetPool::pick`], for a retry: replicas in `tried` are used only when no other
    /// replica is available (a one-replica target retries on its one replica).
    pub fn pick_excluding(&self, pick: &Pick, tried: &[Arc<Replica>]) -> Option<Arc<Replica>> {
        self.choose(pick, tried).map(|c| c.replica)
    }

    /// [`TargetPool::pick_excluding`], telling also how a prefix-aware choice went (for the
    /// gateway's metrics).
    pub fn choose(&self, pick: &Pick, tried: &[Arc<Replica>]) -> Option<Chosen> {
        let was_tried = |r: &Arc<Replica>| tried.iter().any(|t| Arc::ptr_eq(t, r));
        let available: Vec<&Arc<Replica>> =
            self.replicas.iter().filter(|r| r.is_available()).collect();
        let (fresh, used): (Vec<_>, Vec<_>) = available.into_iter().partition(|r| !was_tried(r));
        let chosen = self
            .choose_and_claim(fresh, pick)
            .or_else(|| self.choose_and_claim(used, pick))?;
        if let Pick::Prefix { blocks, .. } = pick {
            self.prefixes.record(&chosen.replica.url, blocks);
        }
        Some(chosen)
    }

    /// Chooses among `candidates` and claims passage through the chosen one's breaker; a
    /// replica whose breaker refuses (a concurrent picker took the last half-open probe) is
    /// dropped and the choice repeated.
    fn choose_and_claim(&self, mut candidates: Vec<&Arc<Replica>>, pick: &Pick) -> Option<Chosen> {
        while !candidates.is_empty() {
            let (chosen, prefix) = match pick {
                Pick::Prefix { blocks, slack } => {
                    match balance::by_prefix(&candidates, blocks, &self.prefixes, *slack) {
                        Some(c) => (
                            c.replica,
                            Some(PrefixRouted {
                                outcome: c.outcome,
                                matched_blocks: c.matched_blocks,
                                prompt_blocks: blocks.len(),
                            }),
                        ),
                        None => (balance::least_loaded(&candidates, &self.next)?, None),
                    }
                }
                Pick::RoundRobin => (balance::round_robin(&candidates, &self.next)?, None),
                Pick::LeastOutstanding => (balance::least_loaded(&candidates, &self.next)?, None),
            };
            if chosen.try_pass() {
                return Some(Chosen {
                    replica: Arc::clone(chosen),
                    prefix,
                });
            }
            candidates.retain(|r| !Arc::ptr_eq(r, chosen));
        }
        None
    }

    /// Waits up to `timeout` for one of `replica`'s concurrency slots (FIFO); see
    /// [`Replica::acquire`]. The permit counts as outstanding while it waits and while it lives.
    pub async fn acquire(
        &self,
        replica: &Arc<Replica>,
        timeout: Duration,
    ) -> Result<ReplicaPermit, QueueTimeout> {
        replica.acquire(timeout).await
    }
}

/// Every target's pool, by target name; swapped atomically on reload.
#[derive(Debug)]
pub struct Upstreams {
    pools: ArcSwap<HashMap<String, Arc<TargetPool>>>,
    /// The config in force and the URLs discovered per target; the lock also serialises
    /// rebuilds so two never build from the same old map.
    sources: Mutex<Sources>,
}

/// What the pools are built from.
#[derive(Debug)]
struct Sources {
    config: GatewayConfig,
    discovered: HashMap<String, Vec<String>>,
}

impl Upstreams {
    /// Pools for every target of `config` with replicas or `discover` (canned-reply targets
    /// have none).
    pub fn new(config: &GatewayConfig) -> Self {
        let discovered = HashMap::new();
        let pools = build_pools(config, &discovered, &HashMap::new());
        Self {
            pools: ArcSwap::from_pointee(pools),
            sources: Mutex::new(Sources {
                config: config.clone(),
                discovered,
            }),
        }
    }

    fn sources(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The targets that discover replicas in DNS now: (target, `discover`, interval).
    pub fn discovering(&self) -> Vec<(String, String, Duration)> {
        self.sources()
            .config
            .targets
            .iter()
            .filter_map(|t| {
                let d = t.discover.clone()?;
                Some((
                    t.name.clone(),
                    d,
                    Duration::from_millis(t.discover_interval_ms),
                ))
            })
            .collect()
    }

    /// Sets the replicas discovered for `target` (sorted and deduplicated here) and rebuilds
    /// the pools if they changed; replicas that stay keep their state, as on reload. Returns
    /// the URLs that left the target (whose metric series the caller forgets).
    pub fn set_discovered(&self, target: &str, mut urls: Vec<String>) -> Vec<String> {
        urls.sort();
        urls.dedup();
        let mut sources = self.sources();
        let before = sources.discovered.get(target).cloned().unwrap_or_default();
        if before == urls {
            return Vec::new();
        }
        let gone: Vec<String> = before.into_iter().filter(|u| !urls.contains(u)).collect();
        sources.discovered.insert(target.to_string(), urls);
        let old = self.pools.load_full();
        let pools = build_pools(&sources.config, &sources.discovered, &old);
        log_changes(&old, &pools);
        self.pools.store(Arc::new(pools));
        gone
    }

    /// The pool of `target`, if it has replicas.
    pub fn pool(&self, target: &str) -> Option<Arc<TargetPool>> {
        self.pools.load().get(target).cloned()
    }

    /// All pools now (health checks, metrics, admin).
    pub fn pools(&self) -> Vec<Arc<TargetPool>> {
        self.pools.load().values().cloned().collect()
    }

    /// Applies a reloaded config: replicas whose (target, URL) stays keep their state (breaker,
    /// health, outstanding count, permits in flight); new ones start fresh; removed ones are
    /// dropped from the pools, and requests in flight on them finish normally.
    ///
    /// A changed `max_concurrency` is applied to the kept replica in place (no new semaphore):
    /// a larger cap frees slots at once, a smaller one takes effect as in-flight requests end,
    /// and queued requests keep their place. Changed breaker thresholds apply to the current
    /// state; `queue_timeout_ms` applies to requests picked after the reload.
    pub fn reconcile(&self, new: &GatewayConfig) {
        let mut sources = self.sources();
        // Discovered replicas of targets that no longer discover are dropped.
        sources
            .discovered
            .retain(|t, _| new.target(t).is_some_and(|t| t.discover.is_some()));
        sources.config = new.clone();
        let old = self.pools.load_full();
        let pools = build_pools(new, &sources.discovered, &old);
        log_changes(&old, &pools);
        self.pools.store(Arc::new(pools));
    }
}

fn build_pools(
    config: &GatewayConfig,
    discovered: &HashMap<String, Vec<String>>,
    old: &HashMap<String, Arc<TargetPool>>,
) -> HashMap<String, Arc<TargetPool>> {
    config
        .targets
        .iter()
        .filter(|t| !t.replicas.is_empty() || t.discover.is_some())
        .map(|t| {
            let keep: HashMap<&str, &Arc<Replica>> = old
                .get(&t.name)
                .map(|p| p.replicas.iter().map(|r| (r.url.as_str(), r)).collect())
                .unwrap_or_default();
            let mut urls = t.replicas.clone();
            if t.discover.is_some() {
                urls.extend(discovered.get(&t.name).into_iter().flatten().cloned());
            }
            let prefixes = old.get(&t.name).map(|p| Arc::clone(&p.prefixes));
            let pool = TargetPool::with_replicas(t, &urls, &config.breaker, &keep, prefixes);
            (t.name.clone(), Arc::new(pool))
        })
        .collect()
}

fn log_changes(old: &HashMap<String, Arc<TargetPool>>, new: &HashMap<String, Arc<TargetPool>>) {
    let urls = |m: &HashMap<String, Arc<TargetPool>>| -> Vec<(String, String)> {
        m.values()
            .flat_map(|p| p.replicas.iter().map(|r| (p.name.clone(), r.url.clone())))
            .collect()
    };
    let (before, after) = (urls(old), urls(new));
    for (target, url) in after.iter().filter(|x| !before.contains(x)) {
        tracing::info!(%target, %url, "replica added");
    }
    for (target, url) in before.iter().filter(|x| !after.contains(x)) {
        tracing::info!(%target, %url, "replica removed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn target(name: &str, urls: &[&str], cap: usize) -> TargetConfig {
        TargetConfig {
            name: name.into(),
            model: None,
            replicas: urls.iter().map(|u| u.to_string()).collect(),
            canned_reply: None,
            max_concurrency: cap,
            queue_timeout_ms: 50,
            timeout_ms: 0,
            api_key: None,
            discover: None,
            discover_interval_ms: 5000,
        }
    }

    fn config(targets: Vec<TargetConfig>) -> GatewayConfig {
        GatewayConfig {
            targets,
            breaker: BreakerConfig {
                failure_threshold: 2,
                open_ms: 60_000,
                half_open_probes: 1,
            },
            ..GatewayConfig::default()
        }
    }

    const A: &str = "http://a:1";
    const B: &str = "http://b:1";
    const C: &str = "http://c:1";

    proptest::proptest! {
        #[test]
        fn a_prompts_blocks_begin_every_longer_prompts_blocks(s in "\\PC{0,300}", tail in "\\PC{0,100}") {
            let short = PrefixBlocks::of(&s);
            let long = PrefixBlocks::of(&format!("{s}{tail}"));
            proptest::prop_assert_eq!(short.len(), s.chars().count() / prefix_index::BLOCK_CHARS);
            let index = PrefixIndex::default();
            index.record("r", &long);
            proptest::prop_assert_eq!(index.matched("r", &short), short.len());
        }
    }

    #[test]
    fn pools_cover_targets_with_replicas_only() {
        let mut canned = target("canned", &[], 1);
        canned.canned_reply = Some("sorry".into());
        let ups = Upstreams::new(&config(vec![target("t", &[A, B, A], 4), canned]));
        let pool = ups.pool("t").unwrap();
        assert_eq!(pool.replicas().len(), 2, "a duplicate URL is one replica");
        assert_eq!(pool.queue_timeout(), Duration::from_millis(50));
        assert!(ups.pool("canned").is_none());
        assert!(ups.pool("missing").is_none());
    }

    #[tokio::test]
    async fn pick_prefers_the_less_loaded_replica() {
        let ups = Upstreams::new(&config(vec![target("t", &[A, B], 100)]));
        let pool = ups.pool("t").unwrap();
        let a = pool.replicas()[0].clone();
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(pool.acquire(&a, Duration::from_millis(10)).await.unwrap());
        }
        for _ in 0..200 {
            assert_eq!(pool.pick(&Pick::LeastOutstanding).unwrap().url, B);
        }
        drop(held);
        let urls: HashSet<_> = (0..200)
            .map(|_| pool.pick(&Pick::LeastOutstanding).unwrap().url.clone())
            .collect();
        assert_eq!(urls.len(), 2, "an idle pair shares the traffic");
    }

    #[test]
    fn pick_skips_open_and_down_replicas_and_returns_none_when_all_are() {
        let ups = Upstreams::new(&config(vec![target("t", &[A, B], 10)]));
        let pool = ups.pool("t").unwrap();
        let (a, b) = (pool.replicas()[0].clone(), pool.replicas()[1].clone());
        a.record_failure();
        a.record_failure();
        assert_eq!(a.breaker_state(), BreakerState::Open);
        for _ in 0..50 {
            assert_eq!(pool.pick(&Pick::LeastOutstanding).unwrap().url, B);
            assert_eq!(
                pool.pick(&Pick::Prefix {
                    blocks: PrefixBlocks::of(&"p".repeat(64)),
                    slack: None
                })
                .unwrap()
                .url,
                B
            );
        }
        let down = crate::config::HealthConfig {
            unhealthy_after: 1,
            ..Default::default()
        };
        b.observe_health(false, &down);
        assert!(pool.pick(&Pick::LeastOutstanding).is_none());
        assert!(pool
            .pick(&Pick::Prefix {
                blocks: PrefixBlocks::of(&"p".repeat(64)),
                slack: None
            })
            .is_none());
    }

    #[test]
    fn half_open_probe_is_claimed_once() {
        let mut cfg = config(vec![target("t", &[A], 10)]);
        cfg.breaker.open_ms = 0;
        let ups = Upstreams::new(&cfg);
        let pool = ups.pool("t").unwrap();
        let a = pool.replicas()[0].clone();
        a.record_failure();
        a.record_failure();
        assert!(pool.pick(&Pick::LeastOutstanding).is_some(), "the probe");
        a.breaker().set_config(BreakerConfig {
            open_ms: 60_000,
            ..cfg.breaker.clone()
        });
        assert!(
            pool.pick(&Pick::LeastOutstanding).is_none(),
            "one probe at a time"
        );
        a.record_success();
        assert!(pool.pick(&Pick::LeastOutstanding).is_some());
    }

    #[test]
    fn retry_goes_to_another_replica_when_there_is_one() {
        let sticky = Pick::Prefix {
            blocks: PrefixBlocks::of(&"x".repeat(200)),
            slack: None,
        };
        let ups = Upstreams::new(&config(vec![target("t", &[A, B, C], 10)]));
        let pool = ups.pool("t").unwrap();
        for _ in 0..50 {
            let first = pool.pick(&sticky).unwrap();
            let second = pool
                .pick_excluding(&sticky, std::slice::from_ref(&first))
                .unwrap();
            assert!(!Arc::ptr_eq(&first, &second));
            let third = pool
                .pick_excluding(&Pick::LeastOutstanding, &[first.clone(), second.clone()])
                .unwrap();
            assert!(!Arc::ptr_eq(&third, &first) && !Arc::ptr_eq(&third, &second));
        }
        let all = pool.replicas().to_vec();
        assert!(
            pool.pick_excluding(&Pick::LeastOutstanding, &all).is_some(),
            "all tried: reuse one"
        );

        let single = Upstreams::new(&config(vec![target("s", &[A], 10)]));
        let pool = single.pool("s").unwrap();
        let only = pool.pick(&Pick::LeastOutstanding).unwrap();
        assert!(Arc::ptr_eq(
            &pool
                .pick_excluding(&Pick::LeastOutstanding, std::slice::from_ref(&only))
                .unwrap(),
            &only
        ));
    }

    #[tokio::test]
    async fn pool_affinity_is_sticky_and_bounded() {
        let ups = Upstreams::new(&config(vec![target("t", &[A, B, C], 100)]));
        let pool = ups.pool("t").unwrap();
        let hash = Pick::Prefix {
            blocks: PrefixBlocks::of(&"system prompt ".repeat(30)),
            slack: None,
        };
        let preferred = pool.pick(&hash).unwrap();
        for _ in 0..20 {
            assert!(Arc::ptr_eq(&pool.pick(&hash).unwrap(), &preferred));
        }
        let mut held = Vec::new();
        for _ in 0..=balance::AFFINITY_LOAD_SLACK_MIN {
            held.push(
                pool.acquire(&preferred, Duration::from_millis(10))
                    .await
                    .unwrap(),
            );
        }
        assert!(!Arc::ptr_eq(&pool.pick(&hash).unwrap(), &preferred));
        held.clear();
        assert!(Arc::ptr_eq(&pool.pick(&hash).unwrap(), &preferred));
    }

    #[tokio::test]
    async fn reconcile_keeps_state_of_kept_replicas_and_drops_removed_ones() {
        let ups = Upstreams::new(&config(vec![
            target("t", &[A, B], 2),
            target("gone", &[C], 1),
        ]));
        let old_pool = ups.pool("t").unwrap();
        let a = old_pool.replicas()[0].clone();
        let b = old_pool.replicas()[1].clone();
        a.record_failure();
        a.record_failure();
        let in_flight = old_pool
            .acquire(&b, Duration::from_millis(10))
            .await
            .unwrap();

        ups.reconcile(&config(vec![target("t", &[A, C], 3)]));
        let pool = ups.pool("t").unwrap();
        let urls: Vec<_> = pool.replicas().iter().map(|r| r.url.as_str()).collect();
        assert_eq!(urls, [A, C]);
        assert!(
            Arc::ptr_eq(&pool.replicas()[0], &a),
            "the same replica object"
        );
        assert_eq!(pool.replicas()[0].breaker_state(), BreakerState::Open);
        assert_eq!(pool.replicas()[0].max_concurrency(), 3);
        assert_eq!(pool.replicas()[1].breaker_state(), BreakerState::Closed);
        assert!(ups.pool("gone").is_none());

        // The removed replica's request finishes normally.
        assert_eq!(b.outstanding(), 1);
        drop(in_flight);
        assert_eq!(b.outstanding(), 0);
    }

    #[test]
    fn reconcile_applies_new_breaker_thresholds_and_new_targets() {
        let ups = Upstreams::new(&config(vec![target("t", &[A], 2)]));
        let mut next = config(vec![target("t", &[A], 2), target("new", &[B], 1)]);
        next.breaker.failure_threshold = 1;
        ups.reconcile(&next);
        let a = ups.pool("t").unwrap().replicas()[0].clone();
        a.record_failure();
        assert_eq!(a.breaker_state(), BreakerState::Open);
        assert_eq!(ups.pool("new").unwrap().replicas()[0].url, B);
        assert_eq!(ups.pools().len(), 2);
    }
}
