//! NF4, QLoRA's NormalFloat-4 (Pagoda-internal `GgmlType::Nf4` and `GgmlType::Nf4Dq`):
//! blocks of 64 weights as indices into [`NF4_CODEBOOK`] times the block's absmax.
//!
//! ```text
//! NF4    block = [absmax: f32][codes: 32 bytes]                          36 bytes / 64
//! NF4_DQ row   = [mean: f32][c: f32 per 256 blocks][k: i8 per block][codes: 32 bytes per block]
//!        absmax_b = k_b * c_g + mean          (g = b / 256)
//! codes: byte j of each 16 holds weight j (low nibble) and j + 16 (high), per 32 weights
//! x[j] = NF4_CODEBOOK[q[j]] * absmax
//! ```
//! Quantizer (bitsandbytes' `quantize_blockwise` with the NF4 map): `absmax = max |x|`, and
//! `q` is the nearest codebook entry to `x / absmax` (a value exactly between two entries
//! takes the lower one). Double quantization (QLoRA): the row's absmaxes minus their mean,
//! quantized to int8 with one f32 scale `c = max|absmax - mean| / 127` per 256 blocks; the
//! 4-bit codes are then computed against the dequantized absmax, so the dequantization
//! reproduces them. Unlike bitsandbytes (one mean per tensor and its dynamic 8-bit map for
//! the absmaxes), the mean and scales are per row and the int8 grid is linear: rows stay
//! independent. Bits per weight: 4.5 (NF4), `4.125 + 32 * (1 + ceil(nb / 256)) / n` (NF4_DQ:
//! QLoRA's 4.127 plus the row mean, 4.129 for rows of 16384; 4.18 for rows of 1536).
//!
//! The integer kernels use [`NF4_I8`], the codebook times 127 rounded: a dot product differs
//! from the exact f32 one by at most `absmax * sum|a| * 0.5 / 127` per block
//! ([`I8_CODEBOOK_MAX_ERR`] is the largest entry error).
//!
//! Invariant: codes are `0..=15`; a zero block has `absmax = 0` and code 7 (0.0).

use super::int4::{nibble, pack_nibbles};
use super::{f16_le, BlockQ8_0};
use crate::dtype::NF4_DQ_GROUP;

/// The NF4 codebook of bitsandbytes (`csrc/kernels.cu`) and the QLoRA paper, as f32.
// The published digits, kept as written so they compare with the sources at a glance.
#[allow(clippy::excessive_precision)]
pub const NF4_CODEBOOK: [f32; 16] = [
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236572,
    1.0,
];

/// [`NF4_CODEBOOK`] times 127, rounded to nearest: the int8 codebook the kernels look up.
pub const NF4_I8: [i8; 16] = [
    -127, -88, -67, -50, -36, -23, -12, 0, 10, 20, 31, 43, 56, 71, 92, 127,
];

/// `max_i |NF4_I8[i] / 127 - NF4_CODEBOOK[i]|`, bounded in the tests.
pub const I8_CODEBOOK_MAX_ERR: f32 = 0.5 / 127.0;

/// Weights per block.
pub const BLOCK: usize = 64;
/// Bytes of one NF4 block.
pub const BLOCK_BYTES: usize = 36;

/// The nearest codebook index of `v` (`v` in `[-1, 1]`), ties to the lower index.
#[inline]
pub fn nearest(v: f32) -> u8 {
    let mut q = 0u8;
    for i in 0..15 {
        let mid = (NF4_CODEBOOK[i] + NF4_CODEBOOK[i + 1]) * 0.5;
        if v > mid {
            q = i as u8 + 1;
        }
    }
    q
}

fn block_absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Codes of one block of 64 against `absmax`, packed into 32 bytes.
fn encode(x: &[f32], absmax: f32, dst: &mut [u8]) {
    let id = if absmax != 0.0 { 1.0 / absmax } else { 0.0 };
    let mut codes = [0u8; BLOCK];
    for (q, &v) in codes.iter_mut().zip(x) {
        *q = nearest((v * id).clamp(-1.0, 1.0));
    }
    pack_nibbles(&codes, dst);
}

fn decode(codes: &[u8], absmax: f32, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = NF4_CODEBOOK[nibble(codes, i) as usize] * absmax;
    }
}

/// Quantizes a row (multiple of 64) to NF4 blocks.
pub fn quantize_row(x: &[f32], dst: &mut [u8]) {
    for (x, b) in x.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(BLOCK_BYTES)) {
        let amax = block_absmax(x);
        b[..4].copy_from_slice(&amax.to_le_bytes());
        encode(x, amax, &mut b[4..]);
    }
}

/// Dequantizes NF4 blocks.
pub fn dequantize_row(src: &[u8], out: &mut [f32]) {
    for (b, o) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        decode(&b[4..], f32_at(b, 0), o);
    }
}

#[inline]
fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Offsets in an NF4_DQ row of `nb` blocks: (second-level scales, absmax codes, 4-bit codes).
#[inline]
pub fn dq_offsets(nb: usize) -> (usize, usize, usize) {
    let k = 4 + 4 * nb.div_ceil(NF4_DQ_GROUP);
    (4, k, k + nb)
}

/// The number of 64-weight blocks of an NF4_DQ row of `len` bytes (`None` when no row
/// has that length).
pub fn dq_blocks(len: usize) -> Option<usize> {
    let mut groups = 1;
    loop {
        let head = 4 + 4 * groups;
        let nb = len.checked_sub(head)? / 33;
        if nb.div_ceil(NF4_DQ_GROUP) == groups {
            return (head + 33 * nb == len).then_some(nb);
        }
        if nb.div_ceil(NF4_DQ_GROUP) < groups {
            return None;
        }
        groups += 1;
    }
}

/// The dequantized absmax of block `b` of an NF4_DQ row.
#[inline]
pub fn dq_absmax(w: &[u8], nb: usize, b: usize) -> f32 {
    let (c_off, k_off, _) = dq_offsets(nb);
    let c = f32_at(w, c_off + 4 * (b / NF4_DQ_GROUP));
    w[k_off + b] as i8 as f32 * c + f32_at(w, 0)
}

/// Quantizes a row (multiple of 64) to NF4_DQ.
pub fn quantize_row_dq(x: &[f32], dst: &mut [u8]) {
    let nb = x.len() / BLOCK;
    let (c_off, k_off, q_off) = dq_offsets(nb);
    let amax: Vec<f32> = x.chunks_exact(BLOCK).map(block_absmax).collect();
    let mean = if nb == 0 {
        0.0
    } else {
        amax.iter().sum::<f32>() / nb as f32
    };
    dst[..4].copy_from_slice(&mean.to_le_bytes());
    for (g, am) in amax.chunks(NF4_DQ_GROUP).enumerate() {
        let dev = am.iter().fold(0.0f32, |m, &a| m.max((a - mean).abs()));
        let c = dev / 127.0;
        let ic = if c != 0.0 { 1.0 / c } else { 0.0 };
        dst[c_off + 4 * g..c_off + 4 * g + 4].copy_from_slice(&c.to_le_bytes());
        for (i, &a) in am.iter().enumerate() {
            let k = ((a - mean) * ic).round().clamp(-127.0, 127.0) as i8;
            dst[k_off + g * NF4_DQ_GROUP + i] = k as u8;
        }
    }
    for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
        let a = dq_absmax(dst, nb, b);
        encode(xb, a, &mut dst[q_off + 32 * b..q_off + 32 * b + 32]);
    }
}

/// Dequantizes an NF4_DQ row.
pub fn dequantize_row_dq(src: &[u8], out: &mut [f32]) {
    let nb = out.len() / BLOCK;
    let q_off = dq_offsets(nb).2;
    for (b, o) in out.chunks_exact_mut(BLOCK).enumerate() {
        decode(&src[q_off + 32 * b..], dq_absmax(src, nb, b), o);
    }
}

/// `sum_j cb[q[j]] * a[j]` in integers over one block of 64 against two Q8_0 blocks,
/// as `sum_k d_k * sumi_k`.
fn block_dot(codes: &[u8], a: &[BlockQ8_0]) -> f32 {
    let mut s = 0.0f32;
    for (k, ab) in a.iter().enumerate() {
        let mut sumi = 0i32;
        for j in 0..32 {
            let w = NF4_I8[nibble(codes, 32 * k + j) as usize] as i32;
            sumi += w * ab.qs[j] as i8 as i32;
        }
        s += sumi as f32 * f16_le(ab.d);
    }
    s
}

/// NF4 row · Q8_0 activations with the int8 codebook.
pub fn vec_dot(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (b, a) in w.chunks_exact(BLOCK_BYTES).zip(a.chunks_exact(2)) {
        sum += block_dot(&b[4..], a) * (f32_at(b, 0) / 127.0);
    }
    sum
}

/// NF4_DQ row · Q8_0 activations with the int8 codebook.
pub fn vec_dot_dq(w: &[u8], a: &[BlockQ8_0]) -> f32 {
    let nb = a.len() / 2;
    debug_assert_eq!(dq_blocks(w.len()), Some(nb));
    let q_off = dq_offsets(nb).2;
    let mut sum = 0.0f32;
    for (b, a) in a.chunks_exact(2).enumerate() {
        let codes = &w[q_off + 32 * b..q_off + 32 * b + 32];
        sum += block_dot(codes, a) * (dq_absmax(w, nb, b) / 127.0);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::excessive_precision)]
    fn codebook_is_the_published_table_exactly() {
        // bitsandbytes csrc/kernels.cu `nf4_dequantization_lut`, f32 literals.
        let published: [f32; 16] = [
            -1.0,
            -0.6961928009986877,
            -0.5250730514526367,
            -0.39491748809814453,
            -0.28444138169288635,
            -0.18477343022823334,
            -0.09105003625154495,
            0.0,
            0.07958029955625534,
            0.16093020141124725,
            0.24611230194568634,
            0.33791524171829224,
            0.44070982933044434,
            0.5626170039176941,
            0.7229568362236572,
            1.0,
        ];
        for (a, b) in NF4_CODEBOOK.iter().zip(&published) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }

    #[test]
    fn int8_codebook_is_the_rounded_table_within_the_bound() {
        for (i, (&c, &q)) in NF4_CODEBOOK.iter().zip(&NF4_I8).enumerate() {
            assert_eq!((c * 127.0).round() as i8, q, "entry {i}");
            assert!(
                (q as f32 / 127.0 - c).abs() <= I8_CODEBOOK_MAX_ERR,
                "entry {i}"
            );
        }
    }

    #[test]
    fn nearest_picks_the_closest_entry_and_maps_entries_to_themselves() {
        for (i, &c) in NF4_CODEBOOK.iter().enumerate() {
            assert_eq!(nearest(c) as usize, i);
        }
        for k in -1000..=1000 {
            let v = k as f32 / 1000.0;
            let q = nearest(v) as usize;
            let best = NF4_CODEBOOK
                .iter()
                .map(|c| (c - v).abs())
                .fold(f32::INFINITY, f32::min);
            assert!((NF4_CODEBOOK[q] - v).abs() <= best + 1e-7, "{v}");
        }
    }

    /// The integer dot product (int8 codebook) against the exact one (f32 codebook, same
    /// quantized activations) stays within the stated bound: per block of 64,
    /// `absmax * sum |a| * I8_CODEBOOK_MAX_ERR`, plus f32 rounding.
    #[test]
    fn integer_dot_is_within_the_codebook_bound_of_the_exact_one() {
        use crate::quant::Block;
        let mut s = 0x2545_f491u32;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        for dq in [false, true] {
            let n = 64 * 24;
            let x: Vec<f32> = (0..n).map(|i| rnd() * (1.0 + (i / 64) as f32)).collect();
            let act: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let ty = if dq {
                crate::GgmlType::Nf4Dq
            } else {
                crate::GgmlType::Nf4
            };
            let mut w = vec![0u8; ty.row_bytes(n).unwrap()];
            crate::quantize_row(ty, &x, &mut w).unwrap();
            let mut wf = vec![0.0f32; n];
            crate::dequantize_row(ty, &w, &mut wf).unwrap();
            let a: Vec<BlockQ8_0> = act
                .chunks(32)
                .map(|c| BlockQ8_0::quantize(c).unwrap())
                .collect();
            let mut af = vec![0.0f32; n];
            for (b, o) in a.iter().zip(af.chunks_mut(32)) {
                b.dequantize(o);
            }
            let got = if dq {
                vec_dot_dq(&w, &a)
            } else {
                vec_dot(&w, &a)
            } as f64;
            let exact: f64 = wf.iter().zip(&af).map(|(p, q)| *p as f64 * *q as f64).sum();
            let mut bound = 0.0f64;
            for b in 0..n / 64 {
                let amax = if dq {
                    dq_absmax(&w, n / 64, b)
                } else {
                    f32_at(&w, b * BLOCK_BYTES)
                };
                let sa: f64 = af[64 * b..64 * b + 64].iter().map(|v| v.abs() as f64).sum();
                bound += amax.abs() as f64 * sa * I8_CODEBOOK_MAX_ERR as f64;
            }
            let diff = (got - exact).abs();
            assert!(diff <= bound * 1.001 + 1e-4, "dq={dq}: {diff} > {bound}");
            assert!(
                diff > 0.0,
                "the int8 codebook is not exact, so some difference shows"
            );
        }
    }
}
