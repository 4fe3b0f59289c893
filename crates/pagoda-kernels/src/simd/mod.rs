//! The per-type row kernels of every ISA path, and the table [`kernel`] that picks one.
//!
//! A row kernel computes one weight row against up to [`NT`] activation rows at once, so the
//! weight blocks are loaded and unpacked once for several tokens (prefill).
//!
//! Invariant: [`kernel`] is only called with an `isa` that [`Isa::is_available`] accepted;
//! the `unsafe` function pointers it returns may then be called with `w` one whole weight row
//! and `nt <= NT` activation rows of the same element count, row `t` starting at
//! `a[t * stride..]` (a partner-quantized byte row or an f32 row).

#[cfg(target_arch = "x86_64")]
pub(crate) mod attn;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_fmt;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_packed;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_q4k;

use crate::quant::{self, as_blocks, float, int4, int8, nf4, Block, BlockQ8_1, VecDot};
use crate::quant::{
    BlockMxfp4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
};
use crate::{GgmlType, Isa};

/// Tokens one kernel call computes against the same weight row.
pub(crate) const NT: usize = 8;

/// Quantized weight row · `nt` quantized activation rows (bytes, `stride` bytes apart).
pub(crate) type QDot = unsafe fn(w: &[u8], a: &[u8], stride: usize, nt: usize, out: &mut [f32; NT]);
/// Float weight row (bytes) · `nt` f32 activation rows (`stride` values apart).
pub(crate) type FDot =
    unsafe fn(w: &[u8], x: &[f32], stride: usize, nt: usize, out: &mut [f32; NT]);
/// Quantizes one activation row into the partner type.
pub(crate) type QuantizeRow = unsafe fn(x: &[f32], dst: &mut [u8]);

/// How one activation row is laid out after quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActLayout {
    /// Whole blocks of this GGUF type (Q8_0, Q8_1 or Q8_K), exactly as the scalar reference.
    Blocks(GgmlType),
    /// The Q8_1 values of `nb = cols / 32` blocks split for wide loads: `cols` code bytes
    /// (i8, contiguous), then each block's f32 scale `d` repeated 8 times (so two blocks'
    /// scales are one 512-bit load matching the `vpdpbusd` lanes), then `nb` f32 sums `s`.
    /// `d` and `s` are the f16-rounded values Q8_1 would store, so products equal the block
    /// layout's. 68 bytes per 32 values.
    Split32,
}

impl ActLayout {
    /// Bytes of one quantized activation row of `cols` values.
    pub(crate) fn row_bytes(self, cols: usize) -> Result<usize, crate::KernelError> {
        match self {
            ActLayout::Blocks(ty) => ty.row_bytes(cols),
            ActLayout::Split32 => Ok(GgmlType::Q8_1.row_bytes(cols)? / 36 * 68),
        }
    }
}

/// How matmul computes the output elements of a weight type.
#[derive(Clone, Copy)]
pub(crate) enum RowKernel {
    /// Integer dot against activations quantized once per call to `partner`.
    Quant {
        partner: ActLayout,
        quantize: QuantizeRow,
        dot: QDot,
    },
    /// Float weights converted on the fly against f32 activations.
    Float { dot: FDot },
    /// No dot product for this type: each weight row is dequantized into scratch first.
    Dequant,
}

fn scalar_dot<B: VecDot>(w: &[u8], a: &[u8], stride: usize, nt: usize, out: &mut [f32; NT]) {
    let len = w.len() / B::BYTES * <B::Partner as Block>::BYTES;
    for t in 0..nt {
        let at = &a[t * stride..t * stride + len];
        out[t] = B::vec_dot(as_blocks::<B>(w), as_blocks::<B::Partner>(at));
    }
}

macro_rules! scalar_float_fn {
    ($name:ident, $dot:path, $elem_bytes:expr) => {
        fn $name(w: &[u8], x: &[f32], stride: usize, nt: usize, out: &mut [f32; NT]) {
            let cols = w.len() / $elem_bytes;
            for t in 0..nt {
                out[t] = $dot(w, &x[t * stride..t * stride + cols]);
            }
        }
    };
}
scalar_float_fn!(scalar_f32, float::dot_f32_row, 4);
scalar_float_fn!(scalar_f16, float::dot_f16_row, 2);
scalar_float_fn!(scalar_bf16, float::dot_bf16_row, 2);

/// Scalar reference quantizer of an activation row.
pub(crate) fn scalar_quantize<B: Block>(x: &[f32], dst: &mut [u8]) {
    for (x, b) in x.chunks_exact(B::N).zip(quant::as_blocks_mut::<B>(dst)) {
        *b = B::quantize(x).expect("activation partner types all have quantizers");
    }
}

/// INT8 row · Q8_0 rows.
fn scalar_int8(w: &[u8], a: &[u8], stride: usize, nt: usize, out: &mut [f32; NT]) {
    let len = (w.len() - 4) / 32 * BlockQ8_0::BYTES;
    for t in 0..nt {
        out[t] = int8::vec_dot(w, as_blocks(&a[t * stride..t * stride + len]));
    }
}

/// INT4 row with groups of `G` · Q8_0 (symmetric) or Q8_1 (asymmetric) rows.
fn scalar_int4<const G: usize, const SYM: bool>(
    w: &[u8],
    a: &[u8],
    stride: usize,
    nt: usize,
    out: &mut [f32; NT],
) {
    let nb = w.len() / int4::group_bytes(G, SYM) * G / 32;
    for t in 0..nt {
        let at = &a[t * stride..];
        out[t] = if SYM {
            int4::vec_dot_sym(w, G, as_blocks(&at[..nb * BlockQ8_0::BYTES]))
        } else {
            int4::vec_dot_asym(w, G, as_blocks(&at[..nb * BlockQ8_1::BYTES]))
        };
    }
}

/// NF4 (`DQ = false`) or NF4_DQ row · Q8_0 rows.
fn scalar_nf4<const DQ: bool>(w: &[u8], a: &[u8], stride: usize, nt: usize, out: &mut [f32; NT]) {
    let nb = if DQ {
        nf4::dq_blocks(w.len()).unwrap_or(0)
    } else {
        w.len() / nf4::BLOCK_BYTES
    };
    let len = 2 * nb * BlockQ8_0::BYTES;
    for t in 0..nt {
        let at = as_blocks(&a[t * stride..t * stride + len]);
        out[t] = if DQ {
            nf4::vec_dot_dq(w, at)
        } else {
            nf4::vec_dot(w, at)
        };
    }
}

/// A row kernel against activations quantized to `P` by the scalar quantizer.
fn quant_with<P: Block>(dot: QDot) -> RowKernel {
    RowKernel::Quant {
        partner: ActLayout::Blocks(P::TYPE),
        quantize: scalar_quantize::<P>,
        dot,
    }
}

fn quant<B: VecDot>(dot: QDot) -> RowKernel {
    RowKernel::Quant {
        partner: ActLayout::Blocks(<B::Partner as Block>::TYPE),
        quantize: scalar_quantize::<B::Partner>,
        dot,
    }
}

fn scalar_kernel(ty: GgmlType) -> RowKernel {
    match ty {
        GgmlType::F32 => RowKernel::Float { dot: scalar_f32 },
        GgmlType::F16 => RowKernel::Float { dot: scalar_f16 },
        GgmlType::BF16 => RowKernel::Float { dot: scalar_bf16 },
        GgmlType::Q4_0 => quant::<BlockQ4_0>(scalar_dot::<BlockQ4_0>),
        GgmlType::Q4_1 => quant::<BlockQ4_1>(scalar_dot::<BlockQ4_1>),
        GgmlType::Q5_0 => quant::<BlockQ5_0>(scalar_dot::<BlockQ5_0>),
        GgmlType::Q5_1 => quant::<BlockQ5_1>(scalar_dot::<BlockQ5_1>),
        GgmlType::Q8_0 => quant::<BlockQ8_0>(scalar_dot::<BlockQ8_0>),
        GgmlType::Q4_K => quant::<BlockQ4K>(scalar_dot::<BlockQ4K>),
        GgmlType::Q5_K => quant::<BlockQ5K>(scalar_dot::<BlockQ5K>),
        GgmlType::Q6_K => quant::<BlockQ6K>(scalar_dot::<BlockQ6K>),
        GgmlType::Mxfp4 => quant::<BlockMxfp4>(scalar_dot::<BlockMxfp4>),
        GgmlType::Q8_1 | GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q8_K => RowKernel::Dequant,
        // INT4 with groups of 32 is stored as Q4_1 / Q4_0 blocks.
        GgmlType::Int4G32 => quant::<BlockQ4_1>(scalar_dot::<BlockQ4_1>),
        GgmlType::Int4G32Sym => quant::<BlockQ4_0>(scalar_dot::<BlockQ4_0>),
        GgmlType::Int8 => quant_with::<BlockQ8_0>(scalar_int8),
        GgmlType::Int4G64 => quant_with::<BlockQ8_1>(scalar_int4::<64, false>),
        GgmlType::Int4G64Sym => quant_with::<BlockQ8_0>(scalar_int4::<64, true>),
        GgmlType::Int4G128 => quant_with::<BlockQ8_1>(scalar_int4::<128, false>),
        GgmlType::Int4G128Sym => quant_with::<BlockQ8_0>(scalar_int4::<128, true>),
        GgmlType::Nf4 => quant_with::<BlockQ8_0>(scalar_nf4::<false>),
        GgmlType::Nf4Dq => quant_with::<BlockQ8_0>(scalar_nf4::<true>),
    }
}

/// The row kernel of `ty` on path `isa` (which must be available).
pub(crate) fn kernel(isa: Isa, ty: GgmlType) -> RowKernel {
    debug_assert!(isa.is_available());
    let scalar = scalar_kernel(ty);
    match isa {
        Isa::Scalar => scalar,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::kernel(ty).unwrap_or(scalar),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => avx512::kernel(ty)
            .or_else(|| avx2::kernel(ty))
            .unwrap_or(scalar),
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::BlockQ8K;

    /// Activations with exact halves (ties), zeros, a zero block and wide scales.
    fn activations(n: usize) -> Vec<f32> {
        let mut s = 0x1234_5678u32;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                let v = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                match i % 97 {
                    0 => 0.0,
                    1 => 63.5 / 127.0,
                    _ if (512..768).contains(&(i % 2048)) => 0.0,
                    _ => v * [1e-3, 1.0, 40.0][(i / 256) % 3],
                }
            })
            .collect()
    }

    /// Reassembles Q8_1 blocks from the split layout (scales back to f16, exactly).
    fn split_to_q8_1(split: &[u8], cols: usize) -> Vec<u8> {
        let nb = cols / 32;
        let f = |o: usize| f32::from_le_bytes(split[o..o + 4].try_into().unwrap());
        let mut out = Vec::with_capacity(nb * 36);
        for b in 0..nb {
            for k in 1..8 {
                assert_eq!(
                    f(cols + 32 * b),
                    f(cols + 32 * b + 4 * k),
                    "scale copies differ"
                );
            }
            let d = half::f16::from_f32(f(cols + 32 * b));
            let s = half::f16::from_f32(f(cols + 32 * nb + 4 * b));
            out.extend_from_slice(&d.to_bits().to_le_bytes());
            out.extend_from_slice(&s.to_bits().to_le_bytes());
            out.extend_from_slice(&split[32 * b..32 * b + 32]);
        }
        out
    }

    #[test]
    fn simd_activation_quantizers_match_the_scalar_reference_bit_for_bit() {
        let x = activations(4096);
        for isa in crate::available_isas() {
            for ty in GgmlType::ALL.into_iter().chain(GgmlType::INTERNAL) {
                let RowKernel::Quant {
                    partner, quantize, ..
                } = kernel(isa, ty)
                else {
                    continue;
                };
                let rb = partner.row_bytes(x.len()).unwrap();
                let mut got = vec![0u8; rb];
                // SAFETY: `isa` is available; lengths match.
                unsafe { quantize(&x, &mut got) };
                let mut want = vec![0u8; GgmlType::Q8_1.row_bytes(x.len()).unwrap().max(rb)];
                match partner {
                    ActLayout::Blocks(GgmlType::Q8_0) => {
                        want.truncate(rb);
                        scalar_quantize::<BlockQ8_0>(&x, &mut want)
                    }
                    ActLayout::Blocks(GgmlType::Q8_1) => {
                        want.truncate(rb);
                        scalar_quantize::<BlockQ8_1>(&x, &mut want)
                    }
                    ActLayout::Blocks(GgmlType::Q8_K) => {
                        want.truncate(rb);
                        scalar_quantize::<BlockQ8K>(&x, &mut want)
                    }
                    ActLayout::Split32 => {
                        want.truncate(GgmlType::Q8_1.row_bytes(x.len()).unwrap());
                        scalar_quantize::<BlockQ8_1>(&x, &mut want);
                        got = split_to_q8_1(&got, x.len());
                    }
                    other => panic!("unexpected partner {other:?}"),
                }
                assert!(
                    got == want,
                    "{isa} {partner:?} quantizer (for {ty}) differs from scalar"
                );
            }
        }
    }
}
