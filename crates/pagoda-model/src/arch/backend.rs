//! The device seam: the few operations a forward pass asks of the device it runs on, and the
//! device's own storage of the KV cache.
//!
//! Every architecture ([`super::decoder`]) is written once, generic over a
//! [`Backend`], out of these operations: load a linear layer, an RMSNorm and a RoPE table
//! onto the device; run linear layers that share an input; normalize rows or heads; add,
//! scale, take a block of columns; apply a gated activation; rotate, store and attend over
//! one layer's paged K/V; and, for
//! the parts every architecture shares, embed tokens and compute the logits rows. What an
//! activation is ([`Backend::Act`]: a host `Vec<f32>` on the CPU, an f32 buffer in GPU
//! memory on CUDA), how a weight is stored (the file's quantized blocks in CPU strips; bf16
//! in GPU memory), how a layer's K/V live ([`Backend::KvLayer`]) and what a pass keeps
//! between calls ([`Backend::Scratch`]) are the backend's. A [`crate::PagedKvCache`] holds
//! them without naming the backend (`super::pass::DeviceKv`); a model on one device
//! (`super::Parts`) and a model split over two (`super::split`) are each one generic
//! implementation over this trait.
//!
//! Adding a device is one module implementing [`Backend`] and its arm in the device
//! registry (`super::place_on`).
//!
//! Invariants:
//! - An activation holds `rows × width` f32 values, row-major; every operation sizes its
//!   outputs itself (callers never pre-size), so buffers are reused across layers and steps.
//! - The batch of one forward pass (which rows are which sequence's, at which positions,
//!   through which block table; the LoRA adapters by rows; the calibration observer) is the
//!   backend's [`Backend::Pass`], built by [`Backend::with_pass`] before the first layer and
//!   read by [`Backend::linears`] and [`Backend::attention`] only.
//! - Operations do not synchronize with the device; the logits come back to the host at the
//!   end of the pass ([`Backend::logits`]), which is where a device error surfaces at the
//!   latest.

use super::adapter::LoraWeights;
use super::gated_delta_cpu::DeltaNetParams;
use super::mamba2_host::Mamba2Params;
use super::rope::Rope;
use crate::device::Device;
use crate::kv_cache::KvShape;
use crate::observer::LinearObserver;
use crate::weights::Weights;
use crate::{KvDtype, ModelConfig, ModelError};
use pagoda_kernels::attention::AttentionShape;
use pagoda_kernels::kv_blocks::KvBlockStorage;
use pagoda_kernels::paged_attention::SeqAttention;
use std::ops::Range;
use std::sync::Arc;

/// A device the forward pass can run on (see the module docs).
pub trait Backend: Clone + Send + Sync + Sized + std::fmt::Debug + 'static {
    /// The device's name in errors: `CPU`, `GPU`.
    const NAME: &'static str;
    /// Whether [`Backend::attention`] takes attention sinks (a model with sinks is refused
    /// at load on a backend without them).
    const ATTENTION_SINKS: bool;

    /// A `[rows, width]` f32 activation on the device.
    type Act: Default + Send;
    /// A linear layer's weight (and bias), ready on the device.
    type Linear: Send + Sync + std::fmt::Debug;
    /// An RMSNorm weight on the device.
    type Norm: Send + Sync + std::fmt::Debug;
    /// One RoPE table (frequencies and scaling) on the device.
    type Rope: Send + Sync + std::fmt::Debug;
    /// One layer's paged keys and values, `[n_blocks, block_size, kv_dim]` each, in the
    /// device's memory. (A second kind of per-sequence cache, such as the recurrent state of
    /// a hybrid model's SSM layers, is a second associated type beside this one: see the
    /// extension point in [`crate::kv_cache`].)
    type KvLayer: Send + Sync + std::fmt::Debug + 'static;
    /// What a forward pass keeps between calls (the activation buffers and the like), held
    /// in the KV cache beside the layers.
    type Scratch: Default + Send + Sync + std::fmt::Debug + 'static;
    /// One forward pass's batch (see the module docs).
    type Pass<'a>;

    /// The device this backend runs on.
    fn device(&self) -> Device;

    /// The device's free and total memory in bytes (`None` for host memory).
    fn memory_info(&self) -> Result<Option<(u64, u64)>, ModelError>;

    /// Bytes of device memory one pass of up to `rows` rows, `logit_rows` of them with
    /// logits, needs beside the weights and the KV cache (0 where the scratch is the
    /// process's own memory).
    fn workspace_bytes(&self, cfg: &ModelConfig, rows: usize, logit_rows: usize) -> u64;

    /// One layer of zeroed K/V per entry of `kv_dims`, each of `shape`'s blocks with that
    /// many values per position (0 for a layer that keeps no K/V of its own; errors: a dtype
    /// the device cannot store, memory that runs out).
    fn new_kv_layers(
        &self,
        kv_dims: &[usize],
        shape: &KvShape,
    ) -> Result<Vec<Self::KvLayer>, ModelError>;

    /// Copies every slot of block `src` into block `dst` in every layer of `kv`, K and V
    /// (both within `shape`'s blocks: the caller checks).
    fn copy_kv_block(
        &self,
        kv: &mut [Self::KvLayer],
        shape: &KvShape,
        src: u32,
        dst: u32,
    ) -> Result<(), ModelError>;

    /// Bytes the K/V layers `kv` of `shape` hold.
    fn kv_bytes(&self, kv: &[Self::KvLayer], shape: &KvShape) -> usize;

    /// A layer's keys and values when they are [`KvBlockStorage`]s in host memory.
    fn host_kv(_kv: &Self::KvLayer) -> Option<(&KvBlockStorage, &KvBlockStorage)> {
        None
    }

    /// How K/V of `dtype` are stored here, for reports: `f16`, `bf16 on cuda:0`.
    fn kv_storage(&self, dtype: KvDtype) -> String;

    /// Where K/V live here, for errors: `in host memory`, `in GPU memory (NAME)`.
    fn kv_whereabouts(&self) -> String;

    /// Makes later passes with `scratch` report their linear layers' inputs to `observer`
    /// (a no-op on a device whose pass has no such hook).
    fn set_observer(_scratch: &mut Self::Scratch, _observer: Option<Arc<dyn LinearObserver>>) {}

    /// Sets up one forward pass over `kv` (the layers of a cache of `block_size`) and the
    /// cache's `scratch`: the pass of the sequences `seqs` (rows, positions, block tables)
    /// with `adapters[i]` applied on `seqs[i]`'s rows, and runs `body` over the layers, the
    /// activations and the pass.
    fn with_pass<'s, R: Send>(
        &self,
        kv: &mut [Self::KvLayer],
        scratch: &mut Self::Scratch,
        block_size: usize,
        seqs: &[SeqAttention<'_>],
        adapters: impl Iterator<Item = Option<&'s LoraWeights>>,
        body: impl for<'p> FnOnce(
                &mut [Self::KvLayer],
                &mut Activations<Self::Act>,
                &mut Self::Pass<'p>,
            ) -> Result<R, ModelError>
            + Send,
    ) -> Result<R, ModelError>;

    /// Loads `name` (`[rows, cols]`, and `bias` when given and present) onto the device.
    fn load_linear(
        &self,
        weights: &Weights,
        name: &str,
        bias: Option<&str>,
        rows: usize,
        cols: usize,
    ) -> Result<Self::Linear, ModelError>;

    /// Loads a table that is only looked up by row (a token embedding with its own output
    /// head).
    fn load_rows(
        &self,
        weights: &Weights,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Self::Linear, ModelError>;

    /// A second handle to `linear` (tied embedding and output head share one weight).
    fn share(&self, linear: &Self::Linear) -> Self::Linear;

    /// Loads the RMSNorm weight `name` of `dim` values (eps and weight offset from `cfg`).
    fn load_norm(
        &self,
        weights: &Weights,
        name: &str,
        dim: usize,
        cfg: &ModelConfig,
    ) -> Result<Self::Norm, ModelError>;

    /// Places a RoPE table (computed on the host, [`Rope`]) on this device.
    fn place_rope(&self, rope: Rope) -> Result<Self::Rope, ModelError>;

    /// The canonical name of a linear's weight (`blk.0.attn_q.weight`).
    fn linear_name(linear: &Self::Linear) -> &str;

    /// `(rows, cols)`: output and input features.
    fn linear_shape(linear: &Self::Linear) -> (usize, usize);

    /// `outs[i] = layers[i](x)` for layers that share the input `x` (`[rows, cols]`), with
    /// the pass's LoRA adapters added on their rows (and the pass's observer told).
    fn linears<const N: usize>(
        &self,
        layers: [&Self::Linear; N],
        x: &Self::Act,
        outs: [&mut Self::Act; N],
        pass: &mut Self::Pass<'_>,
    ) -> Result<(), ModelError>;

    /// Normalizes every row of `x` into `out`.
    fn rms_norm(
        &self,
        norm: &Self::Norm,
        x: &Self::Act,
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// Normalizes every head (`norm`-sized piece) of `x` in place (QK-norm).
    fn rms_norm_heads(&self, norm: &Self::Norm, x: &mut Self::Act) -> Result<(), ModelError>;

    /// `x += y`.
    fn add(&self, x: &mut Self::Act, y: &Self::Act) -> Result<(), ModelError>;

    /// `x *= s`.
    fn scale(&self, x: &mut Self::Act, s: f32) -> Result<(), ModelError>;

    /// `x = [0; len]`.
    fn zeros(&self, x: &mut Self::Act, len: usize) -> Result<(), ModelError>;

    /// `out[j] = x[rows[j]]` for rows `width` values wide (`rows` within `x`: the caller's).
    fn gather_rows(
        &self,
        x: &Self::Act,
        width: usize,
        rows: &[u32],
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// `x[rows[j]] += weights[j] * y[j]` for rows `width` values wide (`rows` distinct and
    /// within `x`: the caller's).
    fn scatter_add_rows(
        &self,
        x: &mut Self::Act,
        width: usize,
        rows: &[u32],
        weights: &[f32],
        y: &Self::Act,
    ) -> Result<(), ModelError>;

    /// `out = x[:, cols]` for `x` of rows `width` values wide: a block of columns of every
    /// row (`out`: `[rows, cols.len()]`; `cols` within `0..width`, the caller checks).
    fn columns(
        &self,
        x: &Self::Act,
        width: usize,
        cols: Range<usize>,
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// LFM2's gated short convolution over `bcx` (`[rows, 3 · channels]`: B, C and x of each
    /// row): per sequence of the pass, `out = C · conv(B · x)` (`[rows, channels]`) with the
    /// causal depthwise convolution of `weight` (`[channels, taps]`, oldest tap first),
    /// continuing from and updating the sequence's slot of `state` (`(floats per slot, every
    /// slot, the pass's slot per sequence)`: the last `taps - 1` rows of `B · x`, oldest
    /// first); a sequence whose rows start at position 0 starts from zeros. Backends without
    /// recurrent layers refuse.
    fn short_conv(
        &self,
        weight: &[f32],
        taps: usize,
        state: (usize, &mut [f32], &[u32]),
        bcx: &Self::Act,
        pass: &Self::Pass<'_>,
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// Mamba-2's core (`super::mamba2`) over `zxbcdt`, the rows' `in_proj` output: per
    /// sequence of the pass, the causal convolution with bias and SiLU, the selective scan and
    /// the gated, grouped RMSNorm, into `out` (`[rows, d_inner]`), continuing from and
    /// updating the sequence's slot of `state` (as [`Backend::short_conv`]'s; a sequence
    /// whose rows start at position 0 starts from zeros). Backends without recurrent layers
    /// refuse.
    fn mamba2(
        &self,
        params: &Mamba2Params,
        state: (usize, &mut [f32], &[u32]),
        zxbcdt: &Self::Act,
        pass: &Self::Pass<'_>,
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// Qwen3.5's gated DeltaNet core (`super::gated_delta_net`) over `inputs`, the rows'
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b` and `in_proj_a` outputs: per sequence of the
    /// pass, the causal convolution with SiLU, the gates, the gated delta rule and the gated
    /// output norm, into `out` (`[rows, value_dim]`), continuing from and updating the
    /// sequence's slot of `state` (as [`Backend::short_conv`]'s; a sequence whose rows start
    /// at position 0 starts from zeros). Backends without recurrent layers refuse.
    fn gated_delta_net(
        &self,
        params: &DeltaNetParams,
        state: (usize, &mut [f32], &[u32]),
        inputs: [&Self::Act; 4],
        pass: &Self::Pass<'_>,
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// `gate = act(gate) * up`.
    fn gated(
        &self,
        activation: Activation,
        gate: &mut Self::Act,
        up: &Self::Act,
    ) -> Result<(), ModelError>;

    /// Rotates `q` (and `k`) by their rows' positions, writes the new `(k, v)` into `kv`
    /// through the rows' block tables, and attends every row of `q` over its sequence's
    /// positions up to its own (within `shape.window`), into `out`
    /// (`[rows, n_heads * head_dim]`). Without new K/V (a KV-shared layer) it attends over
    /// what `kv` holds, which an earlier layer of the same pass wrote for these rows.
    /// `sinks` (one logit per query head, gpt-oss) join each head's softmax denominator.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        shape: &AttentionShape,
        rope: &Self::Rope,
        q: &mut Self::Act,
        new_kv: Option<(&mut Self::Act, &Self::Act)>,
        sinks: Option<&[f32]>,
        kv: &mut Self::KvLayer,
        pass: &mut Self::Pass<'_>,
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// The embedding rows of `tokens`, times `scale` when set, into `out` (`[tokens, hidden]`).
    fn embed(
        &self,
        table: &Self::Linear,
        tokens: &[u32],
        scale: Option<f32>,
        out: &mut Self::Act,
    ) -> Result<(), ModelError>;

    /// `out = host` (`[rows, width]` f32 in host memory): the hidden state a part of a split
    /// model hands to the part on this device ([`super::split`]).
    fn copy_from_host(&self, host: &[f32], out: &mut Self::Act) -> Result<(), ModelError>;

    /// `x` in host memory (waiting for the device): the stages `Model::first_non_finite`
    /// looks into, and the hidden state a part of a split model hands on.
    fn to_host(&self, x: &Self::Act) -> Result<Vec<f32>, ModelError>;

    /// The logits of the rows `rows` of `x` (final norm, output head, soft-cap when set), on
    /// the host: `[Σ rows, vocab]`.
    #[allow(clippy::too_many_arguments)]
    fn logits(
        &self,
        norm: &Self::Norm,
        head: &Self::Linear,
        x: &Self::Act,
        rows: &[Range<usize>],
        softcap: Option<f32>,
        buffers: &mut Activations<Self::Act>,
        pass: &mut Self::Pass<'_>,
    ) -> Result<Vec<f32>, ModelError>;
}

pub use crate::family::Activation;

/// The activation buffers of the forward pass, reused across layers and steps (each grows
/// to the largest batch seen). Shapes for a batch of `total` rows.
#[derive(Debug, Default, Clone)]
pub struct Activations<A> {
    /// Hidden states, `[total, hidden]`.
    pub x: A,
    /// `[total, n_heads * head_dim]`.
    pub q: A,
    /// `[total, kv_dim]`.
    pub k: A,
    /// `[total, kv_dim]`.
    pub v: A,
    /// Attention output, `[total, n_heads * head_dim]`.
    pub attn: A,
    /// `[total, ffn_dim]`.
    pub gate: A,
    /// `[total, ffn_dim]`.
    pub up: A,
    /// Normalized input of a block, `[total, hidden]`.
    pub normed: A,
    /// Output of a block, `[total, hidden]`.
    pub branch: A,
    /// Post-norm of a block's output (Gemma 3), `[total, hidden]`.
    pub post: A,
    /// Every layer's per-layer input (Gemma 4), `[total, n_layers * per_layer]`.
    pub per_layer: A,
    /// One layer's slice of `per_layer`, `[total, per_layer]`.
    pub per_layer_one: A,
    /// The per-layer gate, `[total, per_layer]`.
    pub per_layer_gate: A,
    /// Router logits of a mixture-of-experts layer, `[total, n_experts]`.
    pub router: A,
    /// The rows one expert runs on, gathered, `[rows, hidden]`.
    pub expert_in: A,
    /// That expert's output, `[rows, hidden]`.
    pub expert_out: A,
    /// Rows that need logits, gathered, `[n_out, hidden]`.
    pub logit_rows: A,
}
