//! The per-type row kernels of every ISA path, and the table [`kernel`] that picks one.
//!
//! Invariant: [`kernel`] is only called with an `isa` that [`Isa::is_available`] accepted;
//! the `unsafe` function pointers it returns may then be called with rows of matching
//! lengths (`w` one weight row, `a`/`x` one activation row of the same element count).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use crate::quant::{self, as_blocks, float, Block, VecDot};
use crate::quant::{
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
};
use crate::{GgmlType, Isa};

/// Dot of one quantized weight row with one quantized activation row (both as bytes).
pub(crate) type QDot = unsafe fn(w: &[u8], a: &[u8]) -> f32;
/// Dot of one float weight row (bytes) with one f32 activation row.
pub(crate) type FDot = unsafe fn(w: &[u8], x: &[f32]) -> f32;
/// Quantizes one activation row into the partner type.
pub(crate) type QuantizeRow = unsafe fn(x: &[f32], dst: &mut [u8]);

/// How matmul computes one output element for a weight type.
#[derive(Clone, Copy)]
pub(crate) enum RowKernel {
    /// Integer dot against activations quantized once per call to `partner`.
    Quant {
        partner: GgmlType,
        quantize: QuantizeRow,
        dot: QDot,
    },
    /// Float weights converted on the fly against f32 activations.
    Float { dot: FDot },
    /// No dot product for this type: each weight row is dequantized into scratch first.
    Dequant,
}

fn scalar_dot<B: VecDot>(w: &[u8], a: &[u8]) -> f32 {
    B::vec_dot(as_blocks::<B>(w), as_blocks::<B::Partner>(a))
}

fn scalar_quantize<B: Block>(x: &[f32], dst: &mut [u8]) {
    for (x, b) in x.chunks_exact(B::N).zip(quant::as_blocks_mut::<B>(dst)) {
        *b = B::quantize(x).expect("activation partner types all have quantizers");
    }
}

fn quant<B: VecDot>(dot: QDot) -> RowKernel {
    RowKernel::Quant {
        partner: <B::Partner as Block>::TYPE,
        quantize: scalar_quantize::<B::Partner>,
        dot,
    }
}

fn scalar_kernel(ty: GgmlType) -> RowKernel {
    match ty {
        GgmlType::F32 => RowKernel::Float {
            dot: float::dot_f32_row,
        },
        GgmlType::F16 => RowKernel::Float {
            dot: float::dot_f16_row,
        },
        GgmlType::BF16 => RowKernel::Float {
            dot: float::dot_bf16_row,
        },
        GgmlType::Q4_0 => quant::<BlockQ4_0>(scalar_dot::<BlockQ4_0>),
        GgmlType::Q4_1 => quant::<BlockQ4_1>(scalar_dot::<BlockQ4_1>),
        GgmlType::Q5_0 => quant::<BlockQ5_0>(scalar_dot::<BlockQ5_0>),
        GgmlType::Q5_1 => quant::<BlockQ5_1>(scalar_dot::<BlockQ5_1>),
        GgmlType::Q8_0 => quant::<BlockQ8_0>(scalar_dot::<BlockQ8_0>),
        GgmlType::Q4_K => quant::<BlockQ4K>(scalar_dot::<BlockQ4K>),
        GgmlType::Q5_K => quant::<BlockQ5K>(scalar_dot::<BlockQ5K>),
        GgmlType::Q6_K => quant::<BlockQ6K>(scalar_dot::<BlockQ6K>),
        GgmlType::Q8_1 | GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q8_K => RowKernel::Dequant,
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
