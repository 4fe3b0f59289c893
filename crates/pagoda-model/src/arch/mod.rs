//! Forward passes: token ids at positions in, logits out, over a paged KV cache.
//!
//! [`Model`] holds the parts every architecture shares (token embedding, final norm, output
//! head) and one decoder stack per architecture ([`llama`] for Llama and Qwen2, [`gemma3`]),
//! all on one device, or split between the CPU and a GPU by layers ([`split`]).
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
//! time over one fresh sequence (layer-wise calibration of offline quantization;
//! [`Model::first_non_finite`], which finds the stage where NaN/inf first appear).
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
pub mod gemma3;
pub mod layers;
pub mod llama;
mod pass;
pub mod split;

pub use adapter::LoraWeights;

use crate::device::Device;
use crate::source::ModelSource;
use crate::weights::Weights;
use crate::{Architecture, KvCache, KvDtype, ModelConfig, ModelError, PagedKvCache};
use backend::{Activations, Backend};
use cpu::{Cpu, CpuPass};
use layers::Linear;
use pagoda_kernels::paged_attention::SeqAttention;
use pass::OnCache;
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
}

/// A stage of the forward pass, as [`Model::first_non_finite`] names where non-finite values
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

/// One architecture's decoder stack on backend `B`.
#[derive(Debug)]
enum Stack<B: Backend> {
    Llama(llama::LlamaLayers<B>),
    Gemma3(gemma3::Gemma3Layers<B>),
}

impl<B: Backend> Stack<B> {
    /// Loads the decoder layers `owned` (within `0..n_layers`: the caller checks).
    fn load(
        backend: &B,
        cfg: &ModelConfig,
        weights: &Weights,
        owned: Range<usize>,
    ) -> Result<Self, ModelError> {
        Ok(match cfg.arch {
            Architecture::Llama | Architecture::Qwen2 => {
                Stack::Llama(llama::LlamaLayers::load(backend, weights, cfg, owned)?)
            }
            Architecture::Gemma3 => {
                Stack::Gemma3(gemma3::Gemma3Layers::load(backend, weights, cfg, owned)?)
            }
        })
    }

    fn forward(
        &self,
        backend: &B,
        cfg: &ModelConfig,
        layers: Range<usize>,
        kv: &mut [B::KvLayer],
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        match self {
            Stack::Llama(st) => st.forward(backend, cfg, layers, kv, a, pass),
            Stack::Gemma3(st) => st.forward(backend, cfg, layers, kv, a, pass),
        }
    }

    fn linears(&self) -> Box<dyn Iterator<Item = &B::Linear> + '_> {
        match self {
            Stack::Llama(st) => Box::new(st.linears()),
            Stack::Gemma3(st) => Box::new(st.linears()),
        }
    }
}

/// A model's weights on backend `B`, or the part of them one device holds: the decoder
/// layers `layers` and, in the part that runs first, the token embedding, in the part that
/// runs last, the final norm and output head. A model on one device is one `Parts` holding
/// everything; a split model ([`split`]) is two.
#[derive(Debug)]
pub(crate) struct Parts<B: Backend> {
    pub(crate) backend: B,
    embedding: Option<B::Linear>,
    /// The final norm and the output head.
    head: Option<(B::Norm, B::Linear)>,
    /// The decoder layers held, within `0..n_layers`.
    layers: Range<usize>,
    stack: Stack<B>,
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
    fn load(backend: B, cfg: &ModelConfig, weights: &Weights) -> Result<Self, ModelError> {
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
        let stack = Stack::load(&backend, cfg, weights, spec.layers.clone())?;
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
            head,
            layers: spec.layers.clone(),
            stack,
        })
    }

    /// The token embedding (a part without one is a bug of the caller, reported as such).
    fn embedding(&self) -> Result<&B::Linear, ModelError> {
        self.embedding.as_ref().ok_or_else(|| {
            ModelError::InvalidConfig("this part of a split model has no token embedding".into())
        })
    }

    /// The final norm and output head.
    fn head(&self) -> Result<(&B::Norm, &B::Linear), ModelError> {
        self.head.as_ref().map(|(n, h)| (n, h)).ok_or_else(|| {
            ModelError::InvalidConfig("this part of a split model has no output head".into())
        })
    }

    /// The embedding rows of every segment's tokens into `a.x` (`[total, hidden]`).
    fn embed_segments(
        &self,
        cfg: &ModelConfig,
        segments: &[BatchSegment<'_>],
        a: &mut Activations<B::Act>,
    ) -> Result<(), ModelError> {
        let tokens: Vec<u32> = segments
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        self.backend
            .embed(self.embedding()?, &tokens, cfg.embedding_scale, &mut a.x)
    }

    /// This part's decoder layers over `a.x`, in place; `kv` holds their K/V, in order.
    fn run_layers(
        &self,
        cfg: &ModelConfig,
        kv: &mut [B::KvLayer],
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
        self.stack
            .forward(&self.backend, cfg, self.layers.clone(), kv, a, pass)
    }

    /// The logits of the rows `logit_rows` of `a.x` (final norm, head, soft-cap).
    fn run_head(
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
        out
    }

    /// The forward pass of a validated batch: embeddings of every segment's tokens, the
    /// layers, then the logits of the rows in `logit_rows`.
    pub(crate) fn run(
        &self,
        cfg: &ModelConfig,
        segments: &[BatchSegment<'_>],
        logit_rows: &[Range<usize>],
        kv: &mut [B::KvLayer],
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        self.embed_segments(cfg, segments, a)?;
        self.run_layers(cfg, kv, a, pass)?;
        self.run_head(cfg, logit_rows, a, pass)
    }
}

/// Where a model's weights live, and the backend that runs them.
#[derive(Debug)]
enum OnDevice {
    Cpu(Parts<Cpu>),
    Cuda(Parts<cuda::Cuda>),
    /// The first layers (and the embedding) on the CPU, the rest (and the head) on a GPU.
    Split(Box<split::Split<cuda::Cuda>>),
}

/// A model ready to run: config plus shape-checked weights on one device.
#[derive(Debug)]
pub struct Model {
    config: ModelConfig,
    weights: OnDevice,
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
        let weights = match device {
            Device::Cpu => OnDevice::Cpu(Parts::load(Cpu, cfg, weights)?),
            Device::Cuda(ordinal) => {
                // Room for a pass of a default engine step beside the weights.
                let reserve = cuda::workspace_bytes(cfg, 2048, 256);
                let backend = cuda::Cuda::for_model(ordinal, weights, reserve)?;
                OnDevice::Cuda(Parts::load(backend, cfg, weights)?)
            }
        };
        Ok(Model {
            config: cfg.clone(),
            weights,
        })
    }

    /// The device the weights live on (and the forward pass runs on).
    pub fn device(&self) -> Device {
        match &self.weights {
            OnDevice::Cpu(_) => Device::Cpu,
            OnDevice::Cuda(p) => Device::Cuda(p.backend.gpu().gpu().ordinal),
            OnDevice::Split(s) => Device::Cuda(s.gpu().gpu().ordinal),
        }
    }

    /// The CPU parts, or an error naming `what` as a CPU-only operation.
    fn cpu_parts(&self, what: &str) -> Result<&Parts<Cpu>, ModelError> {
        match &self.weights {
            OnDevice::Cpu(p) => Ok(p),
            OnDevice::Cuda(_) | OnDevice::Split(_) => Err(ModelError::InvalidConfig(format!(
                "{what} runs on the CPU only, and this model is on {}",
                self.device()
            ))),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The GPU's free and total memory in bytes, for a model on a GPU (`None` on the CPU).
    pub fn gpu_memory(&self) -> Result<Option<(u64, u64)>, ModelError> {
        match &self.weights {
            OnDevice::Cpu(_) => Ok(None),
            OnDevice::Cuda(p) => Ok(Some(p.backend.gpu().memory_info()?)),
            OnDevice::Split(s) => Ok(Some(s.gpu().memory_info()?)),
        }
    }

    /// Bytes of device memory a forward pass of up to `rows` rows (`logit_rows` of them with
    /// logits) needs beside the weights and the KV cache, on a GPU; 0 on the CPU (whose
    /// scratch is counted with the process).
    pub fn workspace_bytes(&self, rows: usize, logit_rows: usize) -> u64 {
        match &self.weights {
            OnDevice::Cpu(_) => 0,
            OnDevice::Cuda(_) | OnDevice::Split(_) => {
                cuda::workspace_bytes(&self.config, rows, logit_rows)
            }
        }
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
        match &self.weights {
            OnDevice::Cpu(_) => Ok(PagedKvCache::new(&self.config, n_blocks, block_size, dtype)),
            OnDevice::Cuda(p) => {
                PagedKvCache::new_cuda(&self.config, n_blocks, block_size, dtype, p.backend.gpu())
            }
            OnDevice::Split(s) => s.new_cache(&self.config, n_blocks, block_size, dtype),
        }
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
        let logit_rows = logit_rows(segments, &seqs);
        let cfg = &self.config;
        match &self.weights {
            OnDevice::Cpu(parts) => {
                parts
                    .backend
                    .with_pass(cache, segments, &seqs, |kv, a, pass| {
                        parts.run(cfg, segments, &logit_rows, kv, a, pass)
                    })
            }
            OnDevice::Cuda(parts) => {
                parts
                    .backend
                    .with_pass(cache, segments, &seqs, |kv, a, pass| {
                        parts.run(cfg, segments, &logit_rows, kv, a, pass)
                    })
            }
            OnDevice::Split(split) => split.run(cfg, segments, &seqs, &logit_rows, cache),
        }
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
        if cache.n_layers() != cfg.n_layers || cache.kv_dim() != cfg.n_kv_heads * cfg.head_dim {
            return Err(ModelError::InvalidBatch(format!(
                "KV cache of {} layers x {} values per position, but the model has {} x {}",
                cache.n_layers(),
                cache.kv_dim(),
                cfg.n_layers,
                cfg.n_kv_heads * cfg.head_dim
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
        let (kv, scratch) = paged.cpu_parts_mut()?;
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
            kv,
            &mut act,
            &mut pass,
        );
        x.copy_from_slice(&act.x);
        scratch.act = act;
        r
    }

    /// Runs `tokens` as one fresh sequence a stage at a time ([`Model::embed`], then
    /// [`Model::forward_layer`] for each layer, then the final norm and output head of the
    /// last position) and returns the first stage whose output holds a NaN or an infinity;
    /// `None` when the logits come out finite. For reporting a numerical fault: it costs one
    /// unbatched prefill of `tokens`, a scan of each stage's output and a KV cache of
    /// `tokens.len()` positions of `dtype` (the dtype the fault happened with: f16 K/V can
    /// overflow where f32 would not). No LoRA adapter is applied. CPU models only.
    pub fn first_non_finite(
        &self,
        tokens: &[u32],
        dtype: KvDtype,
    ) -> Result<Option<NonFiniteStage>, ModelError> {
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
        if tokens.is_empty() {
            return Err(ModelError::InvalidBatch(
                "a forward pass over zero tokens".into(),
            ));
        }
        let parts = self.cpu_parts("locating a numerical fault")?;
        let mut x = self.embed(tokens)?;
        if !finite(&x) {
            return Ok(Some(NonFiniteStage::Embedding));
        }
        let mut cache = self.new_cache_with(tokens.len(), dtype);
        for layer in 0..self.config.n_layers {
            self.forward_layer(layer, &mut x, &mut cache)?;
            if !finite(&x) {
                return Ok(Some(NonFiniteStage::Layer(layer)));
            }
        }
        let d = self.config.hidden_size;
        let last = &x[x.len() - d..];
        let (output_norm, output) = parts.head()?;
        let mut normed = Vec::new();
        output_norm.forward(last, &mut normed);
        if !finite(&normed) {
            return Ok(Some(NonFiniteStage::OutputNorm));
        }
        let mut logits = Vec::new();
        output.forward(&normed, 1, &mut logits)?;
        if let Some(cap) = self.config.final_logit_softcap {
            pagoda_kernels::ops::softcap_inplace(&mut logits, cap);
        }
        Ok((!finite(&logits)).then_some(NonFiniteStage::OutputHead))
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
        fn find<B: Backend>(parts: &Parts<B>, name: &str) -> Option<(usize, usize)> {
            parts
                .stack
                .linears()
                .find(|l| B::linear_name(l) == name)
                .map(B::linear_shape)
        }
        match &self.weights {
            OnDevice::Cpu(p) => find(p, name),
            OnDevice::Cuda(p) => find(p, name),
            OnDevice::Split(s) => find(s.front(), name).or_else(|| find(s.back(), name)),
        }
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

/// The rows of the batch whose logits the segments asked for, in segment order.
fn logit_rows(segments: &[BatchSegment<'_>], seqs: &[SeqAttention<'_>]) -> Vec<Range<usize>> {
    segments
        .iter()
        .zip(seqs)
        .filter_map(|(seg, seq)| match seg.logits? {
            Logits::Last => Some(seq.rows.end - 1..seq.rows.end),
            Logits::All => Some(seq.rows.clone()),
        })
        .collect()
}
