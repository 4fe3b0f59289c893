//! Q3_K: 256 weights in 16 groups of 16, 3-bit codes (2 low bits + a high-bit mask), a 6-bit
//! signed scale per group under one f16 super-scale. Dequantization only (matmul dequantizes
//! its rows on the fly).
//!
//! ```text
//! #[repr(C)] struct block_q3_K { hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16 }   // 110 bytes
//! element e = 128h + 32k + l (h in 0..2, k in 0..4, l in 0..32), group g = e / 16:
//!   q = ((qs[32h + l] >> 2k) & 3) - (if hmask[l] bit (4h + k) is set { 0 } else { 4 })
//!   x[e] = d * (scale6(g) - 32) * q
//! scale6(g) = low nibble of scales[g % 8] (high nibble when g >= 8)
//!             | ((scales[8 + g % 4] >> 2(g / 4)) & 3) << 4
//! ```

use super::{f16_le, Block};
use crate::GgmlType;

/// One Q3_K block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ3K {
    pub hmask: [u8; 32],
    pub qs: [u8; 64],
    pub scales: [u8; 12],
    pub d: [u8; 2],
}

impl BlockQ3K {
    /// The signed 6-bit scale of group `g` (0..16), already offset by -32.
    #[inline]
    pub fn scale(&self, g: usize) -> i32 {
        let lo = if g < 8 {
            self.scales[g] & 0xF
        } else {
            self.scales[g - 8] >> 4
        };
        let hi = (self.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
        (lo | (hi << 4)) as i32 - 32
    }
}

// SAFETY: repr(C) of byte arrays, 110 bytes.
unsafe impl Block for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const N: usize = 256;
    const BYTES: usize = 110;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        for h in 0..2 {
            for k in 0..4 {
                let mask = 1u8 << (4 * h + k);
                for l in 0..32 {
                    let e = 128 * h + 32 * k + l;
                    let dl = d * self.scale(e / 16) as f32;
                    let low = ((self.qs[32 * h + l] >> (2 * k)) & 3) as i32;
                    let q = low - if self.hmask[l] & mask != 0 { 0 } else { 4 };
                    out[e] = dl * q as f32;
                }
            }
        }
    }

    fn quantize(_x: &[f32]) -> Option<Self> {
        None
    }
}
