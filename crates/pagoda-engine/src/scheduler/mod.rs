//! The scheduler: decides, every step, which sequences run and which of their tokens, and owns
//! the block pool that says where their KV lives. Pure bookkeeping — it never touches tensors.
//!
//! One step (vLLM V1 / nano-vllm shape): [`Scheduler::schedule`] → [`SchedulerOutput`] (plain
//! data) → the runner copies `copies` and runs every chunk in one forward pass → the engine
//! samples one token per chunk with `sample` → [`Scheduler::update`]. There is no prefill
//! phase: a sequence has `num_computed` tokens with KV, and a step gives it some of the rest.
//!
//! Each step:
//! 1. **Running** sequences first, best first (policy rank, then arrival): each gets the rest of
//!    its tokens, capped by what is left of `max_num_batched_tokens` (a decode is one token, a
//!    chunked prefill continues). Blocks are allocated as writes cross into new blocks; before a
//!    write into a block shared with another sequence (ref > 1, after a fork) or findable in
//!    the prefix cache, the block is copied (copy-on-write). Out of blocks → the worst running sequence (lowest effective
//!    priority, then newest) is **preempted by recompute**: blocks released, `num_computed = 0`,
//!    back to the front of the waiting queue with its generated tokens kept. If the worst is the
//!    one asking, it preempts itself. The best running sequence is never preempted (it can take
//!    every block), so every step makes progress.
//! 2. **Waiting** sequences, in policy order (under [`Policy::Sjf`], shortest predicted job
//!    first: prompt left plus expected output, [`predict`]), while the budget, `max_num_seqs` running and free
//!    blocks allow — but not in a step that had to preempt. Under [`BatchingMode::Static`]
//!    admission happens only when nothing was running, and then gathers a whole wave: up to
//!    `max_num_seqs` sequences whose prompts all fit in the free blocks, whatever this step's
//!    token budget (those without a chunk now prefill in the next steps). On admission the longest cached prefix of full blocks is
//!    reused (never all tokens: at least one is computed so there are logits). The queue is
//!    head-of-line: the first sequence that does not fit stops admission.
//!
//! After the forward pass, `update` advances `num_computed`, registers newly full blocks in
//! the prefix cache, appends sampled tokens and ends sequences on `max_tokens`
//! ([`SeqEnd::Length`]) or on `max_model_len` / the whole pool's capacity
//! ([`SeqEnd::ContextFull`]), freeing their blocks. Only `update` and `finish` end sequences.
//!
//! `n > 1` choices: after the `update` that appended the parent's first token, the engine
//! calls [`Scheduler::fork`] per extra choice; the child shares the parent's prompt blocks and
//! copies the shared partial block on its first write into it (copy-on-write; `copies` of the
//! next output, to run in order before the forward pass).
//!
//! Invariants ([`Scheduler::check_invariants`], asserted after every call in debug builds):
//! every sequence is in exactly one of `running`/`waiting`; waiting ones hold no blocks; each
//! block's ref count equals the number of block tables holding it; a running table covers
//! `num_computed + in_flight` positions; no sequence is longer than `max_model_len` or than
//! the pool holds, nor has generated more than `max_tokens`; the pool's own invariants.

mod error;
mod policy;
pub mod predict;
mod sequence;
mod states;

pub use crate::block_pool::BlockId;
pub use error::SchedulerError;
pub use policy::{BatchingMode, Policy};
pub use sequence::{SeqInfo, SeqRequest, SeqStatus};

use crate::block_pool::{BlockPool, PoolStats};
use crate::state_pool::{SlotId, StatePool, StateStats};
use predict::OutputEstimate;
use sequence::Sequence;
use states::HybridStates;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

/// Identifies one sequence (one choice of one request) inside the scheduler.
pub type SeqId = u64;

/// How the scheduler batches.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Most tokens (decode tokens + prefill chunk tokens) in one step.
    pub max_num_batched_tokens: usize,
    /// Most running sequences (and so most chunks in one step).
    pub max_num_seqs: usize,
    pub policy: Policy,
    pub mode: BatchingMode,
    /// Positions a sequence may occupy (the model's context, possibly lowered).
    pub max_model_len: usize,
    /// Rank gained per second since arrival (see [`Policy`]); 0 disables aging.
    pub aging_per_sec: f64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_num_batched_tokens: 512,
            max_num_seqs: 64,
            policy: Policy::Fcfs,
            mode: BatchingMode::Continuous,
            max_model_len: 2048,
            aging_per_sec: 1.0,
        }
    }
}

impl SchedulerConfig {
    /// Checks the limits; [`Scheduler::new`] clamps values this rejects.
    pub fn validate(&self) -> Result<(), SchedulerError> {
        let bad = |m: &str| Err(SchedulerError::InvalidConfig(m.to_string()));
        if self.max_num_batched_tokens == 0 {
            return bad("max_num_batched_tokens must be at least 1");
        }
        if self.max_num_seqs == 0 {
            return bad("max_num_seqs must be at least 1");
        }
        if self.max_model_len < 2 {
            return bad("max_model_len must be at least 2 (one prompt token and one generated)");
        }
        if !self.aging_per_sec.is_finite() || self.aging_per_sec < 0.0 {
            return bad("aging_per_sec must be a finite number >= 0");
        }
        Ok(())
    }
}

/// One sequence's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledChunk {
    pub seq: SeqId,
    /// Position of `tokens[0]`; positions before it are already in the cache.
    pub start: usize,
    pub tokens: Vec<u32>,
    /// The sequence's whole block table; covers positions `0..start + tokens.len()`.
    pub block_table: Vec<BlockId>,
    /// The chunk ends at the sequence's last known token: sample one token from its last row
    /// (from each of its last `num_draft + 1` rows when it carries proposals).
    pub sample: bool,
    /// Speculative decoding: the last `num_draft` of `tokens` are proposals that follow the
    /// sequence's last known token, to be verified against the rows before them. Their KV is
    /// written but counts only once `update` accepts them. Always 0 unless `sample`.
    pub num_draft: usize,
    /// A hybrid model's recurrent-state slot this chunk continues and updates (`None` for
    /// transformers).
    pub state_slot: Option<SlotId>,
}

impl ScheduledChunk {
    /// Rows of logits this chunk needs: `num_draft + 1` when it samples, else none.
    pub fn sample_rows(&self) -> usize {
        if self.sample {
            self.num_draft + 1
        } else {
            0
        }
    }

    /// The proposals this chunk verifies (empty without speculation).
    pub fn draft(&self) -> &[u32] {
        &self.tokens[self.tokens.len() - self.num_draft..]
    }
}

/// What one step runs. Plain data for the runner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    pub chunks: Vec<ScheduledChunk>,
    /// Copy-on-write block copies `(src, dst)`, to run before the forward pass.
    pub copies: Vec<(BlockId, BlockId)>,
    /// Sequences preempted this step (back to waiting; they will recompute).
    pub preempted: Vec<SeqId>,
    /// Sequences that ended without running, nothing held: children whose forked first token
    /// already completed them (same reason their parent ended with). The engine must end them
    /// even if `chunks` is empty. Every other end comes from `update`.
    pub ended: Vec<(SeqId, SeqEnd)>,
    /// Sum of `chunks[i].tokens.len()`.
    pub num_batched_tokens: usize,
    /// Recurrent-state slot copies `(src, dst)` to run before the forward pass (a hybrid
    /// model: a prefix snapshot into a resuming sequence's slot, a parent's state into its
    /// fork's).
    pub state_copies: Vec<(SlotId, SlotId)>,
    /// Recurrent-state slot copies `(live, snapshot)` to run after the forward pass: prefix
    /// snapshots (`states.rs`).
    pub state_snapshots: Vec<(SlotId, SlotId)>,
}

/// Why a sequence left the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqEnd {
    /// `max_tokens` generated.
    Length,
    /// `max_model_len` reached, or the whole KV cache cannot hold one more token of it.
    ContextFull,
    /// Aborted by the client (or the engine, on an error).
    Aborted,
    /// The engine decided it is done (EOS, stop token or string).
    Stopped,
}

/// Counters and gauges of the scheduler.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SchedulerStats {
    pub running: usize,
    pub waiting: usize,
    pub preempted_total: u64,
    /// `schedule` calls.
    pub steps: u64,
    /// `num_batched_tokens` of the latest step.
    pub tokens_last_step: usize,
    pub pool: PoolStats,
    /// Tokens of sequences admitted (each admission counts, including after preemption).
    pub prefix_queried_tokens: u64,
    /// Of those, tokens whose KV came from the prefix cache.
    pub prefix_hit_tokens: u64,
    /// A hybrid model's recurrent-state slots (`None` for transformers).
    pub states: Option<StateStats>,
}

impl SchedulerStats {
    /// Share of admitted tokens served by the prefix cache (0 before any admission).
    pub fn prefix_hit_rate(&self) -> f64 {
        if self.prefix_queried_tokens == 0 {
            0.0
        } else {
            self.prefix_hit_tokens as f64 / self.prefix_queried_tokens as f64
        }
    }
}

/// Continuous-batching scheduler over one [`BlockPool`]. See the module docs.
#[derive(Debug, Clone)]
pub struct Scheduler {
    config: SchedulerConfig,
    pool: BlockPool,
    seqs: HashMap<SeqId, Sequence>,
    /// Running sequences; sorted best first at the start of every step.
    running: Vec<SeqId>,
    waiting: VecDeque<SeqId>,
    /// Children that were complete when forked (their first token already reached
    /// `max_tokens` or the context): hold nothing, reported in the next output's `ended`.
    pending_ends: Vec<(SeqId, SeqEnd)>,
    /// A hybrid model's recurrent-state slots (`states.rs`); `None` for transformers.
    states: Option<HybridStates>,
    /// Sequences the latest `update` ended, kept until the next `schedule` so that the
    /// engine may still fork from them.
    just_ended: HashMap<SeqId, ForkSource>,
    next_order: u64,
    preempted_total: u64,
    steps: u64,
    tokens_last_step: usize,
    prefix_queried_tokens: u64,
    prefix_hit_tokens: u64,
    /// Output length of sequences without an explicit `max_tokens`, learned as they end.
    output_estimate: OutputEstimate,
}

impl Scheduler {
    /// A scheduler over `pool`. Limits that [`SchedulerConfig::validate`] rejects are clamped
    /// (token budget and sequence cap to at least 1, aging to a finite value >= 0).
    pub fn new(mut config: SchedulerConfig, pool: BlockPool) -> Self {
        config.max_num_batched_tokens = config.max_num_batched_tokens.max(1);
        config.max_num_seqs = config.max_num_seqs.max(1);
        if !config.aging_per_sec.is_finite() || config.aging_per_sec < 0.0 {
            config.aging_per_sec = 0.0;
        }
        Scheduler {
            config,
            pool,
            seqs: HashMap::new(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            pending_ends: Vec::new(),
            states: None,
            just_ended: HashMap::new(),
            next_order: 0,
            preempted_total: 0,
            steps: 0,
            tokens_last_step: 0,
            prefix_queried_tokens: 0,
            prefix_hit_tokens: 0,
            output_estimate: OutputEstimate::default(),
        }
    }

    /// This scheduler for a hybrid model: every running sequence holds a recurrent-state
    /// slot of `states`, and with prefix caching prefixes resume from state snapshots
    /// (`states.rs`).
    pub fn with_states(mut self, states: StatePool) -> Self {
        self.states = Some(HybridStates::new(states));
        self
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The running estimate of output tokens that predicts the length of sequences without
    /// an explicit `max_tokens` under [`Policy::Sjf`] (see [`predict`]).
    pub fn output_estimate(&self) -> OutputEstimate {
        self.output_estimate
    }

    /// Queues a new sequence (at the back of the waiting queue). The request must be one the
    /// engine has checked (a non-empty prompt that fits the context and the KV pool, at least
    /// one output token): the scheduler only `debug_assert`s that. The error is for an id
    /// already held.
    pub fn add(&mut self, req: SeqRequest, now: Instant) -> Result<(), SchedulerError> {
        self.add_with_salt(req, 0, now)
    }

    /// [`add`](Self::add) with the sequence's prefix-cache hashes salted by `salt` (0: none):
    /// sequences share cached blocks only with sequences of the same salt (a LoRA adapter's
    /// identity: KV computed under one adapter is wrong under another). Forks inherit it.
    pub fn add_with_salt(
        &mut self,
        req: SeqRequest,
        salt: u64,
        now: Instant,
    ) -> Result<(), SchedulerError> {
        debug_assert!(
            self.admissible(&req),
            "the scheduler takes checked requests (EngineCore::validate): {} prompt tokens, \
             max_tokens {}",
            req.prompt.len(),
            req.max_tokens
        );
        if self.holds(req.id) {
            return Err(SchedulerError::DuplicateId { id: req.id });
        }
        let id = req.id;
        let mut seq = Sequence::new(req, now, self.next_order);
        seq.set_salt(salt);
        self.next_order += 1;
        if self.pool.prefix_caching() {
            seq.extend_hashes(self.pool.block_size());
        }
        self.seqs.insert(id, seq);
        self.waiting.push_back(id);
        self.debug_check();
        Ok(())
    }

    /// Whether a request is within what the scheduler can run: a non-empty prompt shorter
    /// than `max_model_len` that fits the whole KV pool, and at least one output token.
    /// The engine refuses anything else, with the error a client reads, before it gets here
    /// (`EngineCore::validate`, once per request); the scheduler only asserts it.
    fn admissible(&self, req: &SeqRequest) -> bool {
        !req.prompt.is_empty()
            && req.max_tokens > 0
            && req.prompt.len() < self.config.max_model_len
            && self.pool.blocks_for(req.prompt.len()) <= self.pool.num_blocks()
    }

    /// Plans one step. See the module docs for the order of decisions.
    pub fn schedule(&mut self, now: Instant) -> SchedulerOutput {
        self.steps += 1;
        self.just_ended.clear();
        let mut out = SchedulerOutput {
            ended: std::mem::take(&mut self.pending_ends),
            state_copies: self
                .states
                .as_mut()
                .map(HybridStates::begin_step)
                .unwrap_or_default(),
            ..SchedulerOutput::default()
        };
        let mut budget = self.config.max_num_batched_tokens;
        let nothing_ran = self.running.is_empty();
        // Work scheduled before but never applied (no `update`) is scheduled again.
        for id in &self.running {
            if let Some(s) = self.seqs.get_mut(id) {
                s.in_flight = 0;
                s.draft_in_flight = 0;
            }
        }
        policy::sort_running(
            self.config.aging_per_sec,
            now,
            &self.seqs,
            &mut self.running,
        );

        let mut i = 0;
        while i < self.running.len() {
            if out.chunks.len() >= self.config.max_num_seqs || budget == 0 {
                break;
            }
            let id = self.running[i];
            let Some(seq) = self.seqs.get(&id) else {
                debug_assert!(false, "running id {id} without a sequence");
                self.running.remove(i);
                continue;
            };
            // `update` ends a sequence before it outgrows the pool, so `n` always fits.
            let n = self.chunk_len(seq, seq.num_computed, seq.to_compute().min(budget));
            if n == 0 {
                i += 1;
                continue;
            }
            let k = self.draft_room(seq, n, budget);
            let mut preempted_self = false;
            while self.pool.num_free() < self.blocks_needed(id, n + k) {
                let Some(victim) = self.running.pop() else {
                    break;
                };
                self.preempt(victim, &mut out);
                if victim == id {
                    preempted_self = true;
                    break;
                }
            }
            if preempted_self {
                break;
            }
            if self.grow(id, n + k, &mut out.copies) {
                if let Some(chunk) = self.make_chunk(id, n, k, &mut out.state_snapshots) {
                    out.chunks.push(chunk);
                    budget -= n + k;
                }
            }
            i += 1;
        }

        let may_admit = out.preempted.is_empty()
            && (self.config.mode == BatchingMode::Continuous || nothing_ran);
        if may_admit && !self.waiting.is_empty() {
            self.admit(now, &mut budget, &mut out);
        }
        out.num_batched_tokens = out.chunks.iter().map(|c| c.tokens.len()).sum();
        self.tokens_last_step = out.num_batched_tokens;
        debug_assert!(out.num_batched_tokens <= self.config.max_num_batched_tokens);
        debug_assert!(out.chunks.len() <= self.config.max_num_seqs);
        self.debug_check();
        out
    }

    /// Applies a step after its forward pass: every chunk's tokens are now computed; chunks
    /// with `sample` get their token from `sampled` (one `(seq, token)` each). Returns the
    /// sequences that ended, blocks freed: `Length` at `max_tokens`, `ContextFull` at
    /// `max_model_len` or when the whole pool could not hold one more token, `Aborted` for a
    /// sampling chunk with no token in `sampled`. Chunks of sequences finished or preempted
    /// since `schedule` are ignored.
    pub fn update(
        &mut self,
        out: &SchedulerOutput,
        sampled: &[(SeqId, u32)],
    ) -> Vec<(SeqId, SeqEnd)> {
        let sampled: Vec<(SeqId, Vec<u32>)> = sampled.iter().map(|&(s, t)| (s, vec![t])).collect();
        self.update_speculative(out, &sampled)
    }

    /// [`Scheduler::update`] for steps whose chunks may carry proposals: each sampling chunk
    /// gets its new tokens from `sampled` — the accepted proposals (a prefix of
    /// [`ScheduledChunk::draft`]) followed by one token sampled after them. The KV of the
    /// accepted proposals is kept; that of the rejected ones is rolled back (their positions
    /// are no longer computed and the blocks only they used go back to the pool). Tokens past
    /// the first one that does not match the proposals are ignored.
    pub fn update_speculative(
        &mut self,
        out: &SchedulerOutput,
        sampled: &[(SeqId, Vec<u32>)],
    ) -> Vec<(SeqId, SeqEnd)> {
        let mut ended = Vec::new();
        let bs = self.pool.block_size();
        let caching = self.pool.prefix_caching();
        let tokens: HashMap<SeqId, &[u32]> =
            sampled.iter().map(|(s, t)| (*s, t.as_slice())).collect();
        if let Some(states) = &mut self.states {
            states.step_applied();
        }
        for chunk in &out.chunks {
            let Some(seq) = self.seqs.get_mut(&chunk.seq) else {
                continue;
            };
            let n = chunk.tokens.len() - chunk.num_draft;
            if seq.state != SeqStatus::Running
                || seq.num_computed != chunk.start
                || seq.in_flight != n
                || seq.draft_in_flight != chunk.num_draft
                || seq.num_computed + n > seq.tokens.len()
            {
                continue;
            }
            seq.num_computed += n;
            seq.in_flight = 0;
            seq.draft_in_flight = 0;
            if !chunk.sample || seq.num_computed != seq.tokens.len() {
                seq.register_full_blocks(&mut self.pool);
                continue;
            }
            let new = match tokens.get(&chunk.seq) {
                Some(t) if !t.is_empty() => *t,
                _ => {
                    // Nobody sampled it: it would wait forever with nothing to compute.
                    ended.push((chunk.seq, SeqEnd::Aborted));
                    continue;
                }
            };
            // Proposals count only up to the first mismatch; one token follows them.
            let accepted = new
                .iter()
                .zip(chunk.draft())
                .take_while(|(a, b)| a == b)
                .count()
                .min(new.len() - 1);
            seq.num_computed += accepted;
            seq.tokens.extend_from_slice(&new[..=accepted]);
            if chunk.num_draft > accepted {
                // Roll back: blocks past the computed positions held only rejected proposals.
                let keep = self.pool.blocks_for(seq.num_computed);
                for b in seq.blocks.drain(keep..).rev() {
                    self.pool.release(b);
                }
            }
            if caching {
                seq.extend_hashes(bs);
            }
            seq.register_full_blocks(&mut self.pool);
            if let Some(end) = end_reason(&self.config, &self.pool, seq) {
                ended.push((chunk.seq, end));
            }
        }
        for &(id, end) in &ended {
            if let Some(s) = self.seqs.get(&id) {
                self.output_estimate
                    .observe(end, s.generated(), s.max_tokens_explicit);
                if end != SeqEnd::Aborted {
                    self.just_ended.insert(id, ForkSource::of(s));
                }
            }
            self.remove(id);
        }
        self.debug_check();
        ended
    }

    /// Gives running sequence `id` proposals for the tokens after its last one (speculative
    /// decoding). The next `schedule` appends as many as fit to its decode chunk and
    /// consumes them; they are dropped if the sequence is not decoding then. `false` if `id`
    /// is not running.
    pub fn propose(&mut self, id: SeqId, draft: Vec<u32>) -> bool {
        match self.seqs.get_mut(&id) {
            Some(s) if s.state == SeqStatus::Running => {
                s.draft = draft;
                true
            }
            _ => false,
        }
    }

    /// Removes sequence `id` from any state now, freeing its blocks (EOS or a stop string:
    /// [`SeqEnd::Stopped`]; a client abort: [`SeqEnd::Aborted`]). `false` if the scheduler
    /// does not hold it (unknown, or already ended).
    pub fn finish(&mut self, id: SeqId, end: SeqEnd) -> bool {
        let found = if let Some(k) = self.pending_ends.iter().position(|&(p, _)| p == id) {
            self.pending_ends.remove(k);
            true
        } else {
            if let Some(s) = self.seqs.get(&id) {
                self.output_estimate
                    .observe(end, s.generated(), s.max_tokens_explicit);
            }
            self.remove(id)
        };
        if found {
            tracing::trace!(seq = id, ?end, "sequence finished");
        }
        self.debug_check();
        found
    }

    /// Starts `child` as another choice of `parent` (`n > 1`): the parent's prompt followed by
    /// the child's own `first_token`, sampled from the same prompt logits.
    ///
    /// Call after the `update` that appended the parent's first token. A running parent
    /// shares its prompt blocks (ref +1): the child starts with `num_computed = prompt len`
    /// and copies the shared partial block on its first write (copy-on-write, in the next
    /// output's `copies`). A parent that `update` just ended (its first token reached
    /// `max_tokens` or the context) or that is waiting after a preemption shares nothing: the
    /// child recomputes its prompt, or — if its first token already completes it — holds
    /// nothing and is reported ended (same reason) in the next output's `ended`.
    pub fn fork(
        &mut self,
        parent: SeqId,
        child: SeqId,
        first_token: u32,
    ) -> Result<(), SchedulerError> {
        if self.holds(child) {
            return Err(SchedulerError::DuplicateId { id: child });
        }
        // Whether the parent has computed exactly its prompt (a hybrid's state is then the
        // prompt's, which the child continues).
        let mut at_prompt_end = false;
        let (source, shared) = if let Some(p) = self.seqs.get(&parent) {
            at_prompt_end = p.state == SeqStatus::Running && p.num_computed == p.prompt_len;
            let prompt_done = match p.state {
                SeqStatus::Running => p.in_flight == 0 && p.num_computed >= p.prompt_len,
                SeqStatus::Waiting => p.generated() > 0,
            };
            if !prompt_done {
                return Err(SchedulerError::ForkNotReady { id: parent });
            }
            let shared = match p.state {
                SeqStatus::Running => p
                    .blocks
                    .get(..self.pool.blocks_for(p.prompt_len))
                    .ok_or(SchedulerError::ForkNotReady { id: parent })?
                    .to_vec(),
                SeqStatus::Waiting => Vec::new(),
            };
            (ForkSource::of(p), shared)
        } else if let Some(src) = self.just_ended.get(&parent) {
            (src.clone(), Vec::new())
        } else {
            return Err(SchedulerError::UnknownSequence { id: parent });
        };
        let mut prompt = source.prompt;
        prompt.push(first_token);
        let mut c = Sequence::new(
            SeqRequest {
                id: child,
                prompt,
                max_tokens: source.max_tokens,
                max_tokens_explicit: source.max_tokens_explicit,
                priority: source.priority,
            },
            source.arrival,
            self.next_order,
        );
        self.next_order += 1;
        c.set_salt(source.salt);
        c.prompt_len = source.prompt_len;
        if let Some(end) = end_reason(&self.config, &self.pool, &c) {
            self.output_estimate
                .observe(end, c.generated(), c.max_tokens_explicit);
            self.pending_ends.push((child, end));
            self.debug_check();
            return Ok(());
        }
        if self.pool.prefix_caching() {
            c.extend_hashes(self.pool.block_size());
        }
        // A hybrid child continues from a copy of its parent's state (only while that is the
        // prompt's), or recomputes.
        let forked = match &mut self.states {
            Some(states) => at_prompt_end && !shared.is_empty() && states.fork(parent, child),
            None => true,
        };
        let shared = if forked { shared } else { Vec::new() };
        if shared.is_empty() {
            self.waiting.push_front(child);
        } else {
            for &b in &shared {
                self.pool.share(b);
            }
            c.blocks = shared;
            c.num_computed = c.prompt_len;
            c.state = SeqStatus::Running;
            self.running.push(child);
        }
        self.seqs.insert(child, c);
        self.debug_check();
        Ok(())
    }

    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            preempted_total: self.preempted_total,
            steps: self.steps,
            tokens_last_step: self.tokens_last_step,
            pool: self.pool.stats(),
            prefix_queried_tokens: self.prefix_queried_tokens,
            prefix_hit_tokens: self.prefix_hit_tokens,
            states: self.states.as_ref().map(HybridStates::stats),
        }
    }

    /// Anything waiting, running, or ended but not yet reported (in `ended`).
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty() || !self.pending_ends.is_empty()
    }

    /// The scheduler holds `id` (waiting, running, or ended but not yet reported).
    fn holds(&self, id: SeqId) -> bool {
        self.seqs.contains_key(&id) || self.pending_ends.iter().any(|&(p, _)| p == id)
    }

    pub fn is_running(&self, id: SeqId) -> bool {
        self.seqs
            .get(&id)
            .is_some_and(|s| s.state == SeqStatus::Running)
    }

    pub fn is_waiting(&self, id: SeqId) -> bool {
        self.seqs
            .get(&id)
            .is_some_and(|s| s.state == SeqStatus::Waiting)
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// A view of sequence `id`, if the scheduler holds it.
    pub fn seq(&self, id: SeqId) -> Option<SeqInfo<'_>> {
        self.seqs.get(&id).map(Sequence::info)
    }

    /// Views of every sequence held, running ones first.
    pub fn seqs(&self) -> impl Iterator<Item = SeqInfo<'_>> + '_ {
        self.running
            .iter()
            .chain(&self.waiting)
            .filter_map(|id| self.seqs.get(id).map(Sequence::info))
    }

    /// `(allocated slots, used slots)` over the distinct blocks of sequences holding blocks:
    /// allocated = blocks × block size, used = slots holding a computed (or scheduled) token.
    pub fn kv_waste(&self) -> (usize, usize) {
        let bs = self.pool.block_size();
        let mut filled: HashMap<BlockId, usize> = HashMap::new();
        for id in &self.running {
            let Some(s) = self.seqs.get(id) else { continue };
            let written = s.num_computed + s.in_flight + s.draft_in_flight;
            for (k, &b) in s.blocks.iter().enumerate() {
                let slots = written.saturating_sub(k * bs).min(bs);
                let e = filled.entry(b).or_insert(0);
                *e = (*e).max(slots);
            }
        }
        (filled.len() * bs, filled.values().sum())
    }

    /// Checks every invariant of the module docs; `Err` names the first one broken.
    /// O(blocks + sequences).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check()?;
        if self.seqs.len() != self.running.len() + self.waiting.len() {
            return Err(format!(
                "{} sequences but {} running + {} waiting",
                self.seqs.len(),
                self.running.len(),
                self.waiting.len()
            ));
        }
        let bs = self.pool.block_size();
        let mut refs = vec![0u32; self.pool.num_blocks()];
        let mut seen = HashSet::new();
        for (id, state) in self
            .running
            .iter()
            .map(|id| (id, SeqStatus::Running))
            .chain(self.waiting.iter().map(|id| (id, SeqStatus::Waiting)))
        {
            if !seen.insert(*id) {
                return Err(format!("sequence {id} listed twice"));
            }
            let s = self
                .seqs
                .get(id)
                .ok_or_else(|| format!("listed sequence {id} does not exist"))?;
            if s.state != state {
                return Err(format!(
                    "sequence {id} is {:?} but listed {state:?}",
                    s.state
                ));
            }
            match state {
                SeqStatus::Waiting => {
                    if s.num_computed != 0 || !s.blocks.is_empty() || s.in_flight != 0 {
                        return Err(format!("waiting sequence {id} holds KV"));
                    }
                }
                SeqStatus::Running => {
                    if s.num_computed + s.in_flight > s.tokens.len() {
                        return Err(format!("sequence {id} computed past its tokens"));
                    }
                    let written = s.num_computed + s.in_flight + s.draft_in_flight;
                    if s.blocks.len() < written.div_ceil(bs) {
                        return Err(format!("sequence {id}'s block table is too short"));
                    }
                }
            }
            if s.tokens.len() > self.config.max_model_len {
                return Err(format!("sequence {id} is longer than max_model_len"));
            }
            if s.tokens.len() > self.pool.num_blocks() * bs {
                return Err(format!("sequence {id} is longer than the pool holds"));
            }
            if s.generated() > s.max_tokens {
                return Err(format!("sequence {id} generated past max_tokens"));
            }
            if s.num_registered > s.blocks.len() {
                return Err(format!("sequence {id} registered blocks it does not hold"));
            }
            for &b in &s.blocks {
                let r = refs
                    .get_mut(b as usize)
                    .ok_or_else(|| format!("sequence {id} holds unknown block {b}"))?;
                *r += 1;
            }
        }
        for (b, &r) in refs.iter().enumerate() {
            let have = self.pool.ref_count(b as BlockId);
            if have != r {
                return Err(format!("block {b}: ref count {have}, held by {r} tables"));
            }
        }
        for &(id, _) in &self.pending_ends {
            if self.seqs.contains_key(&id) || !seen.insert(id) {
                return Err(format!("pending end {id} is also held or listed twice"));
            }
        }
        let st = self.pool.stats();
        if st.blocks_free + st.blocks_used != st.blocks_total {
            return Err("free + used blocks != total".into());
        }
        if let Some(states) = &self.states {
            states.check(&self.running)?;
        }
        Ok(())
    }

    fn debug_check(&self) {
        #[cfg(debug_assertions)]
        if let Err(e) = self.check_invariants() {
            panic!("scheduler invariant broken: {e}");
        }
    }

    /// Blocks to take from the pool for `id` to write `n` tokens from `num_computed`.
    fn blocks_needed(&self, id: SeqId, n: usize) -> usize {
        let Some(s) = self.seqs.get(&id) else {
            return 0;
        };
        let new = self
            .pool
            .blocks_for(s.num_computed + n)
            .saturating_sub(s.blocks.len());
        new + usize::from(self.needs_copy(s))
    }

    /// The block the next write lands in is partly filled (from this sequence's view) and
    /// either shared or in the prefix cache. The second case: a fork child holds its parent's
    /// last prompt block, which the parent has since filled with generated tokens and
    /// registered; if the parent is gone the child is its only holder, but writing it in
    /// place would corrupt what the cache serves under the parent's hash.
    fn needs_copy(&self, s: &Sequence) -> bool {
        let bs = self.pool.block_size();
        !s.num_computed.is_multiple_of(bs)
            && s.blocks
                .get(s.num_computed / bs)
                .is_some_and(|&b| self.pool.ref_count(b) > 1 || self.pool.is_cached(b))
    }

    /// Copies the shared block about to be written and allocates blocks up to position
    /// `num_computed + n`. `false` (nothing scheduled) only if the pool ran dry, which the
    /// caller's `num_free` check rules out.
    fn grow(&mut self, id: SeqId, n: usize, copies: &mut Vec<(BlockId, BlockId)>) -> bool {
        let Some(s) = self.seqs.get(&id) else {
            return false;
        };
        let copy = self.needs_copy(s);
        let bs = self.pool.block_size();
        let Some(s) = self.seqs.get_mut(&id) else {
            return false;
        };
        if copy {
            let k = s.num_computed / bs;
            let Some(dst) = self.pool.allocate() else {
                debug_assert!(false, "pool ran dry after the free-block check");
                return false;
            };
            let src = s.blocks[k];
            copies.push((src, dst));
            s.blocks[k] = dst;
            self.pool.release(src);
        }
        let target = self.pool.blocks_for(s.num_computed + n);
        while s.blocks.len() < target {
            let Some(b) = self.pool.allocate() else {
                debug_assert!(false, "pool ran dry after the free-block check");
                return false;
            };
            s.blocks.push(b);
        }
        true
    }

    /// How many of `seq`'s proposals a chunk of `n` tokens can carry: only a decode (its one
    /// remaining token) carries any, and never more than the step's budget, `max_tokens`,
    /// `max_model_len` or the pool could hold if all were accepted.
    fn draft_room(&self, seq: &Sequence, n: usize, budget: usize) -> usize {
        if seq.draft.is_empty() || n != 1 || seq.to_compute() != 1 {
            return 0;
        }
        let capacity = self.pool.num_blocks() * self.pool.block_size();
        // Accepting k proposals and sampling one more adds k + 1 tokens.
        let by_tokens = seq.max_tokens.saturating_sub(seq.generated() + 1);
        let by_len = self
            .config
            .max_model_len
            .min(capacity)
            .saturating_sub(seq.tokens.len() + 1);
        seq.draft.len().min(budget - n).min(by_tokens).min(by_len)
    }

    /// How many of the `n` tokens from position `start` a step could give `seq` it gets: all of them, except that a
    /// hybrid model's prefill chunk under prefix caching ends on a block boundary when it
    /// stops short of the sequence's end, and at the last boundary before its final token when
    /// it would cross it (the points its state is snapshotted at, `states.rs`).
    fn chunk_len(&self, seq: &Sequence, start: usize, n: usize) -> usize {
        if self.states.is_none() || !self.pool.prefix_caching() {
            return n;
        }
        let bs = self.pool.block_size();
        let len = seq.tokens.len();
        let last_boundary = (len - 1) / bs * bs;
        if start < last_boundary && start + n > last_boundary {
            return last_boundary - start;
        }
        let aligned = (start + n) / bs * bs;
        if start + n < len && aligned > start {
            aligned - start
        } else {
            n
        }
    }

    /// The chunk of `n` tokens from `num_computed` followed by `k` of the sequence's
    /// proposals, marked in flight; the proposals are consumed. A hybrid model's chunk that
    /// ends a prefill on a block boundary adds its state snapshot to `snapshots`.
    fn make_chunk(
        &mut self,
        id: SeqId,
        n: usize,
        k: usize,
        snapshots: &mut Vec<(SlotId, SlotId)>,
    ) -> Option<ScheduledChunk> {
        let bs = self.pool.block_size();
        let caching = self.pool.prefix_caching();
        let s = self.seqs.get_mut(&id)?;
        let mut state_slot = None;
        if let Some(states) = &mut self.states {
            state_slot = states.live(id);
            let end = s.num_computed + n;
            let prefill = end < s.tokens.len();
            if caching && prefill && end.is_multiple_of(bs) {
                if let Some(&hash) = s.hashes.get(end / bs - 1) {
                    snapshots.extend(states.snapshot(id, hash));
                }
            }
        }
        let start = s.num_computed;
        let mut tokens = s.tokens.get(start..start + n)?.to_vec();
        let sample = start + n == s.tokens.len();
        let k = if sample { k.min(s.draft.len()) } else { 0 };
        tokens.extend_from_slice(&s.draft[..k]);
        s.draft.clear();
        s.in_flight = n;
        s.draft_in_flight = k;
        Some(ScheduledChunk {
            seq: id,
            start,
            tokens,
            block_table: s.blocks.clone(),
            sample,
            num_draft: k,
            state_slot,
        })
    }

    /// Running → waiting front, blocks released; the caller already took it off `running`.
    fn preempt(&mut self, id: SeqId, out: &mut SchedulerOutput) {
        let Some(s) = self.seqs.get_mut(&id) else {
            return;
        };
        s.release_blocks(&mut self.pool);
        if let Some(states) = &mut self.states {
            states.stop(id);
        }
        s.state = SeqStatus::Waiting;
        s.preemptions += 1;
        self.waiting.push_front(id);
        self.preempted_total += 1;
        out.preempted.push(id);
        tracing::debug!(
            seq = id,
            tokens = s.tokens.len(),
            "preempted (will recompute)"
        );
    }

    /// Admits waiting sequences in policy order (step 2 of the module docs).
    fn admit(&mut self, now: Instant, budget: &mut usize, out: &mut SchedulerOutput) {
        let (policy, aging) = (self.config.policy, self.config.aging_per_sec);
        let order = policy::waiting_order(
            policy,
            aging,
            now,
            &self.seqs,
            &self.waiting,
            &self.output_estimate,
        );
        let bs = self.pool.block_size();
        // Static mode gathers a wave: admission is not bounded by this step's budget, but each
        // admitted prompt must fit in blocks not yet promised to the wave's earlier prompts.
        let wave = self.config.mode == BatchingMode::Static;
        let mut promised = 0usize;
        let mut admitted = HashSet::new();
        for id in order {
            if self.running.len() >= self.config.max_num_seqs
                || out.chunks.len() >= self.config.max_num_seqs
                || (*budget == 0 && !wave)
            {
                break;
            }
            let Some(s) = self.seqs.get(&id) else {
                continue;
            };
            // Longest cached prefix of full blocks, leaving at least one token to compute.
            let max_hit = if self.pool.prefix_caching() {
                ((s.tokens.len() - 1) / bs).min(s.hashes.len())
            } else {
                0
            };
            let (mut hit, mut hit_free) = (0, 0);
            while hit < max_hit {
                match self.pool.peek(s.hashes[hit]) {
                    Some(b) => {
                        hit_free += usize::from(self.pool.ref_count(b) == 0);
                        hit += 1;
                    }
                    None => break,
                }
            }
            let mut resume = None;
            if let Some(states) = &self.states {
                if !states.can_start() {
                    break;
                }
                // A hybrid resumes only where a state snapshot was kept.
                while hit > 0 && !states.has_snapshot(s.hashes[hit - 1]) {
                    hit -= 1;
                    let b = self.pool.peek(s.hashes[hit]);
                    hit_free -= usize::from(b.is_some_and(|b| self.pool.ref_count(b) == 0));
                }
                resume = hit.checked_sub(1).map(|k| s.hashes[k]);
            }
            let cached = hit * bs;
            let n = self.chunk_len(s, cached, (s.tokens.len() - cached).min(*budget));
            let new_blocks = if wave {
                self.pool.blocks_for(s.tokens.len()) - hit
            } else {
                self.pool.blocks_for(cached + n) - hit
            };
            if (n == 0 && !wave) || self.pool.num_free() < new_blocks + hit_free + promised {
                break;
            }
            if let Some(states) = &mut self.states {
                if states.start(id, resume, &mut out.state_copies).is_none() {
                    break;
                }
            }
            let Some(s) = self.seqs.get_mut(&id) else {
                continue;
            };
            for k in 0..max_hit {
                // Past the peeked hits this is the one miss, counted as a query.
                let found = self.pool.lookup(s.hashes[k]);
                match found {
                    Some(b) if k < hit => s.blocks.push(b),
                    Some(b) => {
                        self.pool.release(b);
                        break;
                    }
                    None => break,
                }
            }
            debug_assert_eq!(s.blocks.len(), hit, "peeked prefix hits vanished");
            let hit = s.blocks.len();
            s.num_computed = hit * bs;
            s.num_registered = hit;
            s.state = SeqStatus::Running;
            let n = (n + cached - s.num_computed).min(*budget);
            self.prefix_queried_tokens += s.tokens.len() as u64;
            self.prefix_hit_tokens += s.num_computed as u64;
            self.running.push(id);
            admitted.insert(id);
            if n > 0 && self.grow(id, n, &mut out.copies) {
                if let Some(chunk) = self.make_chunk(id, n, 0, &mut out.state_snapshots) {
                    out.chunks.push(chunk);
                    *budget -= n;
                }
            }
            if wave {
                let held = self.seqs.get(&id).map_or(0, |s| s.blocks.len());
                promised += (new_blocks + hit).saturating_sub(held);
            }
        }
        if !admitted.is_empty() {
            self.waiting.retain(|id| !admitted.contains(id));
        }
    }

    /// Takes `id` off `running`/`waiting`, frees its blocks and forgets it.
    fn remove(&mut self, id: SeqId) -> bool {
        let Some(s) = self.seqs.get(&id) else {
            return false;
        };
        match s.state {
            SeqStatus::Running => self.running.retain(|&r| r != id),
            SeqStatus::Waiting => self.waiting.retain(|&w| w != id),
        }
        self.drop_seq(id);
        true
    }

    /// Frees `id`'s blocks and forgets it; the caller took it off its list.
    fn drop_seq(&mut self, id: SeqId) {
        if let Some(mut s) = self.seqs.remove(&id) {
            s.release_blocks(&mut self.pool);
        }
        if let Some(states) = &mut self.states {
            states.stop(id);
        }
    }
}

/// What a fork needs of its parent: the prompt and the request's limits.
#[derive(Debug, Clone)]
struct ForkSource {
    prompt: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    max_tokens_explicit: bool,
    priority: i32,
    arrival: Instant,
    salt: u64,
}

impl ForkSource {
    fn of(s: &Sequence) -> Self {
        ForkSource {
            prompt: s.tokens[..s.prompt_len].to_vec(),
            prompt_len: s.prompt_len,
            max_tokens: s.max_tokens,
            max_tokens_explicit: s.max_tokens_explicit,
            priority: s.priority,
            arrival: s.arrival,
            salt: s.salt,
        }
    }
}

/// Why `seq` must end now that its last token is known, if it must: `max_tokens` generated,
/// `max_model_len` reached, or more tokens than the whole pool holds (computing the next
/// token needs KV for all of them).
fn end_reason(config: &SchedulerConfig, pool: &BlockPool, seq: &Sequence) -> Option<SeqEnd> {
    let capacity = pool.num_blocks() * pool.block_size();
    if seq.generated() >= seq.max_tokens {
        Some(SeqEnd::Length)
    } else if seq.tokens.len() >= config.max_model_len || seq.tokens.len() > capacity {
        Some(SeqEnd::ContextFull)
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
