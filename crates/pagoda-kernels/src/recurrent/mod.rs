//! Kernels of the recurrent (state-space and linear-attention) layers of hybrid models, on ONE
//! sequence's f32 state: the caller owns the per-sequence states, loops over sequences and
//! feeds each kernel that sequence's rows.
//!
//! - `conv1d`: the causal depthwise short convolution in front of every such layer
//!   (Qwen3.5 / Qwen3-Next GatedDeltaNet, Mamba-2, LFM2's ShortConv); state = the last
//!   `K - 1` inputs.
//! - `gated_delta`: the gated delta rule of Qwen3.5 / Qwen3-Next (GatedDeltaNet); state =
//!   one `[d_k, d_v]` matrix per value head.
//! - `ssd`: the Mamba-2 selective scan (state space duality) of Mamba-2, Nemotron-H and
//!   Granite 4 (GraniteMoeHybrid); state = one `[head_dim, state_dim]` matrix per head.
//!
//! Each kernel has a step form (one token, decode) and a prefill form (`T` tokens) whose
//! outputs and final state equal running the step form `T` times, up to f32 rounding. The
//! references are transformers' torch functions (`scripts/reference/golden_recurrent.py`
//! writes their outputs; `tests/recurrent.rs` compares).
//!
//! Layouts (all row-major, f32): per-token inputs and outputs are token-major (`[T, ...]`, a
//! token's row is what the projections produce for it); states are as each kernel documents
//! and only ever read or written by these kernels (a zero-filled state is an empty history).
//!
//! Invariants:
//! - every length is checked against the explicit dimensions before any work; a mismatch is a
//!   [`KernelError::Shape`] naming the argument, never a panic, and leaves `state` untouched;
//! - heads are independent and each head's arithmetic is fixed, so results do not depend on
//!   the rayon thread count (heads may run in parallel);
//! - the hot loops are plain loops over contiguous rows, compiled once per ISA
//!   ([`Isa::Avx512`] / [`Isa::Avx2`] with fused multiply-add, [`Isa::Scalar`] without) and
//!   picked at run time with [`crate::best_isa`]; all paths agree within f32 rounding.

pub mod conv1d;
pub mod gated_delta;
pub mod ssd;

pub use conv1d::{conv1d_causal_prefill, conv1d_causal_step, ConvActivation, ConvWeights};
pub use gated_delta::{
    gated_delta_gates, gated_delta_prefill, gated_delta_prefill_form, gated_delta_step,
    GatedDeltaInputs, GatedDeltaShape, GATED_DELTA_CHUNK,
};
pub use ssd::{
    ssd_dt, ssd_prefill, ssd_prefill_form, ssd_step, SsdInputs, SsdParams, SsdShape, SSD_CHUNK,
};

#[cfg(doc)]
use crate::Isa;
use crate::KernelError;

/// How a prefill runs: both give the steps' results (the scan bit for bit on one ISA, the
/// chunked form within f32 rounding); they differ in speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillForm {
    /// The step's body, token after token, one head (and column tile) at a time so the
    /// state stays in L1 across a block of tokens: the steps' arithmetic without their
    /// per-token trip through the whole state.
    Scan,
    /// The chunked (WY / SSD) form of the torch references: per chunk, products of
    /// `[C, C]` and `[C, d]` matrices (`gemm` crate) instead of per-token passes.
    Chunked,
}

impl PrefillForm {
    /// What `*_prefill` runs: the chunked form, the faster or equal one at every length
    /// measured (`tests/recurrent_bench.rs`). The scan is for callers that need a prefill to
    /// reproduce the steps exactly (a prefill of speculative tokens that must match decoding
    /// them one by one).
    pub const DEFAULT: PrefillForm = PrefillForm::Chunked;
}

/// `Err(Shape)` unless `what` holds exactly `expected` values.
pub(crate) fn check_len(what: &str, actual: usize, expected: usize) -> Result<(), KernelError> {
    if actual == expected {
        Ok(())
    } else {
        Err(KernelError::Shape(format!(
            "{what}: {actual} values, expected {expected}"
        )))
    }
}

/// `Err(Shape)` naming `what` when `cond` fails.
pub(crate) fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), KernelError> {
    if cond {
        Ok(())
    } else {
        Err(KernelError::Shape(what()))
    }
}

/// `a * b` of dimensions, or `Err(Shape)` on overflow.
pub(crate) fn dims(parts: &[usize]) -> Result<usize, KernelError> {
    parts
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| KernelError::Shape(format!("dimensions {parts:?} overflow")))
}

/// PyTorch's `F.softplus` (beta 1, threshold 20): `x` above 20, else `ln(1 + e^x)`.
#[inline]
pub(crate) fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `1 / (1 + e^-x)`.
#[inline]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `e^x` by the Cephes `expf` polynomial (range reduction by `ln 2` in two parts, degree-6
/// polynomial, `2^n` by exponent arithmetic), written with adds, multiplies and integer casts
/// only so loops over it vectorize on every ISA (libm's `expf` is a call per element). Within
/// 2 ulp of libm for `|x| <= 87`; arguments are clamped to `[-87.3, 88.3]`, so the result is
/// finite (about `1e-38` below, `3e38` above); NaN stays NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.3);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `x · sigmoid(x)` over a slice, in place.
#[inline(always)]
pub(crate) fn silu_inplace(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v /= 1.0 + exp(-*v);
    }
}

/// The longest chunk of the chunked prefills.
pub(crate) const CHUNK_MAX: usize = 64;

/// The decays inside one chunk of `l <= CHUNK_MAX` tokens whose per-token log decays are `a(i)`:
/// `decay[i][j] = exp(Σ_{j<s<=i} a_s)` for `j <= i` and 0 above the diagonal (`[l, l]`, row
/// stride `l`), and `cum[i] = Σ_{s<=i} a_s`. Segment sums, as torch's `segment_sum`: each entry
/// is a short sum of its own terms, never a difference of two long cumulative sums.
pub(crate) fn chunk_decays(a: impl Fn(usize) -> f32, l: usize, decay: &mut [f32], cum: &mut [f32]) {
    assert!(l <= CHUNK_MAX && decay.len() >= l * l && cum.len() >= l);
    let mut run = [0.0f32; CHUNK_MAX];
    let mut total = 0.0f32;
    for i in 0..l {
        let ai = a(i);
        total += ai;
        cum[i] = total;
        for r in &mut run[..i] {
            *r += ai;
        }
        run[i] = 0.0;
        let row = &mut decay[i * l..(i + 1) * l];
        for (d, &r) in row[..=i].iter_mut().zip(&run[..=i]) {
            *d = exp(r);
        }
        row[i + 1..].fill(0.0);
    }
}

/// How a compiled instantiation of a hot loop multiplies and adds.
pub(crate) trait MulAdd: Copy {
    /// `a * b + c`.
    fn madd(a: f32, b: f32, c: f32) -> f32;
}

/// Separate multiply and add (the scalar path: baseline x86-64 has no FMA, and `mul_add`
/// there would be a library call).
#[derive(Clone, Copy)]
pub(crate) struct Unfused;
/// One rounding (`vfmadd`), for the paths compiled with FMA.
#[derive(Clone, Copy)]
pub(crate) struct Fused;

impl MulAdd for Unfused {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

impl MulAdd for Fused {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// Defines `pub(crate) fn $name(isa: Isa, args...)` that runs the `#[inline(always)]` generic
/// body `$body::<M: MulAdd>(args...)` compiled for `isa` (AVX-512 or AVX2 with FMA, else the
/// portable unfused build). An `isa` this CPU lacks runs the portable build, so the `unsafe`
/// calls below only ever run on a CPU with the features they were compiled for.
macro_rules! per_isa {
    ($(#[$meta:meta])* fn $name:ident => $body:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name(isa: crate::Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) {
                    $body::<$crate::recurrent::Fused>($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) {
                    $body::<$crate::recurrent::Fused>($($arg),*)
                }
                if isa == crate::Isa::Avx512 && isa.is_available() {
                    // SAFETY: the CPU has every feature `avx512` was compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if isa == crate::Isa::Avx2 && isa.is_available() {
                    // SAFETY: the CPU has AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            let _ = isa;
            $body::<$crate::recurrent::Unfused>($($arg),*)
        }
    };
}
pub(crate) use per_isa;

/// Width of the column tiles the hot loops keep in registers (4 AVX-512 or 8 AVX2 vectors).
pub(crate) const TILE: usize = 64;

/// Solves `(I + A) X = X` in place by forward substitution, `A` strictly lower triangular
/// (`[n, n]`, entries on and above the diagonal ignored), `X` `[n, w]`:
/// `X[i] -= Σ_{j<i} A[i][j] X[j]`.
#[inline(always)]
fn forward_substitute_body<M: MulAdd>(a: &[f32], x: &mut [f32], n: usize, w: usize) {
    debug_assert!(a.len() >= n * n && x.len() >= n * w);
    let mut c0 = 0;
    while c0 < w {
        let tw = TILE.min(w - c0);
        if tw == TILE {
            substitute_tile::<M, TILE>(a, x, n, w, c0);
        } else {
            substitute_tail::<M>(a, x, n, w, c0, tw);
        }
        c0 += tw;
    }
}

#[inline(always)]
fn substitute_tile<M: MulAdd, const W: usize>(
    a: &[f32],
    x: &mut [f32],
    n: usize,
    w: usize,
    c0: usize,
) {
    for i in 1..n {
        let (done, rest) = x.split_at_mut(i * w);
        let row = &mut rest[c0..c0 + W];
        let mut acc = [0.0f32; W];
        acc.copy_from_slice(row);
        for (j, &aij) in a[i * n..i * n + i].iter().enumerate() {
            let xj = &done[j * w + c0..j * w + c0 + W];
            for l in 0..W {
                acc[l] = M::madd(-aij, xj[l], acc[l]);
            }
        }
        row.copy_from_slice(&acc);
    }
}

#[inline(always)]
fn substitute_tail<M: MulAdd>(a: &[f32], x: &mut [f32], n: usize, w: usize, c0: usize, tw: usize) {
    for i in 1..n {
        let (done, rest) = x.split_at_mut(i * w);
        let row = &mut rest[c0..c0 + tw];
        for (j, &aij) in a[i * n..i * n + i].iter().enumerate() {
            let xj = &done[j * w + c0..j * w + c0 + tw];
            for (r, &v) in row.iter_mut().zip(xj) {
                *r = M::madd(-aij, v, *r);
            }
        }
    }
}

per_isa! {
    /// Forward substitution of a chunk's unit lower-triangular system (see
    /// `forward_substitute_body`).
    fn forward_substitute => forward_substitute_body(a: &[f32], x: &mut [f32], n: usize, w: usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_substitution_solves_the_unit_lower_system_on_every_isa() {
        let (n, w) = (7, 70);
        let a: Vec<f32> = (0..n * n).map(|i| (i as f32 * 0.7).sin() * 0.3).collect();
        let rhs: Vec<f32> = (0..n * w).map(|i| (i as f32 * 0.13).cos()).collect();
        for isa in crate::available_isas() {
            let mut x = rhs.clone();
            forward_substitute(isa, &a, &mut x, n, w);
            // (I + strict_lower(A)) x == rhs
            for i in 0..n {
                for c in 0..w {
                    let mut v = x[i * w + c];
                    for j in 0..i {
                        v += a[i * n + j] * x[j * w + c];
                    }
                    assert!((v - rhs[i * w + c]).abs() < 1e-5, "{isa} ({i}, {c})");
                }
            }
        }
    }

    #[test]
    fn polynomial_exp_is_within_2_ulp_of_libm() {
        let mut worst = 0.0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x), x.exp());
            worst = worst.max((got - want).abs() / want);
            x += 0.001_7;
        }
        assert!(worst < 2.5e-7, "relative error {worst}");
        assert!(exp(-1000.0) < 1e-37 && exp(-1000.0) >= 0.0);
        assert!(exp(1000.0).is_finite());
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
    }

    #[test]
    fn softplus_follows_torch_threshold() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert!(softplus(-100.0) >= 0.0);
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
    }
}
