//! The three ways of choosing which weights of one linear layer become zero, on one matrix
//! `W: [rows, cols]` (row = output feature, column = input channel):
//!
//! - [`magnitude`] — the smallest `|W_ij|`, per output row (every row keeps the same count).
//! - [`wanda`] — Wanda (Sun et al., 2023): the smallest `|W_ij| · ‖X_j‖₂`, per output row
//!   (the paper's comparison group); `‖X_j‖₂` comes from the Hessian's diagonal
//!   (`H_jj = 2/n · Σ x_j²`, a constant factor away, which does not change a row's ranking).
//! - [`sparsegpt`] — SparseGPT (Frantar & Alistarh, 2023): columns in blocks of `block`; at
//!   each block's start the mask of the block is chosen by `w² / [H⁻¹]_jj²` (unstructured:
//!   the block's smallest fraction over all its rows; N:M: at every M-th column, the M − N
//!   smallest of the next M in each row), then column by column the pruned weights' error is
//!   spread over the row's later columns through the upper Cholesky factor of the dampened
//!   `H⁻¹` (GPTQ's [`GptqFactor`], shared with quantization), in blocks as the reference.
//!
//! Invariants: masks are exact counts — unstructured prunes `floor(s · group)` weights of
//! every group (a row, or a SparseGPT block), N:M prunes exactly `M − N` of every `M`
//! consecutive columns of a row — ties broken by the lower index first (a stable sort), so the
//! result is deterministic and matches a NumPy `argsort(kind="stable")`. (SparseGPT's
//! reference thresholds with `<=` at index `floor(s · numel)` and so prunes one weight more
//! per block; this module prunes the requested fraction.) Pruned weights are exactly `0.0`;
//! SparseGPT also zeroes dead columns (inputs calibration never saw non-zero), as GPTQ does.

use rayon::prelude::*;

use super::{Pattern, PruneOptions};
use crate::quantize::gptq::{GptqFactor, GptqOptions, Hessian};
use crate::quantize::linalg::{gemm_f32, MatRef};
use crate::CompressError;

/// Indices of the `k` smallest `scores` (ties: lower index first).
fn smallest(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// The mask (`true` = pruned) of one row of `scores` for `pattern` at `sparsity`.
fn row_mask(scores: &[f32], pattern: Pattern, sparsity: f64, mask: &mut [bool]) {
    match pattern {
        Pattern::Unstructured => {
            let k = (sparsity * scores.len() as f64).floor() as usize;
            for i in smallest(scores, k) {
                mask[i] = true;
            }
        }
        Pattern::NM { n, m } => {
            for (g, s) in scores.chunks(m).enumerate() {
                // A short tail group (cols not a multiple of M) prunes proportionally.
                let k = if s.len() == m {
                    m - n
                } else {
                    s.len() * (m - n) / m
                };
                for i in smallest(s, k) {
                    mask[g * m + i] = true;
                }
            }
        }
    }
}

/// The row-wise mask of a score matrix.
fn rowwise(scores: &[f32], rows: usize, cols: usize, opts: &PruneOptions) -> Vec<bool> {
    debug_assert_eq!(scores.len(), rows * cols);
    let mut mask = vec![false; rows * cols];
    mask.par_chunks_mut(cols.max(1))
        .zip(scores.par_chunks(cols.max(1)))
        .for_each(|(m, s)| row_mask(s, opts.pattern, opts.sparsity, m));
    mask
}

fn apply(w: &[f32], mask: &[bool]) -> Vec<f32> {
    w.iter()
        .zip(mask)
        .map(|(&v, &m)| if m { 0.0 } else { v })
        .collect()
}

fn check(w: &[f32], rows: usize, cols: usize) -> Result<(), CompressError> {
    if rows.checked_mul(cols) != Some(w.len()) || cols == 0 {
        return Err(CompressError::InvalidInput(format!(
            "a matrix of {} values is not {rows}x{cols}",
            w.len()
        )));
    }
    Ok(())
}

/// Magnitude pruning per output row: `W` with each row's smallest `|W_ij|` set to zero.
pub fn magnitude(
    w: &[f32],
    rows: usize,
    cols: usize,
    opts: &PruneOptions,
) -> Result<Vec<f32>, CompressError> {
    check(w, rows, cols)?;
    let scores: Vec<f32> = w.iter().map(|v| v.abs()).collect();
    Ok(apply(w, &rowwise(&scores, rows, cols, opts)))
}

/// The mask Wanda chooses (`true` = pruned): per output row, the smallest `|W_ij| · √H_jj`.
pub fn wanda_mask(
    w: &[f32],
    rows: usize,
    cols: usize,
    hessian: &Hessian,
    opts: &PruneOptions,
) -> Result<Vec<bool>, CompressError> {
    check(w, rows, cols)?;
    if hessian.cols != cols {
        return Err(CompressError::InvalidInput(format!(
            "a Hessian of {} columns for a matrix of {cols}",
            hessian.cols
        )));
    }
    let norms: Vec<f32> = (0..cols)
        .map(|j| hessian.h[j * cols + j].max(0.0).sqrt() as f32)
        .collect();
    let scores: Vec<f32> = w
        .chunks_exact(cols)
        .flat_map(|row| row.iter().zip(&norms).map(|(v, n)| v.abs() * n))
        .collect();
    Ok(rowwise(&scores, rows, cols, opts))
}

/// Wanda pruning: `W` with [`wanda_mask`]'s weights set to zero (no weight update).
pub fn wanda(
    w: &[f32],
    rows: usize,
    cols: usize,
    hessian: &Hessian,
    opts: &PruneOptions,
) -> Result<Vec<f32>, CompressError> {
    Ok(apply(w, &wanda_mask(w, rows, cols, hessian, opts)?))
}

/// The factor SparseGPT runs on: GPTQ's (dead columns, dampening, upper Cholesky factor of
/// `H⁻¹`) in the natural column order.
pub fn sparsegpt_factor(hessian: &Hessian, damp: f64) -> Result<GptqFactor, CompressError> {
    GptqFactor::new(
        hessian,
        &GptqOptions {
            damp,
            act_order: false,
            ..GptqOptions::default()
        },
    )
}

/// SparseGPT: the pruned and compensated `W` (see the module docs).
pub fn sparsegpt(
    w: &[f32],
    rows: usize,
    cols: usize,
    factor: &GptqFactor,
    opts: &PruneOptions,
) -> Result<Vec<f32>, CompressError> {
    check(w, rows, cols)?;
    let (u, dead) = factor.natural_order().ok_or_else(|| {
        CompressError::InvalidInput("SparseGPT needs a factor in natural column order".into())
    })?;
    if dead.len() != cols {
        return Err(CompressError::InvalidInput(format!(
            "a Hessian factor of {} columns for a matrix of {cols}",
            dead.len()
        )));
    }
    let block = opts.block.max(1);
    let mut work: Vec<f32> = w.to_vec();
    for row in work.chunks_exact_mut(cols) {
        for (x, &d) in row.iter_mut().zip(dead) {
            if d {
                *x = 0.0;
            }
        }
    }
    let diag: Vec<f32> = (0..cols).map(|j| u[j * cols + j]).collect();
    let mut err = vec![0.0f32; rows * block];
    let mut mask = vec![false; rows * block];
    for b0 in (0..cols).step_by(block) {
        let b1 = (b0 + block).min(cols);
        let bw = b1 - b0;
        mask.fill(false);
        if opts.pattern == Pattern::Unstructured {
            // The block's smallest fraction over all its rows.
            let scores: Vec<f32> = work
                .chunks_exact(cols)
                .flat_map(|row| {
                    row[b0..b1]
                        .iter()
                        .zip(&diag[b0..b1])
                        .map(|(v, d)| v * v / (d * d))
                })
                .collect();
            let k = (opts.sparsity * (rows * bw) as f64).floor() as usize;
            for i in smallest(&scores, k) {
                mask[(i / bw) * block + i % bw] = true;
            }
        }
        work.par_chunks_mut(cols)
            .zip(err.par_chunks_mut(block))
            .zip(mask.par_chunks_mut(block))
            .for_each(|((row, e), m)| {
                for i in b0..b1 {
                    if let Pattern::NM { n, m: group } = opts.pattern {
                        if (i - b0) % group == 0 {
                            // The next M columns of this row, as compensated so far.
                            let end = (i + group).min(b1);
                            let s: Vec<f32> = row[i..end]
                                .iter()
                                .zip(&diag[i..end])
                                .map(|(v, d)| v * v / (d * d))
                                .collect();
                            let k = if s.len() == group {
                                group - n
                            } else {
                                s.len() * (group - n) / group
                            };
                            for j in smallest(&s, k) {
                                m[i - b0 + j] = true;
                            }
                        }
                    }
                    let ui = &u[i * cols..(i + 1) * cols];
                    let q = if m[i - b0] { 0.0 } else { row[i] };
                    let er = (row[i] - q) / ui[i];
                    row[i] = q;
                    e[i - b0] = er;
                    if er != 0.0 {
                        for (x, &uij) in row[i + 1..b1].iter_mut().zip(&ui[i + 1..b1]) {
                            *x -= er * uij;
                        }
                    }
                }
            });
        if b1 < cols {
            // work[:, b1..] −= err[:, ..bw] · U[b0..b1, b1..]
            let e = MatRef {
                data: &err,
                rows,
                cols: bw,
                rs: block,
                cs: 1,
            };
            let ub = MatRef {
                data: &u[b0 * cols + b1..],
                rows: bw,
                cols: cols - b1,
                rs: cols,
                cs: 1,
            };
            gemm_f32(&mut work[b1..], cols, 1.0, e, ub, -1.0);
        }
    }
    Ok(work)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prune::PruneMethod;

    fn opts(pattern: Pattern, sparsity: f64) -> PruneOptions {
        PruneOptions {
            method: PruneMethod::Magnitude,
            sparsity,
            pattern,
            damp: 0.01,
            block: 128,
        }
    }

    fn matrix(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| (((i * 7919) % 997) as f32 / 997.0 - 0.5) * 3.0)
            .collect()
    }

    #[test]
    fn magnitude_prunes_exact_counts_per_row_and_group() {
        let (rows, cols) = (6, 64);
        let w = matrix(rows, cols);
        let p = magnitude(&w, rows, cols, &opts(Pattern::Unstructured, 0.5)).unwrap();
        for row in p.chunks(cols) {
            assert_eq!(row.iter().filter(|v| **v == 0.0).count(), 32);
        }
        let p = magnitude(&w, rows, cols, &opts(Pattern::NM { n: 2, m: 4 }, 0.5)).unwrap();
        for (g, (pg, wg)) in p.chunks(4).zip(w.chunks(4)).enumerate() {
            assert_eq!(pg.iter().filter(|v| **v == 0.0).count(), 2, "group {g}");
            // The kept two are the two largest.
            let kept: f32 = pg.iter().map(|v| v.abs()).sum();
            let mut a: Vec<f32> = wg.iter().map(|v| v.abs()).collect();
            a.sort_by(|x, y| y.total_cmp(x));
            assert_eq!(kept, a[0] + a[1]);
        }
    }

    #[test]
    fn wanda_weighs_by_input_norm() {
        // Two columns: the smaller weight sees a far larger input, so Wanda keeps it.
        let w = vec![1.0f32, 0.5];
        let mut h = Hessian::new(2);
        h.add(&[0.1, 10.0, -0.1, -10.0]).unwrap();
        let o = opts(Pattern::Unstructured, 0.5);
        assert_eq!(wanda(&w, 1, 2, &h, &o).unwrap(), vec![0.0, 0.5]);
        assert_eq!(magnitude(&w, 1, 2, &o).unwrap(), vec![1.0, 0.0]);
    }
}
