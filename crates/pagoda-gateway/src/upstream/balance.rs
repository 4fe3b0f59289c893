//! Replica choice: least outstanding requests, round robin, and prefix-aware choice bounded by
//! load.
//!
//! Owns the pure selection over a list of candidate replicas (already filtered to available
//! ones); claiming breaker probes and retry exclusion live in `TargetPool`. Invariants: a choice
//! is always one of the candidates, and an empty list gives `None`.
//!
//! Least outstanding ([`least_loaded`]) scans every candidate (the gateway's own counts are
//! exact and a pool is tens of replicas, so the scan is cheap and power of two choices'
//! sampling would only add imbalance: measured, it trailed round robin at concurrency 6 over 3
//! replicas) and breaks ties by the pool's rotating counter, so equally loaded replicas take
//! turns as in round robin.
//!
//! Prefix-aware choice ([`by_prefix`]) asks the target's [`PrefixIndex`] how many leading
//! blocks of the prompt each candidate was sent lately and, among the candidates no busier
//! than the least loaded one plus [`affinity_load_bound`]'s slack, takes the longest match
//! (equal matches: the less loaded). A prompt no such candidate holds any of gains nothing
//! from affinity, so it goes to the least loaded candidate, ties broken by rendezvous
//! (highest-random-weight) hashing of its first block with each replica URL: idle pools send a
//! new system prompt to the same replica from every gateway instance, and a replica that goes
//! away or comes back moves only its own prompts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::hash::mix64;
use super::prefix_index::{PrefixBlocks, PrefixIndex};
use super::replica::Replica;

/// The preferred replica may carry at least this many more outstanding requests than the least
/// loaded one before affinity gives way to load. A cache hit on a long shared prefix saves more
/// than a few requests' wait: measured on three CPU replicas at concurrency 6 (docs/
/// benchmarks.md, prefix-aware routing), a slack of 3 cut round robin's mean TTFT ×2.2 and 16
/// ×2.9; 8 held as much in cache as 16 and kept the replicas' request counts even. SGLang's and
/// vLLM's routers give way only past 64 more and 1.5 times as many.
pub const AFFINITY_LOAD_SLACK_MIN: usize = 8;

/// ... or `least / AFFINITY_LOAD_SLACK_DIV` more (50 %), when that is larger: under heavy load
/// the bound is relative.
pub const AFFINITY_LOAD_SLACK_DIV: usize = 2;

/// The most outstanding requests an affinity choice may have, given the least loaded candidate
/// and the route's `prefix_load_slack` (`None`: `max(8, 50 %)` of `least`).
pub fn affinity_load_bound(least: usize, slack: Option<usize>) -> usize {
    least.saturating_add(
        slack.unwrap_or_else(|| AFFINITY_LOAD_SLACK_MIN.max(least / AFFINITY_LOAD_SLACK_DIV)),
    )
}

/// Least outstanding: the candidate with the fewest outstanding requests; among equals, the
/// first at or after the rotating counter `next` (so equals take turns).
pub fn least_loaded<'a>(
    candidates: &[&'a Arc<Replica>],
    next: &AtomicUsize,
) -> Option<&'a Arc<Replica>> {
    let n = candidates.len();
    if n == 0 {
        return None;
    }
    let start = next.fetch_add(1, Ordering::Relaxed) % n;
    (0..n)
        .map(|i| candidates[(start + i) % n])
        .min_by_key(|r| r.outstanding())
}

/// Rendezvous score of a replica for a prefix (higher wins).
pub fn rendezvous_score(prefix_hash: u64, replica: &Replica) -> u64 {
    mix64(prefix_hash ^ mix64(replica.url_hash))
}

/// The choice for a prompt nobody holds: the least loaded candidate, ties broken by the
/// highest rendezvous score of `prefix_hash` (then by URL, so the order is total).
pub fn by_rendezvous<'a>(
    candidates: &[&'a Arc<Replica>],
    prefix_hash: u64,
) -> Option<&'a Arc<Replica>> {
    candidates.iter().copied().min_by(|a, b| {
        a.outstanding()
            .cmp(&b.outstanding())
            .then_with(|| rendezvous_score(prefix_hash, b).cmp(&rendezvous_score(prefix_hash, a)))
            .then_with(|| a.url.cmp(&b.url))
    })
}

/// Round robin: the candidates in turn, by a counter shared by the target's requests.
pub fn round_robin<'a>(
    candidates: &[&'a Arc<Replica>],
    next: &AtomicUsize,
) -> Option<&'a Arc<Replica>> {
    if candidates.is_empty() {
        return None;
    }
    Some(candidates[next.fetch_add(1, Ordering::Relaxed) % candidates.len()])
}

/// How a prefix-aware choice went: the `outcome` of `pagoda_gateway_prefix_routes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixOutcome {
    /// Sent where the longest run of its blocks went lately.
    Longest,
    /// The replica holding the longest run was past the load bound: sent elsewhere (to a
    /// shorter match, or by load).
    Spilled,
    /// No replica was sent any of its blocks lately: sent by load.
    Unmatched,
}

impl PrefixOutcome {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            PrefixOutcome::Longest => "longest",
            PrefixOutcome::Spilled => "spilled",
            PrefixOutcome::Unmatched => "unmatched",
        }
    }
}

/// A prefix-aware choice and what it expects the replica's cache to hold.
#[derive(Debug, Clone, Copy)]
pub struct PrefixChoice<'a> {
    pub replica: &'a Arc<Replica>,
    pub outcome: PrefixOutcome,
    /// Leading blocks of the prompt the chosen replica was sent lately.
    pub matched_blocks: usize,
}

/// The prefix-aware choice for `blocks` (see the module docs); `None` for a prompt without a
/// complete block or no candidate (the caller then balances on load alone).
pub fn by_prefix<'a>(
    candidates: &[&'a Arc<Replica>],
    blocks: &PrefixBlocks,
    index: &PrefixIndex,
    slack: Option<usize>,
) -> Option<PrefixChoice<'a>> {
    let first = blocks.first()?;
    let least = candidates.iter().map(|r| r.outstanding()).min()?;
    let bound = affinity_load_bound(least, slack);
    let scored: Vec<(usize, &'a Arc<Replica>)> = candidates
        .iter()
        .map(|r| (index.matched(&r.url, blocks), *r))
        .collect();
    let longest = scored.iter().map(|(m, _)| *m).max().unwrap_or(0);
    let best = scored
        .iter()
        .filter(|(_, r)| r.outstanding() <= bound)
        .max_by(|(ma, a), (mb, b)| {
            ma.cmp(mb)
                .then(b.outstanding().cmp(&a.outstanding()))
                .then(rendezvous_score(first, a).cmp(&rendezvous_score(first, b)))
        });
    let (replica, matched_blocks) = match best {
        Some(&(held, r)) if held > 0 => (r, held),
        _ => {
            let r = by_rendezvous(candidates, first)?;
            (r, index.matched(&r.url, blocks))
        }
    };
    let outcome = if longest == 0 {
        PrefixOutcome::Unmatched
    } else if matched_blocks == longest {
        PrefixOutcome::Longest
    } else {
        PrefixOutcome::Spilled
    };
    Some(PrefixChoice {
        replica,
        outcome,
        matched_blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BreakerConfig;
    use std::collections::HashMap;
    use std::time::Duration;

    fn replicas(n: usize) -> Vec<Arc<Replica>> {
        (0..n)
            .map(|i| {
                Arc::new(Replica::new(
                    "t",
                    &format!("http://10.0.0.{i}:8000"),
                    1000,
                    BreakerConfig::default(),
                ))
            })
            .collect()
    }

    async fn load(r: &Arc<Replica>, n: usize) -> Vec<super::super::ReplicaPermit> {
        let mut held = Vec::new();
        for _ in 0..n {
            held.push(r.acquire(Duration::from_millis(10)).await.unwrap());
        }
        held
    }

    #[test]
    fn bound_is_eight_or_a_half() {
        assert_eq!(affinity_load_bound(0, None), 8);
        assert_eq!(affinity_load_bound(3, None), 11);
        assert_eq!(affinity_load_bound(16, None), 24);
        assert_eq!(affinity_load_bound(100, None), 150);
        assert_eq!(affinity_load_bound(usize::MAX, None), usize::MAX);
        assert_eq!(affinity_load_bound(3, Some(0)), 3);
        assert_eq!(affinity_load_bound(100, Some(8)), 108);
        assert_eq!(affinity_load_bound(usize::MAX, Some(8)), usize::MAX);
    }

    #[test]
    fn empty_and_single_candidate() {
        let next = AtomicUsize::new(0);
        assert!(least_loaded(&[], &next).is_none());
        assert!(by_rendezvous(&[], 7).is_none());
        let rs = replicas(1);
        let c: Vec<_> = rs.iter().collect();
        assert_eq!(least_loaded(&c, &next).unwrap().url, rs[0].url);
        assert_eq!(by_rendezvous(&c, 7).unwrap().url, rs[0].url);
    }

    #[tokio::test]
    async fn least_loaded_takes_the_fewest_outstanding_and_rotates_among_equals() {
        let rs = replicas(4);
        let c: Vec<_> = rs.iter().collect();
        let next = AtomicUsize::new(0);
        let _a = load(&rs[0], 2).await;
        let _b = load(&rs[1], 1).await;
        let _d = load(&rs[3], 1).await;
        for _ in 0..20 {
            assert_eq!(least_loaded(&c, &next).unwrap().url, rs[2].url);
        }
        // rs[1] and rs[3] tie once rs[2] is as busy: they take turns.
        let _c = load(&rs[2], 1).await;
        let picks: Vec<_> = (0..8)
            .map(|_| least_loaded(&c, &next).unwrap().url.clone())
            .collect();
        assert!(picks.iter().all(|u| *u != rs[0].url), "{picks:?}");
        for r in [&rs[1], &rs[2], &rs[3]] {
            assert!(picks.contains(&r.url), "{} never picked: {picks:?}", r.url);
        }
    }

    #[tokio::test]
    async fn a_closed_loop_stays_even() {
        // Six clients over three replicas, one finishing at a time: least outstanding keeps
        // every replica at two (power of two choices left three on one a third of the time).
        let rs = replicas(3);
        let c: Vec<_> = rs.iter().collect();
        let next = AtomicUsize::new(0);
        let mut held: Vec<Vec<_>> = vec![Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..6 {
            let r = least_loaded(&c, &next).unwrap();
            let i = rs.iter().position(|x| x.url == r.url).unwrap();
            held[i].extend(load(r, 1).await);
        }
        for step in 0..60 {
            held[step % 3].pop();
            let r = least_loaded(&c, &next).unwrap();
            let i = rs.iter().position(|x| x.url == r.url).unwrap();
            held[i].extend(load(r, 1).await);
            assert!(held.iter().all(|h| h.len() == 2), "step {step}");
        }
    }

    #[test]
    fn rendezvous_is_sticky_and_spreads_distinct_prefixes() {
        let rs = replicas(4);
        let c: Vec<_> = rs.iter().collect();
        let first = by_rendezvous(&c, 42).unwrap().url.clone();
        for _ in 0..100 {
            assert_eq!(by_rendezvous(&c, 42).unwrap().url, first);
        }
        let mut counts = HashMap::new();
        for p in 0..4000u64 {
            *counts
                .entry(by_rendezvous(&c, mix64(p)).unwrap().url.clone())
                .or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 4);
        assert!(
            counts.values().all(|&n| (800..1200).contains(&n)),
            "{counts:?}"
        );
    }

    #[tokio::test]
    async fn rendezvous_gives_way_to_load_and_comes_back() {
        let rs = replicas(3);
        let c: Vec<_> = rs.iter().collect();
        let preferred = by_rendezvous(&c, 99).unwrap().clone();
        let held = load(&preferred, 1).await;
        let other = by_rendezvous(&c, 99).unwrap().clone();
        assert_ne!(other.url, preferred.url, "a busier replica loses");
        assert_eq!(
            by_rendezvous(&c, 99).unwrap().url,
            other.url,
            "the second choice is consistent"
        );
        drop(held);
        assert_eq!(by_rendezvous(&c, 99).unwrap().url, preferred.url);
    }

    #[test]
    fn round_robin_takes_turns() {
        let rs = replicas(3);
        let c: Vec<_> = rs.iter().collect();
        let next = AtomicUsize::new(0);
        let order: Vec<_> = (0..6)
            .map(|_| round_robin(&c, &next).unwrap().url.clone())
            .collect();
        assert_eq!(order[..3], order[3..]);
        assert_eq!(
            order[..3]
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len(),
            3
        );
        assert!(round_robin(&[], &next).is_none());
    }

    #[tokio::test]
    async fn prefix_choice_follows_the_longest_match_within_the_load_bound() {
        let rs = replicas(3);
        let c: Vec<_> = rs.iter().collect();
        let index = PrefixIndex::default();
        let system = "s".repeat(64 * 4);
        let long = PrefixBlocks::of(&format!("{system}{}", "a".repeat(64 * 4)));
        let short = PrefixBlocks::of(&system);
        index.record(&rs[1].url, &short);
        index.record(&rs[2].url, &long);
        let ask = PrefixBlocks::of(&format!("{system}{}", "a".repeat(64 * 4 + 10)));
        let choice = by_prefix(&c, &ask, &index, None).unwrap();
        assert_eq!(choice.replica.url, rs[2].url, "longest");
        assert_eq!(
            (choice.outcome, choice.matched_blocks),
            (PrefixOutcome::Longest, 8)
        );
        // The longest holder over the bound: the next longest, counted as spilled.
        let held = load(&rs[2], AFFINITY_LOAD_SLACK_MIN + 1).await;
        let choice = by_prefix(&c, &ask, &index, None).unwrap();
        assert_eq!(choice.replica.url, rs[1].url);
        assert_eq!(
            (choice.outcome, choice.matched_blocks),
            (PrefixOutcome::Spilled, 4)
        );
        // A route's own slack lets it through.
        let choice = by_prefix(&c, &ask, &index, Some(AFFINITY_LOAD_SLACK_MIN + 1)).unwrap();
        assert_eq!(choice.replica.url, rs[2].url);
        drop(held);
        // Two hold the same blocks: the less loaded of them.
        index.record(&rs[0].url, &long);
        let busy = load(&rs[0], 1).await;
        assert_eq!(
            by_prefix(&c, &ask, &index, None).unwrap().replica.url,
            rs[2].url
        );
        drop(busy);
        let busy = load(&rs[2], 1).await;
        assert_eq!(
            by_prefix(&c, &ask, &index, None).unwrap().replica.url,
            rs[0].url
        );
        drop(busy);
        // Nobody holds it: the rendezvous choice of its first block, the same every time...
        let new = PrefixBlocks::of(&"n".repeat(300));
        let choice = by_prefix(&c, &new, &index, None).unwrap();
        assert_eq!(
            (choice.outcome, choice.matched_blocks),
            (PrefixOutcome::Unmatched, 0)
        );
        let chosen = choice.replica.clone();
        assert_eq!(
            chosen.url,
            by_rendezvous(&c, new.first().unwrap()).unwrap().url
        );
        // ... unless it is busier than another: with nothing cached, load decides alone.
        let busy = load(&chosen, 1).await;
        assert_ne!(
            by_prefix(&c, &new, &index, None).unwrap().replica.url,
            chosen.url
        );
        drop(busy);
        // No complete block: no opinion.
        assert!(by_prefix(&c, &PrefixBlocks::of("hi"), &index, None).is_none());
    }

    #[test]
    fn removing_a_replica_moves_only_its_prefixes() {
        let rs = replicas(4);
        let all: Vec<_> = rs.iter().collect();
        let fewer: Vec<_> = rs.iter().take(3).collect();
        for p in 0..500u64 {
            let before = by_rendezvous(&all, mix64(p)).unwrap();
            let after = by_rendezvous(&fewer, mix64(p)).unwrap();
            if before.url != rs[3].url {
                assert_eq!(before.url, after.url);
            }
        }
    }
}
