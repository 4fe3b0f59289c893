//! AVX2+F16C and AVX-512 bodies of the paged-attention decode primitives ([`DecodeOps`]),
//! and the `#[target_feature]` entry points that inline the generic decode driver over them.
//!
//! The two GQA kernels keep every query head of a sub-group in registers at once:
//! - scores: 4 key rows x `G` heads of accumulators; each key chunk is loaded (f16 widened
//!   by `vcvtph2ps`) once and FMA'd against every head's query chunk; four row sums are
//!   reduced together (`hadd`).
//! - accumulate: `G` heads x `U` registers of output columns stay in registers across all
//!   rows of a segment; each value chunk is loaded (widened) once and FMA'd with each head's
//!   probability broadcast.
//!
//! The bodies are written once over [`Simd`] (8 or 16 f32 lanes) and [`Elem`] (f16, f32 or
//! FP8 E4M3 storage: a code `s eeee mmm` becomes the f16 `s 0eeee mmm0000000` times 2^8, exact
//! for every code, subnormals included, widened by `vcvtph2ps`; the NaN codes become NaN); sub-group sizes are chosen so accumulators, loaded rows and the query / broadcast
//! operand fit the register file (16 ymm, 32 zmm).
//!
//! Invariant: the entry points are reached only through `paged_attention`'s `decode_fn` for an
//! ISA found available; every primitive checks its slice lengths (`check_scores`,
//! `check_accumulate`, `Rows::new`) before reading through raw pointers, so the only
//! precondition left to `unsafe` is the CPU.
//!
//! `exp` is the Cephes `expf` polynomial (range reduction by `ln 2` split in two constants,
//! degree-6 polynomial, `2^n` by exponent arithmetic): within 2 ulp of libm for the
//! arguments attention gives it (`<= 0`); arguments below `ln(f32::MIN_POSITIVE)` give 0.

use std::arch::x86_64::*;

use half::f16;

use crate::fp8::E4m3;
use crate::kv_blocks::BlockRows;
use crate::paged_attention::decode::{
    check_accumulate, check_scores, decode_group, DecodeArgs, DecodeOps, DecodeScratch, Rows,
};

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this, `exp` underflows f32's normal range; such lanes are set to 0.
const EXP_MIN: f32 = -87.336_55;
const EXP_MAX: f32 = 88.0;
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// AVX2 + FMA + F16C, 8 lanes.
#[derive(Clone, Copy)]
pub(crate) struct Avx2;
/// AVX-512 F/BW/VL, 16 lanes, masked tails.
#[derive(Clone, Copy)]
pub(crate) struct Avx512;

/// The AVX2 decode task.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `a` passed `paged_attention`'s validation.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn decode_avx2(a: &DecodeArgs<'_>, sc: &mut DecodeScratch) {
    // SAFETY: the features Avx2's primitives use are enabled here (caller's contract).
    unsafe { decode_group::<Avx2>(a, sc) }
}

/// The AVX-512 decode task.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL plus the AVX2 set; `a` passed validation.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn decode_avx512(a: &DecodeArgs<'_>, sc: &mut DecodeScratch) {
    // SAFETY: as above.
    unsafe { decode_group::<Avx512>(a, sc) }
}

/// The AVX2 row softmax (attention's GEMM path).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn softmax_avx2(x: &mut [f32]) {
    // SAFETY: as decode_avx2.
    unsafe { softmax::<Avx2>(x) }
}

/// The AVX-512 row softmax.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL plus the AVX2 set.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn softmax_avx512(x: &mut [f32]) {
    // SAFETY: as decode_avx512.
    unsafe { softmax::<Avx512>(x) }
}

/// `x = softmax(x)`, as `ops::softmax_inplace` (unchanged when every value is `-inf`).
///
/// # Safety
/// `S`'s ISA is available.
#[inline(always)]
unsafe fn softmax<S: Tuning>(x: &mut [f32]) {
    // SAFETY: the ISA is available (caller); vectors at i + l <= len only.
    unsafe {
        let max = <S as DecodeOps>::max(x);
        if max == f32::NEG_INFINITY {
            return;
        }
        let inv = S::splat(1.0 / S::exp_sum(x, max));
        let (n, l, p) = (x.len(), S::LANES, x.as_mut_ptr());
        let mut i = 0;
        while i + l <= n {
            S::store(p.add(i), S::mul(S::load(p.add(i), l), inv), l);
            i += l;
        }
        if i < n {
            S::store(p.add(i), S::mul(S::load(p.add(i), n - i), inv), n - i);
        }
    }
}

// ------------------------------------------------------------------------ vector layer

/// The f32 vector operations the GQA kernels are written over.
///
/// # Safety
/// Every method needs the ISA's CPU features; pointers must be valid for the `n` lanes named.
pub(crate) trait Simd: Copy {
    type V: Copy;
    const LANES: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    /// `n <= LANES` f32 from `p`, zeros above.
    unsafe fn load(p: *const f32, n: usize) -> Self::V;
    /// `n <= LANES` f16 from `p` widened, zeros above.
    unsafe fn load_f16(p: *const f16, n: usize) -> Self::V;
    /// `n <= LANES` E4M3 codes from `p` as their exact values, zeros above.
    unsafe fn load_e4m3(p: *const E4m3, n: usize) -> Self::V;
    /// The low `n <= LANES` lanes to `p`.
    unsafe fn store(p: *mut f32, v: Self::V, n: usize);
    /// `a * b + c`.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `c - a * b`.
    unsafe fn fnmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// Round to the nearest integer (ties to even).
    unsafe fn round(a: Self::V) -> Self::V;
    /// `y * 2^n` for integral `n` in `-126..=127`.
    unsafe fn ldexp(y: Self::V, n: Self::V) -> Self::V;
    /// `v` where `x >= limit`, else 0 (also where `x` is NaN).
    unsafe fn keep_ge(x: Self::V, limit: Self::V, v: Self::V) -> Self::V;
    /// The lane sums of four vectors.
    unsafe fn hsum4(v: [Self::V; 4]) -> [f32; 4];
    unsafe fn hsum(v: Self::V) -> f32;
    unsafe fn hmax(v: Self::V) -> f32;
}

/// A storage element type the kernels read.
pub(crate) trait Elem: Copy {
    /// # Safety
    /// As [`Simd::load`].
    unsafe fn load<S: Simd>(p: *const Self, n: usize) -> S::V;
}

impl Elem for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const f32, n: usize) -> S::V {
        // SAFETY: forwarded contract.
        unsafe { S::load(p, n) }
    }
}

impl Elem for f16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const f16, n: usize) -> S::V {
        // SAFETY: forwarded contract.
        unsafe { S::load_f16(p, n) }
    }
}

impl Elem for E4m3 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const E4m3, n: usize) -> S::V {
        // SAFETY: forwarded contract.
        unsafe { S::load_e4m3(p, n) }
    }
}

/// `E4M3 code · 2^8` as f16 bits (`w`: 8 codes zero-extended to 16-bit lanes): the exponent
/// and mantissa move to the top of f16's (bias 15 = 7 + 8), the NaN codes to f16's NaN.
#[inline(always)]
unsafe fn e4m3_f16_bits_128(w: __m128i) -> __m128i {
    let sign = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8);
    let mag = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7F)), 7);
    let nan = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7F << 7));
    let mag = _mm_blendv_epi8(mag, _mm_set1_epi16(0x7E00), nan);
    _mm_or_si128(sign, mag)
}

/// As [`e4m3_f16_bits_128`] for 16 codes.
#[inline(always)]
unsafe fn e4m3_f16_bits_256(w: __m256i) -> __m256i {
    let sign = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
    let mag = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), 7);
    let nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F << 7));
    let mag = _mm256_mask_mov_epi16(mag, nan, _mm256_set1_epi16(0x7E00));
    _mm256_or_si256(sign, mag)
}

/// Four 8-lane sums at once.
#[inline(always)]
unsafe fn hsum4_256(a: [__m256; 4]) -> [f32; 4] {
    let h01 = _mm256_hadd_ps(a[0], a[1]);
    let h23 = _mm256_hadd_ps(a[2], a[3]);
    let h = _mm256_hadd_ps(h01, h23);
    let s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    let mut out = [0.0f32; 4];
    // SAFETY: out holds 4 floats.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), s) };
    out
}

impl Simd for Avx2 {
    type V = __m256;
    const LANES: usize = 8;

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }

    #[inline(always)]
    unsafe fn load(p: *const f32, n: usize) -> __m256 {
        // SAFETY (both arms): the caller guarantees n lanes at p; maskload reads no more.
        if n == 8 {
            unsafe { _mm256_loadu_ps(p) }
        } else {
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lanes);
            unsafe { _mm256_maskload_ps(p, m) }
        }
    }

    #[inline(always)]
    unsafe fn load_f16(p: *const f16, n: usize) -> __m256 {
        if n == 8 {
            // SAFETY: 8 f16 at p (caller).
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        } else {
            let mut buf = [0u16; 8];
            // SAFETY: n <= 8 f16 at p (caller) into an 8-element buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(p as *const u16, buf.as_mut_ptr(), n);
                _mm256_cvtph_ps(_mm_loadu_si128(buf.as_ptr() as *const __m128i))
            }
        }
    }

    #[inline(always)]
    unsafe fn load_e4m3(p: *const E4m3, n: usize) -> __m256 {
        let bytes = if n == 8 {
            // SAFETY: 8 codes at p (caller).
            unsafe { _mm_loadl_epi64(p as *const __m128i) }
        } else {
            let mut buf = [0u8; 16];
            // SAFETY: n <= 8 codes at p (caller) into a 16-byte buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(p as *const u8, buf.as_mut_ptr(), n);
                _mm_loadu_si128(buf.as_ptr() as *const __m128i)
            }
        };
        // SAFETY: register operations of the enabled ISA.
        unsafe {
            let h = e4m3_f16_bits_128(_mm_cvtepu8_epi16(bytes));
            _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0))
        }
    }

    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256, n: usize) {
        // SAFETY (both arms): n lanes at p (caller); maskstore writes no more.
        if n == 8 {
            unsafe { _mm256_storeu_ps(p, v) }
        } else {
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lanes);
            unsafe { _mm256_maskstore_ps(p, m, v) }
        }
    }

    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }

    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }

    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }

    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }

    #[inline(always)]
    unsafe fn fnmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fnmadd_ps(a, b, c)
    }

    #[inline(always)]
    unsafe fn min(a: __m256, b: __m256) -> __m256 {
        _mm256_min_ps(a, b)
    }

    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        _mm256_max_ps(a, b)
    }

    #[inline(always)]
    unsafe fn round(a: __m256) -> __m256 {
        _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
    }

    #[inline(always)]
    unsafe fn ldexp(y: __m256, n: __m256) -> __m256 {
        // 2^n as a normal number's exponent bits.
        let e = _mm256_slli_epi32(
            _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
            23,
        );
        _mm256_mul_ps(y, _mm256_castsi256_ps(e))
    }

    #[inline(always)]
    unsafe fn keep_ge(x: __m256, limit: __m256, v: __m256) -> __m256 {
        _mm256_and_ps(_mm256_cmp_ps(x, limit, _CMP_GE_OQ), v)
    }

    #[inline(always)]
    unsafe fn hsum4(v: [__m256; 4]) -> [f32; 4] {
        // SAFETY: same features.
        unsafe { hsum4_256(v) }
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: same features.
        unsafe { super::avx2::hsum(v) }
    }

    #[inline(always)]
    unsafe fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }
}

/// Lanes `0..k` of a 16-lane mask (`k <= 16`).
#[inline(always)]
fn mask16(k: usize) -> __mmask16 {
    ((1u32 << k) - 1) as __mmask16
}

/// The 8-lane half sums of a 16-lane vector.
#[inline(always)]
unsafe fn fold512(v: __m512) -> __m256 {
    _mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)),
    )
}

impl Simd for Avx512 {
    type V = __m512;
    const LANES: usize = 16;

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }

    #[inline(always)]
    unsafe fn load(p: *const f32, n: usize) -> __m512 {
        // SAFETY: n lanes at p (caller); masked-off lanes are not read.
        unsafe { _mm512_maskz_loadu_ps(mask16(n), p) }
    }

    #[inline(always)]
    unsafe fn load_f16(p: *const f16, n: usize) -> __m512 {
        // SAFETY: as above.
        unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(n), p as *const i16)) }
    }

    #[inline(always)]
    unsafe fn load_e4m3(p: *const E4m3, n: usize) -> __m512 {
        // SAFETY: n codes at p (caller); masked-off bytes are not read.
        unsafe {
            let bytes = _mm_maskz_loadu_epi8(mask16(n), p as *const i8);
            let h = e4m3_f16_bits_256(_mm256_cvtepu8_epi16(bytes));
            _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0))
        }
    }

    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512, n: usize) {
        // SAFETY: as above; masked-off lanes are not written.
        unsafe { _mm512_mask_storeu_ps(p, mask16(n), v) }
    }

    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }

    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }

    #[inline(always)]
    unsafe fn hsum4(v: [__m512; 4]) -> [f32; 4] {
        // Interleave-and-add twice: each 128-bit lane then holds that lane's partial sums of
        // v0..v3; then add the four lanes.
        let r01 = _mm512_add_ps(
            _mm512_unpacklo_ps(v[0], v[1]),
            _mm512_unpackhi_ps(v[0], v[1]),
        );
        let r23 = _mm512_add_ps(
            _mm512_unpacklo_ps(v[2], v[3]),
            _mm512_unpackhi_ps(v[2], v[3]),
        );
        let (a, b) = (_mm512_castps_pd(r01), _mm512_castps_pd(r23));
        let r = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        );
        let h = fold512(r);
        let s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        let mut out = [0.0f32; 4];
        // SAFETY: out holds 4 floats.
        unsafe { _mm_storeu_ps(out.as_mut_ptr(), s) };
        out
    }

    #[inline(always)]
    unsafe fn hsum(v: __m512) -> f32 {
        _mm512_reduce_add_ps(v)
    }

    #[inline(always)]
    unsafe fn hmax(v: __m512) -> f32 {
        _mm512_reduce_max_ps(v)
    }

    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }

    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }

    #[inline(always)]
    unsafe fn fnmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fnmadd_ps(a, b, c)
    }

    #[inline(always)]
    unsafe fn min(a: __m512, b: __m512) -> __m512 {
        _mm512_min_ps(a, b)
    }

    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        _mm512_max_ps(a, b)
    }

    #[inline(always)]
    unsafe fn round(a: __m512) -> __m512 {
        _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
    }

    #[inline(always)]
    unsafe fn ldexp(y: __m512, n: __m512) -> __m512 {
        _mm512_scalef_ps(y, n)
    }

    #[inline(always)]
    unsafe fn keep_ge(x: __m512, limit: __m512, v: __m512) -> __m512 {
        _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, limit, _CMP_GE_OQ), v)
    }
}

// ------------------------------------------------------------------------- GQA kernels

/// The operands of a scores pass over one sub-group of heads (bounds checked by the caller).
#[derive(Clone, Copy)]
struct ScoreOps<E> {
    /// The sub-group's query heads, `[G, hd]`.
    q: *const f32,
    hd: usize,
    /// Key row `i` at `k + i * stride`.
    k: *const E,
    stride: usize,
    scale: f32,
    /// Score of head `g`, row `i` at `out + g * out_stride + i`.
    out: *mut f32,
    out_stride: usize,
}

impl<E> ScoreOps<E> {
    /// The same pass starting at row `i`.
    ///
    /// # Safety
    /// Row `i` and its outputs are in bounds.
    #[inline(always)]
    unsafe fn at_row(self, i: usize) -> Self {
        // SAFETY: in bounds (caller).
        unsafe {
            ScoreOps {
                k: self.k.add(i * self.stride),
                out: self.out.add(i),
                ..self
            }
        }
    }
}

/// `out[g * out_stride + i] = scale * q_g · k_i` for `G` heads and the first `R` rows of
/// `o`, `R` in 1 or 4.
///
/// # Safety
/// `S`'s ISA is available; `q`, the `R` rows of `hd` values and the outputs are in bounds.
#[inline(always)]
unsafe fn scores_rows<S: Simd, E: Elem, const G: usize, const R: usize>(o: ScoreOps<E>) {
    let l = S::LANES;
    // SAFETY (whole body): columns < hd of the G query heads and of the R rows (caller).
    unsafe {
        let mut acc = [[S::zero(); R]; G];
        let mut c = 0;
        while c + l <= o.hd {
            score_step::<S, E, G, R>(&mut acc, &o, c, l);
            c += l;
        }
        if c < o.hd {
            score_step::<S, E, G, R>(&mut acc, &o, c, o.hd - c);
        }
        for (g, a) in acc.iter().enumerate() {
            let out = o.out.add(g * o.out_stride);
            if R == 4 {
                let s = S::hsum4([a[0], a[1 % R], a[2 % R], a[3 % R]]);
                for r in 0..4 {
                    *out.add(r) = s[r] * o.scale;
                }
            } else {
                for r in 0..R {
                    *out.add(r) = S::hsum(a[r]) * o.scale;
                }
            }
        }
    }
}

/// One column chunk (`c..c + n`) of [`scores_rows`]. (A function, not a closure: closures
/// do not inherit `#[target_feature]`, so their intrinsics would not inline.)
///
/// # Safety
/// As [`scores_rows`].
#[inline(always)]
unsafe fn score_step<S: Simd, E: Elem, const G: usize, const R: usize>(
    acc: &mut [[S::V; R]; G],
    o: &ScoreOps<E>,
    c: usize,
    n: usize,
) {
    // SAFETY: columns c..c + n < hd of the G heads and R rows (caller).
    unsafe {
        let mut kv = [S::zero(); R];
        for (r, x) in kv.iter_mut().enumerate() {
            *x = E::load::<S>(o.k.add(r * o.stride + c), n);
        }
        for (g, a) in acc.iter_mut().enumerate() {
            let qv = S::load(o.q.add(g * o.hd + c), n);
            for r in 0..R {
                a[r] = S::fma(qv, kv[r], a[r]);
            }
        }
    }
}

/// [`scores_rows`] over `rows` rows for a sub-group of `G` heads.
///
/// # Safety
/// As [`scores_rows`], for all `rows` rows.
#[inline(always)]
unsafe fn scores_group<S: Simd, E: Elem, const G: usize>(o: ScoreOps<E>, rows: usize) {
    let mut i = 0;
    // SAFETY: rows i.. < rows and their outputs (caller).
    unsafe {
        while i + 4 <= rows {
            scores_rows::<S, E, G, 4>(o.at_row(i));
            i += 4;
        }
        while i < rows {
            scores_rows::<S, E, G, 1>(o.at_row(i));
            i += 1;
        }
    }
}

/// The operands of an accumulate pass over one sub-group of heads (bounds checked by the
/// caller).
#[derive(Clone, Copy)]
struct AccOps<E> {
    /// The sub-group's accumulators, `[G, hd]`, and their rescale factors `[G]`.
    acc: *mut f32,
    hd: usize,
    c: *const f32,
    /// Probability of head `g`, row `i` at `p + g * p_stride + i`.
    p: *const f32,
    p_stride: usize,
    /// Value row `i` at `v + i * stride`, `i < rows`.
    v: *const E,
    stride: usize,
    rows: usize,
}

/// `acc_g[d..] = c_g * acc_g + Σ_i p_g[i] * v_i[d..]` for `G` heads over the columns of `U`
/// vectors from `d`, each using its first `n <= LANES` lanes (`n = LANES` but in the tail).
///
/// # Safety
/// `S`'s ISA is available; the columns, rows and probabilities named are in bounds.
#[inline(always)]
unsafe fn accumulate_cols<S: Simd, E: Elem, const G: usize, const U: usize>(
    o: &AccOps<E>,
    d: usize,
    n: usize,
) {
    let l = S::LANES;
    // SAFETY (whole body): columns d + u*l + (0..n) < hd of G heads' acc and of every row.
    unsafe {
        let mut a = [[S::zero(); U]; G];
        for (g, ag) in a.iter_mut().enumerate() {
            let cg = S::splat(*o.c.add(g));
            for (u, x) in ag.iter_mut().enumerate() {
                *x = S::mul(S::load(o.acc.add(g * o.hd + d + u * l), n), cg);
            }
        }
        for i in 0..o.rows {
            let mut vv = [S::zero(); U];
            for (u, x) in vv.iter_mut().enumerate() {
                *x = E::load::<S>(o.v.add(i * o.stride + d + u * l), n);
            }
            for (g, ag) in a.iter_mut().enumerate() {
                let pg = S::splat(*o.p.add(g * o.p_stride + i));
                for u in 0..U {
                    ag[u] = S::fma(pg, vv[u], ag[u]);
                }
            }
        }
        for (g, ag) in a.iter().enumerate() {
            for (u, x) in ag.iter().enumerate() {
                S::store(o.acc.add(g * o.hd + d + u * l), *x, n);
            }
        }
    }
}

/// [`accumulate_cols`] over all `hd` columns for a sub-group of `G` heads.
///
/// # Safety
/// As [`accumulate_cols`], for every column.
#[inline(always)]
unsafe fn accumulate_group<S: Simd, E: Elem, const G: usize, const U: usize>(o: AccOps<E>) {
    let l = S::LANES;
    let mut d = 0;
    // SAFETY: every call names columns below hd (caller: all columns valid).
    unsafe {
        while d + U * l <= o.hd {
            accumulate_cols::<S, E, G, U>(&o, d, l);
            d += U * l;
        }
        while d < o.hd {
            accumulate_cols::<S, E, G, 1>(&o, d, (o.hd - d).min(l));
            d += l;
        }
    }
}

/// Runs `$body` with the const `$g` bound to `$n` (1..=6).
macro_rules! with_heads {
    ($n:expr, $g:ident => $body:expr) => {
        match $n {
            1 => {
                const $g: usize = 1;
                $body
            }
            2 => {
                const $g: usize = 2;
                $body
            }
            3 => {
                const $g: usize = 3;
                $body
            }
            4 => {
                const $g: usize = 4;
                $body
            }
            5 => {
                const $g: usize = 5;
                $body
            }
            _ => {
                const $g: usize = 6;
                $body
            }
        }
    };
}

/// Heads per sub-group and column registers of one ISA's kernels.
trait Tuning: Simd {
    /// Most heads of a scores pass (4 rows x G accumulators + 4 rows + 1 query register).
    const SCORE_HEADS: usize;
    /// Most heads of an accumulate pass (G x `ACC_COLS` accumulators + `ACC_COLS` value
    /// registers + 1 broadcast).
    const ACC_HEADS: usize;
}

/// Column registers of an accumulate pass.
const ACC_COLS: usize = 4;

impl Tuning for Avx2 {
    const SCORE_HEADS: usize = 2;
    const ACC_HEADS: usize = 2;
}

impl Tuning for Avx512 {
    const SCORE_HEADS: usize = 6;
    const ACC_HEADS: usize = 6;
}

/// Splits `heads` into passes of at most `max`, as even as possible: (first head, count).
#[inline(always)]
fn passes(heads: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = heads.div_ceil(max);
    let base = heads.checked_div(n).unwrap_or(0);
    let extra = heads.checked_rem(n).unwrap_or(0);
    (0..n).scan(0, move |g0, j| {
        let cnt = base + usize::from(j < extra);
        let at = *g0;
        *g0 += cnt;
        Some((at, cnt))
    })
}

// ------------------------------------------------------------------------------- exp

/// `exp(x)` per lane (see the module docs).
///
/// # Safety
/// `S`'s ISA is available.
#[inline(always)]
unsafe fn exp<S: Simd>(x: S::V) -> S::V {
    // SAFETY (whole body): register operations of an available ISA.
    unsafe {
        let lo = S::splat(EXP_MIN);
        let xc = S::min(S::max(x, lo), S::splat(EXP_MAX));
        let n = S::round(S::mul(xc, S::splat(LOG2E)));
        let r = S::fnmadd(n, S::splat(LN2_HI), xc);
        let r = S::fnmadd(n, S::splat(LN2_LO), r);
        let mut p = S::splat(P[0]);
        for &c in &P[1..] {
            p = S::fma(p, r, S::splat(c));
        }
        let y = S::add(S::fma(p, S::mul(r, r), r), S::splat(1.0));
        S::keep_ge(x, lo, S::ldexp(y, n))
    }
}

/// Most lanes of any [`Simd`]: the padded tail buffers.
const MAX_LANES: usize = 16;

// ---------------------------------------------------------------------- DecodeOps impl

impl<S: Tuning> DecodeOps for S {
    #[inline(always)]
    unsafe fn scores(
        q: &[f32],
        hd: usize,
        k: Rows<'_>,
        scale: f32,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let heads = check_scores(q, hd, &k, out, out_stride);
        let (rows, stride) = (k.rows(), k.stride());
        if rows == 0 {
            return;
        }
        for (g0, cnt) in passes(heads, S::SCORE_HEADS) {
            let (q, out) = (q[g0 * hd..].as_ptr(), out[g0 * out_stride..].as_mut_ptr());
            // SAFETY: the ISA is available (caller); check_scores and Rows::new bound every
            // row, head and output the kernels touch.
            unsafe {
                match k.data() {
                    BlockRows::F16(d) => {
                        let o = ScoreOps {
                            q,
                            hd,
                            k: d.as_ptr(),
                            stride,
                            scale,
                            out,
                            out_stride,
                        };
                        with_heads!(cnt, G => scores_group::<S, f16, G>(o, rows))
                    }
                    BlockRows::F32(d) => {
                        let o = ScoreOps {
                            q,
                            hd,
                            k: d.as_ptr(),
                            stride,
                            scale,
                            out,
                            out_stride,
                        };
                        with_heads!(cnt, G => scores_group::<S, f32, G>(o, rows))
                    }
                    BlockRows::Fp8(d) => {
                        let o = ScoreOps {
                            q,
                            hd,
                            k: d.as_ptr(),
                            stride,
                            scale,
                            out,
                            out_stride,
                        };
                        with_heads!(cnt, G => scores_group::<S, E4m3, G>(o, rows))
                    }
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn max(x: &[f32]) -> f32 {
        let (n, l) = (x.len(), S::LANES);
        // SAFETY (whole body): full vectors at i + l <= n only.
        unsafe {
            let mut m = S::splat(f32::NEG_INFINITY);
            let mut i = 0;
            while i + l <= n {
                m = S::max(m, S::load(x.as_ptr().add(i), l));
                i += l;
            }
            x[i..].iter().copied().fold(S::hmax(m), f32::max)
        }
    }

    #[inline(always)]
    unsafe fn exp_sum(x: &mut [f32], max: f32) -> f32 {
        let (n, l) = (x.len(), S::LANES);
        let p = x.as_mut_ptr();
        // SAFETY (whole body): full vectors at i + l <= n; the tail goes through a padded
        // buffer of MAX_LANES >= l floats.
        unsafe {
            let m = S::splat(max);
            let mut sum = S::zero();
            let mut i = 0;
            while i + l <= n {
                let e = exp::<S>(S::sub(S::load(p.add(i), l), m));
                S::store(p.add(i), e, l);
                sum = S::add(sum, e);
                i += l;
            }
            if i < n {
                // Padding lanes are -inf: exp gives 0.
                let mut buf = [f32::NEG_INFINITY; MAX_LANES];
                buf[..n - i].copy_from_slice(&x[i..]);
                let e = exp::<S>(S::sub(S::load(buf.as_ptr(), l), m));
                S::store(buf.as_mut_ptr(), e, l);
                sum = S::add(sum, e);
                x[i..].copy_from_slice(&buf[..n - i]);
            }
            S::hsum(sum)
        }
    }

    #[inline(always)]
    unsafe fn accumulate(
        acc: &mut [f32],
        hd: usize,
        c: &[f32],
        p: &[f32],
        p_stride: usize,
        v: Rows<'_>,
    ) {
        let heads = check_accumulate(acc, hd, c, p, p_stride, &v);
        let (rows, stride) = (v.rows(), v.stride());
        if rows == 0 {
            return;
        }
        for (g0, cnt) in passes(heads, S::ACC_HEADS) {
            let acc = acc[g0 * hd..].as_mut_ptr();
            let c = c[g0..].as_ptr();
            let p = p[g0 * p_stride..].as_ptr();
            // SAFETY: as in `scores` (check_accumulate, Rows::new).
            unsafe {
                match v.data() {
                    BlockRows::F16(d) => {
                        let o = AccOps {
                            acc,
                            hd,
                            c,
                            p,
                            p_stride,
                            v: d.as_ptr(),
                            stride,
                            rows,
                        };
                        with_heads!(cnt, G => accumulate_group::<S, f16, G, ACC_COLS>(o))
                    }
                    BlockRows::F32(d) => {
                        let o = AccOps {
                            acc,
                            hd,
                            c,
                            p,
                            p_stride,
                            v: d.as_ptr(),
                            stride,
                            rows,
                        };
                        with_heads!(cnt, G => accumulate_group::<S, f32, G, ACC_COLS>(o))
                    }
                    BlockRows::Fp8(d) => {
                        let o = AccOps {
                            acc,
                            hd,
                            c,
                            p,
                            p_stride,
                            v: d.as_ptr(),
                            stride,
                            rows,
                        };
                        with_heads!(cnt, G => accumulate_group::<S, E4m3, G, ACC_COLS>(o))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_split_evenly_and_cover_every_head() {
        for max in 1..=6 {
            for heads in 0..20 {
                let p: Vec<_> = passes(heads, max).collect();
                assert_eq!(p.iter().map(|x| x.1).sum::<usize>(), heads);
                let mut at = 0;
                for &(g0, cnt) in &p {
                    assert_eq!(g0, at);
                    assert!(cnt <= max && (heads == 0 || cnt > 0));
                    at += cnt;
                }
            }
        }
    }
}
