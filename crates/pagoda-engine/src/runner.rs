//! Executes one scheduled step on the model: copy-on-write block copies, then one batched
//! forward pass over every scheduled chunk (each under its request's LoRA adapter, if any),
//! returning logits for the chunks that sample.
//!
//! A hybrid model's sequences each get a recurrent-state slot ([`crate::state_pool`]) while
//! they run: the cache holds one per sequence the scheduler may run at once, a sequence
//! takes one when it first runs (a forked `n > 1` choice: a copy of its parent's, see
//! [`ModelRunner::apply_forks`]) and gives it back when it no longer runs (finished, aborted
//! or preempted; a preempted sequence recomputes from position 0, where its new slot starts
//! from zeros).
//!
//! Invariant: the runner never decides who runs; it does exactly what the
//! [`SchedulerOutput`] says, and owns the paged KV memory the block pool's ids index and
//! the state slots of its running sequences.

use crate::scheduler::{SchedulerOutput, SeqId};
use crate::state_pool::{SlotId, StatePool};
use crate::EngineError;
use pagoda_model::arch::{BatchSegment, Logits, LoraWeights, Model};
use pagoda_model::PagedKvCache;
use std::collections::HashMap;
use std::sync::Arc;

pub struct ModelRunner {
    model: Arc<Model>,
    cache: PagedKvCache,
    /// A hybrid model's state slots: the pool and each running sequence's slot.
    states: Option<(StatePool, HashMap<SeqId, SlotId>)>,
}

impl ModelRunner {
    pub fn new(model: Arc<Model>, cache: PagedKvCache) -> Self {
        ModelRunner {
            model,
            cache,
            states: None,
        }
    }

    /// A runner for a hybrid model: `max_seqs` state slots (the most sequences the scheduler
    /// runs at once), each `slot_bytes` bytes.
    pub fn with_state_slots(
        model: Arc<Model>,
        mut cache: PagedKvCache,
        max_seqs: usize,
        slot_bytes: usize,
    ) -> Self {
        cache.set_state_slots(max_seqs);
        ModelRunner {
            model,
            cache,
            states: Some((StatePool::new(max_seqs, slot_bytes, false), HashMap::new())),
        }
    }

    /// State slots in use (running sequences of a hybrid model) and in all.
    pub fn state_slots_used(&self) -> Option<(usize, usize)> {
        self.states.as_ref().map(|(pool, _)| {
            let s = pool.stats();
            (s.slots_used, s.slots_total)
        })
    }

    /// A hybrid model's forks (`(parent, child)`, from the scheduler's output): each child
    /// takes a slot holding a copy of its parent's state (the parent has computed exactly
    /// the prompt the child shares, and nothing ran since the fork). A parent without a slot
    /// leaves its child without one (it then recomputes). A no-op for transformers.
    pub fn apply_forks(&mut self, forks: &[(SeqId, SeqId)]) {
        let Some((pool, by_seq)) = self.states.as_mut() else {
            return;
        };
        for &(parent, child) in forks {
            let Some(&src) = by_seq.get(&parent) else {
                continue;
            };
            let Some(dst) = pool.allocate_live() else {
                continue;
            };
            self.cache.copy_state_slot(src, dst);
            by_seq.insert(child, dst);
        }
    }

    /// Each chunk's state slot: slots of sequences that no longer run go back first, then a
    /// chunk's sequence keeps its slot or takes a free one (only at position 0: a sequence
    /// cannot resume a state it never had).
    fn state_slots(
        &mut self,
        step: &SchedulerOutput,
        running: &dyn Fn(SeqId) -> bool,
    ) -> Result<Vec<Option<u32>>, EngineError> {
        let Some((pool, by_seq)) = self.states.as_mut() else {
            return Ok(vec![None; step.chunks.len()]);
        };
        by_seq.retain(|&seq, &mut slot| {
            let keep = running(seq);
            if !keep {
                pool.release(slot);
            }
            keep
        });
        step.chunks
            .iter()
            .map(|c| {
                if let Some(&slot) = by_seq.get(&c.seq) {
                    return Ok(Some(slot));
                }
                if c.start != 0 {
                    return Err(EngineError::InvalidRequest(format!(
                        "sequence {} resumes at position {} without a recurrent state (a \
                         hybrid model's state is not shared through the prefix cache or a fork)",
                        c.seq, c.start
                    )));
                }
                let slot = pool.allocate_live().ok_or_else(|| {
                    EngineError::InvalidRequest(
                        "no free recurrent-state slot: more sequences run than the cache was \
                         made for"
                            .into(),
                    )
                })?;
                by_seq.insert(c.seq, slot);
                Ok(Some(slot))
            })
            .collect()
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn cache(&self) -> &PagedKvCache {
        &self.cache
    }

    /// Runs the step; returns logits in chunk order, [`ScheduledChunk::sample_rows`] rows per
    /// chunk (one for a sampling chunk, `num_draft + 1` when it carries proposals).
    ///
    /// [`ScheduledChunk::sample_rows`]: crate::scheduler::ScheduledChunk::sample_rows
    pub fn execute(&mut self, step: &SchedulerOutput) -> Result<Vec<f32>, EngineError> {
        self.execute_with_adapters(step, &[], &|_| true)
    }

    /// [`execute`](Self::execute) with chunk `i`'s rows under LoRA adapter `adapters[i]`
    /// (missing entries: the base model); `running` says which sequences still run (a hybrid
    /// model's state slots of the others go back).
    pub fn execute_with_adapters(
        &mut self,
        step: &SchedulerOutput,
        adapters: &[Option<LoraWeights>],
        running: &dyn Fn(SeqId) -> bool,
    ) -> Result<Vec<f32>, EngineError> {
        for &(src, dst) in &step.copies {
            self.cache.copy_block(src, dst)?;
        }
        if step.chunks.is_empty() {
            return Ok(Vec::new());
        }
        let slots = self.state_slots(step, running)?;
        let segments: Vec<BatchSegment<'_>> = step
            .chunks
            .iter()
            .enumerate()
            .map(|(i, c)| BatchSegment {
                tokens: &c.tokens,
                start: c.start,
                block_table: &c.block_table,
                logits: match (c.sample, c.num_draft) {
                    (false, _) => None,
                    (true, 0) => Some(Logits::Last),
                    // Proposals: the last known token's row and every proposal's.
                    (true, _) => Some(Logits::All),
                },
                adapter: adapters.get(i).and_then(Option::as_ref),
                state_slot: slots[i],
            })
            .collect();
        Ok(self.model.forward_batch(&segments, &mut self.cache)?)
    }
}
