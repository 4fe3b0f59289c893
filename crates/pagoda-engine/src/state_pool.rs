//! The recurrent-state slot pool of hybrid models (issue 40: Qwen3.5's gated DeltaNet layers,
//! Mamba-2 and short-convolution layers): which fixed-size state slots are in use, by whom,
//! and which hold a reusable snapshot of a prompt prefix. Pure bookkeeping over slot ids
//! `0..n_slots`, beside the KV [`BlockPool`]; the state bytes (per slot: each recurrent
//! layer's convolution window and recurrent matrix) live in the runner's cache.
//!
//! A slot is in one of three states, exactly as a KV block (the pool is a [`BlockPool`] of
//! one-"token" blocks, so it inherits that pool's invariants, its LRU and its checks):
//! - **live**: held by one running sequence, which writes its state there every step
//!   (reference count 1; never shared, never registered);
//! - **snapshot**: a copy of a live state taken at a prefix boundary, registered under that
//!   prefix's chained block hash ([`crate::block_pool::chain_hash`]): while a sequence is
//!   copying it out it is held (counted), otherwise it is *cached free* — findable by
//!   [`StatePool::find_snapshot`] until a live allocation evicts it, least recently used
//!   first;
//! - **free**.
//!
//! Snapshots are taken at the end of a prefill chunk that ends on a KV block boundary (the
//! scheduler ends a hybrid prompt's chunks there): a recurrent state cannot be rewound, so a
//! later request sharing the prefix resumes from the deepest snapshot whose hash its own
//! prompt reproduces and computes only the rest; a state per block would cost far more memory
//! than the blocks themselves (Qwen3.5-4B: tens of MB per state against kilobytes per block),
//! so chunk ends are the points.
//!
//! Invariants: every live slot has one holder and no hash; a snapshot's contents never
//! change after registration (a resuming sequence copies it into its own live slot);
//! `num_free()` counts plain and cached-free slots, so admission (a sequence needs one live
//! slot beside its blocks) may evict snapshots but never a live state.

use crate::block_pool::{BlockHash, BlockPool, PoolStats};

/// Index of one recurrent-state slot.
pub type SlotId = u32;

/// Live and snapshot recurrent-state slots (see the module docs).
#[derive(Debug, Clone)]
pub struct StatePool {
    slots: BlockPool,
    slot_bytes: usize,
}

/// A snapshot of the pool's counters (for metrics: slots in use beside KV usage).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateStats {
    pub slots_total: usize,
    /// Live slots and snapshots being copied out.
    pub slots_used: usize,
    pub slots_free: usize,
    /// Snapshots findable by prefix.
    pub snapshots: usize,
    pub snapshot_queries: u64,
    pub snapshot_hits: u64,
}

impl StatePool {
    /// `n_slots` free slots of `slot_bytes` bytes each; with `prefix_caching` off no snapshot
    /// is ever registered or found.
    pub fn new(n_slots: usize, slot_bytes: usize, prefix_caching: bool) -> Self {
        StatePool {
            slots: BlockPool::new(n_slots, 1, prefix_caching),
            slot_bytes,
        }
    }

    /// A slot for a sequence's live state, or `None` when every slot is live or being copied
    /// from. May evict the least recently used snapshot.
    pub fn allocate_live(&mut self) -> Option<SlotId> {
        self.slots.allocate()
    }

    /// Gives back a live slot (finish, abort, preemption) or a snapshot the caller finished
    /// copying from.
    pub fn release(&mut self, id: SlotId) {
        self.slots.release(id);
    }

    /// A slot to copy a live state into as the snapshot of prefix `hash`, or `None` when a
    /// snapshot of that prefix exists already (nothing to do), prefix caching is off, or no
    /// slot is free. The caller copies the state, then calls [`StatePool::publish_snapshot`].
    pub fn begin_snapshot(&mut self, hash: BlockHash) -> Option<SlotId> {
        if !self.slots.prefix_caching() || self.slots.peek(hash).is_some() {
            return None;
        }
        self.slots.allocate()
    }

    /// Makes slot `id` (from [`StatePool::begin_snapshot`], now holding the state of prefix
    /// `hash`) findable, and releases the writer's hold: it stays cached until evicted.
    pub fn publish_snapshot(&mut self, id: SlotId, hash: BlockHash) {
        self.slots.register(id, hash);
        self.slots.release(id);
    }

    /// The snapshot of prefix `hash`, held for copying (release it after), or `None`. Counts
    /// a query, and a hit when found.
    pub fn find_snapshot(&mut self, hash: BlockHash) -> Option<SlotId> {
        self.slots.lookup(hash)
    }

    /// Whether a snapshot of prefix `hash` exists, without taking it or counting a query.
    pub fn has_snapshot(&self, hash: BlockHash) -> bool {
        self.slots.peek(hash).is_some()
    }

    /// Slots a live allocation can take now (plain free and cached snapshots).
    pub fn num_free(&self) -> usize {
        self.slots.num_free()
    }

    pub fn num_slots(&self) -> usize {
        self.slots.num_blocks()
    }

    /// Bytes of one slot's state (every recurrent layer's convolution window and matrix).
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Bytes of the whole pool, for the memory plan beside the KV blocks.
    pub fn memory_bytes(&self) -> usize {
        self.num_slots().saturating_mul(self.slot_bytes)
    }

    pub fn stats(&self) -> StateStats {
        let PoolStats {
            blocks_total,
            blocks_used,
            blocks_free,
            blocks_cached,
            prefix_queries,
            prefix_hits,
        } = self.slots.stats();
        StateStats {
            slots_total: blocks_total,
            slots_used: blocks_used,
            slots_free: blocks_free,
            snapshots: blocks_cached,
            snapshot_queries: prefix_queries,
            snapshot_hits: prefix_hits,
        }
    }

    /// Checks the invariants (the underlying pool's); `Err` names the first one broken.
    pub fn check(&self) -> Result<(), String> {
        self.slots.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn live_slots_run_out_and_snapshots_give_way_to_them() {
        let mut p = StatePool::new(3, 1024, true);
        assert_eq!(p.memory_bytes(), 3 * 1024);
        let a = p.allocate_live().unwrap();
        let snap = p.begin_snapshot(42).unwrap();
        p.publish_snapshot(snap, 42);
        assert!(p.has_snapshot(42));
        assert!(p.begin_snapshot(42).is_none(), "one snapshot per prefix");
        let b = p.allocate_live().unwrap();
        // The third live allocation evicts the cached snapshot, never a live slot.
        let c = p.allocate_live().unwrap();
        assert_eq!(c, snap);
        assert!(!p.has_snapshot(42));
        assert_eq!(p.allocate_live(), None);
        for id in [a, b, c] {
            p.release(id);
        }
        assert_eq!(p.num_free(), 3);
        p.check().unwrap();
    }

    #[test]
    fn a_snapshot_being_copied_is_not_evicted() {
        let mut p = StatePool::new(2, 8, true);
        let s = p.begin_snapshot(7).unwrap();
        p.publish_snapshot(s, 7);
        let held = p.find_snapshot(7).unwrap();
        let live = p.allocate_live().unwrap();
        assert_ne!(live, held);
        assert_eq!(p.allocate_live(), None);
        p.release(held);
        assert!(p.has_snapshot(7), "released snapshots stay cached");
        assert_eq!(p.stats().snapshot_hits, 1);
        p.release(live);
        p.check().unwrap();
    }

    #[test]
    fn without_prefix_caching_nothing_is_snapshotted() {
        let mut p = StatePool::new(2, 8, false);
        assert!(p.begin_snapshot(1).is_none());
        assert!(p.find_snapshot(1).is_none());
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Admit a sequence: it resumes from the snapshot of `prefix` if there is one.
        Admit { prefix: u8 },
        /// A running sequence ends a chunk on a boundary: snapshot its state under `prefix`.
        Snapshot { seq: usize, prefix: u8 },
        /// Finish, abort or preempt a running sequence (all give the slot back).
        Remove { seq: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..6).prop_map(|prefix| Op::Admit { prefix }),
            (0usize..16, 0u8..6).prop_map(|(seq, prefix)| Op::Snapshot { seq, prefix }),
            (0usize..16).prop_map(|seq| Op::Remove { seq }),
        ]
    }

    proptest! {
        /// Random admissions, snapshots and removals (finish, abort and preemption all give a
        /// slot back): no slot leaks, a live slot is never handed out twice, and once every
        /// sequence is gone all slots are free again.
        #[test]
        fn no_slot_leaks_under_random_admit_snapshot_and_remove(
            n_slots in 1usize..8,
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let mut p = StatePool::new(n_slots, 64, true);
            let mut running: Vec<SlotId> = Vec::new();
            for op in ops {
                match op {
                    Op::Admit { prefix } => {
                        let resume = p.find_snapshot(u64::from(prefix));
                        match p.allocate_live() {
                            Some(slot) => {
                                prop_assert!(!running.contains(&slot), "live slot {} given twice", slot);
                                running.push(slot);
                            }
                            None => prop_assert!(running.len() + usize::from(resume.is_some()) >= n_slots),
                        }
                        if let Some(s) = resume {
                            prop_assert!(!running.contains(&s), "a snapshot became live while held");
                            p.release(s);
                        }
                    }
                    Op::Snapshot { seq, prefix } => {
                        if !running.is_empty() {
                            let _live = running[seq % running.len()];
                            if let Some(s) = p.begin_snapshot(u64::from(prefix)) {
                                prop_assert!(!running.contains(&s));
                                p.publish_snapshot(s, u64::from(prefix));
                            }
                        }
                    }
                    Op::Remove { seq } => {
                        if !running.is_empty() {
                            let slot = running.swap_remove(seq % running.len());
                            p.release(slot);
                        }
                    }
                }
                if let Err(e) = p.check() {
                    prop_assert!(false, "{}", e);
                }
                prop_assert_eq!(p.stats().slots_used, running.len());
            }
            for slot in running.drain(..) {
                p.release(slot);
            }
            prop_assert_eq!(p.num_free(), n_slots);
        }
    }
}
