//! AVX-512 row kernels: the AVX2 bodies rebuilt on VNNI (`vpdpbusd`), plus 512-bit float
//! kernels.
//!
//! Invariant: every function here is `#[target_feature]` with the AVX-512 set it uses and is
//! reached only through [`kernel`], which the dispatcher calls only after `Isa::Avx512` was
//! found available; kernels needing VNNI are returned only when the CPU has it.

use std::arch::x86_64::*;

use super::avx2::{self, entry_points, IntDot};
use super::avx2::{q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0};
use super::{RowKernel, NT};
use crate::cpu::features;
use crate::GgmlType;

/// `vpdpbusd` on ymm (AVX-512 VNNI + VL): u8 x s8 groups of 4 summed into i32, no i16
/// saturation.
pub(crate) struct Vnni;

impl IntDot for Vnni {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }
}

entry_points!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", Vnni;
    dot_q4_0 => q4_0, dot_q4_1 => q4_1, dot_q5_0 => q5_0, dot_q5_1 => q5_1, dot_q8_0 => q8_0,
    dot_q4_k => q4_k, dot_q5_k => q5_k, dot_q6_k => q6_k,
);

#[inline(always)]
unsafe fn hsum512(v: __m512) -> f32 {
    _mm512_reduce_add_ps(v)
}

/// F32 / F16 / BF16 weights · f32 activations, 32 values per step.
#[inline(always)]
unsafe fn float_dot<const N: usize, const EB: usize>(
    w: &[u8],
    x: &[f32],
    st: usize,
    out: &mut [f32; NT],
    load16: impl Fn(*const u8) -> __m512,
) {
    let cols = w.len() / EB;
    debug_assert!(x.len() >= (N - 1) * st + cols);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); 2]; N];
    let full = cols / 32 * 32;
    let mut i = 0;
    while i < full {
        let w0 = load16(wp.add(i * EB));
        let w1 = load16(wp.add((i + 16) * EB));
        for t in 0..N {
            let xt = xp.add(t * st + i);
            acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt.add(16)), acc[t][1]);
        }
        i += 32;
    }
    // Remainder (< 32 values): masked loads keep every access in bounds.
    let mut rest = [_mm512_setzero_ps(); N];
    while i < cols {
        let k = (cols - i).min(16);
        let m: __mmask16 = ((1u32 << k) - 1) as __mmask16;
        let wv = match EB {
            4 => _mm512_maskz_loadu_ps(m, wp.add(i * EB) as *const f32),
            _ => {
                let h = _mm256_maskz_loadu_epi16(m, wp.add(i * EB) as *const i16);
                let mut buf = [0u8; 32];
                _mm256_storeu_si256(buf.as_mut_ptr() as *mut __m256i, h);
                load16(buf.as_ptr())
            }
        };
        for t in 0..N {
            let xv = _mm512_maskz_loadu_ps(m, xp.add(t * st + i));
            rest[t] = _mm512_fmadd_ps(wv, xv, rest[t]);
        }
        i += k;
    }
    for t in 0..N {
        out[t] = hsum512(_mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]), rest[t]));
    }
}

#[inline(always)]
unsafe fn load16_f32(p: *const u8) -> __m512 {
    _mm512_loadu_ps(p as *const f32)
}

#[inline(always)]
unsafe fn load16_f16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

#[inline(always)]
unsafe fn load16_bf16(p: *const u8) -> __m512 {
    let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
    _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))
}

macro_rules! float_entry {
    ($name:ident, $eb:literal, $load:ident) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
        unsafe fn $name(w: &[u8], x: &[f32], st: usize, nt: usize, out: &mut [f32; NT]) {
            let l = |p| $load(p);
            match nt {
                1 => float_dot::<1, $eb>(w, x, st, out, l),
                2 => float_dot::<2, $eb>(w, x, st, out, l),
                3 => float_dot::<3, $eb>(w, x, st, out, l),
                _ => float_dot::<4, $eb>(w, x, st, out, l),
            }
        }
    };
}
float_entry!(dot_f32, 4, load16_f32);
float_entry!(dot_f16, 2, load16_f16);
float_entry!(dot_bf16, 2, load16_bf16);

/// The AVX-512 kernel of `ty`, when there is one (else the AVX2 one is used).
pub(crate) fn kernel(ty: GgmlType) -> Option<RowKernel> {
    let float = |dot| Some(RowKernel::Float { dot });
    match ty {
        GgmlType::F32 => return float(dot_f32),
        GgmlType::F16 => return float(dot_f16),
        GgmlType::BF16 => return float(dot_bf16),
        _ => {}
    }
    if !features().avx512_vnni {
        return None;
    }
    let with = |dot| match avx2::kernel(ty) {
        Some(RowKernel::Quant {
            partner, quantize, ..
        }) => Some(RowKernel::Quant {
            partner,
            quantize,
            dot,
        }),
        _ => None,
    };
    match ty {
        GgmlType::Q4_0 => with(dot_q4_0),
        GgmlType::Q4_1 => with(dot_q4_1),
        GgmlType::Q5_0 => with(dot_q5_0),
        GgmlType::Q5_1 => with(dot_q5_1),
        GgmlType::Q8_0 => with(dot_q8_0),
        GgmlType::Q4_K => with(dot_q4_k),
        GgmlType::Q5_K => with(dot_q5_k),
        GgmlType::Q6_K => with(dot_q6_k),
        _ => None,
    }
}
