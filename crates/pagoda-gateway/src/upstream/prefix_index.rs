//! Prefix-aware routing's memory: which prompt prefixes each replica of a target was sent,
//! at block granularity, so a request goes where the longest part of its prompt is likely
//! still in the engine's prefix cache (SGLang's router and llm-d's approximate prefix scorer
//! work the same way; the gateway has no tokenizer, so blocks are characters).
//!
//! A prompt is cut into blocks of [`BLOCK_CHARS`] characters and each block's key is a hash
//! chained over every block before it ([`PrefixBlocks`]), so a key stands for the whole
//! prefix up to its block: two prompts share key *i* only if they share their first *i* + 1
//! blocks. A replica "holds" the blocks of every request routed to it lately.
//!
//! Invariants: each replica's entry holds at most [`BLOCKS_PER_REPLICA`] keys (the least
//! recently routed go first), so memory is bounded whatever clients send; only the first
//! [`MAX_BLOCKS`] blocks of a prompt count; the hashes are stable across processes, so every
//! gateway instance computes the same keys for the same prompt.

use std::collections::HashMap;
use std::sync::Mutex;

use super::hash::{fnv1a, mix64, FNV_OFFSET};

/// Characters per block: about 16 tokens, the KV block size of vLLM and of Pagoda's engine.
pub const BLOCK_CHARS: usize = 64;
/// Blocks of a prompt that count (16,384 characters, a few thousand tokens).
pub const MAX_BLOCKS: usize = 256;
/// Keys remembered per replica (about 2M characters of distinct prefixes).
pub const BLOCKS_PER_REPLICA: usize = 32_768;

/// The chained block keys of one prompt.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrefixBlocks(Vec<u64>);

impl PrefixBlocks {
    /// The keys of `text`'s complete blocks (a trailing partial block is not a key: the
    /// engine caches whole blocks only).
    pub fn of(text: &str) -> PrefixBlocks {
        let mut keys = Vec::new();
        let mut h = FNV_OFFSET;
        let mut chars = 0usize;
        for c in text.chars() {
            let mut buf = [0u8; 4];
            for &b in c.encode_utf8(&mut buf).as_bytes() {
                h = fnv1a(h, b);
            }
            chars += 1;
            if chars == BLOCK_CHARS {
                keys.push(mix64(h));
                chars = 0;
                if keys.len() == MAX_BLOCKS {
                    break;
                }
            }
        }
        PrefixBlocks(keys)
    }

    /// Number of complete blocks.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first block's key (stands for the prompt's first [`BLOCK_CHARS`] characters).
    pub fn first(&self) -> Option<u64> {
        self.0.first().copied()
    }
}

/// The blocks each replica of one target was sent; see the module docs.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// A counter that orders recordings (the recency of a key).
    clock: u64,
    /// Replica URL → block key → when it was last routed there.
    replicas: HashMap<String, HashMap<u64, u64>>,
}

impl PrefixIndex {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many leading blocks of `blocks` the replica at `url` holds.
    pub fn matched(&self, url: &str, blocks: &PrefixBlocks) -> usize {
        let inner = self.inner();
        let Some(held) = inner.replicas.get(url) else {
            return 0;
        };
        blocks.0.iter().take_while(|k| held.contains_key(k)).count()
    }

    /// Notes that `blocks` were routed to the replica at `url` now.
    pub fn record(&self, url: &str, blocks: &PrefixBlocks) {
        if blocks.is_empty() {
            return;
        }
        let mut inner = self.inner();
        inner.clock += 1;
        let now = inner.clock;
        let held = inner.replicas.entry(url.to_string()).or_default();
        for &k in &blocks.0 {
            held.insert(k, now);
        }
        if held.len() > BLOCKS_PER_REPLICA {
            evict_oldest(held, BLOCKS_PER_REPLICA * 3 / 4);
        }
    }

    /// Forgets every replica not in `urls` (they left the target).
    pub fn retain(&self, urls: &[&str]) {
        self.inner()
            .replicas
            .retain(|url, _| urls.contains(&url.as_str()));
    }
}

/// Keeps the `keep` most recently recorded keys of `held`.
fn evict_oldest(held: &mut HashMap<u64, u64>, keep: usize) {
    let mut ages: Vec<u64> = held.values().copied().collect();
    let cut = ages.len().saturating_sub(keep);
    if cut == 0 {
        return;
    }
    let (_, &mut threshold, _) = ages.select_nth_unstable(cut - 1);
    held.retain(|_, t| *t > threshold);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(seed: char, chars: usize) -> String {
        std::iter::repeat_n(seed, chars).collect()
    }

    #[test]
    fn blocks_are_whole_chained_and_capped() {
        assert!(PrefixBlocks::of(&text('a', BLOCK_CHARS - 1)).is_empty());
        assert_eq!(PrefixBlocks::of(&text('a', BLOCK_CHARS * 3 + 5)).len(), 3);
        assert_eq!(
            PrefixBlocks::of(&text('a', BLOCK_CHARS * 1000)).len(),
            MAX_BLOCKS
        );
        // Same second block, different first: no key in common (keys stand for prefixes).
        let x = PrefixBlocks::of(&format!("{}{}", text('x', 64), text('s', 64)));
        let y = PrefixBlocks::of(&format!("{}{}", text('y', 64), text('s', 64)));
        assert!(x.0.iter().all(|k| !y.0.contains(k)));
        // Characters, not bytes: 64 two-byte characters are one block.
        assert_eq!(PrefixBlocks::of(&text('é', 64)).len(), 1);
        // Stable across builds and processes.
        assert_eq!(
            PrefixBlocks::of(&text('a', 64)).first(),
            PrefixBlocks::of(&text('a', 100)).first()
        );
    }

    #[test]
    fn matching_counts_the_shared_leading_blocks() {
        let index = PrefixIndex::default();
        let system = text('s', BLOCK_CHARS * 4);
        let first = PrefixBlocks::of(&format!("{system}{}", text('q', 200)));
        index.record("http://a", &first);
        let follow_up = PrefixBlocks::of(&format!("{system}{}", text('r', 200)));
        assert_eq!(index.matched("http://a", &follow_up), 4);
        assert_eq!(index.matched("http://b", &follow_up), 0);
        assert_eq!(index.matched("http://a", &first), first.len());
        let other = PrefixBlocks::of(&text('o', 500));
        assert_eq!(index.matched("http://a", &other), 0);
        index.retain(&["http://b"]);
        assert_eq!(index.matched("http://a", &first), 0);
    }

    #[test]
    fn memory_is_bounded_and_recent_prefixes_survive() {
        let index = PrefixIndex::default();
        let recent = PrefixBlocks::of(&text('r', BLOCK_CHARS * 8));
        for i in 0..(BLOCKS_PER_REPLICA / MAX_BLOCKS + 8) {
            let p = PrefixBlocks::of(&format!("{i:08}{}", text('z', BLOCK_CHARS * MAX_BLOCKS)));
            index.record("http://a", &p);
            index.record("http://a", &recent);
        }
        let held = index.inner().replicas["http://a"].len();
        assert!(held <= BLOCKS_PER_REPLICA, "{held}");
        assert_eq!(index.matched("http://a", &recent), 8);
    }
}
