//! AVX2 (+FMA, F16C) row kernels, written once over an [`IntDot`] primitive so the AVX-512
//! path can reuse a body with VNNI (`vpdpbusd` on ymm) instead of `vpmaddubsw`/`vpmaddwd`
//! where it has no 512-bit kernel of its own (Q5_K today). Also the AVX2 activation
//! quantizers (bit-identical to the scalar ones) and small helpers `avx512.rs` shares.
//!
//! The Pagoda-internal formats (INT8, INT4 g64/g128, NF4, NF4_DQ) have bodies here too, against
//! Q8_0 / Q8_1 blocks (INT4 g32 is Q4_1 / Q4_0 and shares theirs); NF4 looks its codes up
//! in the int8 codebook with `vpshufb`.
//!
//! Every body computes one weight row against `N` (1..=4) activation rows, unpacking each
//! weight block once. Sub-block scales are applied in integers where ggml does, per-block
//! scales in f32; only the float summation order differs from the scalar reference.
//!
//! Invariant: every function here either is `#[target_feature(enable = "avx2,fma,f16c")]`
//! (or stronger) or is `#[inline(always)]` and called only from such functions, and is
//! reached only through [`kernel`] / `avx512::kernel`, which the dispatcher calls after the
//! ISA was found available. Loads are unaligned (`loadu`, `read_unaligned`).

use std::arch::x86_64::*;

use super::{ActLayout, RowKernel, NT};
use crate::quant::{Block, BlockQ8K, BlockQ8_0, BlockQ8_1};
use crate::GgmlType;

/// The int8 dot-product primitive a body is built on.
pub(crate) trait IntDot {
    /// `acc + sum over each group of 4 bytes of u[i] * s[i]` (u unsigned, s signed; sums of
    /// pairs must fit i16 for the maddubs form), 8 i32 lanes.
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

/// `vpmaddubsw` + `vpmaddwd`.
pub(crate) struct Maddubs;

impl IntDot for Maddubs {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(
            acc,
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)),
        )
    }
}

#[inline(always)]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = std::ptr::read_unaligned(p as *const u16);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline(always)]
pub(crate) unsafe fn f32_at(p: *const u8) -> f32 {
    f32::from_bits(std::ptr::read_unaligned(p as *const u32))
}

#[inline(always)]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline(always)]
pub(crate) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// 16 bytes of nibbles to 32 bytes: low nibbles in 0..16, high nibbles in 16..32.
#[inline(always)]
pub(crate) unsafe fn nibbles32(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

/// Bit `i` of the u32 at `p` to byte `i` as 0x10 (set) or 0 (ggml's `bytes_from_bits_32`).
#[inline(always)]
unsafe fn bits32_to_0x10(p: *const u8) -> __m256i {
    let x = std::ptr::read_unaligned(p as *const u32) as i32;
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0x0000000000000000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    let set = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

#[inline(always)]
pub(crate) unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn finish<const N: usize>(acc: [__m256; N], extra: [f32; N], out: &mut [f32; NT]) {
    for t in 0..N {
        out[t] = hsum(acc[t]) + extra[t];
    }
}

// ---------------------------------------------------------------- 32-element block formats

/// Q4_0 · Q8_0: `sum (q - 8) a = sum q a - 8 sum a`.
#[inline(always)]
pub(crate) unsafe fn q4_0<D: IntDot, const N: usize>(
    w: &[u8],
    a: &[u8],
    st: usize,
    out: &mut [f32; NT],
) {
    const WB: usize = 18;
    const AB: usize = BlockQ8_0::BYTES;
    let nb = w.len() / WB;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let eight = _mm256_set1_epi8(8);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let wb = wp.add(b * WB);
        let q = nibbles32(wb.add(2));
        let dw = f16_at(wb);
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let av = load(ab.add(2));
            let z = _mm256_setzero_si256();
            let p = _mm256_sub_epi32(D::dot(z, q, av), D::dot(z, eight, av));
            let d = _mm256_set1_ps(dw * f16_at(ab));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    finish(acc, [0.0; N], out);
}

/// Q4_1 · Q8_1: `d_w d_a sum q a + m_w s_a`.
#[inline(always)]
pub(crate) unsafe fn q4_1<D: IntDot, const N: usize>(
    w: &[u8],
    a: &[u8],
    st: usize,
    out: &mut [f32; NT],
) {
    const WB: usize = 20;
    const AB: usize = BlockQ8_1::BYTES;
    let nb = w.len() / WB;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); N];
    let mut mins = [0.0f32; N];
    for b in 0..nb {
        let wb = wp.add(b * WB);
        let q = nibbles32(wb.add(4));
        let (dw, mw) = (f16_at(wb), f16_at(wb.add(2)));
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let p = D::dot(_mm256_setzero_si256(), q, load(ab.add(4)));
            let d = _mm256_set1_ps(dw * f16_at(ab));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
            mins[t] += mw * f16_at(ab.add(2));
        }
    }
    finish(acc, mins, out);
}

/// Q5_0 · Q8_0: `sum (q - 16) a`.
#[inline(always)]
pub(crate) unsafe fn q5_0<D: IntDot, const N: usize>(
    w: &[u8],
    a: &[u8],
    st: usize,
    out: &mut [f32; NT],
) {
    const WB: usize = 22;
    const AB: usize = BlockQ8_0::BYTES;
    let nb = w.len() / WB;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let sixteen = _mm256_set1_epi8(16);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let wb = wp.add(b * WB);
        let q = _mm256_or_si256(nibbles32(wb.add(6)), bits32_to_0x10(wb.add(2)));
        let dw = f16_at(wb);
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let av = load(ab.add(2));
            let z = _mm256_setzero_si256();
            let p = _mm256_sub_epi32(D::dot(z, q, av), D::dot(z, sixteen, av));
            let d = _mm256_set1_ps(dw * f16_at(ab));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    finish(acc, [0.0; N], out);
}

/// Q5_1 · Q8_1.
#[inline(always)]
pub(crate) unsafe fn q5_1<D: IntDot, const N: usize>(
    w: &[u8],
    a: &[u8],
    st: usize,
    out: &mut [f32; NT],
) {
    const WB: usize = 24;
    const AB: usize = BlockQ8_1::BYTES;
    let nb = w.len() / WB;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); N];
    let mut mins = [0.0f32; N];
    for b in 0..nb {
        let wb = wp.add(b * WB);
        let q = _mm256_or_si256(nibbles32(wb.add(8)), bits32_to_0x10(wb.add(4)));
        let (dw, mw) = (f16_at(wb), f16_at(wb.add(2)));
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let p = D::dot(_mm256_setzero_si256(), q, load(ab.add(4)));
            let d = _mm256_set1_ps(dw * f16_at(ab));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
            mins[t] += mw * f16_at(ab.add(2));
        }
    }
    finish(acc, mins, out);
}

/// Q8_0 · Q8_0: signs moved onto the activations so the weights are unsigned.
#[inline(always)]
pub(crate) unsafe fn q8_0<D: IntDot, const N: usize>(
    w: &[u8],
    a: &[u8],
    st: usize,
    out: &mut [f32; NT],
) {
    const WB: usize = 34;
    const AB: usize = BlockQ8_0::BYTES;
    let nb = w.len() / WB;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let wb = wp.add(b * WB);
        let wv = load(wb.add(2));
        let u = _mm256_abs_epi8(wv);
        let dw = f16_at(wb);
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let s = _mm256_sign_epi8(load(ab.add(2)), wv);
            let p = D::dot(_mm256_setzero_si256(), u, s);
            let d = _mm256_set1_ps(dw * f16_at(ab));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    finish(acc, [0.0; N], out);
}

// ------------------------------------------------------------------------------ k-quants

/// The 8 scales and 8 mins of a Q4_K/Q5_K block as bytes 0..8 and 8..16 (ggml's kmask trick).
#[inline(always)]
pub(crate) unsafe fn k_scales_mins(p: *const u8) -> [u32; 4] {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    let mut u = [0u32; 4];
    std::ptr::copy_nonoverlapping(p, u.as_mut_ptr() as *mut u8, 12);
    u[3] = ((u[2] >> 4) & KMASK2) | (((u[1] >> 6) & KMASK3) << 4);
    let uaux = u[1] & KMASK1;
    u[1] = (u[2] & KMASK2) | (((u[0] >> 6) & KMASK3) << 4);
    u[2] = uaux;
    u[0] &= KMASK1;
    u
}

/// `sum_s m[s] * (bsum[2s] + bsum[2s+1])` with the 8 mins as bytes 8..16 of `sm`.
#[inline(always)]
unsafe fn k_min_term(sm: &[u32; 4], a: *const u8) -> i32 {
    let mins = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, sm[3] as i32, sm[2] as i32));
    let bs = _mm256_loadu_si256(a.add(260) as *const __m256i);
    let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    let prod = _mm_madd_epi16(mins, pairs);
    let s = _mm_add_epi32(prod, _mm_shuffle_epi32(prod, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Q4_K · Q8_K.
#[inline(always)]
pub(crate) unsafe fn q4_k<D: IntDot, const N: usize>(
    w: &[u8],
    a: &[u8],
    st: usize,
    out: &mut [f32; NT],
) {
    const WB: usize = 144;
    const AB: usize = BlockQ8K::BYTES;
    let nb = w.len() / WB;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut accm = [0.0f32; N];
    for b in 0..nb {
        let wb = wp.add(b * WB);
        let (d, dmin) = (f16_at(wb), f16_at(wb.add(2)));
        let sm = k_scales_mins(wb.add(4));
        let sc = std::slice::from_raw_parts(sm.as_ptr() as *const u8, 8);
        let mut q = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let bits = load(wb.add(16 + 32 * c));
            q[2 * c] = _mm256_and_si256(bits, m4);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        }
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let mut sumi = _mm256_setzero_si256();
            for s in 0..8 {
                let p = D::dot(_mm256_setzero_si256(), q[s], load(ab.add(4 + 32 * s)));
                sumi =
                    _mm256_add_epi32(sumi, _mm256_mullo_epi32(p, _mm256_set1_epi32(sc[s] as i32)));
            }
            let da = f32_at(ab);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(sumi), acc[t]);
            accm[t] -= dmin * da * k_min_term(&sm, ab) as f32;
        }
    }
    finish(acc, accm, out);
}

/// Q5_K · Q8_K.
#[inline(always)]
pub(crate) unsafe fn q5_k<D: IntDot, const N: usize>(
    w: &[u8],
    a: &[u8],
    st: usize,
    out: &mut [f32; NT],
) {
    const WB: usize = 176;
    const AB: usize = BlockQ8K::BYTES;
    let nb = w.len() / WB;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let bit = _mm256_set1_epi8(0x10);
    let mut acc = [_mm256_setzero_ps(); N];
    let mut accm = [0.0f32; N];
    for b in 0..nb {
        let wb = wp.add(b * WB);
        let (d, dmin) = (f16_at(wb), f16_at(wb.add(2)));
        let sm = k_scales_mins(wb.add(4));
        let sc = std::slice::from_raw_parts(sm.as_ptr() as *const u8, 8);
        let mut hb = load(wb.add(16));
        let mut q = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let bits = load(wb.add(48 + 32 * c));
            let h0 = _mm256_and_si256(_mm256_slli_epi16(hb, 4), bit);
            let h1 = _mm256_and_si256(_mm256_slli_epi16(hb, 3), bit);
            q[2 * c] = _mm256_or_si256(_mm256_and_si256(bits, m4), h0);
            q[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h1);
            hb = _mm256_srli_epi16(hb, 2);
        }
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let mut sumi = _mm256_setzero_si256();
            for s in 0..8 {
                let p = D::dot(_mm256_setzero_si256(), q[s], load(ab.add(4 + 32 * s)));
                sumi =
                    _mm256_add_epi32(sumi, _mm256_mullo_epi32(p, _mm256_set1_epi32(sc[s] as i32)));
            }
            let da = f32_at(ab);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(sumi), acc[t]);
            accm[t] -= dmin * da * k_min_term(&sm, ab) as f32;
        }
    }
    finish(acc, accm, out);
}

/// Q6_K · Q8_K: unsigned codes 0..64 times activations, minus `32 * sum_g sc[g] bsum[g]`.
#[inline(always)]
pub(crate) unsafe fn q6_k<D: IntDot, const N: usize>(
    w: &[u8],
    a: &[u8],
    st: usize,
    out: &mut [f32; NT],
) {
    const WB: usize = 210;
    const AB: usize = BlockQ8K::BYTES;
    let nb = w.len() / WB;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(0x03);
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let wb = wp.add(b * WB);
        let d = f16_at(wb.add(208));
        let sc128 = _mm_loadu_si128(wb.add(192) as *const __m128i);
        let sc16 = _mm256_cvtepi8_epi16(sc128);
        // Per 32-code vector k (elements 32k..32k+32, groups 2k and 2k+1): [sc[2k] x8, sc[2k+1] x8] as i16.
        let mut scv = [_mm256_setzero_si256(); 8];
        for k in 0..8 {
            let lo = _mm_set1_epi16(*wb.add(192 + 2 * k) as i8 as i16);
            let hi = _mm_set1_epi16(*wb.add(193 + 2 * k) as i8 as i16);
            scv[k] = _mm256_set_m128i(hi, lo);
        }
        let mut q = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let l1 = load(wb.add(64 * h));
            let l2 = load(wb.add(64 * h + 32));
            let hh = load(wb.add(128 + 32 * h));
            let h0 = _mm256_slli_epi16(_mm256_and_si256(hh, m3), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 2), m3), 4);
            let h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 4), m3), 4);
            let h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 6), m3), 4);
            q[4 * h] = _mm256_or_si256(_mm256_and_si256(l1, m4), h0);
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l2, m4), h1);
            q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h2);
            q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m4), h3);
        }
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let mut sumi = _mm256_setzero_si256();
            for k in 0..8 {
                let p16 = _mm256_maddubs_epi16(q[k], load(ab.add(4 + 32 * k)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, scv[k]));
            }
            // 32 * sum_g sc[g] * bsum[g]
            let bs = _mm256_loadu_si256(ab.add(260) as *const __m256i);
            let off = _mm256_madd_epi16(bs, sc16);
            let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
            let da = f32_at(ab);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    finish(acc, [0.0; N], out);
}

// ------------------------------------------------------------------------------- floats

/// F32 / F16 / BF16 weights · f32 activations; `LOAD` turns 8 weights at a byte pointer into f32.
#[inline(always)]
unsafe fn float_dot<const N: usize, const EB: usize>(
    w: &[u8],
    x: &[f32],
    st: usize,
    out: &mut [f32; NT],
    load8: impl Fn(*const u8) -> __m256,
) {
    let cols = w.len() / EB;
    debug_assert!(x.len() >= (N - 1) * st + cols);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    let full = cols / 16 * 16;
    let mut i = 0;
    while i < full {
        let w0 = load8(wp.add(i * EB));
        let w1 = load8(wp.add((i + 8) * EB));
        for t in 0..N {
            let xt = xp.add(t * st + i);
            acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt.add(8)), acc[t][1]);
        }
        i += 16;
    }
    let mut tail = [0.0f32; N];
    if full < cols {
        let mut wt = [0.0f32; 16];
        let wrest = std::slice::from_raw_parts(wp.add(full * EB), (cols - full) * EB);
        match EB {
            4 => crate::quant::float::f32_from_le(wrest, &mut wt),
            _ => {
                // 2-byte types: decode through a padded copy so the vector load stays in bounds.
                let mut buf = [0u8; 32];
                buf[..wrest.len()].copy_from_slice(wrest);
                let v0 = load8(buf.as_ptr());
                let v1 = load8(buf.as_ptr().add(16));
                _mm256_storeu_ps(wt.as_mut_ptr(), v0);
                _mm256_storeu_ps(wt.as_mut_ptr().add(8), v1);
            }
        }
        for t in 0..N {
            for j in 0..cols - full {
                tail[t] += wt[j] * *xp.add(t * st + full + j);
            }
        }
    }
    for t in 0..N {
        out[t] = hsum(_mm256_add_ps(acc[t][0], acc[t][1])) + tail[t];
    }
}

#[inline(always)]
unsafe fn load8_f32(p: *const u8) -> __m256 {
    _mm256_loadu_ps(p as *const f32)
}

#[inline(always)]
unsafe fn load8_f16(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[inline(always)]
unsafe fn load8_bf16(p: *const u8) -> __m256 {
    let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
}

// --------------------------------------------------------------------------- quantizers

/// C `roundf` (half away from zero) on 8 lanes, exactly: truncate, then step away from zero
/// where the dropped fraction is at least one half.
#[inline(always)]
pub(crate) unsafe fn roundf8(v: __m256) -> __m256 {
    let t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    let frac = _mm256_sub_ps(v, t);
    let sign_mask = _mm256_set1_ps(-0.0);
    let abs_frac = _mm256_andnot_ps(sign_mask, frac);
    let step = _mm256_and_ps(
        _mm256_cmp_ps(abs_frac, _mm256_set1_ps(0.5), _CMP_GE_OQ),
        _mm256_or_ps(_mm256_and_ps(v, sign_mask), _mm256_set1_ps(1.0)),
    );
    _mm256_add_ps(t, step)
}

#[inline(always)]
pub(crate) unsafe fn abs_max8(p: *const f32, n: usize) -> f32 {
    let sign_mask = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    for i in (0..n).step_by(8) {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(p.add(i))));
    }
    let s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Packs 32 i32 lanes (4 vectors, in order) to 32 i8.
#[inline(always)]
pub(crate) unsafe fn pack32(i: [__m256i; 4]) -> __m256i {
    let a = _mm256_packs_epi32(i[0], i[1]);
    let b = _mm256_packs_epi32(i[2], i[3]);
    let p = _mm256_packs_epi16(a, b);
    // packs interleaves 128-bit lanes: restore element order.
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Q8_0 (`SUM = false`) or Q8_1 (`SUM = true`) activation rows, bit-identical to the scalar
/// reference quantizer.
#[inline(always)]
unsafe fn quantize_q8<const SUM: bool>(x: &[f32], dst: &mut [u8]) {
    let bb = if SUM { 36 } else { 34 };
    let off = if SUM { 4 } else { 2 };
    for (b, xs) in x.chunks_exact(32).enumerate() {
        let p = xs.as_ptr();
        let amax = abs_max8(p, 32);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        let mut iv = [_mm256_setzero_si256(); 4];
        for k in 0..4 {
            let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(8 * k)), idv);
            iv[k] = _mm256_cvttps_epi32(roundf8(v));
        }
        let q = pack32(iv);
        let db = dst.as_mut_ptr().add(b * bb);
        std::ptr::write_unaligned(db as *mut [u8; 2], crate::quant::f16_to_le(d));
        _mm256_storeu_si256(db.add(off) as *mut __m256i, q);
        if SUM {
            let s = hsum_epi32(_mm256_add_epi32(
                _mm256_add_epi32(iv[0], iv[1]),
                _mm256_add_epi32(iv[2], iv[3]),
            ));
            std::ptr::write_unaligned(
                db.add(2) as *mut [u8; 2],
                crate::quant::f16_to_le(s as f32 * d),
            );
        }
    }
}

/// Q8_K activation rows, bit-identical to the scalar reference quantizer.
#[inline(always)]
unsafe fn quantize_q8k(x: &[f32], dst: &mut [u8]) {
    for (b, xs) in x.chunks_exact(256).enumerate() {
        let db = dst.as_mut_ptr().add(b * BlockQ8K::BYTES);
        // The signed value of largest magnitude (first one on ties, as the scalar loop).
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        let am = abs_max8(xs.as_ptr(), 256);
        if am > 0.0 {
            for &v in xs {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
        }
        if amax == 0.0 {
            std::ptr::write_bytes(db, 0, BlockQ8K::BYTES);
            continue;
        }
        let iscale = -127.0 / max;
        let isv = _mm256_set1_ps(iscale);
        let p = xs.as_ptr();
        for g in 0..8 {
            let mut iv = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(32 * g + 8 * k)), isv);
                // Round half to even (the MXCSR default), then clamp to 127.
                iv[k] = _mm256_min_epi32(_mm256_cvtps_epi32(v), _mm256_set1_epi32(127));
            }
            let q = pack32(iv);
            _mm256_storeu_si256(db.add(4 + 32 * g) as *mut __m256i, q);
            // Sums of each 16: i32 lanes 0..8 of iv[0..2] form group 2g, iv[2..4] group 2g+1.
            let s0 = hsum_epi32(_mm256_add_epi32(iv[0], iv[1])) as i16;
            let s1 = hsum_epi32(_mm256_add_epi32(iv[2], iv[3])) as i16;
            std::ptr::write_unaligned(db.add(260 + 4 * g) as *mut [u8; 2], s0.to_le_bytes());
            std::ptr::write_unaligned(db.add(262 + 4 * g) as *mut [u8; 2], s1.to_le_bytes());
        }
        std::ptr::write_unaligned(db as *mut [u8; 4], (1.0 / iscale).to_le_bytes());
    }
}

// ---------------------------------------------------------------------------- dispatch

// ------------------------------------------------ Pagoda-internal formats · Q8_0

/// INT8 per-channel · Q8_0: `|w|` against the activations signed by `w`, one f16 activation
/// scale per 32, the row scale once at the end.
#[inline(always)]
unsafe fn int8<D: IntDot, const N: usize>(w: &[u8], a: &[u8], st: usize, out: &mut [f32; NT]) {
    const AB: usize = BlockQ8_0::BYTES;
    let nb = (w.len() - 4) / 32;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr().add(4), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let q = load(wp.add(32 * b));
        let u = _mm256_sign_epi8(q, q);
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let av = _mm256_sign_epi8(load(ab.add(2)), q);
            let p = D::dot(_mm256_setzero_si256(), u, av);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(ab)), _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    let s = f32_at(w.as_ptr());
    for t in 0..N {
        out[t] = hsum(acc[t]) * s;
    }
}

/// NF4 / NF4_DQ · Q8_0: 32 codes at a time through the int8 codebook (`vpshufb`), then as
/// INT8 with `absmax / 127` per block of 64.
#[inline(always)]
unsafe fn nf4_body<D: IntDot, const DQ: bool, const N: usize>(
    w: &[u8],
    a: &[u8],
    st: usize,
    out: &mut [f32; NT],
) {
    use crate::quant::nf4;
    const AB: usize = BlockQ8_0::BYTES;
    let nb = if DQ {
        nf4::dq_blocks(w.len()).unwrap_or(0)
    } else {
        w.len() / nf4::BLOCK_BYTES
    };
    debug_assert!(a.len() >= (N - 1) * st + 2 * nb * AB);
    let (c_off, k_off, q_off) = nf4::dq_offsets(nb);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let cb = _mm256_broadcastsi128_si256(_mm_loadu_si128(nf4::NF4_I8.as_ptr() as *const __m128i));
    let mean = if DQ { f32_at(wp) } else { 0.0 };
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let (codes, amax) = if DQ {
            let c = f32_at(wp.add(c_off + 4 * (b / crate::NF4_DQ_GROUP)));
            let k = *wp.add(k_off + b) as i8;
            (wp.add(q_off + 32 * b), k as f32 * c + mean)
        } else {
            let wb = wp.add(b * nf4::BLOCK_BYTES);
            (wb.add(4), f32_at(wb))
        };
        let w0 = _mm256_shuffle_epi8(cb, nibbles32(codes));
        let w1 = _mm256_shuffle_epi8(cb, nibbles32(codes.add(16)));
        let (u0, u1) = (_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(w1, w1));
        let dw = _mm256_set1_ps(amax * (1.0 / 127.0));
        for t in 0..N {
            let ab = ap.add(t * st + 2 * b * AB);
            let z = _mm256_setzero_si256();
            let p0 = D::dot(z, u0, _mm256_sign_epi8(load(ab.add(2)), w0));
            let p1 = D::dot(z, u1, _mm256_sign_epi8(load(ab.add(AB + 2)), w1));
            let f = _mm256_mul_ps(_mm256_set1_ps(f16_at(ab)), _mm256_cvtepi32_ps(p0));
            let f = _mm256_fmadd_ps(
                _mm256_set1_ps(f16_at(ab.add(AB))),
                _mm256_cvtepi32_ps(p1),
                f,
            );
            acc[t] = _mm256_fmadd_ps(dw, f, acc[t]);
        }
    }
    for t in 0..N {
        out[t] = hsum(acc[t]);
    }
}

#[inline(always)]
unsafe fn nf4<D: IntDot, const N: usize>(w: &[u8], a: &[u8], st: usize, out: &mut [f32; NT]) {
    nf4_body::<D, false, N>(w, a, st, out)
}

#[inline(always)]
unsafe fn nf4_dq<D: IntDot, const N: usize>(w: &[u8], a: &[u8], st: usize, out: &mut [f32; NT]) {
    nf4_body::<D, true, N>(w, a, st, out)
}

/// MXFP4 · Q8_0: a block's 32 codes looked up in the doubled E2M1 codebook (exact int8) with
/// one `vpshufb`, signed through `|w|` and the sign moved onto the activations, scaled by
/// `2^(e - 128)` times the activation block's `d`.
#[inline(always)]
unsafe fn mxfp4<D: IntDot, const N: usize>(w: &[u8], a: &[u8], st: usize, out: &mut [f32; NT]) {
    use crate::quant::mxfp4;
    const AB: usize = BlockQ8_0::BYTES;
    const BB: usize = 17;
    let nb = w.len() / BB;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let cb =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(mxfp4::KVALUES.as_ptr() as *const __m128i));
    let mut acc = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let wb = wp.add(BB * b);
        let wv = _mm256_shuffle_epi8(cb, nibbles32(wb.add(1)));
        let u = _mm256_sign_epi8(wv, wv);
        let dw = mxfp4::e8m0_half(*wb);
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let p = D::dot(
                _mm256_setzero_si256(),
                u,
                _mm256_sign_epi8(load(ab.add(2)), wv),
            );
            let d = _mm256_set1_ps(dw * f16_at(ab));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    for t in 0..N {
        out[t] = hsum(acc[t]);
    }
}

/// INT4 with groups of `G` (64, 128) · Q8_0 (symmetric: `q - 8` signed, as INT8) or Q8_1
/// (asymmetric: unsigned codes, the minimum times the stored activation sums).
#[inline(always)]
unsafe fn int4_body<D: IntDot, const G: usize, const SYM: bool, const N: usize>(
    w: &[u8],
    a: &[u8],
    st: usize,
    out: &mut [f32; NT],
) {
    let ab_len = if SYM {
        BlockQ8_0::BYTES
    } else {
        BlockQ8_1::BYTES
    };
    let (head, a_codes) = if SYM { (2, 2) } else { (4, 4) };
    let gb = crate::quant::int4::group_bytes(G, SYM);
    let ng = w.len() / gb;
    debug_assert!(a.len() >= (N - 1) * st + ng * G / 32 * ab_len);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); N];
    let mut accm = [0.0f32; N];
    for g in 0..ng {
        let wb = wp.add(g * gb);
        let dw = f16_at(wb);
        let mw = if SYM { 0.0 } else { f16_at(wb.add(2)) };
        for k in 0..G / 32 {
            let mut q = nibbles32(wb.add(head + 16 * k));
            if SYM {
                q = _mm256_sub_epi8(q, _mm256_set1_epi8(8));
            }
            let u = if SYM { _mm256_sign_epi8(q, q) } else { q };
            for t in 0..N {
                let ab = ap.add(t * st + (g * G / 32 + k) * ab_len);
                let mut av = load(ab.add(a_codes));
                if SYM {
                    av = _mm256_sign_epi8(av, q);
                }
                let p = D::dot(_mm256_setzero_si256(), u, av);
                let d = _mm256_set1_ps(dw * f16_at(ab));
                acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
                if !SYM {
                    accm[t] += mw * f16_at(ab.add(2));
                }
            }
        }
    }
    finish(acc, accm, out);
}

macro_rules! int4_bodies {
    ($($name:ident => $g:literal, $sym:literal),* $(,)?) => {
        $(
            #[inline(always)]
            unsafe fn $name<D: IntDot, const N: usize>(
                w: &[u8],
                a: &[u8],
                st: usize,
                out: &mut [f32; NT],
            ) {
                int4_body::<D, $g, $sym, N>(w, a, st, out)
            }
        )*
    };
}
int4_bodies!(
    int4_g64 => 64, false,
    int4_g64_sym => 64, true,
    int4_g128 => 128, false,
    int4_g128_sym => 128, true,
);

/// Expands to `#[target_feature]` entry points that pick the `N`-token body at run time.
macro_rules! entry_points {
    ($features:literal, $dot:ty; $($name:ident => $body:ident),* $(,)?) => {
        $(
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn $name(w: &[u8], a: &[u8], st: usize, nt: usize, out: &mut [f32; NT]) {
                match nt {
                    1 => $body::<$dot, 1>(w, a, st, out),
                    2 => $body::<$dot, 2>(w, a, st, out),
                    3 => $body::<$dot, 3>(w, a, st, out),
                    4 => $body::<$dot, 4>(w, a, st, out),
                    5 => $body::<$dot, 5>(w, a, st, out),
                    6 => $body::<$dot, 6>(w, a, st, out),
                    7 => $body::<$dot, 7>(w, a, st, out),
                    _ => $body::<$dot, 8>(w, a, st, out),
                }
            }
        )*
    };
}
pub(crate) use entry_points;

entry_points!("avx2,fma,f16c", Maddubs;
    dot_q4_0 => q4_0, dot_q4_1 => q4_1, dot_q5_0 => q5_0, dot_q5_1 => q5_1, dot_q8_0 => q8_0,
    dot_q4_k => q4_k, dot_q5_k => q5_k, dot_q6_k => q6_k,
    dot_int8 => int8, dot_nf4 => nf4, dot_nf4_dq => nf4_dq, dot_mxfp4 => mxfp4,
    dot_int4_g64 => int4_g64, dot_int4_g64_sym => int4_g64_sym,
    dot_int4_g128 => int4_g128, dot_int4_g128_sym => int4_g128_sym,
);

macro_rules! float_entry {
    ($name:ident, $eb:literal, $load:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(w: &[u8], x: &[f32], st: usize, nt: usize, out: &mut [f32; NT]) {
            let l = |p| $load(p);
            // At most 4 tokens per pass keeps the accumulators in registers.
            let mut t0 = 0;
            while t0 < nt {
                let mut o = [0.0f32; NT];
                let xs = &x[t0 * st..];
                match nt - t0 {
                    1 => float_dot::<1, $eb>(w, xs, st, &mut o, l),
                    2 => float_dot::<2, $eb>(w, xs, st, &mut o, l),
                    3 => float_dot::<3, $eb>(w, xs, st, &mut o, l),
                    _ => float_dot::<4, $eb>(w, xs, st, &mut o, l),
                }
                let k = (nt - t0).min(4);
                out[t0..t0 + k].copy_from_slice(&o[..k]);
                t0 += k;
            }
        }
    };
}
float_entry!(dot_f32, 4, load8_f32);
float_entry!(dot_f16, 2, load8_f16);
float_entry!(dot_bf16, 2, load8_bf16);

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_0(x: &[f32], dst: &mut [u8]) {
    quantize_q8::<false>(x, dst)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_1(x: &[f32], dst: &mut [u8]) {
    quantize_q8::<true>(x, dst)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_k(x: &[f32], dst: &mut [u8]) {
    quantize_q8k(x, dst)
}

/// The AVX2 kernel of `ty`, when there is one.
pub(crate) fn kernel(ty: GgmlType) -> Option<RowKernel> {
    let q80 = |dot| RowKernel::Quant {
        partner: ActLayout::Blocks(GgmlType::Q8_0),
        quantize: quantize_q8_0,
        dot,
    };
    let q81 = |dot| RowKernel::Quant {
        partner: ActLayout::Blocks(GgmlType::Q8_1),
        quantize: quantize_q8_1,
        dot,
    };
    let q8k = |dot| RowKernel::Quant {
        partner: ActLayout::Blocks(GgmlType::Q8_K),
        quantize: quantize_q8_k,
        dot,
    };
    Some(match ty {
        GgmlType::Q4_0 | GgmlType::Int4G32Sym => q80(dot_q4_0),
        GgmlType::Q4_1 | GgmlType::Int4G32 => q81(dot_q4_1),
        GgmlType::Q5_0 => q80(dot_q5_0),
        GgmlType::Q5_1 => q81(dot_q5_1),
        GgmlType::Q8_0 => q80(dot_q8_0),
        GgmlType::Int8 => q80(dot_int8),
        GgmlType::Int4G64 => q81(dot_int4_g64),
        GgmlType::Int4G64Sym => q80(dot_int4_g64_sym),
        GgmlType::Int4G128 => q81(dot_int4_g128),
        GgmlType::Int4G128Sym => q80(dot_int4_g128_sym),
        GgmlType::Nf4 => q80(dot_nf4),
        GgmlType::Nf4Dq => q80(dot_nf4_dq),
        GgmlType::Mxfp4 => q80(dot_mxfp4),
        GgmlType::Q4_K => q8k(dot_q4_k),
        GgmlType::Q5_K => q8k(dot_q5_k),
        GgmlType::Q6_K => q8k(dot_q6_k),
        GgmlType::F32 => RowKernel::Float { dot: dot_f32 },
        GgmlType::F16 => RowKernel::Float { dot: dot_f16 },
        GgmlType::BF16 => RowKernel::Float { dot: dot_bf16 },
        _ => return None,
    })
}
