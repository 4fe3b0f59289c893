//! Q2_K: 256 weights in 16 groups of 16, 2-bit codes, a 4-bit scale and 4-bit minimum per
//! group under f16 super-scales. Dequantization only (no quantizer, no integer dot: matmul
//! dequantizes its rows on the fly).
//!
//! ```text
//! #[repr(C)] struct block_q2_K { scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16 }   // 84 bytes
//! element e = 128h + 32k + l (h in 0..2, k in 0..4, l in 0..32), group g = e / 16:
//!   x[e] = d * (scales[g] & 0xF) * ((qs[32h + l] >> 2k) & 3) - dmin * (scales[g] >> 4)
//! ```

use super::{f16_le, Block};
use crate::GgmlType;

/// One Q2_K block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2K {
    pub scales: [u8; 16],
    pub qs: [u8; 64],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}

// SAFETY: repr(C) of byte arrays, 84 bytes.
unsafe impl Block for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const N: usize = 256;
    const BYTES: usize = 84;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        let min = f16_le(self.dmin);
        for h in 0..2 {
            for k in 0..4 {
                for l in 0..32 {
                    let e = 128 * h + 32 * k + l;
                    let sc = self.scales[e / 16];
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    let q = (self.qs[32 * h + l] >> (2 * k)) & 3;
                    out[e] = dl * q as f32 - ml;
                }
            }
        }
    }

    fn quantize(_x: &[f32]) -> Option<Self> {
        None
    }
}
