//! Forward passes: token ids at positions in, logits out, over a paged KV cache.
//!
//! [`Model`] holds the token embedding, the decoder stack ([`decoder`], one for every family,
//! driven by its [`crate::family::Family`] spec) and the final norm and output head,
//! all on one device (`parts.rs`, generic over the [`backend::Backend`]), or split between
//! the CPU and a GPU by layers ([`split`], generic too); which of the two, on which device,
//! is decided in one place, the device registry (`place_on`), and the model reaches it
//! through one trait object (`Placed`), one dynamic call per forward pass.
//! Weights stay borrowed from the model file's mmap, in its own block formats (or, after
//! online quantization at load, in owned buffers of the chosen format: the forward pass
//! cannot tell the two apart); linears of the packable types are copied at load into 16-row
//! strips where the CPU has the strip kernels ([`layers::Linear`]).
//!
//! There is one forward path, [`Model::forward_batch`]: the new tokens of several sequences
//! ([`BatchSegment`]s: decode rows and prefill chunks alike) are concatenated into one
//! `[total_rows, hidden]` batch, every linear layer runs once over all rows, and only RoPE, the
//! K/V writes and attention go per sequence, through its block table into a [`PagedKvCache`].
//! [`Model::forward`] is the one-segment case over a single-sequence [`KvCache`].
//! [`Model::embed`] and [`Model::forward_layer`] run the same stack one decoder layer at a
//! time over one fresh sequence (layer-wise calibration of offline quantization, CPU models
//! only); [`Model::first_non_finite`] does the same on any device, through the backend, to
//! find the stage where NaN/inf first appear.
//!
//! Invariants: input is validated before anything is written (empty batch or segment, token
//! outside the vocabulary, block table too short or naming a block the cache lacks, positions
//! past the context length: errors, never panics); a segment's positions `0..start` are already
//! in the cache through its block table (the caller's bookkeeping); `forward` is called with
//! `start == cache.len()`, and on success the cache holds `start + tokens.len()` positions, on
//! error it is unchanged in length.

pub mod adapter;
pub mod backend;
pub mod blocks;
pub mod cpu;
pub mod cuda;
pub(crate) mod cuda_weights;
pub mod decoder;
pub mod gated_delta_cpu;
pub mod gated_delta_net;
pub mod layers;
pub mod mamba2;
pub mod mamba2_host;
pub mod moe;
mod parts;
mod pass;
pub mod per_layer;
mod placed;
pub mod rope;
pub mod short_conv;
pub mod split;

pub use adapter::LoraWeights;
pub use placed::{BatchSegment, Logits, NonFiniteStage};

use crate::device::{Device, DeviceChoice};
use crate::placement::Placement;
use crate::source::ModelSource;
use crate::weights::Weights;
use crate::{KvCache, KvDtype, ModelConfig, ModelError, PagedKvCache};
use backend::Backend;
use cpu::{Cpu, CpuPass};
use layers::Linear;
use pagoda_kernels::paged_attention::SeqAttention;
use parts::Parts;
use pass::DeviceKv;
use placed::{logit_rows, Placed};

/// The device registry, the one place a device is named: the backend that loads a model's
/// weights onto `device`, wholly, or (`split_at: Some(k)`) with layers `0..k` and the
/// embedding on the CPU and the rest on `device`. Adding a device is its [`Backend`] module
/// and an arm here.
fn place_on(
    cfg: &ModelConfig,
    weights: &Weights,
    device: Device,
    split_at: Option<usize>,
) -> Result<Box<dyn Placed>, ModelError> {
    fn whole<B: Backend>(
        backend: B,
        cfg: &ModelConfig,
        weights: &Weights,
    ) -> Result<Box<dyn Placed>, ModelError> {
        Ok(Box::new(Parts::load(backend, cfg, weights)?))
    }
    fn split<B: Backend>(
        backend: B,
        cfg: &ModelConfig,
        weights: &Weights,
        at: usize,
    ) -> Result<Box<dyn Placed>, ModelError> {
        Ok(Box::new(split::Split::load(cfg, weights, backend, at)?))
    }
    match (device, split_at) {
        (Device::Cpu, _) => whole(Cpu, cfg, weights),
        (Device::Cuda(ordinal), None) => {
            // Room for a pass of a default engine step beside the weights.
            let reserve = cuda::workspace_bytes(cfg, 2048, 256);
            whole(
                cuda::Cuda::for_model(ordinal, weights, reserve)?,
                cfg,
                weights,
            )
        }
        (Device::Cuda(ordinal), Some(at)) => split(cuda::Cuda::on(ordinal)?, cfg, weights, at),
    }
}

/// A model ready to run: config plus shape-checked weights on one device (or split over two).
#[derive(Debug)]
pub struct Model {
    config: ModelConfig,
    weights: Box<dyn Placed>,
}

impl Model {
    /// Builds the forward pass for `source` on the CPU, checking every tensor's presence and
    /// shape.
    pub fn from_source(source: &ModelSource) -> Result<Self, ModelError> {
        Self::from_source_on(source, Device::Cpu)
    }

    /// [`Model::from_source`] with the weights on `device`.
    pub fn from_source_on(source: &ModelSource, device: Device) -> Result<Self, ModelError> {
        Self::build(&source.config, &source.weights, device).map_err(|e| with_path(source, e))
    }

    /// Checks that [`Model::from_source`] would succeed — every tensor the architecture needs
    /// is present with its shape and byte length — without copying any weight: the linears
    /// stay borrowed in the file's row layout (no strip repacking) and the model is dropped.
    pub fn check(source: &ModelSource) -> Result<(), ModelError> {
        layers::borrowing_only(|| Self::from_source(source)).map(drop)
    }

    /// Builds the forward pass for `cfg` over `weights` on the CPU (no file path in errors):
    /// for tools that rewrite a model's weights, such as layer-wise quantization.
    pub fn from_weights(
        cfg: &ModelConfig,
        weights: &crate::weights::Weights,
    ) -> Result<Self, ModelError> {
        Self::build(cfg, weights, Device::Cpu)
    }

    fn build(cfg: &ModelConfig, weights: &Weights, device: Device) -> Result<Self, ModelError> {
        cfg.validate()?;
        Ok(Model {
            config: cfg.clone(),
            weights: place_on(cfg, weights, device, None)?,
        })
    }

    /// The device the weights live on (and the forward pass runs on).
    pub fn device(&self) -> Device {
        self.weights.device()
    }

    /// The CPU parts, or an error naming `what` as a CPU-only operation.
    fn cpu_parts(&self, what: &str) -> Result<&Parts<Cpu>, ModelError> {
        self.weights
            .as_any()
            .downcast_ref::<Parts<Cpu>>()
            .ok_or_else(|| {
                ModelError::InvalidConfig(format!(
                    "{what} runs on the CPU only, and this model is on {}",
                    self.device()
                ))
            })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The GPU's free and total memory in bytes, for a model on a GPU (`None` on the CPU).
    pub fn gpu_memory(&self) -> Result<Option<(u64, u64)>, ModelError> {
        self.weights.memory_info()
    }

    /// Bytes of device memory a forward pass of up to `rows` rows (`logit_rows` of them with
    /// logits) needs beside the weights and the KV cache, on a GPU; 0 on the CPU (whose
    /// scratch is counted with the process).
    pub fn workspace_bytes(&self, rows: usize, logit_rows: usize) -> u64 {
        self.weights.workspace_bytes(&self.config, rows, logit_rows)
    }

    /// A paged cache of `n_blocks` blocks of `block_size` positions on the model's device:
    /// host memory for a CPU model; GPU memory (K/V stored as bf16 whatever 16-bit `dtype`
    /// asks; f32 is refused there) for a CUDA one. Errors: a zero block size, GPU memory
    /// that runs out.
    pub fn try_new_paged_cache(
        &self,
        n_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Result<PagedKvCache, ModelError> {
        if block_size == 0 {
            return Err(ModelError::InvalidConfig(
                "KV block size must be at least 1".into(),
            ));
        }
        self.weights
            .new_cache(&self.config, n_blocks, block_size, dtype)
    }
    /// A fresh single-sequence cache for up to `capacity` positions (at most the context
    /// length) of `dtype`, on the model's device (see [`Model::try_new_paged_cache`]).
    pub fn try_new_cache(&self, capacity: usize, dtype: KvDtype) -> Result<KvCache, ModelError> {
        let capacity = capacity.min(self.config.context_length).max(1);
        let bs = KvCache::BLOCK_SIZE;
        let paged = self.try_new_paged_cache(capacity.div_ceil(bs), bs, dtype)?;
        Ok(KvCache::over(paged, capacity))
    }

    /// A fresh cache for up to `capacity` positions (at most the model's context length),
    /// stored as f16 (llama.cpp's default, which the reference logits come from).
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        self.new_cache_with(capacity, KvDtype::F16)
    }

    /// A fresh cache for up to `capacity` positions (at most the context length) as `dtype`.
    pub fn new_cache_with(&self, capacity: usize, dtype: KvDtype) -> KvCache {
        KvCache::with_dtype(
            &self.config,
            capacity.min(self.config.context_length).max(1),
            dtype,
        )
    }

    /// A paged cache of `n_blocks` blocks of `block_size` positions for this model (many
    /// sequences, each through its own block table), in host memory: for a CPU model
    /// ([`Model::try_new_paged_cache`] makes one on any device). Panics if `block_size` is
    /// zero.
    pub fn new_paged_cache(
        &self,
        n_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> PagedKvCache {
        PagedKvCache::new(&self.config, n_blocks, block_size, dtype)
    }

    /// Runs `tokens` at positions `start..` and returns logits, `[1, vocab]` for
    /// [`Logits::Last`] or `[tokens.len(), vocab]` for [`Logits::All`].
    pub fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        cache: &mut KvCache,
        logits: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        self.forward_adapted(tokens, start, cache, logits, None)
    }

    /// [`Model::forward`] with a LoRA adapter applied unmerged (`None`: the base model). A
    /// cache must hold the K/V of one adapter only: the caller keeps them apart.
    pub fn forward_adapted(
        &self,
        tokens: &[u32],
        start: usize,
        cache: &mut KvCache,
        logits: Logits,
        adapter: Option<&LoraWeights>,
    ) -> Result<Vec<f32>, ModelError> {
        cache.check_room(start, tokens.len())?;
        let (block_table, paged) = cache.parts();
        let segment = BatchSegment {
            tokens,
            start,
            block_table,
            logits: Some(logits),
            adapter,
            // A single sequence: the cache's one state slot (a hybrid model's).
            state_slot: Some(0),
        };
        let out = self.forward_batch(&[segment], paged)?;
        cache.set_len(start + tokens.len());
        Ok(out)
    }

    /// Runs all segments as one batch: embeddings and every linear layer once over the
    /// concatenated rows (weights read once per step), RoPE, K/V writes and attention per
    /// segment over its block table. Returns the logits rows of the segments that asked for
    /// them, in segment order (`[rows, vocab]`; empty when none did).
    ///
    /// Errors, before anything is written: no segments, a segment without tokens, a token
    /// outside the vocabulary, positions past the context length, a block table too short for
    /// `start + tokens.len()` or naming a block `cache` lacks, a cache shaped for another model.
    pub fn forward_batch(
        &self,
        segments: &[BatchSegment<'_>],
        cache: &mut PagedKvCache,
    ) -> Result<Vec<f32>, ModelError> {
        let seqs = self.plan_batch(segments, cache)?;
        self.bind_state_slots(segments, cache)?;
        let logit_rows = logit_rows(segments, &seqs);
        self.weights
            .forward_batch(&self.config, segments, &seqs, &logit_rows, cache)
    }

    /// For a model with recurrent layers: checks that every segment names a state slot of
    /// `cache`, each a different one, and makes them the next pass's slots.
    fn bind_state_slots(
        &self,
        segments: &[BatchSegment<'_>],
        cache: &mut PagedKvCache,
    ) -> Result<(), ModelError> {
        if !self.config.has_recurrent_state() {
            return Ok(());
        }
        let Some(states) = cache.storage_mut().recurrent_states() else {
            return Err(ModelError::InvalidBatch(
                "a hybrid model over a cache without recurrent state: make the cache with                  the model's try_new_paged_cache"
                    .into(),
            ));
        };
        let n = states.slots();
        let mut slots = Vec::with_capacity(segments.len());
        for (i, seg) in segments.iter().enumerate() {
            match seg.state_slot {
                Some(s) if (s as usize) < n && !slots.contains(&s) => slots.push(s),
                Some(s) => {
                    return Err(ModelError::InvalidBatch(format!(
                        "segment {i}: state slot {s} is outside the cache's {n} or taken by                          another segment"
                    )))
                }
                None => {
                    return Err(ModelError::InvalidBatch(format!(
                        "segment {i} names no state slot, and this hybrid model keeps a                          recurrent state per sequence"
                    )))
                }
            }
        }
        states.bind(slots);
        Ok(())
    }

    /// Validates the batch and lays out its rows: segment `i` owns rows `seqs[i].rows`.
    fn plan_batch<'a>(
        &self,
        segments: &[BatchSegment<'a>],
        cache: &PagedKvCache,
    ) -> Result<Vec<SeqAttention<'a>>, ModelError> {
        let cfg = &self.config;
        if segments.is_empty() {
            return Err(ModelError::InvalidBatch(
                "a forward pass over no segments".into(),
            ));
        }
        if cache.n_layers() != cfg.n_layers || cache.kv_dim() != cfg.max_kv_dim() {
            return Err(ModelError::InvalidBatch(format!(
                "KV cache of {} layers x {} values per position, but the model has {} x {}",
                cache.n_layers(),
                cache.kv_dim(),
                cfg.n_layers,
                cfg.max_kv_dim()
            )));
        }
        let mut seqs = Vec::with_capacity(segments.len());
        let mut row = 0;
        for (i, seg) in segments.iter().enumerate() {
            let n = seg.tokens.len();
            if n == 0 {
                return Err(ModelError::InvalidBatch(format!(
                    "segment {i} has no tokens (a forward pass over zero tokens)"
                )));
            }
            if let Some(&token) = seg.tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
                return Err(ModelError::InvalidToken {
                    token,
                    vocab_size: cfg.vocab_size,
                });
            }
            let end = seg.start.saturating_add(n);
            if end > cfg.context_length {
                return Err(ModelError::ContextFull {
                    needed: end,
                    capacity: cfg.context_length,
                });
            }
            cache.check_table(seg.block_table, end)?;
            if let Some(a) = seg.adapter {
                if !a.fits(self) {
                    return Err(ModelError::InvalidBatch(format!(
                        "segment {i}: LoRA adapter {:?} was prepared for a model of another shape",
                        a.name()
                    )));
                }
            }
            seqs.push(SeqAttention {
                rows: row..row + n,
                start: seg.start,
                block_table: seg.block_table,
            });
            row += n;
        }
        Ok(seqs)
    }

    /// The hidden states entering the first layer for `tokens` (`[n, hidden]`: embedding
    /// rows, scaled as the forward pass scales them). With [`Model::forward_layer`], runs the
    /// stack one layer at a time (layer-wise calibration for GPTQ/AWQ). CPU models only.
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.config;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(ModelError::InvalidToken {
                token,
                vocab_size: cfg.vocab_size,
            });
        }
        let parts = self.cpu_parts("layer-by-layer evaluation")?;
        let mut x = Vec::new();
        parts
            .backend
            .embed(parts.embedding()?, tokens, cfg.embedding_scale, &mut x)?;
        Ok(x)
    }

    /// Runs decoder layer `layer` alone over `x` (`[n, hidden]`, in place): one fresh sequence
    /// at positions `0..n`, its K/V written into `cache`'s layer `layer` (the cache's other
    /// layers and its length are left as they are, so a cache can serve every layer in
    /// turn). The cache's observer, if any, sees this layer's linear inputs. Running layers
    /// `0..n_layers` in order over [`Model::embed`]'s output gives [`Model::forward`]'s hidden
    /// states before the final norm. CPU models only.
    pub fn forward_layer(
        &self,
        layer: usize,
        x: &mut [f32],
        cache: &mut KvCache,
    ) -> Result<(), ModelError> {
        let cfg = &self.config;
        let d = cfg.hidden_size;
        if layer >= cfg.n_layers {
            return Err(ModelError::InvalidBatch(format!(
                "layer {layer} of a model with {} layers",
                cfg.n_layers
            )));
        }
        let n = x.len() / d;
        if n == 0 || x.len() % d != 0 {
            return Err(ModelError::InvalidBatch(format!(
                "{} hidden values are not rows of {d}",
                x.len()
            )));
        }
        if n > cache.capacity() || n > cfg.context_length {
            return Err(ModelError::ContextFull {
                needed: n,
                capacity: cache.capacity().min(cfg.context_length),
            });
        }
        let parts = self.cpu_parts("layer-by-layer evaluation")?;
        let (block_table, paged) = cache.parts();
        paged.check_table(block_table, n)?;
        let seqs = [SeqAttention {
            rows: 0..n,
            start: 0,
            block_table,
        }];
        let DeviceKv {
            layers: kv,
            scratch,
            states,
            ..
        } = DeviceKv::<Cpu>::of(paged)?;
        states.bind([0]);
        let mut act = std::mem::take(&mut scratch.act);
        act.x.clear();
        act.x.extend_from_slice(x);
        let mut pass = CpuPass {
            seqs: &seqs,
            lora: &mut scratch.lora,
            observer: &scratch.observer,
        };
        let r = parts.stack.forward(
            &parts.backend,
            cfg,
            layer..layer + 1,
            (kv, states),
            &mut act,
            &mut pass,
        );
        x.copy_from_slice(&act.x);
        scratch.act = act;
        r
    }

    /// Runs `tokens` as one fresh sequence a stage at a time (the embedding, then each
    /// decoder layer, then the final norm and output head of the last position), on the
    /// devices the model runs on, and returns the first stage whose output holds a NaN or an
    /// infinity; `None` when the logits come out finite. For reporting a numerical fault: it
    /// costs one unbatched prefill of `tokens`, a copy of each stage's output to the host
    /// and a KV cache of `tokens.len()` positions of `dtype` (the dtype the fault happened
    /// with: f16 K/V can overflow where f32 would not). No LoRA adapter is applied.
    pub fn first_non_finite(
        &self,
        tokens: &[u32],
        dtype: KvDtype,
    ) -> Result<Option<NonFiniteStage>, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::InvalidBatch(
                "a forward pass over zero tokens".into(),
            ));
        }
        let cfg = &self.config;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(ModelError::InvalidToken {
                token,
                vocab_size: cfg.vocab_size,
            });
        }
        self.weights.first_non_finite(cfg, tokens, dtype)
    }

    /// The linear layer whose weight has canonical name `name` (`blk.0.attn_q.weight`), on a
    /// CPU model (`None` on another device, or when there is none of that name).
    pub fn find_linear(&self, name: &str) -> Option<&Linear> {
        let parts = self.cpu_parts("").ok()?;
        parts.stack.linears().find(|l| l.name() == name)
    }

    /// `(rows, cols)` of the linear layer whose weight has canonical name `name`, on any
    /// device.
    pub fn linear_shape(&self, name: &str) -> Option<(usize, usize)> {
        self.weights.linear_shape(name)
    }
}

impl Model {
    /// Builds the forward pass for `source` where `device` and `gpu_layers` say
    /// ([`split::place`]), and returns how it was placed.
    ///
    /// Errors: [`split::place`]'s, and the build's own.
    pub fn from_source_placed(
        source: &ModelSource,
        device: DeviceChoice,
        gpu_layers: Option<usize>,
    ) -> Result<(Model, Placement), ModelError> {
        let cfg = &source.config;
        let (device, placement) = split::place(source, device, gpu_layers)?;
        let model = match device {
            Device::Cuda(ordinal) if !placement.all_cpu() => {
                if placement.all_gpu() {
                    Model::from_source_on(source, Device::Cuda(ordinal))?
                } else {
                    let split_at = Some(placement.gpu_layers.start);
                    let weights = place_on(cfg, &source.weights, Device::Cuda(ordinal), split_at)
                        .map_err(|e| with_path(source, e))?;
                    Model {
                        config: cfg.clone(),
                        weights,
                    }
                }
            }
            _ => Model::from_source_on(source, Device::Cpu)?,
        };
        Ok((model, placement))
    }

    /// Decoder layers whose K/V live in GPU memory: all of them for a model on a GPU, the
    /// GPU part's for a split one, none on the CPU (the engine sizes the two halves of a
    /// split cache from this).
    pub fn kv_layers_on_gpu(&self) -> usize {
        self.weights.kv_layers_on_device()
    }
}

/// A build error with the model file's path in it (the build itself knows no path).
fn with_path(source: &ModelSource, e: ModelError) -> ModelError {
    match e {
        ModelError::Tensor {
            tensor, message, ..
        } => ModelError::Tensor {
            path: source.path.clone(),
            tensor,
            message,
        },
        ModelError::MissingTensor(t) => ModelError::Tensor {
            path: source.path.clone(),
            tensor: t,
            message: "missing from the model file".into(),
        },
        other => other,
    }
}
