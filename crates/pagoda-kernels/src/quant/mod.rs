//! Weight formats: the GGUF block formats and the Pagoda-internal ones (`int8`, `int4`,
//! `nf4`: row-level functions, as INT8 and NF4_DQ rows carry a header), their byte layouts,
//! dequantization, reference quantization and the scalar dot products against their
//! activation partner types.
//!
//! Each format lives in its own file as a `#[repr(C)]` struct made only of byte arrays, so
//! its alignment is 1 and any byte slice of the right length (an unaligned mmap slice
//! included) can be viewed as a slice of blocks without copying.
//!
//! Invariant: a [`Block`] type has `size_of::<Self>() == Self::BYTES == TYPE.type_size()` and
//! `Self::N == TYPE.block_size()`, and every bit pattern is a valid value (checked by the
//! tests at the end of this file). The scalar code here is the reference every SIMD path is
//! tested against.

pub mod float;
pub mod int4;
pub mod int8;
pub mod mxfp4;
pub mod nf4;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;
mod search;

pub use mxfp4::BlockMxfp4;
pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q4_k::BlockQ4K;
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use q8_0::BlockQ8_0;
pub use q8_1::BlockQ8_1;
pub use q8_k::BlockQ8K;

use crate::{GgmlType, KernelError};

/// One quantized block format.
///
/// # Safety
/// Implementors must be `#[repr(C)]` structs of `u8` arrays only (alignment 1, no padding,
/// every bit pattern valid) of exactly `BYTES` bytes, so that [`as_blocks`] may reinterpret
/// any byte slice as blocks.
pub unsafe trait Block: Copy + Send + Sync + 'static {
    /// The GGUF type this block stores.
    const TYPE: GgmlType;
    /// Elements per block.
    const N: usize;
    /// Bytes per block.
    const BYTES: usize;

    /// Writes the block's `N` values to `out[..N]`.
    fn dequantize(&self, out: &mut [f32]);

    /// Quantizes `x[..N]` with the reference (ggml `*_ref`) rounding. `None` when the
    /// format has no quantizer here.
    fn quantize(x: &[f32]) -> Option<Self>;
}

/// A block format with an integer dot product against an activation partner format.
pub trait VecDot: Block {
    /// What activations are quantized to before the dot product (same `N`).
    type Partner: Block;

    /// `sum_i dequant(w)_i * dequant(a)_i` over whole rows of blocks (`w.len() == a.len()`).
    fn vec_dot(w: &[Self], a: &[Self::Partner]) -> f32;
}

/// Views `bytes` as blocks. Panics (a programming error) when the length is not a multiple
/// of the block size; callers validate lengths first.
#[inline]
pub fn as_blocks<B: Block>(bytes: &[u8]) -> &[B] {
    assert_eq!(std::mem::size_of::<B>(), B::BYTES);
    assert_eq!(
        bytes.len() % B::BYTES,
        0,
        "{} bytes is not whole {} blocks",
        bytes.len(),
        B::TYPE
    );
    // SAFETY: `Block` guarantees alignment 1, no padding and no invalid bit patterns, and the
    // length is a whole number of blocks.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / B::BYTES) }
}

/// Mutable version of [`as_blocks`].
#[inline]
pub fn as_blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    assert_eq!(std::mem::size_of::<B>(), B::BYTES);
    assert_eq!(
        bytes.len() % B::BYTES,
        0,
        "{} bytes is not whole {} blocks",
        bytes.len(),
        B::TYPE
    );
    // SAFETY: as in `as_blocks`; the borrow is unique.
    unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / B::BYTES)
    }
}

/// Views blocks as their bytes.
#[inline]
pub fn blocks_as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    // SAFETY: `Block` types are plain bytes without padding.
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks))
    }
}

/// Little-endian f16 bytes to f32.
#[inline]
pub(crate) fn f16_le(b: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// f32 to little-endian f16 bytes (round to nearest even, like `GGML_FP32_TO_FP16`).
#[inline]
pub(crate) fn f16_to_le(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// `nearest_int` of ggml: round half to even, for values well inside the i32 range.
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

fn dequant_blocks<B: Block>(src: &[u8], dst: &mut [f32]) {
    for (b, out) in as_blocks::<B>(src).iter().zip(dst.chunks_exact_mut(B::N)) {
        b.dequantize(out);
    }
}

fn quant_blocks<B: Block>(src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    for (x, b) in src
        .chunks_exact(B::N)
        .zip(as_blocks_mut::<B>(dst).iter_mut())
    {
        *b = B::quantize(x).ok_or(KernelError::Unsupported(B::TYPE))?;
    }
    Ok(())
}

/// Dequantizes one row of `dst.len()` elements of type `ty` from `src`
/// (`src.len()` must be `ty.row_bytes(dst.len())`).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    let expected = ty.row_bytes(dst.len())?;
    if src.len() != expected {
        return Err(KernelError::WrongByteLength {
            ty,
            expected,
            actual: src.len(),
            what: format!("a row of {} elements", dst.len()),
        });
    }
    match ty {
        GgmlType::F32 => float::f32_from_le(src, dst),
        GgmlType::F16 => float::f16_to_f32_row(src, dst),
        GgmlType::BF16 => float::bf16_to_f32_row(src, dst),
        GgmlType::Q4_0 => dequant_blocks::<BlockQ4_0>(src, dst),
        GgmlType::Q4_1 => dequant_blocks::<BlockQ4_1>(src, dst),
        GgmlType::Q5_0 => dequant_blocks::<BlockQ5_0>(src, dst),
        GgmlType::Q5_1 => dequant_blocks::<BlockQ5_1>(src, dst),
        GgmlType::Q8_0 => dequant_blocks::<BlockQ8_0>(src, dst),
        GgmlType::Q8_1 => dequant_blocks::<BlockQ8_1>(src, dst),
        GgmlType::Q2_K => dequant_blocks::<BlockQ2K>(src, dst),
        GgmlType::Q3_K => dequant_blocks::<BlockQ3K>(src, dst),
        GgmlType::Q4_K => dequant_blocks::<BlockQ4K>(src, dst),
        GgmlType::Q5_K => dequant_blocks::<BlockQ5K>(src, dst),
        GgmlType::Q6_K => dequant_blocks::<BlockQ6K>(src, dst),
        GgmlType::Q8_K => dequant_blocks::<BlockQ8K>(src, dst),
        GgmlType::Mxfp4 => dequant_blocks::<BlockMxfp4>(src, dst),
        GgmlType::Int8 => int8::dequantize(src, dst),
        GgmlType::Int4G32 => dequant_blocks::<BlockQ4_1>(src, dst),
        GgmlType::Int4G32Sym => dequant_blocks::<BlockQ4_0>(src, dst),
        GgmlType::Int4G64 => int4::dequantize_row(src, 64, false, dst),
        GgmlType::Int4G64Sym => int4::dequantize_row(src, 64, true, dst),
        GgmlType::Int4G128 => int4::dequantize_row(src, 128, false, dst),
        GgmlType::Int4G128Sym => int4::dequantize_row(src, 128, true, dst),
        GgmlType::Nf4 => nf4::dequantize_row(src, dst),
        GgmlType::Nf4Dq => nf4::dequantize_row_dq(src, dst),
    }
    Ok(())
}

/// Quantizes one row `src` into `ty` with reference-quality rounding (ggml's `*_ref`);
/// `dst.len()` must be `ty.row_bytes(src.len())`. Q2_K and Q3_K have no quantizer here
/// ([`KernelError::Unsupported`]).
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    let expected = ty.row_bytes(src.len())?;
    if dst.len() != expected {
        return Err(KernelError::WrongByteLength {
            ty,
            expected,
            actual: dst.len(),
            what: format!("the output of quantizing {} elements", src.len()),
        });
    }
    match ty {
        GgmlType::F32 => float::f32_to_le(src, dst),
        GgmlType::F16 => float::f32_to_f16_row(src, dst),
        GgmlType::BF16 => float::f32_to_bf16_row(src, dst),
        GgmlType::Q4_0 => quant_blocks::<BlockQ4_0>(src, dst)?,
        GgmlType::Q4_1 => quant_blocks::<BlockQ4_1>(src, dst)?,
        GgmlType::Q5_0 => quant_blocks::<BlockQ5_0>(src, dst)?,
        GgmlType::Q5_1 => quant_blocks::<BlockQ5_1>(src, dst)?,
        GgmlType::Q8_0 => quant_blocks::<BlockQ8_0>(src, dst)?,
        GgmlType::Q8_1 => quant_blocks::<BlockQ8_1>(src, dst)?,
        GgmlType::Q2_K => quant_blocks::<BlockQ2K>(src, dst)?,
        GgmlType::Q3_K => quant_blocks::<BlockQ3K>(src, dst)?,
        GgmlType::Q4_K => quant_blocks::<BlockQ4K>(src, dst)?,
        GgmlType::Q5_K => quant_blocks::<BlockQ5K>(src, dst)?,
        GgmlType::Q6_K => quant_blocks::<BlockQ6K>(src, dst)?,
        GgmlType::Q8_K => quant_blocks::<BlockQ8K>(src, dst)?,
        GgmlType::Mxfp4 => quant_blocks::<BlockMxfp4>(src, dst)?,
        GgmlType::Int8 => int8::quantize(src, dst),
        GgmlType::Int4G32 => int4::quantize_row(src, 32, false, dst),
        GgmlType::Int4G32Sym => int4::quantize_row(src, 32, true, dst),
        GgmlType::Int4G64 => int4::quantize_row(src, 64, false, dst),
        GgmlType::Int4G64Sym => int4::quantize_row(src, 64, true, dst),
        GgmlType::Int4G128 => int4::quantize_row(src, 128, false, dst),
        GgmlType::Int4G128Sym => int4::quantize_row(src, 128, true, dst),
        GgmlType::Nf4 => nf4::quantize_row(src, dst),
        GgmlType::Nf4Dq => nf4::quantize_row_dq(src, dst),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry<B: Block>() {
        assert_eq!(std::mem::size_of::<B>(), B::BYTES, "{}", B::TYPE);
        assert_eq!(std::mem::align_of::<B>(), 1, "{}", B::TYPE);
        assert_eq!(B::BYTES, B::TYPE.type_size(), "{}", B::TYPE);
        assert_eq!(B::N, B::TYPE.block_size(), "{}", B::TYPE);
    }

    #[test]
    fn block_structs_match_the_dtype_table() {
        geometry::<BlockQ4_0>();
        geometry::<BlockQ4_1>();
        geometry::<BlockQ5_0>();
        geometry::<BlockQ5_1>();
        geometry::<BlockQ8_0>();
        geometry::<BlockQ8_1>();
        geometry::<BlockQ2K>();
        geometry::<BlockQ3K>();
        geometry::<BlockQ4K>();
        geometry::<BlockQ5K>();
        geometry::<BlockQ6K>();
        geometry::<BlockQ8K>();
        geometry::<BlockMxfp4>();
    }

    #[test]
    fn nearest_int_rounds_half_to_even_like_ggml() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-0.4), 0);
    }
}
