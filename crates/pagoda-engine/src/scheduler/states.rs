//! A hybrid model's recurrent-state slots as the scheduler hands them out ([`HybridStates`]):
//! which running sequence writes which live slot, which prompt prefixes have a state
//! snapshot, and the copies the runner makes for them. Bookkeeping only (over
//! [`StatePool`]); the state bytes live in the runner's cache.
//!
//! - Every running sequence of a hybrid model holds exactly one live slot: taken at admission
//!   (from zeros at position 0, or a copy of a prefix snapshot), at a fork (a copy of the
//!   parent's), given back when it stops running (finish, abort, preemption).
//! - **Snapshots** (prefix caching): a recurrent state cannot be rewound or rebuilt from
//!   blocks, so a later request can skip a prefix only where the state after exactly that
//!   prefix was kept. The scheduler ends a hybrid prompt's prefill chunks on KV block
//!   boundaries (a chunk that stops short of the prompt's end stops at a boundary, and the
//!   prompt's last boundary before its final token always ends a chunk), and after each such
//!   chunk the runner copies the live state into a snapshot slot registered under the hash of
//!   the prefix's last block. So a prompt's state is kept at its last block boundary (a
//!   follow-up turn, which starts with the whole earlier prompt, resumes there) and at every
//!   chunk end of a long prompt (`max_num_batched_tokens` apart: a shared system prompt longer
//!   than one chunk is mostly skipped). Chunk ends rather than every block: one state weighs as
//!   much as thousands of KV positions.
//! - A sequence resumes from the deepest snapshot whose prefix hash its prompt reproduces and
//!   whose blocks are all cached; it computes the rest.
//!
//! Per step: copies `state_copies` (snapshot → live, parent → child) run before the forward
//! pass, `state_snapshots` (live → snapshot) after it; the snapshot slots read or written by
//! a step stay held until [`HybridStates::step_applied`] (written ones are published then),
//! or are dropped unpublished if the step is scheduled again without being applied.
//!
//! Invariants: a live slot has one holder; a published snapshot never changes; the pool's own
//! invariants ([`StatePool::check`]).

use super::SeqId;
use crate::block_pool::BlockHash;
use crate::state_pool::{SlotId, StatePool, StateStats};
use std::collections::HashMap;

/// See the module docs.
#[derive(Debug, Clone)]
pub(super) struct HybridStates {
    pool: StatePool,
    live: HashMap<SeqId, SlotId>,
    /// Snapshot slots the current step writes, with their prefix (published by
    /// `step_applied`).
    writing: Vec<(SlotId, BlockHash)>,
    /// Snapshots the current step copies from (held until `step_applied`).
    reading: Vec<SlotId>,
    /// Copies `(src, dst)` decided since the last output (forks), emitted with the next.
    pending_copies: Vec<(SlotId, SlotId)>,
}

impl HybridStates {
    pub fn new(pool: StatePool) -> Self {
        HybridStates {
            pool,
            live: HashMap::new(),
            writing: Vec::new(),
            reading: Vec::new(),
            pending_copies: Vec::new(),
        }
    }

    /// The live slot of `seq`, if it holds one.
    pub fn live(&self, seq: SeqId) -> Option<SlotId> {
        self.live.get(&seq).copied()
    }

    /// Whether a sequence can start now (a live slot is free, possibly by evicting a
    /// snapshot).
    pub fn can_start(&self) -> bool {
        self.pool.num_free() > 0
    }

    /// Whether a snapshot of the prefix ending with the block of hash `hash` exists.
    pub fn has_snapshot(&self, hash: BlockHash) -> bool {
        self.pool.has_snapshot(hash)
    }

    /// Gives `seq` a live slot, restored from the snapshot of `resume_from` when given
    /// (the copy goes into `copies`); `None` (nothing taken) when no slot is free or the
    /// snapshot is gone.
    pub fn start(
        &mut self,
        seq: SeqId,
        resume_from: Option<BlockHash>,
        copies: &mut Vec<(SlotId, SlotId)>,
    ) -> Option<SlotId> {
        let snapshot = match resume_from {
            Some(hash) => Some(self.pool.find_snapshot(hash)?),
            None => None,
        };
        let Some(slot) = self.pool.allocate_live() else {
            if let Some(s) = snapshot {
                self.pool.release(s);
            }
            return None;
        };
        if let Some(s) = snapshot {
            copies.push((s, slot));
            self.reading.push(s);
        }
        self.live.insert(seq, slot);
        Some(slot)
    }

    /// Gives `child` a live slot holding a copy of `parent`'s (copied before the next pass);
    /// `false` when the parent holds none or no slot is free.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> bool {
        let Some(src) = self.live(parent) else {
            return false;
        };
        let Some(dst) = self.pool.allocate_live() else {
            return false;
        };
        self.pending_copies.push((src, dst));
        self.live.insert(child, dst);
        true
    }

    /// Gives back `seq`'s live slot, if it holds one. Copies already decided stay (a later
    /// fork's copy may read a slot this one fills; a copy into a slot nobody holds is
    /// harmless, since copies run in order before the pass and whoever takes the slot next
    /// starts from zeros or from a copy that comes later).
    pub fn stop(&mut self, seq: SeqId) {
        if let Some(slot) = self.live.remove(&seq) {
            self.pool.release(slot);
        }
    }

    /// After a chunk that left `seq`'s state at the end of the prefix whose last block has
    /// hash `hash`: the copy `(live, snapshot)` to make after the pass, unless that prefix
    /// has a snapshot already or no slot is free.
    pub fn snapshot(&mut self, seq: SeqId, hash: BlockHash) -> Option<(SlotId, SlotId)> {
        let live = self.live(seq)?;
        if self.writing.iter().any(|&(_, h)| h == hash) {
            return None;
        }
        let slot = self.pool.begin_snapshot(hash)?;
        self.writing.push((slot, hash));
        Some((live, slot))
    }

    /// Starts a step: snapshot slots of a step that was never applied go back unpublished
    /// (their copies may not have run); returns the fork copies decided since the last step.
    pub fn begin_step(&mut self) -> Vec<(SlotId, SlotId)> {
        for (slot, _) in std::mem::take(&mut self.writing) {
            self.pool.release(slot);
        }
        for slot in std::mem::take(&mut self.reading) {
            self.pool.release(slot);
        }
        std::mem::take(&mut self.pending_copies)
    }

    /// The step ran: its snapshots are published, the ones it copied from released.
    pub fn step_applied(&mut self) {
        for (slot, hash) in std::mem::take(&mut self.writing) {
            self.pool.publish_snapshot(slot, hash);
        }
        for slot in std::mem::take(&mut self.reading) {
            self.pool.release(slot);
        }
    }

    pub fn stats(&self) -> StateStats {
        self.pool.stats()
    }

    /// `running` holds exactly the sequences with live slots, and the pool is consistent.
    pub fn check(&self, running: &[SeqId]) -> Result<(), String> {
        if running.len() != self.live.len() || running.iter().any(|s| !self.live.contains_key(s)) {
            return Err(format!(
                "{} running sequences but {} live state slots",
                running.len(),
                self.live.len()
            ));
        }
        self.pool.check()
    }
}
