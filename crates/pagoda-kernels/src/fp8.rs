//! FP8 E4M3 values: the OCP "E4M3FN" format of `__nv_fp8_e4m3`, `torch.float8_e4m3fn` and
//! vLLM's `--kv-cache-dtype fp8` (the FP8 KV cache of [`crate::kv_blocks`]).
//!
//! A code is `s eeee mmm`: sign, 4 exponent bits (bias 7), 3 mantissa bits. Exponent 0 is
//! subnormal (`m · 2^-9`); there are no infinities; `s 1111 111` (0x7F, 0xFF) are the only NaNs,
//! so the largest finite magnitude is `1.75 · 2^8 = 448` ([`E4M3_MAX`]).
//!
//! Invariants (tested exhaustively in this file against a brute-force nearest-code search):
//! - [`E4m3::from_f32`] rounds to the nearest code, ties to the even code (the one whose
//!   mantissa's last bit is 0), and saturates: every finite value beyond ±448 and ±inf become
//!   ±448, as CUDA's `__NV_SATFINITE` conversion does; NaN becomes NaN (sign kept); the sign of
//!   a zero result is kept (`-0.001` → `-0`).
//! - [`E4m3::to_f32`] is exact (every code is an f32), and `from_f32(to_f32(c)) == c` for all 256
//!   codes (the NaN codes included).
//!
//! The same two conversions are written in CUDA C in `pagoda-cuda`'s kernels (no fp8 header
//! is needed there); its tests hold them to this file's bits.

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// Smallest normal E4M3 magnitude, `2^-6`; below it the codes are subnormal, `m · 2^-9`.
const MIN_NORMAL: f32 = 0.015_625;

/// One FP8 E4M3 code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[repr(transparent)]
pub struct E4m3(pub u8);

/// The value of each of the 256 codes.
static DECODE: [f32; 256] = decode_table();

const fn decode_code(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let em = (code & 0x7F) as u32;
    if em == 0x7F {
        // A quiet NaN with the code's sign (so the code round-trips).
        return f32::from_bits(0x7FC0_0000 | ((code as u32 & 0x80) << 24));
    }
    let mag = if em < 8 {
        // Subnormal: m · 2^-9 (exact in f32).
        em as f32 / 512.0
    } else {
        // Normal: exponent E - 7 + 127 = E + 120, mantissa's 3 bits on top of f32's 23.
        f32::from_bits((em << 20) + (120 << 23))
    };
    sign * mag
}

const fn decode_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = decode_code(i as u8);
        i += 1;
    }
    t
}

impl E4m3 {
    /// The canonical NaN (positive sign).
    pub const NAN: E4m3 = E4m3(0x7F);
    /// `448`.
    pub const MAX: E4m3 = E4m3(0x7E);

    /// The nearest code to `x`, ties to even, saturating to ±448 (see the module invariants).
    #[inline]
    pub fn from_f32(x: f32) -> E4m3 {
        let bits = x.to_bits();
        let sign = ((bits >> 24) & 0x80) as u8;
        let a = f32::from_bits(bits & 0x7FFF_FFFF);
        if a.is_nan() {
            return E4m3(sign | 0x7F);
        }
        if a >= E4M3_MAX {
            return E4m3(sign | 0x7E);
        }
        if a < MIN_NORMAL {
            // Subnormal codes are the integers m = a · 2^9 (0..=8; 8 is the smallest normal,
            // whose code is 8 too). The product is exact; rounding ties to even.
            let m = (a * 512.0).round_ties_even() as u8;
            return E4m3(sign | m);
        }
        // Normal: keep 3 of f32's 23 mantissa bits, ties to even; a carry moves into the
        // exponent, which is what the next code is. a < 448, so the result is at most 448.
        let ab = a.to_bits();
        let rounded = (ab + 0x7_FFFF + ((ab >> 20) & 1)) >> 20;
        let code = rounded - (120 << 3);
        E4m3(sign | code.min(0x7E) as u8)
    }

    /// The exact value of this code (NaN for 0x7F and 0xFF).
    #[inline]
    pub fn to_f32(self) -> f32 {
        DECODE[self.0 as usize]
    }

    pub fn is_nan(self) -> bool {
        self.0 & 0x7F == 0x7F
    }
}

/// `dst[i] = src[i] · scale` (`scale` 1 is exact).
///
/// Panics if the lengths differ.
pub fn decode_scaled(src: &[E4m3], scale: f32, dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "fp8 decode: lengths differ");
    if scale == 1.0 {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    } else {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32() * scale;
        }
    }
}

/// `dst[i] = from_f32(src[i] / scale)`: the stored code of a value under a per-tensor scale
/// (division, not a multiplication by the inverse, as vLLM's and the CUDA kernel's writes).
///
/// Panics if the lengths differ.
pub fn encode_scaled(src: &[f32], scale: f32, dst: &mut [E4m3]) {
    assert_eq!(src.len(), dst.len(), "fp8 encode: lengths differ");
    if scale == 1.0 {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = E4m3::from_f32(s);
        }
    } else {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = E4m3::from_f32(s / scale);
        }
    }
}

/// A zeroed `Vec<E4m3>` of `len` codes from a zeroed allocation (calloc: pages untouched until
/// written, as the f16 storage's).
pub fn zeroed_vec(len: usize) -> Vec<E4m3> {
    let mut bytes = std::mem::ManuallyDrop::new(vec![0u8; len]);
    let (ptr, len, cap) = (bytes.as_mut_ptr(), bytes.len(), bytes.capacity());
    // SAFETY: E4m3 is repr(transparent) over u8 (same size and alignment, every bit pattern
    // valid), and the allocation's ownership moves from `bytes` (never dropped) to the result.
    unsafe { Vec::from_raw_parts(ptr.cast::<E4m3>(), len, cap) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Value of a code from the definition, in f64 (independent of `decode_code`'s bits).
    fn reference_value(code: u8) -> f64 {
        let s = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((code >> 3) & 0xF) as i32;
        let m = (code & 7) as f64;
        if e == 15 && m == 7.0 {
            return f64::NAN;
        }
        if e == 0 {
            s * m / 8.0 * 2f64.powi(-6)
        } else {
            s * (1.0 + m / 8.0) * 2f64.powi(e - 7)
        }
    }

    /// The nearest finite code by search over all of them: ties to the even mantissa,
    /// saturation beyond 448, NaN to NaN, the input's sign on zero.
    fn reference_encode(x: f32) -> u8 {
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        if x.is_nan() {
            return sign | 0x7F;
        }
        let a = (x as f64).abs();
        let mut best = 0u8;
        let mut best_err = f64::INFINITY;
        for c in 0u8..0x7F {
            let err = (reference_value(c) - a).abs();
            if err < best_err || (err == best_err && c & 1 == 0) {
                best = c;
                best_err = err;
            }
        }
        sign | best
    }

    #[test]
    fn every_code_decodes_to_its_defined_value() {
        for c in 0..=255u8 {
            let want = reference_value(c);
            let got = E4m3(c).to_f32();
            if want.is_nan() {
                assert!(got.is_nan() && E4m3(c).is_nan(), "code {c:#04x}");
            } else {
                assert_eq!(got as f64, want, "code {c:#04x}");
                assert!(!E4m3(c).is_nan());
            }
        }
        assert_eq!(E4m3::MAX.to_f32(), E4M3_MAX);
        assert_eq!(E4m3(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(E4m3(0x08).to_f32(), MIN_NORMAL);
    }

    #[test]
    fn all_256_codes_round_trip() {
        for c in 0..=255u8 {
            assert_eq!(E4m3::from_f32(E4m3(c).to_f32()), E4m3(c), "code {c:#04x}");
        }
    }

    #[test]
    fn midpoints_round_to_even_and_neighbours_to_nearest() {
        // Every pair of adjacent non-negative finite codes: the midpoint goes to the even
        // code, one f32 ulp either side to the nearer code. Both signs.
        for c in 0u8..0x7E {
            let (lo, hi) = (E4m3(c).to_f32(), E4m3(c + 1).to_f32());
            let mid = ((lo as f64 + hi as f64) / 2.0) as f32;
            assert_eq!(
                (mid as f64),
                (lo as f64 + hi as f64) / 2.0,
                "midpoint exact"
            );
            let even = if c & 1 == 0 { c } else { c + 1 };
            for s in [0u8, 0x80] {
                let sg = if s == 0 { 1.0 } else { -1.0 };
                assert_eq!(E4m3::from_f32(sg * mid).0, s | even, "midpoint {mid}");
                let below = f32::from_bits(mid.to_bits() - 1);
                let above = f32::from_bits(mid.to_bits() + 1);
                assert_eq!(E4m3::from_f32(sg * below).0, s | c, "below {mid}");
                assert_eq!(E4m3::from_f32(sg * above).0, s | (c + 1), "above {mid}");
            }
        }
    }

    #[test]
    fn saturates_at_448_and_keeps_nan_and_signed_zero() {
        for x in [
            448.0f32,
            449.0,
            463.9,
            464.0,
            480.0,
            1e6,
            f32::MAX,
            f32::INFINITY,
        ] {
            assert_eq!(E4m3::from_f32(x), E4m3::MAX, "{x}");
            assert_eq!(E4m3::from_f32(-x), E4m3(0xFE), "-{x}");
        }
        assert!(E4m3::from_f32(f32::NAN).is_nan());
        assert!(E4m3::from_f32(f32::NAN).to_f32().is_nan());
        assert_eq!(E4m3::from_f32(-0.0), E4m3(0x80));
        assert_eq!(E4m3::from_f32(-1e-4), E4m3(0x80));
        assert_eq!(E4m3::from_f32(1e-30), E4m3(0));
        // Half the smallest subnormal ties to the even code 0; just above goes to 1.
        assert_eq!(E4m3::from_f32(2f32.powi(-10)), E4m3(0));
        assert_eq!(E4m3::from_f32(2f32.powi(-10) * 1.0001), E4m3(1));
    }

    #[test]
    fn scaled_helpers_divide_then_round() {
        let src = [1.0f32, -3.0, 900.0, 0.25];
        let mut codes = [E4m3::default(); 4];
        encode_scaled(&src, 2.0, &mut codes);
        let mut back = [0.0f32; 4];
        decode_scaled(&codes, 2.0, &mut back);
        assert_eq!(back, [1.0, -3.0, 896.0, 0.25]);
        assert!(zeroed_vec(10).iter().all(|c| c.0 == 0));
    }

    proptest! {
        #[test]
        fn encoding_matches_the_nearest_code_search(bits in any::<u32>()) {
            let x = f32::from_bits(bits);
            prop_assert_eq!(E4m3::from_f32(x).0, reference_encode(x), "x = {}", x);
        }

        #[test]
        fn encoding_in_range_matches_the_search_and_bounds_the_error(x in -500.0f32..500.0) {
            let c = E4m3::from_f32(x);
            prop_assert_eq!(c.0, reference_encode(x));
            // Within half a step: relative 2^-4 for normals, absolute 2^-10 for subnormals.
            let err = (c.to_f32() - x.clamp(-E4M3_MAX, E4M3_MAX)).abs();
            prop_assert!(err <= (x.abs() / 16.0).max(2f32.powi(-10)), "x {} err {}", x, err);
        }
    }
}
