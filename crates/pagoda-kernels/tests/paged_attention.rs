//! Paged attention against contiguous `causal_attention` on the same keys and values: batches
//! of sequences with decode rows and prefill chunks, shuffled block tables, GQA, sliding
//! windows, soft-capping and partial last blocks, on every ISA path and every storage type
//! (F16 and FP8 compared against contiguous attention over the K/V as stored, FP8 with scales
//! other than 1), plus a property test over random shapes and tables, and the cost of FP8 K/V
//! against F16 K/V on the same inputs (`FP8_VS_F16_TOLERANCE`).

use pagoda_kernels::attention::{causal_attention, AttentionShape};
use pagoda_kernels::kv_blocks::{KvBlockStorage, KvDtype};
use pagoda_kernels::paged_attention::{paged_attention, paged_attention_with_isa, SeqAttention};
use pagoda_kernels::{available_isas, Isa};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// One case: a layer shape, a block pool and the sequences of one call.
#[derive(Debug, Clone)]
struct Case {
    shape: AttentionShape,
    dtype: KvDtype,
    block_size: usize,
    /// (start, n) of each sequence.
    seqs: Vec<(usize, usize)>,
    seed: u64,
}

/// Storage, tables and inputs built from a case, and the contiguous K/V each sequence sees.
struct Built {
    keys: KvBlockStorage,
    values: KvBlockStorage,
    tables: Vec<Vec<u32>>,
    /// Per sequence: K and V `[start + n, kv_dim]` as read back from storage.
    contiguous: Vec<(Vec<f32>, Vec<f32>)>,
    q: Vec<f32>,
}

/// FP8 keys with scale 1/32 and values with scale 1/128 (K in ±2 is at most 64 codes' worth,
/// V in ±1 at most 128: neither saturates), so the scales are exercised.
const FP8_TEST_SCALES: (f32, f32) = (1.0 / 32.0, 1.0 / 128.0);

fn storages(
    dtype: KvDtype,
    n_blocks: usize,
    bs: usize,
    kv_dim: usize,
) -> (KvBlockStorage, KvBlockStorage) {
    match dtype {
        KvDtype::Fp8E4m3 => (
            KvBlockStorage::new_fp8(n_blocks, bs, kv_dim, FP8_TEST_SCALES.0),
            KvBlockStorage::new_fp8(n_blocks, bs, kv_dim, FP8_TEST_SCALES.1),
        ),
        _ => (
            KvBlockStorage::new(dtype, n_blocks, bs, kv_dim),
            KvBlockStorage::new(dtype, n_blocks, bs, kv_dim),
        ),
    }
}

fn build(c: &Case) -> Built {
    let mut rng = StdRng::seed_from_u64(c.seed);
    let kv_dim = c.shape.n_kv_heads * c.shape.head_dim;
    let q_dim = c.shape.n_heads * c.shape.head_dim;
    let bs = c.block_size;
    let needed: usize = c.seqs.iter().map(|&(s, n)| (s + n).div_ceil(bs)).sum();
    // A few spare blocks, then every sequence gets distinct, shuffled blocks.
    let n_blocks = needed + 3;
    let mut pool: Vec<u32> = (0..n_blocks as u32).collect();
    pool.shuffle(&mut rng);
    let (mut keys, mut values) = storages(c.dtype, n_blocks, bs, kv_dim);
    let mut tables = Vec::new();
    let mut contiguous = Vec::new();
    for &(start, n) in &c.seqs {
        let total = start + n;
        let table: Vec<u32> = pool.drain(..total.div_ceil(bs)).collect();
        let k: Vec<f32> = (0..total * kv_dim)
            .map(|_| rng.gen_range(-2.0..2.0))
            .collect();
        let v: Vec<f32> = (0..total * kv_dim)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        // Two writes (prefix, then the new rows), as a model fills the cache.
        keys.write(&table, 0, &k[..start * kv_dim]);
        keys.write(&table, start, &k[start * kv_dim..]);
        values.write(&table, 0, &v[..start * kv_dim]);
        values.write(&table, start, &v[start * kv_dim..]);
        let mut kr = vec![0.0; k.len()];
        let mut vr = vec![0.0; v.len()];
        for p in 0..total {
            keys.read_row(&table, p, &mut kr[p * kv_dim..(p + 1) * kv_dim]);
            values.read_row(&table, p, &mut vr[p * kv_dim..(p + 1) * kv_dim]);
        }
        if c.dtype == KvDtype::F32 {
            assert_eq!(kr, k, "f32 storage reads back exactly");
        }
        tables.push(table);
        contiguous.push((kr, vr));
    }
    let rows: usize = c.seqs.iter().map(|s| s.1).sum();
    let q = (0..rows * q_dim)
        .map(|_| rng.gen_range(-2.0..2.0))
        .collect();
    Built {
        keys,
        values,
        tables,
        contiguous,
        q,
    }
}

fn seq_views<'a>(c: &Case, tables: &'a [Vec<u32>]) -> Vec<SeqAttention<'a>> {
    let mut row = 0;
    c.seqs
        .iter()
        .zip(tables)
        .map(|(&(start, n), table)| {
            let s = SeqAttention {
                rows: row..row + n,
                start,
                block_table: table,
            };
            row += n;
            s
        })
        .collect()
}

/// Largest |paged - contiguous| over every output of the case on `isa`.
fn max_error(c: &Case, isa: Isa) -> f32 {
    let b = build(c);
    let q_dim = c.shape.n_heads * c.shape.head_dim;
    let seqs = seq_views(c, &b.tables);
    let mut got = vec![f32::NAN; b.q.len()];
    paged_attention_with_isa(isa, &c.shape, &b.q, &b.keys, &b.values, &seqs, &mut got)
        .expect("valid case");
    let mut worst = 0.0f32;
    for (s, (k, v)) in seqs.iter().zip(&b.contiguous) {
        let n = s.rows.len();
        let mut want = vec![0.0; n * q_dim];
        let qs = &b.q[s.rows.start * q_dim..s.rows.end * q_dim];
        causal_attention(&c.shape, qs, k, v, n, s.start, &mut want);
        let g = &got[s.rows.start * q_dim..s.rows.end * q_dim];
        for (x, y) in g.iter().zip(&want) {
            assert!(x.is_finite(), "{isa}: non-finite output {x}");
            worst = worst.max((x - y).abs());
        }
    }
    worst
}

fn tolerance(dtype: KvDtype) -> f32 {
    match dtype {
        KvDtype::F32 => 1e-5,
        // The kernel reads exactly the values `read_row` gives; only the order of f32 sums
        // differs, as for F16.
        KvDtype::F16 | KvDtype::Fp8E4m3 => 1e-4,
    }
}

fn shape(
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    softcap: Option<f32>,
    window: Option<usize>,
) -> AttentionShape {
    AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        softcap,
        window,
    }
}

fn check_everywhere(c: &Case) {
    for isa in available_isas() {
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Fp8E4m3] {
            let c = Case { dtype, ..c.clone() };
            let e = max_error(&c, isa);
            assert!(e < tolerance(dtype), "{isa} {dtype} {c:?}: max error {e}");
        }
    }
}

/// The shapes of the served models: SmolLM2 (9/3 x 64), Qwen2.5-1.5B (12/2 x 128), a Gemma 3
/// local layer (window and softcap, 4/1 x 256), an odd head size (20) for the SIMD tails.
#[test]
fn mixed_batches_match_contiguous_attention() {
    // Decode rows at block edges and mid-block, 2- and 3-row chunks, prefill from scratch
    // and after a prefix, a partial last block everywhere.
    let seqs = vec![
        (37, 1),
        (0, 1),
        (15, 1),
        (16, 1),
        (0, 21),
        (9, 2),
        (30, 3),
        (17, 6),
    ];
    for (shape, bs) in [
        (shape(9, 3, 64, None, None), 16),
        (shape(12, 2, 128, None, None), 16),
        (shape(4, 1, 256, Some(30.0), Some(11)), 4),
        (shape(6, 3, 20, None, Some(5)), 32),
        (shape(2, 2, 48, Some(5.0), None), 7),
    ] {
        check_everywhere(&Case {
            shape,
            dtype: KvDtype::F32,
            block_size: bs,
            seqs: seqs.clone(),
            seed: 11,
        });
    }
}

#[test]
fn long_context_decode_with_a_window_skips_nothing_it_should_see() {
    // 300 positions, window 40: only the last 3-4 blocks are visible.
    check_everywhere(&Case {
        shape: shape(8, 2, 64, None, Some(40)),
        dtype: KvDtype::F32,
        block_size: 16,
        seqs: vec![(299, 1), (250, 2), (0, 1)],
        seed: 5,
    });
}

/// Few sequences over long contexts on a few threads: decode tasks are split along their
/// positions and the parts' softmax states merged; the result must not notice.
#[test]
fn split_long_decodes_match_contiguous_attention() {
    for threads in [2, 3, 4, 8] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a test pool");
        pool.install(|| {
            for (shape, bs, seqs) in [
                (shape(9, 3, 64, None, None), 16, vec![(1100, 1)]),
                (
                    shape(12, 2, 128, Some(20.0), None),
                    16,
                    vec![(700, 2), (0, 1)],
                ),
                // Window 600 of 1500 positions; part boundaries fall mid-block (block 7).
                (shape(4, 1, 256, None, Some(600)), 7, vec![(1499, 1)]),
                // A prefill chunk in the same call as a split decode.
                (shape(6, 2, 16, None, None), 16, vec![(900, 3), (40, 24)]),
            ] {
                check_everywhere(&Case {
                    shape,
                    dtype: KvDtype::F32,
                    block_size: bs,
                    seqs,
                    seed: threads as u64,
                });
            }
        });
    }
}

#[test]
fn a_window_skips_blocks_it_cannot_see() {
    // Blocks wholly before the window are never read: their table entries may even be
    // stale. Give them a block full of huge values; the result must not change.
    let c = Case {
        shape: shape(2, 1, 16, None, Some(8)),
        dtype: KvDtype::F32,
        block_size: 4,
        seqs: vec![(20, 1)],
        seed: 9,
    };
    let b = build(&c);
    let seqs = seq_views(&c, &b.tables);
    let mut want = vec![0.0; b.q.len()];
    paged_attention(&c.shape, &b.q, &b.keys, &b.values, &seqs, &mut want);
    let mut keys = b.keys.clone();
    let mut values = b.values.clone();
    let table = &b.tables[0];
    // Position 20 sees 13..=20: blocks 0..3 (positions 0..12) are outside.
    keys.write(table, 0, &vec![1e30; 12 * 16]);
    values.write(table, 0, &vec![1e30; 12 * 16]);
    let mut got = vec![0.0; b.q.len()];
    paged_attention(&c.shape, &b.q, &keys, &values, &seqs, &mut got);
    assert_eq!(got, want);
}

#[test]
fn every_isa_gives_the_scalar_result() {
    let c = Case {
        shape: shape(12, 2, 128, Some(50.0), None),
        dtype: KvDtype::F16,
        block_size: 16,
        seqs: vec![(100, 1), (64, 1), (3, 2)],
        seed: 21,
    };
    let b = build(&c);
    let seqs = seq_views(&c, &b.tables);
    let run = |isa| {
        let mut out = vec![0.0; b.q.len()];
        paged_attention_with_isa(isa, &c.shape, &b.q, &b.keys, &b.values, &seqs, &mut out).unwrap();
        out
    };
    let scalar = run(Isa::Scalar);
    for isa in available_isas() {
        for (x, y) in run(isa).iter().zip(&scalar) {
            assert!((x - y).abs() < 1e-5, "{isa}: {x} vs scalar {y}");
        }
    }
}

#[test]
fn every_isa_gives_the_scalar_result_on_fp8_with_nan_codes_kept() {
    let c = Case {
        shape: shape(12, 2, 128, Some(50.0), None),
        dtype: KvDtype::Fp8E4m3,
        block_size: 16,
        seqs: vec![(100, 1), (64, 1), (3, 2)],
        seed: 22,
    };
    let b = build(&c);
    let seqs = seq_views(&c, &b.tables);
    let run = |values: &KvBlockStorage, isa| {
        let mut out = vec![0.0; b.q.len()];
        paged_attention_with_isa(isa, &c.shape, &b.q, &b.keys, values, &seqs, &mut out).unwrap();
        out
    };
    let scalar = run(&b.values, Isa::Scalar);
    for isa in available_isas() {
        for (x, y) in run(&b.values, isa).iter().zip(&scalar) {
            assert!((x - y).abs() < 1e-5, "{isa}: {x} vs scalar {y}");
        }
    }
    // A NaN stored in V stays NaN on every path (as in f16: a numerical fault is reported,
    // never hidden by the cache's format).
    let mut values = b.values.clone();
    let kv_dim = c.shape.n_kv_heads * c.shape.head_dim;
    let mut row = vec![0.5f32; kv_dim];
    row[3] = f32::NAN;
    values.write(&b.tables[0], 50, &row);
    for isa in available_isas() {
        // Row 0, query head 0 (kv head 0), dimension 3.
        let out = run(&values, isa);
        assert!(out[3].is_nan(), "{isa}: a NaN value read as {}", out[3]);
    }
}

/// FP8 (E4M3, scale 1) K/V against F16 K/V on the same inputs: keys in ±2, values in ±1,
/// outputs in ±1. E4M3 keeps 3 mantissa bits (relative error ≤ 2^-4 per value). Measured
/// largest output differences over the shapes below: 0.045 (9/3 x 64), 0.042 (12/2 x 128),
/// 0.022 (4/1 x 256), the same on every ISA; the bound leaves room for other seeds while
/// failing a decode that misreads codes.
const FP8_VS_F16_TOLERANCE: f32 = 0.08;

#[test]
fn fp8_kv_stays_within_a_named_tolerance_of_f16_kv() {
    for (shape, bs, seqs) in [
        (
            shape(9, 3, 64, None, None),
            16,
            vec![(200, 1), (0, 40), (31, 3)],
        ),
        (shape(12, 2, 128, None, None), 16, vec![(500, 1), (17, 20)]),
        (shape(4, 1, 256, Some(30.0), Some(64)), 8, vec![(300, 1)]),
    ] {
        let c = Case {
            shape,
            dtype: KvDtype::F16,
            block_size: bs,
            seqs,
            seed: 3,
        };
        let bf = build(&c);
        let q_dim = c.shape.n_heads * c.shape.head_dim;
        let kv_dim = c.shape.n_kv_heads * c.shape.head_dim;
        // The same K/V (as f16 read them back) into FP8 storage at scale 1.
        let n_blocks = bf.keys.n_blocks();
        let mut k8 = KvBlockStorage::new(KvDtype::Fp8E4m3, n_blocks, bs, kv_dim);
        let mut v8 = KvBlockStorage::new(KvDtype::Fp8E4m3, n_blocks, bs, kv_dim);
        for (table, (k, v)) in bf.tables.iter().zip(&bf.contiguous) {
            k8.write(table, 0, k);
            v8.write(table, 0, v);
        }
        let seqs = seq_views(&c, &bf.tables);
        for isa in available_isas() {
            let mut f16_out = vec![0.0; bf.q.len()];
            let mut fp8_out = vec![0.0; bf.q.len()];
            paged_attention_with_isa(
                isa,
                &c.shape,
                &bf.q,
                &bf.keys,
                &bf.values,
                &seqs,
                &mut f16_out,
            )
            .unwrap();
            paged_attention_with_isa(isa, &c.shape, &bf.q, &k8, &v8, &seqs, &mut fp8_out).unwrap();
            let worst = f16_out
                .iter()
                .zip(&fp8_out)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            let rows = bf.q.len() / q_dim;
            assert!(
                worst < FP8_VS_F16_TOLERANCE,
                "{isa} {:?}: fp8 vs f16 max difference {worst} over {rows} rows",
                c.shape
            );
            assert!(worst > 0.0, "fp8 storage rounded nothing: is it fp8?");
        }
    }
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        (
            1usize..=4,
            1usize..=4,
            prop_oneof![1usize..=40, Just(64), Just(72), Just(128)],
        ),
        prop_oneof![Just(None), (1.0f32..40.0).prop_map(Some)],
        prop_oneof![Just(None), (1usize..30).prop_map(Some)],
        prop_oneof![
            Just(KvDtype::F16),
            Just(KvDtype::F32),
            Just(KvDtype::Fp8E4m3)
        ],
        1usize..=20,
        // Mostly short contexts; some long enough for a split decode (few tasks per thread).
        prop::collection::vec(
            (
                prop_oneof![4 => 0usize..60, 1 => 500usize..1100],
                prop_oneof![1usize..=3, 4usize..=12],
            ),
            1..6,
        ),
        any::<u64>(),
    )
        .prop_map(
            |((kv, group, hd), softcap, window, dtype, block_size, seqs, seed)| Case {
                shape: shape(kv * group, kv, hd, softcap, window),
                dtype,
                block_size,
                seqs,
                seed,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random shapes, block sizes, windows, softcaps and batches on every ISA path.
    #[test]
    fn paged_equals_contiguous(c in case_strategy()) {
        for isa in available_isas() {
            let e = max_error(&c, isa);
            prop_assert!(e < tolerance(c.dtype), "{} max error {}", isa, e);
        }
    }
}

#[test]
fn empty_batches_and_empty_sequences_do_nothing() {
    let c = Case {
        shape: shape(2, 1, 16, None, None),
        dtype: KvDtype::F16,
        block_size: 4,
        seqs: vec![(5, 1)],
        seed: 1,
    };
    let b = build(&c);
    let mut out = vec![3.0; b.q.len()];
    paged_attention(&c.shape, &b.q, &b.keys, &b.values, &[], &mut out);
    let table: Vec<u32> = Vec::new();
    let empty = [SeqAttention {
        rows: 0..0,
        start: 0,
        block_table: &table,
    }];
    paged_attention(&c.shape, &b.q, &b.keys, &b.values, &empty, &mut out);
    assert!(out.iter().all(|&x| x == 3.0));
}

/// Attention with sinks computed the plain way: per row and query head, the scores of the
/// visible positions, `p_j = exp(s_j - m) / (Σ exp(s - m) + exp(sink - m))`, `Σ p_j v_j`.
fn naive_with_sinks(
    shape: &AttentionShape,
    sinks: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    start: usize,
) -> Vec<f32> {
    let hd = shape.head_dim;
    let (q_dim, kv_dim) = (shape.n_heads * hd, shape.n_kv_heads * hd);
    let group = shape.n_heads / shape.n_kv_heads;
    let mut out = vec![0.0f32; n * q_dim];
    for t in 0..n {
        let pos = start + t;
        let first = shape.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..shape.n_heads {
            let kvh = h / group;
            let qh = &q[t * q_dim + h * hd..][..hd];
            let scores: Vec<f32> = (first..=pos)
                .map(|p| {
                    let kp = &k[p * kv_dim + kvh * hd..][..hd];
                    shape.scale * qh.iter().zip(kp).map(|(a, b)| a * b).sum::<f32>()
                })
                .collect();
            let m = scores.iter().copied().fold(sinks[h], f32::max);
            let denom: f32 =
                scores.iter().map(|s| (s - m).exp()).sum::<f32>() + (sinks[h] - m).exp();
            let o = &mut out[t * q_dim + h * hd..][..hd];
            for (s, p) in scores.iter().zip(first..=pos) {
                let w = (s - m).exp() / denom;
                let vp = &v[p * kv_dim + kvh * hd..][..hd];
                for (x, y) in o.iter_mut().zip(vp) {
                    *x += w * y;
                }
            }
        }
    }
    out
}

/// Sinks on the decode path (whole and split along positions) and the prefill GEMM path,
/// with GQA and a window: the same as the plain computation, and different from no sinks.
#[test]
fn attention_sinks_join_the_denominator_on_every_path() {
    use pagoda_kernels::paged_attention::paged_attention_with_sinks;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .expect("a test pool");
    pool.install(|| {
        for (shape, seqs) in [
            (shape(4, 2, 16, None, None), vec![(30, 1), (0, 1)]),
            // 1100 visible positions: split into parts, merged.
            (shape(4, 2, 16, None, None), vec![(1100, 1)]),
            (shape(4, 2, 16, None, Some(8)), vec![(60, 1)]),
            (shape(6, 2, 16, None, Some(12)), vec![(5, 40), (300, 2)]),
        ] {
            let c = Case {
                shape,
                dtype: KvDtype::F32,
                block_size: 16,
                seqs,
                seed: 7,
            };
            let b = build(&c);
            let seqs = seq_views(&c, &b.tables);
            let sinks: Vec<f32> = (0..shape.n_heads).map(|h| h as f32 * 1.5 + 4.0).collect();
            let mut got = vec![f32::NAN; b.q.len()];
            paged_attention_with_sinks(
                &shape,
                Some(&sinks),
                &b.q,
                &b.keys,
                &b.values,
                &seqs,
                &mut got,
            );
            let mut plain = vec![f32::NAN; b.q.len()];
            paged_attention(&shape, &b.q, &b.keys, &b.values, &seqs, &mut plain);
            let q_dim = shape.n_heads * shape.head_dim;
            let (mut worst, mut moved) = (0.0f32, 0.0f32);
            for (s, (k, v)) in seqs.iter().zip(&b.contiguous) {
                let n = s.rows.len();
                let qs = &b.q[s.rows.start * q_dim..s.rows.end * q_dim];
                let want = naive_with_sinks(&shape, &sinks, qs, k, v, n, s.start);
                let range = s.rows.start * q_dim..s.rows.end * q_dim;
                for ((x, y), z) in got[range.clone()].iter().zip(&want).zip(&plain[range]) {
                    worst = worst.max((x - y).abs());
                    moved = moved.max((x - z).abs());
                }
            }
            assert!(worst < 1e-5, "{shape:?}: max error {worst}");
            assert!(moved > 1e-2, "{shape:?}: sinks changed nothing ({moved})");
        }
    });
}
