//! Setting up one backend's forward pass over a KV cache: [`OnCache::with_pass`] takes the
//! backend's K/V layers and reusable scratch out of a [`PagedKvCache`] on its device, builds
//! the backend's [`Backend::Pass`] for the batch (rows → sequence, position, block table; the
//! LoRA adapters by rows) and runs a body over them. A model on one device runs its whole
//! pass in one body; a split model ([`super::split`]) runs one body per device.
//!
//! Invariants: the CPU's body runs hot (`pagoda_kernels::hot_pool::run_hot`: on a worker of the
//! kernels' pool, helpers polling between its parallel loops) with the CPU LoRA batch cleared
//! before and after it; the GPU's body gets the batch's block tables uploaded once; a cache
//! on another device (or split) is an error, never a panic.

use super::backend::{Activations, Backend};
use super::cpu::{Cpu, CpuPass};
use super::cuda::{Cuda, CudaPass};
use super::BatchSegment;
use crate::{ModelError, PagedKvCache};
use pagoda_kernels::paged_attention::SeqAttention;

/// A backend that can run a forward pass over a [`PagedKvCache`] of its device.
pub(crate) trait OnCache: Backend {
    /// Runs `body` over `cache`'s K/V layers, the pass's activations and the pass of the
    /// batch `segments` (laid out as `seqs`).
    fn with_pass<R: Send>(
        &self,
        cache: &mut PagedKvCache,
        segments: &[BatchSegment<'_>],
        seqs: &[SeqAttention<'_>],
        body: impl for<'p> FnOnce(
                &mut [Self::KvLayer],
                &mut Activations<Self::Act>,
                &mut Self::Pass<'p>,
            ) -> Result<R, ModelError>
            + Send,
    ) -> Result<R, ModelError>;
}

impl OnCache for Cpu {
    fn with_pass<R: Send>(
        &self,
        cache: &mut PagedKvCache,
        segments: &[BatchSegment<'_>],
        seqs: &[SeqAttention<'_>],
        body: impl for<'p> FnOnce(
                &mut [Self::KvLayer],
                &mut Activations<Vec<f32>>,
                &mut CpuPass<'p>,
            ) -> Result<R, ModelError>
            + Send,
    ) -> Result<R, ModelError> {
        let (kv, scratch) = cache.cpu_parts_mut()?;
        // The whole pass runs hot (`pagoda_kernels::hot_pool`): on a worker of the kernels'
        // rayon pool, with the hot pool's helpers polling between its parallel loops instead
        // of parking, so no kernel call waits for a sleeping thread (or a halted vCPU) to
        // wake. A caller already inside a pass runs it in place.
        pagoda_kernels::hot_pool::run_hot(|| {
            scratch.lora.clear();
            for (seg, seq) in segments.iter().zip(seqs) {
                if let Some(a) = seg.adapter {
                    scratch.lora.push(seq.rows.clone(), a.clone());
                }
            }
            let mut pass = CpuPass {
                seqs,
                lora: &mut scratch.lora,
                observer: &scratch.observer,
            };
            let out = body(kv, &mut scratch.act, &mut pass);
            // The output head is never adapted (LoraWeights refuses lm_head targets).
            scratch.lora.clear();
            out
        })
    }
}

impl OnCache for Cuda {
    fn with_pass<R: Send>(
        &self,
        cache: &mut PagedKvCache,
        segments: &[BatchSegment<'_>],
        seqs: &[SeqAttention<'_>],
        body: impl for<'p> FnOnce(
                &mut [Self::KvLayer],
                &mut Activations<Self::Act>,
                &mut CudaPass<'p>,
            ) -> Result<R, ModelError>
            + Send,
    ) -> Result<R, ModelError> {
        let block_size = cache.block_size();
        let (kv, scratch) = cache.cuda_parts_mut()?;
        let spans: Vec<pagoda_cuda::SeqSpan<'_>> = seqs
            .iter()
            .map(|s| pagoda_cuda::SeqSpan {
                first_row: s.rows.start,
                rows: s.rows.len(),
                start: s.start,
                block_table: s.block_table,
            })
            .collect();
        let batch = pagoda_cuda::AttentionBatch::upload(self.gpu(), &spans, block_size)?;
        let lora = segments
            .iter()
            .zip(seqs)
            .filter_map(|(seg, seq)| Some((seq.rows.clone(), seg.adapter?.clone())))
            .collect();
        let (act, parts_of_scratch) = scratch.split();
        let mut pass = CudaPass {
            batch,
            block_size,
            lora,
            scratch: parts_of_scratch,
        };
        body(kv, act, &mut pass)
    }
}
