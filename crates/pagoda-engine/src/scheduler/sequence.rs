//! One sequence as the scheduler sees it: its tokens (prompt + generated), how many of them
//! have their KV computed, and the blocks holding that KV.
//!
//! Invariants (between steps):
//! - waiting: `num_computed == 0`, no blocks, nothing in flight;
//! - running: `num_computed < tokens.len()` (there is always a token to feed) and
//!   `blocks.len() >= ceil((num_computed + in_flight + draft_in_flight) / block_size)`;
//! - `draft` holds proposals for the tokens after `tokens` (speculative decoding); they are
//!   never part of `tokens` until `update` accepts them, and never hashed or registered;
//! - `hashes` holds the chained hashes of the full blocks of `tokens` (when prefix caching is
//!   on), starting from `root` (the salt of its LoRA adapter, if any), and the first
//!   `num_registered` blocks were offered to the pool under them.

use super::SeqId;
use crate::block_pool::{chain_hash, salt_root, BlockHash, BlockId, BlockPool};
use std::time::Instant;

/// A sequence to schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqRequest {
    pub id: SeqId,
    pub prompt: Vec<u32>,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// The client chose `max_tokens`, so it predicts the output's length under
    /// [`Policy::Sjf`](super::Policy::Sjf); `false`: a front end filled it in, and the
    /// scheduler's running estimate predicts it instead (see [`super::predict`]).
    pub max_tokens_explicit: bool,
    /// Higher runs first under [`Policy::Priority`](super::Policy::Priority).
    pub priority: i32,
}

/// Where a sequence is in the scheduler's lifecycle (vLLM's request status): queued without
/// KV, or admitted and holding blocks. A sequence that ended is no longer held at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    /// Queued (new, or preempted and to be recomputed); holds no blocks.
    Waiting,
    /// Admitted: scheduled every step until it ends or is preempted.
    Running,
}

/// A read-only view of one sequence (tests, stats, debugging).
#[derive(Debug, Clone, Copy)]
pub struct SeqInfo<'a> {
    pub id: SeqId,
    /// Prompt followed by the generated tokens.
    pub tokens: &'a [u32],
    pub prompt_len: usize,
    /// Tokens whose KV is in the cache.
    pub num_computed: usize,
    pub block_table: &'a [BlockId],
    pub state: SeqStatus,
    pub priority: i32,
    /// Times this sequence was preempted.
    pub preemptions: u32,
}

impl SeqInfo<'_> {
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len.min(self.tokens.len())..]
    }
}

#[derive(Debug, Clone)]
pub(super) struct Sequence {
    pub id: SeqId,
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub max_tokens: usize,
    pub max_tokens_explicit: bool,
    pub priority: i32,
    pub arrival: Instant,
    /// Arrival order: larger is newer (forks get a fresh one).
    pub order: u64,
    pub num_computed: usize,
    /// Tokens scheduled by the latest `schedule` and not yet applied by `update`.
    pub in_flight: usize,
    /// Proposed (draft) tokens scheduled after the `in_flight` ones, to be verified.
    pub draft_in_flight: usize,
    /// Proposals for the next step (speculative decoding); cleared when scheduled.
    pub draft: Vec<u32>,
    pub blocks: Vec<BlockId>,
    pub hashes: Vec<BlockHash>,
    pub num_registered: usize,
    pub state: SeqStatus,
    pub preemptions: u32,
    /// Parent hash of the first block (`None`: unsalted); see [`salt_root`].
    pub root: Option<BlockHash>,
    /// The salt `root` came from (0: none), passed on to forks.
    pub salt: u64,
}

impl Sequence {
    pub fn new(req: SeqRequest, arrival: Instant, order: u64) -> Self {
        Sequence {
            id: req.id,
            prompt_len: req.prompt.len(),
            tokens: req.prompt,
            max_tokens: req.max_tokens,
            max_tokens_explicit: req.max_tokens_explicit,
            priority: req.priority,
            arrival,
            order,
            num_computed: 0,
            in_flight: 0,
            draft_in_flight: 0,
            draft: Vec::new(),
            blocks: Vec::new(),
            hashes: Vec::new(),
            num_registered: 0,
            state: SeqStatus::Waiting,
            preemptions: 0,
            root: None,
            salt: 0,
        }
    }

    /// Salts the block hash chain (before any hash is computed).
    pub fn set_salt(&mut self, salt: u64) {
        debug_assert!(self.hashes.is_empty());
        self.salt = salt;
        self.root = salt_root(salt);
    }

    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Tokens still to compute before the next sample.
    pub fn to_compute(&self) -> usize {
        self.tokens.len().saturating_sub(self.num_computed)
    }

    /// Hashes every full block of `tokens` not hashed yet.
    pub fn extend_hashes(&mut self, block_size: usize) {
        while (self.hashes.len() + 1) * block_size <= self.tokens.len() {
            let k = self.hashes.len();
            let block = &self.tokens[k * block_size..(k + 1) * block_size];
            let parent = self.hashes.last().copied().or(self.root);
            self.hashes.push(chain_hash(parent, block));
        }
    }

    /// Offers every full computed block not offered yet to the prefix cache.
    pub fn register_full_blocks(&mut self, pool: &mut BlockPool) {
        let full = (self.num_computed / pool.block_size())
            .min(self.blocks.len())
            .min(self.hashes.len());
        for k in self.num_registered..full {
            pool.register(self.blocks[k], self.hashes[k]);
        }
        self.num_registered = self.num_registered.max(full);
    }

    /// Returns every block to the pool, last first (so a prefix's later blocks are evicted
    /// before its earlier ones), and forgets the computed KV.
    pub fn release_blocks(&mut self, pool: &mut BlockPool) {
        for &b in self.blocks.iter().rev() {
            pool.release(b);
        }
        self.blocks.clear();
        self.num_computed = 0;
        self.in_flight = 0;
        self.draft_in_flight = 0;
        self.draft.clear();
        self.num_registered = 0;
    }

    pub fn info(&self) -> SeqInfo<'_> {
        SeqInfo {
            id: self.id,
            tokens: &self.tokens,
            prompt_len: self.prompt_len,
            num_computed: self.num_computed,
            block_table: &self.blocks,
            state: self.state,
            priority: self.priority,
            preemptions: self.preemptions,
        }
    }
}
