//! AVX-512 VNNI row kernels of the Pagoda-internal weight formats (INT8 per-channel, INT4
//! with groups of 64 and 128, NF4, NF4_DQ; INT4 with groups of 32 shares Q4_0/Q4_1's
//! kernels) and of the codebook format MXFP4, against activations in the
//! [`ActLayout::Split32`](super::ActLayout) layout: 64 weights per `vpdpbusd` step, signed
//! weights through `|w|` and the sign moved onto the activations, NF4 and MXFP4 codes looked
//! up in their int8 codebooks with `vpshufb`.
//!
//! Invariant: every function here is `#[target_feature]` with the AVX-512 set it uses (VNNI
//! included) or `#[inline(always)]` and called only from such functions, and is reached
//! only through `avx512::kernel`, which returns these kernels only when the CPU has VNNI.
//! `w` is one whole weight row (so its length fixes the column count) and each of the `nt`
//! activation rows at `a[t * st..]` holds the split layout of the same columns.

use std::arch::x86_64::*;

use super::avx2::{self, hsum_epi32};
use super::NT;
use crate::quant::{int4, mxfp4, nf4};

/// 16 + 16 nibble bytes (32 weights each: low nibbles then high) to 64 codes in order.
#[inline(always)]
unsafe fn nibbles64(p: *const u8) -> __m512i {
    nibbles64_of(_mm256_loadu_si256(p as *const __m256i))
}

/// As [`nibbles64`], from the 32 bytes in a register.
#[inline(always)]
unsafe fn nibbles64_of(v: __m256i) -> __m512i {
    let m4 = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(v, m4);
    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    _mm512_shuffle_i64x2(z, z, 0b11_01_10_00)
}

/// Signed weights `wv` · activations `av`: `vpdpbusd(|w|, sign(w) * a)`.
#[inline(always)]
unsafe fn dot_signed(u: __m512i, neg: __mmask64, av: __m512i) -> __m512i {
    let z = _mm512_setzero_si512();
    _mm512_dpbusd_epi32(z, u, _mm512_mask_sub_epi8(av, neg, z, av))
}

/// INT8 per-channel · split activations: per pair of 32-blocks one `vpdpbusd`, the
/// activation scales as 16 lanes, the row scale once at the end.
#[inline(always)]
unsafe fn int8z<const N: usize>(w: &[u8], a: &[u8], st: usize, out: &mut [f32; NT]) {
    let cols = w.len() - 4;
    let nb = cols / 32;
    debug_assert!(a.len() >= (N - 1) * st + cols + 36 * nb);
    let (wp, ap) = (w.as_ptr().add(4), a.as_ptr());
    let mut acc = [_mm512_setzero_ps(); N];
    let mut tail = [0.0f32; N];
    let mut b = 0;
    while b + 2 <= nb {
        let codes = _mm512_loadu_si512(wp.add(32 * b) as *const _);
        let (u, neg) = (_mm512_abs_epi8(codes), _mm512_movepi8_mask(codes));
        for t in 0..N {
            let at = ap.add(t * st);
            let p = dot_signed(u, neg, _mm512_loadu_si512(at.add(32 * b) as *const _));
            let da = _mm512_loadu_ps(at.add(cols + 32 * b) as *const f32);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), da, acc[t]);
        }
        b += 2;
    }
    if b < nb {
        let codes = _mm256_loadu_si256(wp.add(32 * b) as *const __m256i);
        let u = _mm256_abs_epi8(codes);
        for t in 0..N {
            let at = ap.add(t * st);
            let av = _mm256_sign_epi8(_mm256_loadu_si256(at.add(32 * b) as *const __m256i), codes);
            let p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, av);
            tail[t] = hsum_epi32(p) as f32 * avx2::f32_at(at.add(cols + 32 * b));
        }
    }
    let s = avx2::f32_at(w.as_ptr());
    for t in 0..N {
        out[t] = (_mm512_reduce_add_ps(acc[t]) + tail[t]) * s;
    }
}

/// INT4 with groups of `G` (64 or 128) · split activations. Symmetric codes subtract
/// `8 * sum a` with a second `vpdpbusd`; asymmetric groups add `m * sum_k s_k`.
#[inline(always)]
unsafe fn int4z<const G: usize, const SYM: bool, const N: usize>(
    w: &[u8],
    a: &[u8],
    st: usize,
    out: &mut [f32; NT],
) {
    let gb = int4::group_bytes(G, SYM);
    let head = if SYM { 2 } else { 4 };
    let ng = w.len() / gb;
    let cols = ng * G;
    let nb = cols / 32;
    let (doff, soff) = (cols, cols + 32 * nb);
    debug_assert!(a.len() >= (N - 1) * st + cols + 36 * nb);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let zero = _mm512_setzero_si512();
    let eight = _mm512_set1_epi8(8);
    let mut acc = [_mm512_setzero_ps(); N];
    let mut accm = [0.0f32; N];
    for g in 0..ng {
        let wb = wp.add(g * gb);
        let dw = _mm512_set1_ps(avx2::f16_at(wb));
        let mw = if SYM { 0.0 } else { avx2::f16_at(wb.add(2)) };
        let mut q = [zero; 2];
        for c in 0..G / 64 {
            q[c] = nibbles64(wb.add(head + 32 * c));
        }
        for t in 0..N {
            let at = ap.add(t * st + g * G);
            let mut f = _mm512_setzero_ps();
            for c in 0..G / 64 {
                let av = _mm512_loadu_si512(at.add(64 * c) as *const _);
                let mut p = _mm512_dpbusd_epi32(zero, q[c], av);
                if SYM {
                    p = _mm512_sub_epi32(p, _mm512_dpbusd_epi32(zero, eight, av));
                }
                let da = ap.add(t * st + doff + 32 * (g * G / 32 + 2 * c));
                f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_loadu_ps(da as *const f32), f);
            }
            acc[t] = _mm512_fmadd_ps(f, dw, acc[t]);
            if !SYM {
                let s = ap.add(t * st + soff + 4 * (g * G / 32));
                let mut ss = 0.0f32;
                for k in 0..G / 32 {
                    ss += avx2::f32_at(s.add(4 * k));
                }
                accm[t] += mw * ss;
            }
        }
    }
    for t in 0..N {
        out[t] = _mm512_reduce_add_ps(acc[t]) + accm[t];
    }
}

/// NF4 (`DQ = false`) or NF4_DQ · split activations: the 64 codes of a block become int8
/// codebook values with one `vpshufb`, then as INT8 with the block's `absmax / 127`.
#[inline(always)]
unsafe fn nf4z<const DQ: bool, const N: usize>(w: &[u8], a: &[u8], st: usize, out: &mut [f32; NT]) {
    let nb = if DQ {
        nf4::dq_blocks(w.len()).unwrap_or(0)
    } else {
        w.len() / nf4::BLOCK_BYTES
    };
    let cols = nb * 64;
    let (c_off, k_off, q_off) = nf4::dq_offsets(nb);
    debug_assert!(a.len() >= (N - 1) * st + cols + 36 * (cols / 32));
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let cb = _mm512_broadcast_i32x4(_mm_loadu_si128(nf4::NF4_I8.as_ptr() as *const __m128i));
    let mut acc = [_mm512_setzero_ps(); N];
    let mean = if DQ { avx2::f32_at(wp) } else { 0.0 };
    for b in 0..nb {
        let (codes, amax) = if DQ {
            // `nf4::dq_absmax` without the bounds checks: offsets come from `dq_offsets`.
            let c = avx2::f32_at(wp.add(c_off + 4 * (b / crate::NF4_DQ_GROUP)));
            let k = *wp.add(k_off + b) as i8;
            (wp.add(q_off + 32 * b), k as f32 * c + mean)
        } else {
            let wb = wp.add(b * nf4::BLOCK_BYTES);
            (wb.add(4), avx2::f32_at(wb))
        };
        let wv = _mm512_shuffle_epi8(cb, nibbles64(codes));
        let (u, neg) = (_mm512_abs_epi8(wv), _mm512_movepi8_mask(wv));
        let dw = _mm512_set1_ps(amax * (1.0 / 127.0));
        for t in 0..N {
            let at = ap.add(t * st);
            let p = dot_signed(u, neg, _mm512_loadu_si512(at.add(64 * b) as *const _));
            let da = _mm512_loadu_ps(at.add(cols + 64 * b) as *const f32);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(da, dw), acc[t]);
        }
    }
    for t in 0..N {
        out[t] = _mm512_reduce_add_ps(acc[t]);
    }
}

/// MXFP4 · split activations: two 17-byte blocks per step, their 64 codes looked up in the
/// doubled E2M1 codebook (exact int8) with one `vpshufb`, each block's `2^(e - 128)` on its
/// eight lanes of the activation scales; an odd last block takes the 256-bit path.
#[inline(always)]
unsafe fn mxfp4z<const N: usize>(w: &[u8], a: &[u8], st: usize, out: &mut [f32; NT]) {
    const BB: usize = 17;
    let nb = w.len() / BB;
    let cols = nb * 32;
    debug_assert!(a.len() >= (N - 1) * st + cols + 36 * nb);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let cb128 = _mm_loadu_si128(mxfp4::KVALUES.as_ptr() as *const __m128i);
    let cb = _mm512_broadcast_i32x4(cb128);
    let mut acc = [_mm512_setzero_ps(); N];
    let mut tail = [0.0f32; N];
    let mut b = 0;
    while b + 2 <= nb {
        let wb = wp.add(BB * b);
        let q0 = _mm_loadu_si128(wb.add(1) as *const __m128i);
        let q1 = _mm_loadu_si128(wb.add(BB + 1) as *const __m128i);
        let codes = nibbles64_of(_mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1));
        let wv = _mm512_shuffle_epi8(cb, codes);
        let (u, neg) = (_mm512_abs_epi8(wv), _mm512_movepi8_mask(wv));
        let dw = _mm512_mask_blend_ps(
            0xFF00,
            _mm512_set1_ps(mxfp4::e8m0_half(*wb)),
            _mm512_set1_ps(mxfp4::e8m0_half(*wb.add(BB))),
        );
        for t in 0..N {
            let at = ap.add(t * st);
            let p = dot_signed(u, neg, _mm512_loadu_si512(at.add(32 * b) as *const _));
            let da = _mm512_loadu_ps(at.add(cols + 32 * b) as *const f32);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(da, dw), acc[t]);
        }
        b += 2;
    }
    if b < nb {
        let wb = wp.add(BB * b);
        let q = _mm_loadu_si128(wb.add(1) as *const __m128i);
        let m4 = _mm_set1_epi8(0x0F);
        let (lo, hi) = (
            _mm_and_si128(q, m4),
            _mm_and_si128(_mm_srli_epi16(q, 4), m4),
        );
        let wv = _mm256_set_m128i(_mm_shuffle_epi8(cb128, hi), _mm_shuffle_epi8(cb128, lo));
        let u = _mm256_abs_epi8(wv);
        let dw = mxfp4::e8m0_half(*wb);
        for t in 0..N {
            let at = ap.add(t * st);
            let av = _mm256_sign_epi8(_mm256_loadu_si256(at.add(32 * b) as *const __m256i), wv);
            let p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, av);
            tail[t] = hsum_epi32(p) as f32 * avx2::f32_at(at.add(cols + 32 * b)) * dw;
        }
    }
    for t in 0..N {
        out[t] = _mm512_reduce_add_ps(acc[t]) + tail[t];
    }
}

macro_rules! entry {
    ($($name:ident => $body:ident [$($g:tt),*]),* $(,)?) => {
        $(
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            pub(crate) unsafe fn $name(
                w: &[u8],
                a: &[u8],
                st: usize,
                nt: usize,
                out: &mut [f32; NT],
            ) {
                match nt {
                    1 => $body::<$($g,)* 1>(w, a, st, out),
                    2 => $body::<$($g,)* 2>(w, a, st, out),
                    3 => $body::<$($g,)* 3>(w, a, st, out),
                    4 => $body::<$($g,)* 4>(w, a, st, out),
                    5 => $body::<$($g,)* 5>(w, a, st, out),
                    6 => $body::<$($g,)* 6>(w, a, st, out),
                    7 => $body::<$($g,)* 7>(w, a, st, out),
                    _ => $body::<$($g,)* 8>(w, a, st, out),
                }
            }
        )*
    };
}
entry!(
    dot_int8 => int8z[],
    dot_int4_g64 => int4z[64, false],
    dot_int4_g64_sym => int4z[64, true],
    dot_int4_g128 => int4z[128, false],
    dot_int4_g128_sym => int4z[128, true],
    dot_nf4 => nf4z[false],
    dot_nf4_dq => nf4z[true],
    dot_mxfp4 => mxfp4z[],
);
