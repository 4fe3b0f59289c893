//! Attention of a batch of sequences over paged K/V ([`KvBlockStorage`] + block tables).
//!
//! Same semantics as [`causal_attention`]: row `t` of a sequence sits at position
//! `start + t` and attends to `max(0, pos + 1 - window) ..= pos`, GQA groups of query heads
//! share a kv head, optional soft-capping before the softmax.
//!
//! Two paths, chosen per sequence: rows of a sequence with few new tokens (decode) run one
//! task per (sequence, kv head) that walks the visible blocks once for every query head of the
//! group, converting each block of K and V to f32 once and keeping a streaming (online)
//! softmax; sequences with a prefill chunk gather their visible K/V into contiguous f32 and
//! reuse the GEMM path of [`causal_attention`]. All tasks of a call run together on rayon.
//!
//! Invariants: `q`/`out` are `[total_rows, n_heads * head_dim]`; every sequence's rows are
//! disjoint; its block table covers positions `0..start + n`.

use crate::attention::{causal_attention, AttentionShape, GEMM_MIN_ROWS};
use crate::kv_blocks::KvBlockStorage;
use crate::ops;
use rayon::prelude::*;
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

enum Task {
    /// Rows of sequence `seq`, query heads of kv head `kv_head`.
    Decode { seq: usize, kv_head: usize },
    /// Every row and head of sequence `seq`.
    Prefill { seq: usize },
}

/// `out[t] = softmax(scale * q[t] Kᵀ + mask) V` for every row of every sequence, K/V read
/// through the block tables. See the module docs for shapes.
pub fn paged_attention(
    shape: &AttentionShape,
    q: &[f32],
    keys: &KvBlockStorage,
    values: &KvBlockStorage,
    seqs: &[SeqAttention<'_>],
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let q_dim = shape.n_heads * hd;
    let kv_dim = shape.n_kv_heads * hd;
    assert!(shape.n_kv_heads > 0 && shape.n_heads % shape.n_kv_heads == 0);
    assert_eq!(q.len(), out.len());
    assert_eq!(q.len() % q_dim, 0);
    assert_eq!(keys.kv_dim(), kv_dim);
    assert_eq!(values.kv_dim(), kv_dim);
    assert_eq!(keys.block_size(), values.block_size());
    let bs = keys.block_size();
    for s in seqs {
        assert!(s.rows.end * q_dim <= q.len(), "rows outside q");
        assert!(
            s.block_table.len() * bs >= s.start + s.rows.len(),
            "block table too short"
        );
    }
    let tasks: Vec<Task> = seqs
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            let prefill = s.rows.len() >= GEMM_MIN_ROWS;
            let kv_heads = if prefill { 1 } else { shape.n_kv_heads };
            (0..kv_heads).map(move |kv_head| {
                if prefill {
                    Task::Prefill { seq: i }
                } else {
                    Task::Decode { seq: i, kv_head }
                }
            })
        })
        .collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|task| match *task {
            Task::Decode { seq, kv_head } => {
                decode_group(shape, q, keys, values, &seqs[seq], kv_head)
            }
            Task::Prefill { seq } => prefill_seq(shape, q, keys, values, &seqs[seq]),
        })
        .collect();
    let group = shape.n_heads / shape.n_kv_heads;
    let group_dim = group * hd;
    for (task, res) in tasks.iter().zip(results) {
        match *task {
            Task::Decode { seq, kv_head } => {
                let s = &seqs[seq];
                for (t, row) in s.rows.clone().zip(res.chunks_exact(group_dim)) {
                    out[t * q_dim + kv_head * group_dim..][..group_dim].copy_from_slice(row);
                }
            }
            Task::Prefill { seq } => {
                let s = &seqs[seq];
                out[s.rows.start * q_dim..s.rows.end * q_dim].copy_from_slice(&res);
            }
        }
    }
}

/// First key position a query at `pos` may see.
fn first_visible(window: Option<usize>, pos: usize) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// The group of query heads of `kv_head` for every row of `s`: `[n, group * head_dim]`.
fn decode_group(
    shape: &AttentionShape,
    q: &[f32],
    keys: &KvBlockStorage,
    values: &KvBlockStorage,
    s: &SeqAttention<'_>,
    kv_head: usize,
) -> Vec<f32> {
    let hd = shape.head_dim;
    let q_dim = shape.n_heads * hd;
    let kv_dim = shape.n_kv_heads * hd;
    let group = shape.n_heads / shape.n_kv_heads;
    let bs = keys.block_size();
    let n = s.rows.len();
    let mut out = vec![0.0f32; n * group * hd]; // [n, group * hd]
    let mut kblock = vec![0.0f32; bs * hd]; // [bs, hd] of this kv head
    let mut vblock = vec![0.0f32; bs * hd];
    let mut scores = vec![0.0f32; bs];
    // Streaming softmax state per query head: running max and sum.
    let mut max = vec![f32::NEG_INFINITY; group];
    let mut sum = vec![0.0f32; group];
    for t in 0..n {
        let pos = s.start + t;
        let lo = first_visible(shape.window, pos);
        max.fill(f32::NEG_INFINITY);
        sum.fill(0.0);
        let acc = &mut out[t * group * hd..(t + 1) * group * hd];
        let q_row = &q[(s.rows.start + t) * q_dim..][..q_dim];
        for b in lo / bs..=pos / bs {
            let first = (b * bs).max(lo);
            let last = ((b + 1) * bs - 1).min(pos); // inclusive
            let count = last + 1 - first;
            let slot0 = first - b * bs;
            let kb = keys.block(s.block_table[b]);
            let vb = values.block(s.block_table[b]);
            for j in 0..count {
                let off = (slot0 + j) * kv_dim + kv_head * hd;
                kb.to_f32(off, &mut kblock[j * hd..(j + 1) * hd]);
                vb.to_f32(off, &mut vblock[j * hd..(j + 1) * hd]);
            }
            for g in 0..group {
                let h = kv_head * group + g;
                let qh = &q_row[h * hd..(h + 1) * hd];
                let sc = &mut scores[..count];
                for (j, x) in sc.iter_mut().enumerate() {
                    *x = ops::dot_f32(qh, &kblock[j * hd..(j + 1) * hd]) * shape.scale;
                }
                if let Some(cap) = shape.softcap {
                    ops::softcap_inplace(sc, cap);
                }
                let block_max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let new_max = max[g].max(block_max);
                let o = &mut acc[g * hd..(g + 1) * hd];
                if new_max > max[g] && max[g] > f32::NEG_INFINITY {
                    let c = (max[g] - new_max).exp();
                    sum[g] *= c;
                    ops::scale_inplace(o, c);
                }
                max[g] = new_max;
                for (j, &x) in sc.iter().enumerate() {
                    let p = (x - new_max).exp();
                    sum[g] += p;
                    ops::axpy(o, p, &vblock[j * hd..(j + 1) * hd]);
                }
            }
        }
        for g in 0..group {
            let inv = 1.0 / sum[g];
            ops::scale_inplace(&mut acc[g * hd..(g + 1) * hd], inv);
        }
    }
    out
}

/// Every head of every row of `s` through the contiguous GEMM path: `[n, n_heads * head_dim]`.
fn prefill_seq(
    shape: &AttentionShape,
    q: &[f32],
    keys: &KvBlockStorage,
    values: &KvBlockStorage,
    s: &SeqAttention<'_>,
) -> Vec<f32> {
    let q_dim = shape.n_heads * shape.head_dim;
    let kv_dim = shape.n_kv_heads * shape.head_dim;
    let n = s.rows.len();
    let lo = first_visible(shape.window, s.start);
    let end = s.start + n;
    let mut k = vec![0.0f32; (end - lo) * kv_dim]; // [visible, kv_dim]
    let mut v = vec![0.0f32; (end - lo) * kv_dim];
    for p in lo..end {
        let i = p - lo;
        keys.read_row(s.block_table, p, &mut k[i * kv_dim..(i + 1) * kv_dim]);
        values.read_row(s.block_table, p, &mut v[i * kv_dim..(i + 1) * kv_dim]);
    }
    let mut out = vec![0.0f32; n * q_dim];
    let q_rows = &q[s.rows.start * q_dim..s.rows.end * q_dim];
    causal_attention(shape, q_rows, &k, &v, n, s.start - lo, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_blocks::KvDtype;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
    }

    /// Several sequences (decode rows and prefill chunks, shuffled tables, partial last
    /// blocks) in one call equal contiguous attention on the same (dtype-rounded) K/V.
    #[test]
    fn matches_contiguous_attention() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            for (window, softcap) in [(None, None), (Some(7), None), (None, Some(10.0))] {
                let shape = AttentionShape {
                    n_heads: 4,
                    n_kv_heads: 2,
                    head_dim: 16,
                    scale: 0.25,
                    softcap,
                    window,
                };
                let (bs, kv_dim, q_dim) = (4, 32, 64);
                let mut keys = KvBlockStorage::new(dtype, 40, bs, kv_dim);
                let mut values = KvBlockStorage::new(dtype, 40, bs, kv_dim);
                let mut seed = 7u64;
                // (start, n): decode, prefill from scratch, prefill chunk after a prefix, 2 rows.
                let specs = [(13usize, 1usize), (0, 9), (6, 5), (3, 2)];
                let mut next_block = 39u32;
                let mut tables = Vec::new();
                let mut contiguous = Vec::new();
                for &(start, n) in &specs {
                    let total = start + n;
                    let table: Vec<u32> = (0..total.div_ceil(bs))
                        .map(|_| {
                            next_block -= 3;
                            next_block % 40
                        })
                        .collect();
                    let k: Vec<f32> = (0..total * kv_dim).map(|_| lcg(&mut seed) * 4.0).collect();
                    let v: Vec<f32> = (0..total * kv_dim).map(|_| lcg(&mut seed)).collect();
                    keys.write(&table, 0, &k);
                    values.write(&table, 0, &v);
                    // Read back: the rounding of the storage type.
                    let mut kr = vec![0.0; k.len()];
                    let mut vr = vec![0.0; v.len()];
                    for p in 0..total {
                        keys.read_row(&table, p, &mut kr[p * kv_dim..(p + 1) * kv_dim]);
                        values.read_row(&table, p, &mut vr[p * kv_dim..(p + 1) * kv_dim]);
                    }
                    tables.push(table);
                    contiguous.push((kr, vr));
                }
                let total_rows: usize = specs.iter().map(|s| s.1).sum();
                let q: Vec<f32> = (0..total_rows * q_dim)
                    .map(|_| lcg(&mut seed) * 4.0)
                    .collect();
                let mut row = 0;
                let seqs: Vec<SeqAttention<'_>> = specs
                    .iter()
                    .zip(&tables)
                    .map(|(&(start, n), table)| {
                        let s = SeqAttention {
                            rows: row..row + n,
                            start,
                            block_table: table,
                        };
                        row += n;
                        s
                    })
                    .collect();
                let mut got = vec![0.0; q.len()];
                paged_attention(&shape, &q, &keys, &values, &seqs, &mut got);
                for (s, (k, v)) in seqs.iter().zip(&contiguous) {
                    let n = s.rows.len();
                    let mut want = vec![0.0; n * q_dim];
                    let qs = &q[s.rows.start * q_dim..s.rows.end * q_dim];
                    causal_attention(&shape, qs, k, v, n, s.start, &mut want);
                    let g = &got[s.rows.start * q_dim..s.rows.end * q_dim];
                    for (a, b) in g.iter().zip(&want) {
                        assert!(
                            (a - b).abs() < 1e-5,
                            "{dtype} {window:?} {softcap:?}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}
