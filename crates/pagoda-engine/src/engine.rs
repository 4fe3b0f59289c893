//! The engine core: one step = `scheduler.schedule()` → `runner.execute()` → sample every
//! chunk that ends at its sequence's last token → `scheduler.update()` → stream events. A row
//! of logits holding NaN or infinities is not sampled from: its request fails with
//! [`EngineError::NumericalFault`] (blocks freed, one log line, see [`crate::fault`]) and the
//! rest of the batch goes on. The KV geometry is planned before the core starts
//! ([`crate::planning`]).
//!
//! [`EngineCore`] is single-threaded plain state; [`EngineHandle`](crate::EngineHandle) owns one
//! on its own thread. Requests map to one sequence per choice; the choices of an `n > 1`
//! request are forked from the first one's prompt blocks when its prompt is computed.
//!
//! Invariants: a sequence id is in `seqs` exactly while the scheduler holds it; every request
//! gets one `Finished` event per choice or one `Error`, then is forgotten.

use crate::block_pool::BlockPool;
use crate::choice::Choice;
use crate::fault::{self, Fault, Located};
use crate::request::Usage;
use crate::request::{EngineRequest, RequestId, RequestTimings, TokenEvent};
use crate::runner::ModelRunner;
use crate::scheduler::{
    ScheduledChunk, Scheduler, SchedulerConfig, SeqEnd, SeqId, SeqRequest, SeqStatus,
};
use crate::speculative::{SpecStats, Speculator};
use crate::stop::FinishReason;
use crate::EngineError;
// Re-exported where they were before planning had a module of its own.
pub use crate::planning::{EngineConfig, KvLayout, DEFAULT_KV_FRACTION};
use flume::Sender;
use pagoda_model::arch::{LoraWeights, Model};
use pagoda_model::tokenizer::Tokenizer;
use pagoda_model::PagedKvCache;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// A snapshot of the engine's state after a step, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    /// Preemptions since start.
    pub preempted_total: u64,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    /// Share of admitted prompt tokens whose KV came from the prefix cache (0 when none yet).
    pub prefix_cache_hit_rate: f64,
    /// Prompt tokens looked up in the prefix cache since start (vLLM's `prefix_cache_queries`).
    pub prefix_cache_queried_tokens: u64,
    /// Of those, tokens found cached (vLLM's `prefix_cache_hits`).
    pub prefix_cache_hit_tokens: u64,
    /// Tokens computed in the last step.
    pub tokens_last_step: usize,
    pub steps: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub requests_finished: u64,
    /// Speculative decoding counters (all zero without it).
    pub spec: SpecStats,
}

/// One request in flight.
struct RequestState {
    prompt: Vec<u32>,
    events: Sender<TokenEvent>,
    request: EngineRequest,
    arrived: Instant,
    first_scheduled: Option<Instant>,
    /// Choices not yet finished.
    live: usize,
    /// Sequence ids of its choices, index = choice index (filled as they are forked).
    seqs: Vec<SeqId>,
    /// Prompt tokens found in the prefix cache (set when its first chunk is scheduled).
    cached_prompt_tokens: usize,
}

/// The output state of one choice of a request (one sequence in the scheduler).
struct ChoiceOutput {
    request: RequestId,
    index: usize,
    choice: Choice,
    first_token: Option<Instant>,
}

/// The engine's state and step function (single-threaded; see the module docs).
pub struct EngineCore {
    scheduler: Scheduler,
    runner: ModelRunner,
    tokenizer: Arc<Tokenizer>,
    layout: KvLayout,
    requests: HashMap<RequestId, RequestState>,
    seqs: HashMap<SeqId, ChoiceOutput>,
    next_seq: SeqId,
    stats: EngineStats,
    speculator: Option<Speculator>,
    /// A numerical fault was located (see [`crate::fault`]): later ones are only logged.
    fault_located: bool,
}

impl EngineCore {
    pub fn new(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        config: &EngineConfig,
    ) -> Result<Self, EngineError> {
        let layout = KvLayout::plan(&model, config)?;
        let cache = PagedKvCache::new(
            model.config(),
            layout.n_blocks,
            layout.block_size,
            layout.dtype,
        );
        let pool = BlockPool::new(layout.n_blocks, layout.block_size, config.prefix_caching);
        let scheduler = Scheduler::new(
            SchedulerConfig {
                max_num_batched_tokens: config.max_num_batched_tokens.max(1),
                max_num_seqs: config.max_num_seqs.max(1),
                policy: config.policy,
                mode: config.mode,
                max_model_len: layout.max_model_len,
                aging_per_sec: config.aging_per_sec,
            },
            pool,
        );
        tracing::info!(
            blocks = layout.n_blocks,
            block_size = layout.block_size,
            dtype = %layout.dtype,
            mib = layout.bytes as f64 / (1 << 20) as f64,
            max_model_len = layout.max_model_len,
            "KV cache"
        );
        let speculator = match &config.speculative {
            Some(spec) => Some(Speculator::new(spec, &tokenizer, layout.capacity_tokens())?),
            None => None,
        };
        Ok(EngineCore {
            speculator,
            scheduler,
            runner: ModelRunner::new(model, cache),
            tokenizer,
            layout,
            requests: HashMap::new(),
            seqs: HashMap::new(),
            next_seq: 0,
            stats: EngineStats {
                kv_blocks_total: layout.n_blocks,
                ..EngineStats::default()
            },
            fault_located: false,
        })
    }

    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    pub fn has_work(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Checks a request against the model and the engine's limits, without queueing it.
    pub fn validate(
        model: &Model,
        layout: &KvLayout,
        req: &EngineRequest,
    ) -> Result<(), EngineError> {
        if req.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        req.sampling.validate(model.config().vocab_size)?;
        if let Some(&bad) = req
            .prompt
            .iter()
            .find(|&&t| t as usize >= model.config().vocab_size)
        {
            return Err(EngineError::Model(pagoda_model::ModelError::InvalidToken {
                token: bad,
                vocab_size: model.config().vocab_size,
            }));
        }
        if req.prompt.len() >= layout.max_model_len {
            return Err(EngineError::PromptTooLong {
                prompt_tokens: req.prompt.len(),
                context: layout.max_model_len,
            });
        }
        if req.prompt.len() + 1 > layout.capacity_tokens() {
            return Err(EngineError::PromptExceedsKvCache {
                prompt_tokens: req.prompt.len(),
                kv_tokens: layout.capacity_tokens(),
            });
        }
        if req.n == 0 || req.n > MAX_CHOICES {
            return Err(EngineError::InvalidRequest(format!(
                "n must be between 1 and {MAX_CHOICES}, got {}",
                req.n
            )));
        }
        if req.max_tokens == 0 {
            return Err(EngineError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        if let Some(a) = &req.adapter {
            if !a.fits(model) {
                return Err(EngineError::InvalidRequest(format!(
                    "LoRA adapter {:?} was loaded for a model of another shape",
                    a.name()
                )));
            }
        }
        Ok(())
    }

    /// Queues a request; its events go to `events`.
    pub fn add_request(
        &mut self,
        id: RequestId,
        request: EngineRequest,
        events: Sender<TokenEvent>,
        arrived: Instant,
    ) {
        if let Err(e) = Self::validate(self.runner.model(), &self.layout, &request) {
            let _ = events.send(TokenEvent::Error {
                message: e.to_string(),
            });
            return;
        }
        let seq = self.new_seq_id();
        let salt = request.adapter.as_ref().map_or(0, |a| a.cache_salt());
        if let Err(e) = self.scheduler.add_with_salt(
            SeqRequest {
                id: seq,
                prompt: request.prompt.clone(),
                max_tokens: request.max_tokens,
                priority: request.priority,
            },
            salt,
            arrived,
        ) {
            let _ = events.send(TokenEvent::Error {
                message: e.to_string(),
            });
            return;
        }
        self.stats.prompt_tokens_total += request.prompt.len() as u64;
        let choice = self.new_choice(&request, 0);
        self.seqs.insert(
            seq,
            ChoiceOutput {
                request: id,
                index: 0,
                choice,
                first_token: None,
            },
        );
        self.requests.insert(
            id,
            RequestState {
                prompt: request.prompt.clone(),
                events,
                live: request.n,
                seqs: vec![seq],
                request,
                arrived,
                first_scheduled: None,
                cached_prompt_tokens: 0,
            },
        );
    }

    /// Ends every choice of request `id` now, freeing its KV blocks. Unknown ids are ignored.
    pub fn abort(&mut self, id: RequestId) {
        let Some(req) = self.requests.remove(&id) else {
            return;
        };
        let now = Instant::now();
        for seq in req.seqs {
            self.forget_speculation(seq);
            if let Some(state) = self.seqs.remove(&seq) {
                self.scheduler.finish(seq, SeqEnd::Aborted);
                let _ = req.events.send(TokenEvent::Finished {
                    index: state.index,
                    reason: FinishReason::Abort,
                    text: String::new(),
                    usage: Usage {
                        prompt_tokens: req.prompt.len(),
                        cached_prompt_tokens: req.cached_prompt_tokens,
                        completion_tokens: state.choice.generated().len(),
                    },
                    timings: RequestTimings {
                        arrived: req.arrived,
                        first_scheduled: req.first_scheduled,
                        first_token: state.first_token,
                        finished: now,
                    },
                });
            }
        }
    }

    /// Fails every request in flight with `message` (after a model fault).
    fn fail_all(&mut self, message: &str) {
        let ids: Vec<RequestId> = self.requests.keys().copied().collect();
        for id in ids {
            self.fail_request(id, message);
        }
        self.seqs.clear();
    }

    /// Fails request `id` as a whole: every choice's sequence ends (its KV blocks go back to
    /// the pool), and its stream gets one `Error` and nothing after it. Unknown ids are ignored.
    fn fail_request(&mut self, id: RequestId, message: &str) {
        let Some(req) = self.requests.remove(&id) else {
            return;
        };
        for seq in &req.seqs {
            self.forget_speculation(*seq);
            self.seqs.remove(seq);
            self.scheduler.finish(*seq, SeqEnd::Aborted);
        }
        let _ = req.events.send(TokenEvent::Error {
            message: message.to_string(),
        });
    }

    /// Fails the request of `seq`, whose row of `chunk` held non-finite logits, and logs it,
    /// naming the stage that first went non-finite when this engine has not located a fault
    /// yet (see [`crate::fault`] for why only the first).
    fn numerical_fault(&mut self, seq: SeqId, chunk: &ScheduledChunk, fault: Fault) {
        let Some(request) = self.seqs.get(&seq).map(|s| s.request) else {
            return;
        };
        let adapter = self
            .requests
            .get(&request)
            .is_some_and(|r| r.request.adapter.is_some());
        let located = if self.fault_located {
            Located::Skipped("the engine re-runs only its first faulting sequence")
        } else {
            match self.fault_tokens(seq, chunk, fault.position) {
                Some(tokens) => {
                    let located =
                        fault::locate(self.runner.model(), &tokens, self.layout.dtype, adapter);
                    self.fault_located = !matches!(located, Located::TooLong { .. });
                    located
                }
                None => Located::Skipped("the sequence's tokens are not known"),
            }
        };
        fault.log(Some(request), &located);
        self.fail_request(request, &fault.error().to_string());
    }

    /// The tokens of `seq` up to and including the input of `chunk`'s row at `position` (a
    /// proposal, when the row verifies one).
    fn fault_tokens(
        &self,
        seq: SeqId,
        chunk: &ScheduledChunk,
        position: usize,
    ) -> Option<Vec<u32>> {
        let info = self.scheduler.seq(seq)?;
        let mut tokens = info.tokens.get(..chunk.start)?.to_vec();
        tokens.extend_from_slice(chunk.tokens.get(..=position.checked_sub(chunk.start)?)?);
        Some(tokens)
    }

    fn new_seq_id(&mut self) -> SeqId {
        self.next_seq += 1;
        self.next_seq
    }

    fn new_choice(&self, request: &EngineRequest, index: usize) -> Choice {
        let mut params = request.sampling.clone();
        if let Some(seed) = params.seed {
            params.seed = Some(seed.wrapping_add(index as u64));
        }
        let mut end_tokens = request.stop_token_ids.clone();
        if !request.ignore_eos {
            end_tokens.extend_from_slice(self.tokenizer.eos_ids());
        }
        Choice::new(params, request.stop.clone(), end_tokens)
    }

    /// Asks the speculator for proposals for every decoding sequence whose request allows
    /// speculation, and hands them to the scheduler.
    fn propose(&mut self) {
        let Some(spec) = self.speculator.as_mut() else {
            return;
        };
        let mut wanted: Vec<(SeqId, &[u32])> = Vec::new();
        for info in self.scheduler.seqs() {
            let decoding =
                info.state == SeqStatus::Running && info.num_computed + 1 == info.tokens.len();
            let allowed = self
                .seqs
                .get(&info.id)
                .and_then(|s| self.requests.get(&s.request))
                .is_some_and(|r| r.request.speculative && r.request.n == 1);
            if decoding && allowed {
                wanted.push((info.id, info.tokens));
            }
        }
        if wanted.is_empty() {
            return;
        }
        let proposals = spec.propose(&wanted);
        for (seq, draft) in proposals {
            self.scheduler.propose(seq, draft);
        }
    }

    /// Samples one chunk's rows: one token, or with proposals the accepted ones followed by
    /// the first sampled token that differs (see [`crate::speculative`]). Returns the picks
    /// and how many proposals were accepted, or the fault of the first row it would sample
    /// from that holds NaN or infinities (nothing of the chunk is then kept).
    fn sample_chunk(
        &mut self,
        chunk: &ScheduledChunk,
        rows: &mut [f32],
        vocab: usize,
    ) -> Option<Result<(Vec<crate::SampledToken>, usize), Fault>> {
        let draft = chunk.draft();
        let state = self.seqs.get_mut(&chunk.seq)?;
        let req = self.requests.get(&state.request)?;
        // The rows are those of the chunk's last `sample_rows` tokens.
        let first_row_position =
            chunk.start + chunk.tokens.len().saturating_sub(chunk.sample_rows());
        let mut picks: Vec<crate::SampledToken> = Vec::with_capacity(draft.len() + 1);
        let mut pending: Vec<u32> = Vec::with_capacity(draft.len() + 1);
        for (i, row) in rows.chunks_exact_mut(vocab).enumerate() {
            let pick = match state.choice.sample_after(row, &req.prompt, &pending) {
                Ok(pick) => pick,
                Err(found) => {
                    return Some(Err(Fault {
                        found,
                        step: state.choice.generated().len() + i,
                        position: first_row_position + i,
                    }))
                }
            };
            let token = pick.token;
            picks.push(pick);
            pending.push(token);
            let matched = draft.get(i) == Some(&token);
            if !matched || state.choice.is_end_token(token) {
                break;
            }
        }
        let accepted = picks.len() - 1;
        Some(Ok((picks, accepted)))
    }

    /// Runs one step. Returns `false` when there was nothing to run.
    pub fn step(&mut self) -> bool {
        let started = Instant::now();
        self.propose();
        let now = Instant::now();
        let out = self.scheduler.schedule(now);
        for &(seq, end) in &out.ended {
            self.end_choice(seq, finish_reason(end), false);
        }
        if out.chunks.is_empty() {
            self.refresh_stats(0);
            return !out.ended.is_empty();
        }
        for chunk in &out.chunks {
            if let Some(seq) = self.seqs.get(&chunk.seq) {
                if let Some(req) = self.requests.get_mut(&seq.request) {
                    if req.first_scheduled.is_none() {
                        req.first_scheduled = Some(now);
                        req.cached_prompt_tokens = chunk.start;
                    }
                }
            }
        }
        let executed = Instant::now();
        let adapters = self.chunk_adapters(&out);
        let mut logits = match self.runner.execute_with_adapters(&out, &adapters) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "forward pass failed; failing every request in flight");
                self.fail_all(&format!("model fault: {e}"));
                self.refresh_stats(out.num_batched_tokens);
                return true;
            }
        };
        tracing::trace!(
            tokens = out.num_batched_tokens,
            chunks = out.chunks.len(),
            ms = executed.elapsed().as_secs_f64() * 1e3,
            "forward pass"
        );
        if let Some(spec) = self.speculator.as_mut() {
            spec.observe_step(executed.elapsed(), out.num_batched_tokens);
        }
        let vocab = self.runner.model().config().vocab_size;
        let sampled_at = Instant::now();
        let mut sampled: Vec<(SeqId, Vec<u32>)> = Vec::new();
        let mut picks = Vec::new();
        let mut forks = Vec::new();
        let mut faults = Vec::new();
        let mut row = 0;
        for chunk in out.chunks.iter().filter(|c| c.sample) {
            let rows = chunk.sample_rows();
            let chunk_logits = &mut logits[row * vocab..(row + rows) * vocab];
            row += rows;
            let Some(state) = self.seqs.get(&chunk.seq) else {
                continue;
            };
            let Some(req) = self.requests.get(&state.request) else {
                continue;
            };
            let needs_fork = req.request.n > req.seqs.len();
            let request = state.request;
            let pristine = needs_fork.then(|| chunk_logits[..vocab].to_vec());
            let (chunk_picks, accepted) = match self.sample_chunk(chunk, chunk_logits, vocab) {
                Some(Ok(sampled)) => sampled,
                Some(Err(fault)) => {
                    faults.push((chunk, fault));
                    continue;
                }
                None => continue,
            };
            if chunk.num_draft > 0 {
                if let Some(spec) = self.speculator.as_mut() {
                    spec.observe(chunk.seq, chunk.num_draft, accepted);
                }
            }
            sampled.push((chunk.seq, chunk_picks.iter().map(|p| p.token).collect()));
            picks.extend(chunk_picks.into_iter().map(|p| (chunk.seq, p)));
            if let Some(base) = pristine {
                forks.push((chunk.seq, request, base));
            }
        }
        let emitted = picks.len();
        // Before `update`: a failed request's sequences leave the scheduler now, so `update`
        // skips their chunks (and its other choices' picks find no choice to deliver to).
        let faulted = !faults.is_empty();
        for (chunk, fault) in faults {
            self.numerical_fault(chunk.seq, chunk, fault);
        }
        let ended = self.scheduler.update_speculative(&out, &sampled);
        for (parent, request, base) in forks {
            self.fork_choices(parent, request, &base);
        }
        for (seq, pick) in picks {
            self.deliver(seq, pick, sampled_at);
        }
        for (seq, end) in ended {
            self.end_choice(seq, finish_reason(end), false);
        }
        // A step that located a fault timed its re-run too: not a decode step's cost.
        if let Some(spec) = self.speculator.as_mut().filter(|_| !faulted) {
            let pure_decode = out
                .chunks
                .iter()
                .all(|c| c.sample && c.tokens.len() == 1 + c.num_draft);
            if pure_decode {
                let speculated = out.chunks.iter().any(|c| c.num_draft > 0);
                spec.observe_decode_step(out.chunks.len(), started.elapsed(), emitted, speculated);
            }
        }
        self.refresh_stats(out.num_batched_tokens);
        true
    }

    /// Starts choices `1..n` of `request` from the parent's prompt blocks, each sampling its
    /// first token from the same logits.
    fn fork_choices(&mut self, parent: SeqId, request: RequestId, base: &[f32]) {
        let Some(req) = self.requests.get(&request) else {
            return;
        };
        let (n, have) = (req.request.n, req.seqs.len());
        let sampled_at = Instant::now();
        for index in have..n {
            let Some(req) = self.requests.get(&request) else {
                return;
            };
            let mut choice = self.new_choice(&req.request, index);
            let mut row = base.to_vec();
            let pick = match choice.sample(&mut row, &req.prompt) {
                Ok(pick) => pick,
                Err(found) => {
                    // The parent sampled this row first and found it finite, so this cannot
                    // happen; if it does, the request fails as any numerical fault does.
                    let fault = Fault {
                        found,
                        step: 0,
                        position: req.prompt.len().saturating_sub(1),
                    };
                    fault.log(
                        Some(request),
                        &Located::Skipped("found while forking choices"),
                    );
                    self.fail_request(request, &fault.error().to_string());
                    return;
                }
            };
            let child = self.new_seq_id();
            if let Err(e) = self.scheduler.fork(parent, child, pick.token) {
                tracing::error!(error = %e, "fork failed");
                self.fail_request(request, &e.to_string());
                return;
            }
            self.seqs.insert(
                child,
                ChoiceOutput {
                    request,
                    index,
                    choice,
                    first_token: None,
                },
            );
            if let Some(req) = self.requests.get_mut(&request) {
                req.seqs.push(child);
            }
            self.deliver(child, pick, sampled_at);
        }
    }

    /// Hands one sampled token to its choice and streams the result.
    fn deliver(&mut self, seq: SeqId, pick: crate::SampledToken, at: Instant) {
        let Some(state) = self.seqs.get_mut(&seq) else {
            return;
        };
        state.first_token.get_or_insert(at);
        let wants_logprobs = state.choice.wants_logprobs();
        let accepted = match state.choice.accept(pick.token, &self.tokenizer) {
            Ok(a) => a,
            Err(e) => {
                let request = state.request;
                self.fail_request(request, &e.to_string());
                return;
            }
        };
        let Some(req) = self.requests.get(&state.request) else {
            return;
        };
        if accepted.kept {
            self.stats.generation_tokens_total += 1;
            let event = TokenEvent::Token {
                index: state.index,
                token: pick.token,
                text: accepted.text,
                logprob: wants_logprobs.then_some(pick),
                at,
            };
            if req.events.send(event).is_err() {
                // The caller went away (client disconnect): stop working for it.
                let request = state.request;
                self.abort(request);
                return;
            }
        }
        if let Some(reason) = accepted.ended {
            self.end_choice(seq, reason, true);
        }
    }

    /// Ends one choice: tells the scheduler (unless it ended the sequence itself), flushes held
    /// text and sends `Finished`; forgets the request after its last choice.
    fn end_choice(&mut self, seq: SeqId, reason: FinishReason, tell_scheduler: bool) {
        self.forget_speculation(seq);
        let Some(mut state) = self.seqs.remove(&seq) else {
            return;
        };
        if tell_scheduler {
            self.scheduler.finish(seq, SeqEnd::Stopped);
        }
        let Some(req) = self.requests.get_mut(&state.request) else {
            return;
        };
        let (text, reason) = state
            .choice
            .finish(&self.tokenizer, reason)
            .unwrap_or((String::new(), reason));
        let _ = req.events.send(TokenEvent::Finished {
            index: state.index,
            reason,
            text,
            usage: Usage {
                prompt_tokens: req.prompt.len(),
                cached_prompt_tokens: req.cached_prompt_tokens,
                completion_tokens: state.choice.generated().len(),
            },
            timings: RequestTimings {
                arrived: req.arrived,
                first_scheduled: req.first_scheduled,
                first_token: state.first_token,
                finished: Instant::now(),
            },
        });
        req.live = req.live.saturating_sub(1);
        if req.live == 0 {
            self.requests.remove(&state.request);
            self.stats.requests_finished += 1;
        }
    }

    /// Drops the speculation state (acceptance, draft KV) of a sequence that ended.
    fn forget_speculation(&mut self, seq: SeqId) {
        if let Some(spec) = self.speculator.as_mut() {
            spec.release(seq);
        }
    }

    /// The LoRA adapter of each chunk's request (`None`: the base model).
    fn chunk_adapters(&self, out: &crate::scheduler::SchedulerOutput) -> Vec<Option<LoraWeights>> {
        out.chunks
            .iter()
            .map(|c| {
                let state = self.seqs.get(&c.seq)?;
                self.requests.get(&state.request)?.request.adapter.clone()
            })
            .collect()
    }

    fn refresh_stats(&mut self, tokens: usize) {
        if let Some(spec) = &self.speculator {
            self.stats.spec = spec.stats();
        }
        let s = self.scheduler.stats();
        self.stats.running = s.running;
        self.stats.waiting = s.waiting;
        self.stats.preempted_total = s.preempted_total;
        self.stats.kv_blocks_used = s.pool.blocks_used;
        self.stats.kv_blocks_total = s.pool.blocks_total;
        self.stats.prefix_cache_hit_rate = s.prefix_hit_rate();
        self.stats.prefix_cache_queried_tokens = s.prefix_queried_tokens;
        self.stats.prefix_cache_hit_tokens = s.prefix_hit_tokens;
        self.stats.tokens_last_step = tokens;
        if tokens > 0 {
            self.stats.steps += 1;
        }
    }
}

/// The API's finish reason for a sequence the scheduler ended.
fn finish_reason(end: SeqEnd) -> FinishReason {
    match end {
        SeqEnd::Aborted => FinishReason::Abort,
        SeqEnd::Stopped => FinishReason::Stop,
        SeqEnd::Length | SeqEnd::ContextFull => FinishReason::Length,
    }
}

/// Most choices one request may ask for.
pub const MAX_CHOICES: usize = 16;
