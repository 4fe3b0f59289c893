//! The KV block pool: which of the paged KV cache's blocks are in use, by how many sequences,
//! and which hold a reusable prompt prefix (the prefix cache).
//!
//! Pure bookkeeping over block ids `0..n_blocks`; the memory they index lives in the runner's
//! `PagedKvCache`. The scheduler is the only caller.
//!
//! Every block is in exactly one of three states:
//! - **used**: `ref_count > 0` (held by that many block tables);
//! - **free**: `ref_count == 0`, no hash, on the free stack;
//! - **cached free**: `ref_count == 0` with a hash, on the LRU list — still findable by
//!   [`BlockPool::lookup`], evicted (least recently released first) only when
//!   [`BlockPool::allocate`] finds no plain free block.
//!
//! A used block may also carry a hash (it is shared through the prefix cache while in use).
//! The hash map holds at most one block per hash, and a block's hash is in the map exactly when
//! the block carries it. `num_free()` counts both kinds of free block.
//!
//! Hashes chain: a full block's hash covers its tokens and its parent's hash, so a hit on block
//! `i` means the whole prefix `0..=i` matches. Only full blocks are ever registered, and the
//! scheduler copies a cached block before any write into it, so its contents never change.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// Index of one KV block in the paged cache.
pub type BlockId = u32;
/// Chained hash of a full block of tokens and every block before it.
pub type BlockHash = u64;

/// Parent "hash" of the first block of a sequence.
const ROOT_HASH: BlockHash = 0x9e37_79b9_7f4a_7c15;
/// End of an LRU link.
const NIL: u32 = u32::MAX;

/// Hash of one full block `tokens` whose predecessor hashed to `parent` (`None` for block 0).
pub fn chain_hash(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    // SipHash with fixed keys: deterministic within a process, well mixed.
    let mut h = DefaultHasher::new();
    parent.unwrap_or(ROOT_HASH).hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// The parent hash of a salted sequence's first block: `None` (the plain root) for salt 0.
/// Sequences with different salts (a LoRA adapter's identity) never share cached blocks.
pub fn salt_root(salt: u64) -> Option<BlockHash> {
    (salt != 0).then(|| {
        let mut h = DefaultHasher::new();
        (ROOT_HASH, "salt", salt).hash(&mut h);
        h.finish()
    })
}

/// Chained hashes of the *full* blocks of `tokens`:
/// `h[i] = hash(h[i-1], tokens[i*bs..(i+1)*bs])`. A trailing partial block has no hash.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut parent = None;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let h = chain_hash(parent, block);
            parent = Some(h);
            h
        })
        .collect()
}

/// A snapshot of the pool's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub blocks_total: usize,
    /// Blocks with `ref_count > 0`.
    pub blocks_used: usize,
    /// Blocks with `ref_count == 0` (plain and cached): `blocks_total - blocks_used`.
    pub blocks_free: usize,
    /// Blocks findable in the prefix cache (used or free).
    pub blocks_cached: usize,
    /// [`BlockPool::lookup`] calls (one per block asked about).
    pub prefix_queries: u64,
    /// Lookups that found a block.
    pub prefix_hits: u64,
}

impl PoolStats {
    /// `prefix_hits / prefix_queries`, 0 before any query.
    pub fn hit_rate(&self) -> f64 {
        if self.prefix_queries == 0 {
            0.0
        } else {
            self.prefix_hits as f64 / self.prefix_queries as f64
        }
    }
}

/// Reference-counted KV blocks with an LRU prefix cache. See the module docs for the states.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    prefix_caching: bool,
    refs: Vec<u32>,
    hashes: Vec<Option<BlockHash>>,
    by_hash: HashMap<BlockHash, BlockId>,
    /// Plain free blocks; popped from the end (initially in id order).
    free: Vec<BlockId>,
    /// Cached free blocks, least recently released at `lru_head`.
    lru_prev: Vec<u32>,
    lru_next: Vec<u32>,
    lru_head: u32,
    lru_tail: u32,
    lru_len: usize,
    queries: u64,
    hits: u64,
}

impl BlockPool {
    /// `n_blocks` free blocks of `block_size` tokens. With `prefix_caching` off, `register`
    /// and `lookup` do nothing. `n_blocks` must be below `u32::MAX` (it is capped there).
    pub fn new(n_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        let n = n_blocks.min(NIL as usize - 1);
        BlockPool {
            block_size: block_size.max(1),
            prefix_caching,
            refs: vec![0; n],
            hashes: vec![None; n],
            by_hash: HashMap::new(),
            free: (0..n as BlockId).rev().collect(),
            lru_prev: vec![NIL; n],
            lru_next: vec![NIL; n],
            lru_head: NIL,
            lru_tail: NIL,
            lru_len: 0,
            queries: 0,
            hits: 0,
        }
    }

    /// A fresh block with `ref_count` 1 and no hash: a plain free block if there is one, else
    /// the least recently released cached block (evicted from the prefix cache). `None` when
    /// every block is in use.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let id = self.lru_head;
                if id == NIL {
                    return None;
                }
                self.lru_unlink(id);
                if let Some(h) = self.hashes[id as usize].take() {
                    self.by_hash.remove(&h);
                }
                id
            }
        };
        debug_assert_eq!(self.refs[id as usize], 0, "allocated block {id} was in use");
        self.refs[id as usize] = 1;
        Some(id)
    }

    /// Drops one reference. At zero the block becomes free: a cached block keeps its hash and
    /// goes to the LRU tail (most recently used), a plain one to the free stack.
    /// Releasing a free block is a bug (debug assertion; ignored in release builds).
    pub fn release(&mut self, id: BlockId) {
        let Some(r) = self.refs.get_mut(id as usize) else {
            debug_assert!(false, "released unknown block {id}");
            return;
        };
        debug_assert!(*r > 0, "double free of block {id}");
        if *r == 0 {
            return;
        }
        *r -= 1;
        if *r == 0 {
            if self.hashes[id as usize].is_some() {
                self.lru_push_tail(id);
            } else {
                self.free.push(id);
            }
        }
    }

    /// Adds one reference to a block already in use (a fork shares its parent's blocks).
    /// Sharing a free block is a bug (debug assertion); release builds take it off the free
    /// lists so the counts stay right.
    pub fn share(&mut self, id: BlockId) {
        let Some(&r) = self.refs.get(id as usize) else {
            debug_assert!(false, "shared unknown block {id}");
            return;
        };
        debug_assert!(r > 0, "shared free block {id}");
        if r == 0 {
            self.take_free(id);
        }
        self.refs[id as usize] += 1;
    }

    /// References held on `id` (0 for free or unknown blocks).
    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.refs.get(id as usize).copied().unwrap_or(0)
    }

    /// The block cached under `hash`, with one more reference (a cached free block leaves the
    /// free list). Counts a query, and a hit when found. `None` with prefix caching off.
    pub fn lookup(&mut self, hash: BlockHash) -> Option<BlockId> {
        if !self.prefix_caching {
            return None;
        }
        self.queries += 1;
        let id = *self.by_hash.get(&hash)?;
        self.hits += 1;
        if self.refs[id as usize] == 0 {
            self.lru_unlink(id);
        }
        self.refs[id as usize] += 1;
        Some(id)
    }

    /// `id` is findable in the prefix cache (it carries a hash). Its contents must not change:
    /// a writer copies it first.
    pub fn is_cached(&self, id: BlockId) -> bool {
        self.hashes.get(id as usize).is_some_and(Option::is_some)
    }

    /// The block cached under `hash`, without taking it or counting a query.
    pub fn peek(&self, hash: BlockHash) -> Option<BlockId> {
        if !self.prefix_caching {
            return None;
        }
        self.by_hash.get(&hash).copied()
    }

    /// Makes used block `id`, now full and computed, findable under `hash`. A block already
    /// registered keeps its hash; if another block already holds `hash` (the same prefix
    /// computed twice), that one stays cached and `id` stays plain.
    pub fn register(&mut self, id: BlockId, hash: BlockHash) {
        if !self.prefix_caching || id as usize >= self.refs.len() {
            return;
        }
        debug_assert!(self.refs[id as usize] > 0, "registered free block {id}");
        if let Some(old) = self.hashes[id as usize] {
            debug_assert_eq!(old, hash, "block {id} registered under two hashes");
            return;
        }
        if self.by_hash.contains_key(&hash) || self.refs[id as usize] == 0 {
            return;
        }
        self.by_hash.insert(hash, id);
        self.hashes[id as usize] = Some(hash);
    }

    /// Blocks with `ref_count == 0`, cached or not: what `allocate` can hand out.
    pub fn num_free(&self) -> usize {
        self.free.len() + self.lru_len
    }

    pub fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks needed to hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    pub fn stats(&self) -> PoolStats {
        let free = self.num_free();
        PoolStats {
            blocks_total: self.num_blocks(),
            blocks_used: self.num_blocks() - free,
            blocks_free: free,
            blocks_cached: self.by_hash.len(),
            prefix_queries: self.queries,
            prefix_hits: self.hits,
        }
    }

    /// Checks every invariant of the module docs; `Err` names the first one broken.
    /// O(blocks); tests and debug assertions call it.
    pub fn check(&self) -> Result<(), String> {
        let n = self.num_blocks();
        let mut on_free = vec![false; n];
        for &id in &self.free {
            let i = id as usize;
            if i >= n || on_free[i] {
                return Err(format!("block {id} twice on the free stack (or unknown)"));
            }
            on_free[i] = true;
            if self.refs[i] != 0 || self.hashes[i].is_some() {
                return Err(format!("free-stack block {id} is in use or cached"));
            }
        }
        let mut on_lru = vec![false; n];
        let (mut id, mut prev, mut len) = (self.lru_head, NIL, 0);
        while id != NIL {
            let i = id as usize;
            if i >= n || on_lru[i] || on_free[i] || self.lru_prev[i] != prev {
                return Err(format!("LRU list broken at block {id}"));
            }
            on_lru[i] = true;
            if self.refs[i] != 0 || self.hashes[i].is_none() {
                return Err(format!("LRU block {id} is in use or not cached"));
            }
            len += 1;
            prev = id;
            id = self.lru_next[i];
        }
        if prev != self.lru_tail || len != self.lru_len {
            return Err("LRU tail or length wrong".into());
        }
        for i in 0..n {
            if self.refs[i] == 0 && !on_free[i] && !on_lru[i] {
                return Err(format!("block {i} has no references but is not free"));
            }
            if let Some(h) = self.hashes[i] {
                if self.by_hash.get(&h) != Some(&(i as BlockId)) {
                    return Err(format!(
                        "block {i} carries a hash the map does not point back"
                    ));
                }
            }
        }
        for (&h, &id) in &self.by_hash {
            if self.hashes.get(id as usize).copied().flatten() != Some(h) {
                return Err(format!(
                    "hash map points at block {id}, which lacks that hash"
                ));
            }
        }
        Ok(())
    }

    /// Takes free block `id` off whichever free list holds it.
    fn take_free(&mut self, id: BlockId) {
        if self.hashes[id as usize].is_some() {
            self.lru_unlink(id);
        } else if let Some(pos) = self.free.iter().rposition(|&b| b == id) {
            self.free.swap_remove(pos);
        }
    }

    fn lru_push_tail(&mut self, id: BlockId) {
        let i = id as usize;
        self.lru_prev[i] = self.lru_tail;
        self.lru_next[i] = NIL;
        if self.lru_tail == NIL {
            self.lru_head = id;
        } else {
            self.lru_next[self.lru_tail as usize] = id;
        }
        self.lru_tail = id;
        self.lru_len += 1;
    }

    fn lru_unlink(&mut self, id: BlockId) {
        let i = id as usize;
        let (prev, next) = (self.lru_prev[i], self.lru_next[i]);
        if prev == NIL {
            debug_assert_eq!(self.lru_head, id, "block {id} is not on the LRU list");
            self.lru_head = next;
        } else {
            self.lru_next[prev as usize] = next;
        }
        if next == NIL {
            self.lru_tail = prev;
        } else {
            self.lru_prev[next as usize] = prev;
        }
        self.lru_prev[i] = NIL;
        self.lru_next[i] = NIL;
        self.lru_len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> BlockPool {
        BlockPool::new(n, 4, true)
    }

    #[test]
    fn hashes_cover_only_full_blocks_and_chain() {
        let t: Vec<u32> = (0..10).collect();
        let h = block_hashes(&t, 4);
        assert_eq!(h.len(), 2);
        assert_eq!(h[0], chain_hash(None, &t[0..4]));
        assert_eq!(h[1], chain_hash(Some(h[0]), &t[4..8]));
        // Same block content after a different prefix hashes differently.
        let mut u = t.clone();
        u[0] = 99;
        assert_ne!(block_hashes(&u, 4)[1], h[1]);
        assert_eq!(block_hashes(&t[..8], 4), h);
        assert!(block_hashes(&t[..3], 4).is_empty());
        assert!(block_hashes(&t, 0).is_empty());
    }

    #[test]
    fn allocate_until_empty_then_release() {
        let mut p = pool(3);
        let ids: Vec<_> = (0..3).map(|_| p.allocate()).collect();
        assert_eq!(ids, vec![Some(0), Some(1), Some(2)]);
        assert_eq!(p.allocate(), None);
        assert_eq!(p.num_free(), 0);
        p.release(1);
        assert_eq!(p.num_free(), 1);
        assert_eq!(p.allocate(), Some(1));
        p.check().unwrap();
    }

    #[test]
    fn share_and_release_count_references() {
        let mut p = pool(2);
        let b = p.allocate().unwrap();
        p.share(b);
        assert_eq!(p.ref_count(b), 2);
        p.release(b);
        assert_eq!(p.ref_count(b), 1);
        assert_eq!(p.num_free(), 1);
        p.release(b);
        assert_eq!(p.ref_count(b), 0);
        assert_eq!(p.num_free(), 2);
        p.check().unwrap();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "double free")]
    fn double_free_is_caught() {
        let mut p = pool(2);
        let b = p.allocate().unwrap();
        p.release(b);
        p.release(b);
    }

    #[test]
    fn released_cached_block_stays_findable_until_evicted() {
        let mut p = pool(2);
        let a = p.allocate().unwrap();
        p.register(a, 7);
        p.release(a);
        assert_eq!(p.num_free(), 2);
        assert_eq!(p.stats().blocks_cached, 1);
        // A hit on a free cached block takes it off the free list.
        assert_eq!(p.lookup(7), Some(a));
        assert_eq!(p.ref_count(a), 1);
        assert_eq!(p.num_free(), 1);
        p.check().unwrap();
        p.release(a);
        // Plain free blocks go first; the cached one is evicted only when nothing else is left.
        let b = p.allocate().unwrap();
        assert_ne!(b, a);
        assert_eq!(p.peek(7), Some(a));
        let c = p.allocate().unwrap();
        assert_eq!(c, a);
        assert_eq!(p.peek(7), None);
        assert_eq!(p.lookup(7), None);
        assert_eq!(p.stats().blocks_cached, 0);
        p.check().unwrap();
    }

    #[test]
    fn eviction_is_least_recently_released_first() {
        let mut p = pool(3);
        let ids: Vec<_> = (0..3).map(|_| p.allocate().unwrap()).collect();
        for (i, &id) in ids.iter().enumerate() {
            p.register(id, 100 + i as u64);
        }
        p.release(ids[2]);
        p.release(ids[0]);
        p.release(ids[1]);
        // Touch ids[2] again: it becomes most recent once released.
        assert_eq!(p.lookup(102), Some(ids[2]));
        p.release(ids[2]);
        assert_eq!(p.allocate(), Some(ids[0]));
        assert_eq!(p.allocate(), Some(ids[1]));
        assert_eq!(p.allocate(), Some(ids[2]));
        assert_eq!(p.allocate(), None);
        p.check().unwrap();
    }

    #[test]
    fn lookup_of_used_block_shares_it() {
        let mut p = pool(2);
        let a = p.allocate().unwrap();
        p.register(a, 1);
        assert_eq!(p.lookup(1), Some(a));
        assert_eq!(p.ref_count(a), 2);
        assert_eq!(p.num_free(), 1);
        assert_eq!(p.lookup(2), None);
        let s = p.stats();
        assert_eq!((s.prefix_queries, s.prefix_hits), (2, 1));
        assert_eq!(s.hit_rate(), 0.5);
        assert_eq!(s.blocks_used, 1);
        p.check().unwrap();
    }

    #[test]
    fn a_hash_maps_to_one_block() {
        let mut p = pool(2);
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        p.register(a, 5);
        p.register(b, 5);
        p.register(a, 5);
        assert_eq!(p.peek(5), Some(a));
        p.release(b);
        // b was never cached: it went to the plain free stack.
        assert_eq!(p.stats().blocks_cached, 1);
        p.check().unwrap();
    }

    #[test]
    fn prefix_caching_off_never_caches() {
        let mut p = BlockPool::new(2, 4, false);
        let a = p.allocate().unwrap();
        p.register(a, 5);
        assert_eq!(p.lookup(5), None);
        assert_eq!(p.stats().prefix_queries, 0);
        assert_eq!(p.stats().blocks_cached, 0);
        p.release(a);
        p.check().unwrap();
    }

    #[test]
    fn stats_add_up() {
        let mut p = pool(5);
        let a = p.allocate().unwrap();
        let _b = p.allocate().unwrap();
        p.register(a, 9);
        p.release(a);
        let s = p.stats();
        assert_eq!(s.blocks_total, 5);
        assert_eq!(s.blocks_used, 1);
        assert_eq!(s.blocks_free, 4);
        assert_eq!(s.blocks_cached, 1);
        assert_eq!(p.blocks_for(0), 0);
        assert_eq!(p.blocks_for(4), 1);
        assert_eq!(p.blocks_for(5), 2);
    }

    /// Random operations against a model of who holds which block: references always add
    /// up, no block is lost, and the structural invariants hold after every operation.
    fn keeps_the_books(
        mut p: BlockPool,
        ops: Vec<(u8, usize, u64)>,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let mut held: Vec<BlockId> = Vec::new();
        let mut content = [0u64; 8];
        for (op, pick, hash) in ops {
            match op {
                0 => {
                    let free = p.num_free();
                    let got = p.allocate();
                    proptest::prop_assert_eq!(got.is_some(), free > 0);
                    if let Some(b) = got {
                        // Fresh block, fresh contents: the hash it may later be registered under.
                        content[b as usize] = hash;
                        proptest::prop_assert_eq!(p.ref_count(b), 1);
                        proptest::prop_assert_eq!(p.num_free(), free - 1);
                        held.push(b);
                    }
                }
                1 if !held.is_empty() => {
                    let b = held.swap_remove(pick % held.len());
                    p.release(b);
                }
                2 if !held.is_empty() => {
                    let b = held[pick % held.len()];
                    p.share(b);
                    held.push(b);
                }
                3 if !held.is_empty() => {
                    let b = held[pick % held.len()];
                    p.register(b, content[b as usize]);
                }
                4 => {
                    if let Some(b) = p.lookup(hash) {
                        held.push(b);
                    }
                }
                _ => {}
            }
            if let Err(e) = p.check() {
                proptest::prop_assert!(false, "{}", e);
            }
            for b in 0..8u32 {
                let n = held.iter().filter(|&&h| h == b).count() as u32;
                proptest::prop_assert_eq!(p.ref_count(b), n, "block {}", b);
            }
            let s = p.stats();
            proptest::prop_assert_eq!(s.blocks_free + s.blocks_used, s.blocks_total);
            let mut distinct = held.clone();
            distinct.sort_unstable();
            distinct.dedup();
            proptest::prop_assert_eq!(s.blocks_used, distinct.len());
        }
        Ok(())
    }

    proptest::proptest! {
        /// The scheduler's configuration (prefix caching on).
        #[test]
        fn random_operations_keep_the_books(ops in proptest::collection::vec((0u8..5, 0usize..64, 0u64..6), 1..300)) {
            keeps_the_books(pool(8), ops)?;
        }

        /// The draft model's configuration (no prefix caching: `register` and `lookup` do
        /// nothing, every block is plain).
        #[test]
        fn random_operations_keep_the_books_without_prefix_caching(ops in proptest::collection::vec((0u8..5, 0usize..64, 0u64..6), 1..300)) {
            keeps_the_books(BlockPool::new(8, 4, false), ops)?;
        }
    }
}
