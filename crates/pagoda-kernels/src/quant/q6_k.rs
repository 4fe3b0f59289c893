//! Q6_K: 256 weights in 16 groups of 16, 6-bit codes around 32, an i8 scale per group under
//! one f16 super-scale; dot partner Q8_K.
//!
//! ```text
//! #[repr(C)] struct block_q6_K { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }   // 210 bytes
//! for half h in 0..2, l in 0..32, k in 0..4 (element e = 128h + 32k + l, group e / 16):
//!   q = ((ql[64h + l + 32(k & 1)] >> 4(k >> 1)) & 0xF) | ((qh[32h + l] >> 2k) & 3) << 4
//!   x[e] = d * scales[e / 16] * (q - 32)
//! ```

use super::search::{make_qx_quants, GROUP_MAX_EPS};
use super::{f16_le, f16_to_le, nearest_int, Block, BlockQ8K, VecDot};
use crate::GgmlType;

/// One Q6_K block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    /// Two's complement bytes.
    pub scales: [u8; 16],
    pub d: [u8; 2],
}

impl BlockQ6K {
    /// The 256 signed codes `-32..32` in element order.
    #[inline]
    pub fn codes(&self) -> [i8; 256] {
        let mut q = [0i8; 256];
        for h in 0..2 {
            for l in 0..32 {
                let qh = self.qh[32 * h + l];
                let a = self.ql[64 * h + l];
                let b = self.ql[64 * h + l + 32];
                q[128 * h + l] = ((a & 0xF) | ((qh & 3) << 4)) as i8 - 32;
                q[128 * h + 32 + l] = ((b & 0xF) | (((qh >> 2) & 3) << 4)) as i8 - 32;
                q[128 * h + 64 + l] = ((a >> 4) | (((qh >> 4) & 3) << 4)) as i8 - 32;
                q[128 * h + 96 + l] = ((b >> 4) | (((qh >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        q
    }
}

// SAFETY: repr(C) of byte arrays, 210 bytes.
unsafe impl Block for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const N: usize = 256;
    const BYTES: usize = 210;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        let q = self.codes();
        for g in 0..16 {
            let dg = d * self.scales[g] as i8 as f32;
            for i in 0..16 {
                out[16 * g + i] = dg * q[16 * g + i] as f32;
            }
        }
    }

    fn quantize(x: &[f32]) -> Option<Self> {
        let x = &x[..256];
        let mut l = [0i8; 256];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for g in 0..16 {
            let s = make_qx_quants(32, &x[16 * g..16 * g + 16], &mut l[16 * g..16 * g + 16]);
            scales[g] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        let mut b = BlockQ6K {
            ql: [0; 128],
            qh: [0; 64],
            scales: [0; 16],
            d: [0; 2],
        };
        if max_abs_scale < GROUP_MAX_EPS {
            return Some(b);
        }
        let iscale = -128.0 / max_scale;
        b.d = f16_to_le(1.0 / iscale);
        for g in 0..16 {
            b.scales[g] = nearest_int(iscale * scales[g]).clamp(-128, 127) as i8 as u8;
        }
        for g in 0..16 {
            let dg = f16_le(b.d) * b.scales[g] as i8 as f32;
            if dg == 0.0 {
                continue;
            }
            for i in 0..16 {
                let q = nearest_int(x[16 * g + i] / dg).clamp(-32, 31);
                l[16 * g + i] = (q + 32) as i8;
            }
        }
        for h in 0..2 {
            for i in 0..32 {
                let e = 128 * h + i;
                let (q1, q2, q3, q4) = (
                    l[e] as u8,
                    l[e + 32] as u8,
                    l[e + 64] as u8,
                    l[e + 96] as u8,
                );
                b.ql[64 * h + i] = (q1 & 0xF) | ((q3 & 0xF) << 4);
                b.ql[64 * h + i + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
                b.qh[32 * h + i] =
                    (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
        Some(b)
    }
}

impl VecDot for BlockQ6K {
    type Partner = BlockQ8K;

    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let q = w.codes();
            let mut sumi = 0i32;
            for g in 0..16 {
                let mut s = 0i32;
                for i in 0..16 {
                    s += q[16 * g + i] as i32 * a.qs[16 * g + i] as i8 as i32;
                }
                sumi += w.scales[g] as i8 as i32 * s;
            }
            sum += f16_le(w.d) * a.d() * sumi as f32;
        }
        sum
    }
}
