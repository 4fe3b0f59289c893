//! Weight quantization: which formats a model's weights can be turned into, and the
//! round-to-nearest quantization of a loaded model's weights (online, at load time — like
//! bitsandbytes' `load_in_4bit`, with llama.cpp's block formats and tensor rules).
//!
//! - [`target`] — [`QuantTarget`], parsed from user strings (`q4_k`, `int8`), and the
//!   row-length fallback chain.
//! - [`rules`] — which tensors are quantized and to which type (llama.cpp's rules).
//! - [`report`] — [`QuantReport`]: bytes before/after, counts per type, kept and fallen-back
//!   tensors.
//! - [`quantize_weights`] — the conversion itself.
//! - [`grid`] — group-wise integer grids (bits, group size, symmetric or not) and RTN on them;
//!   [`gptq`] and [`awq`] — the calibration-aware algorithms over those grids (offline
//!   quantization); `linalg` — the Cholesky pieces GPTQ needs.
//! - [`calibrate`] — runs calibration text through a model and records each linear input's
//!   Hessian and channel magnitudes; `layer` — RTN/GPTQ/AWQ of one decoder layer into GGUF
//!   blocks (Q4_0, Q4_1, Q8_0), with AWQ's scales folded into the preceding norm/projection;
//!   [`offline`] — the drivers over a whole model (and the public face of `layer`'s options
//!   and results); [`sequential`] — the layer-wise driver, calibrated on the outputs of the
//!   layers already quantized (bounded memory: one layer's statistics at a time);
//!   [`write`] — the result as a GGUF file (source metadata, atomic write).
//!
//! Invariants: a matrix is converted row by row (dequantize one row to f32, quantize it
//! with the kernels' reference quantizer), rows in parallel on the rayon pool, so the extra
//! memory is the output plus one f32 row per task, never the model in f32. A tensor that
//! already has the type it would get is left byte for byte as it was. When anything was
//! converted, every tensor of the result owns its bytes (the kept ones are copied), so the
//! result holds no reference to the file's mapping and the memory the report gives is the
//! memory the weights take; when nothing changes the input views are returned as they are.

// `usize::is_multiple_of` is newer than the workspace's rust-version (1.85).
#![allow(clippy::manual_is_multiple_of)]

pub mod awq;
pub mod calibrate;
pub mod gguf_meta;
pub mod gptq;
pub mod grid;
pub mod hf_write;
pub(crate) mod layer;
pub(crate) mod linalg;
pub mod offline;
pub mod report;
pub mod rules;
pub mod sequential;
pub mod target;
pub mod write;

pub use report::{QuantReport, TensorOutcome};
pub use rules::Plan;
pub use target::{QuantTarget, ALIASES, TARGETS};

use crate::CompressError;
use pagoda_kernels::{dequantize_row, quantize_row, GgmlType};
use pagoda_model::weights::{TensorView, Weights};
use rayon::prelude::*;
use std::time::Instant;

/// Elements one rayon task converts at least (several short rows per task).
const ELEMENTS_PER_TASK: usize = 1 << 16;

/// How [`quantize_weights`] applies the target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuantOptions {
    /// Every weight matrix gets the target, the output head too (llama.cpp's `--pure`);
    /// by default the head gets Q6_K or Q8_0 as llama.cpp gives it.
    pub pure: bool,
}

/// Quantizes `weights` to `target` following [`rules`]; returns the new weights and what was
/// done. Errors name the tensor: a non-finite weight, a shape whose size overflows.
pub fn quantize_weights(
    weights: &Weights,
    target: QuantTarget,
    options: &QuantOptions,
) -> Result<(Weights, QuantReport), CompressError> {
    let started = Instant::now();
    let head = rules::output_head_name(weights);
    let plans: Vec<(&TensorView, Plan)> = weights
        .iter()
        .map(|v| (v, rules::plan(v, target, v.name == head, options.pure)))
        .collect();
    let any_converted = plans.iter().any(|(_, p)| matches!(p, Plan::Convert { .. }));
    let mut out = Weights::new();
    let mut tensors = Vec::with_capacity(plans.len());
    for (view, plan) in plans {
        let new_view = match plan {
            Plan::Convert { to, .. } => {
                let data = convert(view, to)?;
                owned(view, to, data)?
            }
            _ if any_converted => owned(view, view.ty, view.data().to_vec())?,
            _ => view.clone(),
        };
        if let Some(wanted) = match plan {
            Plan::Convert { to, wanted } if to != wanted => Some(wanted),
            _ => None,
        } {
            tracing::debug!(tensor = %view.name, cols = view.cols(), %wanted, to = %new_view.ty, "row length does not fit; fell back");
        }
        tensors.push(TensorOutcome {
            name: view.name.clone(),
            from: view.ty,
            to: new_view.ty,
            plan,
            bytes_before: view.n_bytes() as u64,
            bytes_after: new_view.n_bytes() as u64,
        });
        out.insert(new_view).map_err(CompressError::InvalidInput)?;
    }
    let report = QuantReport {
        target: target.ty(),
        tensors,
        elapsed: started.elapsed(),
    };
    Ok((out, report))
}

/// An owned view named and shaped as `view`, of type `ty`, over `data`.
fn owned(view: &TensorView, ty: GgmlType, data: Vec<u8>) -> Result<TensorView, CompressError> {
    TensorView::owned(view.name.clone(), ty, view.shape.clone(), data).map_err(|message| {
        CompressError::Tensor {
            tensor: view.name.clone(),
            ty: view.ty,
            shape: view.shape.clone(),
            to: ty,
            message,
        }
    })
}

/// `view`'s data as `to`, row by row on the rayon pool.
fn convert(view: &TensorView, to: GgmlType) -> Result<Vec<u8>, CompressError> {
    let tensor_error = |message: String| CompressError::Tensor {
        tensor: view.name.clone(),
        ty: view.ty,
        shape: view.shape.clone(),
        to,
        message,
    };
    let (rows, cols) = (view.rows(), view.cols());
    let src_row = view.ty.row_bytes(cols)?;
    let dst_row = to
        .row_bytes(cols)
        .map_err(|e| tensor_error(e.to_string()))?;
    let total = dst_row
        .checked_mul(rows)
        .ok_or_else(|| tensor_error("the output size overflows".into()))?;
    let mut out = vec![0u8; total];
    if total == 0 {
        return Ok(out);
    }
    let rows_per_task = (ELEMENTS_PER_TASK / cols).max(1);
    let src = view.data();
    out.par_chunks_mut(dst_row * rows_per_task)
        .enumerate()
        .try_for_each_init(
            || vec![0f32; cols],
            |row, (task, dst)| {
                for (k, dst) in dst.chunks_exact_mut(dst_row).enumerate() {
                    let r = task * rows_per_task + k;
                    dequantize_row(view.ty, &src[r * src_row..(r + 1) * src_row], row)?;
                    if let Some(col) = row.iter().position(|v| !v.is_finite()) {
                        return Err(CompressError::NonFinite {
                            tensor: view.name.clone(),
                            ty: view.ty,
                            row: r,
                            col,
                            value: row[col],
                        });
                    }
                    quantize_row(to, row, dst)?;
                }
                Ok(())
            },
        )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(name: &str, rows: usize, cols: usize, f: impl Fn(usize) -> f32) -> TensorView {
        let mut data = Vec::with_capacity(rows * cols * 4);
        for i in 0..rows * cols {
            data.extend_from_slice(&f(i).to_le_bytes());
        }
        TensorView::owned(name, GgmlType::F32, vec![rows, cols], data).unwrap()
    }

    #[test]
    fn many_short_rows_convert_across_task_boundaries() {
        // 3000 rows of 32: several tasks, the last one partial.
        let v = matrix("blk.0.attn_q.weight", 3000, 32, |i| (i % 97) as f32 - 48.0);
        let data = convert(&v, GgmlType::Q8_0).unwrap();
        let mut back = vec![0f32; 32];
        for r in [0, 2047, 2048, 2999] {
            dequantize_row(GgmlType::Q8_0, &data[r * 34..(r + 1) * 34], &mut back).unwrap();
            for (c, b) in back.iter().enumerate() {
                let want = ((r * 32 + c) % 97) as f32 - 48.0;
                assert!(
                    (b - want).abs() <= 48.0 / 127.0,
                    "row {r} col {c}: {b} vs {want}"
                );
            }
        }
    }

    #[test]
    fn nothing_to_do_returns_the_same_views() {
        let mut w = Weights::new();
        w.insert(matrix("output_norm.weight", 1, 8, |_| 1.0))
            .unwrap();
        let (out, report) =
            quantize_weights(&w, "q8_0".parse().unwrap(), &Default::default()).unwrap();
        assert_eq!(report.n_converted(), 0);
        assert_eq!(report.bytes_before(), report.bytes_after());
        let a = w.get("output_norm.weight").unwrap().data().as_ptr();
        assert_eq!(out.get("output_norm.weight").unwrap().data().as_ptr(), a);
    }
}
