//! Several matrix products over the same activations in one parallel region: the Q, K and V
//! projections of a layer, or the gate and up projections of its MLP.
//!
//! Decoding a token on a CPU runs hundreds of small matrix products per step; as separate
//! [`matmul`](crate::matmul) calls each one quantizes the activations again and pays a fork
//! and a join (threads wait for the slowest chunk). [`matmul_group`] quantizes the activations
//! once per partner layout and spreads the row chunks of all its matrices over one fork.
//!
//! Invariant: every output element is bit-identical to what `matmul` gives for that matrix
//! alone: the same kernel computes it from the same quantized activations, in the same token
//! tiles (see `matmul::compute_rows`); only which task computes it differs. Batches of
//! [`crate::BATCH_INVARIANT_ROWS`] rows or more (prefill, where the strip GEMM and column
//! segments apply) and types without a dot kernel go through `matmul` one matrix at a time.

use crate::matmul::{chunk_rows, compute_rows, quantize_activations, OutPtr, WeightMatrix};
use crate::packed::{WeightLayout, STRIP_ROWS};
use crate::simd::{kernel, ActLayout, RowKernel};
use crate::{Isa, KernelError};

/// `outs[i] = x · ws[i]ᵀ` for matrices sharing `x` (`[n, cols]`, every matrix `cols` wide),
/// each `outs[i]` `[n, ws[i].rows]`, on the fastest available ISA path.
pub fn matmul_group(
    ws: &[WeightMatrix<'_>],
    x: &[f32],
    n: usize,
    outs: &mut [&mut [f32]],
) -> Result<(), KernelError> {
    matmul_group_with_isa(crate::best_isa(), ws, x, n, outs)
}

/// How one matrix of the group is computed.
enum Plan {
    /// Integer dot against the activations quantized to `layout`.
    Quant {
        layout: ActLayout,
        dot: crate::simd::QDot,
    },
    /// Float weights against the f32 activations.
    Float { dot: crate::simd::FDot },
    /// Packed strips against the activations in the type's partner layout (task ranges
    /// are strips).
    Strips { layout: ActLayout },
}

/// As [`matmul_group`], on path `isa` (an error when this CPU lacks it).
pub fn matmul_group_with_isa(
    isa: Isa,
    ws: &[WeightMatrix<'_>],
    x: &[f32],
    n: usize,
    outs: &mut [&mut [f32]],
) -> Result<(), KernelError> {
    if ws.len() != outs.len() {
        return Err(KernelError::Shape(format!(
            "{} matrices but {} outputs",
            ws.len(),
            outs.len()
        )));
    }
    let fallback = |outs: &mut [&mut [f32]]| -> Result<(), KernelError> {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            crate::matmul::matmul_with_isa(isa, w, x, n, out)?;
        }
        Ok(())
    };
    let Some(first) = ws.first() else {
        return Ok(());
    };
    let cols = first.cols;
    if n == 0 || n >= crate::BATCH_INVARIANT_ROWS || cols == 0 || ws.len() == 1 {
        return fallback(outs);
    }
    if !isa.is_available() {
        return Err(KernelError::IsaUnavailable(isa.name()));
    }
    // Validate every matrix and output exactly as `matmul` would, before any kernel runs.
    let mut mats = Vec::with_capacity(ws.len());
    let mut plans = Vec::with_capacity(ws.len());
    let mut layouts: Vec<(ActLayout, crate::simd::QuantizeRow)> = Vec::new();
    let mut need_isums = false;
    for (w, out) in ws.iter().zip(outs.iter()) {
        let w = w.validated()?;
        if w.cols != cols || n.checked_mul(cols) != Some(x.len()) {
            return Err(KernelError::Shape(format!(
                "activations hold {} values, expected {n} tokens x {} columns",
                x.len(),
                w.cols
            )));
        }
        if n.checked_mul(w.rows) != Some(out.len()) {
            return Err(KernelError::Shape(format!(
                "output holds {} values, expected {n} tokens x {} rows",
                out.len(),
                w.rows
            )));
        }
        let row_kernel = if w.layout == WeightLayout::Strips16 {
            if !crate::matmul::strip_kernel_on(isa) {
                return fallback(outs);
            }
            need_isums |= crate::matmul::needs_isums(w.ty);
            // The strips take the activations the type's row kernel takes.
            let layout = match kernel(isa, w.ty) {
                RowKernel::Quant {
                    partner, quantize, ..
                } => {
                    if !layouts.iter().any(|(l, _)| *l == partner) {
                        layouts.push((partner, quantize));
                    }
                    partner
                }
                _ => return fallback(outs),
            };
            plans.push(Plan::Strips { layout });
            mats.push(w);
            continue;
        } else {
            kernel(isa, w.ty)
        };
        plans.push(match row_kernel {
            RowKernel::Quant {
                partner,
                quantize,
                dot,
            } => {
                if !layouts.iter().any(|(l, _)| *l == partner) {
                    layouts.push((partner, quantize));
                }
                Plan::Quant {
                    layout: partner,
                    dot,
                }
            }
            RowKernel::Float { dot } => Plan::Float { dot },
            RowKernel::Dequant => return fallback(outs),
        });
        mats.push(w);
    }
    // The activations, quantized once per partner layout the group needs.
    let mut acts = Vec::with_capacity(layouts.len());
    for (layout, quantize) in &layouts {
        let arow = layout.row_bytes(cols)?;
        // SAFETY: `isa` is available (checked above), so its `quantize` may run.
        acts.push((*layout, arow, unsafe {
            quantize_activations(*quantize, x, n, cols, arow)
        }));
    }
    let isums = match acts.iter().find(|(l, _, _)| *l == ActLayout::Split32) {
        Some((_, arow, a)) if need_isums => crate::matmul::block_sums(a, *arow, n, cols),
        _ => Vec::new(),
    };
    // Every matrix's row chunks, as `matmul` would cut them, as one list of tasks.
    let mut tasks = Vec::new();
    for (i, w) in mats.iter().enumerate() {
        if matches!(plans[i], Plan::Strips { .. }) {
            let (strips, per) = (w.rows / STRIP_ROWS, crate::matmul::strips_per_task(w, n));
            tasks.extend(
                (0..strips)
                    .step_by(per)
                    .map(|s0| (i, s0..(s0 + per).min(strips))),
            );
            continue;
        }
        let row_bytes = w.ty.row_bytes(cols)?;
        let chunk = chunk_rows(w.rows, row_bytes, n);
        tasks.extend(
            (0..w.rows)
                .step_by(chunk)
                .map(|r0| (i, r0..(r0 + chunk).min(w.rows))),
        );
    }
    let ptrs: Vec<OutPtr> = outs.iter_mut().map(|o| OutPtr(o.as_mut_ptr())).collect();
    let run = |(i, rs): &(usize, std::ops::Range<usize>)| {
        let w = &mats[*i];
        let row_bytes = w.row_bytes();
        match plans[*i] {
            Plan::Quant { layout, dot } => {
                let Some((_, arow, a)) = acts.iter().find(|(l, _, _)| *l == layout) else {
                    return;
                };
                let arow = *arow;
                let f = |wrow: &[u8], _seg: usize, t0: usize, nt: usize, o: &mut [f32; 8]| {
                    // SAFETY: `isa` is available; `wrow` is a whole row and tokens
                    // t0..t0+nt have `arow` bytes each in `a`.
                    unsafe { dot(wrow, &a[t0 * arow..(t0 + nt) * arow], arow, nt, o) }
                };
                // SAFETY: `ptrs[i]` is output `i` (`[n, rows]`, validated) and the tasks of
                // matrix `i` hold disjoint row ranges.
                unsafe { compute_rows(w, row_bytes, rs.clone(), n, 1, ptrs[*i], &f) };
            }
            Plan::Float { dot } => {
                let f = |wrow: &[u8], _seg: usize, t0: usize, nt: usize, o: &mut [f32; 8]| {
                    // SAFETY: as above, with `cols` f32 values per token.
                    unsafe { dot(wrow, &x[t0 * cols..(t0 + nt) * cols], cols, nt, o) }
                };
                // SAFETY: as above.
                unsafe { compute_rows(w, row_bytes, rs.clone(), n, 1, ptrs[*i], &f) };
            }
            Plan::Strips { layout } => {
                #[cfg(target_arch = "x86_64")]
                if let Some((_, arow, a)) = acts.iter().find(|(l, _, _)| *l == layout) {
                    // SAFETY: the strip kernel runs on `isa` (checked when planning); `w` is
                    // validated and packed; `a` holds `n` rows in its partner layout, with
                    // their block sums when the group needs them (Split32 types only);
                    // matrix `i`'s tasks own disjoint strips.
                    unsafe {
                        crate::matmul::compute_strips(
                            w,
                            rs.clone(),
                            n,
                            (a, *arow, &isums),
                            ptrs[*i],
                        )
                    };
                }
            }
        }
    };
    if tasks.len() == 1 {
        run(&tasks[0]);
    } else {
        crate::hot_pool::parallel_for(tasks.len(), &|i| run(&tasks[i]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{quantize_row, GgmlType};

    fn values(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12345);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 20_001) as f32 / 10_000.0 - 1.0
            })
            .collect()
    }

    fn quantized(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let src = values(rows * cols, seed);
        let rb = ty.row_bytes(cols).unwrap();
        let mut data = vec![0u8; rows * rb];
        for (dst, row) in data.chunks_exact_mut(rb).zip(src.chunks_exact(cols)) {
            quantize_row(ty, row, dst).unwrap();
        }
        data
    }

    /// Bit-identical to one `matmul` per matrix, for mixed types (two partner layouts and a
    /// float type in one group) and every batch size of the decode path and past it.
    #[test]
    fn equals_separate_matmuls_bit_for_bit() {
        let cols = 512;
        let types = [
            (GgmlType::Q4_K, 96),
            (GgmlType::Q6_K, 40),
            (GgmlType::Q4_1, 64),
            (GgmlType::Q8_0, 33),
            (GgmlType::F16, 17),
        ];
        let data: Vec<Vec<u8>> = types
            .iter()
            .enumerate()
            .map(|(i, &(ty, rows))| quantized(ty, rows, cols, i as u32 + 1))
            .collect();
        let ws: Vec<WeightMatrix<'_>> = types
            .iter()
            .zip(&data)
            .map(|(&(ty, rows), d)| WeightMatrix::new(ty, rows, cols, d).unwrap())
            .collect();
        for isa in crate::available_isas() {
            for n in [1, 2, 5, 8, 9, 17, 18, 20] {
                let x = values(n * cols, 100 + n as u32);
                let mut alone: Vec<Vec<f32>> = Vec::new();
                for w in &ws {
                    let mut out = vec![0.0; n * w.rows];
                    crate::matmul_with_isa(isa, w, &x, n, &mut out).unwrap();
                    alone.push(out);
                }
                let mut grouped: Vec<Vec<f32>> =
                    ws.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
                let mut views: Vec<&mut [f32]> =
                    grouped.iter_mut().map(|v| v.as_mut_slice()).collect();
                matmul_group_with_isa(isa, &ws, &x, n, &mut views).unwrap();
                for (i, (a, g)) in alone.iter().zip(&grouped).enumerate() {
                    let same = a.iter().zip(g).all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(same, "{isa:?} n={n} matrix {i} ({:?}) differs", types[i].0);
                }
            }
        }
    }

    #[test]
    fn mismatched_shapes_are_errors_not_panics() {
        let d = quantized(GgmlType::Q8_0, 4, 64, 1);
        let e = quantized(GgmlType::Q8_0, 4, 32, 2);
        let w = WeightMatrix::new(GgmlType::Q8_0, 4, 64, &d).unwrap();
        let narrow = WeightMatrix::new(GgmlType::Q8_0, 4, 32, &e).unwrap();
        let x = values(2 * 64, 3);
        let (mut o1, mut o2) = (vec![0.0; 8], vec![0.0; 8]);
        // Different widths in one group.
        let r = matmul_group(&[w, narrow], &x, 2, &mut [&mut o1, &mut o2]);
        assert!(matches!(r, Err(KernelError::Shape(_))), "{r:?}");
        // An output of the wrong size.
        let mut short = vec![0.0; 7];
        let r = matmul_group(&[w, w], &x, 2, &mut [&mut o1, &mut short]);
        assert!(matches!(r, Err(KernelError::Shape(_))), "{r:?}");
        // Counts that do not pair up.
        let r = matmul_group(&[w, w], &x, 2, &mut [&mut o1]);
        assert!(matches!(r, Err(KernelError::Shape(_))), "{r:?}");
    }
}
