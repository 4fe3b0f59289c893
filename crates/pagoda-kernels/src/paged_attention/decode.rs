//! The decode path of paged attention, one task = (sequence rows, kv head, positions): the
//! tile primitives ([`DecodeOps`]: scores, max, exp, accumulate over every query head of a
//! GQA group), their portable bodies ([`Scalar`], the reference of the SIMD ones in
//! `simd/attn.rs`), and the driver generic over them ([`decode_group`]: tiles across block
//! boundaries, online softmax per (row, head)).
//!
//! Owns what the SIMD bodies implement against, so `simd/attn.rs` depends on this module and
//! not on `paged_attention` itself (which picks the body per ISA and plans the tasks).
//!
//! Invariant: every primitive checks its slice lengths ([`check_scores`],
//! [`check_accumulate`], [`Rows::new`]) before reading, so an implementation's only
//! precondition left to `unsafe` is its CPU.

use std::ops::Range;

use crate::attention_shape::{first_visible, AttentionShape};
use crate::kv_blocks::{BlockRows, KvBlockStorage};
use crate::ops;

/// Most positions of one decode tile: the serial part of a softmax update (max, rescale) is
/// paid once per tile and head.
pub(crate) const TILE: usize = 64;
/// Fewest positions of a tile (one 512-bit register of scores).
const MIN_TILE: usize = 16;
/// Key values (and as many value values) one tile covers: at most 16 KiB of each as f32, so
/// the rows a tile's passes re-read stay in L1.
const TILE_VALUES: usize = 4096;

/// Positions per decode tile for heads of `head_dim`.
fn tile_len(head_dim: usize) -> usize {
    (TILE_VALUES / head_dim).clamp(MIN_TILE, TILE)
}

/// `rows` rows of one kv head's `head_dim` values, `stride` apart, in the storage's type.
/// Built only by [`Rows::new`], which checks that every row lies inside the data. FP8 rows are
/// read as their codes' values: the primitives never see a storage scale (the driver folds
/// the keys' into the score scale, the caller the values' into the output).
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    data: BlockRows<'a>,
    stride: usize,
    rows: usize,
    head_dim: usize,
}

impl<'a> Rows<'a> {
    /// The rows of `data` from offset `off` (panics unless they all lie inside it).
    pub(crate) fn new(
        data: BlockRows<'a>,
        off: usize,
        stride: usize,
        rows: usize,
        head_dim: usize,
    ) -> Self {
        let span = if rows == 0 {
            0
        } else {
            (rows - 1) * stride + head_dim
        };
        let data = match data {
            BlockRows::F16(d) => BlockRows::F16(&d[off..off + span]),
            BlockRows::F32(d) => BlockRows::F32(&d[off..off + span]),
            BlockRows::Fp8(d) => BlockRows::Fp8(&d[off..off + span]),
        };
        Rows {
            data,
            stride,
            rows,
            head_dim,
        }
    }

    pub(crate) fn data(&self) -> BlockRows<'a> {
        self.data
    }

    pub(crate) fn stride(&self) -> usize {
        self.stride
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// `q · row i`.
    fn dot(&self, q: &[f32], i: usize) -> f32 {
        let at = i * self.stride;
        match self.data {
            BlockRows::F32(d) => ops::dot_f32(q, &d[at..at + self.head_dim]),
            BlockRows::F16(d) => {
                let mut buf = [0.0f32; SCALAR_CHUNK];
                let row = &d[at..at + self.head_dim];
                let mut sum = 0.0;
                for (k, q) in row.chunks(SCALAR_CHUNK).zip(q.chunks(SCALAR_CHUNK)) {
                    let b = &mut buf[..k.len()];
                    half::slice::HalfFloatSliceExt::convert_to_f32_slice(k, b);
                    sum += ops::dot_f32(q, b);
                }
                sum
            }
            BlockRows::Fp8(d) => {
                let mut buf = [0.0f32; SCALAR_CHUNK];
                let row = &d[at..at + self.head_dim];
                let mut sum = 0.0;
                for (k, q) in row.chunks(SCALAR_CHUNK).zip(q.chunks(SCALAR_CHUNK)) {
                    let b = &mut buf[..k.len()];
                    crate::fp8::decode_scaled(k, 1.0, b);
                    sum += ops::dot_f32(q, b);
                }
                sum
            }
        }
    }

    /// `acc += p * row i`.
    fn axpy(&self, acc: &mut [f32], p: f32, i: usize) {
        let at = i * self.stride;
        match self.data {
            BlockRows::F32(d) => ops::axpy(acc, p, &d[at..at + self.head_dim]),
            BlockRows::F16(d) => {
                let mut buf = [0.0f32; SCALAR_CHUNK];
                let row = &d[at..at + self.head_dim];
                for (v, a) in row.chunks(SCALAR_CHUNK).zip(acc.chunks_mut(SCALAR_CHUNK)) {
                    let b = &mut buf[..v.len()];
                    half::slice::HalfFloatSliceExt::convert_to_f32_slice(v, b);
                    ops::axpy(a, p, b);
                }
            }
            BlockRows::Fp8(d) => {
                let mut buf = [0.0f32; SCALAR_CHUNK];
                let row = &d[at..at + self.head_dim];
                for (v, a) in row.chunks(SCALAR_CHUNK).zip(acc.chunks_mut(SCALAR_CHUNK)) {
                    let b = &mut buf[..v.len()];
                    crate::fp8::decode_scaled(v, 1.0, b);
                    ops::axpy(a, p, b);
                }
            }
        }
    }
}

/// Values the scalar path widens at a time (bulk conversion is far faster than one by one).
const SCALAR_CHUNK: usize = 64;

/// Checks the arguments of [`DecodeOps::scores`]; returns the head count.
pub(crate) fn check_scores(
    q: &[f32],
    hd: usize,
    k: &Rows<'_>,
    out: &[f32],
    out_stride: usize,
) -> usize {
    assert!(hd > 0 && q.len() % hd == 0 && k.head_dim == hd);
    let heads = q.len() / hd;
    assert!(heads == 0 || k.rows == 0 || out.len() >= (heads - 1) * out_stride + k.rows);
    assert!(heads <= 1 || out_stride >= k.rows);
    heads
}

/// Checks the arguments of [`DecodeOps::accumulate`]; returns the head count.
pub(crate) fn check_accumulate(
    acc: &[f32],
    hd: usize,
    c: &[f32],
    p: &[f32],
    p_stride: usize,
    v: &Rows<'_>,
) -> usize {
    let heads = c.len();
    assert!(v.head_dim == hd && acc.len() == heads * hd);
    assert!(heads == 0 || v.rows == 0 || p.len() >= (heads - 1) * p_stride + v.rows);
    heads
}

/// The tile primitives of the decode path on one ISA. Every query head of a GQA group is
/// handled in one call, so each key / value row is loaded (and widened) once per tile.
///
/// # Safety
/// Implementations may use the instructions of their ISA: call them only on a CPU where it
/// is available. Lengths are checked (`check_scores`, `check_accumulate`, [`Rows::new`]),
/// so memory safety does not depend on the caller otherwise.
pub(crate) trait DecodeOps {
    /// For every head `g < q.len() / hd` and row `i < k.rows()`:
    /// `out[g * out_stride + i] = scale * q[g * hd..][..hd] · k_i`.
    unsafe fn scores(
        q: &[f32],
        hd: usize,
        k: Rows<'_>,
        scale: f32,
        out: &mut [f32],
        out_stride: usize,
    );
    /// The largest of `x` (`-inf` when empty).
    unsafe fn max(x: &[f32]) -> f32;
    /// `x[i] = exp(x[i] - max)`; returns their sum.
    unsafe fn exp_sum(x: &mut [f32], max: f32) -> f32;
    /// For every head `g < c.len()`:
    /// `acc[g * hd..][..hd] = c[g] * acc_g + Σ_i p[g * p_stride + i] * v_i`.
    unsafe fn accumulate(
        acc: &mut [f32],
        hd: usize,
        c: &[f32],
        p: &[f32],
        p_stride: usize,
        v: Rows<'_>,
    );
}

/// Portable bodies; the reference of the SIMD ones.
pub(crate) struct Scalar;

impl DecodeOps for Scalar {
    unsafe fn scores(
        q: &[f32],
        hd: usize,
        k: Rows<'_>,
        scale: f32,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let heads = check_scores(q, hd, &k, out, out_stride);
        for g in 0..heads {
            let qh = &q[g * hd..(g + 1) * hd];
            for i in 0..k.rows {
                out[g * out_stride + i] = k.dot(qh, i) * scale;
            }
        }
    }

    unsafe fn max(x: &[f32]) -> f32 {
        x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    }

    unsafe fn exp_sum(x: &mut [f32], max: f32) -> f32 {
        let mut sum = 0.0;
        for v in x.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        sum
    }

    unsafe fn accumulate(
        acc: &mut [f32],
        hd: usize,
        c: &[f32],
        p: &[f32],
        p_stride: usize,
        v: Rows<'_>,
    ) {
        let heads = check_accumulate(acc, hd, c, p, p_stride, &v);
        for g in 0..heads {
            let a = &mut acc[g * hd..(g + 1) * hd];
            ops::scale_inplace(a, c[g]);
            for i in 0..v.rows {
                v.axpy(a, p[g * p_stride + i], i);
            }
        }
    }
}

/// What one decode task reads.
pub(crate) struct DecodeArgs<'a> {
    pub shape: &'a AttentionShape,
    pub q: &'a [f32],
    pub keys: &'a KvBlockStorage,
    pub values: &'a KvBlockStorage,
    /// The sequence's rows of `q` / `out`, the position of the first, and its block table
    /// (a [`SeqAttention`](super::SeqAttention)'s fields).
    pub rows: Range<usize>,
    pub start: usize,
    pub block_table: &'a [u32],
    pub kv_head: usize,
    /// The positions this task covers: all the rows may see, or one part of them.
    pub positions: Range<usize>,
}

/// Per-thread buffers of the decode path, reused across calls.
#[derive(Debug, Default)]
pub(crate) struct DecodeScratch {
    /// Scores, then probabilities, of one tile: `[group, tile_len]`.
    p: Vec<f32>,
    /// Rescale factor of each group head's accumulator for the tile.
    c: Vec<f32>,
    /// Per (row, group head): accumulator `[head_dim]`, running max, running sum: the
    /// task's result, read by the caller after [`decode_group`].
    pub(crate) acc: Vec<f32>,
    pub(crate) max: Vec<f32>,
    pub(crate) sum: Vec<f32>,
}

/// A decode task body on one ISA: leaves the unnormalised softmax state of the task's rows
/// and group heads over its positions in `scratch` (`acc`: `[n, group * head_dim]`, `max`,
/// `sum`: `[n, group]`; a row that sees none of the positions has max `-inf`, sum and
/// accumulator 0). The accumulator is in the values' stored units: the caller multiplies by
/// `values.scale()`.
pub(crate) type DecodeFn = unsafe fn(&DecodeArgs<'_>, &mut DecodeScratch);

/// One run of a tile's positions that lies in one block.
#[derive(Clone, Copy, Default)]
struct Segment {
    /// First position of the run, relative to the tile's first.
    off: usize,
    cnt: usize,
    block: u32,
    /// Slot of the run's first position in its block.
    slot: usize,
}

/// The decode driver, generic over the tile primitives (inlined into each ISA's
/// `#[target_feature]` entry point).
///
/// # Safety
/// `O`'s ISA is available; `a` passed `paged_attention`'s validation.
#[inline(always)]
pub(crate) unsafe fn decode_group<O: DecodeOps>(a: &DecodeArgs<'_>, sc: &mut DecodeScratch) {
    let shape = a.shape;
    let hd = shape.head_dim;
    let q_dim = shape.n_heads * hd;
    let kv_dim = shape.n_kv_heads * hd;
    let kv_col = a.kv_head * hd;
    let group = shape.n_heads / shape.n_kv_heads;
    let gd = group * hd;
    let bs = a.keys.block_size();
    let n = a.rows.len();
    let tile = tile_len(hd);
    // q · (code · k_scale) = (q · code) · k_scale; exactly `shape.scale` when the scale is 1.
    let score_scale = shape.scale * a.keys.scale();
    let states = n * group;
    sc.acc.clear();
    sc.acc.resize(states * hd, 0.0);
    sc.max.clear();
    sc.max.resize(states, f32::NEG_INFINITY);
    sc.sum.clear();
    sc.sum.resize(states, 0.0);
    sc.p.resize(group * tile, 0.0);
    sc.c.resize(group, 0.0);
    let mut segs = [Segment::default(); TILE];
    // The task's positions: p0..stop.
    let stop = a.positions.end;
    let mut p0 = a.positions.start;
    while p0 < stop {
        let end = (p0 + tile).min(stop); // this tile: positions p0..end
        let mut n_segs = 0;
        let mut p = p0;
        while p < end {
            let slot = p % bs;
            let cnt = (bs - slot).min(end - p);
            segs[n_segs] = Segment {
                off: p - p0,
                cnt,
                block: a.block_table[p / bs],
                slot,
            };
            n_segs += 1;
            p += cnt;
        }
        let segs = &segs[..n_segs];
        for t in 0..n {
            let pos = a.start + t;
            if pos < p0 {
                continue;
            }
            // This row's visible positions of the tile, tile-relative: lo..hi.
            let lo = first_visible(shape.window, pos).max(p0) - p0;
            let hi = (pos + 1).min(end) - p0;
            if lo >= hi {
                continue;
            }
            // The rows of each segment this row sees, from tile-relative position `from`.
            let parts = segs.iter().filter_map(|seg| {
                let (from, to) = (seg.off.max(lo), (seg.off + seg.cnt).min(hi));
                (from < to).then(|| {
                    let off = (seg.slot + from - seg.off) * kv_dim + kv_col;
                    (seg.block, from, to - from, off)
                })
            });
            let q_group = &a.q[(a.rows.start + t) * q_dim + a.kv_head * gd..][..gd];
            for (block, from, rows, off) in parts.clone() {
                let k = Rows::new(a.keys.block(block), off, kv_dim, rows, hd);
                // SAFETY: O's ISA is available (caller); the primitives check lengths.
                unsafe { O::scores(q_group, hd, k, score_scale, &mut sc.p[from..], tile) };
            }
            for g in 0..group {
                let st = t * group + g;
                let p = &mut sc.p[g * tile + lo..g * tile + hi];
                if let Some(cap) = shape.softcap {
                    ops::softcap_inplace(p, cap);
                }
                // SAFETY: as above.
                let tile_max = unsafe { O::max(p) };
                let old = sc.max[st];
                let new = old.max(tile_max);
                // The accumulator is still zero while the max is -inf.
                sc.c[g] = if old == f32::NEG_INFINITY {
                    0.0
                } else {
                    (old - new).exp()
                };
                // SAFETY: as above.
                let tile_sum = unsafe { O::exp_sum(p, new) };
                sc.sum[st] = sc.sum[st] * sc.c[g] + tile_sum;
                sc.max[st] = new;
            }
            let acc = &mut sc.acc[t * gd..(t + 1) * gd];
            for (block, from, rows, off) in parts {
                let v = Rows::new(a.values.block(block), off, kv_dim, rows, hd);
                // SAFETY: as above.
                unsafe { O::accumulate(acc, hd, &sc.c, &sc.p[from..], tile, v) };
                sc.c.fill(1.0);
            }
        }
        p0 = end;
    }
}
