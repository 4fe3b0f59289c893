//! Replica choice: power of two choices on outstanding requests, round robin, and
//! prefix-aware choice bounded by load.
//!
//! Owns the pure selection over a list of candidate replicas (already filtered to available
//! ones); claiming breaker probes and retry exclusion live in `TargetPool`. Invariants: a choice
//! is always one of the candidates, and an empty list gives `None`.
//!
//! Prefix affinity ranks candidates by rendezvous (highest-random-weight) hashing of the prefix
//! hash with each replica URL's hash, and takes the first in that order whose load is within
//! [`AFFINITY_LOAD_SLACK_MIN`] / [`AFFINITY_LOAD_SLACK_DIV`] of the least loaded candidate. The
//! least loaded candidate is always within the bound, so a choice always exists. Spilling in
//! rendezvous order (rather than to a random replica) sends a hot prefix's overflow consistently
//! to the same second replica, which then holds the prefix in its cache too. Rendezvous hashing
//! moves only the prefixes of a replica that goes away or comes back, and is the same on every
//! gateway instance because the hashes are stable.
//!
//! Prefix-aware choice ([`by_prefix`]) first asks the target's [`PrefixIndex`] how many leading
//! blocks of the prompt each candidate within the load bound was sent lately and takes the
//! longest match; a prompt no candidate holds any of goes by rendezvous on its first block, so
//! a new system prompt lands on the same replica from every gateway instance.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rand::Rng;

use super::hash::mix64;
use super::prefix_index::{PrefixBlocks, PrefixIndex};
use super::replica::Replica;

/// The preferred replica may carry at least this many more outstanding requests than the least
/// loaded one before affinity gives way to load. One: a prefix-cache hit saves the prefill of
/// the shared prefix, about what one request ahead in the queue costs; measured, a slack of 4
/// let the busiest replica run 4 requests ahead at concurrency 6 over 3 replicas and lost to
/// round robin (docs/benchmarks.md, prefix-aware routing).
pub const AFFINITY_LOAD_SLACK_MIN: usize = 1;

/// ... or `least / AFFINITY_LOAD_SLACK_DIV` more (25 %), when that is larger (under heavy load
/// a queue of 4 ahead of 16 costs relatively less).
pub const AFFINITY_LOAD_SLACK_DIV: usize = 4;

/// The most outstanding requests an affinity choice may have, given the least loaded candidate.
pub fn affinity_load_bound(least: usize) -> usize {
    least.saturating_add(AFFINITY_LOAD_SLACK_MIN.max(least / AFFINITY_LOAD_SLACK_DIV))
}

/// Power of two choices: of two distinct random candidates, the one with fewer outstanding
/// requests (one candidate: it).
pub fn power_of_two<'a, R: Rng>(
    candidates: &[&'a Arc<Replica>],
    rng: &mut R,
) -> Option<&'a Arc<Replica>> {
    match candidates.len() {
        0 => None,
        1 => Some(candidates[0]),
        n => {
            let i = rng.gen_range(0..n);
            let j = (i + rng.gen_range(1..n)) % n;
            let (a, b) = (candidates[i], candidates[j]);
            Some(if b.outstanding() < a.outstanding() {
                b
            } else {
                a
            })
        }
    }
}

/// Rendezvous score of a replica for a prefix (higher wins).
pub fn rendezvous_score(prefix_hash: u64, replica: &Replica) -> u64 {
    mix64(prefix_hash ^ mix64(replica.url_hash))
}

/// The affinity choice for `prefix_hash`: the first candidate in rendezvous order within the
/// load bound of the least loaded candidate.
pub fn by_affinity<'a>(
    candidates: &[&'a Arc<Replica>],
    prefix_hash: u64,
) -> Option<&'a Arc<Replica>> {
    let least = candidates.iter().map(|r| r.outstanding()).min()?;
    let bound = affinity_load_bound(least);
    let mut ranked: Vec<(u64, &'a Arc<Replica>)> = candidates
        .iter()
        .map(|r| (rendezvous_score(prefix_hash, r), *r))
        .collect();
    ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.url.cmp(&b.1.url)));
    ranked
        .into_iter()
        .map(|(_, r)| r)
        .find(|r| r.outstanding() <= bound)
        // Loads move concurrently; if every candidate grew past the bound, fall back to the
        // least loaded one rather than fail.
        .or_else(|| candidates.iter().min_by_key(|r| r.outstanding()).copied())
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

/// The prefix-aware choice for `blocks` (see the module docs); `None` for a prompt without a
/// complete block or no candidate (the caller then balances on load alone).
pub fn by_prefix<'a>(
    candidates: &[&'a Arc<Replica>],
    blocks: &PrefixBlocks,
    index: &PrefixIndex,
) -> Option<&'a Arc<Replica>> {
    let first = blocks.first()?;
    let least = candidates.iter().map(|r| r.outstanding()).min()?;
    let bound = affinity_load_bound(least);
    let best = candidates
        .iter()
        .filter(|r| r.outstanding() <= bound)
        .map(|r| {
            (
                index.matched(&r.url, blocks),
                std::cmp::Reverse(r.outstanding()),
                rendezvous_score(first, r),
                *r,
            )
        })
        .max_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    match best {
        Some((held, _, _, r)) if held > 0 => Some(r),
        _ => by_affinity(candidates, first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BreakerConfig;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
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
    fn bound_is_one_or_a_quarter() {
        assert_eq!(affinity_load_bound(0), 1);
        assert_eq!(affinity_load_bound(3), 4);
        assert_eq!(affinity_load_bound(10), 12);
        assert_eq!(affinity_load_bound(100), 125);
        assert_eq!(affinity_load_bound(usize::MAX), usize::MAX);
    }

    #[test]
    fn empty_and_single_candidate() {
        let mut rng = StdRng::seed_from_u64(1);
        assert!(power_of_two(&[], &mut rng).is_none());
        assert!(by_affinity(&[], 7).is_none());
        let rs = replicas(1);
        let c: Vec<_> = rs.iter().collect();
        assert_eq!(power_of_two(&c, &mut rng).unwrap().url, rs[0].url);
        assert_eq!(by_affinity(&c, 7).unwrap().url, rs[0].url);
    }

    #[tokio::test]
    async fn p2c_prefers_the_less_loaded_replica() {
        let rs = replicas(2);
        let _held = load(&rs[0], 5).await;
        let c: Vec<_> = rs.iter().collect();
        let mut rng = StdRng::seed_from_u64(2);
        for _ in 0..1000 {
            assert_eq!(power_of_two(&c, &mut rng).unwrap().url, rs[1].url);
        }
    }

    #[tokio::test]
    async fn p2c_avoids_a_loaded_replica_among_many() {
        let rs = replicas(4);
        let _held = load(&rs[2], 3).await;
        let c: Vec<_> = rs.iter().collect();
        let mut rng = StdRng::seed_from_u64(3);
        let mut counts = HashMap::new();
        for _ in 0..4000 {
            *counts
                .entry(power_of_two(&c, &mut rng).unwrap().url.clone())
                .or_insert(0) += 1;
        }
        assert_eq!(
            counts.get(&rs[2].url),
            None,
            "the loaded replica always loses its pair"
        );
        for r in [&rs[0], &rs[1], &rs[3]] {
            let n = counts[&r.url];
            assert!((1000..1700).contains(&n), "{} got {n}", r.url);
        }
    }

    #[test]
    fn affinity_is_sticky_and_spreads_distinct_prefixes() {
        let rs = replicas(4);
        let c: Vec<_> = rs.iter().collect();
        let first = by_affinity(&c, 42).unwrap().url.clone();
        for _ in 0..100 {
            assert_eq!(by_affinity(&c, 42).unwrap().url, first);
        }
        let mut counts = HashMap::new();
        for p in 0..4000u64 {
            *counts
                .entry(by_affinity(&c, mix64(p)).unwrap().url.clone())
                .or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 4);
        assert!(
            counts.values().all(|&n| (800..1200).contains(&n)),
            "{counts:?}"
        );
    }

    #[tokio::test]
    async fn affinity_moves_off_an_overloaded_replica_and_back() {
        let rs = replicas(3);
        let c: Vec<_> = rs.iter().collect();
        let preferred = by_affinity(&c, 99).unwrap().clone();
        let mut held = load(&preferred, AFFINITY_LOAD_SLACK_MIN).await;
        assert_eq!(
            by_affinity(&c, 99).unwrap().url,
            preferred.url,
            "within the bound"
        );
        held.extend(load(&preferred, 1).await);
        let spill = by_affinity(&c, 99).unwrap().clone();
        assert_ne!(spill.url, preferred.url, "past the bound");
        assert_eq!(
            by_affinity(&c, 99).unwrap().url,
            spill.url,
            "spill is consistent"
        );
        held.clear();
        assert_eq!(by_affinity(&c, 99).unwrap().url, preferred.url);
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
        assert_eq!(
            by_prefix(&c, &ask, &index).unwrap().url,
            rs[2].url,
            "longest"
        );
        // The longest holder over the bound: the next longest.
        let held = load(&rs[2], AFFINITY_LOAD_SLACK_MIN + 1).await;
        assert_eq!(by_prefix(&c, &ask, &index).unwrap().url, rs[1].url);
        drop(held);
        // Two hold the same blocks: the less loaded of them.
        index.record(&rs[0].url, &long);
        let busy = load(&rs[0], 1).await;
        assert_eq!(by_prefix(&c, &ask, &index).unwrap().url, rs[2].url);
        drop(busy);
        let busy = load(&rs[2], 1).await;
        assert_eq!(by_prefix(&c, &ask, &index).unwrap().url, rs[0].url);
        drop(busy);
        // Nobody holds it: the rendezvous choice of its first block, the same every time.
        let new = PrefixBlocks::of(&"n".repeat(300));
        let chosen = by_prefix(&c, &new, &index).unwrap().url.clone();
        assert_eq!(chosen, by_affinity(&c, new.first().unwrap()).unwrap().url);
        // No complete block: no opinion.
        assert!(by_prefix(&c, &PrefixBlocks::of("hi"), &index).is_none());
    }

    #[test]
    fn removing_a_replica_moves_only_its_prefixes() {
        let rs = replicas(4);
        let all: Vec<_> = rs.iter().collect();
        let fewer: Vec<_> = rs.iter().take(3).collect();
        for p in 0..500u64 {
            let before = by_affinity(&all, mix64(p)).unwrap();
            let after = by_affinity(&fewer, mix64(p)).unwrap();
            if before.url != rs[3].url {
                assert_eq!(before.url, after.url);
            }
        }
    }
}
