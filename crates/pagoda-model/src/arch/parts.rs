//! A model's weights on one backend: [`Parts`], the token embedding, the decoder stack of
//! the model ([`DecoderLayers`]) and the final norm and output head, or the part of them one
//! device holds. A model on one device is one `Parts` holding everything (and is the
//! [`Placed`] the [`super::Model`] runs); a split model ([`super::split`]) is two.
//!
//! Invariants: a part's layers are a range within `0..n_layers` (checked at load); a pass
//! over a part is given exactly its layers' K/V (checked each pass: an error, not a panic);
//! the embedding is scaled, the layers run and the head soft-caps as every architecture's
//! reference does, on any backend.

use super::backend::{Activations, Backend};
use super::decoder::DecoderLayers;
use super::pass::{with_pass, DeviceKv};
use super::per_layer::PerLayerInputs;
use super::placed::{BatchSegment, NonFiniteStage, Placed};
use crate::device::Device;
use crate::kv_cache::KvShape;
use crate::recurrent_state::RecurrentStates;
use crate::weights::Weights;
use crate::{KvCache, KvDtype, ModelConfig, ModelError, PagedKvCache};
use pagoda_kernels::paged_attention::SeqAttention;
use std::any::Any;
use std::ops::Range;

/// A model's weights on backend `B`, or the part of them one device holds: the decoder
/// layers `layers` and, in the part that runs first, the token embedding, in the part that
/// runs last, the final norm and output head. A model on one device is one `Parts` holding
/// everything; a split model ([`split`]) is two.
#[derive(Debug)]
pub(crate) struct Parts<B: Backend> {
    pub(crate) backend: B,
    embedding: Option<B::Linear>,
    /// Per-layer embeddings (Gemma 4), with the token embedding.
    per_layer: Option<PerLayerInputs<B>>,
    /// The final norm and the output head.
    head: Option<(B::Norm, B::Linear)>,
    /// The decoder layers held, within `0..n_layers`.
    pub(crate) layers: Range<usize>,
    pub(crate) stack: DecoderLayers<B>,
}

/// Which parts of a model one [`Parts`] loads.
#[derive(Debug, Clone)]
pub(crate) struct PartSpec {
    pub(crate) layers: Range<usize>,
    pub(crate) embedding: bool,
    pub(crate) head: bool,
}

impl PartSpec {
    /// Everything: a model on one device.
    pub(crate) fn whole(cfg: &ModelConfig) -> Self {
        PartSpec {
            layers: 0..cfg.n_layers,
            embedding: true,
            head: true,
        }
    }
}

impl<B: Backend> Parts<B> {
    pub(crate) fn load(
        backend: B,
        cfg: &ModelConfig,
        weights: &Weights,
    ) -> Result<Self, ModelError> {
        Self::load_part(backend, cfg, weights, &PartSpec::whole(cfg))
    }

    /// Loads only what `spec` names (the layers a part owns, its embedding or head).
    pub(crate) fn load_part(
        backend: B,
        cfg: &ModelConfig,
        weights: &Weights,
        spec: &PartSpec,
    ) -> Result<Self, ModelError> {
        if spec.layers.start > spec.layers.end || spec.layers.end > cfg.n_layers {
            return Err(ModelError::InvalidConfig(format!(
                "layers {:?} of a model with {} layers",
                spec.layers, cfg.n_layers
            )));
        }
        let (v, d) = (cfg.vocab_size, cfg.hidden_size);
        let own_head = weights.contains("output.weight") && !cfg.tie_word_embeddings;
        let (embedding, output) = match (spec.embedding, spec.head) {
            // The embedding is only looked up by row: alone, it keeps the file's layout.
            (true, true) if own_head => (
                Some(backend.load_rows(weights, "token_embd.weight", v, d)?),
                Some(backend.load_linear(weights, "output.weight", None, v, d)?),
            ),
            (true, true) => {
                let tied = backend.load_linear(weights, "token_embd.weight", None, v, d)?;
                (Some(backend.share(&tied)), Some(tied))
            }
            (true, false) => (
                Some(backend.load_rows(weights, "token_embd.weight", v, d)?),
                None,
            ),
            (false, true) => {
                let name = if own_head {
                    "output.weight"
                } else {
                    "token_embd.weight"
                };
                (None, Some(backend.load_linear(weights, name, None, v, d)?))
            }
            (false, false) => (None, None),
        };
        if (cfg.variants.per_layer_input.is_some() || cfg.variants.kv_shared > 0)
            && !(spec.embedding && spec.head)
        {
            return Err(ModelError::InvalidConfig(format!(
                "a {} model cannot be split between devices yet (its layers share K/V or \
                 per-layer inputs); load it on one device",
                cfg.arch.family().display
            )));
        }
        let per_layer = if spec.embedding {
            PerLayerInputs::load(&backend, weights, cfg)?
        } else {
            None
        };
        let stack = DecoderLayers::load(&backend, weights, cfg, spec.layers.clone())?;
        let head = match output {
            Some(output) => Some((
                backend.load_norm(weights, "output_norm.weight", d, cfg)?,
                output,
            )),
            None => None,
        };
        Ok(Parts {
            backend,
            embedding,
            per_layer,
            head,
            layers: spec.layers.clone(),
            stack,
        })
    }

    /// The token embedding (a part without one is a bug of the caller, reported as such).
    pub(crate) fn embedding(&self) -> Result<&B::Linear, ModelError> {
        self.embedding.as_ref().ok_or_else(|| {
            ModelError::InvalidConfig("this part of a split model has no token embedding".into())
        })
    }

    /// The final norm and output head.
    pub(crate) fn head(&self) -> Result<(&B::Norm, &B::Linear), ModelError> {
        self.head.as_ref().map(|(n, h)| (n, h)).ok_or_else(|| {
            ModelError::InvalidConfig("this part of a split model has no output head".into())
        })
    }

    /// The embedding rows of every segment's tokens into `a.x` (`[total, hidden]`), and
    /// their per-layer inputs into `a.per_layer` when the model has them.
    pub(crate) fn embed_segments(
        &self,
        cfg: &ModelConfig,
        segments: &[BatchSegment<'_>],
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        let tokens: Vec<u32> = segments
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        self.backend
            .embed(self.embedding()?, &tokens, cfg.embedding_scale, &mut a.x)?;
        match &self.per_layer {
            Some(p) => p.compute(&self.backend, cfg, &tokens, a, pass),
            None => Ok(()),
        }
    }

    /// This part's decoder layers over `a.x`, in place; `kv` holds their K/V, in order.
    pub(crate) fn run_layers(
        &self,
        cfg: &ModelConfig,
        kv: &mut [B::KvLayer],
        states: &mut RecurrentStates,
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        if kv.len() != self.layers.len() {
            return Err(ModelError::InvalidBatch(format!(
                "a KV cache of {} layers for the {} layers {:?}",
                kv.len(),
                self.layers.len(),
                self.layers
            )));
        }
        self.stack.forward(
            &self.backend,
            cfg,
            self.layers.clone(),
            (kv, states),
            a,
            pass,
        )
    }

    /// The logits of the rows `logit_rows` of `a.x` (final norm, head, soft-cap, logit scale).
    pub(crate) fn run_head(
        &self,
        cfg: &ModelConfig,
        logit_rows: &[Range<usize>],
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        let (norm, output) = self.head()?;
        let x = std::mem::take(&mut a.x);
        let out = self.backend.logits(
            norm,
            output,
            &x,
            logit_rows,
            cfg.final_logit_softcap,
            a,
            pass,
        );
        a.x = x;
        let mut logits = out?;
        if let Some(s) = cfg.logit_scale {
            pagoda_kernels::ops::scale_inplace(&mut logits, 1.0 / s);
        }
        Ok(logits)
    }

    /// The forward pass of a validated batch: embeddings of every segment's tokens, the
    /// layers, then the logits of the rows in `logit_rows`.
    pub(crate) fn run(
        &self,
        cfg: &ModelConfig,
        segments: &[BatchSegment<'_>],
        logit_rows: &[Range<usize>],
        (kv, states): (&mut [B::KvLayer], &mut RecurrentStates),
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        self.embed_segments(cfg, segments, a, pass)?;
        self.run_layers(cfg, kv, states, a, pass)?;
        self.run_head(cfg, logit_rows, a, pass)
    }
}

impl<B: Backend> Parts<B> {
    /// A KV cache of `n_blocks` blocks of `block_size` for this part's layers, on its device.
    pub(crate) fn new_cache(
        &self,
        cfg: &ModelConfig,
        n_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Result<PagedKvCache, ModelError> {
        let shape = KvShape {
            n_blocks,
            block_size,
            dtype,
            kv_dim: cfg.max_kv_dim(),
        };
        let kv_dims: Vec<usize> = self
            .layers
            .clone()
            .map(|i| cfg.layer_kv_cache_dim(i))
            .collect();
        let floats: Vec<usize> = self
            .layers
            .clone()
            .map(|i| cfg.layer_state_floats(i))
            .collect();
        // One sequence's state by default (a single-sequence cache); a server sizes the
        // slots to its sequences (`PagedKvCache::set_state_slots`).
        let states = RecurrentStates::new(&floats, 1);
        DeviceKv::cache(self.backend.clone(), &kv_dims, shape, states)
    }

    /// Layers whose K/V live outside host memory.
    pub(crate) fn kv_layers_on_device(&self) -> usize {
        match self.backend.device() {
            Device::Cpu => 0,
            _ => self.layers.len(),
        }
    }

    /// `(rows, cols)` of this part's linear named `name`.
    pub(crate) fn linear_shape(&self, name: &str) -> Option<(usize, usize)> {
        self.stack
            .linears()
            .find(|l| B::linear_name(l) == name)
            .map(B::linear_shape)
    }

    /// The first stage of [`super::Model::first_non_finite`] (this part holds the embedding):
    /// the embedding rows of `tokens`, in host memory.
    pub(crate) fn embed_to_host(
        &self,
        cfg: &ModelConfig,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        let mut x = B::Act::default();
        self.backend
            .embed(self.embedding()?, tokens, cfg.embedding_scale, &mut x)?;
        self.backend.to_host(&x)
    }

    /// The stages of [`super::Model::first_non_finite`] this part holds after the embedding:
    /// its layers, one at a time, over `x` (the hidden states of one fresh sequence at
    /// positions `0..`, in host memory, in and out), then, where it holds the head, the final
    /// norm and output head of the last position. `cache` holds this part's layers; `table`
    /// covers the sequence. The first stage whose output is not finite, if any.
    pub(crate) fn locate_non_finite(
        &self,
        cfg: &ModelConfig,
        x: &mut Vec<f32>,
        cache: &mut PagedKvCache,
        table: &[u32],
    ) -> Result<Option<NonFiniteStage>, ModelError> {
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
        let d = cfg.hidden_size;
        let n = x.len() / d;
        let seqs = [SeqAttention {
            rows: 0..n,
            start: 0,
            block_table: table,
        }];
        let backend = &self.backend;
        with_pass(
            backend,
            cache,
            std::iter::empty(),
            &seqs,
            |kv, states, a, pass| {
                backend.copy_from_host(x, &mut a.x)?;
                states.bind([0]);
                for layer in self.layers.clone() {
                    self.stack
                        .forward(backend, cfg, layer..layer + 1, (kv, states), a, pass)?;
                    *x = backend.to_host(&a.x)?;
                    if !finite(x) {
                        return Ok(Some(NonFiniteStage::Layer(layer)));
                    }
                }
                let Some((norm, head)) = &self.head else {
                    return Ok(None);
                };
                backend.copy_from_host(&x[x.len() - d..], &mut a.logit_rows)?;
                backend.rms_norm(norm, &a.logit_rows, &mut a.normed)?;
                if !finite(&backend.to_host(&a.normed)?) {
                    return Ok(Some(NonFiniteStage::OutputNorm));
                }
                backend.linears([head], &a.normed, [&mut a.branch], pass)?;
                let mut logits = backend.to_host(&a.branch)?;
                if let Some(cap) = cfg.final_logit_softcap {
                    pagoda_kernels::ops::softcap_inplace(&mut logits, cap);
                }
                if let Some(s) = cfg.logit_scale {
                    pagoda_kernels::ops::scale_inplace(&mut logits, 1.0 / s);
                }
                Ok((!finite(&logits)).then_some(NonFiniteStage::OutputHead))
            },
        )
    }
}

/// A model wholly on `B`'s device.
impl<B: Backend> Placed for Parts<B> {
    fn forward_batch(
        &self,
        cfg: &ModelConfig,
        segments: &[BatchSegment<'_>],
        seqs: &[SeqAttention<'_>],
        logit_rows: &[Range<usize>],
        cache: &mut PagedKvCache,
    ) -> Result<Vec<f32>, ModelError> {
        with_pass(
            &self.backend,
            cache,
            segments.iter().map(|s| s.adapter),
            seqs,
            |kv, states, a, pass| self.run(cfg, segments, logit_rows, (kv, states), a, pass),
        )
    }

    fn new_cache(
        &self,
        cfg: &ModelConfig,
        n_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Result<PagedKvCache, ModelError> {
        Parts::new_cache(self, cfg, n_blocks, block_size, dtype)
    }

    fn device(&self) -> Device {
        self.backend.device()
    }

    fn memory_info(&self) -> Result<Option<(u64, u64)>, ModelError> {
        self.backend.memory_info()
    }

    fn workspace_bytes(&self, cfg: &ModelConfig, rows: usize, logit_rows: usize) -> u64 {
        self.backend.workspace_bytes(cfg, rows, logit_rows)
    }

    fn kv_layers_on_device(&self) -> usize {
        Parts::kv_layers_on_device(self)
    }

    fn linear_shape(&self, name: &str) -> Option<(usize, usize)> {
        Parts::linear_shape(self, name)
    }

    fn first_non_finite(
        &self,
        cfg: &ModelConfig,
        tokens: &[u32],
        dtype: KvDtype,
    ) -> Result<Option<NonFiniteStage>, ModelError> {
        let mut x = self.embed_to_host(cfg, tokens)?;
        if !x.iter().all(|v| v.is_finite()) {
            return Ok(Some(NonFiniteStage::Embedding));
        }
        let table = fresh_sequence(cfg, tokens.len())?;
        let mut cache = Parts::new_cache(self, cfg, table.len(), KvCache::BLOCK_SIZE, dtype)?;
        self.locate_non_finite(cfg, &mut x, &mut cache, &table)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The block table (blocks `0..`, of [`KvCache::BLOCK_SIZE`] positions) of a cache for one
/// fresh sequence of `n` positions, as [`super::Model::first_non_finite`] runs it; a sequence
/// past the context length is an error.
pub(crate) fn fresh_sequence(cfg: &ModelConfig, n: usize) -> Result<Vec<u32>, ModelError> {
    if n > cfg.context_length {
        return Err(ModelError::ContextFull {
            needed: n,
            capacity: cfg.context_length,
        });
    }
    let blocks = n.max(1).div_ceil(KvCache::BLOCK_SIZE);
    Ok((0..blocks as u32).collect())
}
