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
    gated_delta_gates, gated_delta_prefill, gated_delta_step, GatedDeltaInputs, GatedDeltaShape,
    GATED_DELTA_CHUNK,
};
pub use ssd::{ssd_dt, ssd_prefill, ssd_step, SsdInputs, SsdParams, SsdShape, SSD_CHUNK};

#[cfg(doc)]
use crate::Isa;
use crate::KernelError;

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
    fn softplus_follows_torch_threshold() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert!(softplus(-100.0) >= 0.0);
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
    }
}
