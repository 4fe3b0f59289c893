//! Output processing: the requests in flight as their callers see them. Owns each request's
//! event stream, prompt and timings, and each choice's output state ([`Choice`]: its sampler,
//! incremental detokenizer and stop matcher); turns sampled tokens into [`TokenEvent`]s
//! (text, logprobs, `Finished` with usage and timings, `Error`), starts the extra choices of
//! an `n > 1` request from its first choice's prompt logits, and ends choices and requests.
//! As vLLM keeps its output processor out of the engine core's loop, the step only hands it
//! the step's sampled tokens and ended sequences ([`OutputProcessor::emit`]).
//!
//! It never touches the scheduler or the speculator itself: what it decides about sequences
//! (a choice ended, a request failed or was abandoned, a forked choice starts) it asks of a
//! [`SeqControl`] at the moment it decides, so the sequence side changes in the same order as
//! the output side.
//!
//! Invariants: a sequence id has a [`ChoiceProgress`] exactly while its choice may still emit;
//! every request gets one `Finished` event per choice (`index` `0..n`) or one `Error`, then is
//! forgotten; a choice whose output ends is released from the sequence side before its
//! `Finished` is sent; a request whose caller went away is aborted at its next token.

use crate::choice::{Choice, SampleError};
use crate::constraint::CompiledConstraint;
use crate::fault::{Fault, Located};
use crate::request::{EngineRequest, RequestId, RequestTimings, TokenEvent, Usage};
use crate::sampling::SampledToken;
use crate::scheduler::{ScheduledChunk, SchedulerError, SeqEnd, SeqId};
use crate::stop::FinishReason;
use flume::Sender;
use pagoda_model::arch::LoraWeights;
use pagoda_model::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// What output processing asks of the owners of sequences (the scheduler and the speculator).
pub(crate) trait SeqControl {
    /// The choice of `seq` is over: forget its speculation state and, when `end` is given,
    /// take it out of the scheduler (its KV blocks go back to the pool). `None`: the
    /// scheduler ended it already.
    fn release(&mut self, seq: SeqId, end: Option<SeqEnd>);

    /// Starts a new sequence forked from `parent`'s prompt, continuing with `first_token`;
    /// returns its id.
    fn fork(&mut self, parent: SeqId, first_token: u32) -> Result<SeqId, SchedulerError>;
}

/// Counters of what output processing emitted since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OutputCounters {
    /// Tokens streamed (EOS and stop tokens are not output).
    pub generation_tokens: u64,
    /// Requests whose every choice finished (not failed, not aborted).
    pub requests_finished: u64,
}

/// One request in flight, as its caller sees it.
struct RequestOutput {
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
    /// The request's compiled constraint in its initial state: every choice's matcher is a
    /// copy of it.
    constraint: Option<CompiledConstraint>,
}

/// The output state of one choice of a request (one sequence in the scheduler).
struct ChoiceProgress {
    request: RequestId,
    index: usize,
    choice: Choice,
    first_token: Option<Instant>,
}

/// What sampling a chunk needs of its choice: the choice, its request's prompt, and whether
/// the request still has choices to fork from this row.
pub(crate) struct ChoiceSampling<'a> {
    pub choice: &'a mut Choice,
    pub prompt: &'a [u32],
    pub request: RequestId,
    pub forks_pending: bool,
}

/// The first row of logits of a request whose other choices are still to start: each of
/// them samples its first token from it ([`OutputProcessor::emit`]).
#[derive(Debug)]
pub(crate) struct Fork {
    pub parent: SeqId,
    pub request: RequestId,
    pub logits: Vec<f32>,
}

/// The requests and choices in flight. See the module docs.
pub(crate) struct OutputProcessor {
    tokenizer: Arc<Tokenizer>,
    requests: HashMap<RequestId, RequestOutput>,
    choices: HashMap<SeqId, ChoiceProgress>,
    counters: OutputCounters,
}

impl OutputProcessor {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        OutputProcessor {
            tokenizer,
            requests: HashMap::new(),
            choices: HashMap::new(),
            counters: OutputCounters::default(),
        }
    }

    /// No request is in flight.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    pub fn counters(&self) -> OutputCounters {
        self.counters
    }

    /// Starts request `id`, its first choice being sequence `seq` (already in the scheduler);
    /// `constraint`: its spec compiled.
    pub fn add(
        &mut self,
        id: RequestId,
        seq: SeqId,
        request: EngineRequest,
        constraint: Option<CompiledConstraint>,
        events: Sender<TokenEvent>,
        arrived: Instant,
    ) {
        let choice = new_choice(&self.tokenizer, &request, 0, constraint.as_ref());
        self.choices.insert(
            seq,
            ChoiceProgress {
                request: id,
                index: 0,
                choice,
                first_token: None,
            },
        );
        self.requests.insert(
            id,
            RequestOutput {
                prompt: request.prompt.clone(),
                events,
                live: request.n,
                seqs: vec![seq],
                request,
                arrived,
                first_scheduled: None,
                cached_prompt_tokens: 0,
                constraint,
            },
        );
    }

    /// `seq`'s request allows speculative decoding (it asked for it, has one choice and no
    /// constraint: proposals are not checked against a mask).
    pub fn may_speculate(&self, seq: SeqId) -> bool {
        self.request_of(seq)
            .is_some_and(|r| r.request.speculative && r.request.n == 1 && r.constraint.is_none())
    }

    /// Some choice in flight has a constraint.
    pub fn has_constrained(&self) -> bool {
        self.choices.values().any(|c| c.choice.is_constrained())
    }

    /// Computes, in parallel, the token masks of the constrained choices among `chunks`'
    /// sampling chunks, so sampling finds them in hand. Nothing to do (and nothing done) when
    /// no choice in flight is constrained. A failure is left for sampling to meet and report.
    pub fn prepare_masks(&mut self, chunks: &[ScheduledChunk]) {
        use rayon::prelude::*;
        if !self.has_constrained() {
            return;
        }
        let sampled: std::collections::HashSet<SeqId> =
            chunks.iter().filter(|c| c.sample).map(|c| c.seq).collect();
        let mut todo: Vec<&mut crate::constraint::ChoiceConstraint> = self
            .choices
            .iter_mut()
            .filter(|(seq, _)| sampled.contains(seq))
            .filter_map(|(_, c)| c.choice.constraint_mut())
            .collect();
        if todo.len() == 1 {
            let _ = todo[0].prepare();
            return;
        }
        todo.par_iter_mut().for_each(|c| {
            let _ = c.prepare();
        });
    }

    /// The LoRA adapter of each chunk's request (`None`: the base model).
    pub fn adapters(&self, chunks: &[ScheduledChunk]) -> Vec<Option<LoraWeights>> {
        chunks
            .iter()
            .map(|c| self.request_of(c.seq)?.request.adapter.clone())
            .collect()
    }

    /// The request `seq` is a choice of, and whether it runs under a LoRA adapter.
    pub fn request_with_adapter(&self, seq: SeqId) -> Option<(RequestId, bool)> {
        let request = self.choices.get(&seq)?.request;
        let adapter = self
            .requests
            .get(&request)
            .is_some_and(|r| r.request.adapter.is_some());
        Some((request, adapter))
    }

    /// Records when each request was first scheduled, and how much of its prompt the prefix
    /// cache held then (its first chunk starts after it).
    pub fn mark_scheduled(&mut self, chunks: &[ScheduledChunk], now: Instant) {
        for chunk in chunks {
            let Some(request) = self.choices.get(&chunk.seq).map(|c| c.request) else {
                continue;
            };
            if let Some(req) = self.requests.get_mut(&request) {
                if req.first_scheduled.is_none() {
                    req.first_scheduled = Some(now);
                    req.cached_prompt_tokens = chunk.start;
                }
            }
        }
    }

    /// What sampling `seq`'s chunk needs; `None` when its choice has ended.
    pub fn sampling(&mut self, seq: SeqId) -> Option<ChoiceSampling<'_>> {
        let state = self.choices.get_mut(&seq)?;
        let req = self.requests.get(&state.request)?;
        Some(ChoiceSampling {
            choice: &mut state.choice,
            prompt: &req.prompt,
            request: state.request,
            forks_pending: req.request.n > req.seqs.len(),
        })
    }

    /// Emits one step: first the forked choices of `forks` (each samples its first token and
    /// streams it), then every sampled token in order, then the sequences the scheduler ended.
    pub fn emit(
        &mut self,
        forks: Vec<Fork>,
        picks: impl IntoIterator<Item = (SeqId, SampledToken)>,
        at: Instant,
        ended: Vec<(SeqId, SeqEnd)>,
        ctl: &mut impl SeqControl,
    ) {
        for fork in forks {
            self.fork(fork.parent, fork.request, &fork.logits, ctl);
        }
        for (seq, pick) in picks {
            self.deliver(seq, pick, at, ctl);
        }
        self.end_by_scheduler(ended, ctl);
    }

    /// Ends the choices of sequences the scheduler ended (it has already let them go).
    pub fn end_by_scheduler(&mut self, ended: Vec<(SeqId, SeqEnd)>, ctl: &mut impl SeqControl) {
        for (seq, end) in ended {
            self.end_choice(seq, finish_reason(end), None, ctl);
        }
    }

    /// Ends every choice of request `id` now (`Finished` with [`FinishReason::Abort`]).
    /// Unknown ids are ignored.
    pub fn abort(&mut self, id: RequestId, ctl: &mut impl SeqControl) {
        let Some(req) = self.requests.remove(&id) else {
            return;
        };
        let now = Instant::now();
        for &seq in &req.seqs {
            let Some(state) = self.choices.remove(&seq) else {
                ctl.release(seq, None);
                continue;
            };
            ctl.release(seq, Some(SeqEnd::Aborted));
            let _ = req.events.send(finished(
                &req,
                &state,
                FinishReason::Abort,
                String::new(),
                now,
            ));
        }
    }

    /// Fails every request in flight with `message` (after a model fault).
    pub fn fail_all(&mut self, message: &str, ctl: &mut impl SeqControl) {
        let ids: Vec<RequestId> = self.requests.keys().copied().collect();
        for id in ids {
            self.fail_request(id, message, ctl);
        }
        self.choices.clear();
    }

    /// Fails request `id` as a whole: every choice's sequence ends (its KV blocks go back to
    /// the pool), and its stream gets one `Error` and nothing after it. Unknown ids are ignored.
    pub fn fail_request(&mut self, id: RequestId, message: &str, ctl: &mut impl SeqControl) {
        let Some(req) = self.requests.remove(&id) else {
            return;
        };
        for seq in &req.seqs {
            self.choices.remove(seq);
            ctl.release(*seq, Some(SeqEnd::Aborted));
        }
        send_error(&req.events, message);
    }

    /// Starts choices `1..n` of `request` from the parent's prompt blocks, each sampling its
    /// first token from the same logits.
    fn fork(&mut self, parent: SeqId, request: RequestId, base: &[f32], ctl: &mut impl SeqControl) {
        let Some(req) = self.requests.get(&request) else {
            return;
        };
        let (n, have) = (req.request.n, req.seqs.len());
        let sampled_at = Instant::now();
        for index in have..n {
            let Some(req) = self.requests.get(&request) else {
                return;
            };
            let mut choice = new_choice(
                &self.tokenizer,
                &req.request,
                index,
                req.constraint.as_ref(),
            );
            let mut row = base.to_vec();
            let pick = match choice.sample(&mut row, &req.prompt) {
                Ok(pick) => pick,
                Err(SampleError::Constraint(message)) => {
                    self.fail_request(request, &message, ctl);
                    return;
                }
                Err(SampleError::NonFinite(found)) => {
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
                    self.fail_request(request, &fault.error().to_string(), ctl);
                    return;
                }
            };
            let child = match ctl.fork(parent, pick.token) {
                Ok(child) => child,
                Err(e) => {
                    tracing::error!(error = %e, "fork failed");
                    self.fail_request(request, &e.to_string(), ctl);
                    return;
                }
            };
            self.choices.insert(
                child,
                ChoiceProgress {
                    request,
                    index,
                    choice,
                    first_token: None,
                },
            );
            if let Some(req) = self.requests.get_mut(&request) {
                req.seqs.push(child);
            }
            self.deliver(child, pick, sampled_at, ctl);
        }
    }

    /// Hands one sampled token to its choice and streams the result.
    fn deliver(&mut self, seq: SeqId, pick: SampledToken, at: Instant, ctl: &mut impl SeqControl) {
        let Some(state) = self.choices.get_mut(&seq) else {
            return;
        };
        state.first_token.get_or_insert(at);
        let wants_logprobs = state.choice.wants_logprobs();
        let accepted = match state.choice.accept(pick.token, &self.tokenizer) {
            Ok(a) => a,
            Err(e) => {
                let request = state.request;
                self.fail_request(request, &e, ctl);
                return;
            }
        };
        let Some(req) = self.requests.get(&state.request) else {
            return;
        };
        if accepted.kept {
            self.counters.generation_tokens += 1;
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
                self.abort(request, ctl);
                return;
            }
        }
        if let Some(reason) = accepted.ended {
            self.end_choice(seq, reason, Some(SeqEnd::Stopped), ctl);
        }
    }

    /// Ends one choice: releases its sequence (`end`: from the scheduler too, unless the
    /// scheduler ended it itself), flushes held text and sends `Finished`; forgets the request
    /// after its last choice.
    fn end_choice(
        &mut self,
        seq: SeqId,
        reason: FinishReason,
        end: Option<SeqEnd>,
        ctl: &mut impl SeqControl,
    ) {
        let Some(mut state) = self.choices.remove(&seq) else {
            ctl.release(seq, None);
            return;
        };
        ctl.release(seq, end);
        let Some(req) = self.requests.get_mut(&state.request) else {
            return;
        };
        let (text, reason) = state
            .choice
            .finish(&self.tokenizer, reason)
            .unwrap_or((String::new(), reason));
        let _ = req
            .events
            .send(finished(req, &state, reason, text, Instant::now()));
        req.live = req.live.saturating_sub(1);
        if req.live == 0 {
            self.requests.remove(&state.request);
            self.counters.requests_finished += 1;
        }
    }

    fn request_of(&self, seq: SeqId) -> Option<&RequestOutput> {
        self.requests.get(&self.choices.get(&seq)?.request)
    }
}

/// Sends a request's one `Error` event (a caller that went away is not an error here).
pub(crate) fn send_error(events: &Sender<TokenEvent>, message: &str) {
    let _ = events.send(TokenEvent::Error {
        message: message.to_string(),
    });
}

/// Choice `index` of `request`: its own seed (the request's plus the index), its stops, the
/// tokens that end it (the request's stop tokens and, unless ignored, the model's EOS) and
/// its own copy of the request's constraint, whose end tokens always include EOS (allowed
/// only where the grammar accepts, `ignore_eos` or not).
fn new_choice(
    tokenizer: &Tokenizer,
    request: &EngineRequest,
    index: usize,
    constraint: Option<&CompiledConstraint>,
) -> Choice {
    let mut params = request.sampling.clone();
    if let Some(seed) = params.seed {
        params.seed = Some(seed.wrapping_add(index as u64));
    }
    let mut end_tokens = request.stop_token_ids.clone();
    if !request.ignore_eos {
        end_tokens.extend_from_slice(tokenizer.eos_ids());
    }
    let constraint = constraint.map(|c| {
        let mut ends = request.stop_token_ids.clone();
        ends.extend_from_slice(tokenizer.eos_ids());
        c.for_choice(&ends)
    });
    Choice::new(
        params,
        request.stop.clone(),
        end_tokens,
        constraint,
        request.keep_special_tokens,
    )
}

/// The API's finish reason for a sequence the scheduler ended.
fn finish_reason(end: SeqEnd) -> FinishReason {
    match end {
        SeqEnd::Aborted => FinishReason::Abort,
        SeqEnd::Stopped => FinishReason::Stop,
        SeqEnd::Length | SeqEnd::ContextFull => FinishReason::Length,
    }
}

/// The `Finished` event of `state`'s choice of `req`, ended for `reason` at `at` with the
/// last held-back `text`.
fn finished(
    req: &RequestOutput,
    state: &ChoiceProgress,
    reason: FinishReason,
    text: String,
    at: Instant,
) -> TokenEvent {
    TokenEvent::Finished {
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
            finished: at,
        },
    }
}
