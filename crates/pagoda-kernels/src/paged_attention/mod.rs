//! Attention of a batch of sequences over paged K/V ([`KvBlockStorage`] + block tables).
//!
//! Same semantics as [`causal_attention`](crate::attention::causal_attention): row `t` of a
//! sequence sits at position `start + t` and attends to `max(0, pos + 1 - window) ..= pos`,
//! GQA groups of query heads share a kv head, optional soft-capping before the softmax.
//!
//! Work is split into one rayon task per (sequence, kv head), all sequences of a call
//! together, and each task covers every query head of its GQA group, so each K/V row is read
//! from the cache once per call:
//! - decode (a sequence with fewer than `PREFILL_MIN_ROWS` new rows: one-row decodes and
//!   speculative verification chunks, each row computed exactly as alone): walks the visible
//!   positions in tiles of up to `TILE` positions (across block boundaries; blocks wholly
//!   before the sliding window are never touched) and keeps a streaming (online) softmax per
//!   (row, head): running max, running sum and an unnormalised accumulator rescaled when the
//!   max grows. Per tile, one pass computes the scores of every head of the group (each key
//!   row loaded and, for F16, widened by `vcvtph2ps` once, FMA'd against all the heads'
//!   queries held in registers), and one pass accumulates `p V` the same way. The tile
//!   primitives (`DecodeOps`: scores, max, exp, accumulate) have scalar, AVX2+F16C and
//!   AVX-512 bodies (`decode.rs`, `simd/attn.rs`), picked at run time like the matmul kernels.
//! - split decode: when a call has too few tasks to spread evenly over the threads (one or
//!   two sequences of a model with 2-3 kv heads), long decode tasks are cut into parts along
//!   their positions (split-K, as flash-decoding); each part leaves its unnormalised state
//!   (accumulator, max, sum) and the parts are merged with `exp(max_part - max)` weights.
//! - prefill (a chunk of at least `PREFILL_MIN_ROWS` rows): gathers the visible K/V of its kv
//!   head into contiguous f32 once and runs attention's per-head GEMM step (`head_gemm`) for
//!   each query head of the group.
//!
//! Invariants (checked on entry, a panic in [`paged_attention`], an error in
//! [`paged_attention_with_isa`]): `q`/`out` are `[total_rows, n_heads * head_dim]`; the rows
//! of different sequences are disjoint and inside `q`; each block table covers positions
//! `0..start + n` with blocks inside both storages. Rows of `out` no sequence names are left
//! untouched. Tasks write disjoint (row, head) cells of `out`, which makes the shared output
//! pointer sound.

pub(crate) mod decode;

use crate::attention::{head_gemm, HeadRows, GEMM_MIN_ROWS};
use crate::attention_shape::{first_visible, AttentionShape};
use crate::kv_blocks::KvBlockStorage;
use crate::{best_isa, ops, Isa, KernelError};
use decode::{decode_group, DecodeArgs, DecodeFn, DecodeScratch, Scalar};
use rayon::prelude::*;
use std::cell::RefCell;
use std::ops::Range;

/// One sequence's share of a batched attention call.
#[derive(Debug, Clone)]
pub struct SeqAttention<'a> {
    /// Rows of `q`/`out` that belong to this sequence.
    pub rows: Range<usize>,
    /// Position of the first of those rows.
    pub start: usize,
    /// Blocks holding positions `0..start + rows.len()`.
    pub block_table: &'a [u32],
}

/// `out[t] = softmax(scale * q[t] Kᵀ + mask) V` for every row of every sequence, K/V read
/// through the block tables, on the fastest ISA path of this CPU.
///
/// Panics when the shapes or tables break the module invariants (a caller bug: the model
/// checks tables before calling); [`paged_attention_with_isa`] reports the same as errors.
pub fn paged_attention(
    shape: &AttentionShape,
    q: &[f32],
    keys: &KvBlockStorage,
    values: &KvBlockStorage,
    seqs: &[SeqAttention<'_>],
    out: &mut [f32],
) {
    paged_attention_with_sinks(shape, None, q, keys, values, seqs, out)
}

/// [`paged_attention`] with attention sinks (gpt-oss): per query head `h` a learned logit
/// `sinks[h]` joins the softmax's denominator without a value,
/// `out[t] = Σ_j exp(s_j - m) v_j / (Σ_j exp(s_j - m) + exp(sinks[h] - m))`, so a row's
/// weights sum to less than 1 (as llama.cpp's `ggml_soft_max_add_sinks` and transformers).
/// `sinks` has `n_heads` entries (checked: a panic, as the other shape errors).
pub fn paged_attention_with_sinks(
    shape: &AttentionShape,
    sinks: Option<&[f32]>,
    q: &[f32],
    keys: &KvBlockStorage,
    values: &KvBlockStorage,
    seqs: &[SeqAttention<'_>],
    out: &mut [f32],
) {
    if let Err(e) = run(best_isa(), shape, sinks, q, keys, values, seqs, out) {
        panic!("paged_attention: {e}");
    }
}

/// As [`paged_attention`], on path `isa`; an error when this CPU lacks it or the arguments
/// break the module invariants (then `out` is untouched).
pub fn paged_attention_with_isa(
    isa: Isa,
    shape: &AttentionShape,
    q: &[f32],
    keys: &KvBlockStorage,
    values: &KvBlockStorage,
    seqs: &[SeqAttention<'_>],
    out: &mut [f32],
) -> Result<(), KernelError> {
    run(isa, shape, None, q, keys, values, seqs, out)
}

#[allow(clippy::too_many_arguments)]
fn run(
    isa: Isa,
    shape: &AttentionShape,
    sinks: Option<&[f32]>,
    q: &[f32],
    keys: &KvBlockStorage,
    values: &KvBlockStorage,
    seqs: &[SeqAttention<'_>],
    out: &mut [f32],
) -> Result<(), KernelError> {
    if !isa.is_available() {
        return Err(KernelError::IsaUnavailable(isa.name()));
    }
    validate(shape, q, keys, values, seqs, out)?;
    if let Some(s) = sinks {
        if s.len() != shape.n_heads {
            return shape_err(format!(
                "{} attention sinks for {} query heads",
                s.len(),
                shape.n_heads
            ));
        }
    }
    let decode = decode_fn(isa);
    let args = CallArgs {
        isa,
        shape,
        sinks,
        q,
        keys,
        values,
        out: OutPtr {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        },
    };
    let tasks = plan(shape, seqs, rayon::current_num_threads());
    // Split decode parts come back as partial softmax states (one slot per task, so they
    // stay in task order), merged per (seq, kv head).
    let slots: Vec<std::sync::OnceLock<Partial>> =
        tasks.iter().map(|_| std::sync::OnceLock::new()).collect();
    crate::hot_pool::parallel_for(tasks.len(), &|i| match tasks[i] {
        Task::Prefill { seq, kv_head } => prefill_group(&args, &seqs[seq], kv_head),
        Task::Decode {
            seq,
            kv_head,
            part,
            parts,
        } => {
            if let Some(p) = decode_task(&args, decode, seq, &seqs[seq], kv_head, part, parts) {
                // Each task sets only its own slot, once.
                let _ = slots[i].set(p);
            }
        }
    });
    let partials: Vec<Partial> = slots
        .into_iter()
        .filter_map(std::sync::OnceLock::into_inner)
        .collect();
    for chunk in partials.chunk_by(|a, b| (a.seq, a.kv_head) == (b.seq, b.kv_head)) {
        merge_partials(&args, &seqs[chunk[0].seq], chunk);
    }
    Ok(())
}

/// One unit of parallel work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Task {
    /// Every row and group head of kv head `kv_head` of a prefill chunk.
    Prefill { seq: usize, kv_head: usize },
    /// Every row and group head of kv head `kv_head` of decode rows, over part `part` of
    /// `parts` equal slices of the visible positions.
    Decode {
        seq: usize,
        kv_head: usize,
        part: usize,
        parts: usize,
    },
}

/// Fewest visible positions one part of a split decode task covers.
/// Chunks of fewer rows take the decode path, row by row exactly as a one-row decode (see
/// [`crate::BATCH_INVARIANT_ROWS`]); larger ones the gathered GEMM.
const PREFILL_MIN_ROWS: usize = if crate::BATCH_INVARIANT_ROWS > GEMM_MIN_ROWS {
    crate::BATCH_INVARIANT_ROWS
} else {
    GEMM_MIN_ROWS
};

const MIN_SPLIT_POSITIONS: usize = 256;
/// Tasks per thread below which long decode tasks are split along their positions.
const TASKS_PER_THREAD: usize = 2;

/// The tasks of a call, prefill first (they are the long ones, so rayon starts them early).
/// When a call has fewer than `TASKS_PER_THREAD` tasks per thread (a few sequences, few kv
/// heads) and they do not already spread evenly over the threads, decode tasks over long
/// contexts are split into parts of at least `MIN_SPLIT_POSITIONS` positions whose partial
/// softmax states are merged afterwards (split-K / flash-decoding): `threads / gcd(tasks,
/// threads)` parts make the task count a multiple of the thread count (3 kv heads on 2
/// threads: 2 parts each; 2 kv heads on 2 threads: no split).
fn plan(shape: &AttentionShape, seqs: &[SeqAttention<'_>], threads: usize) -> Vec<Task> {
    let prefill = |s: &SeqAttention<'_>| s.rows.len() >= PREFILL_MIN_ROWS;
    let live = seqs.iter().filter(|s| !s.rows.is_empty()).count();
    let threads = threads.max(1);
    let want = TASKS_PER_THREAD * threads;
    let base = live * shape.n_kv_heads;
    let mut tasks = Vec::with_capacity(base);
    for (seq, s) in seqs.iter().enumerate() {
        if prefill(s) {
            tasks.extend((0..shape.n_kv_heads).map(|kv_head| Task::Prefill { seq, kv_head }));
        }
    }
    for (seq, s) in seqs.iter().enumerate() {
        if s.rows.is_empty() || prefill(s) {
            continue;
        }
        let visible = s.start + s.rows.len() - first_visible(shape.window, s.start);
        let parts = if base >= want {
            1
        } else {
            (threads / gcd(base, threads))
                .min(visible / MIN_SPLIT_POSITIONS)
                .max(1)
        };
        for kv_head in 0..shape.n_kv_heads {
            tasks.extend((0..parts).map(|part| Task::Decode {
                seq,
                kv_head,
                part,
                parts,
            }));
        }
    }
    tasks
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn shape_err(msg: String) -> Result<(), KernelError> {
    Err(KernelError::Shape(msg))
}

fn validate(
    shape: &AttentionShape,
    q: &[f32],
    keys: &KvBlockStorage,
    values: &KvBlockStorage,
    seqs: &[SeqAttention<'_>],
    out: &[f32],
) -> Result<(), KernelError> {
    let (hd, nh, nkv) = (shape.head_dim, shape.n_heads, shape.n_kv_heads);
    if hd == 0 || nkv == 0 || nh % nkv != 0 {
        return shape_err(format!(
            "{nh} query heads, {nkv} kv heads of dim {hd}: need kv heads > 0 dividing the \
             query heads and dim > 0"
        ));
    }
    let (q_dim, kv_dim) = (nh * hd, nkv * hd);
    if q.len() != out.len() || q.len() % q_dim != 0 {
        return shape_err(format!(
            "q holds {} and out {} values; both must be the same whole number of \
             {q_dim}-value rows",
            q.len(),
            out.len()
        ));
    }
    for (name, s) in [("keys", keys), ("values", values)] {
        if s.kv_dim() != kv_dim || s.block_size() != keys.block_size() || s.block_size() == 0 {
            return shape_err(format!(
                "{name} storage has kv_dim {} and block size {}; expected kv_dim {kv_dim} and \
                 the keys' non-zero block size {}",
                s.kv_dim(),
                s.block_size(),
                keys.block_size()
            ));
        }
    }
    let total_rows = q.len() / q_dim;
    let bs = keys.block_size();
    let n_blocks = keys.n_blocks().min(values.n_blocks());
    let mut ranges: Vec<Range<usize>> = Vec::with_capacity(seqs.len());
    for (i, s) in seqs.iter().enumerate() {
        if s.rows.start > s.rows.end || s.rows.end > total_rows {
            return shape_err(format!(
                "sequence {i}: rows {:?} outside the {total_rows} rows of q",
                s.rows
            ));
        }
        let n = s.rows.len();
        if n == 0 {
            continue;
        }
        let needed = (s.start + n).div_ceil(bs);
        if s.block_table.len() < needed {
            return shape_err(format!(
                "sequence {i}: block table of {} blocks does not cover positions 0..{} \
                 ({needed} blocks of {bs})",
                s.block_table.len(),
                s.start + n
            ));
        }
        if let Some(&b) = s.block_table[..needed]
            .iter()
            .find(|&&b| b as usize >= n_blocks)
        {
            return shape_err(format!(
                "sequence {i}: block {b} outside a pool of {n_blocks} blocks"
            ));
        }
        ranges.push(s.rows.clone());
    }
    ranges.sort_by_key(|r| r.start);
    if let Some(w) = ranges.windows(2).find(|w| w[0].end > w[1].start) {
        return shape_err(format!("sequences share rows: {:?} and {:?}", w[0], w[1]));
    }
    Ok(())
}

/// The shared, read-only arguments of one call and its output.
struct CallArgs<'a> {
    /// An available ISA.
    isa: Isa,
    shape: &'a AttentionShape,
    /// Per query head, the sink logit (see [`paged_attention_with_sinks`]).
    sinks: Option<&'a [f32]>,
    q: &'a [f32],
    keys: &'a KvBlockStorage,
    values: &'a KvBlockStorage,
    out: OutPtr,
}

/// `out` of one call, shared by its tasks; each writes only its own (row, head) cells.
#[derive(Clone, Copy)]
struct OutPtr {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: the pointer is only written through `write`, whose callers write disjoint ranges
// (module invariants), and it outlives the tasks (the call blocks until they are done).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Copies `src` to `out[at..at + src.len()]`.
    ///
    /// # Safety
    /// No other task reads or writes that range during the call.
    unsafe fn write(&self, at: usize, src: &[f32]) {
        assert!(at + src.len() <= self.len, "output range outside out");
        // SAFETY: in bounds (asserted); exclusive by the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(at), src.len()) };
    }
}

// ------------------------------------------------------------------------------ prefill

/// Every query head of kv head `kv_head` for every row of `seq`, through the GEMM step.
fn prefill_group(a: &CallArgs<'_>, seq: &SeqAttention<'_>, kv_head: usize) {
    let isa = a.isa;
    let shape = a.shape;
    let hd = shape.head_dim;
    let q_dim = shape.n_heads * hd;
    let kv_dim = shape.n_kv_heads * hd;
    let group = shape.n_heads / shape.n_kv_heads;
    let bs = a.keys.block_size();
    let n = seq.rows.len();
    let lo = first_visible(shape.window, seq.start);
    let end = seq.start + n;
    // This kv head's visible keys and values, [end - lo, hd] each.
    let mut k = vec![0.0f32; (end - lo) * hd];
    let mut v = vec![0.0f32; (end - lo) * hd];
    for p in lo..end {
        let block = seq.block_table[p / bs];
        let off = (p % bs) * kv_dim + kv_head * hd;
        let i = (p - lo) * hd;
        a.keys.block(block).to_f32(off, &mut k[i..i + hd]);
        a.values.block(block).to_f32(off, &mut v[i..i + hd]);
    }
    // FP8 storages' scales (1 otherwise: nothing to do).
    for (data, scale) in [(&mut k, a.keys.scale()), (&mut v, a.values.scale())] {
        if scale != 1.0 {
            ops::scale_inplace(data, scale);
        }
    }
    (0..group).into_par_iter().for_each(|g| {
        let h = kv_head * group + g;
        let rows = HeadRows {
            q: &a.q[seq.rows.start * q_dim + h * hd..],
            q_stride: q_dim,
            keys: &k,
            values: &v,
            kv_stride: hd,
        };
        let mut o = vec![0.0f32; n * hd];
        let sink = a.sinks.map(|s| s[h]);
        head_gemm(isa, shape, sink, &rows, n, seq.start, lo, &mut o);
        for (t, row) in o.chunks_exact(hd).enumerate() {
            // SAFETY: cell (row t of this sequence, head h) belongs to this task alone.
            unsafe { a.out.write((seq.rows.start + t) * q_dim + h * hd, row) };
        }
    });
}

// ------------------------------------------------------------------------------- decode

fn decode_scalar(a: &DecodeArgs<'_>, sc: &mut DecodeScratch) {
    // SAFETY: the scalar primitives need no CPU feature.
    unsafe { decode_group::<Scalar>(a, sc) }
}

fn decode_fn(isa: Isa) -> DecodeFn {
    match isa {
        Isa::Scalar => decode_scalar,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => crate::simd::attn::decode_avx2,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => crate::simd::attn::decode_avx512,
        #[cfg(not(target_arch = "x86_64"))]
        _ => decode_scalar,
    }
}

thread_local! {
    static SCRATCH: RefCell<DecodeScratch> = RefCell::default();
}

/// The unnormalised softmax state of one part of a split decode task.
struct Partial {
    seq: usize,
    kv_head: usize,
    /// Per (row, group head): accumulator `[head_dim]`, running max, running sum.
    acc: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
}

/// Runs one decode task: writes its outputs, or returns its partial state when the task is
/// one of several parts.
fn decode_task(
    a: &CallArgs<'_>,
    decode: DecodeFn,
    seq_index: usize,
    seq: &SeqAttention<'_>,
    kv_head: usize,
    part: usize,
    parts: usize,
) -> Option<Partial> {
    let shape = a.shape;
    let hd = shape.head_dim;
    let q_dim = shape.n_heads * hd;
    let gd = shape.n_heads / shape.n_kv_heads * hd;
    // This part's slice of the positions any row may see.
    let first = first_visible(shape.window, seq.start);
    let len = seq.start + seq.rows.len() - first;
    let positions = first + part * len / parts..first + (part + 1) * len / parts;
    let args = DecodeArgs {
        shape,
        q: a.q,
        keys: a.keys,
        values: a.values,
        rows: seq.rows.clone(),
        start: seq.start,
        block_table: seq.block_table,
        kv_head,
        positions,
    };
    SCRATCH.with_borrow_mut(|sc| {
        // SAFETY: `decode` came from `decode_fn` for an ISA `paged_attention_with_isa`
        // found available.
        unsafe { decode(&args, sc) };
        if parts > 1 {
            return Some(Partial {
                seq: seq_index,
                kv_head,
                acc: sc.acc.clone(),
                max: sc.max.clone(),
                sum: sc.sum.clone(),
            });
        }
        // The values' scale (FP8; 1 otherwise) is folded into the normalisation.
        let v_scale = a.values.scale();
        let group = shape.n_heads / shape.n_kv_heads;
        for (st, (acc, &sum)) in sc.acc.chunks_exact_mut(hd).zip(&sc.sum).enumerate() {
            let sum = sum + sink_mass(a.sinks, kv_head * group + st % group, sc.max[st]);
            ops::scale_inplace(acc, v_scale / sum);
        }
        for (t, row) in sc.acc.chunks_exact(gd).enumerate() {
            // SAFETY: cells (row t of this sequence, heads of kv_head's group) belong to
            // this task alone.
            unsafe {
                a.out
                    .write((seq.rows.start + t) * q_dim + kv_head * gd, row)
            };
        }
        None
    })
}

/// What a sink adds to the softmax denominator of query head `h` whose running max is `max`:
/// `exp(sink - max)` (0 without sinks). The running max need not include the sink: the
/// accumulator and sum are relative to the same `max`.
fn sink_mass(sinks: Option<&[f32]>, h: usize, max: f32) -> f32 {
    sinks.map_or(0.0, |s| (s[h] - max).exp())
}

/// Combines the parts of one split decode task (`parts`: all of them, same sequence and kv
/// head) and writes the outputs: with `M` the largest part max, every part's accumulator and
/// sum are weighted by `exp(max_part - M)`.
fn merge_partials(a: &CallArgs<'_>, seq: &SeqAttention<'_>, parts: &[Partial]) {
    let hd = a.shape.head_dim;
    let q_dim = a.shape.n_heads * hd;
    let gd = a.shape.n_heads / a.shape.n_kv_heads * hd;
    let kv_head = parts[0].kv_head;
    let group = a.shape.n_heads / a.shape.n_kv_heads;
    let mut acc = vec![0.0f32; parts[0].acc.len()];
    for (st, out) in acc.chunks_exact_mut(hd).enumerate() {
        let m = parts
            .iter()
            .map(|p| p.max[st])
            .fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for p in parts {
            // A part that saw none of this row's positions has max -inf: weight 0.
            if p.max[st] == f32::NEG_INFINITY {
                continue;
            }
            let w = (p.max[st] - m).exp();
            sum += w * p.sum[st];
            ops::axpy(out, w, &p.acc[st * hd..(st + 1) * hd]);
        }
        let sum = sum + sink_mass(a.sinks, kv_head * group + st % group, m);
        ops::scale_inplace(out, a.values.scale() / sum);
    }
    for (t, row) in acc.chunks_exact(gd).enumerate() {
        // SAFETY: the parts' tasks are done; these cells belong to this (seq, kv head).
        unsafe {
            a.out
                .write((seq.rows.start + t) * q_dim + kv_head * gd, row)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::tests::lcg;
    use crate::kv_blocks::KvDtype;
    use decode::DecodeOps;

    fn shape(window: Option<usize>, softcap: Option<f32>) -> AttentionShape {
        AttentionShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            scale: 0.25,
            softcap,
            window,
        }
    }

    /// A pool holding one sequence of `len` positions through `table`.
    fn filled(dtype: KvDtype, table: &[u32], len: usize) -> (KvBlockStorage, KvBlockStorage) {
        let mut keys = KvBlockStorage::new(dtype, 8, 4, 32);
        let mut values = KvBlockStorage::new(dtype, 8, 4, 32);
        let mut seed = 3u64;
        let k: Vec<f32> = (0..len * 32).map(|_| lcg(&mut seed)).collect();
        keys.write(table, 0, &k);
        values.write(table, 0, &k);
        (keys, values)
    }

    #[test]
    fn plan_splits_decode_only_to_even_out_the_threads() {
        let table = [0u32; 200];
        let seq = |start: usize, n: usize| SeqAttention {
            rows: 0..n,
            start,
            block_table: &table,
        };
        let parts = |shape: &AttentionShape, seqs: &[SeqAttention<'_>], threads| {
            plan(shape, seqs, threads)
                .iter()
                .map(|t| match *t {
                    Task::Decode { parts, .. } => parts,
                    Task::Prefill { .. } => 0,
                })
                .collect::<Vec<_>>()
        };
        let kv2 = shape(None, None);
        let kv1 = AttentionShape {
            n_kv_heads: 1,
            ..kv2
        };
        // 2 kv heads x 1 sequence on 2 threads: already even.
        assert_eq!(parts(&kv2, &[seq(1000, 1)], 2), vec![1; 2]);
        // On 4 threads: 2 parts each; on 8: 4 each, but never below 256 positions a part.
        assert_eq!(parts(&kv2, &[seq(1000, 1)], 4), vec![2; 4]);
        assert_eq!(parts(&kv2, &[seq(1100, 1)], 8), vec![4; 8]);
        assert_eq!(parts(&kv2, &[seq(600, 1)], 8), vec![2; 4]);
        assert_eq!(parts(&kv2, &[seq(100, 1)], 8), vec![1; 2]);
        // 1 kv head on 3 threads: 3 parts; 3 sequences on 3 threads: none.
        assert_eq!(parts(&kv1, &[seq(1000, 1)], 3), vec![3; 3]);
        assert_eq!(
            parts(&kv1, &[seq(900, 1), seq(900, 1), seq(900, 1)], 3),
            vec![1; 3]
        );
        // Enough tasks per thread: no split. A window bounds what a split may cover.
        assert_eq!(parts(&kv1, &vec![seq(1000, 1); 4], 2), vec![1; 4]);
        let windowed = AttentionShape {
            window: Some(300),
            ..kv1
        };
        assert_eq!(parts(&windowed, &[seq(3000, 1)], 4), vec![1]);
        // Prefill tasks count, are never split and come first.
        assert_eq!(parts(&kv1, &[seq(0, 40), seq(1000, 1)], 4), vec![0, 2, 2]);
    }

    #[test]
    fn simd_exp_matches_libm() {
        // Several registers and a partial one, down past the underflow limit.
        let xs: Vec<f32> = (0..37).map(|i| -(i as f32) * 2.5 - 0.01).collect();
        for isa in crate::available_isas() {
            let mut x = xs.clone();
            // SAFETY: every ISA of `available_isas` is available.
            let sum = unsafe {
                match isa {
                    Isa::Scalar => Scalar::exp_sum(&mut x, 0.5),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => crate::simd::attn::Avx2::exp_sum(&mut x, 0.5),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => crate::simd::attn::Avx512::exp_sum(&mut x, 0.5),
                    #[cfg(not(target_arch = "x86_64"))]
                    _ => continue,
                }
            };
            let mut want_sum = 0.0;
            for (&got, &x0) in x.iter().zip(&xs) {
                let want = (x0 - 0.5).exp();
                want_sum += want;
                assert!(
                    (got - want).abs() <= 2e-7 * want + 1e-37,
                    "{isa}: exp({}) = {got}, want {want}",
                    x0 - 0.5
                );
            }
            assert!((sum - want_sum).abs() <= 1e-6 * want_sum, "{isa}");
        }
    }

    #[test]
    fn bad_arguments_are_errors_and_leave_out_untouched() {
        let table = [3u32, 1];
        let (keys, values) = filled(KvDtype::F16, &table, 6);
        let shape = shape(None, None);
        let q = vec![0.5f32; 3 * 64];
        let isa = crate::best_isa();
        let run = |seqs: &[SeqAttention<'_>]| {
            let mut out = vec![7.0f32; 3 * 64];
            let r = paged_attention_with_isa(isa, &shape, &q, &keys, &values, seqs, &mut out);
            assert!(out.iter().all(|&x| x == 7.0));
            r
        };
        let seq = |rows: Range<usize>, start: usize, block_table: &'static [u32]| SeqAttention {
            rows,
            start,
            block_table,
        };
        // Table too short for positions 0..9.
        assert!(matches!(
            run(&[seq(0..1, 8, &[3, 1])]),
            Err(KernelError::Shape(_))
        ));
        // Block outside the pool.
        assert!(run(&[seq(0..1, 5, &[3, 8])]).is_err());
        // Rows outside q, and two sequences sharing row 1.
        assert!(run(&[seq(2..4, 0, &[3])]).is_err());
        assert!(run(&[seq(0..2, 0, &[3]), seq(1..3, 0, &[1])]).is_err());
        let wrong = AttentionShape {
            n_kv_heads: 3,
            ..shape
        };
        let mut out = vec![0.0; q.len()];
        assert!(paged_attention_with_isa(isa, &wrong, &q, &keys, &values, &[], &mut out).is_err());
    }

    #[test]
    fn rows_no_sequence_names_are_untouched() {
        let table = [2u32, 5];
        let (keys, values) = filled(KvDtype::F32, &table, 6);
        let shape = shape(None, None);
        let q = vec![0.25f32; 3 * 64];
        let mut out = vec![7.0f32; 3 * 64];
        let seqs = [SeqAttention {
            rows: 1..2,
            start: 5,
            block_table: &table,
        }];
        paged_attention(&shape, &q, &keys, &values, &seqs, &mut out);
        assert!(out[..64].iter().chain(&out[128..]).all(|&x| x == 7.0));
        assert!(out[64..128].iter().all(|&x| x != 7.0));
    }
}
