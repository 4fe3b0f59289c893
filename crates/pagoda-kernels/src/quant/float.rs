//! The float element types F32, F16 and BF16: row conversions to and from f32 and the scalar
//! dot products of a float weight row against f32 activations.
//!
//! Invariant: byte rows are little-endian and may be unaligned; every read here goes through
//! `from_le_bytes` on byte chunks, never through a cast pointer.

/// Little-endian f32 bytes to f32.
pub fn f32_from_le(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// f32 to little-endian bytes.
pub fn f32_to_le(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(4)) {
        b.copy_from_slice(&x.to_le_bytes());
    }
}

/// F16 bytes to f32 (exact).
pub fn f16_to_f32_row(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

/// f32 to F16 bytes, round to nearest even.
pub fn f32_to_f16_row(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&half::f16::from_f32(*x).to_bits().to_le_bytes());
    }
}

/// BF16 bits to f32 (exact).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to BF16 bits as `ggml_compute_fp32_to_bf16` does: NaN made quiet, else round to
/// nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

/// BF16 bytes to f32.
pub fn bf16_to_f32_row(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// f32 to BF16 bytes.
pub fn f32_to_bf16_row(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
    }
}

/// Dot product of an F32 byte row with f32 activations.
pub fn dot_f32_row(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut tail = 0.0f32;
    let full = x.len() / 8 * 8;
    for (wc, xc) in w[..full * 4]
        .chunks_exact(32)
        .zip(x[..full].chunks_exact(8))
    {
        for l in 0..8 {
            let b = &wc[l * 4..l * 4 + 4];
            acc[l] += f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * xc[l];
        }
    }
    for (b, xv) in w[full * 4..].chunks_exact(4).zip(&x[full..]) {
        tail += f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * xv;
    }
    acc.iter().sum::<f32>() + tail
}

/// Dot product of an F16 byte row with f32 activations.
pub fn dot_f16_row(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (i, (b, xv)) in w.chunks_exact(2).zip(x).enumerate() {
        acc[i % 8] += half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32() * xv;
    }
    acc.iter().sum()
}

/// Dot product of a BF16 byte row with f32 activations.
pub fn dot_bf16_row(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (i, (b, xv)) in w.chunks_exact(2).zip(x).enumerate() {
        acc[i % 8] += bf16_to_f32(u16::from_le_bytes([b[0], b[1]])) * xv;
    }
    acc.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan_quiet() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (1.0).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        let nan = f32_to_bf16(f32::from_bits(0x7f80_0001));
        assert!(bf16_to_f32(nan).is_nan());
        assert_eq!(bf16_to_f32(0xc000), -2.0);
    }

    #[test]
    fn float_dots_match_naive() {
        let x: Vec<f32> = (0..19).map(|i| i as f32 * 0.25 - 2.0).collect();
        let w: Vec<f32> = (0..19).map(|i| 1.5 - i as f32 * 0.125).collect();
        let naive: f32 = x.iter().zip(&w).map(|(a, b)| a * b).sum();
        let mut b32 = vec![0u8; 19 * 4];
        f32_to_le(&w, &mut b32);
        let mut b16 = vec![0u8; 19 * 2];
        f32_to_f16_row(&w, &mut b16);
        let mut bb = vec![0u8; 19 * 2];
        f32_to_bf16_row(&w, &mut bb);
        assert!((dot_f32_row(&b32, &x) - naive).abs() < 1e-4);
        assert!((dot_f16_row(&b16, &x) - naive).abs() < 1e-4);
        assert!((dot_bf16_row(&bb, &x) - naive).abs() < 1e-4);
    }
}
