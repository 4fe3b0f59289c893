//! The device seam: the few operations a forward pass asks of the device it runs on.
//!
//! Every architecture ([`super::llama`], [`super::gemma3`]) is written once, generic over a
//! [`Backend`], out of these operations: load a linear layer, an RMSNorm and a RoPE table
//! onto the device; run linear layers that share an input; normalize rows or heads; add;
//! apply a gated activation; rotate, store and attend over one layer's paged K/V; and, for
//! the parts every architecture shares, embed tokens and compute the logits rows. What an
//! activation is ([`Backend::Act`]: a host `Vec<f32>` on the CPU, an f32 buffer in GPU
//! memory on CUDA), how a weight is stored (the file's quantized blocks in CPU strips; bf16
//! in GPU memory) and how a layer's K/V live ([`Backend::KvLayer`]) are the backend's.
//!
//! Invariants:
//! - An activation holds `rows × width` f32 values, row-major; every operation sizes its
//!   outputs itself (callers never pre-size), so buffers are reused across layers and steps.
//! - The batch of one forward pass (which rows are which sequence's, at which positions,
//!   through which block table; the LoRA adapters by rows; the calibration observer) is the
//!   backend's [`Backend::Pass`], built by the model before the first layer and read by
//!   [`Backend::linears`] and [`Backend::attention`] only.
//! - Operations do not synchronize with the device; the logits come back to the host at the
//!   end of the pass ([`Backend::logits`]), which is where a device error surfaces at the
//!   latest.

use crate::config::RopeScaling;
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use pagoda_kernels::attention::AttentionShape;
use std::ops::Range;

/// A device the forward pass can run on (see the module docs).
pub trait Backend: Send + Sync + Sized + 'static {
    /// A `[rows, width]` f32 activation on the device.
    type Act: Default + Send;
    /// A linear layer's weight (and bias), ready on the device.
    type Linear: Send + Sync + std::fmt::Debug;
    /// An RMSNorm weight on the device.
    type Norm: Send + Sync + std::fmt::Debug;
    /// One RoPE table (frequencies and scaling) on the device.
    type Rope: Send + Sync + std::fmt::Debug;
    /// One layer's paged keys and values.
    type KvLayer: Send;
    /// One forward pass's batch (see the module docs).
    type Pass<'a>;

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

    /// The RoPE table of base `theta` under `scaling` (with the file's per-dimension
    /// frequency factors when `freq_factors` and the file has them).
    fn load_rope(
        &self,
        weights: &Weights,
        cfg: &ModelConfig,
        theta: f32,
        scaling: &RopeScaling,
        freq_factors: bool,
    ) -> Result<Self::Rope, ModelError>;

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

    /// `gate = act(gate) * up`.
    fn gated(
        &self,
        activation: Activation,
        gate: &mut Self::Act,
        up: &Self::Act,
    ) -> Result<(), ModelError>;

    /// Rotates `q` and `k` by their rows' positions, writes `k` and `v` into `kv` through the
    /// rows' block tables, and attends every row of `q` over its sequence's positions up to
    /// its own (within `shape.window`), into `out` (`[rows, n_heads * head_dim]`).
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        shape: &AttentionShape,
        rope: &Self::Rope,
        q: &mut Self::Act,
        k: &mut Self::Act,
        v: &Self::Act,
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

/// The gate's activation of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen2).
    Silu,
    /// GeGLU with the tanh approximation (Gemma).
    GeluTanh,
}

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
    /// Rows that need logits, gathered, `[n_out, hidden]`.
    pub logit_rows: A,
}
