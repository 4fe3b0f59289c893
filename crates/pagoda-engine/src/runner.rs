//! Executes one scheduled step on the model: copy-on-write block copies, then one batched
//! forward pass over every scheduled chunk (each under its request's LoRA adapter, if any),
//! returning logits for the chunks that sample.
//!
//! A hybrid model's recurrent-state slots are the scheduler's to hand out
//! (`scheduler/states.rs`): each chunk names its slot, and the runner copies slots as the step
//! says — snapshots into resuming sequences and parents into forks before the pass, live
//! states into prefix snapshots after it.
//!
//! Invariant: the runner never decides who runs; it does exactly what the
//! [`SchedulerOutput`] says, and owns the paged KV memory the block pool's ids index and
//! the state slots of its running sequences.

use crate::scheduler::SchedulerOutput;
use crate::EngineError;
use pagoda_model::arch::{BatchSegment, Logits, LoraWeights, Model};
use pagoda_model::PagedKvCache;
use std::sync::Arc;

pub struct ModelRunner {
    model: Arc<Model>,
    cache: PagedKvCache,
}

impl ModelRunner {
    pub fn new(model: Arc<Model>, cache: PagedKvCache) -> Self {
        ModelRunner { model, cache }
    }

    /// A runner for a hybrid model whose cache keeps `slots` recurrent-state slots (the
    /// scheduler's state pool's size).
    pub fn with_state_slots(model: Arc<Model>, mut cache: PagedKvCache, slots: usize) -> Self {
        cache.set_state_slots(slots);
        ModelRunner { model, cache }
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
        self.execute_with_adapters(step, &[])
    }

    /// [`execute`](Self::execute) with chunk `i`'s rows under LoRA adapter `adapters[i]`
    /// (missing entries: the base model).
    pub fn execute_with_adapters(
        &mut self,
        step: &SchedulerOutput,
        adapters: &[Option<LoraWeights>],
    ) -> Result<Vec<f32>, EngineError> {
        for &(src, dst) in &step.copies {
            self.cache.copy_block(src, dst)?;
        }
        for &(src, dst) in &step.state_copies {
            self.cache.copy_state_slot(src, dst);
        }
        if step.chunks.is_empty() {
            return Ok(Vec::new());
        }
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
                state_slot: c.state_slot,
            })
            .collect();
        let logits = self.model.forward_batch(&segments, &mut self.cache)?;
        for &(live, snapshot) in &step.state_snapshots {
            self.cache.copy_state_slot(live, snapshot);
        }
        Ok(logits)
    }
}
