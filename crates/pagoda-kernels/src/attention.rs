//! Causal self-attention of new query rows against cached keys and values, with grouped-query
//! heads, an optional sliding window and optional logit soft-capping.
//!
//! Decode (one query row) runs a dot-product loop per head; prefill chunks run two f32 GEMMs
//! per head (`S = Q Kᵀ`, `O = softmax(S) V`) so the work is done by cache-blocked SIMD kernels.
//! The per-head GEMM step (`head_gemm`, over strided f32 views) is shared with
//! `paged_attention`'s prefill path. The row path is the plain reference the paged decode
//! kernels are tested against.
//!
//! Invariants: row `t` of the queries sits at position `start + t` and attends to positions
//! `max(0, start + t + 1 - window) ..= start + t`; `keys`/`values` hold at least
//! `start + n` rows of `n_kv_heads * head_dim`.

use crate::attention_shape::first_visible;
pub use crate::attention_shape::AttentionShape;
use crate::{best_isa, ops, Isa};
use rayon::prelude::*;

/// Query rows below this count use the per-row loop; GEMM setup costs more than it saves.
pub(crate) const GEMM_MIN_ROWS: usize = 4;

/// `out[t] = softmax(scale * q[t] Kᵀ + causal mask) V` for every head.
///
/// `q`, `out`: `[n, n_heads * head_dim]`; `keys`, `values`: `[>= start + n, n_kv_heads * head_dim]`.
pub fn causal_attention(
    shape: &AttentionShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    n: usize,
    start: usize,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let q_dim = shape.n_heads * hd;
    let kv_dim = shape.n_kv_heads * hd;
    assert!(shape.n_kv_heads > 0 && shape.n_heads % shape.n_kv_heads == 0);
    assert_eq!(q.len(), n * q_dim);
    assert_eq!(out.len(), n * q_dim);
    assert!(keys.len() >= (start + n) * kv_dim && values.len() >= (start + n) * kv_dim);
    if n < GEMM_MIN_ROWS {
        attention_rows(shape, q, keys, values, n, start, out);
    } else {
        attention_gemm(shape, q, keys, values, n, start, out);
    }
}

fn attention_rows(
    shape: &AttentionShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    n: usize,
    start: usize,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let n_heads = shape.n_heads;
    let kv_dim = shape.n_kv_heads * hd;
    let group = n_heads / shape.n_kv_heads;
    debug_assert_eq!(out.len(), n * n_heads * hd);
    // One task per (row, head); each owns its `hd`-sized slice of `out`.
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (t, h) = (idx / n_heads, idx % n_heads);
        let kh = h / group;
        let pos = start + t;
        let lo = first_visible(shape.window, pos);
        let qh = &q[t * n_heads * hd + h * hd..][..hd];
        let mut scores: Vec<f32> = (lo..=pos)
            .map(|j| ops::dot_f32(qh, &keys[j * kv_dim + kh * hd..][..hd]) * shape.scale)
            .collect();
        if let Some(cap) = shape.softcap {
            ops::softcap_inplace(&mut scores, cap);
        }
        ops::softmax_inplace(&mut scores);
        o.fill(0.0);
        for (j, &p) in (lo..=pos).zip(&scores) {
            ops::axpy(o, p, &values[j * kv_dim + kh * hd..][..hd]);
        }
    });
}

fn attention_gemm(
    shape: &AttentionShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    n: usize,
    start: usize,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let n_heads = shape.n_heads;
    let q_dim = n_heads * hd;
    let kv_dim = shape.n_kv_heads * hd;
    let group = n_heads / shape.n_kv_heads;
    // Keys any row of this chunk may see: [lo, start + n).
    let lo = first_visible(shape.window, start);
    let isa = best_isa();
    let per_head: Vec<Vec<f32>> = (0..n_heads)
        .into_par_iter()
        .map(|h| {
            let kh = h / group;
            let mut o = vec![0.0f32; n * hd];
            let heads = HeadRows {
                q: &q[h * hd..],
                q_stride: q_dim,
                keys: &keys[lo * kv_dim + kh * hd..],
                values: &values[lo * kv_dim + kh * hd..],
                kv_stride: kv_dim,
            };
            head_gemm(isa, shape, None, &heads, n, start, lo, &mut o);
            o
        })
        .collect();
    for (h, o) in per_head.iter().enumerate() {
        for t in 0..n {
            out[t * q_dim + h * hd..][..hd].copy_from_slice(&o[t * hd..][..hd]);
        }
    }
}

/// One query head's rows and its kv head's visible keys and values, as strided f32 views.
pub(crate) struct HeadRows<'a> {
    /// Row `t` of the queries at `q[t * q_stride..][..head_dim]`.
    pub q: &'a [f32],
    pub q_stride: usize,
    /// Position `lo + j` at `keys[j * kv_stride..][..head_dim]` (likewise `values`).
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub kv_stride: usize,
}

/// The GEMM path for one query head: `n` rows at positions `start..start + n` against the
/// keys and values of positions `lo..start + n` (`lo` at most the first position row 0 may
/// see), `S = scale · Q Kᵀ`, masked soft(capped) max (with `sink` in its denominator when
/// set), `O = S V` into `out` (`[n, head_dim]`).
/// The softmax runs on path `isa` (which must be available).
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_gemm(
    isa: Isa,
    shape: &AttentionShape,
    sink: Option<f32>,
    rows: &HeadRows<'_>,
    n: usize,
    start: usize,
    lo: usize,
    out: &mut [f32],
) {
    let softmax = softmax_fn(isa);
    let hd = shape.head_dim;
    assert!(n > 0 && lo <= first_visible(shape.window, start));
    let len = start + n - lo;
    // These bounds make every element the two GEMMs address lie inside its slice.
    assert!(rows.q.len() >= (n - 1) * rows.q_stride + hd);
    assert!(rows.keys.len() >= (len - 1) * rows.kv_stride + hd);
    assert!(rows.values.len() >= (len - 1) * rows.kv_stride + hd);
    assert_eq!(out.len(), n * hd);
    // [n, len]
    let mut scores = vec![0.0f32; n * len];
    // SAFETY: q rows t < n at stride q_stride, columns < hd; keys rows j < len at stride
    // kv_stride, columns < hd; scores is [n, len] row-major (all asserted above).
    unsafe {
        gemm::gemm(
            n,
            len,
            hd,
            scores.as_mut_ptr(),
            1,
            len as isize,
            false,
            rows.q.as_ptr(),
            1,
            rows.q_stride as isize,
            rows.keys.as_ptr(),
            rows.kv_stride as isize,
            1,
            0.0,
            shape.scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    for (t, row) in scores.chunks_exact_mut(len).enumerate() {
        let pos = start + t;
        let first = first_visible(shape.window, pos) - lo;
        let last = pos - lo; // inclusive
        let visible = &mut row[first..=last];
        if let Some(cap) = shape.softcap {
            ops::softcap_inplace(visible, cap);
        }
        // A sink's share of the denominator, from the scores before they are normalized:
        // with `m` their max and `z = Σ exp(s - m)`, weights become `p · z / (z + exp(sink - m))`.
        let keep = sink.map(|sink| {
            let m = visible.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f32 = visible.iter().map(|&s| (s - m).exp()).sum();
            z / (z + (sink - m).exp())
        });
        // SAFETY: `softmax` is the path of an available ISA (caller's contract).
        unsafe { softmax(visible) };
        if let Some(keep) = keep {
            ops::scale_inplace(visible, keep);
        }
        row[..first].fill(0.0);
        row[last + 1..].fill(0.0);
    }
    // SAFETY: scores is [n, len] row-major; values rows j < len at stride kv_stride,
    // columns < hd; out is [n, hd] row-major (asserted above).
    unsafe {
        gemm::gemm(
            n,
            hd,
            len,
            out.as_mut_ptr(),
            1,
            hd as isize,
            false,
            scores.as_ptr(),
            1,
            len as isize,
            rows.values.as_ptr(),
            1,
            rows.kv_stride as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// In-place softmax of one row on some ISA path; callable only where that ISA is available.
pub(crate) type SoftmaxFn = unsafe fn(&mut [f32]);

/// The softmax of path `isa` (scalar: [`ops::softmax_inplace`]).
pub(crate) fn softmax_fn(isa: Isa) -> SoftmaxFn {
    debug_assert!(isa.is_available());
    match isa {
        Isa::Scalar => ops::softmax_inplace,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => crate::simd::attn::softmax_avx2,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => crate::simd::attn::softmax_avx512,
        #[cfg(not(target_arch = "x86_64"))]
        _ => ops::softmax_inplace,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A deterministic value in [-0.5, 0.5) (shared by the crate's unit tests).
    pub(crate) fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
    }

    /// Both paths agree with each other row by row, for full and sliding-window attention,
    /// with and without soft-capping, from an empty and from a partly filled cache.
    #[test]
    fn gemm_path_matches_row_path() {
        for (window, softcap, start) in [
            (None, None, 0),
            (Some(5), None, 3),
            (None, Some(20.0), 7),
            (Some(3), Some(5.0), 0),
        ] {
            let shape = AttentionShape {
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 16,
                scale: 0.25,
                softcap,
                window,
            };
            let n = 9;
            let mut seed = 42u64;
            let total = start + n;
            let q: Vec<f32> = (0..n * 64).map(|_| lcg(&mut seed) * 4.0).collect();
            let k: Vec<f32> = (0..total * 32).map(|_| lcg(&mut seed) * 4.0).collect();
            let v: Vec<f32> = (0..total * 32).map(|_| lcg(&mut seed)).collect();
            let mut a = vec![0.0; n * 64];
            let mut b = vec![0.0; n * 64];
            attention_rows(&shape, &q, &k, &v, n, start, &mut a);
            attention_gemm(&shape, &q, &k, &v, n, start, &mut b);
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() < 1e-5,
                    "{window:?} {softcap:?} {start}: {x} vs {y}"
                );
            }
        }
    }

    #[test]
    fn every_softmax_path_matches_the_scalar_one() {
        let mut seed = 5u64;
        for len in [1usize, 7, 16, 37, 300] {
            let x: Vec<f32> = (0..len).map(|_| lcg(&mut seed) * 60.0).collect();
            let mut want = x.clone();
            ops::softmax_inplace(&mut want);
            for isa in crate::available_isas() {
                let mut got = x.clone();
                // SAFETY: every ISA of `available_isas` is available.
                unsafe { softmax_fn(isa)(&mut got) };
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-6, "{isa} len {len}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn one_visible_position_returns_its_value() {
        let shape = AttentionShape {
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 2,
            scale: 1.0,
            softcap: None,
            window: Some(1),
        };
        let q = [1.0, 0.0, 0.0, 1.0];
        let k = [5.0, 5.0, -5.0, 3.0];
        let v = [1.0, 2.0, 3.0, 4.0];
        let mut out = [0.0; 4];
        causal_attention(&shape, &q, &k, &v, 2, 0, &mut out);
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
    }
}
