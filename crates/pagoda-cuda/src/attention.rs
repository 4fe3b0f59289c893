//! Paged attention on the GPU: a batch's device-side metadata ([`AttentionBatch`], uploaded
//! once per forward step and shared by every layer), the per-layer parameters
//! ([`AttentionParams`]), the split-decode scratch ([`AttentionWorkspace`]) and
//! [`Kernels::paged_attention`].
//!
//! Semantics are `pagoda_kernels::paged_attention`'s: row `r` of a sequence sits at position
//! `start + (r - first_row)` and attends to `first_visible(window, pos) ..= pos` of its own
//! sequence (`max(0, pos + 1 - window)`, 0 without a window), K/V of position `t` at slot
//! `block_table[t / block_size] * block_size + t % block_size` of the bf16 or FP8 E4M3
//! caches (`[n_slots, n_kv_heads * head_dim]`; [`Kernels::paged_attention_fp8`] reads codes
//! under static [`Fp8Scales`], widened in registers by software on every architecture), query head `h` on kv head `h / (n_heads /
//! n_kv_heads)`, scores `scale · q·k`, soft-capped (`cap · tanh(s / cap)`) when set, softmax
//! and output in f32.
//!
//! Dispatch: a sequence with one row (a decode step) goes to the decode kernel, one block
//! per (sequence, query head, split of its visible positions: flash-decoding; the splits are
//! merged by a second kernel when there is more than one); a sequence with more rows (a
//! prefill chunk or a speculative verification) to the prefill kernel, one block per (tile
//! of 16 of its rows, query head), tiles of 32 positions in shared memory reused by the 16
//! rows. Both run on the same batch, each over its own list (decode sequences, prefill tiles)
//! built at upload.
//!
//! Invariants: [`AttentionBatch::upload`] checks that the sequences tile their rows in order
//! and that each block table covers its positions; [`Kernels::paged_attention`] checks the
//! parameters, the buffers' lengths, that every block the batch names lies inside both
//! caches and that the caches are 16-byte aligned (8-byte for FP8: the kernels read K/V rows
//! in chunks of 8 values), before launching anything.

use crate::error::CudaError;
use crate::gpu_context::GpuContext;
use crate::ops::{launch, Check, Fp8Scales, Kernels};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};
use half::bf16;
use std::sync::Arc;

/// Query rows per prefill block (`PF_BQ` in `attention.cu`).
const PREFILL_ROWS: usize = 16;
/// Threads of the attention kernels (`DEC_THREADS`, `PF_THREADS`).
const THREADS: u32 = 128;
/// Most positions one decode split covers (`DEC_SPLIT_MAX`).
const SPLIT_MAX: usize = 512;
/// Fewest positions of a decode split (when splitting to fill the GPU).
const SPLIT_MIN: usize = 64;
/// Decode blocks worth filling the GPU with (about two per SM of an H100/H200) before a
/// sequence's positions are split further than `SPLIT_MAX` requires.
const TARGET_BLOCKS: usize = 264;
/// Largest head_dim the kernels hold in shared memory (`MAX_HD`).
const MAX_HEAD_DIM: usize = 256;
/// Most blocks along gridDim.y / gridDim.z.
const MAX_GRID_YZ: usize = 65535;

/// One sequence of a batch, as the host knows it.
#[derive(Debug, Clone, Copy)]
pub struct SeqSpan<'a> {
    /// First row of the batch (of `q` / `out`) that belongs to the sequence.
    pub first_row: usize,
    /// Its rows (0 is allowed: the sequence is skipped).
    pub rows: usize,
    /// Position of its first row.
    pub start: usize,
    /// Blocks holding positions `0..start + rows` (longer is fine).
    pub block_table: &'a [u32],
}

/// Per-layer attention parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    pub n_heads: usize,
    /// Divides `n_heads`.
    pub n_kv_heads: usize,
    /// A multiple of 8 (a K/V head row is whole 16-byte chunks), at most 256.
    pub head_dim: usize,
    /// Must equal the batch's.
    pub block_size: usize,
    /// Multiplier on q·k.
    pub scale: f32,
    /// `cap · tanh(s / cap)` on the scaled scores (cap finite and > 0).
    pub softcap: Option<f32>,
    /// Attend only to the last `window` positions, the query's own included (> 0).
    pub window: Option<usize>,
}

/// Offsets (in i32 elements) of the arrays packed in [`AttentionBatch`]'s metadata buffer.
#[derive(Debug, Clone, Copy, Default)]
struct MetaOffsets {
    seq_first_row: usize,
    seq_rows: usize,
    seq_start: usize,
    seq_table_off: usize,
    tables: usize,
    decode_seqs: usize,
    prefill_tiles: usize,
}

/// A batch's attention metadata on the device, built by [`AttentionBatch::upload`].
#[derive(Debug)]
pub struct AttentionBatch {
    positions: CudaSlice<i32>,
    slots: CudaSlice<i32>,
    /// Per sequence: first row, rows, start, offset of its block table; the block tables;
    /// the decode sequences; the prefill tiles (sequence, first row within it).
    meta: CudaSlice<i32>,
    off: MetaOffsets,
    total_rows: usize,
    block_size: usize,
    n_decode: usize,
    n_tiles: usize,
    /// Largest position of a decode row (sizes the splits).
    max_decode_pos: usize,
    /// Largest block any sequence uses (checked against the caches per call).
    max_block: Option<u32>,
}

fn upload_err(message: String) -> CudaError {
    CudaError::Shape {
        kernel: "AttentionBatch::upload",
        message,
    }
}

fn to_i32(what: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| upload_err(format!("{what} = {v} exceeds i32::MAX")))
}

impl AttentionBatch {
    /// Uploads the metadata of `seqs` (whose rows tile `0..total` in order) for caches of
    /// `block_size` positions per block: three host-to-device copies (positions, slots, and
    /// everything else packed into one buffer).
    pub fn upload(
        ctx: &GpuContext,
        seqs: &[SeqSpan<'_>],
        block_size: usize,
    ) -> Result<AttentionBatch, CudaError> {
        Self::upload_on(ctx.stream(), seqs, block_size)
    }

    fn upload_on(
        stream: &Arc<CudaStream>,
        seqs: &[SeqSpan<'_>],
        block_size: usize,
    ) -> Result<AttentionBatch, CudaError> {
        let h = HostBatch::plan(seqs, block_size)?;
        // cudarc cannot allocate zero bytes: an empty array gets one unused element.
        let copy = |mut v: Vec<i32>, call: &'static str| {
            if v.is_empty() {
                v.push(0);
            }
            stream.clone_htod(&v).map_err(|e| CudaError::Driver {
                call,
                message: e.to_string(),
            })
        };
        Ok(AttentionBatch {
            positions: copy(h.positions, "cuMemcpyHtoDAsync (positions)")?,
            slots: copy(h.slots, "cuMemcpyHtoDAsync (slots)")?,
            meta: copy(h.meta, "cuMemcpyHtoDAsync (attention metadata)")?,
            off: h.off,
            total_rows: h.total_rows,
            block_size,
            n_decode: h.n_decode,
            n_tiles: h.n_tiles,
            max_decode_pos: h.max_decode_pos,
            max_block: h.max_block,
        })
    }
}

/// [`AttentionBatch`]'s arrays on the host, checked.
#[derive(Debug)]
struct HostBatch {
    positions: Vec<i32>,
    slots: Vec<i32>,
    meta: Vec<i32>,
    off: MetaOffsets,
    total_rows: usize,
    n_decode: usize,
    n_tiles: usize,
    max_decode_pos: usize,
    max_block: Option<u32>,
}

impl HostBatch {
    fn plan(seqs: &[SeqSpan<'_>], block_size: usize) -> Result<HostBatch, CudaError> {
        if block_size == 0 {
            return Err(upload_err("block_size 0".to_string()));
        }
        to_i32("block_size", block_size)?;
        let mut positions = Vec::new();
        let mut slots = Vec::new();
        let mut first_rows = Vec::with_capacity(seqs.len());
        let mut rows = Vec::with_capacity(seqs.len());
        let mut starts = Vec::with_capacity(seqs.len());
        let mut table_offs = Vec::with_capacity(seqs.len());
        let mut tables: Vec<i32> = Vec::new();
        let mut decode = Vec::new();
        let mut tiles = Vec::new();
        let mut max_decode_pos = 0;
        let mut max_block: Option<u32> = None;
        let mut next_row = 0usize;
        for (i, s) in seqs.iter().enumerate() {
            if s.first_row != next_row {
                return Err(upload_err(format!(
                    "sequence {i} starts at row {} but the rows before it end at {next_row}: \
                     sequences must tile the rows in order",
                    s.first_row
                )));
            }
            let end = s
                .start
                .checked_add(s.rows)
                .ok_or_else(|| upload_err(format!("sequence {i}: start + rows overflows")))?;
            to_i32("a position", end)?;
            // An empty sequence reads nothing, so needs no block (as on the CPU).
            let needed = if s.rows == 0 {
                0
            } else {
                end.div_ceil(block_size)
            };
            if s.block_table.len() < needed {
                return Err(upload_err(format!(
                    "sequence {i}: block table of {} blocks does not cover positions 0..{end} \
                     ({needed} blocks of {block_size})",
                    s.block_table.len()
                )));
            }
            let table = &s.block_table[..needed];
            if let Some(&b) = table.iter().max() {
                // Every slot of the block must be an i32.
                let last_slot = (b as usize + 1)
                    .checked_mul(block_size)
                    .ok_or_else(|| upload_err(format!("sequence {i}: block {b} overflows")))?;
                to_i32("a slot", last_slot)?;
                max_block = Some(max_block.map_or(b, |m| m.max(b)));
            }
            first_rows.push(to_i32("a row", s.first_row)?);
            rows.push(to_i32("rows", s.rows)?);
            starts.push(to_i32("start", s.start)?);
            table_offs.push(to_i32("block table entries", tables.len())?);
            tables.extend(table.iter().map(|&b| b as i32));
            for p in s.start..end {
                positions.push(p as i32);
                slots.push((table[p / block_size] as usize * block_size + p % block_size) as i32);
            }
            match s.rows {
                0 => {}
                1 => {
                    decode.push(i as i32);
                    max_decode_pos = max_decode_pos.max(s.start);
                }
                n => {
                    for r0 in (0..n).step_by(PREFILL_ROWS) {
                        tiles.push(i as i32);
                        tiles.push(r0 as i32);
                    }
                }
            }
            next_row += s.rows;
        }
        to_i32("rows", next_row)?;
        let mut meta = Vec::new();
        let mut push = |a: &[i32]| {
            let at = meta.len();
            meta.extend_from_slice(a);
            at
        };
        let off = MetaOffsets {
            seq_first_row: push(&first_rows),
            seq_rows: push(&rows),
            seq_start: push(&starts),
            seq_table_off: push(&table_offs),
            tables: push(&tables),
            decode_seqs: push(&decode),
            prefill_tiles: push(&tiles),
        };
        to_i32("metadata", meta.len())?;
        Ok(HostBatch {
            positions,
            slots,
            meta,
            off,
            total_rows: next_row,
            n_decode: decode.len(),
            n_tiles: tiles.len() / 2,
            max_decode_pos,
            max_block,
        })
    }
}

impl AttentionBatch {
    /// The absolute position of every row (`[total_rows]`, for `Kernels::rope`; at least one
    /// element even when there is no row).
    pub fn positions(&self) -> &CudaSlice<i32> {
        &self.positions
    }

    /// The KV slot of every row (`[total_rows]`, for `Kernels::kv_write`).
    pub fn slots(&self) -> &CudaSlice<i32> {
        &self.slots
    }

    /// Rows of the batch.
    pub fn total_rows(&self) -> usize {
        self.total_rows
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Sequences that take the decode kernel (one row each).
    pub fn decode_sequences(&self) -> usize {
        self.n_decode
    }

    /// Blocks of 16 query rows that take the prefill kernel (per head).
    pub fn prefill_tiles(&self) -> usize {
        self.n_tiles
    }
}

/// Scratch of split decoding, grown when a call needs more (never shrunk).
#[derive(Debug, Default)]
pub struct AttentionWorkspace {
    /// Per (decode sequence, head, split): unnormalised accumulator `[head_dim]`.
    acc: Option<CudaSlice<f32>>,
    /// Per (decode sequence, head, split): running max and sum.
    ml: Option<CudaSlice<f32>>,
}

impl AttentionWorkspace {
    pub fn new() -> Self {
        Self::default()
    }

    /// Device memory it holds, in bytes.
    pub fn bytes(&self) -> usize {
        let len = |s: &Option<CudaSlice<f32>>| s.as_ref().map_or(0, |s| s.len());
        (len(&self.acc) + len(&self.ml)) * 4
    }
}

/// `buf` holding at least `n` values (reallocated on `stream` when shorter).
fn grow(
    buf: &mut Option<CudaSlice<f32>>,
    stream: &Arc<CudaStream>,
    n: usize,
) -> Result<(), CudaError> {
    if buf.as_ref().is_none_or(|b| b.len() < n) {
        *buf = None; // free first: the old buffer is not needed
        *buf = Some(
            stream
                .alloc_zeros::<f32>(n)
                .map_err(|e| CudaError::Driver {
                    call: "cuMemAllocAsync (attention workspace)",
                    message: format!("{e} ({n} floats)"),
                })?,
        );
    }
    Ok(())
}

/// Positions per split and splits for decode rows that see up to `visible` positions, with
/// `base` (sequence, head) blocks before splitting.
fn split_plan(visible: usize, base: usize) -> (usize, usize) {
    let want = TARGET_BLOCKS.div_ceil(base.max(1)).max(1);
    let len = visible
        .div_ceil(want)
        .next_multiple_of(SPLIT_MIN)
        .clamp(SPLIT_MIN, SPLIT_MAX);
    (len, visible.div_ceil(len).max(1))
}

impl Kernels {
    /// Attention of every row of `batch` (see the module doc): `q` and `out` are
    /// `[total_rows, n_heads * head_dim]` f32, `k_cache` / `v_cache` bf16 `[n_slots, n_kv_heads
    /// * head_dim]`. Rows of `out` of no sequence are left untouched.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        batch: &AttentionBatch,
        q: &impl DevicePtr<f32>,
        k_cache: &impl DevicePtr<bf16>,
        v_cache: &impl DevicePtr<bf16>,
        out: &mut impl DevicePtrMut<f32>,
        params: AttentionParams,
        sinks: Option<&CudaSlice<f32>>,
        workspace: &mut AttentionWorkspace,
    ) -> Result<(), CudaError> {
        self.attention_on(
            batch, q, k_cache, v_cache, out, params, sinks, workspace, None,
        )
    }

    /// As [`Kernels::paged_attention`] over FP8 E4M3 caches (codes as `u8`) read as
    /// `code · scale` (`pagoda_kernels::paged_attention` over FP8 storage).
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention_fp8(
        &self,
        batch: &AttentionBatch,
        q: &impl DevicePtr<f32>,
        k_cache: &impl DevicePtr<u8>,
        v_cache: &impl DevicePtr<u8>,
        out: &mut impl DevicePtrMut<f32>,
        params: AttentionParams,
        scales: Fp8Scales,
        sinks: Option<&CudaSlice<f32>>,
        workspace: &mut AttentionWorkspace,
    ) -> Result<(), CudaError> {
        let scales = scales.check("paged_attention_fp8")?;
        self.attention_on(
            batch,
            q,
            k_cache,
            v_cache,
            out,
            params,
            sinks,
            workspace,
            Some(scales),
        )
    }

    /// The body of both: `fp8` is `Some` for caches of E4M3 codes (`T` = `u8`), `None` for
    /// bf16 ones.
    #[allow(clippy::too_many_arguments)]
    fn attention_on<T>(
        &self,
        batch: &AttentionBatch,
        q: &impl DevicePtr<f32>,
        k_cache: &impl DevicePtr<T>,
        v_cache: &impl DevicePtr<T>,
        out: &mut impl DevicePtrMut<f32>,
        params: AttentionParams,
        sinks: Option<&CudaSlice<f32>>,
        workspace: &mut AttentionWorkspace,
        fp8: Option<Fp8Scales>,
    ) -> Result<(), CudaError> {
        let c = Check {
            kernel: if fp8.is_some() {
                "paged_attention_fp8"
            } else {
                "paged_attention"
            },
            stream: &self.stream,
        };
        let p = params;
        let (hd, nh, nkv) = (p.head_dim, p.n_heads, p.n_kv_heads);
        let (softcap, window) = checked_params(&c, &p, batch)?;
        if batch.total_rows == 0 || (batch.n_decode == 0 && batch.n_tiles == 0) {
            return Ok(());
        }
        let q_dim = c.mul("q row", nh, hd)?;
        let kv_dim = nkv * hd;
        let q_len = c.mul("q", batch.total_rows, q_dim)?;
        c.int("q", q_len)?;
        let n_slots = k_cache.len().min(v_cache.len()) / kv_dim;
        let blocks = n_slots / batch.block_size;
        if let Some(b) = batch.max_block {
            if b as usize >= blocks {
                return Err(c.shape(format!(
                    "the batch uses block {b} but the caches ({} and {} values, kv_dim \
                     {kv_dim}, block_size {}) hold {blocks} blocks",
                    k_cache.len(),
                    v_cache.len(),
                    batch.block_size
                )));
            }
        }
        let (nh_i, nkv_i, hd_i) = (nh as i32, c.int("n_kv_heads", nkv)?, hd as i32);
        let bs_i = batch.block_size as i32;
        // The keys' scale folds into the score scale (q · (code · s) = (q · code) · s); the
        // values' is applied by the kernels to the output.
        let (scale, v_scale) = match fp8 {
            Some(s) => (p.scale * s.k, s.v),
            None => (p.scale, 1.0f32),
        };
        let (qp, _q) = c.input("q", q, q_len)?;
        let (kp, _k) = c.input("k_cache", k_cache, n_slots * kv_dim)?;
        let (vp, _v) = c.input("v_cache", v_cache, n_slots * kv_dim)?;
        // Eight values per chunk read: 16 bytes of bf16, 8 of FP8.
        let align = 8 * std::mem::size_of::<T>() as u64;
        if kp % align != 0 || vp % align != 0 {
            return Err(c.shape(format!(
                "k_cache and v_cache must start {align}-byte aligned (a whole allocation, or a \
                 view starting at a multiple of 8 values)"
            )));
        }
        let (meta, _m) = c.input("batch metadata", &batch.meta, batch.meta.len())?;
        let at = |off: usize| meta + 4 * off as u64;

        let (op, _o) = c.output("out", out, q_len)?;
        // Per query head, a logit in the softmax's denominator (0: none).
        let sinks = match sinks {
            Some(s) => Some(c.input("sinks", s, nh)?),
            None => None,
        };
        let sinks_p = sinks.as_ref().map_or(0u64, |s| s.0);
        // The guards (`_q`, `_k`, `_v`, `_m`, `_o`) live until every launch is enqueued.
        let args = KernelArgs {
            q: qp,
            k: kp,
            v: vp,
            out: op,
            first_row: at(batch.off.seq_first_row),
            rows: at(batch.off.seq_rows),
            start: at(batch.off.seq_start),
            table_off: at(batch.off.seq_table_off),
            tables: at(batch.off.tables),
            decode_seqs: at(batch.off.decode_seqs),
            tiles: at(batch.off.prefill_tiles),
            n_heads: nh_i,
            n_kv_heads: nkv_i,
            head_dim: hd_i,
            block_size: bs_i,
            scale,
            softcap,
            window,
            v_scale,
            sinks: sinks_p,
        };

        if batch.n_tiles > 0 {
            self.launch_prefill(&c, &args, batch, nh, fp8.is_some())?;
        }
        if batch.n_decode > 0 {
            self.launch_decode(&c, &args, batch, &p, workspace, fp8.is_some())?;
        }
        Ok(())
    }

    /// The prefill tiles (16 rows × 32 positions each) of every sequence with more than one
    /// new row: one thread block per (tile, query head).
    fn launch_prefill(
        &self,
        c: &Check<'_>,
        a: &KernelArgs,
        batch: &AttentionBatch,
        nh: usize,
        fp8: bool,
    ) -> Result<(), CudaError> {
        let cfg = LaunchConfig {
            grid_dim: (c.int("prefill tiles", batch.n_tiles)? as u32, nh as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        if fp8 {
            launch!(
                self.stream,
                "attn_prefill_fp8",
                &self.attn_prefill_fp8,
                cfg,
                &a.q,
                &a.k,
                &a.v,
                &a.out,
                &a.tiles,
                &a.first_row,
                &a.rows,
                &a.start,
                &a.table_off,
                &a.tables,
                &a.n_heads,
                &a.n_kv_heads,
                &a.head_dim,
                &a.block_size,
                &a.scale,
                &a.softcap,
                &a.window,
                &a.v_scale,
                &a.sinks
            )?;
        } else {
            launch!(
                self.stream,
                "attn_prefill",
                &self.attn_prefill,
                cfg,
                &a.q,
                &a.k,
                &a.v,
                &a.out,
                &a.tiles,
                &a.first_row,
                &a.rows,
                &a.start,
                &a.table_off,
                &a.tables,
                &a.n_heads,
                &a.n_kv_heads,
                &a.head_dim,
                &a.block_size,
                &a.scale,
                &a.softcap,
                &a.window,
                &a.sinks
            )?;
        }
        Ok(())
    }

    /// The one-row (decode) sequences: the visible positions cut into splits
    /// (`split_plan`), one thread block per (sequence, query head, split); with more than
    /// one split, partial results go to `workspace` and a reduce kernel merges them.
    fn launch_decode(
        &self,
        c: &Check<'_>,
        a: &KernelArgs,
        batch: &AttentionBatch,
        p: &AttentionParams,
        workspace: &mut AttentionWorkspace,
        fp8: bool,
    ) -> Result<(), CudaError> {
        let (hd, nh) = (p.head_dim, p.n_heads);
        let visible = match p.window {
            Some(w) => w.min(batch.max_decode_pos + 1),
            None => batch.max_decode_pos + 1,
        };
        let base = c.mul("decode blocks", batch.n_decode, nh)?;
        let (split_len, n_splits) = split_plan(visible, base);
        if n_splits > MAX_GRID_YZ {
            return Err(c.shape(format!(
                "{visible} visible positions need {n_splits} decode splits of {split_len}; \
                 at most {MAX_GRID_YZ}"
            )));
        }
        let (split_len_i, n_splits_i) = (split_len as i32, n_splits as i32);
        let n_decode_i = c.int("decode sequences", batch.n_decode)?;
        let parts = c.mul("decode splits", base, n_splits)?;
        if n_splits > 1 {
            grow(
                &mut workspace.acc,
                &self.stream,
                c.mul("workspace", parts, hd)?,
            )?;
            grow(
                &mut workspace.ml,
                &self.stream,
                c.mul("workspace", parts, 2)?,
            )?;
        }
        // With one split the kernel writes `out` directly and never reads the workspace.
        let split = n_splits > 1;
        let ws_acc = match workspace.acc.as_mut().filter(|_| split) {
            Some(w) => Some(c.output("workspace", w, parts * hd)?),
            None => None,
        };
        let ws_ml = match workspace.ml.as_mut().filter(|_| split) {
            Some(m) => Some(c.output("workspace", m, parts * 2)?),
            None => None,
        };
        let acc_p = ws_acc.as_ref().map_or(0u64, |w| w.0);
        let ml_p = ws_ml.as_ref().map_or(0u64, |w| w.0);
        if split && (acc_p == 0 || ml_p == 0) {
            return Err(c.shape("the split-decode workspace was not allocated".to_string()));
        }
        let cfg = LaunchConfig {
            grid_dim: (n_decode_i as u32, nh as u32, n_splits as u32),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        if fp8 {
            launch!(
                self.stream,
                "attn_decode_fp8",
                &self.attn_decode_fp8,
                cfg,
                &a.q,
                &a.k,
                &a.v,
                &a.out,
                &acc_p,
                &ml_p,
                &a.decode_seqs,
                &a.first_row,
                &a.start,
                &a.table_off,
                &a.tables,
                &a.n_heads,
                &a.n_kv_heads,
                &a.head_dim,
                &a.block_size,
                &a.scale,
                &a.softcap,
                &a.window,
                &split_len_i,
                &n_splits_i,
                &a.v_scale,
                &a.sinks
            )?;
        } else {
            launch!(
                self.stream,
                "attn_decode",
                &self.attn_decode,
                cfg,
                &a.q,
                &a.k,
                &a.v,
                &a.out,
                &acc_p,
                &ml_p,
                &a.decode_seqs,
                &a.first_row,
                &a.start,
                &a.table_off,
                &a.tables,
                &a.n_heads,
                &a.n_kv_heads,
                &a.head_dim,
                &a.block_size,
                &a.scale,
                &a.softcap,
                &a.window,
                &split_len_i,
                &n_splits_i,
                &a.sinks
            )?;
        }
        if n_splits > 1 {
            let cfg = LaunchConfig {
                grid_dim: (n_decode_i as u32, nh as u32, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(
                self.stream,
                "attn_decode_reduce",
                &self.attn_decode_reduce,
                cfg,
                &acc_p,
                &ml_p,
                &a.out,
                &a.decode_seqs,
                &a.first_row,
                &a.n_heads,
                &a.head_dim,
                &n_splits_i,
                &a.sinks
            )?;
        }
        Ok(())
    }
}

/// What every attention kernel is given, checked and in the kernels' own types: device
/// addresses of q, the caches, the output and the batch metadata's arrays, then the
/// `int` / `float` parameters.
struct KernelArgs {
    q: u64,
    k: u64,
    v: u64,
    out: u64,
    first_row: u64,
    rows: u64,
    start: u64,
    table_off: u64,
    tables: u64,
    decode_seqs: u64,
    tiles: u64,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    block_size: i32,
    scale: f32,
    softcap: f32,
    window: i32,
    v_scale: f32,
    /// Device address of the per-head sinks, 0 for none.
    sinks: u64,
}

/// The checks of `p` against the kernels' limits and `batch`, and the soft-cap and window
/// as the kernels take them (0: none).
fn checked_params(
    c: &Check<'_>,
    p: &AttentionParams,
    batch: &AttentionBatch,
) -> Result<(f32, i32), CudaError> {
    let (hd, nh, nkv) = (p.head_dim, p.n_heads, p.n_kv_heads);
    if nkv == 0 || nh % nkv != 0 || nh == 0 {
        return Err(c.shape(format!(
            "{nh} query heads, {nkv} kv heads: need kv heads > 0 dividing the query heads"
        )));
    }
    if hd == 0 || hd % 8 != 0 || hd > MAX_HEAD_DIM {
        return Err(c.shape(format!(
            "head_dim {hd}: the kernels support multiples of 8 up to {MAX_HEAD_DIM}"
        )));
    }
    if nh > MAX_GRID_YZ {
        return Err(c.shape(format!("{nh} query heads: at most {MAX_GRID_YZ}")));
    }
    if p.block_size != batch.block_size {
        return Err(c.shape(format!(
            "block_size {} but the batch was uploaded for {}",
            p.block_size, batch.block_size
        )));
    }
    let softcap = match p.softcap {
        None => 0.0f32,
        Some(cap) if cap.is_finite() && cap > 0.0 => cap,
        Some(cap) => return Err(c.shape(format!("softcap {cap} is not a finite positive number"))),
    };
    let window = match p.window {
        None => 0i32,
        Some(0) => return Err(c.shape("window 0 sees no position".to_string())),
        // A window past every i32 position sees everything, as none does.
        Some(w) => i32::try_from(w).unwrap_or(0),
    };
    Ok((softcap, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_planned_into_rows_slots_decode_sequences_and_prefill_tiles() {
        let (t0, t1, t2) = ([7u32, 2, 9], [4u32], [5u32, 6]);
        let seqs = [
            SeqSpan {
                first_row: 0,
                rows: 1,
                start: 33,
                block_table: &t0,
            },
            SeqSpan {
                first_row: 1,
                rows: 0,
                start: 3,
                block_table: &t1,
            },
            SeqSpan {
                first_row: 1,
                rows: 20,
                start: 2,
                block_table: &t2,
            },
        ];
        let h = HostBatch::plan(&seqs, 16).expect("valid");
        assert_eq!(h.total_rows, 21);
        assert_eq!(h.positions[0], 33);
        assert_eq!(h.slots[0], 9 * 16 + 1);
        assert_eq!(h.positions[1..], (2..22).collect::<Vec<i32>>()[..]);
        assert_eq!(h.slots[1], 5 * 16 + 2);
        assert_eq!(h.slots[15], 6 * 16);
        assert_eq!((h.n_decode, h.n_tiles, h.max_decode_pos), (1, 2, 33));
        assert_eq!(h.max_block, Some(9));
        let m = |at: usize, n: usize| h.meta[at..at + n].to_vec();
        assert_eq!(m(h.off.seq_first_row, 3), [0, 1, 1]);
        assert_eq!(m(h.off.seq_rows, 3), [1, 0, 20]);
        assert_eq!(m(h.off.seq_start, 3), [33, 3, 2]);
        // Only the blocks a sequence needs are uploaded (none for the empty one).
        assert_eq!(m(h.off.seq_table_off, 3), [0, 3, 3]);
        assert_eq!(m(h.off.tables, 5), [7, 2, 9, 5, 6]);
        assert_eq!(m(h.off.decode_seqs, 1), [0]);
        assert_eq!(m(h.off.prefill_tiles, 4), [2, 0, 2, 16]);
        assert_eq!(h.meta.len(), h.off.prefill_tiles + 4);
    }

    #[test]
    fn a_batch_with_gaps_or_short_tables_is_refused_by_name() {
        let t = [0u32, 1];
        let gap = [
            SeqSpan {
                first_row: 0,
                rows: 2,
                start: 0,
                block_table: &t,
            },
            SeqSpan {
                first_row: 3,
                rows: 1,
                start: 0,
                block_table: &t,
            },
        ];
        let e = HostBatch::plan(&gap, 16).expect_err("gap").to_string();
        assert!(
            e.contains("AttentionBatch::upload") && e.contains("row 3"),
            "{e}"
        );
        let short = [SeqSpan {
            first_row: 0,
            rows: 2,
            start: 31,
            block_table: &t,
        }];
        let e = HostBatch::plan(&short, 16)
            .expect_err("short table")
            .to_string();
        assert!(e.contains("does not cover positions 0..33"), "{e}");
        assert!(HostBatch::plan(&[], 0).is_err());
        assert_eq!(HostBatch::plan(&[], 16).expect("empty").total_rows, 0);
    }

    #[test]
    fn splits_cover_the_visible_positions_within_the_kernel_limits() {
        for visible in [1, 63, 64, 65, 511, 512, 513, 4096, 32768, 1 << 20] {
            for base in [1, 7, 32, 264, 10_000] {
                let (len, n) = split_plan(visible, base);
                assert!((SPLIT_MIN..=SPLIT_MAX).contains(&len), "{visible} {base}");
                assert!(
                    n * len >= visible && (n - 1) * len < visible,
                    "{visible} {base}"
                );
            }
        }
        // Enough sequences and heads: no split below SPLIT_MAX positions.
        assert_eq!(split_plan(512, 264), (512, 1));
        // One sequence of 32 heads over 4096 positions: split to fill the GPU.
        assert_eq!(split_plan(4096, 32), (512, 8));
    }
}
