//! Q8_1: 32 values as signed bytes with an f16 scale and the f16 `s = d * sum(qs)`; the
//! activation partner of Q4_1 and Q5_1 weights (the `s` term carries their minimum).
//!
//! ```text
//! #[repr(C)] struct block_q8_1 { d: f16, s: f16, qs: [i8; 32] }   // 36 bytes
//! x[j] = d * qs[j]
//! ```

use super::{f16_le, f16_to_le, Block};
use crate::GgmlType;

/// One Q8_1 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_1 {
    pub d: [u8; 2],
    pub s: [u8; 2],
    /// Two's complement bytes.
    pub qs: [u8; 32],
}

// SAFETY: repr(C) of byte arrays, 36 bytes.
unsafe impl Block for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    const N: usize = 32;
    const BYTES: usize = 36;

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
        let mut sum = 0i32;
        for (q, &v) in qs.iter_mut().zip(x) {
            let r = (v * id).round() as i8;
            sum += r as i32;
            *q = r as u8;
        }
        Some(BlockQ8_1 {
            d: f16_to_le(d),
            s: f16_to_le(sum as f32 * d),
            qs,
        })
    }
}
