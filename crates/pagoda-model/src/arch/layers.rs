//! The CPU's building blocks of the forward pass: linear layers over the file's quantized
//! weights (repacked into strips where this CPU's kernels want them), RMSNorm weights, the
//! calibration observer, and the CPU pass's reusable [`Scratch`] (RoPE tables: [`super::rope`]). The CPU
//! [`Backend`](super::backend::Backend) ([`super::cpu`]) is made of these.
//!
//! A linear layer's output gets each segment's LoRA adapter added on that segment's rows
//! ([`Scratch::lora`], a [`LoraBatch`], through [`Linear::add_lora`]) right after the layer runs.
//!
//! Invariants: a [`Linear`] was shape-checked against the config when the model was built, so
//! the kernel calls here cannot fail on shape; they return errors only for kernel faults.

use super::adapter::LoraBatch;
use super::backend::Activations;
use crate::weights::{TensorView, Weights};
use crate::{ModelConfig, ModelError};
use pagoda_kernels::ops;
use pagoda_kernels::{WeightLayout, WeightMatrix};

/// A linear layer `y = W x (+ b)` whose weight stays in its block format (the file's own, or
/// the one it was quantized to at load). Weights of the types where strips pay (Q4_0, Q4_1,
/// INT4 g32, Q5_0, Q8_0, MXFP4, INT8, Q4_K, Q6_K: `pagoda_kernels::packed::strips_pay`) are repacked at
/// load into 16-row strips when this CPU runs the strip kernels (AVX-512 VNNI;
/// `PAGODA_WEIGHT_LAYOUT=rows` keeps the file's row layout): the same bytes, reordered.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: TensorView,
    layout: WeightLayout,
    bias: Option<Vec<f32>>,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
}

impl Linear {
    /// Loads `name` (+ `name_bias` when given and present) and checks it is `[rows, cols]`;
    /// a weight of a packable type is repacked into strips where that pays.
    pub fn load(
        weights: &Weights,
        name: &str,
        bias_name: Option<&str>,
        rows: usize,
        cols: usize,
    ) -> Result<Self, ModelError> {
        Self::load_as(weights, name, bias_name, rows, cols, true)
    }

    /// [`Linear::load`] keeping the file's row layout: for a table that is only looked up by
    /// row (a token embedding with its own output head), where a packed copy would only cost
    /// memory.
    pub fn load_rows(
        weights: &Weights,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Self, ModelError> {
        Self::load_as(weights, name, None, rows, cols, false)
    }

    fn load_as(
        weights: &Weights,
        name: &str,
        bias_name: Option<&str>,
        rows: usize,
        cols: usize,
        may_pack: bool,
    ) -> Result<Self, ModelError> {
        let weight = weights.get(name)?.clone();
        expect_shape(&weight, &[rows, cols])?;
        // Validate the byte length once, here, so later calls cannot fail on it.
        WeightMatrix::new(weight.ty, rows, cols, weight.data()).map_err(|e| {
            ModelError::Tensor {
                path: Default::default(),
                tensor: name.to_string(),
                message: e.to_string(),
            }
        })?;
        let bias = match bias_name {
            Some(b) if weights.contains(b) => Some(weights.vector_f32(b, rows)?),
            _ => None,
        };
        let (weight, layout) = if may_pack && repack_for_this_cpu(weight.ty, rows, cols) {
            (pack_strips(&weight, rows, cols)?, WeightLayout::Strips16)
        } else {
            (weight, WeightLayout::Rows)
        };
        Ok(Linear {
            weight,
            layout,
            bias,
            rows,
            cols,
        })
    }

    /// The weight as a kernel matrix.
    pub fn matrix(&self) -> WeightMatrix<'_> {
        WeightMatrix {
            ty: self.weight.ty,
            rows: self.rows,
            cols: self.cols,
            data: self.weight.data(),
            layout: self.layout,
        }
    }

    /// `out[t] = W x[t] + b` for the `n` rows of `x` (`[n, cols]` -> `[n, rows]`).
    pub fn forward(&self, x: &[f32], n: usize, out: &mut Vec<f32>) -> Result<(), ModelError> {
        out.resize(n * self.rows, 0.0);
        pagoda_kernels::matmul(&self.matrix(), x, n, out)?;
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(self.rows) {
                ops::add_inplace(row, b);
            }
        }
        Ok(())
    }

    /// [`Linear::forward`] of several layers that share the input `x` (Q, K and V; gate and
    /// up) in one kernel call: the activations are quantized once and all rows run in one
    /// parallel region; each output is bit-identical to its own `forward`.
    pub fn forward_group<const N: usize>(
        layers: [&Linear; N],
        x: &[f32],
        n: usize,
        outs: [&mut Vec<f32>; N],
    ) -> Result<(), ModelError> {
        let mut views: Vec<&mut [f32]> = Vec::with_capacity(N);
        for (layer, out) in layers.iter().zip(outs) {
            out.resize(n * layer.rows, 0.0);
            views.push(out.as_mut_slice());
        }
        let matrices = layers.map(|l| l.matrix());
        pagoda_kernels::matmul_group(&matrices, x, n, &mut views)?;
        for (layer, out) in layers.iter().zip(views) {
            if let Some(b) = &layer.bias {
                for row in out.chunks_exact_mut(layer.rows) {
                    ops::add_inplace(row, b);
                }
            }
        }
        Ok(())
    }

    /// Row `r` of the weight as f32 (an embedding lookup).
    pub fn row(&self, r: usize, out: &mut [f32]) -> Result<(), ModelError> {
        Ok(self.matrix().dequantize_row(r, out)?)
    }

    /// Bytes of weight data (for memory reports).
    pub fn weight_bytes(&self) -> usize {
        self.weight.data().len()
    }

    /// The weight's canonical tensor name (`blk.3.attn_q.weight`).
    pub fn name(&self) -> &str {
        &self.weight.name
    }

    /// Adds the forward pass's LoRA adapters to this layer's output `out` (`[total, rows]`)
    /// for input `x` (`[total, cols]`): [`LoraBatch::apply`] under this layer's name.
    pub fn add_lora(&self, lora: &mut LoraBatch, x: &[f32], out: &mut [f32]) {
        lora.apply(self.name(), (self.rows, self.cols), x, out);
    }
}

thread_local! {
    /// Set while [`borrowing_only`] runs on this thread: nothing is repacked.
    static BORROW_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` (a model build) with every linear kept in the file's row layout, so the build
/// borrows the weights instead of copying them: what a check that a model loads needs
/// ([`crate::Model::check`]). Restores the previous setting even if `f` panics.
pub(crate) fn borrowing_only<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BORROW_ONLY.with(|b| b.set(self.0));
        }
    }
    let _restore = Restore(BORROW_ONLY.with(|b| b.replace(true)));
    f()
}

/// Whether a `rows x cols` weight of `ty` is repacked into strips at load: the type and shape
/// allow it, the strip kernel runs on this CPU, `PAGODA_WEIGHT_LAYOUT` is not `rows`, and the
/// build is not a [`borrowing_only`] check.
fn repack_for_this_cpu(ty: pagoda_kernels::GgmlType, rows: usize, cols: usize) -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let enabled = *ENABLED.get_or_init(|| {
        pagoda_kernels::packed::strips_are_fast()
            && std::env::var("PAGODA_WEIGHT_LAYOUT").as_deref() != Ok("rows")
    });
    enabled
        && !BORROW_ONLY.with(std::cell::Cell::get)
        && pagoda_kernels::packed::strips_pay(ty)
        && pagoda_kernels::packed::packable(ty, rows, cols)
}

/// Rows packed at a time: the file pages of one piece are released before the next is read,
/// so loading never holds a whole matrix twice (a multiple of the strip height).
const PACK_PIECE_ROWS: usize = 64 * pagoda_kernels::packed::STRIP_ROWS;

/// `weight` (row layout, shape-checked) repacked into a new, 64-byte aligned buffer, piece by
/// piece; each piece's file pages leave the RSS once it is packed (strips are whole rows,
/// so a piece of rows is a piece of strips).
fn pack_strips(weight: &TensorView, rows: usize, cols: usize) -> Result<TensorView, ModelError> {
    let fault = |message: String| ModelError::Tensor {
        path: Default::default(),
        tensor: weight.name.clone(),
        message,
    };
    let data = weight.data();
    let row_bytes = data.len() / rows.max(1);
    TensorView::owned_aligned(
        weight.name.clone(),
        weight.ty,
        weight.shape.clone(),
        weight.n_bytes(),
        |out| -> Result<(), pagoda_kernels::KernelError> {
            for r0 in (0..rows).step_by(PACK_PIECE_ROWS) {
                let r1 = (r0 + PACK_PIECE_ROWS).min(rows);
                let bytes = r0 * row_bytes..r1 * row_bytes;
                let piece = WeightMatrix::new(weight.ty, r1 - r0, cols, &data[bytes.clone()])?;
                piece.pack_into(&mut out[bytes.clone()])?;
                // The file's copy is no longer read by the forward pass.
                weight.release_pages(bytes);
            }
            Ok(())
        },
    )
    .map_err(fault)
}

pub use crate::observer::LinearObserver;

/// The observer of a forward pass, if any (a newtype so that [`Scratch`] stays `Debug`).
#[derive(Clone, Default)]
pub struct ObserverSlot(pub Option<std::sync::Arc<dyn LinearObserver>>);

impl std::fmt::Debug for ObserverSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ObserverSlot(Some)"
        } else {
            "ObserverSlot(None)"
        })
    }
}

impl ObserverSlot {
    /// Tells the observer, if there is one, that `x` feeds `linears`.
    #[inline]
    pub fn see(&self, linears: &[&Linear], x: &[f32], n: usize) {
        if let Some(o) = &self.0 {
            let names: Vec<&str> = linears.iter().map(|l| l.name()).collect();
            o.observe(&names, x, n);
        }
    }
}

/// An RMSNorm weight, dequantized to f32 (it is small).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
    offset: f32,
}

impl RmsNorm {
    pub fn load(
        weights: &Weights,
        name: &str,
        dim: usize,
        cfg: &ModelConfig,
    ) -> Result<Self, ModelError> {
        Ok(RmsNorm {
            weight: weights.vector_f32(name, dim)?,
            eps: cfg.rms_eps,
            offset: cfg.norm_weight_offset,
        })
    }

    /// Normalizes every row of `x` into `out` (same shape).
    pub fn forward(&self, x: &[f32], out: &mut Vec<f32>) {
        out.resize(x.len(), 0.0);
        ops::rms_norm(x, &self.weight, self.eps, self.offset, out);
    }

    /// The weight (without the config's offset), `eps` and the offset added to the weight.
    pub fn parts(&self) -> (&[f32], f32, f32) {
        (&self.weight, self.eps, self.offset)
    }

    /// Normalizes every `weight.len()`-sized piece of `x` in place (per-head QK-norm).
    pub fn forward_inplace(&self, x: &mut [f32]) {
        ops::rms_norm_inplace(x, &self.weight, self.eps, self.offset);
    }
}

pub(crate) fn expect_shape(t: &TensorView, shape: &[usize]) -> Result<(), ModelError> {
    if t.shape != shape {
        return Err(ModelError::Tensor {
            path: Default::default(),
            tensor: t.name.clone(),
            message: format!("shape {:?}, but the config implies {:?}", t.shape, shape),
        });
    }
    Ok(())
}

/// The CPU forward pass's reusable state (kept in the [`PagedKvCache`] between calls): the
/// activation buffers, the calibration observer and the LoRA adapters of the pass.
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    pub act: Activations<Vec<f32>>,
    /// Calibration hook: sees every linear layer's input (none when serving).
    pub observer: ObserverSlot,
    /// The LoRA adapters of the current forward pass, by rows (empty outside one).
    pub lora: LoraBatch,
}
