//! Paged key/value storage of one layer: a pool of fixed-size blocks addressed through
//! per-sequence block tables (PagedAttention's memory layout).
//!
//! Layout: `[n_blocks, block_size, kv_dim]`, token-major inside a block, so one position's
//! `kv_dim` values are contiguous and one kv head's rows sit at stride `kv_dim`. Position `p`
//! of a sequence lives in block `table[p / block_size]`, slot `p % block_size`.
//!
//! Element types ([`KvDtype`]): f16 (the default), f32, and FP8 E4M3 ([`crate::fp8`]) with one
//! static scale per storage (one layer's K, or its V): a value `x` is stored as
//! `E4m3::from_f32(x / scale)` and read as `code · scale`. The scale is [`FP8_DEFAULT_SCALE`]
//! (1.0) unless the storage is made with another ([`KvBlockStorage::new_fp8`]): vLLM's default
//! when a checkpoint carries no `k_scale` / `v_scale`, and the only choice that needs no
//! calibration and keeps a block's bytes exactly half of f16's (a per-block scale would have
//! to be fixed by a block's first token, or re-encode the block when a later token is larger).
//! Values beyond `448 · scale` saturate to it (`__NV_SATFINITE`).
//!
//! Invariants: storage never grows; a write or read through a table that does not cover the
//! position, or names a block outside the pool, is a caller bug and panics (the model checks
//! tables before calling). An FP8 storage's scale is fixed when it is made (its codes are only
//! meaningful under it); f16 and f32 storages have scale 1.

use crate::fp8::{self, E4m3};
use half::f16;
use std::fmt;
use std::str::FromStr;

/// Element type of stored keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum KvDtype {
    /// Half precision, as llama.cpp and vLLM store KV by default.
    #[default]
    F16,
    F32,
    /// FP8 E4M3 with a static per-storage scale (vLLM's `--kv-cache-dtype fp8`): half of
    /// f16's bytes, so twice the blocks in the same memory.
    Fp8E4m3,
}

/// The scale of an FP8 storage made without one (vLLM's default `k_scale = v_scale = 1.0`).
pub const FP8_DEFAULT_SCALE: f32 = 1.0;

impl KvDtype {
    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
            KvDtype::Fp8E4m3 => 1,
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
            KvDtype::Fp8E4m3 => "fp8",
        })
    }
}

impl FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" | "fp16" | "float16" | "half" => Ok(KvDtype::F16),
            "f32" | "fp32" | "float32" | "float" => Ok(KvDtype::F32),
            "fp8" | "fp8_e4m3" | "fp8-e4m3" | "e4m3" => Ok(KvDtype::Fp8E4m3),
            "fp8_e5m2" | "fp8-e5m2" | "e5m2" => Err(format!(
                "KV cache dtype `{s}` is not supported: FP8 KV is stored as E4M3 (use fp8)"
            )),
            _ => Err(format!(
                "unknown KV cache dtype `{s}` (expected f16, f32 or fp8)"
            )),
        }
    }
}

#[derive(Debug, Clone)]
enum Data {
    F16(Vec<f16>),
    F32(Vec<f32>),
    Fp8(Vec<E4m3>),
}

/// The K or the V blocks of one layer.
#[derive(Debug, Clone)]
pub struct KvBlockStorage {
    data: Data,
    /// Stored value × scale = the value (1 for f16 / f32).
    scale: f32,
    n_blocks: usize,
    block_size: usize,
    kv_dim: usize,
}

/// A borrowed view of one block's rows for one kv head, in the storage's own type.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BlockRows<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
    /// Codes, to be multiplied by the storage's [`KvBlockStorage::scale`].
    Fp8(&'a [E4m3]),
}

impl KvBlockStorage {
    /// Zeroed storage (the allocation is lazy: untouched pages cost no RAM); FP8 under
    /// [`FP8_DEFAULT_SCALE`] ([`KvBlockStorage::new_fp8`] takes another).
    pub fn new(dtype: KvDtype, n_blocks: usize, block_size: usize, kv_dim: usize) -> Self {
        let len = n_blocks * block_size * kv_dim;
        let data = match dtype {
            // `vec![f16::ZERO; n]` would write every element; zeroed u16s come from calloc.
            KvDtype::F16 => Data::F16(half::vec::HalfBitsVecExt::reinterpret_into(vec![0u16; len])),
            KvDtype::F32 => Data::F32(vec![0.0; len]),
            KvDtype::Fp8E4m3 => Data::Fp8(fp8::zeroed_vec(len)),
        };
        KvBlockStorage {
            data,
            // f16 and f32 are stored as themselves.
            scale: if dtype == KvDtype::Fp8E4m3 {
                FP8_DEFAULT_SCALE
            } else {
                1.0
            },
            n_blocks,
            block_size,
            kv_dim,
        }
    }

    /// Zeroed FP8 storage whose values are read as `code · scale`.
    ///
    /// Panics unless `scale` is finite and positive (a caller bug: scales come from code, not
    /// from requests).
    pub fn new_fp8(n_blocks: usize, block_size: usize, kv_dim: usize, scale: f32) -> Self {
        assert!(
            scale.is_finite() && scale > 0.0,
            "FP8 KV scale must be finite and positive, got {scale}"
        );
        let mut s = KvBlockStorage::new(KvDtype::Fp8E4m3, n_blocks, block_size, kv_dim);
        s.scale = scale;
        s
    }

    pub fn dtype(&self) -> KvDtype {
        match self.data {
            Data::F16(_) => KvDtype::F16,
            Data::F32(_) => KvDtype::F32,
            Data::Fp8(_) => KvDtype::Fp8E4m3,
        }
    }

    /// Stored value × scale = the value: 1 except for an FP8 storage made with another.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    pub fn memory_bytes(&self) -> usize {
        self.n_blocks * self.block_size * self.kv_dim * self.dtype().bytes()
    }

    /// Offset of position `p`'s row.
    fn offset(&self, block_table: &[u32], p: usize) -> usize {
        let block = block_table[p / self.block_size] as usize;
        assert!(
            block < self.n_blocks,
            "block {block} outside a pool of {}",
            self.n_blocks
        );
        (block * self.block_size + p % self.block_size) * self.kv_dim
    }

    /// Stores `rows` (`[n, kv_dim]` f32) at positions `start..start + n` of the sequence whose
    /// blocks are `block_table`.
    pub fn write(&mut self, block_table: &[u32], start: usize, rows: &[f32]) {
        let kv = self.kv_dim;
        assert_eq!(rows.len() % kv, 0, "rows are not a multiple of kv_dim");
        for (t, row) in rows.chunks_exact(kv).enumerate() {
            let at = self.offset(block_table, start + t);
            match &mut self.data {
                Data::F16(d) => {
                    half::slice::HalfFloatSliceExt::convert_from_f32_slice(
                        &mut d[at..at + kv],
                        row,
                    );
                }
                Data::F32(d) => d[at..at + kv].copy_from_slice(row),
                Data::Fp8(d) => fp8::encode_scaled(row, self.scale, &mut d[at..at + kv]),
            }
        }
    }

    /// Copies every slot of block `src` into block `dst` (copy-on-write of a shared block).
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let len = self.block_size * self.kv_dim;
        let (s, d) = (src as usize * len, dst as usize * len);
        assert!((src as usize) < self.n_blocks && (dst as usize) < self.n_blocks);
        match &mut self.data {
            Data::F16(v) => v.copy_within(s..s + len, d),
            Data::F32(v) => v.copy_within(s..s + len, d),
            Data::Fp8(v) => v.copy_within(s..s + len, d),
        }
    }

    /// Reads position `p` back as f32 (`out`: `[kv_dim]`).
    pub fn read_row(&self, block_table: &[u32], p: usize, out: &mut [f32]) {
        let at = self.offset(block_table, p);
        let kv = self.kv_dim;
        match &self.data {
            Data::F16(d) => {
                half::slice::HalfFloatSliceExt::convert_to_f32_slice(&d[at..at + kv], out)
            }
            Data::F32(d) => out.copy_from_slice(&d[at..at + kv]),
            Data::Fp8(d) => fp8::decode_scaled(&d[at..at + kv], self.scale, out),
        }
    }

    /// All `block_size * kv_dim` values of block `block`.
    pub(crate) fn block(&self, block: u32) -> BlockRows<'_> {
        let len = self.block_size * self.kv_dim;
        let s = block as usize * len;
        assert!(
            (block as usize) < self.n_blocks,
            "block {block} outside the pool"
        );
        match &self.data {
            Data::F16(d) => BlockRows::F16(&d[s..s + len]),
            Data::F32(d) => BlockRows::F32(&d[s..s + len]),
            Data::Fp8(d) => BlockRows::Fp8(&d[s..s + len]),
        }
    }
}

impl BlockRows<'_> {
    /// Converts `len` values from `offset` into `out` as f32 (FP8: the codes' values, not yet
    /// multiplied by the storage's scale).
    #[inline]
    pub(crate) fn to_f32(self, offset: usize, out: &mut [f32]) {
        let len = out.len();
        match self {
            BlockRows::F16(d) => {
                half::slice::HalfFloatSliceExt::convert_to_f32_slice(&d[offset..offset + len], out)
            }
            BlockRows::F32(d) => out.copy_from_slice(&d[offset..offset + len]),
            BlockRows::Fp8(d) => fp8::decode_scaled(&d[offset..offset + len], 1.0, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read_through_a_shuffled_table() {
        for dtype in [KvDtype::F16, KvDtype::F32] {
            let mut s = KvBlockStorage::new(dtype, 6, 4, 3);
            let table = [5u32, 0, 3];
            let rows: Vec<f32> = (0..10 * 3).map(|i| i as f32 * 0.5).collect();
            s.write(&table, 0, &rows[..5 * 3]);
            s.write(&table, 5, &rows[5 * 3..]);
            let mut out = [0.0; 3];
            for p in 0..10 {
                s.read_row(&table, p, &mut out);
                assert_eq!(&out[..], &rows[p * 3..p * 3 + 3], "{dtype} position {p}");
            }
            assert_eq!(s.memory_bytes(), 6 * 4 * 3 * dtype.bytes());
        }
    }

    #[test]
    fn copy_block_duplicates_every_slot() {
        let mut s = KvBlockStorage::new(KvDtype::F16, 3, 2, 2);
        s.write(&[1], 0, &[1.0, 2.0, 3.0, 4.0]);
        s.copy_block(1, 2);
        let mut out = [0.0; 2];
        s.read_row(&[2], 1, &mut out);
        assert_eq!(out, [3.0, 4.0]);
    }

    #[test]
    fn dtype_parses_and_prints() {
        assert_eq!("F16".parse::<KvDtype>(), Ok(KvDtype::F16));
        assert_eq!("fp32".parse::<KvDtype>(), Ok(KvDtype::F32));
        assert_eq!("fp8".parse::<KvDtype>(), Ok(KvDtype::Fp8E4m3));
        assert_eq!("FP8_E4M3".parse::<KvDtype>(), Ok(KvDtype::Fp8E4m3));
        assert_eq!(KvDtype::Fp8E4m3.to_string(), "fp8");
        assert_eq!(KvDtype::Fp8E4m3.bytes() * 2, KvDtype::F16.bytes());
        let e = "q3".parse::<KvDtype>().unwrap_err();
        assert!(e.contains("`q3`") && e.contains("fp8"), "{e}");
        let e = "fp8_e5m2".parse::<KvDtype>().unwrap_err();
        assert!(e.contains("E4M3"), "{e}");
        assert_eq!(KvDtype::default().to_string(), "f16");
    }

    #[test]
    fn fp8_rows_read_back_within_half_a_step_and_saturate() {
        for scale in [1.0f32, 0.25, 3.0] {
            let mut s = KvBlockStorage::new_fp8(4, 2, 4, scale);
            assert_eq!(s.scale(), scale);
            assert_eq!(s.memory_bytes(), 4 * 2 * 4);
            let rows = [0.3f32, -1.7, 5.0, 0.001, 100.0, -0.02, 2e4, -2e4];
            s.write(&[3, 1], 0, &rows);
            let mut out = [0.0f32; 4];
            for p in 0..2 {
                s.read_row(&[3, 1], p, &mut out);
                for (d, (&got, &x)) in out.iter().zip(&rows[p * 4..]).enumerate() {
                    let max = fp8::E4M3_MAX * scale;
                    let want = x.clamp(-max, max);
                    let step = (want.abs() / 16.0).max(scale * 2f32.powi(-10));
                    assert!(
                        (got - want).abs() <= step,
                        "scale {scale} p {p} d {d}: {got} vs {x}"
                    );
                }
            }
            s.copy_block(3, 0);
            s.read_row(&[0], 1, &mut out);
            let mut again = [0.0f32; 4];
            s.read_row(&[3], 1, &mut again);
            assert_eq!(out, again);
        }
    }
}
