//! Tensor element types: the GGUF ones as GGUF numbers them (`ggml_type`), plus
//! Pagoda-internal weight formats (INT8 per-channel, INT4 group-wise, NF4, NF4 with double
//! quantization) that only online quantization produces in memory and that have no GGUF id.
//!
//! Invariant: a row of `n` elements is valid only when `n` is a multiple of `block_size()`,
//! and it takes exactly [`GgmlType::row_bytes`]`(n)` bytes — the one place that knows a
//! row's geometry. For block types (every GGUF type, INT4, NF4: [`GgmlType::is_blockwise`])
//! that is `n / block_size()` blocks of `type_size()` bytes, so a row slices by blocks. The
//! row types add a header per row: INT8 is `[f32 scale][n x i8]`, NF4_DQ is
//! `[f32 mean][f32 scale per 256 blocks][i8 absmax code per block][32 code bytes per block]`;
//! their `type_size()` is the per-block payload without that header.

use crate::KernelError;

/// A tensor element type, numbered as in GGUF's `ggml_type`.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    BF16,
    /// MXFP4 (OCP microscaling FP4): 32 E2M1 codes with one shared E8M0 exponent.
    Mxfp4,
    /// INT8 per-channel (Pagoda-internal): one f32 scale per row, `absmax / 127`.
    Int8,
    /// INT4, groups of 32, asymmetric: Q4_1's block layout (f16 scale, f16 min).
    Int4G32,
    /// INT4, groups of 32, symmetric: Q4_0's block layout (f16 scale, codes offset by 8).
    Int4G32Sym,
    /// INT4, groups of 64, asymmetric: `[f16 d][f16 m][32 code bytes]`.
    Int4G64,
    /// INT4, groups of 64, symmetric: `[f16 d][32 code bytes]`.
    Int4G64Sym,
    /// INT4, groups of 128, asymmetric: `[f16 d][f16 m][64 code bytes]`.
    Int4G128,
    /// INT4, groups of 128, symmetric: `[f16 d][64 code bytes]`.
    Int4G128Sym,
    /// NF4 (QLoRA NormalFloat-4), blocks of 64: `[f32 absmax][32 code bytes]`.
    Nf4,
    /// NF4 with double-quantized absmaxes (a row type, see the module doc).
    Nf4Dq,
}

/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;

/// NF4 blocks whose absmaxes share one second-level f32 scale in NF4_DQ (QLoRA's 256).
pub const NF4_DQ_GROUP: usize = 256;

impl GgmlType {
    /// Every type this crate knows, in GGUF id order.
    pub const ALL: [GgmlType; 16] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::BF16,
        GgmlType::Mxfp4,
    ];

    /// The Pagoda-internal weight types: no GGUF id, produced only in memory by online
    /// quantization, never read from or written to a GGUF file.
    pub const INTERNAL: [GgmlType; 9] = [
        GgmlType::Int8,
        GgmlType::Int4G32,
        GgmlType::Int4G32Sym,
        GgmlType::Int4G64,
        GgmlType::Int4G64Sym,
        GgmlType::Int4G128,
        GgmlType::Int4G128Sym,
        GgmlType::Nf4,
        GgmlType::Nf4Dq,
    ];

    /// The type with GGUF id `id`, if this crate knows it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Self::ALL.into_iter().find(|t| t.id() == Some(id))
    }

    /// The GGUF `ggml_type` id; `None` for the Pagoda-internal types.
    pub fn id(self) -> Option<u32> {
        Some(match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::BF16 => 30,
            GgmlType::Mxfp4 => 39,
            GgmlType::Int8
            | GgmlType::Int4G32
            | GgmlType::Int4G32Sym
            | GgmlType::Int4G64
            | GgmlType::Int4G64Sym
            | GgmlType::Int4G128
            | GgmlType::Int4G128Sym
            | GgmlType::Nf4
            | GgmlType::Nf4Dq => return None,
        })
    }

    /// The name GGUF tools print (`Q4_K`, `F16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
            GgmlType::BF16 => "BF16",
            GgmlType::Mxfp4 => "MXFP4",
            GgmlType::Int8 => "INT8",
            GgmlType::Int4G32 => "INT4_G32",
            GgmlType::Int4G32Sym => "INT4_G32_SYM",
            GgmlType::Int4G64 => "INT4_G64",
            GgmlType::Int4G64Sym => "INT4_G64_SYM",
            GgmlType::Int4G128 => "INT4_G128",
            GgmlType::Int4G128Sym => "INT4_G128_SYM",
            GgmlType::Nf4 => "NF4",
            GgmlType::Nf4Dq => "NF4_DQ",
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1
            | GgmlType::Int8
            | GgmlType::Int4G32
            | GgmlType::Int4G32Sym
            | GgmlType::Mxfp4 => 32,
            GgmlType::Int4G64 | GgmlType::Int4G64Sym | GgmlType::Nf4 | GgmlType::Nf4Dq => 64,
            GgmlType::Int4G128 | GgmlType::Int4G128Sym => 128,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K => QK_K,
        }
    }

    /// Bytes per block (for the row types INT8 and NF4_DQ, the per-block payload without the
    /// row header: use [`GgmlType::row_bytes`] for sizes).
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q5_1 => 2 + 2 + 4 + 16,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q8_1 => 4 + 32,
            GgmlType::Q2_K => QK_K / 16 + QK_K / 4 + 2 + 2,
            GgmlType::Q3_K => QK_K / 8 + QK_K / 4 + 12 + 2,
            GgmlType::Q4_K => 2 + 2 + 12 + QK_K / 2,
            GgmlType::Q5_K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            GgmlType::Q6_K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            GgmlType::Q8_K => 4 + QK_K + QK_K / 16 * 2,
            GgmlType::Mxfp4 => 1 + 16,
            GgmlType::Int8 => 32,
            GgmlType::Int4G32 => 2 + 2 + 16,
            GgmlType::Int4G32Sym => 2 + 16,
            GgmlType::Int4G64 => 2 + 2 + 32,
            GgmlType::Int4G64Sym => 2 + 32,
            GgmlType::Int4G128 => 2 + 2 + 64,
            GgmlType::Int4G128Sym => 2 + 64,
            GgmlType::Nf4 => 4 + 32,
            GgmlType::Nf4Dq => 1 + 32,
        }
    }

    /// True when a row is exactly `n / block_size()` blocks of `type_size()` bytes (no row
    /// header), so it can be sliced by blocks: every type but INT8 and NF4_DQ.
    pub fn is_blockwise(self) -> bool {
        !matches!(self, GgmlType::Int8 | GgmlType::Nf4Dq)
    }

    /// True for the Pagoda-internal types (no GGUF id).
    pub fn is_internal(self) -> bool {
        self.id().is_none()
    }

    /// Bytes taken by a row of `n` elements, or an error when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Result<usize, KernelError> {
        let bs = self.block_size();
        if n % bs != 0 {
            return Err(KernelError::PartialBlock {
                ty: self,
                elements: n,
            });
        }
        let overflow = || KernelError::SizeOverflow {
            ty: self,
            elements: n,
        };
        let blocks = (n / bs)
            .checked_mul(self.type_size())
            .ok_or_else(overflow)?;
        let header = match self {
            GgmlType::Int8 => 4,
            GgmlType::Nf4Dq => 4 + 4 * (n / bs).div_ceil(NF4_DQ_GROUP),
            _ => 0,
        };
        blocks.checked_add(header).ok_or_else(overflow)
    }

    /// True for the block-quantized types (everything but F32, F16, BF16).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for GgmlType {
    type Err = KernelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .chain(Self::INTERNAL)
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| KernelError::UnknownTypeName(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id().unwrap()), Some(t));
            assert_eq!(t.name().parse::<GgmlType>().unwrap(), t);
        }
        assert_eq!(GgmlType::from_id(4), None); // removed Q4_2
        assert_eq!(GgmlType::from_id(9999), None);
        for t in GgmlType::INTERNAL {
            assert_eq!(t.id(), None);
            assert!(t.is_internal() && t.is_quantized());
            assert_eq!(t.name().parse::<GgmlType>().unwrap(), t);
        }
    }

    #[test]
    fn internal_row_geometry() {
        assert_eq!(GgmlType::Int8.row_bytes(64).unwrap(), 4 + 64);
        assert_eq!(GgmlType::Int4G64.row_bytes(128).unwrap(), 2 * 36);
        assert_eq!(GgmlType::Int4G128Sym.row_bytes(256).unwrap(), 2 * 66);
        assert_eq!(GgmlType::Nf4.row_bytes(128).unwrap(), 2 * 36);
        // 9 blocks: mean, one scale, 9 absmax codes, 9 x 32 code bytes.
        assert_eq!(GgmlType::Nf4Dq.row_bytes(576).unwrap(), 8 + 9 + 288);
        // 257 blocks need a second scale.
        assert_eq!(GgmlType::Nf4Dq.row_bytes(257 * 64).unwrap(), 12 + 257 * 33);
        assert!(GgmlType::Int4G128.row_bytes(64).is_err());
        // Bits per weight: NF4-DQ is QLoRA's 4.127 plus the per-row f32 mean on rows of 256
        // blocks (4.129).
        let bpw = |t: GgmlType, n: usize| t.row_bytes(n).unwrap() as f64 * 8.0 / n as f64;
        assert!((bpw(GgmlType::Nf4Dq, 16384) - (4.127 + 32.0 / 16384.0)).abs() < 1e-3);
        assert_eq!(bpw(GgmlType::Nf4, 1536), 4.5);
        assert_eq!(bpw(GgmlType::Int4G128Sym, 1536), 4.125);
        assert!((bpw(GgmlType::Int8, 1536) - 8.0208).abs() < 1e-3);
        assert!(GgmlType::Int8.row_bytes(33).is_err());
    }

    #[test]
    fn block_sizes_match_ggml() {
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q5_K.type_size(), 176);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q8_K.type_size(), 292);
        assert_eq!(GgmlType::Q2_K.type_size(), 84);
        assert_eq!(GgmlType::Q3_K.type_size(), 110);
        assert_eq!(GgmlType::Q8_0.row_bytes(64).unwrap(), 68);
        assert_eq!(GgmlType::Mxfp4.type_size(), 17);
        assert_eq!(GgmlType::from_id(39), Some(GgmlType::Mxfp4));
        assert!(GgmlType::Q8_0.row_bytes(33).is_err());
    }
}
