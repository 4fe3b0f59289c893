//! Speculative decoding: proposals for the next tokens of decoding sequences, verified by the
//! target in the same step as everything else (continuous batching, paged KV).
//!
//! Each step, before scheduling, [`Speculator::propose`] asks the proposer — n-gram prompt
//! lookup ([`ngram`]) or a draft model ([`draft`]) — for up to `k` tokens per decoding
//! sequence (`k` from [`adaptive`]) and hands them to the scheduler, which appends them to the
//! sequence's decode chunk. The target computes logits for the last token and every proposal
//! in one forward pass; the engine then samples row by row with the request's own sampler and
//! keeps proposals while the sampled token equals the proposal, ending with the first sampled
//! token that differs (or the one after the last proposal). The scheduler rolls back the KV
//! of rejected proposals.
//!
//! **Exactness.** Proposals are deterministic (prompt lookup, or the draft's argmax), i.e. a
//! point-mass draft distribution `q = δ(d)`. Rejection sampling (Leviathan et al. 2023, Chen
//! et al. 2023) then accepts `d` with probability `min(1, p(d)/q(d)) = p(d)` and on rejection
//! samples from `norm(max(0, p - q))` = `p` without `d`. Sampling `x ~ p` and accepting iff
//! `x == d` (else emitting `x`) has exactly that law: `P(d) = p(d)`, `P(y) = p(y)` for `y ≠ d`.
//! So every emitted token follows the target's distribution after the request's penalties,
//! temperature and truncation; greedy output equals greedy decoding without speculation up to
//! floating-point differences between a one-row and a many-row forward pass.
//!
//! A measured guard ([`guard`]) stops proposals altogether (with periodic probes) while
//! decode steps with proposals emit fewer tokens per second than steps without; it also runs
//! an occasional step without proposals so that the plain rate is always measured.
//!
//! Invariants: proposals are only made for sequences whose request allows speculation and
//! has one choice; a proposer error turns speculation off for that step (decoding goes on);
//! the counters only grow.

pub mod adaptive;
pub mod cost;
pub mod draft;
pub mod guard;
pub mod ngram;

use crate::scheduler::SeqId;
use crate::EngineError;
use adaptive::{AdaptiveK, SpecCosts};
use cost::CostModel;
use draft::{DraftProposer, DraftQuery};
use guard::{GuardDecision, ThroughputGuard};
use ngram::NgramProposer;
use pagoda_model::arch::Model;
use pagoda_model::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Most tokens one proposal may hold.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// Uncached tokens a draft may feed before its proposals and the step still count as a
/// steady decode step (after a rejection or a plain step it feeds one or two).
const CATCH_UP_TOKENS: usize = 4;

/// Which proposer speculation uses.
#[derive(Clone)]
pub enum ProposerConfig {
    /// Prompt lookup over the sequence's own tokens.
    Ngram(NgramProposer),
    /// A smaller model sharing the target's tokenizer.
    Draft {
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
    },
}

impl std::fmt::Debug for ProposerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProposerConfig::Ngram(n) => write!(f, "Ngram({}..={})", n.min_n, n.max_n),
            ProposerConfig::Draft { model, .. } => write!(
                f,
                "Draft({} layers, dim {})",
                model.config().n_layers,
                model.config().hidden_size
            ),
        }
    }
}

/// Speculative decoding settings of an engine.
#[derive(Debug, Clone)]
pub struct SpeculativeConfig {
    pub proposer: ProposerConfig,
    /// Most tokens proposed per step (`k`), `1..=MAX_SPECULATIVE_TOKENS`.
    pub num_tokens: usize,
    /// Adapt `k` per sequence to its acceptance and the measured costs (0 turns it off while
    /// acceptance is too low to pay), and stop proposing while speculative steps measure
    /// slower than plain ones; `false` always proposes `num_tokens`.
    pub adaptive: bool,
}

impl SpeculativeConfig {
    pub fn validate(&self) -> Result<(), EngineError> {
        if self.num_tokens == 0 || self.num_tokens > MAX_SPECULATIVE_TOKENS {
            return Err(EngineError::InvalidConfig(format!(
                "speculative tokens must be between 1 and {MAX_SPECULATIVE_TOKENS}, got {}",
                self.num_tokens
            )));
        }
        if let ProposerConfig::Ngram(n) = &self.proposer {
            if n.min_n == 0 || n.min_n > n.max_n {
                return Err(EngineError::InvalidConfig(format!(
                    "n-gram lengths must satisfy 1 <= min <= max, got {}..={}",
                    n.min_n, n.max_n
                )));
            }
        }
        Ok(())
    }
}

/// Counters of speculation since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecStats {
    /// Verification chunks (decode steps that carried proposals).
    pub drafts: u64,
    /// Tokens proposed and verified.
    pub proposed_tokens: u64,
    /// Of those, accepted.
    pub accepted_tokens: u64,
}

impl SpecStats {
    /// Share of proposed tokens accepted (0 before any).
    pub fn acceptance_rate(&self) -> f64 {
        if self.proposed_tokens == 0 {
            0.0
        } else {
            self.accepted_tokens as f64 / self.proposed_tokens as f64
        }
    }

    /// Mean tokens emitted per verification step: accepted proposals plus the sampled one.
    pub fn mean_acceptance_length(&self) -> f64 {
        if self.drafts == 0 {
            0.0
        } else {
            1.0 + self.accepted_tokens as f64 / self.drafts as f64
        }
    }
}

enum Proposer {
    Ngram(NgramProposer),
    Draft(Box<DraftProposer>),
}

/// The speculation state of one engine. See the module docs.
pub struct Speculator {
    proposer: Proposer,
    max_k: usize,
    adaptive: bool,
    per_seq: HashMap<SeqId, AdaptiveK>,
    stats: SpecStats,
    costs: CostModel,
    guard: ThroughputGuard,
    /// This step's proposals included a draft's catch-up prefill (the step is not timed).
    warming_up: bool,
}

impl std::fmt::Debug for Speculator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculator")
            .field("max_k", &self.max_k)
            .field("adaptive", &self.adaptive)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Speculator {
    /// Builds the proposer (a draft's KV cache holds `capacity_tokens` positions).
    pub fn new(
        config: &SpeculativeConfig,
        target_tokenizer: &Tokenizer,
        capacity_tokens: usize,
    ) -> Result<Self, EngineError> {
        config.validate()?;
        let draft_default = match &config.proposer {
            ProposerConfig::Ngram(_) => 0.0,
            ProposerConfig::Draft { .. } => 0.3,
        };
        let proposer = match &config.proposer {
            ProposerConfig::Ngram(n) => Proposer::Ngram(*n),
            ProposerConfig::Draft { model, tokenizer } => Proposer::Draft(Box::new(
                DraftProposer::new(model.clone(), tokenizer, target_tokenizer, capacity_tokens)?,
            )),
        };
        Ok(Speculator {
            proposer,
            max_k: config.num_tokens,
            adaptive: config.adaptive,
            per_seq: HashMap::new(),
            stats: SpecStats::default(),
            costs: CostModel::new(draft_default),
            guard: ThroughputGuard::default(),
            warming_up: false,
        })
    }

    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// Costs relative to a plain decode step for a step with `batch` decoding sequences,
    /// measured (defaults until measured).
    pub fn costs(&self, batch: usize) -> SpecCosts {
        self.costs.costs(batch)
    }

    /// Proposals for `seqs` (sequence id and its tokens so far), each as long as its
    /// adaptive `k` allows; sequences with `k = 0` get none.
    pub fn propose(&mut self, seqs: &[(SeqId, &[u32])]) -> Vec<(SeqId, Vec<u32>)> {
        self.warming_up = false;
        let decision = if self.adaptive {
            self.guard.decide(seqs.len())
        } else {
            GuardDecision::Speculate
        };
        if !decision.proposes() {
            return Vec::new();
        }
        let costs = self.costs(seqs.len());
        let (max_k, adaptive) = (self.max_k, self.adaptive);
        let wanted: Vec<(SeqId, &[u32], usize)> = seqs
            .iter()
            .map(|&(id, tokens)| {
                let controller = self
                    .per_seq
                    .entry(id)
                    .or_insert_with(|| AdaptiveK::new(max_k, adaptive));
                let k = match decision {
                    GuardDecision::Probe => controller.probe_k(costs),
                    _ => controller.next_k(costs),
                };
                (id, tokens, k)
            })
            .filter(|&(_, _, k)| k > 0)
            .collect();
        match &mut self.proposer {
            Proposer::Ngram(p) => wanted
                .into_iter()
                .map(|(id, tokens, k)| (id, p.propose(tokens, k)))
                .filter(|(_, d)| !d.is_empty())
                .collect(),
            Proposer::Draft(d) => {
                let queries: Vec<DraftQuery<'_>> = wanted
                    .iter()
                    .map(|&(seq, tokens, k)| DraftQuery { seq, tokens, k })
                    .collect();
                let passes = queries.iter().map(|q| q.k).max().unwrap_or(0);
                // A draft catching up on a prompt (a sequence's first proposal) runs a
                // prefill: neither a draft pass's cost nor a decode step's.
                self.warming_up = queries
                    .iter()
                    .any(|q| d.uncached(q.seq, q.tokens) > CATCH_UP_TOKENS);
                let t0 = std::time::Instant::now();
                match d.propose(&queries) {
                    Ok(map) => {
                        if passes > 0 && !self.warming_up {
                            let per = t0.elapsed().as_secs_f64() / passes as f64;
                            self.costs.observe_draft_pass(per);
                        }
                        map.into_iter().filter(|(_, d)| !d.is_empty()).collect()
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "draft model failed; decoding without speculation this step");
                        Vec::new()
                    }
                }
            }
        }
    }

    /// Records one verification of `seq`: `accepted` of `proposed` tokens taken.
    pub fn observe(&mut self, seq: SeqId, proposed: usize, accepted: usize) {
        self.stats.drafts += 1;
        self.stats.proposed_tokens += proposed as u64;
        self.stats.accepted_tokens += accepted as u64;
        if let Some(a) = self.per_seq.get_mut(&seq) {
            a.observe(proposed, accepted);
        }
    }

    /// Records the target's time for a step of `tokens` tokens (the cost model behind
    /// adaptive `k`).
    pub fn observe_step(&mut self, elapsed: Duration, tokens: usize) {
        self.costs.observe_step(tokens, elapsed.as_secs_f64());
    }

    /// Records a pure decode step of `batch` sequences (every chunk one token, maybe with
    /// proposals): `emitted` tokens in `elapsed`, proposals included or not (the guard
    /// against speculation that measures slower than plain decoding).
    pub fn observe_decode_step(
        &mut self,
        batch: usize,
        elapsed: Duration,
        emitted: usize,
        speculative: bool,
    ) {
        // Taken, not read: a step without proposals does not call `propose`.
        if std::mem::take(&mut self.warming_up) {
            return;
        }
        self.guard
            .observe(batch, emitted, elapsed.as_secs_f64(), speculative);
    }

    /// Forgets sequence `seq` (ended or aborted).
    pub fn release(&mut self, seq: SeqId) {
        self.per_seq.remove(&seq);
        if let Proposer::Draft(d) = &mut self.proposer {
            d.release(seq);
        }
    }
}
