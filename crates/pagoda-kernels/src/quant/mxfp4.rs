//! MXFP4 (OCP microscaling FP4, GGUF type 39): 32 E2M1 codes sharing one E8M0 exponent; the
//! expert weights of gpt-oss (its HF checkpoints and GGUFs store experts this way). Dot
//! partner Q8_0.
//!
//! ```text
//! #[repr(C)] struct block_mxfp4 { e: u8, qs: [u8; 16] }   // 17 bytes
//! x[j]      = KVALUES[qs[j] & 0x0F] * 2^(e - 128)      j in 0..16
//! x[j + 16] = KVALUES[qs[j] >> 4]   * 2^(e - 128)
//! ```
//!
//! [`KVALUES`] are the E2M1 values doubled (0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6 times 2), so they
//! are exact int8 numbers and the shared scale is halved to compensate (ggml's
//! `GGML_E8M0_TO_FP32_HALF`: `2^(e - 128)`, with `e = 0, 1` the subnormals 2^-128, 2^-127).
//! Because the codebook is exact in int8, the integer dot product against Q8_0 activations
//! loses nothing beyond the activations' own rounding.
//!
//! The quantizer is ggml's `quantize_row_mxfp4_ref`: `e = floor(log2(amax)) - 2 + 127` (0 for
//! a zero block) and each value takes the first codebook entry nearest to `x / 2^(e - 128)`.
//! HF checkpoints (openai/gpt-oss-*) store the same codes and exponents in another nibble
//! order: [`from_hf_block`] converts.

use super::{f16_le, Block, BlockQ8_0, VecDot};
use crate::GgmlType;

/// E2M1 values times two, indexed by the 4-bit code (bit 3 is the sign): ggml's
/// `kvalues_mxfp4`.
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// One MXFP4 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockMxfp4 {
    /// The shared E8M0 exponent (bias 127; see [`e8m0_half`]).
    pub e: u8,
    pub qs: [u8; 16],
}

/// Half the value of the E8M0 exponent `e`: `2^(e - 128)` (ggml's `GGML_E8M0_TO_FP32_HALF`,
/// bit for bit, including its two subnormal results for `e < 2`).
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// The first index of [`KVALUES`] whose value times `d` is nearest to `x` (ggml's
/// `best_index_mxfp4`; ties keep the lower index).
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (KVALUES[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// A block from the HF layout of gpt-oss checkpoints: `scale` is the same E8M0 exponent, and
/// byte `i` of `packed` holds element `2i` in its low nibble and `2i + 1` in its high one
/// (transformers' `convert_moe_packed_tensors`); ggml keeps element `j` and `j + 16` in byte `j`.
pub fn from_hf_block(scale: u8, packed: &[u8; 16]) -> BlockMxfp4 {
    let code = |k: usize| (packed[k / 2] >> (4 * (k % 2))) & 0x0F;
    let mut qs = [0u8; 16];
    for (j, q) in qs.iter_mut().enumerate() {
        *q = code(j) | (code(j + 16) << 4);
    }
    BlockMxfp4 { e: scale, qs }
}

// SAFETY: repr(C) of byte arrays, 17 bytes.
unsafe impl Block for BlockMxfp4 {
    const TYPE: GgmlType = GgmlType::Mxfp4;
    const N: usize = 32;
    const BYTES: usize = 17;

    fn dequantize(&self, out: &mut [f32]) {
        let d = e8m0_half(self.e);
        for j in 0..16 {
            out[j] = KVALUES[(self.qs[j] & 0x0F) as usize] as f32 * d;
            out[j + 16] = KVALUES[(self.qs[j] >> 4) as usize] as f32 * d;
        }
    }

    fn quantize(x: &[f32]) -> Option<Self> {
        let amax = x[..32].iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // ggml casts the float exponent to uint8; clamped here so that out-of-range blocks
        // (|x| below 2^-125 or non-finite) stay defined.
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 254.0) as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = best_index(x[j], d) | (best_index(x[j + 16], d) << 4);
        }
        Some(BlockMxfp4 { e, qs })
    }
}

impl VecDot for BlockMxfp4 {
    type Partner = BlockQ8_0;

    fn vec_dot(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let mut sumi = 0i32;
            for j in 0..16 {
                let lo = KVALUES[(w.qs[j] & 0x0F) as usize] as i32;
                let hi = KVALUES[(w.qs[j] >> 4) as usize] as i32;
                sumi += lo * a.qs[j] as i8 as i32 + hi * a.qs[j + 16] as i8 as i32;
            }
            sum += sumi as f32 * (e8m0_half(w.e) * f16_le(a.d));
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(130), 4.0);
        assert_eq!(e8m0_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(254), 2f32.powi(126));
    }

    #[test]
    fn quantize_round_trips_codebook_values_and_dequantizes_in_order() {
        // Values on the grid of e = 127 (d = 0.5): every code twice, kept exactly.
        let mut y = [0.0f32; 32];
        let x: Vec<f32> = (0..32).map(|i| KVALUES[i % 16] as f32 * 0.5).collect();
        let b = BlockMxfp4::quantize(&x).unwrap();
        assert_eq!(b.e, 127);
        b.dequantize(&mut y);
        assert_eq!(&y[..], &x[..]);
        assert_eq!(BlockMxfp4::quantize(&[0.0; 32]).unwrap().e, 0);
    }

    #[test]
    fn hf_nibble_order_becomes_ggml_order() {
        // HF: byte i = elements 2i (low), 2i + 1 (high); element k gets code k % 16.
        let mut packed = [0u8; 16];
        for (i, p) in packed.iter_mut().enumerate() {
            *p = ((2 * i) % 16) as u8 | ((((2 * i + 1) % 16) as u8) << 4);
        }
        let b = from_hf_block(128, &packed);
        let mut y = [0.0f32; 32];
        b.dequantize(&mut y);
        for (k, v) in y.iter().enumerate() {
            assert_eq!(*v, KVALUES[k % 16] as f32, "element {k}");
        }
    }

    #[test]
    fn vec_dot_matches_dequantized_product() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.1)
            .collect();
        let a: Vec<f32> = (0..64)
            .map(|i| ((i * 11 % 17) as f32 - 8.0) * 0.05)
            .collect();
        let w: Vec<BlockMxfp4> = x
            .chunks(32)
            .map(|c| BlockMxfp4::quantize(c).unwrap())
            .collect();
        let q: Vec<BlockQ8_0> = a
            .chunks(32)
            .map(|c| BlockQ8_0::quantize(c).unwrap())
            .collect();
        let mut wd = [0.0f32; 64];
        let mut ad = [0.0f32; 64];
        for (i, b) in w.iter().enumerate() {
            b.dequantize(&mut wd[32 * i..]);
        }
        for (i, b) in q.iter().enumerate() {
            b.dequantize(&mut ad[32 * i..]);
        }
        let want: f32 = wd.iter().zip(&ad).map(|(a, b)| a * b).sum();
        let got = BlockMxfp4::vec_dot(&w, &q);
        assert!(
            (got - want).abs() < 1e-4 * want.abs().max(1.0),
            "{got} vs {want}"
        );
    }
}
