//! Paged attention time per call: decode batches (16 sequences x 512 positions of context and
//! 64 x 256, one new row each at the last position; 1 x 2048, where decode tasks are split
//! along their positions) and a prefill chunk (256 rows after a
//! 256-row prefix), for the SmolLM2-135M layer shape (9 query / 3 kv heads of 64) and Qwen2.5-1.5B's
//! (12 / 2 of 128), F16, FP8 E4M3 and F32 blocks of 16 slots, on every ISA path; plus the contiguous
//! `causal_attention` over the same K/V (one call per sequence) for reference.
//!
//! `cargo run --release -p pagoda-kernels --example paged_attention_bench [-- ISA,ISA..]`
//!
//! `KV GB/s` counts the K and V bytes of the visible positions each call reads once.
//! Figures are the best of 5 rounds (the machine may be shared). Threads: the rayon default.

use std::time::{Duration, Instant};

use pagoda_kernels::attention::{causal_attention, AttentionShape};
use pagoda_kernels::kv_blocks::{KvBlockStorage, KvDtype};
use pagoda_kernels::paged_attention::{paged_attention_with_isa, SeqAttention};
use pagoda_kernels::{available_isas, Isa};

const BLOCK: usize = 16;

struct Setup {
    shape: AttentionShape,
    keys: KvBlockStorage,
    values: KvBlockStorage,
    contiguous: Vec<(Vec<f32>, Vec<f32>)>,
    tables: Vec<Vec<u32>>,
    /// (start, n) per sequence.
    seqs: Vec<(usize, usize)>,
    q: Vec<f32>,
}

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
}

fn setup(heads: (usize, usize, usize), dtype: KvDtype, seqs: &[(usize, usize)]) -> Setup {
    let (n_heads, n_kv_heads, head_dim) = heads;
    let shape = AttentionShape {
        n_heads,
        n_kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        softcap: None,
        window: None,
    };
    let kv_dim = n_kv_heads * head_dim;
    let blocks: usize = seqs.iter().map(|&(s, n)| (s + n).div_ceil(BLOCK)).sum();
    let mut keys = KvBlockStorage::new(dtype, blocks, BLOCK, kv_dim);
    let mut values = KvBlockStorage::new(dtype, blocks, BLOCK, kv_dim);
    let mut seed = 1u64;
    // Interleave the sequences' blocks, as a pool shared by a batch ends up.
    let n_seqs = seqs.len() as u32;
    let mut tables = Vec::new();
    let mut contiguous = Vec::new();
    for (i, &(start, n)) in seqs.iter().enumerate() {
        let len = start + n;
        let table: Vec<u32> = (0..len.div_ceil(BLOCK) as u32)
            .map(|b| b * n_seqs + i as u32)
            .collect();
        let k: Vec<f32> = (0..len * kv_dim).map(|_| lcg(&mut seed)).collect();
        let v: Vec<f32> = (0..len * kv_dim).map(|_| lcg(&mut seed)).collect();
        keys.write(&table, 0, &k);
        values.write(&table, 0, &v);
        tables.push(table);
        contiguous.push((k, v));
    }
    let rows: usize = seqs.iter().map(|s| s.1).sum();
    let q = (0..rows * n_heads * head_dim)
        .map(|_| lcg(&mut seed))
        .collect();
    Setup {
        shape,
        keys,
        values,
        contiguous,
        tables,
        seqs: seqs.to_vec(),
        q,
    }
}

/// Best-of-5 microseconds per call of `f`.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut iters = 0u32;
    while start.elapsed() < Duration::from_millis(100) {
        f();
        iters += 1;
    }
    let iters = iters.max(1);
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let isas: Vec<Isa> = match std::env::args().nth(1) {
        Some(list) => available_isas()
            .into_iter()
            .filter(|i| list.split(',').any(|n| n == i.name()))
            .collect(),
        None => available_isas(),
    };
    println!(
        "threads {}, ISAs {:?}",
        rayon::current_num_threads(),
        isas.iter().map(|i| i.name()).collect::<Vec<_>>()
    );
    println!(
        "{:<8} {:<22} {:<4} {:<10} {:>10} {:>9}",
        "model", "batch", "kv", "path", "us/call", "KV GB/s"
    );
    let decode16: Vec<(usize, usize)> = vec![(511, 1); 16];
    let decode64: Vec<(usize, usize)> = vec![(255, 1); 64];
    let decode1: Vec<(usize, usize)> = vec![(2047, 1)];
    let prefill = vec![(256, 256)];
    for (model, heads) in [("smollm2", (9, 3, 64)), ("qwen2.5", (12, 2, 128))] {
        for (batch, seqs) in [
            ("decode 16 x ctx 512", &decode16),
            ("decode 64 x ctx 256", &decode64),
            ("decode 1 x ctx 2048", &decode1),
            ("prefill 256 after 256", &prefill),
        ] {
            for dtype in [KvDtype::F16, KvDtype::Fp8E4m3, KvDtype::F32] {
                let s = setup(heads, dtype, seqs);
                let q_dim = heads.0 * heads.2;
                let mut out = vec![0.0; s.q.len()];
                let mut row = 0;
                let views: Vec<SeqAttention<'_>> = s
                    .seqs
                    .iter()
                    .zip(&s.tables)
                    .map(|(&(start, n), table)| {
                        let v = SeqAttention {
                            rows: row..row + n,
                            start,
                            block_table: table,
                        };
                        row += n;
                        v
                    })
                    .collect();
                let kv_bytes: usize = s
                    .seqs
                    .iter()
                    .map(|&(st, n)| 2 * (st + n) * heads.1 * heads.2 * dtype.bytes())
                    .sum();
                let line = |path: &str, us: f64| {
                    println!(
                        "{model:<8} {batch:<22} {dtype:<4} {path:<10} {us:>10.1} {:>9.2}",
                        kv_bytes as f64 / us / 1e3
                    );
                };
                for &isa in &isas {
                    let us = time(|| {
                        paged_attention_with_isa(
                            isa, &s.shape, &s.q, &s.keys, &s.values, &views, &mut out,
                        )
                        .expect("bench arguments are valid");
                    });
                    line(isa.name(), us);
                }
                if dtype == KvDtype::F32 {
                    let us = time(|| {
                        for (v, (k, vv)) in views.iter().zip(&s.contiguous) {
                            let r = v.rows.start * q_dim..v.rows.end * q_dim;
                            let n = v.rows.len();
                            causal_attention(
                                &s.shape,
                                &s.q[r.clone()],
                                k,
                                vv,
                                n,
                                v.start,
                                &mut out[r],
                            );
                        }
                    });
                    line("contiguous", us);
                }
            }
        }
    }
}
