//! INT4 group-wise (Pagoda-internal `GgmlType::Int4G{32,64,128}[Sym]`): groups of `G` weights
//! with an f16 scale, and for the asymmetric types an f16 minimum.
//!
//! ```text
//! asym group = [d: f16][m: f16][codes: G/2 bytes]    x = d * q + m,        q in 0..=15
//! sym  group = [d: f16][codes: G/2 bytes]            x = d * (q - 8),      q in 0..=15
//! codes: per 32 weights, 16 bytes; byte j holds weight j (low nibble) and j + 16 (high)
//! ```
//! With `G = 32` the layouts are Q4_1 (asym) and Q4_0 (sym) exactly, so those types share
//! their dequantization and kernels; only the quantizer differs: codes are computed with
//! the f16-rounded scale and minimum that are stored, so the stored values reproduce the
//! rounding the quantizer intended.
//!
//! Quantizers: asym `d = (max - min) / 15`, `q = clamp(floor((x - m) / d + 0.5), 0, 15)`;
//! sym (Q4_0's signed absmax) `d = -v / 8` where `v` is the value of largest magnitude,
//! `q = clamp(floor(x / d + 8.5), 0, 15)`, so `v` maps to code 0 exactly. Dot partners: Q8_1
//! (asym: the minimum pairs with the activation sums) and Q8_0 (sym).
//!
//! Invariant: a group is `group_bytes(G, sym)` bytes; rows are whole groups.

use super::{f16_le, f16_to_le, BlockQ8_0, BlockQ8_1};

/// Bytes of one group.
pub const fn group_bytes(g: usize, sym: bool) -> usize {
    g / 2 + if sym { 2 } else { 4 }
}

/// Quantizes one group `x` (`x.len() == G`) into `dst` (`group_bytes(G, sym)` bytes).
pub fn quantize_group(x: &[f32], sym: bool, dst: &mut [u8]) {
    let g = x.len();
    debug_assert!(g <= 128 && g % 32 == 0);
    let mut buf = [0u8; 128];
    let codes = &mut buf[..g];
    let off = if sym {
        let mut v = 0.0f32;
        for &e in x {
            if e.abs() > v.abs() {
                v = e;
            }
        }
        let d = f16_le(f16_to_le(v / -8.0));
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (q, &e) in codes.iter_mut().zip(x) {
            *q = (e * id + 8.5).floor().clamp(0.0, 15.0) as u8;
        }
        dst[..2].copy_from_slice(&f16_to_le(d));
        2
    } else {
        let min = x.iter().copied().fold(f32::INFINITY, f32::min);
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m = f16_le(f16_to_le(min));
        let d = f16_le(f16_to_le((max - m) / 15.0));
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (q, &e) in codes.iter_mut().zip(x) {
            *q = ((e - m) * id + 0.5).floor().clamp(0.0, 15.0) as u8;
        }
        dst[..2].copy_from_slice(&f16_to_le(d));
        dst[2..4].copy_from_slice(&f16_to_le(m));
        4
    };
    pack_nibbles(codes, &mut dst[off..off + g / 2]);
}

/// Packs codes (`0..=15`, a multiple of 32) as 16 bytes per 32: low nibble j, high j + 16.
pub fn pack_nibbles(codes: &[u8], dst: &mut [u8]) {
    for (c, d) in codes.chunks_exact(32).zip(dst.chunks_exact_mut(16)) {
        for j in 0..16 {
            d[j] = c[j] | (c[j + 16] << 4);
        }
    }
}

/// Code `i` of packed nibbles.
#[inline]
pub fn nibble(codes: &[u8], i: usize) -> u8 {
    let b = codes[i / 32 * 16 + i % 16];
    if i % 32 < 16 {
        b & 0x0F
    } else {
        b >> 4
    }
}

/// Dequantizes one group (`out.len() == G`).
pub fn dequantize_group(src: &[u8], sym: bool, out: &mut [f32]) {
    let d = f16_le([src[0], src[1]]);
    if sym {
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * (nibble(&src[2..], i) as f32 - 8.0);
        }
    } else {
        let m = f16_le([src[2], src[3]]);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * nibble(&src[4..], i) as f32 + m;
        }
    }
}

/// Quantizes a row of whole groups of `g`.
pub fn quantize_row(x: &[f32], g: usize, sym: bool, dst: &mut [u8]) {
    for (x, d) in x
        .chunks_exact(g)
        .zip(dst.chunks_exact_mut(group_bytes(g, sym)))
    {
        quantize_group(x, sym, d);
    }
}

/// Dequantizes a row of whole groups of `g`.
pub fn dequantize_row(src: &[u8], g: usize, sym: bool, out: &mut [f32]) {
    for (s, o) in src
        .chunks_exact(group_bytes(g, sym))
        .zip(out.chunks_exact_mut(g))
    {
        dequantize_group(s, sym, o);
    }
}

/// Symmetric row · Q8_0 activations.
pub fn vec_dot_sym(w: &[u8], g: usize, a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (grp, a) in w
        .chunks_exact(group_bytes(g, true))
        .zip(a.chunks_exact(g / 32))
    {
        let d = f16_le([grp[0], grp[1]]);
        let mut gs = 0.0f32;
        for (k, ab) in a.iter().enumerate() {
            let mut sumi = 0i32;
            for j in 0..32 {
                let q = nibble(&grp[2..], 32 * k + j) as i32 - 8;
                sumi += q * ab.qs[j] as i8 as i32;
            }
            gs += sumi as f32 * f16_le(ab.d);
        }
        sum += gs * d;
    }
    sum
}

/// Asymmetric row · Q8_1 activations (the minimum times the stored activation sums).
pub fn vec_dot_asym(w: &[u8], g: usize, a: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (grp, a) in w
        .chunks_exact(group_bytes(g, false))
        .zip(a.chunks_exact(g / 32))
    {
        let (d, m) = (f16_le([grp[0], grp[1]]), f16_le([grp[2], grp[3]]));
        let (mut gs, mut ss) = (0.0f32, 0.0f32);
        for (k, ab) in a.iter().enumerate() {
            let mut sumi = 0i32;
            for j in 0..32 {
                sumi += nibble(&grp[4..], 32 * k + j) as i32 * ab.qs[j] as i8 as i32;
            }
            gs += sumi as f32 * f16_le(ab.d);
            ss += f16_le(ab.s);
        }
        sum += gs * d + ss * m;
    }
    sum
}
