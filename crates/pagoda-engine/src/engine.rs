//! The engine core: one step reads top to bottom as
//! propose → schedule → execute → sample → update → emit, each a call into the module that
//! owns it: the speculator proposes ([`crate::speculative`]), the scheduler plans
//! ([`crate::scheduler`]), the runner runs the forward pass ([`crate::runner`]), every chunk
//! that ends at its sequence's last token is sampled ([`crate::step_sampling`]), the scheduler
//! applies the step, and output processing streams events ([`crate::output`]). A row of logits
//! holding NaN or infinities is not sampled from: its request fails with
//! [`EngineError::NumericalFault`] (blocks freed, one log line, see [`crate::fault`]) and the
//! rest of the batch goes on. The KV geometry is planned before the core starts
//! ([`crate::planning`]).
//!
//! [`EngineCore`] is single-threaded plain state; [`EngineHandle`](crate::EngineHandle) owns one
//! on its own thread. Requests map to one sequence per choice; the choices of an `n > 1`
//! request are forked from the first one's prompt blocks when its prompt is computed.
//!
//! Invariants: a sequence id has output state exactly while the scheduler holds it (or, for a
//! sequence the scheduler just ended, until this step emits its end); every request gets one
//! `Finished` event per choice or one `Error`, then is forgotten.

use crate::block_pool::BlockPool;
use crate::constraint::{CompiledConstraint, Constraints};
use crate::fault::{self, Fault, FaultReporter};
use crate::output::{self, OutputProcessor, SeqControl};
use crate::request::{EngineRequest, RequestId, TokenEvent};
use crate::runner::ModelRunner;
use crate::scheduler::{
    ScheduledChunk, Scheduler, SchedulerConfig, SchedulerError, SchedulerOutput, SeqEnd, SeqId,
    SeqRequest, SeqStatus,
};
use crate::speculative::{SpecStats, Speculator};
use crate::state_pool::StatePool;
use crate::step_sampling::{self, SampledStep};
use crate::EngineError;
// Re-exported where they were before planning had a module of its own.
pub use crate::planning::{EngineConfig, KvLayout, DEFAULT_KV_FRACTION};
use flume::Sender;
use pagoda_model::arch::Model;
use pagoda_model::tokenizer::Tokenizer;
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
    /// A hybrid model's recurrent-state slots in use (running sequences) and in all; 0 for
    /// a transformer.
    pub state_slots_used: usize,
    pub state_slots_total: usize,
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

/// The engine's state and step function (single-threaded; see the module docs).
pub struct EngineCore {
    scheduler: Scheduler,
    runner: ModelRunner,
    layout: KvLayout,
    outputs: OutputProcessor,
    next_seq: SeqId,
    stats: EngineStats,
    speculator: Option<Speculator>,
    faults: FaultReporter,
    /// The constraint compiler of this engine's tokenizer (shared with the handle).
    constraints: Arc<Constraints>,
}

impl EngineCore {
    pub fn new(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        config: &EngineConfig,
    ) -> Result<Self, EngineError> {
        let hybrid = model.config().has_recurrent_state();
        if hybrid && config.speculative.is_some() {
            return Err(EngineError::InvalidRequest(format!(
                "speculative decoding with a hybrid {} model is not supported: its recurrent \
                 state cannot be rolled back past rejected proposals; serve it without a draft",
                model.config().arch.family().display
            )));
        }
        let layout = KvLayout::plan(&model, config)?;
        let cache = model.try_new_paged_cache(layout.n_blocks, layout.block_size, layout.dtype)?;
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
        // A hybrid's sequences hold recurrent-state slots, and resume cached prefixes from
        // state snapshots (`scheduler/states.rs`).
        let scheduler = match layout.states {
            Some(plan) => {
                tracing::info!(
                    slots = plan.slots,
                    mib_each = plan.slot_bytes as f64 / (1 << 20) as f64,
                    "recurrent-state slots"
                );
                scheduler.with_states(StatePool::new(
                    plan.slots,
                    plan.slot_bytes,
                    config.prefix_caching,
                ))
            }
            None => scheduler,
        };
        tracing::info!(
            blocks = layout.n_blocks,
            block_size = layout.block_size,
            dtype = %cache.storage(),
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
            runner: match layout.states {
                Some(plan) => ModelRunner::with_state_slots(model, cache, plan.slots),
                None => ModelRunner::new(model, cache),
            },
            layout,
            constraints: Arc::new(Constraints::new(tokenizer.clone())),
            outputs: OutputProcessor::new(tokenizer),
            next_seq: 0,
            stats: EngineStats {
                kv_blocks_total: layout.n_blocks,
                ..EngineStats::default()
            },
            faults: FaultReporter::default(),
        })
    }

    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// The constraint compiler of this engine's tokenizer (its token environment is built
    /// once, on first use, and shared).
    pub fn constraints(&self) -> &Arc<Constraints> {
        &self.constraints
    }

    pub fn stats(&self) -> EngineStats {
        let counters = self.outputs.counters();
        EngineStats {
            generation_tokens_total: counters.generation_tokens,
            requests_finished: counters.requests_finished,
            ..self.stats
        }
    }

    pub fn has_work(&self) -> bool {
        !self.outputs.is_empty()
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

    /// Queues a request; its events go to `events`. It is checked ([`validate`](Self::validate))
    /// and its constraint, if any, compiled here (on the caller's thread;
    /// [`EngineHandle`](crate::EngineHandle) does both in `submit`, off the engine thread).
    pub fn add_request(
        &mut self,
        id: RequestId,
        request: EngineRequest,
        events: Sender<TokenEvent>,
        arrived: Instant,
    ) {
        let compiled = match request
            .constraint
            .as_ref()
            .map(|c| self.constraints.compile(c))
        {
            None => None,
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => {
                output::send_error(
                    &events,
                    &EngineError::InvalidConstraint(e.to_string()).to_string(),
                );
                return;
            }
        };
        if let Err(e) = Self::validate(self.runner.model(), &self.layout, &request) {
            output::send_error(&events, &e.to_string());
            return;
        }
        self.add_compiled(id, request, compiled, events, arrived);
    }

    /// Queues a request already checked ([`validate`](Self::validate), once: by
    /// `EngineHandle::submit` or [`add_request`](Self::add_request)) whose constraint is
    /// already compiled (`None`: it has none).
    pub(crate) fn add_compiled(
        &mut self,
        id: RequestId,
        request: EngineRequest,
        constraint: Option<CompiledConstraint>,
        events: Sender<TokenEvent>,
        arrived: Instant,
    ) {
        debug_assert!(
            Self::validate(self.runner.model(), &self.layout, &request).is_ok(),
            "add_compiled takes validated requests"
        );
        let seq = next_seq_id(&mut self.next_seq);
        let salt = request.adapter.as_ref().map_or(0, |a| a.cache_salt());
        if let Err(e) = self.scheduler.add_with_salt(
            SeqRequest {
                id: seq,
                prompt: request.prompt.clone(),
                max_tokens: request.max_tokens,
                max_tokens_explicit: request.max_tokens_explicit,
                priority: request.priority,
            },
            salt,
            arrived,
        ) {
            output::send_error(&events, &e.to_string());
            return;
        }
        self.stats.prompt_tokens_total += request.prompt.len() as u64;
        self.outputs
            .add(id, seq, request, constraint, events, arrived);
    }

    /// Ends every choice of request `id` now, freeing its KV blocks. Unknown ids are ignored.
    pub fn abort(&mut self, id: RequestId) {
        let (outputs, mut seqs) = self.parts();
        outputs.abort(id, &mut seqs);
    }

    /// Runs one step. Returns `false` when there was nothing to run.
    pub fn step(&mut self) -> bool {
        let started = Instant::now();
        self.propose();
        let plan = self.schedule();
        if plan.chunks.is_empty() {
            self.refresh_stats(0);
            return !plan.ended.is_empty();
        }
        let Some(mut logits) = self.execute(&plan) else {
            return true;
        };
        let sampled = self.sample(&plan, &mut logits);
        let emitted = sampled.emitted();
        let faulted = !sampled.faults.is_empty();
        let ended = self.update(&plan, &sampled);
        self.emit(sampled, ended);
        // A step that located a fault timed its re-run too: not a decode step's cost.
        if !faulted {
            self.observe_decode_step(&plan, started, emitted);
        }
        self.refresh_stats(plan.num_batched_tokens);
        true
    }

    /// Propose: the speculator's proposals for every decoding sequence whose request allows
    /// speculation, handed to the scheduler.
    fn propose(&mut self) {
        let Some(spec) = self.speculator.as_mut() else {
            return;
        };
        let mut wanted: Vec<(SeqId, &[u32])> = Vec::new();
        for info in self.scheduler.seqs() {
            let decoding =
                info.state == SeqStatus::Running && info.num_computed + 1 == info.tokens.len();
            if decoding && self.outputs.may_speculate(info.id) {
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

    /// Schedule: the scheduler plans the step. Sequences it ended without running them
    /// (forked choices complete from their first token) end their choices now; requests
    /// scheduled for the first time note when, and how much of their prompt was cached.
    fn schedule(&mut self) -> SchedulerOutput {
        let now = Instant::now();
        let plan = self.scheduler.schedule(now);
        let (outputs, mut seqs) = self.parts();
        outputs.end_by_scheduler(plan.ended.clone(), &mut seqs);
        outputs.mark_scheduled(&plan.chunks, now);
        plan
    }

    /// Execute: one forward pass over every chunk of `plan`, each under its request's LoRA
    /// adapter; the logits of the sampling chunks. A failed pass fails every request in
    /// flight (`None`). While it runs, another thread computes the token masks of the
    /// step's constrained choices (their matchers have consumed every token sampled so far),
    /// so sampling finds them in hand; no thread when no choice is constrained.
    fn execute(&mut self, plan: &SchedulerOutput) -> Option<Vec<f32>> {
        let executed = Instant::now();
        let adapters = self.outputs.adapters(&plan.chunks);
        let result = if self.outputs.has_constrained() {
            let (outputs, runner) = (&mut self.outputs, &mut self.runner);
            std::thread::scope(|s| {
                let masks = s.spawn(|| outputs.prepare_masks(&plan.chunks));
                let result = runner.execute_with_adapters(plan, &adapters);
                // A mask left uncomputed (a panic there) is computed again when sampling.
                let _ = masks.join();
                result
            })
        } else {
            self.runner.execute_with_adapters(plan, &adapters)
        };
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "forward pass failed; failing every request in flight");
                let (outputs, mut seqs) = self.parts();
                outputs.fail_all(&format!("model fault: {e}"), &mut seqs);
                self.refresh_stats(plan.num_batched_tokens);
                return None;
            }
        };
        tracing::trace!(
            tokens = plan.num_batched_tokens,
            chunks = plan.chunks.len(),
            ms = executed.elapsed().as_secs_f64() * 1e3,
            "forward pass"
        );
        if let Some(spec) = self.speculator.as_mut() {
            spec.observe_step(executed.elapsed(), plan.num_batched_tokens);
        }
        Some(logits)
    }

    /// Sample: every sampling chunk's new tokens; the speculator learns how many of each
    /// chunk's proposals were accepted.
    fn sample<'p>(&mut self, plan: &'p SchedulerOutput, logits: &mut [f32]) -> SampledStep<'p> {
        let vocab = self.runner.model().config().vocab_size;
        let sampled = step_sampling::sample_step(plan, logits, vocab, &mut self.outputs);
        if let Some(spec) = self.speculator.as_mut() {
            for chunk in sampled.chunks.iter().filter(|c| c.num_draft > 0) {
                spec.observe(chunk.seq, chunk.num_draft, chunk.accepted);
            }
        }
        sampled
    }

    /// Update: requests with a numerical fault or a failed constraint fail first (their sequences leave the
    /// scheduler, so it skips their chunks and their other choices' tokens find no choice to
    /// go to), then the scheduler applies the step. Returns the sequences it ended.
    fn update(
        &mut self,
        plan: &SchedulerOutput,
        sampled: &SampledStep<'_>,
    ) -> Vec<(SeqId, SeqEnd)> {
        for (chunk, fault) in &sampled.faults {
            self.numerical_fault(chunk, fault);
        }
        for (seq, message) in &sampled.constraint_failures {
            if let Some((request, _)) = self.outputs.request_with_adapter(*seq) {
                tracing::warn!(request, error = %message, "constraint failed; failing its request");
                let (outputs, mut seqs) = self.parts();
                outputs.fail_request(request, message, &mut seqs);
            }
        }
        self.scheduler.update_speculative(plan, &sampled.tokens())
    }

    /// Emit: output processing streams the step's tokens (forking `n > 1` choices first) and
    /// ends the choices the scheduler ended.
    fn emit(&mut self, sampled: SampledStep<'_>, ended: Vec<(SeqId, SeqEnd)>) {
        let SampledStep {
            at, chunks, forks, ..
        } = sampled;
        let picks = chunks.into_iter().flat_map(|c| {
            let seq = c.seq;
            c.picks.into_iter().map(move |p| (seq, p))
        });
        let (outputs, mut seqs) = self.parts();
        outputs.emit(forks, picks, at, ended, &mut seqs);
    }

    /// Tells the speculator's throughput guard how a pure decode step went (every chunk one
    /// token, maybe with proposals).
    fn observe_decode_step(&mut self, plan: &SchedulerOutput, started: Instant, emitted: usize) {
        let Some(spec) = self.speculator.as_mut() else {
            return;
        };
        let pure_decode = plan
            .chunks
            .iter()
            .all(|c| c.sample && c.tokens.len() == 1 + c.num_draft);
        if pure_decode {
            let speculated = plan.chunks.iter().any(|c| c.num_draft > 0);
            spec.observe_decode_step(plan.chunks.len(), started.elapsed(), emitted, speculated);
        }
    }

    /// Fails the request of `chunk`'s sequence, one of whose rows held non-finite logits, and
    /// logs it (naming the stage that first went non-finite when this engine has not located
    /// a fault yet: see [`crate::fault`] for why only the first).
    fn numerical_fault(&mut self, chunk: &ScheduledChunk, fault: &Fault) {
        let Some((request, adapter)) = self.outputs.request_with_adapter(chunk.seq) else {
            return;
        };
        let scheduler = &self.scheduler;
        self.faults.report(
            fault,
            request,
            self.runner.model(),
            self.layout.dtype,
            adapter,
            || fault::row_input(scheduler.seq(chunk.seq)?.tokens, chunk, fault.position),
        );
        let (outputs, mut seqs) = self.parts();
        outputs.fail_request(request, &fault.error().to_string(), &mut seqs);
    }

    /// The output processor and, apart from it, the owners of sequences it acts on.
    fn parts(&mut self) -> (&mut OutputProcessor, Sequences<'_>) {
        (
            &mut self.outputs,
            Sequences {
                scheduler: &mut self.scheduler,
                speculator: self.speculator.as_mut(),
                next_seq: &mut self.next_seq,
            },
        )
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
        if let Some(states) = s.states {
            self.stats.state_slots_used = states.slots_used;
            self.stats.state_slots_total = states.slots_total;
        }
        self.stats.prefix_cache_hit_rate = s.prefix_hit_rate();
        self.stats.prefix_cache_queried_tokens = s.prefix_queried_tokens;
        self.stats.prefix_cache_hit_tokens = s.prefix_hit_tokens;
        self.stats.tokens_last_step = tokens;
        if tokens > 0 {
            self.stats.steps += 1;
        }
    }
}

/// The scheduler and the speculator, as output processing acts on them.
struct Sequences<'a> {
    scheduler: &'a mut Scheduler,
    speculator: Option<&'a mut Speculator>,
    next_seq: &'a mut SeqId,
}

impl SeqControl for Sequences<'_> {
    fn release(&mut self, seq: SeqId, end: Option<SeqEnd>) {
        if let Some(spec) = self.speculator.as_mut() {
            spec.release(seq);
        }
        if let Some(end) = end {
            self.scheduler.finish(seq, end);
        }
    }

    fn fork(&mut self, parent: SeqId, first_token: u32) -> Result<SeqId, SchedulerError> {
        let child = next_seq_id(self.next_seq);
        self.scheduler.fork(parent, child, first_token)?;
        Ok(child)
    }
}

fn next_seq_id(next: &mut SeqId) -> SeqId {
    *next += 1;
    *next
}

/// Most choices one request may ask for.
pub const MAX_CHOICES: usize = 16;
