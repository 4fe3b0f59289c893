//! Q4_1: 32 weights as 4-bit codes with an f16 scale and an f16 minimum; dot partner Q8_1.
//!
//! ```text
//! #[repr(C)] struct block_q4_1 { d: f16, m: f16, qs: [u8; 16] }   // 20 bytes
//! x[j]      = d * (qs[j] & 0x0F) + m      j in 0..16
//! x[j + 16] = d * (qs[j] >> 4)   + m
//! ```
//! The minimum term of the dot product is `m * s` where `s = d_a * sum(a)` is stored in Q8_1.

use super::{f16_le, f16_to_le, Block, BlockQ8_1, VecDot};
use crate::GgmlType;

/// One Q4_1 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; 16],
}

// SAFETY: repr(C) of byte arrays, 20 bytes.
unsafe impl Block for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const N: usize = 32;
    const BYTES: usize = 20;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        let m = f16_le(self.m);
        for j in 0..16 {
            out[j] = d * (self.qs[j] & 0x0F) as f32 + m;
            out[j + 16] = d * (self.qs[j] >> 4) as f32 + m;
        }
    }

    fn quantize(x: &[f32]) -> Option<Self> {
        let x = &x[..32];
        let min = x.iter().copied().fold(f32::INFINITY, f32::min);
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            qs[j] = q0 | (q1 << 4);
        }
        Some(BlockQ4_1 {
            d: f16_to_le(d),
            m: f16_to_le(min),
            qs,
        })
    }
}

impl VecDot for BlockQ4_1 {
    type Partner = BlockQ8_1;

    fn vec_dot(w: &[Self], a: &[BlockQ8_1]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let mut sumi = 0i32;
            for j in 0..16 {
                sumi += (w.qs[j] & 0x0F) as i32 * a.qs[j] as i8 as i32
                    + (w.qs[j] >> 4) as i32 * a.qs[j + 16] as i8 as i32;
            }
            sum += sumi as f32 * (f16_le(w.d) * f16_le(a.d)) + f16_le(w.m) * f16_le(a.s);
        }
        sum
    }
}
