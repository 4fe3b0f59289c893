//! The strip kernels of packed weights (`crate::packed`: Q4_0, Q4_1, INT4 g32, Q5_0, Q8_0,
//! MXFP4, INT8, Q4_K, Q6_K) on AVX-512 VNNI: one strip of
//! 16 rows against up to [`TOKENS`] (8: a verification step of speculative decoding is one
//! pass) tokens whose activations are in the `Split32` layout.
//!
//! Per 32-column block: four 64-byte code loads give eight vectors of 16 rows x 4 codes (low
//! and high nibbles); each is multiplied by a 4-byte broadcast of the token's activation codes
//! with `vpdpbusd`, so lane `l` ends the block holding row `l`'s integer dot product, with no
//! lane sum. The 16 rows' f16 scales (and minimums) are one conversion per block, shared by
//! every token of the pass. Q8_0 strips hold `code + 128` (unsigned, as `vpdpbusd` wants) and
//! give eight vectors per block directly. Q4_0's code offset of 8 and Q8_0's 128 are taken
//! off with the block's integer activation sum, so the integer part is exact.
//!
//! Invariant: each token's result is computed by the same instruction sequence whatever
//! other tokens share the pass, so it is bit-identical to computing that token alone.

use std::arch::x86_64::*;

use crate::packed::{StripFormat, STRIP_ROWS};

/// Tokens per pass over a strip.
pub(crate) const TOKENS: usize = 8;

/// One token's operands: its `Split32` activation row and, for Q4_0, its per-block integer
/// code sums.
#[derive(Clone, Copy)]
pub(crate) struct TokenRow {
    pub(crate) act: *const u8,
    pub(crate) isums: *const i32,
    pub(crate) out: *mut f32,
}

/// Bytes ahead of the current block that the strip kernels prefetch: with several tokens a
/// block takes long enough to compute that the hardware prefetcher falls behind (each new
/// block started with a cache miss, measured as the hottest instruction), and the hardware
/// prefetcher does not cross 4 KiB pages. Into L2, 8 KiB ahead: against L1 at 4 KiB,
/// `matmul_bench models` (interleaved rounds, 2 threads) gave Qwen2.5-1.5B matmuls per
/// token 31.8-47.7 ms vs 39.2-54.5 ms (six rounds, all won) and 4 / 8 tokens 58-67 / 61-63 ms
/// vs 72-73 / 75-91 ms; the Q4_1 and INT4 models gained or tied.
const PREFETCH_AHEAD: usize = 8192;

/// Prefetches `lines` cache lines from `p + PREFETCH_AHEAD + 64 * first` into L2. Prefetches
/// never fault, so the addresses may run past the end of the matrix.
#[inline(always)]
unsafe fn prefetch_lines(p: *const u8, first: usize, lines: usize) {
    for l in first..first + lines {
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH_AHEAD + 64 * l) as *const i8);
    }
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> i32 {
    std::ptr::read_unaligned(p as *const i32)
}

#[inline(always)]
unsafe fn rdf32(p: *const u8) -> f32 {
    std::ptr::read_unaligned(p as *const f32)
}

/// Strip at `s` (`nb` blocks `stride` bytes apart, scales at `d_in` and minimums at `m_in`
/// in each) against `T` tokens;
/// writes 16 outputs per token at `tok.out`. `NIB`: codes are nibbles (256 code bytes per
/// block) else bytes (512); `MIN`: blocks carry minimums; `OFF`: the code offset; `RS`: one
/// f32 scale per row (INT8) in a 64-byte strip header instead of per-block scales; `H5`: a
/// fifth code bit per code (Q5_0) in eight 64-bit masks after the nibbles; `E8`: MXFP4, the
/// nibbles index the codebook plus `OFF` (one `vpshufb`) and the 16 rows' scales are E8M0
/// bytes.
#[inline(always)]
unsafe fn strip<
    const NIB: bool,
    const MIN: bool,
    const OFF: i32,
    const RS: bool,
    const H5: bool,
    const E8: bool,
    const T: usize,
>(
    s: *const u8,
    nb: usize,
    (stride, d_in, m_in): (usize, usize, usize),
    tok: &[TokenRow],
) {
    let cols = 32 * nb;
    let m4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); T];
    // Row-scaled (INT8): the strip starts with the 16 rows' f32 scales.
    let (row_scales, s) = if RS {
        (_mm512_loadu_ps(s as *const f32), s.add(64))
    } else {
        (_mm512_setzero_ps(), s)
    };
    let lines = stride.div_ceil(64);
    for b in 0..nb {
        let c = s.add(stride * b);
        prefetch_lines(c, 0, lines);
        // Vector i: 16 rows x the 4 codes of columns 4i .. 4i + 4.
        let mut u = [_mm512_setzero_si512(); 8];
        if NIB {
            for k in 0..4 {
                let v = _mm512_loadu_si512(c.add(64 * k) as *const _);
                u[k] = _mm512_and_si512(v, m4);
                u[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
            if E8 {
                let lut =
                    _mm512_broadcast_i32x4(_mm_loadu_si128(MXFP4_LUT.as_ptr() as *const __m128i));
                for ui in u.iter_mut() {
                    *ui = _mm512_shuffle_epi8(lut, *ui);
                }
            }
            if H5 {
                // Fifth bits: mask i selects the bytes of vector i that get 0x10.
                let bit5 = _mm512_set1_epi8(0x10);
                for (i, ui) in u.iter_mut().enumerate() {
                    let m = std::ptr::read_unaligned(c.add(256 + 8 * i) as *const u64);
                    *ui = _mm512_or_si512(*ui, _mm512_maskz_mov_epi8(m, bit5));
                }
            }
        } else {
            for (k, uk) in u.iter_mut().enumerate() {
                *uk = _mm512_loadu_si512(c.add(64 * k) as *const _);
            }
        }
        let dw = if RS {
            _mm512_setzero_ps()
        } else if E8 {
            e8m0_half_x16(c.add(d_in))
        } else {
            _mm512_cvtph_ps(_mm256_loadu_si256(c.add(d_in) as *const __m256i))
        };
        let mw = if MIN {
            _mm512_cvtph_ps(_mm256_loadu_si256(c.add(m_in) as *const __m256i))
        } else {
            _mm512_setzero_ps()
        };
        for t in 0..T {
            let ap = tok[t].act.add(32 * b);
            // Two independent chains (even and odd column quads), added at the end.
            let mut p0 = _mm512_setzero_si512();
            let mut p1 = _mm512_setzero_si512();
            for i in (0..8).step_by(2) {
                p0 = _mm512_dpbusd_epi32(p0, u[i], _mm512_set1_epi32(rd32(ap.add(4 * i))));
                p1 = _mm512_dpbusd_epi32(p1, u[i + 1], _mm512_set1_epi32(rd32(ap.add(4 * i + 4))));
            }
            let mut p = _mm512_add_epi32(p0, p1);
            if OFF != 0 {
                p = _mm512_sub_epi32(p, _mm512_set1_epi32(OFF * *tok[t].isums.add(b)));
            }
            let da = _mm512_set1_ps(rdf32(tok[t].act.add(cols + 32 * b)));
            let scale = if RS { da } else { _mm512_mul_ps(dw, da) };
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc[t]);
            if MIN {
                let sa = _mm512_set1_ps(rdf32(tok[t].act.add(cols + 32 * nb + 4 * b)));
                acc[t] = _mm512_fmadd_ps(mw, sa, acc[t]);
            }
        }
    }
    for t in 0..T {
        let v = if RS {
            _mm512_mul_ps(acc[t], row_scales)
        } else {
            acc[t]
        };
        _mm512_storeu_ps(tok[t].out, v);
    }
}

/// MXFP4's codebook plus 12 (`quant::mxfp4::KVALUES[i] + 12`, 0..=24): unsigned codes for
/// `vpdpbusd`, the 12 taken off with the activation sums.
const MXFP4_LUT: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (crate::quant::mxfp4::KVALUES[i] + 12) as u8;
        i += 1;
    }
    t
};

/// The 16 E8M0 bytes at `p` as f32 `2^(e - 128)` (`quant::mxfp4::e8m0_half`, bit for bit:
/// `(e - 1) << 23`, and the subnormals `0x200000 << e` for `e < 2`).
#[inline(always)]
unsafe fn e8m0_half_x16(p: *const u8) -> __m512 {
    let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
    let normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    let sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
    let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub))
}

/// Bytes of one Q8_K activation block: d (f32), 256 codes, 16 i16 sums of 16 codes.
const Q8K: usize = 292;

/// A Q4_K strip (`packed::pack_q4k_block` layout, `nb` super-blocks) against `T` tokens
/// with Q8_K activations. Per super-block: the 16 rows' packed 6-bit scales and minimums are
/// unpacked as lanes (the same bit moves as the row kernel, 16 rows at once) and shared by
/// the tokens; each sub-block's integer dot is scaled by its 6-bit scale in integers, so
/// the integer part is exact as in the reference.
#[inline(always)]
unsafe fn strip_q4k<const T: usize>(s: *const u8, nb: usize, tok: &[TokenRow]) {
    use crate::packed::Q4K_SCALES;
    let m4 = _mm512_set1_epi8(0x0F);
    let ff = _mm512_set1_epi32(0xFF);
    let kmask1 = _mm512_set1_epi32(0x3f3f_3f3f);
    let kmask2 = _mm512_set1_epi32(0x0f0f_0f0f);
    let kmask3 = _mm512_set1_epi32(0x0303_0303);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let blk = s.add(STRIP_ROWS * 144 * b);
        let u0 = _mm512_loadu_si512(blk.add(Q4K_SCALES) as *const _);
        let u1 = _mm512_loadu_si512(blk.add(Q4K_SCALES + 64) as *const _);
        let u2 = _mm512_loadu_si512(blk.add(Q4K_SCALES + 128) as *const _);
        // Bytes 0..4 of each lane: scales 0..4 / 4..8, minimums 0..4 / 4..8.
        let sc_lo = _mm512_and_si512(u0, kmask1);
        let sc_hi = _mm512_or_si512(
            _mm512_and_si512(u2, kmask2),
            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), kmask3), 4),
        );
        let mn_lo = _mm512_and_si512(u1, kmask1);
        let mn_hi = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32(u2, 4), kmask2),
            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), kmask3), 4),
        );
        let byte = |v: __m512i, j: u32| -> __m512i {
            _mm512_and_si512(_mm512_srlv_epi32(v, _mm512_set1_epi32(8 * j as i32)), ff)
        };
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(
            blk.add(Q4K_SCALES + 192) as *const __m256i
        ));
        let dmw = _mm512_cvtph_ps(_mm256_loadu_si256(
            blk.add(Q4K_SCALES + 224) as *const __m256i
        ));
        let mut sumi = [_mm512_setzero_si512(); T];
        for c in 0..4 {
            // 36 lines per super-block, 9 per chunk.
            prefetch_lines(blk, 9 * c, 9);
            let mut plo = [_mm512_setzero_si512(); T];
            let mut phi = [_mm512_setzero_si512(); T];
            for k in 0..8 {
                let v = _mm512_loadu_si512(blk.add(64 * (8 * c + k)) as *const _);
                let lo = _mm512_and_si512(v, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                for t in 0..T {
                    let ap = tok[t].act.add(Q8K * b + 4 + 64 * c + 4 * k);
                    plo[t] = _mm512_dpbusd_epi32(plo[t], lo, _mm512_set1_epi32(rd32(ap)));
                    phi[t] = _mm512_dpbusd_epi32(phi[t], hi, _mm512_set1_epi32(rd32(ap.add(32))));
                }
            }
            let (s0, s1) = if c < 2 {
                (byte(sc_lo, 2 * c as u32), byte(sc_lo, 2 * c as u32 + 1))
            } else {
                (byte(sc_hi, 2 * c as u32 - 4), byte(sc_hi, 2 * c as u32 - 3))
            };
            for t in 0..T {
                let scaled = _mm512_add_epi32(
                    _mm512_mullo_epi32(plo[t], s0),
                    _mm512_mullo_epi32(phi[t], s1),
                );
                sumi[t] = _mm512_add_epi32(sumi[t], scaled);
            }
        }
        // The minimums as 16-bit pairs per lane, for `vpdpwssd` against pairs of activation
        // sums: (m0, m2), (m1, m3), (m4, m6), (m5, m7).
        let words = _mm512_set1_epi32(0x00FF_00FF);
        let mins = [
            _mm512_and_si512(mn_lo, words),
            _mm512_srli_epi16(mn_lo, 8),
            _mm512_and_si512(mn_hi, words),
            _mm512_srli_epi16(mn_hi, 8),
        ];
        for t in 0..T {
            let a = tok[t].act.add(Q8K * b);
            // A sub-block's activation sum (two 16-column sums) fits in 16 bits: |sum| <= 32 · 128.
            let asum = |j: usize| -> u32 {
                let g =
                    |i: usize| std::ptr::read_unaligned(a.add(260 + 2 * i) as *const i16) as i32;
                (g(2 * j) + g(2 * j + 1)) as u16 as u32
            };
            let pair =
                |j0: usize, j1: usize| _mm512_set1_epi32((asum(j0) | (asum(j1) << 16)) as i32);
            let mut msum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mins[0], pair(0, 2));
            msum = _mm512_dpwssd_epi32(msum, mins[1], pair(1, 3));
            msum = _mm512_dpwssd_epi32(msum, mins[2], pair(4, 6));
            msum = _mm512_dpwssd_epi32(msum, mins[3], pair(5, 7));
            let da = _mm512_set1_ps(rdf32(a));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(dw, da), acc[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmw, da), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(tok[t].out, acc[t]);
    }
}

/// A Q6_K strip (`packed::pack_q6k_block` layout) against `T` tokens with Q8_K activations:
/// per 32-column chunk, four nibble vectors and two vectors of high bit pairs give the eight
/// 6-bit code vectors; the two 16-column groups of the chunk are two `vpdpbusd` chains, each
/// with the code offset 32 taken off by the group's activation sum and scaled by the rows'
/// i8 group scales in integers.
#[inline(always)]
unsafe fn strip_q6k<const T: usize>(s: *const u8, nb: usize, tok: &[TokenRow]) {
    use crate::packed::{Q6K_D, Q6K_HIGH, Q6K_SCALES};
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let blk = s.add(STRIP_ROWS * 210 * b);
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(Q6K_D) as *const __m256i));
        let mut sumi = [_mm512_setzero_si512(); T];
        for c in 0..8 {
            // 53 lines per super-block, 7 per chunk.
            prefetch_lines(blk, 7 * c, 7);
            let h = [
                _mm512_loadu_si512(blk.add(Q6K_HIGH + 128 * c) as *const _),
                _mm512_loadu_si512(blk.add(Q6K_HIGH + 128 * c + 64) as *const _),
            ];
            // High bit pair of vector i = 4a + m, moved to bits 4..6 of each byte.
            let high = |i: usize| -> __m512i {
                let v = h[i / 4];
                let shifted = match i % 4 {
                    0 => _mm512_slli_epi16(v, 4),
                    1 => _mm512_slli_epi16(v, 2),
                    2 => v,
                    _ => _mm512_srli_epi16(v, 2),
                };
                _mm512_and_si512(shifted, m30)
            };
            let mut u = [_mm512_setzero_si512(); 8];
            for k in 0..4 {
                let v = _mm512_loadu_si512(blk.add(256 * c + 64 * k) as *const _);
                u[k] = _mm512_or_si512(_mm512_and_si512(v, m4), high(k));
                u[4 + k] =
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), high(4 + k));
            }
            let sc = |g: usize| {
                _mm512_cvtepi8_epi32(_mm_loadu_si128(
                    blk.add(Q6K_SCALES + 16 * g) as *const __m128i
                ))
            };
            let (s0, s1) = (sc(2 * c), sc(2 * c + 1));
            for t in 0..T {
                let a = tok[t].act.add(Q8K * b);
                let ap = a.add(4 + 32 * c);
                let mut p0 = _mm512_setzero_si512();
                let mut p1 = _mm512_setzero_si512();
                for k in 0..4 {
                    p0 = _mm512_dpbusd_epi32(p0, u[k], _mm512_set1_epi32(rd32(ap.add(4 * k))));
                    p1 = _mm512_dpbusd_epi32(
                        p1,
                        u[4 + k],
                        _mm512_set1_epi32(rd32(ap.add(16 + 4 * k))),
                    );
                }
                let bsum =
                    |g: usize| std::ptr::read_unaligned(a.add(260 + 2 * g) as *const i16) as i32;
                p0 = _mm512_sub_epi32(p0, _mm512_set1_epi32(32 * bsum(2 * c)));
                p1 = _mm512_sub_epi32(p1, _mm512_set1_epi32(32 * bsum(2 * c + 1)));
                let scaled =
                    _mm512_add_epi32(_mm512_mullo_epi32(p0, s0), _mm512_mullo_epi32(p1, s1));
                sumi[t] = _mm512_add_epi32(sumi[t], scaled);
            }
        }
        for t in 0..T {
            let da = _mm512_set1_ps(rdf32(tok[t].act.add(Q8K * b)));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[t]), _mm512_mul_ps(dw, da), acc[t]);
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(tok[t].out, acc[t]);
    }
}

/// Strip at `s` of format `f` against `tok.len()` (1..=[`TOKENS`]) tokens.
///
/// # Safety
/// AVX-512 F/BW and VNNI are available; `s` is a whole strip of `nb` blocks of format `f`
/// with `geometry` = `packed::block_geometry(f)`; every token's `act` is a row of `nb`
/// blocks' values in the partner layout (`Split32`, or Q8_K for Q4_K),
/// `isums` holds its `nb` block sums when `f.offset != 0`, and `out` has room for 16 values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn strip_kernel(
    f: StripFormat,
    s: *const u8,
    nb: usize,
    geometry: (usize, usize, usize),
    tok: &[TokenRow],
) {
    macro_rules! go {
        ($nib:literal, $min:literal, $off:literal, $rs:literal, $h5:literal, $e8:literal) => {
            match tok.len() {
                1 => strip::<$nib, $min, $off, $rs, $h5, $e8, 1>(s, nb, geometry, tok),
                2 => strip::<$nib, $min, $off, $rs, $h5, $e8, 2>(s, nb, geometry, tok),
                3 => strip::<$nib, $min, $off, $rs, $h5, $e8, 3>(s, nb, geometry, tok),
                4 => strip::<$nib, $min, $off, $rs, $h5, $e8, 4>(s, nb, geometry, tok),
                5 => strip::<$nib, $min, $off, $rs, $h5, $e8, 5>(s, nb, geometry, tok),
                6 => strip::<$nib, $min, $off, $rs, $h5, $e8, 6>(s, nb, geometry, tok),
                7 => strip::<$nib, $min, $off, $rs, $h5, $e8, 7>(s, nb, geometry, tok),
                _ => strip::<$nib, $min, $off, $rs, $h5, $e8, 8>(s, nb, geometry, tok),
            }
        };
    }
    if f.q6k {
        match tok.len() {
            1 => strip_q6k::<1>(s, nb, tok),
            2 => strip_q6k::<2>(s, nb, tok),
            3 => strip_q6k::<3>(s, nb, tok),
            4 => strip_q6k::<4>(s, nb, tok),
            5 => strip_q6k::<5>(s, nb, tok),
            6 => strip_q6k::<6>(s, nb, tok),
            7 => strip_q6k::<7>(s, nb, tok),
            _ => strip_q6k::<8>(s, nb, tok),
        }
        return;
    }
    if f.q4k {
        match tok.len() {
            1 => strip_q4k::<1>(s, nb, tok),
            2 => strip_q4k::<2>(s, nb, tok),
            3 => strip_q4k::<3>(s, nb, tok),
            4 => strip_q4k::<4>(s, nb, tok),
            5 => strip_q4k::<5>(s, nb, tok),
            6 => strip_q4k::<6>(s, nb, tok),
            7 => strip_q4k::<7>(s, nb, tok),
            _ => strip_q4k::<8>(s, nb, tok),
        }
        return;
    }
    match (f.nibbles, f.min, f.offset, f.row_scale, f.high5, f.e8m0) {
        (true, true, 0, false, false, false) => go!(true, true, 0, false, false, false),
        (true, false, 8, false, false, false) => go!(true, false, 8, false, false, false),
        (true, false, 12, false, false, true) => go!(true, false, 12, false, false, true),
        (true, false, 16, false, true, false) => go!(true, false, 16, false, true, false),
        (false, false, 128, false, false, false) => go!(false, false, 128, false, false, false),
        (false, false, 128, true, false, false) => go!(false, false, 128, true, false, false),
        _ => debug_assert!(false, "no strip kernel for {f:?}"),
    }
}
