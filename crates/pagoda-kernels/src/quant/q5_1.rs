//! Q5_1: 32 weights as 5-bit codes with an f16 scale and an f16 minimum; dot partner Q8_1.
//!
//! ```text
//! #[repr(C)] struct block_q5_1 { d: f16, m: f16, qh: [u8; 4] /* u32 LE */, qs: [u8; 16] }   // 24 bytes
//! x[j]      = d * ((qs[j] & 0x0F) | bit(qh, j)      << 4) + m      j in 0..16
//! x[j + 16] = d * ((qs[j] >> 4)   | bit(qh, j + 16) << 4) + m
//! ```

use super::{f16_le, f16_to_le, Block, BlockQ8_1, VecDot};
use crate::GgmlType;

/// One Q5_1 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

impl BlockQ5_1 {
    /// The 32 codes `0..32` in element order.
    #[inline]
    pub fn codes(&self) -> [u8; 32] {
        let qh = u32::from_le_bytes(self.qh);
        let mut q = [0u8; 32];
        for j in 0..16 {
            q[j] = (self.qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
            q[j + 16] = (self.qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        }
        q
    }
}

// SAFETY: repr(C) of byte arrays, 24 bytes.
unsafe impl Block for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const N: usize = 32;
    const BYTES: usize = 24;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        let m = f16_le(self.m);
        for (o, q) in out.iter_mut().zip(self.codes()) {
            *o = d * q as f32 + m;
        }
    }

    fn quantize(x: &[f32]) -> Option<Self> {
        let x = &x[..32];
        let min = x.iter().copied().fold(f32::INFINITY, f32::min);
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        let mut qh = 0u32;
        for j in 0..16 {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(31) as u8;
            let q1 = (((x[j + 16] - min) * id + 0.5) as i8).min(31) as u8;
            qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
            qh |= (((q0 >> 4) & 1) as u32) << j;
            qh |= (((q1 >> 4) & 1) as u32) << (j + 16);
        }
        Some(BlockQ5_1 {
            d: f16_to_le(d),
            m: f16_to_le(min),
            qh: qh.to_le_bytes(),
            qs,
        })
    }
}

impl VecDot for BlockQ5_1 {
    type Partner = BlockQ8_1;

    fn vec_dot(w: &[Self], a: &[BlockQ8_1]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let q = w.codes();
            let mut sumi = 0i32;
            for j in 0..32 {
                sumi += q[j] as i32 * a.qs[j] as i8 as i32;
            }
            sum += sumi as f32 * (f16_le(w.d) * f16_le(a.d)) + f16_le(w.m) * f16_le(a.s);
        }
        sum
    }
}
