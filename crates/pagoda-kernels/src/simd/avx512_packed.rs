//! The strip kernel of packed weights (`crate::packed`: Q4_0, Q4_1, INT4 g32, Q8_0, INT8) on AVX-512 VNNI: one strip of
//! 16 rows against up to [`TOKENS`] tokens whose activations are in the `Split32` layout.
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

use crate::packed::StripFormat;

/// Tokens per pass over a strip.
pub(crate) const TOKENS: usize = 4;

/// One token's operands: its `Split32` activation row and, for Q4_0, its per-block integer
/// code sums.
#[derive(Clone, Copy)]
pub(crate) struct TokenRow {
    pub(crate) act: *const u8,
    pub(crate) isums: *const i32,
    pub(crate) out: *mut f32,
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
/// f32 scale per row (INT8) in a 64-byte strip header instead of per-block scales.
#[inline(always)]
unsafe fn strip<
    const NIB: bool,
    const MIN: bool,
    const OFF: i32,
    const RS: bool,
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
    for b in 0..nb {
        let c = s.add(stride * b);
        // Vector i: 16 rows x the 4 codes of columns 4i .. 4i + 4.
        let mut u = [_mm512_setzero_si512(); 8];
        if NIB {
            for k in 0..4 {
                let v = _mm512_loadu_si512(c.add(64 * k) as *const _);
                u[k] = _mm512_and_si512(v, m4);
                u[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
        } else {
            for (k, uk) in u.iter_mut().enumerate() {
                *uk = _mm512_loadu_si512(c.add(64 * k) as *const _);
            }
        }
        let dw = if RS {
            _mm512_setzero_ps()
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

/// Strip at `s` of format `f` against `tok.len()` (1..=[`TOKENS`]) tokens.
///
/// # Safety
/// AVX-512 F/BW and VNNI are available; `s` is a whole strip of `nb` blocks of format `f`
/// with `geometry` = `packed::block_geometry(f)`; every token's `act` is a `Split32` row of `32 * nb` values,
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
        ($nib:literal, $min:literal, $off:literal, $rs:literal) => {
            match tok.len() {
                1 => strip::<$nib, $min, $off, $rs, 1>(s, nb, geometry, tok),
                2 => strip::<$nib, $min, $off, $rs, 2>(s, nb, geometry, tok),
                3 => strip::<$nib, $min, $off, $rs, 3>(s, nb, geometry, tok),
                _ => strip::<$nib, $min, $off, $rs, 4>(s, nb, geometry, tok),
            }
        };
    }
    match (f.nibbles, f.min, f.offset, f.row_scale) {
        (true, true, 0, false) => go!(true, true, 0, false),
        (true, false, 8, false) => go!(true, false, 8, false),
        (false, false, 128, false) => go!(false, false, 128, false),
        (false, false, 128, true) => go!(false, false, 128, true),
        _ => debug_assert!(false, "no strip kernel for {f:?}"),
    }
}
