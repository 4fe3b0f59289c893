//! Q4_0: 32 weights as 4-bit unsigned codes around 8 with one f16 scale; dot partner Q8_0.
//!
//! ```text
//! #[repr(C)] struct block_q4_0 { d: f16, qs: [u8; 16] }   // 18 bytes
//! x[j]      = d * ((qs[j] & 0x0F) - 8)      j in 0..16
//! x[j + 16] = d * ((qs[j] >> 4)   - 8)
//! ```

use super::{f16_le, f16_to_le, Block, BlockQ8_0, VecDot};
use crate::GgmlType;

/// One Q4_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; 16],
}

// SAFETY: repr(C) of byte arrays, 18 bytes.
unsafe impl Block for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const N: usize = 32;
    const BYTES: usize = 18;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        for j in 0..16 {
            out[j] = d * ((self.qs[j] & 0x0F) as i32 - 8) as f32;
            out[j + 16] = d * ((self.qs[j] >> 4) as i32 - 8) as f32;
        }
    }

    fn quantize(x: &[f32]) -> Option<Self> {
        // The value of largest magnitude maps to -8 exactly.
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in &x[..32] {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            qs[j] = q0 | (q1 << 4);
        }
        Some(BlockQ4_0 {
            d: f16_to_le(d),
            qs,
        })
    }
}

impl VecDot for BlockQ4_0 {
    type Partner = BlockQ8_0;

    fn vec_dot(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let mut sumi = 0i32;
            for j in 0..16 {
                let lo = (w.qs[j] & 0x0F) as i32 - 8;
                let hi = (w.qs[j] >> 4) as i32 - 8;
                sumi += lo * a.qs[j] as i8 as i32 + hi * a.qs[j + 16] as i8 as i32;
            }
            sum += sumi as f32 * (f16_le(w.d) * f16_le(a.d));
        }
        sum
    }
}
