//! Sampling a step: the rows of logits of every sampling chunk become its sequence's new
//! tokens, each row sampled by the choice's own sampler (penalties, temperature, truncation,
//! seed). A chunk carrying proposals (speculative decoding) keeps sampled tokens while they
//! equal the proposals and ends with the first that differs, or the one after the last
//! proposal (see [`crate::speculative`] for why that is exact).
//!
//! Invariants: rows are consumed in chunk order, [`ScheduledChunk::sample_rows`] per sampling
//! chunk, whether or not its choice still exists; a row holding NaN or infinities is never
//! sampled from: its chunk yields a [`Fault`] and nothing of it is kept; the first row of a
//! request that still has choices to fork is copied before sampling changes it. A
//! constrained choice's row is masked before anything else touches it
//! ([`crate::constraint`]); the masks of a step's constrained choices are computed together,
//! in parallel, before its rows are sampled; a choice whose constraint fails yields a
//! failure naming it and nothing of its chunk is kept.

use crate::choice::SampleError;
use crate::fault::Fault;
use crate::output::{ChoiceSampling, Fork, OutputProcessor};
use crate::sampling::SampledToken;
use crate::scheduler::{ScheduledChunk, SchedulerOutput, SeqId};
use std::time::Instant;

/// What one sampling chunk produced.
#[derive(Debug)]
pub(crate) struct SampledChunk {
    pub seq: SeqId,
    /// The accepted proposals followed by one sampled token (just that token without them).
    pub picks: Vec<SampledToken>,
    /// Proposals the chunk carried.
    pub num_draft: usize,
    /// Of those, accepted.
    pub accepted: usize,
}

/// What sampling a step produced.
#[derive(Debug)]
pub(crate) struct SampledStep<'p> {
    /// When sampling began (the time of the step's tokens).
    pub at: Instant,
    /// Chunks sampled, in chunk order.
    pub chunks: Vec<SampledChunk>,
    /// Requests whose other choices start from this step's rows.
    pub forks: Vec<Fork>,
    /// Chunks with a row of non-finite logits (nothing of them was sampled).
    pub faults: Vec<(&'p ScheduledChunk, Fault)>,
    /// Sequences whose constraint failed, with the message (nothing of them was sampled).
    pub constraint_failures: Vec<(SeqId, String)>,
}

impl SampledStep<'_> {
    /// The new tokens of each sampled sequence, as the scheduler's update takes them.
    pub fn tokens(&self) -> Vec<(SeqId, Vec<u32>)> {
        self.chunks
            .iter()
            .map(|c| (c.seq, c.picks.iter().map(|p| p.token).collect()))
            .collect()
    }

    /// Tokens sampled (proposals accepted included).
    pub fn emitted(&self) -> usize {
        self.chunks.iter().map(|c| c.picks.len()).sum()
    }
}

/// Samples every sampling chunk of `plan` from `logits` (rows of `vocab`, in chunk order, as
/// the runner returns them; sampling may change them in place).
pub(crate) fn sample_step<'p>(
    plan: &'p SchedulerOutput,
    logits: &mut [f32],
    vocab: usize,
    outputs: &mut OutputProcessor,
) -> SampledStep<'p> {
    let mut step = SampledStep {
        at: Instant::now(),
        chunks: Vec::new(),
        forks: Vec::new(),
        faults: Vec::new(),
        constraint_failures: Vec::new(),
    };
    outputs.prepare_masks(&plan.chunks);
    let mut row = 0;
    for chunk in plan.chunks.iter().filter(|c| c.sample) {
        let rows = chunk.sample_rows();
        let chunk_logits = &mut logits[row * vocab..(row + rows) * vocab];
        row += rows;
        let Some(mut choice) = outputs.sampling(chunk.seq) else {
            continue;
        };
        let fork = choice.forks_pending.then(|| Fork {
            parent: chunk.seq,
            request: choice.request,
            logits: chunk_logits[..vocab].to_vec(),
        });
        match sample_chunk(chunk, chunk_logits, vocab, &mut choice) {
            Ok(picks) => {
                step.chunks.push(SampledChunk {
                    seq: chunk.seq,
                    accepted: picks.len() - 1,
                    num_draft: chunk.num_draft,
                    picks,
                });
                step.forks.extend(fork);
            }
            Err(ChunkError::Fault(fault)) => step.faults.push((chunk, fault)),
            Err(ChunkError::Constraint(message)) => {
                step.constraint_failures.push((chunk.seq, message));
            }
        }
    }
    step
}

/// Why a chunk yielded nothing.
enum ChunkError {
    /// A row it would sample from held NaN or infinities.
    Fault(Fault),
    /// Its choice's constraint failed.
    Constraint(String),
}

/// Samples one chunk's rows: one token, or with proposals the accepted ones followed by the
/// first sampled token that differs. `Err`: the fault of the first row it would sample from
/// that holds NaN or infinities, or the failure of the choice's constraint.
fn sample_chunk(
    chunk: &ScheduledChunk,
    rows: &mut [f32],
    vocab: usize,
    state: &mut ChoiceSampling<'_>,
) -> Result<Vec<SampledToken>, ChunkError> {
    let draft = chunk.draft();
    // The rows are those of the chunk's last `sample_rows` tokens.
    let first_row_position = chunk.start + chunk.tokens.len().saturating_sub(chunk.sample_rows());
    let mut picks: Vec<SampledToken> = Vec::with_capacity(draft.len() + 1);
    let mut pending: Vec<u32> = Vec::with_capacity(draft.len() + 1);
    for (i, row) in rows.chunks_exact_mut(vocab).enumerate() {
        let pick = match state.choice.sample_after(row, state.prompt, &pending) {
            Ok(pick) => pick,
            Err(SampleError::Constraint(message)) => return Err(ChunkError::Constraint(message)),
            Err(SampleError::NonFinite(found)) => {
                return Err(ChunkError::Fault(Fault {
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
    Ok(picks)
}
