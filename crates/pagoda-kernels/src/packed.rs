//! Load-time repacked weights: 16 rows of one matrix interleaved into one *strip* (Q4_0,
//! Q4_1 and the INT4 g32 types stored as those, Q5_0, Q8_0, MXFP4, INT8 per-channel rows,
//! Q4_K and Q6_K super-blocks), so that a single AVX-512 VNNI `vpdpbusd` multiplies 4 codes of 16 rows
//! by a 4-byte broadcast of one token's activation codes, and each block's scales of 16 rows
//! are one vector. The row layout instead unpacks a scale (and a minimum) per block and row,
//! and sums lanes per row at the end; on a decode step that arithmetic, not memory, bounded
//! these products.
//!
//! Strip `s` (rows `16s .. 16s + 16`) of a matrix with `nb = cols / 32` blocks per row (the
//! 32-column types; the k-quants: see `pack_q4k_block` and `pack_q6k_block`):
//!
//! ```text
//! per block b, in order (one sequential stream):
//! codes   256 bytes   4-bit: vector k (0..4) = 64 bytes; bytes 4l .. 4l + 4 are
//!                     qs[4k .. 4k + 4] of row l's block b: the low nibble of byte j is
//!                     column 4k + j, the high nibble column 16 + 4k + j
//!         512 bytes   Q8_0: vector k (0..8): bytes 4l .. 4l + 4 are qs[4k .. 4k + 4] of
//!                     row l's block b, XOR 0x80 (code + 128, unsigned)
//! d       32 bytes    the 16 rows' f16 scales, row order
//!         16 bytes    MXFP4: the 16 rows' E8M0 exponents instead (codes as Q4_0's nibbles,
//!                     looked up in the codebook by the kernel)
//! m       32 bytes    (Q4_1 only) the 16 rows' f16 minimums
//!
//! Q5_0 blocks add, after the codes, eight 64-bit masks of the fifth bits (mask i, bit 4l + j:
//! row l, column 4i + j), 64 bytes, before d.
//!
//! INT8 per-channel strips start with the 16 rows' f32 scales (64 bytes), then per block
//! the 512 code bytes as for Q8_0 (no per-block scale).
//! ```
//!
//! A strip is exactly the bytes of its 16 rows in the row layout, reordered, so packing never
//! grows a model. `pack_into` and `unpack_row` convert (callers pack through
//! [`WeightMatrix::pack`](crate::WeightMatrix::pack)); the products of strip matrices are in
//! `matmul`. This module knows bytes and formats only: it imports no product code, so the
//! strip kernels (`simd/avx512_packed.rs`) and `matmul` both build on it.
//!
//! Invariants: only types for which [`packable`] holds are packed (`rows` a multiple of
//! [`STRIP_ROWS`], `cols` of 32); a packed matrix's bytes are `rows * row_bytes(cols)`.

use crate::{GgmlType, KernelError};

/// Rows per strip.
pub const STRIP_ROWS: usize = 16;

/// How a weight matrix's bytes are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightLayout {
    /// Row after row, each row its blocks in order: the file's own layout.
    #[default]
    Rows,
    /// Strips of [`STRIP_ROWS`] rows ([`WeightMatrix::pack`](crate::WeightMatrix::pack)).
    Strips16,
}

/// What the strips of one weight type hold, and where its row-layout blocks keep it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StripFormat {
    /// Codes are nibbles (two per byte), else bytes.
    pub(crate) nibbles: bool,
    /// Blocks carry a minimum (paired with the activation sums).
    pub(crate) min: bool,
    /// Subtracted from every stored code (8 for Q4_0, 128 for Q8_0's flipped codes): taken
    /// off with the block's integer activation sum.
    pub(crate) offset: i32,
    /// Row-layout block: offsets of the f16 scale, the f16 minimum and the codes; its bytes.
    d_at: usize,
    m_at: usize,
    q_at: usize,
    block_bytes: usize,
    /// XORed into every code byte when packing (0x80: Q8_0's signed codes stored as
    /// unsigned `code + 128`, as `vpdpbusd` wants them).
    flip: u8,
    /// One f32 scale per row (INT8 per-channel) instead of per block: a strip starts with
    /// the 16 rows' scales (64 bytes) and its blocks are codes only.
    pub(crate) row_scale: bool,
    /// Q4_K super-blocks of 256 columns ([`pack_q4k_block`]); the fields above are unused.
    pub(crate) q4k: bool,
    /// Q6_K super-blocks of 256 columns ([`pack_q6k_block`]); the fields above are unused.
    pub(crate) q6k: bool,
    /// A fifth code bit (Q5_0): after a block's nibble codes, eight 64-bit masks, mask `i`
    /// bit `4l + j` = the fifth bit of row `l`, column `4i + j`.
    pub(crate) high5: bool,
    /// MXFP4: the scale is one E8M0 byte per row and block (16 bytes per strip block), and
    /// the nibbles index the codebook (`quant::mxfp4::KVALUES`, looked up plus `offset`).
    pub(crate) e8m0: bool,
}

impl StripFormat {
    /// Columns of one block.
    pub(crate) fn block_cols(self) -> usize {
        if self.q4k || self.q6k {
            256
        } else {
            32
        }
    }

    /// Code bytes of one row's block.
    fn row_codes(self) -> usize {
        if self.nibbles {
            16
        } else {
            32
        }
    }

    /// Code bytes of one block of a strip.
    pub(crate) fn strip_codes(self) -> usize {
        STRIP_ROWS * self.row_codes()
    }
}

/// The strip format of `ty`, `None` for types that are not packed.
pub(crate) fn format(ty: GgmlType) -> Option<StripFormat> {
    let q4 = |min: bool| StripFormat {
        nibbles: true,
        min,
        offset: if min { 0 } else { 8 },
        d_at: 0,
        m_at: 2,
        q_at: if min { 4 } else { 2 },
        block_bytes: if min { 20 } else { 18 },
        flip: 0,
        row_scale: false,
        q4k: false,
        q6k: false,
        high5: false,
        e8m0: false,
    };
    let bytes = |row_scale: bool| StripFormat {
        nibbles: false,
        min: false,
        offset: 128,
        d_at: 0,
        m_at: 0,
        q_at: if row_scale { 0 } else { 2 },
        block_bytes: if row_scale { 32 } else { 34 },
        flip: 0x80,
        row_scale,
        q4k: false,
        q6k: false,
        high5: false,
        e8m0: false,
    };
    match ty {
        GgmlType::Q4_0 | GgmlType::Int4G32Sym => Some(q4(false)),
        GgmlType::Q4_1 | GgmlType::Int4G32 => Some(q4(true)),
        GgmlType::Q8_0 => Some(bytes(false)),
        GgmlType::Int8 => Some(bytes(true)),
        // Codebook values plus 12 are 0..=24: unsigned for `vpdpbusd`, 12 taken off with the
        // activation sums as Q4_0's 8.
        GgmlType::Mxfp4 => Some(StripFormat {
            offset: 12,
            q_at: 1,
            block_bytes: 17,
            e8m0: true,
            ..q4(false)
        }),
        GgmlType::Q5_0 => Some(StripFormat {
            offset: 16,
            q_at: 6,
            block_bytes: 22,
            high5: true,
            ..q4(false)
        }),
        GgmlType::Q4_K => Some(StripFormat {
            q_at: 16,
            block_bytes: 144,
            q4k: true,
            ..q4(true)
        }),
        GgmlType::Q6_K => Some(StripFormat {
            offset: 0,
            block_bytes: 210,
            q6k: true,
            ..bytes(false)
        }),
        _ => None,
    }
}

/// Whether `ty` with this shape can be packed into strips.
pub fn packable(ty: GgmlType, rows: usize, cols: usize) -> bool {
    format(ty).is_some_and(|f| cols % f.block_cols() == 0)
        && rows > 0
        && rows % STRIP_ROWS == 0
        && cols > 0
}

/// Whether packing pays on this CPU: the strip kernel needs AVX-512 with VNNI (elsewhere a
/// packed matrix is computed by unpacking it, which is correct but slow).
pub fn strips_are_fast() -> bool {
    crate::cpu::features().avx512_vnni && crate::Isa::Avx512.is_available()
}

/// Whether models should pack weights of `ty` (where [`strips_are_fast`]): every packable
/// type. (Q6_K was kept in rows until its strip kernel prefetched: without it, matmul_bench
/// at 2 threads gave 14-15 GB/s on 1536x8960 and 8960x1536 against the row kernel's 21-23;
/// with it 24-29 GB/s for one token and ~2.5x the row kernel's rate for four.)
pub fn strips_pay(ty: GgmlType) -> bool {
    format(ty).is_some()
}

/// Where one block of a strip keeps its parts: (block stride, scales' offset in the block,
/// minimums' offset in the block). Block `b` of a strip starts at `b * stride`: its codes,
/// then the 16 rows' f16 scales, then (with minimums) their f16 minimums, so a strip is one
/// sequential stream.
pub(crate) fn block_geometry(f: StripFormat) -> (usize, usize, usize) {
    if f.q4k {
        return (Q4K_STRIP_BLOCK, Q4K_D, Q4K_D + 32);
    }
    if f.q6k {
        return (STRIP_ROWS * 210, 0, 0);
    }
    let d_in = f.strip_codes() + if f.high5 { 64 } else { 0 };
    if f.row_scale {
        return (d_in, 0, 0);
    }
    let m_in = d_in + if f.e8m0 { STRIP_ROWS } else { 32 };
    (if f.min { m_in + 32 } else { m_in }, d_in, m_in)
}

/// Bytes before a strip's first block: the 16 rows' f32 scales for row-scaled formats.
pub(crate) fn strip_header(f: StripFormat) -> usize {
    if f.row_scale {
        4 * STRIP_ROWS
    } else {
        0
    }
}

/// `data` (`rows` rows of `ty` in the row layout, `cols` columns) reordered into strips,
/// in `out` (exactly `data.len()` bytes; align it to 64 for the fastest loads). Callers go
/// through [`WeightMatrix::pack`](crate::WeightMatrix::pack) /
/// [`WeightMatrix::pack_into`](crate::WeightMatrix::pack_into), which check the layout.
pub(crate) fn pack_into(
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: &[u8],
    out: &mut [u8],
) -> Result<(), KernelError> {
    if out.len() != data.len() {
        return Err(KernelError::Shape(format!(
            "{} bytes of room for a packed matrix of {} bytes",
            out.len(),
            data.len()
        )));
    }
    if !packable(ty, rows, cols) {
        return Err(not_packable(ty, rows, cols));
    }
    let Some(f) = format(ty) else {
        return Ok(()); // unreachable: `packable` holds
    };
    let nb = cols / f.block_cols();
    let (head, row_bytes) = (strip_header(f), data.len() / rows);
    let (stride, d_in, m_in) = block_geometry(f);
    for (s, strip) in out.chunks_exact_mut(head + nb * stride).enumerate() {
        let (scales, blocks) = strip.split_at_mut(head);
        for l in 0..STRIP_ROWS {
            let mut row = &data[(s * STRIP_ROWS + l) * row_bytes..][..row_bytes];
            if f.q4k || f.q6k {
                for (blk, dst) in row
                    .chunks_exact(f.block_bytes)
                    .zip(blocks.chunks_exact_mut(stride))
                {
                    if f.q4k {
                        pack_q4k_block(blk, l, dst);
                    } else {
                        pack_q6k_block(blk, l, dst);
                    }
                }
                continue;
            }
            if f.row_scale {
                scales[4 * l..4 * l + 4].copy_from_slice(&row[..4]);
                row = &row[4..];
            }
            for (blk, dst) in row
                .chunks_exact(f.block_bytes)
                .zip(blocks.chunks_exact_mut(stride))
            {
                for k in 0..f.row_codes() / 4 {
                    for j in 0..4 {
                        dst[64 * k + 4 * l + j] = blk[f.q_at + 4 * k + j] ^ f.flip;
                    }
                }
                if f.high5 {
                    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                    let shift = 4 * (l % 2);
                    for i in 0..8 {
                        let at = f.strip_codes() + 8 * i + l / 2;
                        let bits = ((qh >> (4 * i)) & 0xF) as u8;
                        dst[at] = (dst[at] & !(0xF << shift)) | (bits << shift);
                    }
                }
                if f.e8m0 {
                    dst[d_in + l] = blk[f.d_at];
                } else if !f.row_scale {
                    dst[d_in + 2 * l..][..2].copy_from_slice(&blk[f.d_at..f.d_at + 2]);
                }
                if f.min {
                    dst[m_in + 2 * l..][..2].copy_from_slice(&blk[f.m_at..f.m_at + 2]);
                }
            }
        }
    }
    Ok(())
}

/// The error for a matrix that cannot be in strips.
pub(crate) fn not_packable(ty: GgmlType, rows: usize, cols: usize) -> KernelError {
    KernelError::Shape(format!(
        "a {rows}x{cols} {} matrix cannot be packed into {STRIP_ROWS}-row strips",
        ty.name()
    ))
}

/// Bytes of one Q4_K super-block of a strip: 16 rows x 144, reordered.
const Q4K_STRIP_BLOCK: usize = STRIP_ROWS * 144;
/// Offset of the 16 rows' packed scale bytes in a Q4_K strip block (after the codes).
pub(crate) const Q4K_SCALES: usize = 2048;
/// Offset of the 16 rows' f16 `d` (then `dmin`, 32 bytes later).
const Q4K_D: usize = Q4K_SCALES + 192;

/// Row `l`'s Q4_K block (144 bytes: d, dmin, 12 scale bytes, 128 code bytes) into strip
/// block `dst`:
///
/// ```text
/// codes   2048 bytes   vector 8c + k (c 0..4, k 0..8): bytes 4l .. 4l + 4 are
///                      qs[32c + 4k .. + 4] of row l (low nibbles: sub-block 2c, high:
///                      sub-block 2c + 1, columns 4k .. 4k + 4 of each)
/// scales   192 bytes   vector i (0..3): bytes 4l .. 4l + 4 are scales[4i .. 4i + 4] of row l
///                      (the 6-bit pairs stay packed; the kernel unpacks 16 rows at once)
/// d, dmin   64 bytes   the 16 rows' f16 d, then their f16 dmin
/// ```
fn pack_q4k_block(src: &[u8], l: usize, dst: &mut [u8]) {
    for c in 0..4 {
        for k in 0..8 {
            dst[64 * (8 * c + k) + 4 * l..][..4].copy_from_slice(&src[16 + 32 * c + 4 * k..][..4]);
        }
    }
    for i in 0..3 {
        dst[Q4K_SCALES + 64 * i + 4 * l..][..4].copy_from_slice(&src[4 + 4 * i..][..4]);
    }
    dst[Q4K_D + 2 * l..][..2].copy_from_slice(&src[..2]);
    dst[Q4K_D + 32 + 2 * l..][..2].copy_from_slice(&src[2..4]);
}

/// Inverse of [`pack_q4k_block`] for row `l`.
fn unpack_q4k_block(src: &[u8], l: usize, dst: &mut [u8]) {
    for c in 0..4 {
        for k in 0..8 {
            dst[16 + 32 * c + 4 * k..][..4].copy_from_slice(&src[64 * (8 * c + k) + 4 * l..][..4]);
        }
    }
    for i in 0..3 {
        dst[4 + 4 * i..][..4].copy_from_slice(&src[Q4K_SCALES + 64 * i + 4 * l..][..4]);
    }
    dst[..2].copy_from_slice(&src[Q4K_D + 2 * l..][..2]);
    dst[2..4].copy_from_slice(&src[Q4K_D + 32 + 2 * l..][..2]);
}

/// Offsets in a Q6_K strip block: high code bits, group scales, `d`.
pub(crate) const Q6K_HIGH: usize = 2048;
pub(crate) const Q6K_SCALES: usize = Q6K_HIGH + 1024;
pub(crate) const Q6K_D: usize = Q6K_SCALES + 256;

/// Row `l`'s Q6_K block (210 bytes: ql, qh, 16 i8 group scales, d) into strip block `dst`,
/// as unsigned 6-bit codes `u = q + 32` of 8 chunks of 32 columns:
///
/// ```text
/// low     2048 bytes   chunk c, vector k (0..4): byte 4l + j holds u[32c + 4k + j] & 15
///                      (low nibble) and u[32c + 16 + 4k + j] & 15 (high nibble)
/// high    1024 bytes   chunk c, vector a (0..2): byte 4l + j holds, in bits 2m .. 2m + 2,
///                      u[32c + 4(4a + m) + j] >> 4
/// scales   256 bytes   group g (0..16): byte 16g + l is row l's scale
/// d         32 bytes   the 16 rows' f16 d
/// ```
fn pack_q6k_block(src: &[u8], l: usize, dst: &mut [u8]) {
    let u = q6k_codes(src);
    for c in 0..8 {
        for k in 0..4 {
            for j in 0..4 {
                let lo = u[32 * c + 4 * k + j] & 15;
                let hi = u[32 * c + 16 + 4 * k + j] & 15;
                dst[256 * c + 64 * k + 4 * l + j] = lo | (hi << 4);
            }
        }
        for a in 0..2 {
            for j in 0..4 {
                let mut bits = 0u8;
                for m in 0..4 {
                    bits |= (u[32 * c + 4 * (4 * a + m) + j] >> 4) << (2 * m);
                }
                dst[Q6K_HIGH + 128 * c + 64 * a + 4 * l + j] = bits;
            }
        }
    }
    for g in 0..16 {
        dst[Q6K_SCALES + 16 * g + l] = src[192 + g];
    }
    dst[Q6K_D + 2 * l..][..2].copy_from_slice(&src[208..210]);
}

/// Inverse of [`pack_q6k_block`] for row `l`.
fn unpack_q6k_block(src: &[u8], l: usize, dst: &mut [u8]) {
    let mut u = [0u8; 256];
    for c in 0..8 {
        for k in 0..4 {
            for j in 0..4 {
                let b = src[256 * c + 64 * k + 4 * l + j];
                u[32 * c + 4 * k + j] = b & 15;
                u[32 * c + 16 + 4 * k + j] = b >> 4;
            }
        }
        for a in 0..2 {
            for j in 0..4 {
                let bits = src[Q6K_HIGH + 128 * c + 64 * a + 4 * l + j];
                for m in 0..4 {
                    u[32 * c + 4 * (4 * a + m) + j] |= ((bits >> (2 * m)) & 3) << 4;
                }
            }
        }
    }
    // Back to Q6_K's own bit layout (see quant/q6_k.rs).
    for h in 0..2 {
        for i in 0..32 {
            let e = 128 * h + i;
            dst[64 * h + i] = (u[e] & 15) | ((u[e + 64] & 15) << 4);
            dst[64 * h + i + 32] = (u[e + 32] & 15) | ((u[e + 96] & 15) << 4);
            dst[128 + 32 * h + i] = (u[e] >> 4)
                | ((u[e + 32] >> 4) << 2)
                | ((u[e + 64] >> 4) << 4)
                | ((u[e + 96] >> 4) << 6);
        }
    }
    for g in 0..16 {
        dst[192 + g] = src[Q6K_SCALES + 16 * g + l];
    }
    dst[208..210].copy_from_slice(&src[Q6K_D + 2 * l..][..2]);
}

/// The 256 unsigned codes (`q + 32`, 0..64) of a Q6_K block, in element order.
fn q6k_codes(src: &[u8]) -> [u8; 256] {
    let (ql, qh) = (&src[..128], &src[128..192]);
    let mut u = [0u8; 256];
    for h in 0..2 {
        for i in 0..32 {
            let (a, b, hb) = (ql[64 * h + i], ql[64 * h + i + 32], qh[32 * h + i]);
            u[128 * h + i] = (a & 15) | ((hb & 3) << 4);
            u[128 * h + 32 + i] = (b & 15) | (((hb >> 2) & 3) << 4);
            u[128 * h + 64 + i] = (a >> 4) | (((hb >> 4) & 3) << 4);
            u[128 * h + 96 + i] = (b >> 4) | (((hb >> 6) & 3) << 4);
        }
    }
    u
}

/// Row `r` of a packed matrix (`ty`, `cols`, strips in `data`) back in the row layout, into
/// `out` (`ty.row_bytes(cols)` bytes). The caller checked `r` and the lengths.
pub(crate) fn unpack_row(ty: GgmlType, cols: usize, data: &[u8], r: usize, out: &mut [u8]) {
    let Some(f) = format(ty) else {
        return; // the caller validated a packed matrix
    };
    let nb = cols / f.block_cols();
    let (stride, d_in, m_in) = block_geometry(f);
    let head = strip_header(f);
    let (s, l) = (r / STRIP_ROWS, r % STRIP_ROWS);
    let strip = &data[s * (head + nb * stride)..][..head + nb * stride];
    let (scales, blocks) = strip.split_at(head);
    if f.q4k || f.q6k {
        for (blk, src) in out
            .chunks_exact_mut(f.block_bytes)
            .zip(blocks.chunks_exact(stride))
        {
            if f.q4k {
                unpack_q4k_block(src, l, blk);
            } else {
                unpack_q6k_block(src, l, blk);
            }
        }
        return;
    }
    let mut out = out;
    if f.row_scale {
        out[..4].copy_from_slice(&scales[4 * l..4 * l + 4]);
        out = &mut out[4..];
    }
    for (blk, src) in out
        .chunks_exact_mut(f.block_bytes)
        .zip(blocks.chunks_exact(stride))
    {
        for k in 0..f.row_codes() / 4 {
            for j in 0..4 {
                blk[f.q_at + 4 * k + j] = src[64 * k + 4 * l + j] ^ f.flip;
            }
        }
        if f.high5 {
            let mut qh = 0u32;
            for i in 0..8 {
                let bits = (src[f.strip_codes() + 8 * i + l / 2] >> (4 * (l % 2))) & 0xF;
                qh |= (bits as u32) << (4 * i);
            }
            blk[2..6].copy_from_slice(&qh.to_le_bytes());
        }
        if f.e8m0 {
            blk[f.d_at] = src[d_in + l];
        } else if !f.row_scale {
            blk[f.d_at..f.d_at + 2].copy_from_slice(&src[d_in + 2 * l..][..2]);
        }
        if f.min {
            blk[f.m_at..f.m_at + 2].copy_from_slice(&src[m_in + 2 * l..][..2]);
        }
    }
}

/// A whole packed matrix (`rows` rows of `ty`, `cols` columns, strips in `data`) back in
/// the row layout (the portable fallback of `matmul`). The caller validated the matrix.
pub(crate) fn unpack(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Vec<u8> {
    let row_bytes = data.len() / rows.max(1);
    let mut out = vec![0u8; data.len()];
    for (r, row) in out.chunks_exact_mut(row_bytes).enumerate() {
        unpack_row(ty, cols, data, r, row);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{quantize_row, WeightMatrix};

    fn matrix(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
        let rb = ty.row_bytes(cols).unwrap();
        let mut data = vec![0u8; rows * rb];
        for (r, dst) in data.chunks_exact_mut(rb).enumerate() {
            let src: Vec<f32> = (0..cols)
                .map(|c| (((r * 31 + c * 17) % 97) as f32 - 48.0) / 23.0)
                .collect();
            quantize_row(ty, &src, dst).unwrap();
        }
        data
    }

    #[test]
    fn packing_keeps_the_size_and_every_row_unpacks_to_its_bytes() {
        for ty in TYPES {
            let (rows, cols) = (48, 256);
            let data = matrix(ty, rows, cols);
            let w = WeightMatrix::new(ty, rows, cols, &data).unwrap();
            let packed = w.pack().unwrap();
            assert_eq!(packed.len(), data.len(), "{ty:?}");
            assert_ne!(packed, data, "{ty:?}: packing reorders bytes");
            let rb = ty.row_bytes(cols).unwrap();
            let mut row = vec![0u8; rb];
            for r in 0..rows {
                unpack_row(ty, cols, &packed, r, &mut row);
                assert_eq!(row, data[r * rb..(r + 1) * rb], "{ty:?} row {r}");
            }
            let pw = WeightMatrix::packed(ty, rows, cols, &packed).unwrap();
            assert_eq!(unpack(pw.ty, pw.rows, pw.cols, pw.data), data);
        }
    }

    fn activations(n: usize, cols: usize) -> Vec<f32> {
        (0..n * cols)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 700.0)
            .collect()
    }

    const TYPES: [GgmlType; 10] = [
        GgmlType::Mxfp4,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Int4G32,
        GgmlType::Int4G32Sym,
        GgmlType::Q8_0,
        GgmlType::Int8,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
    ];

    /// On every ISA, the packed matrix gives what the row layout gives (within the rounding
    /// of a different summation order), for decode, speculative and prefill batch sizes.
    #[test]
    fn packed_products_match_the_row_layout() {
        let (rows, cols) = (64, 512);
        for ty in TYPES {
            let data = matrix(ty, rows, cols);
            let w = WeightMatrix::new(ty, rows, cols, &data).unwrap();
            let packed = w.pack().unwrap();
            let pw = WeightMatrix::packed(ty, rows, cols, &packed).unwrap();
            for isa in crate::available_isas() {
                for n in [1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 18, 40] {
                    let x = activations(n, cols);
                    let mut want = vec![0.0; n * rows];
                    let mut got = vec![f32::NAN; n * rows];
                    crate::matmul_with_isa(isa, &w, &x, n, &mut want).unwrap();
                    crate::matmul_with_isa(isa, &pw, &x, n, &mut got).unwrap();
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                            "{ty:?} {isa:?} n={n} element {i}: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }

    /// A token's result does not depend on how many tokens share the call: each row of an
    /// n-token product equals that token's one-token product bit for bit (what greedy
    /// speculative decoding relies on), also through `matmul_group`.
    #[test]
    fn packed_results_are_batch_invariant_and_grouping_changes_nothing() {
        let (rows, cols) = (48, 256);
        let datas: Vec<Vec<u8>> = TYPES.iter().map(|&ty| matrix(ty, rows, cols)).collect();
        let packs: Vec<Vec<u8>> = TYPES
            .iter()
            .zip(&datas)
            .map(|(&ty, d)| {
                WeightMatrix::new(ty, rows, cols, d)
                    .unwrap()
                    .pack()
                    .unwrap()
            })
            .collect();
        let ws: Vec<WeightMatrix<'_>> = TYPES
            .iter()
            .zip(&packs)
            .map(|(&ty, p)| WeightMatrix::packed(ty, rows, cols, p).unwrap())
            .collect();
        let q5 = matrix(GgmlType::Q5_1, rows, cols);
        let mut group = ws.clone();
        group.push(WeightMatrix::new(GgmlType::Q5_1, rows, cols, &q5).unwrap());
        for n in [2, 5, 8, 17] {
            let x = activations(n, cols);
            let mut outs: Vec<Vec<f32>> = vec![vec![0.0; n * rows]; group.len()];
            let mut views: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
            crate::matmul_group(&group, &x, n, &mut views).unwrap();
            for (w, got) in group.iter().zip(&outs) {
                let mut all = vec![0.0; n * rows];
                crate::matmul(w, &x, n, &mut all).unwrap();
                assert_eq!(got, &all, "{:?} n={n}: group against alone", w.ty);
                for t in 0..n {
                    let mut one = vec![0.0; rows];
                    crate::matmul(w, &x[t * cols..(t + 1) * cols], 1, &mut one).unwrap();
                    assert_eq!(
                        &all[t * rows..(t + 1) * rows],
                        one.as_slice(),
                        "{:?} n={n} token {t}",
                        w.ty
                    );
                }
            }
        }
    }

    #[test]
    fn packed_rows_dequantize_like_the_row_layout() {
        let (rows, cols) = (32, 256);
        for ty in TYPES {
            let data = matrix(ty, rows, cols);
            let w = WeightMatrix::new(ty, rows, cols, &data).unwrap();
            let packed = w.pack().unwrap();
            let pw = WeightMatrix::packed(ty, rows, cols, &packed).unwrap();
            let (mut a, mut b) = (vec![0.0; cols], vec![0.0; cols]);
            for r in 0..rows {
                w.dequantize_row(r, &mut a).unwrap();
                pw.dequantize_row(r, &mut b).unwrap();
                assert_eq!(a, b, "{ty:?} row {r}");
            }
            assert!(pw.dequantize_row(rows, &mut b).is_err());
        }
    }

    #[test]
    fn unpackable_types_and_shapes_are_refused() {
        assert!(!packable(GgmlType::Q5_1, 16, 32));
        assert!(
            !packable(GgmlType::Q4_0, 8, 32),
            "rows not a multiple of 16"
        );
        assert!(!packable(GgmlType::Q4_0, 16, 48), "cols not whole blocks");
        let data = matrix(GgmlType::Q4_0, 8, 32);
        let w = WeightMatrix::new(GgmlType::Q4_0, 8, 32, &data).unwrap();
        assert!(w.pack().is_err());
        assert!(WeightMatrix::packed(GgmlType::Q4_0, 8, 32, &data).is_err());
        let q5k = matrix(GgmlType::Q5_K, 16, 256);
        assert!(WeightMatrix::packed(GgmlType::Q5_K, 16, 256, &q5k).is_err());
        assert!(
            !packable(GgmlType::Q4_K, 16, 128),
            "k-quants need whole 256-column blocks"
        );
        assert!(
            WeightMatrix::packed(GgmlType::Q4_0, 16, 32, &data).is_err(),
            "short data"
        );
    }
}
