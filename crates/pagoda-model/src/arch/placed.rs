//! What a model placed on its devices does, and the types it speaks: [`Placed`], the one
//! trait object a [`super::Model`] holds (a model on one device, `super::parts::Parts`, or
//! split over two, [`super::split`]), and the batch a forward pass runs ([`BatchSegment`],
//! [`Logits`]) and the stages [`super::Model::first_non_finite`] names ([`NonFiniteStage`]).
//!
//! Invariant: [`Placed`]'s methods are called once per forward pass or per model-level
//! question (never per layer or per token), so the dynamic call costs nothing the pass
//! feels; everything inside it is generic over the backends.

use super::adapter::LoraWeights;
use crate::device::Device;
use crate::{KvDtype, ModelConfig, ModelError, PagedKvCache};
use pagoda_kernels::paged_attention::SeqAttention;
use std::any::Any;
use std::ops::Range;

/// Which positions of a forward pass need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position (generation).
    Last,
    /// Every position (evaluation, golden tests).
    All,
}

/// One sequence's part of a batched forward pass.
#[derive(Debug, Clone, Copy)]
pub struct BatchSegment<'a> {
    /// New tokens, at positions `start..start + tokens.len()`.
    pub tokens: &'a [u32],
    /// Tokens before these are already in the cache through `block_table`.
    pub start: usize,
    /// The sequence's blocks in position order; covers positions `0..start + tokens.len()`.
    pub block_table: &'a [u32],
    /// `None`: no logits; [`Logits::Last`]: the last row's; [`Logits::All`]: every row's.
    pub logits: Option<Logits>,
    /// A LoRA adapter applied, unmerged, to this segment's rows only (checked against the
    /// model when it was prepared; one that does not [`fit`](LoraWeights::fits) is an error).
    pub adapter: Option<&'a LoraWeights>,
    /// The sequence's recurrent-state slot in the cache (hybrid models; `None` otherwise).
    pub state_slot: Option<u32>,
}

/// A stage of the forward pass, as [`super::Model::first_non_finite`] names where non-finite values
/// (NaN, ±inf) first appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonFiniteStage {
    /// The token embedding rows (scaled as the forward pass scales them).
    Embedding,
    /// The output of decoder layer `0..n_layers`.
    Layer(usize),
    /// The final norm of the last position.
    OutputNorm,
    /// The output head's logits of the last position (after soft-capping, if any).
    OutputHead,
}

impl std::fmt::Display for NonFiniteStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NonFiniteStage::Embedding => f.write_str("the token embedding"),
            NonFiniteStage::Layer(i) => write!(f, "layer {i}"),
            NonFiniteStage::OutputNorm => f.write_str("the final norm"),
            NonFiniteStage::OutputHead => f.write_str("the output head"),
        }
    }
}

/// A model's weights placed on the devices that run them: one `Parts` (a model on one
/// device) or a `Split` (two). Everything the model does that depends on where it
/// runs goes through here, one dynamic call per forward pass; the pass itself is generic
/// over the backends.
pub(crate) trait Placed: Send + Sync + std::fmt::Debug {
    /// The forward pass of a validated batch laid out as `seqs`, over `cache`.
    fn forward_batch(
        &self,
        cfg: &ModelConfig,
        segments: &[BatchSegment<'_>],
        seqs: &[SeqAttention<'_>],
        logit_rows: &[Range<usize>],
        cache: &mut PagedKvCache,
    ) -> Result<Vec<f32>, ModelError>;

    /// A paged cache on the devices of the layers (`block_size` is not zero).
    fn new_cache(
        &self,
        cfg: &ModelConfig,
        n_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Result<PagedKvCache, ModelError>;

    /// The device the forward pass ends on (the one holding the output head).
    fn device(&self) -> Device;

    /// That device's free and total memory (`None` for host memory).
    fn memory_info(&self) -> Result<Option<(u64, u64)>, ModelError>;

    /// See [`super::Model::workspace_bytes`].
    fn workspace_bytes(&self, cfg: &ModelConfig, rows: usize, logit_rows: usize) -> u64;

    /// Decoder layers whose K/V live outside host memory.
    fn kv_layers_on_device(&self) -> usize;

    /// `(rows, cols)` of the linear named `name`.
    fn linear_shape(&self, name: &str) -> Option<(usize, usize)>;

    /// See [`super::Model::first_non_finite`] (`tokens` are non-empty and within the vocabulary).
    fn first_non_finite(
        &self,
        cfg: &ModelConfig,
        tokens: &[u32],
        dtype: KvDtype,
    ) -> Result<Option<NonFiniteStage>, ModelError>;

    /// For the operations of one backend only (layer-by-layer calibration on the CPU).
    fn as_any(&self) -> &dyn Any;
}

/// The rows of the batch whose logits the segments asked for, in segment order.
pub(crate) fn logit_rows(
    segments: &[BatchSegment<'_>],
    seqs: &[SeqAttention<'_>],
) -> Vec<Range<usize>> {
    segments
        .iter()
        .zip(seqs)
        .filter_map(|(seg, seq)| match seg.logits? {
            Logits::Last => Some(seq.rows.end - 1..seq.rows.end),
            Logits::All => Some(seq.rows.clone()),
        })
        .collect()
}
