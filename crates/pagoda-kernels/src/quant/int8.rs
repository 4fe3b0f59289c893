//! INT8 per-channel (Pagoda-internal `GgmlType::Int8`): one f32 scale per weight row.
//!
//! ```text
//! row = [s: f32 LE][q: i8; n]        // 4 + n bytes, n a multiple of 32
//! s = absmax(row) / 127,  q[j] = round_half_away(x[j] / s),  x[j] ≈ s * q[j]
//! ```
//! Dot partner: Q8_0 activations (one f16 scale per 32); the row scale multiplies the sum.
//!
//! Invariant: `|q[j]| <= 127`; an all-zero row has `s = 0` and all-zero codes.

use super::{f16_le, BlockQ8_0};

/// Quantizes `x` into `dst` (`dst.len() == 4 + x.len()`).
pub fn quantize(x: &[f32], dst: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let s = amax / 127.0;
    let id = if s != 0.0 { 1.0 / s } else { 0.0 };
    dst[..4].copy_from_slice(&s.to_le_bytes());
    for (q, &v) in dst[4..].iter_mut().zip(x) {
        *q = (v * id).round().clamp(-127.0, 127.0) as i8 as u8;
    }
}

/// The row scale.
#[inline]
pub fn scale(w: &[u8]) -> f32 {
    f32::from_le_bytes([w[0], w[1], w[2], w[3]])
}

/// Dequantizes a row (`src.len() == 4 + out.len()`).
pub fn dequantize(src: &[u8], out: &mut [f32]) {
    let s = scale(src);
    for (o, &q) in out.iter_mut().zip(&src[4..]) {
        *o = q as i8 as f32 * s;
    }
}

/// `sum_j x[j] * a[j]` of a row against its Q8_0-quantized activations.
pub fn vec_dot(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (q, a) in w[4..].chunks_exact(32).zip(a) {
        let mut sumi = 0i32;
        for j in 0..32 {
            sumi += q[j] as i8 as i32 * a.qs[j] as i8 as i32;
        }
        sum += sumi as f32 * f16_le(a.d);
    }
    sum * scale(w)
}
