//! Q4_K: 256 weights in 8 sub-blocks of 32, 4-bit codes, each sub-block with a 6-bit scale and
//! a 6-bit minimum under f16 super-scales; dot partner Q8_K.
//!
//! ```text
//! #[repr(C)] struct block_q4_K { d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128] }   // 144 bytes
//! sub-block s = 2c + h (c in 0..4, h in 0..2) holds x[32s + l] = d*sc[s]*q - dmin*m[s],
//!   q = (qs[32c + l] >> 4h) & 0xF
//! scales packs 8 (sc, m) pairs of 6 bits (see `scale_min`).
//! ```

use super::search::make_qkx2_quants;
use super::{f16_le, f16_to_le, nearest_int, Block, BlockQ8K, VecDot};
use crate::GgmlType;

/// One Q4_K block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}

/// The 6-bit scale and minimum of sub-block `j` from the 12 packed bytes (shared by Q5_K).
#[inline]
pub fn scale_min(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All 8 (scale, min) pairs.
#[inline]
pub fn scales_mins(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        (sc[j], m[j]) = scale_min(j, q);
    }
    (sc, m)
}

/// Packs 8 (scale, min) pairs of 6 bits into 12 bytes (inverse of `scale_min`).
pub(crate) fn pack_scales_mins(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// The reference search shared by Q4_K and Q5_K: codes in `0..=nmax` for 256 values, the
/// f16 super-scales and the packed sub-block scales.
pub(crate) fn quantize_k_super(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    l: &mut [u8; 256],
) -> ([u8; 2], [u8; 2], [u8; 12]) {
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut laux = [0u8; 32];
    let mut weights = [0.0f32; 32];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().map(|v| v * v).sum();
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            &mut laux,
            rmin,
            0.1,
            nstep,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = nearest_int(inv_scale * scales[j]).clamp(0, 63) as u8;
        lm[j] = nearest_int(inv_min * mins[j]).clamp(0, 63) as u8;
    }
    let packed = pack_scales_mins(&ls, &lm);
    let d = f16_to_le(max_scale / 63.0);
    let dmin = f16_to_le(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min(j, &packed);
        let dd = f16_le(d) * sc as f32;
        if dd == 0.0 {
            continue;
        }
        let dm = f16_le(dmin) * m as f32;
        for i in 0..32 {
            l[32 * j + i] = nearest_int((x[32 * j + i] + dm) / dd).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed)
}

// SAFETY: repr(C) of byte arrays, 144 bytes.
unsafe impl Block for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const N: usize = 256;
    const BYTES: usize = 144;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        let min = f16_le(self.dmin);
        for c in 0..4 {
            let (sc0, m0) = scale_min(2 * c, &self.scales);
            let (sc1, m1) = scale_min(2 * c + 1, &self.scales);
            let (d0, d1) = (d * sc0 as f32, d * sc1 as f32);
            let (mm0, mm1) = (min * m0 as f32, min * m1 as f32);
            for l in 0..32 {
                let q = self.qs[32 * c + l];
                out[64 * c + l] = d0 * (q & 0xF) as f32 - mm0;
                out[64 * c + 32 + l] = d1 * (q >> 4) as f32 - mm1;
            }
        }
    }

    fn quantize(x: &[f32]) -> Option<Self> {
        let mut l = [0u8; 256];
        let (d, dmin, scales) = quantize_k_super(&x[..256], 15, -1.0, 20, &mut l);
        let mut qs = [0u8; 128];
        for c in 0..4 {
            for i in 0..32 {
                qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
        Some(BlockQ4K {
            d,
            dmin,
            scales,
            qs,
        })
    }
}

impl VecDot for BlockQ4K {
    type Partner = BlockQ8K;

    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let (sc, m) = scales_mins(&w.scales);
            let mut sum_d = 0i32;
            let mut sum_m = 0i32;
            for s in 0..8 {
                let (c, shift) = (s / 2, 4 * (s % 2));
                let mut sumi = 0i32;
                for l in 0..32 {
                    let q = ((w.qs[32 * c + l] >> shift) & 0xF) as i32;
                    sumi += q * a.qs[32 * s + l] as i8 as i32;
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
