//! Q8_0: 32 values as signed bytes with one f16 scale. A weight format and the activation
//! partner of Q4_0, Q5_0 and Q8_0 weights.
//!
//! ```text
//! #[repr(C)] struct block_q8_0 { d: f16, qs: [i8; 32] }   // 34 bytes
//! x[j] = d * qs[j]
//! ```

use super::{f16_le, f16_to_le, Block, VecDot};
use crate::GgmlType;

/// One Q8_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    /// Two's complement bytes.
    pub qs: [u8; 32],
}

/// Rounds half away from zero, like C `roundf`.
#[inline]
fn roundf(x: f32) -> f32 {
    x.round()
}

// SAFETY: repr(C) of byte arrays, 34 bytes.
unsafe impl Block for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const N: usize = 32;
    const BYTES: usize = 34;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as i8 as f32 * d;
        }
    }

    fn quantize(x: &[f32]) -> Option<Self> {
        let x = &x[..32];
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 32];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = roundf(v * id) as i8 as u8;
        }
        Some(BlockQ8_0 {
            d: f16_to_le(d),
            qs,
        })
    }
}

impl VecDot for BlockQ8_0 {
    type Partner = BlockQ8_0;

    fn vec_dot(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let mut sumi = 0i32;
            for j in 0..32 {
                sumi += w.qs[j] as i8 as i32 * a.qs[j] as i8 as i32;
            }
            sum += sumi as f32 * (f16_le(w.d) * f16_le(a.d));
        }
        sum
    }
}
