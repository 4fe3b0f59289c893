//! Q4_K and Q6_K prefill GEMMs on AVX-512 VNNI: eight weight rows repacked into one strip so that a
//! single `vpdpbusd` computes 8 codes x 8 rows for one token, against an 8-byte broadcast of
//! that token's Q8_K codes.
//!
//! Strip layout, per 256-value block (`STRIP_BLOCK` bytes): for sub-block `s` and group `j`
//! (`0..4`) one 64-byte vector holding, at bytes `8i..8i + 8`, the codes `32s + 8j ..+ 8` of
//! row `i` (i32 lane `2i + h` = row `i`, codes `8j + 4h ..+ 4`); then per sub-block the scale
//! of row `i` as i32 in lanes `2i`, `2i + 1`; then two i16-pair vectors of the mins (lane
//! `2i + h`: `m[4h + 2p]`, `m[4h + 2p + 1]` for `p = 0, 1`) for `vpdpwssd` against the
//! 32-value activation sums; then `d` and `dmin` per lane as f32. Sub-block sums are scaled
//! once per sub-block for 8 rows at once; lanes `2i` and `2i + 1` are added once per row and
//! token at the very end. Rows past the matrix end are zero (their outputs are dropped).
//! Q6_K uses the same code layout with 16 group scales and a `32 * sum sc * bsum` offset
//! term (see `Q6_STRIP_BLOCK`). Each rayon task repacks its strip into its own scratch once
//! per call, then runs every token over it 8 at a time.
//!
//! Invariant: [`gemm`] is only called when AVX-512 F/BW/VL and VNNI are available, with
//! activations quantized to Q8_K blocks (292 bytes, codes at 4, sums at 260).

use std::arch::x86_64::*;

use rayon::prelude::*;

/// Rows per strip.
const R: usize = 8;
/// Tokens per micro-kernel pass.
const T: usize = 8;
const WB: usize = 144;
const AB: usize = 292;
const CODES: usize = 8 * 4 * 64;
const SC_OFF: usize = CODES;
const M_OFF: usize = SC_OFF + 8 * 64;
const D_OFF: usize = M_OFF + 2 * 64;
/// Bytes of one block of a strip.
pub(crate) const STRIP_BLOCK: usize = D_OFF + 2 * 64;

/// Repacks rows `r0..r0 + 8` (those below `rows`) of `nb` blocks each into `buf`.
///
/// # Safety
/// AVX2 is available; `w` holds `rows` rows of `nb` Q4_K blocks; `buf` holds at least
/// `nb * STRIP_BLOCK` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn repack(w: &[u8], rows: usize, nb: usize, r0: usize, buf: &mut [u8]) {
    let rb = nb * WB;
    debug_assert!(w.len() >= rows * rb && buf.len() >= nb * STRIP_BLOCK);
    if r0 + R > rows {
        buf[..nb * STRIP_BLOCK].fill(0);
    }
    let m4 = _mm256_set1_epi8(0x0F);
    let bp = buf.as_mut_ptr();
    let st64 = |at: usize, v: u64| std::ptr::write_unaligned(bp.add(at) as *mut u64, v);
    for i in 0..R.min(rows - r0) {
        let row = w.as_ptr().add((r0 + i) * rb);
        for b in 0..nb {
            let blk = row.add(b * WB);
            let out = b * STRIP_BLOCK;
            for c in 0..4 {
                let bits = _mm256_loadu_si256(blk.add(16 + 32 * c) as *const __m256i);
                let lo = _mm256_and_si256(bits, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                for (s, v) in [(2 * c, lo), (2 * c + 1, hi)] {
                    let mut q = [0u64; 4];
                    _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, v);
                    for (j, &qj) in q.iter().enumerate() {
                        st64(out + (4 * s + j) * 64 + 8 * i, qj);
                    }
                }
            }
            let sm = super::avx2::k_scales_mins(blk.add(4));
            let sm: [u8; 16] = std::mem::transmute(sm);
            let (sc, m) = (&sm[..8], &sm[8..]);
            for s in 0..8 {
                st64(out + SC_OFF + 64 * s + 8 * i, sc[s] as u64 * 0x1_0000_0001);
            }
            for p in 0..2 {
                let v = m[2 * p] as u64
                    | (m[2 * p + 1] as u64) << 16
                    | (m[4 + 2 * p] as u64) << 32
                    | (m[5 + 2 * p] as u64) << 48;
                st64(out + M_OFF + 64 * p + 8 * i, v);
            }
            let d = super::avx2::f16_at(blk).to_bits() as u64;
            let dmin = (-super::avx2::f16_at(blk.add(2))).to_bits() as u64;
            st64(out + D_OFF + 8 * i, d * 0x1_0000_0001);
            st64(out + D_OFF + 64 + 8 * i, dmin * 0x1_0000_0001);
        }
    }
}

/// One strip of `nb` blocks · `N` tokens (Q8_K rows `st` bytes apart at `a`):
/// `out[t][i]` = row `i` · token `t`.
#[inline(always)]
unsafe fn strip<const N: usize>(p: *const u8, nb: usize, a: *const u8, st: usize) -> [[f32; R]; N] {
    let zero = _mm512_setzero_si512();
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        let sp = p.add(b * STRIP_BLOCK);
        let ab = a.add(b * AB);
        let mut isum = [zero; N];
        for s in 0..8 {
            let mut sub = [zero; N];
            for j in 0..4 {
                let wv = _mm512_loadu_si512(sp.add((4 * s + j) * 64) as *const _);
                for t in 0..N {
                    let q =
                        std::ptr::read_unaligned(ab.add(t * st + 4 + 32 * s + 8 * j) as *const i64);
                    sub[t] = _mm512_dpbusd_epi32(sub[t], wv, _mm512_set1_epi64(q));
                }
            }
            let sc = _mm512_loadu_si512(sp.add(SC_OFF + 64 * s) as *const _);
            for t in 0..N {
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sub[t], sc));
            }
        }
        let m0 = _mm512_loadu_si512(sp.add(M_OFF) as *const _);
        let m1 = _mm512_loadu_si512(sp.add(M_OFF + 64) as *const _);
        let dv = _mm512_loadu_ps(sp.add(D_OFF) as *const f32);
        let dmv = _mm512_loadu_ps(sp.add(D_OFF + 64) as *const f32);
        for t in 0..N {
            let at = ab.add(t * st);
            let bs = _mm256_loadu_si256(at.add(260) as *const __m256i);
            // B_s = bsums[2s] + bsums[2s + 1] as i16 (|B_s| <= 32 * 127).
            let b16 = _mm256_cvtepi32_epi16(_mm256_madd_epi16(bs, ones));
            let b16 = _mm_shuffle_epi32(b16, 0b11_01_10_00);
            let bq0 = _mm512_broadcastq_epi64(b16);
            let bq1 = _mm512_broadcastq_epi64(_mm_unpackhi_epi64(b16, b16));
            let mn = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(zero, m0, bq0), m1, bq1);
            let da = _mm512_set1_ps(std::ptr::read_unaligned(at as *const f32));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dv, da), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mn), _mm512_mul_ps(dmv, da), acc[t]);
        }
    }
    let mut out = [[0.0f32; R]; N];
    for t in 0..N {
        let mut v = [0.0f32; 16];
        _mm512_storeu_ps(v.as_mut_ptr(), acc[t]);
        for i in 0..R {
            out[t][i] = v[2 * i] + v[2 * i + 1];
        }
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn strip_n(
    p: *const u8,
    nb: usize,
    a: *const u8,
    st: usize,
    nt: usize,
    out: &mut [[f32; R]; T],
) {
    macro_rules! go {
        ($n:literal) => {{
            let o = strip::<$n>(p, nb, a, st);
            out[..$n].copy_from_slice(&o);
        }};
    }
    match nt {
        1 => go!(1),
        2 => go!(2),
        3 => go!(3),
        4 => go!(4),
        5 => go!(5),
        6 => go!(6),
        7 => go!(7),
        _ => go!(8),
    }
}

/// Raw output pointer for strips that write disjoint rows.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: each strip writes only its own rows of the output, which outlives the parallel
// section.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// Element `i` (a method, so closures capture the whole `Sync` wrapper).
    fn at(&self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// `out[t * rows + r] = W[r] · a[t]` for Q4_K weights `w` (`rows` rows of `nb` blocks) and
/// `n` Q8_K activation rows of `nb` blocks each in `a`.
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI are available; `w.len() == rows * nb * 144`,
/// `a.len() == n * nb * 292`, `out.len() == n * rows`.
pub(crate) unsafe fn gemm(w: &[u8], rows: usize, nb: usize, a: &[u8], n: usize, out: &mut [f32]) {
    gemm_with(w, rows, nb, a, n, out, WB, STRIP_BLOCK, repack, strip_n);
}

/// As [`gemm`], for Q6_K weights (210-byte blocks).
///
/// # Safety
/// As for [`gemm`], with `w.len() == rows * nb * 210`.
pub(crate) unsafe fn gemm_q6_k(
    w: &[u8],
    rows: usize,
    nb: usize,
    a: &[u8],
    n: usize,
    out: &mut [f32],
) {
    gemm_with(
        w,
        rows,
        nb,
        a,
        n,
        out,
        Q6_WB,
        Q6_STRIP_BLOCK,
        repack_q6,
        strip_n_q6,
    );
}

type Repack = unsafe fn(&[u8], usize, usize, usize, &mut [u8]);
type StripN = unsafe fn(*const u8, usize, *const u8, usize, usize, &mut [[f32; R]; T]);

#[allow(clippy::too_many_arguments)]
unsafe fn gemm_with(
    w: &[u8],
    rows: usize,
    nb: usize,
    a: &[u8],
    n: usize,
    out: &mut [f32],
    wb: usize,
    strip_block: usize,
    repack: Repack,
    strip_n: StripN,
) {
    assert!(w.len() == rows * nb * wb && a.len() == n * nb * AB && out.len() == n * rows);
    let st = nb * AB;
    let strips = rows.div_ceil(R);
    let o = Out(out.as_mut_ptr());
    (0..strips).into_par_iter().with_min_len(2).for_each_init(
        || vec![0u8; nb * strip_block],
        |buf, sidx| {
            let r0 = sidx * R;
            // SAFETY: AVX2 is implied by the caller's AVX-512 set; `buf` was made
            // for `nb` blocks.
            repack(w, rows, nb, r0, buf);
            let mut res = [[0.0f32; R]; T];
            for t0 in (0..n).step_by(T) {
                let nt = T.min(n - t0);
                // SAFETY: features per the caller; `buf` holds `nb` strip blocks and
                // tokens t0..t0 + nt have `st` bytes each in `a`.
                strip_n(buf.as_ptr(), nb, a.as_ptr().add(t0 * st), st, nt, &mut res);
                for (t, row) in res[..nt].iter().enumerate() {
                    for (i, &v) in row.iter().enumerate() {
                        let r = r0 + i;
                        if r < rows {
                            // SAFETY: `t0 + t < n`, `r < rows`; only this strip
                            // writes rows r0..r0 + 8.
                            *o.at((t0 + t) * rows + r) = v;
                        }
                    }
                }
            }
        },
    );
}

// ------------------------------------------------------------------------------ Q6_K

const Q6_WB: usize = 210;
const Q6_SC_OFF: usize = CODES;
const Q6_O_OFF: usize = Q6_SC_OFF + 16 * 64;
const Q6_D_OFF: usize = Q6_O_OFF + 4 * 64;
/// Bytes of one Q6_K block of a strip: codes 0..64 as for Q4_K (vector `v` holds codes
/// `8v ..+ 8` of each row, group `v / 2`), the 16 group scales as i32 lane pairs, four
/// i16-pair vectors of the scales for the `32 * sum_g sc[g] bsum[g]` offset term (lane
/// `2i + h`: `sc[8h + 2p]`, `sc[8h + 2p + 1]`), then `d` per lane.
const Q6_STRIP_BLOCK: usize = Q6_D_OFF + 64;

/// Repacks Q6_K rows `r0..r0 + 8` (those below `rows`) of `nb` blocks each into `buf`.
///
/// # Safety
/// As for [`repack`], with 210-byte blocks and `nb * Q6_STRIP_BLOCK` bytes of `buf`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn repack_q6(w: &[u8], rows: usize, nb: usize, r0: usize, buf: &mut [u8]) {
    let rb = nb * Q6_WB;
    debug_assert!(w.len() >= rows * rb && buf.len() >= nb * Q6_STRIP_BLOCK);
    if r0 + R > rows {
        buf[..nb * Q6_STRIP_BLOCK].fill(0);
    }
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(0x03);
    let bp = buf.as_mut_ptr();
    let st64 = |at: usize, v: u64| std::ptr::write_unaligned(bp.add(at) as *mut u64, v);
    for i in 0..R.min(rows - r0) {
        let row = w.as_ptr().add((r0 + i) * rb);
        for b in 0..nb {
            let wb = row.add(b * Q6_WB);
            let out = b * Q6_STRIP_BLOCK;
            for h in 0..2 {
                let l1 = _mm256_loadu_si256(wb.add(64 * h) as *const __m256i);
                let l2 = _mm256_loadu_si256(wb.add(64 * h + 32) as *const __m256i);
                let hh = _mm256_loadu_si256(wb.add(128 + 32 * h) as *const __m256i);
                let hb = |k: i32| {
                    let v = match k {
                        0 => hh,
                        1 => _mm256_srli_epi16(hh, 2),
                        2 => _mm256_srli_epi16(hh, 4),
                        _ => _mm256_srli_epi16(hh, 6),
                    };
                    _mm256_slli_epi16(_mm256_and_si256(v, m3), 4)
                };
                let q = [
                    _mm256_or_si256(_mm256_and_si256(l1, m4), hb(0)),
                    _mm256_or_si256(_mm256_and_si256(l2, m4), hb(1)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), hb(2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m4), hb(3)),
                ];
                for (k, v) in q.iter().enumerate() {
                    let mut qq = [0u64; 4];
                    _mm256_storeu_si256(qq.as_mut_ptr() as *mut __m256i, *v);
                    let v0 = (128 * h + 32 * k) / 8;
                    for (j, &qj) in qq.iter().enumerate() {
                        st64(out + (v0 + j) * 64 + 8 * i, qj);
                    }
                }
            }
            let sc: [i8; 16] = std::ptr::read_unaligned(wb.add(192) as *const [i8; 16]);
            for g in 0..16 {
                st64(
                    out + Q6_SC_OFF + 64 * g + 8 * i,
                    (sc[g] as i32 as u32 as u64) * 0x1_0000_0001,
                );
            }
            let h16 = |x: i8| x as i16 as u16 as u64;
            for p in 0..4 {
                let v = h16(sc[2 * p])
                    | h16(sc[2 * p + 1]) << 16
                    | h16(sc[8 + 2 * p]) << 32
                    | h16(sc[9 + 2 * p]) << 48;
                st64(out + Q6_O_OFF + 64 * p + 8 * i, v);
            }
            let d = super::avx2::f16_at(wb.add(208)).to_bits() as u64;
            st64(out + Q6_D_OFF + 8 * i, d * 0x1_0000_0001);
        }
    }
}

/// One Q6_K strip of `nb` blocks · `N` tokens, as [`strip`].
#[inline(always)]
unsafe fn strip_q6<const N: usize>(
    p: *const u8,
    nb: usize,
    a: *const u8,
    st: usize,
) -> [[f32; R]; N] {
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); N];
    for b in 0..nb {
        let sp = p.add(b * Q6_STRIP_BLOCK);
        let ab = a.add(b * AB);
        let mut isum = [zero; N];
        for g in 0..16 {
            let mut sub = [zero; N];
            for jj in 0..2 {
                let v = 2 * g + jj;
                let wv = _mm512_loadu_si512(sp.add(v * 64) as *const _);
                for t in 0..N {
                    let q = std::ptr::read_unaligned(ab.add(t * st + 4 + 8 * v) as *const i64);
                    sub[t] = _mm512_dpbusd_epi32(sub[t], wv, _mm512_set1_epi64(q));
                }
            }
            let sc = _mm512_loadu_si512(sp.add(Q6_SC_OFF + 64 * g) as *const _);
            for t in 0..N {
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sub[t], sc));
            }
        }
        let o: [__m512i; 4] =
            std::array::from_fn(|k| _mm512_loadu_si512(sp.add(Q6_O_OFF + 64 * k) as *const _));
        let dv = _mm512_loadu_ps(sp.add(Q6_D_OFF) as *const f32);
        for t in 0..N {
            let at = ab.add(t * st);
            let lo = _mm_loadu_si128(at.add(260) as *const __m128i);
            let hi = _mm_loadu_si128(at.add(276) as *const __m128i);
            // u32 units (bsum pairs): (u0, u4, u1, u5) and (u2, u6, u3, u7).
            let pl = _mm_unpacklo_epi32(lo, hi);
            let ph = _mm_unpackhi_epi32(lo, hi);
            let mut mn = _mm512_dpwssd_epi32(zero, o[0], _mm512_broadcastq_epi64(pl));
            mn = _mm512_dpwssd_epi32(
                mn,
                o[1],
                _mm512_broadcastq_epi64(_mm_unpackhi_epi64(pl, pl)),
            );
            mn = _mm512_dpwssd_epi32(mn, o[2], _mm512_broadcastq_epi64(ph));
            mn = _mm512_dpwssd_epi32(
                mn,
                o[3],
                _mm512_broadcastq_epi64(_mm_unpackhi_epi64(ph, ph)),
            );
            let tot = _mm512_sub_epi32(isum[t], _mm512_slli_epi32(mn, 5));
            let da = _mm512_set1_ps(std::ptr::read_unaligned(at as *const f32));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(dv, da), acc[t]);
        }
    }
    let mut out = [[0.0f32; R]; N];
    for t in 0..N {
        let mut v = [0.0f32; 16];
        _mm512_storeu_ps(v.as_mut_ptr(), acc[t]);
        for i in 0..R {
            out[t][i] = v[2 * i] + v[2 * i + 1];
        }
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn strip_n_q6(
    p: *const u8,
    nb: usize,
    a: *const u8,
    st: usize,
    nt: usize,
    out: &mut [[f32; R]; T],
) {
    macro_rules! go {
        ($n:literal) => {{
            let o = strip_q6::<$n>(p, nb, a, st);
            out[..$n].copy_from_slice(&o);
        }};
    }
    match nt {
        1 => go!(1),
        2 => go!(2),
        3 => go!(3),
        4 => go!(4),
        5 => go!(5),
        6 => go!(6),
        7 => go!(7),
        _ => go!(8),
    }
}
