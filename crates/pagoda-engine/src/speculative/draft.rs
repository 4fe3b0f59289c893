//! Draft-model proposals: a smaller model with the target's tokenizer runs `k` greedy decode
//! steps per sequence (all sequences of a step batched in one forward pass per draft
//! position) and proposes what it generated.
//!
//! The draft keeps its own paged KV cache (the draft model's shape differs from the target's)
//! with a block table per sequence, its blocks handed out by a [`BlockPool`] — the same
//! allocator type as the target's, without prefix caching (the draft's KV is rolled back in
//! place, so it is never shared). What its cache holds for a sequence is remembered as the
//! token ids fed (`fed`); before proposing, the longest common prefix of `fed` and the
//! sequence's tokens is kept and the rest is recomputed — this is the draft's KV rollback
//! after rejected proposals (and it also copes with preemption).
//!
//! Invariants: `fed.len()` positions of a sequence's draft KV are valid and covered by its
//! blocks; every block is held by exactly one sequence's table (ref count 1) or free in the
//! pool; a sequence that cannot get blocks gets no proposal (decoding goes on without
//! speculation), never an error.

use crate::block_pool::{BlockId, BlockPool};
use crate::EngineError;
use pagoda_model::arch::{BatchSegment, Logits, Model};
use pagoda_model::tokenizer::Tokenizer;
use pagoda_model::{KvDtype, PagedKvCache};
use std::collections::HashMap;
use std::sync::Arc;

use crate::scheduler::SeqId;

/// Positions per block of the draft's cache.
const BLOCK_SIZE: usize = 16;

/// What the draft's cache holds for one sequence.
#[derive(Debug, Default)]
struct DraftSeq {
    blocks: Vec<BlockId>,
    fed: Vec<u32>,
}

/// A draft model with its own KV cache. See the module docs.
pub struct DraftProposer {
    model: Arc<Model>,
    cache: PagedKvCache,
    pool: BlockPool,
    seqs: HashMap<SeqId, DraftSeq>,
}

impl std::fmt::Debug for DraftProposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftProposer")
            .field("blocks", &self.cache.n_blocks())
            .field("free", &self.pool.num_free())
            .field("seqs", &self.seqs.len())
            .finish()
    }
}

/// One sequence to propose for: its tokens so far and how many proposals it wants.
#[derive(Debug, Clone, Copy)]
pub struct DraftQuery<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub k: usize,
}

impl DraftProposer {
    /// A proposer over `model` whose cache holds `capacity_tokens` positions in all.
    ///
    /// Errors when the draft's tokenizer is not the target's (same size, same token at every
    /// id): proposals are token ids, so they would mean other text.
    pub fn new(
        model: Arc<Model>,
        draft_tokenizer: &Tokenizer,
        target_tokenizer: &Tokenizer,
        capacity_tokens: usize,
    ) -> Result<Self, EngineError> {
        check_same_vocabulary(draft_tokenizer, target_tokenizer)?;
        let n_blocks = capacity_tokens.div_ceil(BLOCK_SIZE).max(2);
        let cache = model.try_new_paged_cache(n_blocks, BLOCK_SIZE, KvDtype::default())?;
        Ok(DraftProposer {
            model,
            cache,
            pool: BlockPool::new(n_blocks, BLOCK_SIZE, false),
            seqs: HashMap::new(),
        })
    }

    /// Greedy proposals for every query (at most `k` each; fewer when the draft's context or
    /// cache runs out). One batched forward pass per draft position.
    pub fn propose(
        &mut self,
        queries: &[DraftQuery<'_>],
    ) -> Result<HashMap<SeqId, Vec<u32>>, EngineError> {
        let ctx = self.model.config().context_length;
        let mut out: HashMap<SeqId, Vec<u32>> = HashMap::new();
        // Per active query: the tokens to feed next (the uncached tail, then one proposal).
        let mut active: Vec<(SeqId, Vec<u32>, usize)> = Vec::new();
        for q in queries {
            if q.k == 0 || q.tokens.is_empty() || q.tokens.len() + q.k > ctx {
                continue;
            }
            let state = self.seqs.entry(q.seq).or_default();
            // Keep the common prefix, leaving at least one token to feed.
            let keep = common_prefix(&state.fed, q.tokens).min(q.tokens.len() - 1);
            state.fed.truncate(keep);
            let feed = q.tokens[keep..].to_vec();
            if !self.reserve(q.seq, q.tokens.len() + q.k - 1) {
                self.release(q.seq);
                continue;
            }
            out.insert(q.seq, Vec::with_capacity(q.k));
            active.push((q.seq, feed, q.k));
        }
        while !active.is_empty() {
            let segments: Vec<BatchSegment<'_>> = active
                .iter()
                .map(|(seq, feed, _)| {
                    let s = &self.seqs[seq];
                    BatchSegment {
                        tokens: feed,
                        start: s.fed.len(),
                        block_table: &s.blocks,
                        logits: Some(Logits::Last),
                        // The draft proposes with its own weights only; the target verifies
                        // under the request's adapter.
                        adapter: None,
                        state_slot: None,
                    }
                })
                .collect();
            let logits = self.model.forward_batch(&segments, &mut self.cache)?;
            let vocab = self.model.config().vocab_size;
            let mut next = Vec::with_capacity(active.len());
            for (i, (seq, feed, k)) in active.into_iter().enumerate() {
                let row = &logits[i * vocab..(i + 1) * vocab];
                let token = argmax(row);
                if let Some(s) = self.seqs.get_mut(&seq) {
                    s.fed.extend_from_slice(&feed);
                }
                let proposed = out.entry(seq).or_default();
                proposed.push(token);
                if proposed.len() < k {
                    next.push((seq, vec![token], k));
                }
            }
            active = next;
        }
        Ok(out)
    }

    /// How many of `tokens` the draft's cache does not hold for `seq` (all of them for a new
    /// sequence): what its next proposal feeds before its own first proposal. One or two on a
    /// steady decode step; the whole prompt on a sequence's first.
    pub fn uncached(&self, seq: SeqId, tokens: &[u32]) -> usize {
        let cached = self
            .seqs
            .get(&seq)
            .map_or(0, |s| common_prefix(&s.fed, tokens));
        tokens.len() - cached
    }

    /// Forgets sequence `seq` and frees its draft KV.
    pub fn release(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.remove(&seq) {
            for &b in s.blocks.iter().rev() {
                self.pool.release(b);
            }
        }
    }

    /// Grows `seq`'s blocks to cover `positions`; `false` when the cache is full.
    fn reserve(&mut self, seq: SeqId, positions: usize) -> bool {
        let want = positions.div_ceil(BLOCK_SIZE);
        let Some(s) = self.seqs.get_mut(&seq) else {
            return false;
        };
        while s.blocks.len() < want {
            match self.pool.allocate() {
                Some(b) => s.blocks.push(b),
                None => return false,
            }
        }
        true
    }

    /// Blocks not held by any sequence (tests).
    pub fn free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    /// Checks the draft's books: the pool's own invariants, and every block held by exactly
    /// one sequence, covering what it was fed. `Err` names the first one broken.
    pub fn check(&self) -> Result<(), String> {
        self.pool.check()?;
        let mut held = vec![0u32; self.pool.num_blocks()];
        for (seq, s) in &self.seqs {
            if s.blocks.len() < s.fed.len().div_ceil(BLOCK_SIZE) {
                return Err(format!(
                    "draft sequence {seq}'s blocks do not cover what it was fed"
                ));
            }
            for &b in &s.blocks {
                let r = held
                    .get_mut(b as usize)
                    .ok_or_else(|| format!("draft sequence {seq} holds unknown block {b}"))?;
                *r += 1;
            }
        }
        for (b, &r) in held.iter().enumerate() {
            let have = self.pool.ref_count(b as BlockId);
            if have != r || r > 1 {
                return Err(format!(
                    "draft block {b}: ref count {have}, held by {r} tables"
                ));
            }
        }
        Ok(())
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// First index of the largest value (ties: lowest id, as greedy sampling picks).
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Errors unless both tokenizers map every id to the same token.
pub fn check_same_vocabulary(draft: &Tokenizer, target: &Tokenizer) -> Result<(), EngineError> {
    let (d, t) = (draft.vocab_size(), target.vocab_size());
    if d != t {
        return Err(EngineError::InvalidConfig(format!(
            "the draft model's vocabulary has {d} tokens but the target's has {t}; speculative \
             decoding needs a draft with the target's tokenizer (e.g. a smaller model of the \
             same family)"
        )));
    }
    if let Some(id) = (0..t as u32).find(|&id| draft.id_to_token(id) != target.id_to_token(id)) {
        return Err(EngineError::InvalidConfig(format!(
            "the draft model's token {id} is {:?} but the target's is {:?}; speculative decoding \
             needs a draft with the target's tokenizer",
            draft.id_to_token(id).unwrap_or_default(),
            target.id_to_token(id).unwrap_or_default()
        )));
    }
    Ok(())
}
