//! Q8_K: 256 values as signed bytes with an f32 scale and the sums of each 16 values; the
//! activation partner of the k-quant weights (the sums carry their minimums).
//!
//! ```text
//! #[repr(C)] struct block_q8_K { d: f32, qs: [i8; 256], bsums: [i16; 16] }   // 292 bytes
//! x[j] = d * qs[j];   bsums[g] = sum(qs[16g .. 16g + 16])
//! ```
//! Codes stay within -127..=127, so `-q` never overflows.

use super::{nearest_int, Block};
use crate::GgmlType;

/// One Q8_K block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8K {
    /// f32 little-endian.
    pub d: [u8; 4],
    /// Two's complement bytes.
    pub qs: [u8; 256],
    /// i16 little-endian sums of each 16 codes.
    pub bsums: [u8; 32],
}

impl BlockQ8K {
    /// The scale.
    #[inline]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    /// Sum of the 16 codes of group `g`.
    #[inline]
    pub fn bsum(&self, g: usize) -> i32 {
        i16::from_le_bytes([self.bsums[2 * g], self.bsums[2 * g + 1]]) as i32
    }
}

// SAFETY: repr(C) of byte arrays, 292 bytes.
unsafe impl Block for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8_K;
    const N: usize = 256;
    const BYTES: usize = 292;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as i8 as f32;
        }
    }

    fn quantize(x: &[f32]) -> Option<Self> {
        let x = &x[..256];
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let mut b = BlockQ8K {
            d: [0; 4],
            qs: [0; 256],
            bsums: [0; 32],
        };
        if amax == 0.0 {
            return Some(b);
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        for g in 0..16 {
            let s: i32 = b.qs[16 * g..16 * g + 16]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            b.bsums[2 * g..2 * g + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
        b.d = (1.0 / iscale).to_le_bytes();
        Some(b)
    }
}
