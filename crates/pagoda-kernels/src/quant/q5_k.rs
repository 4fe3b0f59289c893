//! Q5_K: 256 weights in 8 sub-blocks of 32, 5-bit codes, scales packed as in Q4_K; dot
//! partner Q8_K.
//!
//! ```text
//! #[repr(C)] struct block_q5_K { d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }   // 176 bytes
//! sub-block s = 2c + h holds x[32s + l] = d*sc[s]*q - dmin*m[s],
//!   q = ((qs[32c + l] >> 4h) & 0xF) | ((qh[l] >> s) & 1) << 4
//! ```

use super::q4_k::{quantize_k_super, scale_min, scales_mins};
use super::{f16_le, Block, BlockQ8K, VecDot};
use crate::GgmlType;

/// One Q5_K block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}

impl BlockQ5K {
    /// Code `l` (0..32) of sub-block `s` (0..8).
    #[inline]
    fn code(&self, s: usize, l: usize) -> u8 {
        let lo = (self.qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF;
        lo | (((self.qh[l] >> s) & 1) << 4)
    }
}

// SAFETY: repr(C) of byte arrays, 176 bytes.
unsafe impl Block for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const N: usize = 256;
    const BYTES: usize = 176;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        let min = f16_le(self.dmin);
        for s in 0..8 {
            let (sc, m) = scale_min(s, &self.scales);
            let (ds, ms) = (d * sc as f32, min * m as f32);
            for l in 0..32 {
                out[32 * s + l] = ds * self.code(s, l) as f32 - ms;
            }
        }
    }

    fn quantize(x: &[f32]) -> Option<Self> {
        let mut l = [0u8; 256];
        let (d, dmin, scales) = quantize_k_super(&x[..256], 31, -0.5, 15, &mut l);
        let mut qs = [0u8; 128];
        let mut qh = [0u8; 32];
        for c in 0..4 {
            for j in 0..32 {
                let l1 = l[64 * c + j];
                let l2 = l[64 * c + 32 + j];
                qh[j] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
                qs[32 * c + j] = (l1 & 0xF) | ((l2 & 0xF) << 4);
            }
        }
        Some(BlockQ5K {
            d,
            dmin,
            scales,
            qh,
            qs,
        })
    }
}

impl VecDot for BlockQ5K {
    type Partner = BlockQ8K;

    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let (sc, m) = scales_mins(&w.scales);
            let mut sum_d = 0i32;
            let mut sum_m = 0i32;
            for s in 0..8 {
                let mut sumi = 0i32;
                for l in 0..32 {
                    sumi += w.code(s, l) as i32 * a.qs[32 * s + l] as i8 as i32;
                }
                sum_d += sc[s] as i32 * sumi;
                sum_m += m[s] as i32 * (a.bsum(2 * s) + a.bsum(2 * s + 1));
            }
            let da = a.d();
            sum += da * f16_le(w.d) * sum_d as f32 - da * f16_le(w.dmin) * sum_m as f32;
        }
        sum
    }
}
