//! AVX-512 row kernels: 512-bit VNNI kernels for the 32-value block formats (two blocks per
//! step, against activations in the [`ActLayout::Split32`] layout), the AVX2 k-quant bodies
//! rebuilt on VNNI (`vpdpbusd`), and 512-bit float kernels.
//!
//! Invariant: every function here is `#[target_feature]` with the AVX-512 set it uses and is
//! reached only through [`kernel`], which the dispatcher calls only after `Isa::Avx512` was
//! found available; kernels needing VNNI are returned only when the CPU has it.

use std::arch::x86_64::*;

use super::avx2::q5_k;
use super::avx2::{self, abs_max8, entry_points, hsum_epi32, nibbles32, pack32, roundf8, IntDot};
use super::avx512_fmt as fmt;
use super::{ActLayout, RowKernel, NT};
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
    dot_q5_k => q5_k,
);

// --------------------------------------------- k-quants, two sub-blocks per 512-bit step

/// Q4_K · Q8_K: sub-blocks 2c and 2c+1 (low and high nibbles of the same 32 bytes) form one
/// zmm against 64 contiguous activation codes; the minimum term is one `vpmaddwd` of the
/// activation sums with the duplicated mins.
#[inline(always)]
unsafe fn q4_kz<const N: usize>(w: &[u8], a: &[u8], st: usize, out: &mut [f32; NT]) {
    const WB: usize = 144;
    const AB: usize = 292;
    let nb = w.len() / WB;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); N];
    let mut accm = [_mm256_setzero_ps(); N];
    for b in 0..nb {
        let wb = wp.add(b * WB);
        let (d, dmin) = (avx2::f16_at(wb), avx2::f16_at(wb.add(2)));
        let sm = avx2::k_scales_mins(wb.add(4));
        let smv = _mm_loadu_si128(sm.as_ptr() as *const __m128i);
        let sc32 = _mm512_cvtepu8_epi32(smv);
        let mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_srli_si128(smv, 8), dup));
        let mut q = [zero; 4];
        let mut scv = [zero; 4];
        for c in 0..4 {
            let bits = avx2::load(wb.add(16 + 32 * c));
            let lo = _mm256_and_si256(bits, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            q[c] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            let idx = _mm512_add_epi32(pair, _mm512_set1_epi32(2 * c as i32));
            scv[c] = _mm512_permutexvar_epi32(idx, sc32);
        }
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let mut sumi = zero;
            for c in 0..4 {
                let av = _mm512_loadu_si512(ab.add(4 + 64 * c) as *const _);
                let p = _mm512_dpbusd_epi32(zero, q[c], av);
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(p, scv[c]));
            }
            let da = avx2::f32_at(ab);
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * da), _mm512_cvtepi32_ps(sumi), acc[t]);
            let bs = _mm256_loadu_si256(ab.add(260) as *const __m256i);
            let summ = _mm256_madd_epi16(bs, mins16);
            accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * da), _mm256_cvtepi32_ps(summ), accm[t]);
        }
    }
    for t in 0..N {
        out[t] = _mm512_reduce_add_ps(acc[t]) - avx2::hsum(accm[t]);
    }
}

/// Q6_K · Q8_K: 64 codes (0..64) per zmm, `vpmaddubsw` then `vpmaddwd` with the four group
/// scales of those 64 values; `32 * sum_g sc[g] bsum[g]` comes off in integers.
#[inline(always)]
unsafe fn q6_kz<const N: usize>(w: &[u8], a: &[u8], st: usize, out: &mut [f32; NT]) {
    const WB: usize = 210;
    const AB: usize = 292;
    let nb = w.len() / WB;
    debug_assert!(a.len() >= (N - 1) * st + nb * AB);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(0x03);
    let zero = _mm512_setzero_si512();
    // i16 lane k of the j-th zmm multiplies codes of group 4j + k / 8.
    let base: [i16; 32] = std::array::from_fn(|k| (k / 8) as i16);
    let base = _mm512_loadu_si512(base.as_ptr() as *const _);
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        let wb = wp.add(b * WB);
        let d = avx2::f16_at(wb.add(208));
        let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192) as *const __m128i));
        let s16z = _mm512_castsi256_si512(s16);
        let mut scv = [zero; 4];
        for j in 0..4 {
            let idx = _mm512_add_epi16(base, _mm512_set1_epi16(4 * j as i16));
            scv[j] = _mm512_permutexvar_epi16(idx, s16z);
        }
        let mut q = [zero; 4];
        for h in 0..2 {
            let l1 = avx2::load(wb.add(64 * h));
            let l2 = avx2::load(wb.add(64 * h + 32));
            let hh = avx2::load(wb.add(128 + 32 * h));
            let h0 = _mm256_slli_epi16(_mm256_and_si256(hh, m3), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 2), m3), 4);
            let h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 4), m3), 4);
            let h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hh, 6), m3), 4);
            let q0 = _mm256_or_si256(_mm256_and_si256(l1, m4), h0);
            let q1 = _mm256_or_si256(_mm256_and_si256(l2, m4), h1);
            let q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h2);
            let q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m4), h3);
            q[2 * h] = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
            q[2 * h + 1] = _mm512_inserti64x4(_mm512_castsi256_si512(q2), q3, 1);
        }
        for t in 0..N {
            let ab = ap.add(t * st + b * AB);
            let mut sumi = zero;
            for j in 0..4 {
                let av = _mm512_loadu_si512(ab.add(4 + 64 * j) as *const _);
                let p16 = _mm512_maddubs_epi16(q[j], av);
                sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(p16, scv[j]));
            }
            let bs = _mm256_loadu_si256(ab.add(260) as *const __m256i);
            let off = _mm256_slli_epi32(_mm256_madd_epi16(bs, s16), 5);
            let sumi = _mm512_sub_epi32(sumi, _mm512_inserti64x4(zero, off, 0));
            let da = avx2::f32_at(ab);
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * da), _mm512_cvtepi32_ps(sumi), acc[t]);
        }
    }
    for t in 0..N {
        out[t] = _mm512_reduce_add_ps(acc[t]);
    }
}

macro_rules! entry_n {
    ($($name:ident => $body:ident),* $(,)?) => {
        $(
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            unsafe fn $name(w: &[u8], a: &[u8], st: usize, nt: usize, out: &mut [f32; NT]) {
                match nt {
                    1 => $body::<1>(w, a, st, out),
                    2 => $body::<2>(w, a, st, out),
                    3 => $body::<3>(w, a, st, out),
                    4 => $body::<4>(w, a, st, out),
                    5 => $body::<5>(w, a, st, out),
                    6 => $body::<6>(w, a, st, out),
                    7 => $body::<7>(w, a, st, out),
                    _ => $body::<8>(w, a, st, out),
                }
            }
        )*
    };
}
entry_n!(dot_q4_k => q4_kz, dot_q6_k => q6_kz);

// ------------------------------------------------------ 32-value blocks, two per step

#[inline(always)]
unsafe fn rd16(p: *const u8) -> i16 {
    std::ptr::read_unaligned(p as *const i16)
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> u32 {
    std::ptr::read_unaligned(p as *const u32)
}

/// Two f32 at `p` in lanes 0 and 1.
#[inline(always)]
unsafe fn load2(p: *const u8) -> __m128 {
    _mm_castpd_ps(_mm_load_sd(p as *const f64))
}

/// A 32-value weight block format as the 512-bit kernels see it.
trait Fmt32 {
    /// Bytes per block; the f16 scale is at offset 0 and, with `MIN`, the f16 min at 2.
    const WB: usize;
    /// Codes are unsigned with this offset subtracted (8 for Q4_0, 16 for Q5_0).
    const OFFSET: i8;
    /// Blocks carry a minimum, paired with the activation sums `s`.
    const MIN: bool;
    /// Codes are signed bytes (Q8_0).
    const SIGNED: bool;
    /// The 64 codes of the blocks at `wb` and `wb + WB`, in element order.
    unsafe fn codes2(wb: *const u8) -> __m512i;
    /// The 32 codes of the block at `wb`.
    unsafe fn codes1(wb: *const u8) -> __m256i;
}

/// 16 + 16 nibble bytes to [lo(b0), hi(b0), lo(b1), hi(b1)] (element order of both blocks).
#[inline(always)]
unsafe fn nibbles64(p0: *const u8, p1: *const u8) -> __m512i {
    let m4 = _mm256_set1_epi8(0x0F);
    let v = _mm256_set_m128i(
        _mm_loadu_si128(p1 as *const __m128i),
        _mm_loadu_si128(p0 as *const __m128i),
    );
    let lo = _mm256_and_si256(v, m4);
    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    _mm512_shuffle_i64x2(z, z, 0b11_01_10_00)
}

/// Fifth bits (u32 at `h0`, `h1`) as 0x10 per element of both blocks.
#[inline(always)]
unsafe fn high_bits64(h0: *const u8, h1: *const u8) -> __m512i {
    let m = rd32(h0) as u64 | ((rd32(h1) as u64) << 32);
    _mm512_maskz_mov_epi8(m, _mm512_set1_epi8(0x10))
}

#[inline(always)]
unsafe fn high_bits32(h: *const u8) -> __m256i {
    _mm256_maskz_mov_epi8(rd32(h), _mm256_set1_epi8(0x10))
}

struct Q4_0;
impl Fmt32 for Q4_0 {
    const WB: usize = 18;
    const OFFSET: i8 = 8;
    const MIN: bool = false;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn codes2(wb: *const u8) -> __m512i {
        nibbles64(wb.add(2), wb.add(Self::WB + 2))
    }
    #[inline(always)]
    unsafe fn codes1(wb: *const u8) -> __m256i {
        nibbles32(wb.add(2))
    }
}

struct Q4_1;
impl Fmt32 for Q4_1 {
    const WB: usize = 20;
    const OFFSET: i8 = 0;
    const MIN: bool = true;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn codes2(wb: *const u8) -> __m512i {
        nibbles64(wb.add(4), wb.add(Self::WB + 4))
    }
    #[inline(always)]
    unsafe fn codes1(wb: *const u8) -> __m256i {
        nibbles32(wb.add(4))
    }
}

struct Q5_0;
impl Fmt32 for Q5_0 {
    const WB: usize = 22;
    const OFFSET: i8 = 16;
    const MIN: bool = false;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn codes2(wb: *const u8) -> __m512i {
        let lo = nibbles64(wb.add(6), wb.add(Self::WB + 6));
        _mm512_or_si512(lo, high_bits64(wb.add(2), wb.add(Self::WB + 2)))
    }
    #[inline(always)]
    unsafe fn codes1(wb: *const u8) -> __m256i {
        _mm256_or_si256(nibbles32(wb.add(6)), high_bits32(wb.add(2)))
    }
}

struct Q5_1;
impl Fmt32 for Q5_1 {
    const WB: usize = 24;
    const OFFSET: i8 = 0;
    const MIN: bool = true;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn codes2(wb: *const u8) -> __m512i {
        let lo = nibbles64(wb.add(8), wb.add(Self::WB + 8));
        _mm512_or_si512(lo, high_bits64(wb.add(4), wb.add(Self::WB + 4)))
    }
    #[inline(always)]
    unsafe fn codes1(wb: *const u8) -> __m256i {
        _mm256_or_si256(nibbles32(wb.add(8)), high_bits32(wb.add(4)))
    }
}

struct Q8_0;
impl Fmt32 for Q8_0 {
    const WB: usize = 34;
    const OFFSET: i8 = 0;
    const MIN: bool = false;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn codes2(wb: *const u8) -> __m512i {
        let b0 = _mm256_loadu_si256(wb.add(2) as *const __m256i);
        let b1 = _mm256_loadu_si256(wb.add(Self::WB + 2) as *const __m256i);
        _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1)
    }
    #[inline(always)]
    unsafe fn codes1(wb: *const u8) -> __m256i {
        _mm256_loadu_si256(wb.add(2) as *const __m256i)
    }
}

/// One weight row of format `F` · `N` activation rows in the split layout.
#[inline(always)]
unsafe fn dot32<F: Fmt32, const N: usize>(w: &[u8], a: &[u8], st: usize, out: &mut [f32; NT]) {
    let nb = w.len() / F::WB;
    let cols = nb * 32;
    let (doff, soff) = (cols, cols + 32 * nb);
    debug_assert!(a.len() >= (N - 1) * st + cols + 36 * nb);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let zero = _mm512_setzero_si512();
    let offv = _mm512_set1_epi8(F::OFFSET);
    let idx01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let mut acc = [_mm512_setzero_ps(); N];
    let mut accm = [_mm_setzero_ps(); N];
    let mut tail = [0.0f32; N];
    let mut b = 0;
    while b + 2 <= nb {
        let wb = wp.add(b * F::WB);
        // [d0, d1, m0, m1] of the two weight blocks.
        let (m0, m1) = if F::MIN {
            (rd16(wb.add(2)), rd16(wb.add(F::WB + 2)))
        } else {
            (0, 0)
        };
        let dm = _mm_cvtph_ps(_mm_setr_epi16(
            rd16(wb),
            rd16(wb.add(F::WB)),
            m0,
            m1,
            0,
            0,
            0,
            0,
        ));
        let dwv = _mm512_permutexvar_ps(idx01, _mm512_castps128_ps512(dm));
        let mv = _mm_movehl_ps(dm, dm);
        let codes = F::codes2(wb);
        let (u, neg) = if F::SIGNED {
            (_mm512_abs_epi8(codes), _mm512_movepi8_mask(codes))
        } else {
            (codes, 0)
        };
        for t in 0..N {
            let at = ap.add(t * st);
            let mut av = _mm512_loadu_si512(at.add(32 * b) as *const _);
            if F::SIGNED {
                av = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
            }
            let mut p = _mm512_dpbusd_epi32(zero, u, av);
            if F::OFFSET != 0 {
                p = _mm512_sub_epi32(p, _mm512_dpbusd_epi32(zero, offv, av));
            }
            let da = _mm512_loadu_ps(at.add(doff + 32 * b) as *const f32);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dwv, da), acc[t]);
            if F::MIN {
                accm[t] = _mm_fmadd_ps(mv, load2(at.add(soff + 4 * b)), accm[t]);
            }
        }
        b += 2;
    }
    if b < nb {
        let wb = wp.add(b * F::WB);
        let dw = avx2::f16_at(wb);
        let mw = if F::MIN { avx2::f16_at(wb.add(2)) } else { 0.0 };
        let codes = F::codes1(wb);
        let u = if F::SIGNED {
            _mm256_abs_epi8(codes)
        } else {
            codes
        };
        for t in 0..N {
            let at = ap.add(t * st);
            let mut av = _mm256_loadu_si256(at.add(32 * b) as *const __m256i);
            if F::SIGNED {
                av = _mm256_sign_epi8(av, codes);
            }
            let z = _mm256_setzero_si256();
            let mut p = _mm256_dpbusd_epi32(z, u, av);
            if F::OFFSET != 0 {
                p = _mm256_sub_epi32(p, _mm256_dpbusd_epi32(z, _mm256_set1_epi8(F::OFFSET), av));
            }
            let da = f32::from_bits(rd32(at.add(doff + 32 * b)));
            tail[t] += hsum_epi32(p) as f32 * (dw * da);
            if F::MIN {
                tail[t] += mw * f32::from_bits(rd32(at.add(soff + 4 * b)));
            }
        }
    }
    for t in 0..N {
        let m = accm[t];
        let m = _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
        out[t] = _mm512_reduce_add_ps(acc[t]) + m + tail[t];
    }
}

macro_rules! entry32 {
    ($($name:ident => $fmt:ty),* $(,)?) => {
        $(
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            unsafe fn $name(w: &[u8], a: &[u8], st: usize, nt: usize, out: &mut [f32; NT]) {
                match nt {
                    1 => dot32::<$fmt, 1>(w, a, st, out),
                    2 => dot32::<$fmt, 2>(w, a, st, out),
                    3 => dot32::<$fmt, 3>(w, a, st, out),
                    4 => dot32::<$fmt, 4>(w, a, st, out),
                    5 => dot32::<$fmt, 5>(w, a, st, out),
                    6 => dot32::<$fmt, 6>(w, a, st, out),
                    7 => dot32::<$fmt, 7>(w, a, st, out),
                    _ => dot32::<$fmt, 8>(w, a, st, out),
                }
            }
        )*
    };
}
entry32!(dot_q4_0 => Q4_0, dot_q4_1 => Q4_1, dot_q5_0 => Q5_0, dot_q5_1 => Q5_1, dot_q8_0 => Q8_0);

/// Activation row to the split layout, with the codes and f16-rounded scales the scalar
/// Q8_1 quantizer produces.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn quantize_split(x: &[f32], dst: &mut [u8]) {
    let cols = x.len();
    let nb = cols / 32;
    debug_assert_eq!(dst.len(), cols + 36 * nb);
    let dp = dst.as_mut_ptr();
    for b in 0..nb {
        let p = x.as_ptr().add(32 * b);
        let amax = abs_max8(p, 32);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        let mut iv = [_mm256_setzero_si256(); 4];
        for k in 0..4 {
            let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(8 * k)), idv);
            iv[k] = _mm256_cvttps_epi32(roundf8(v));
        }
        _mm256_storeu_si256(dp.add(32 * b) as *mut __m256i, pack32(iv));
        let sum = hsum_epi32(_mm256_add_epi32(
            _mm256_add_epi32(iv[0], iv[1]),
            _mm256_add_epi32(iv[2], iv[3]),
        ));
        let d16 = half::f16::from_f32(d).to_f32();
        let s16 = half::f16::from_f32(sum as f32 * d).to_f32();
        _mm256_storeu_ps(dp.add(cols + 32 * b) as *mut f32, _mm256_set1_ps(d16));
        std::ptr::write_unaligned(dp.add(cols + 32 * nb + 4 * b) as *mut f32, s16);
    }
}

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
    let split = |dot| {
        Some(RowKernel::Quant {
            partner: ActLayout::Split32,
            quantize: quantize_split,
            dot,
        })
    };
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
        GgmlType::Q4_0 => split(dot_q4_0),
        GgmlType::Q4_1 => split(dot_q4_1),
        GgmlType::Q5_0 => split(dot_q5_0),
        GgmlType::Q5_1 => split(dot_q5_1),
        GgmlType::Q8_0 => split(dot_q8_0),
        GgmlType::Q4_K => with(dot_q4_k),
        GgmlType::Q5_K => with(dot_q5_k),
        GgmlType::Q6_K => with(dot_q6_k),
        GgmlType::Int4G32 => split(dot_q4_1),
        GgmlType::Int4G32Sym => split(dot_q4_0),
        GgmlType::Int8 => split(fmt::dot_int8),
        GgmlType::Int4G64 => split(fmt::dot_int4_g64),
        GgmlType::Int4G64Sym => split(fmt::dot_int4_g64_sym),
        GgmlType::Int4G128 => split(fmt::dot_int4_g128),
        GgmlType::Int4G128Sym => split(fmt::dot_int4_g128_sym),
        GgmlType::Nf4 => split(fmt::dot_nf4),
        GgmlType::Nf4Dq => split(fmt::dot_nf4_dq),
        GgmlType::Mxfp4 => split(fmt::dot_mxfp4),
        _ => None,
    }
}
