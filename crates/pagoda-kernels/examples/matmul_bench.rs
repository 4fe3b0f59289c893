//! Matmul throughput per weight type, shape, token count and ISA path.
//!
//! `cargo run --release -p pagoda-kernels --example matmul_bench [-- TYPE,TYPE.. [ISA,ISA..]]`
//! `cargo run --release -p pagoda-kernels --example matmul_bench -- models [ISA,ISA..]`
//!
//! The `models` mode runs every matrix product of one forward pass of SmolLM2-135M (Q4_1,
//! Q8_0 output) and of Qwen2.5-1.5B Q4_K_M (Q4_K/Q6_K) in sequence, for 1 token (decode)
//! and 64 tokens (a prefill chunk), and prints the matmul-only time per step and tokens/s,
//! with the 4-bit matrices in the row layout and packed into 16-row strips (as models load
//! them on AVX-512 VNNI). In both modes `MATMUL_BENCH_TOKENS=1,4,8` sets the token counts
//! (e.g. the verification widths of speculative decoding); in `models` mode `MATMUL_BENCH_MODEL=Qwen2.5-1.5B` keeps
//! the models whose name contains it.
//!
//! Weights are cycled through enough copies (>= 256 MiB in all) that every call streams its
//! matrix from DRAM, as decode does with a real model; GB/s counts weight bytes read per
//! second, GFLOP/s counts 2·rows·cols·n. Threads: the rayon default (RAYON_NUM_THREADS).
//!
//! The machine may be shared: besides wall-clock rates the bench prints `cpu-GB/s`, weight
//! bytes per second of CPU time actually received by this process's threads (summed from
//! /proc/self/task/*/schedstat), times the thread count, i.e. the rate the
//! threads would reach if they had their cores to themselves.

use std::time::{Duration, Instant};

use pagoda_kernels::{available_isas, matmul_with_isa, quantize_row, GgmlType, Isa, WeightMatrix};

const TYPES: [GgmlType; 20] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Int8,
    GgmlType::Int4G32,
    GgmlType::Int4G64,
    GgmlType::Int4G128,
    GgmlType::Int4G32Sym,
    GgmlType::Int4G64Sym,
    GgmlType::Int4G128Sym,
    GgmlType::Nf4,
    GgmlType::Nf4Dq,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// (rows, cols): SmolLM2-135M FFN up (576 -> 1536) and down, Qwen2.5-1.5B FFN up/down.
const SHAPES: [(usize, usize); 4] = [(1536, 576), (576, 1536), (8960, 1536), (1536, 8960)];

/// Nanoseconds of CPU time all threads of this process have run so far (Linux; 0 elsewhere).
fn cpu_ns() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// (rows, cols, type, count per layer) of one layer, the layer count and the output head.
struct ModelShape {
    name: &'static str,
    layer: &'static [(usize, usize, GgmlType)],
    layers: usize,
    head: (usize, usize, GgmlType),
}

const MODELS: [ModelShape; 3] = [
    ModelShape {
        name: "SmolLM2-135M Q4_1",
        layer: &[
            (576, 576, GgmlType::Q4_1),  // q
            (192, 576, GgmlType::Q4_1),  // k
            (192, 576, GgmlType::Q4_1),  // v
            (576, 576, GgmlType::Q4_1),  // o
            (1536, 576, GgmlType::Q4_1), // gate
            (1536, 576, GgmlType::Q4_1), // up
            (576, 1536, GgmlType::Q4_1), // down
        ],
        layers: 30,
        head: (49152, 576, GgmlType::Q8_0),
    },
    ModelShape {
        name: "Qwen2.5-0.5B int4",
        layer: &[
            (896, 896, GgmlType::Q4_1),  // q
            (128, 896, GgmlType::Q4_1),  // k
            (128, 896, GgmlType::Q4_1),  // v
            (896, 896, GgmlType::Q4_1),  // o
            (4864, 896, GgmlType::Q4_1), // gate
            (4864, 896, GgmlType::Q4_1), // up
            (896, 4864, GgmlType::Q4_1), // down
        ],
        layers: 24,
        head: (151936, 896, GgmlType::Q8_0),
    },
    ModelShape {
        name: "Qwen2.5-1.5B Q4_K_M",
        layer: &[
            (1536, 1536, GgmlType::Q4_K), // q
            (256, 1536, GgmlType::Q4_K),  // k
            (256, 1536, GgmlType::Q6_K),  // v
            (1536, 1536, GgmlType::Q4_K), // o
            (8960, 1536, GgmlType::Q4_K), // gate
            (8960, 1536, GgmlType::Q4_K), // up
            (1536, 8960, GgmlType::Q6_K), // down
        ],
        layers: 28,
        head: (151936, 1536, GgmlType::Q6_K),
    },
];

fn quantized(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let row: Vec<f32> = (0..cols)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / 8388608.0 - 1.0
        })
        .collect();
    let mut q = vec![0u8; rb];
    quantize_row(ty, &row, &mut q).unwrap();
    q.iter().copied().cycle().take(rows * rb).collect()
}

/// Token counts per call: `MATMUL_BENCH_TOKENS`, default decode and a 64-token prefill chunk.
fn model_token_counts() -> Vec<usize> {
    std::env::var("MATMUL_BENCH_TOKENS")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|t| t.trim().parse().ok())
                .collect::<Vec<usize>>()
        })
        .filter(|v| !v.is_empty() && !v.contains(&0))
        .unwrap_or_else(|| vec![1, 64])
}

fn models(isas: &[Isa]) {
    let only = std::env::var("MATMUL_BENCH_MODEL").unwrap_or_default();
    for m in MODELS.iter().filter(|m| m.name.contains(only.as_str())) {
        let mut mats: Vec<(usize, usize, GgmlType, Vec<u8>)> = Vec::new();
        for l in 0..m.layers {
            for (i, &(r, c, t)) in m.layer.iter().enumerate() {
                mats.push((r, c, t, quantized(t, r, c, (l * 7 + i) as u32)));
            }
        }
        let (r, c, t) = m.head;
        mats.push((r, c, t, quantized(t, r, c, 99)));
        // The same matrices with the ones models pack (`strips_pay`) in 16-row strips.
        let packed: Vec<Option<Vec<u8>>> = mats
            .iter()
            .map(|(r, c, t, d)| {
                let w = WeightMatrix::new(*t, *r, *c, d).unwrap();
                (pagoda_kernels::packed::packable(*t, *r, *c)
                    && pagoda_kernels::packed::strips_pay(*t))
                .then(|| w.pack().unwrap())
            })
            .collect();
        let layouts: &[bool] = if packed.iter().any(Option::is_some) {
            &[false, true]
        } else {
            &[false]
        };
        let bytes: usize = mats.iter().map(|m| m.3.len()).sum();
        let maxc = mats.iter().map(|m| m.1).max().unwrap();
        let maxr = mats.iter().map(|m| m.0).max().unwrap();
        for n in model_token_counts() {
            let x: Vec<f32> = (0..n * maxc)
                .map(|i| ((i % 97) as f32 - 48.0) / 48.0)
                .collect();
            let mut out = vec![0.0f32; n * maxr];
            for (&isa, &strips) in isas
                .iter()
                .flat_map(|i| layouts.iter().map(move |l| (i, l)))
            {
                let mut step = || {
                    for ((r, c, t, d), p) in mats.iter().zip(&packed) {
                        let w = match p {
                            Some(p) if strips => WeightMatrix::packed(*t, *r, *c, p).unwrap(),
                            _ => WeightMatrix::new(*t, *r, *c, d).unwrap(),
                        };
                        matmul_with_isa(isa, &w, &x[..n * c], n, &mut out[..n * r]).unwrap();
                    }
                };
                step();
                let start = Instant::now();
                let cpu0 = cpu_ns();
                let mut steps = 0u32;
                while start.elapsed() < Duration::from_millis(1500) || steps < 2 {
                    step();
                    steps += 1;
                }
                let per = start.elapsed().as_secs_f64() / steps as f64;
                let cpu_per = (cpu_ns() - cpu0) as f64 * 1e-9
                    / steps as f64
                    / rayon::current_num_threads() as f64;
                println!(
                    "{:<20} n={:<3} {:<7} {:<6} {:>8.2} ms/step {:>8.1} tok/s {:>6.1} GB/s | cpu-time: {:>8.1} tok/s {:>6.1} GB/s",
                    m.name,
                    n,
                    isa.name(),
                    if strips { "strips" } else { "rows" },
                    per * 1e3,
                    n as f64 / per,
                    bytes as f64 / per / 1e9,
                    n as f64 / cpu_per,
                    bytes as f64 / cpu_per / 1e9
                );
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("models") {
        let isas: Vec<Isa> = match args.get(1) {
            Some(s) => available_isas()
                .into_iter()
                .filter(|i| s.split(',').any(|n| n == i.name()))
                .collect(),
            None => available_isas()
                .into_iter()
                .filter(|i| *i != Isa::Scalar)
                .collect(),
        };
        return models(&isas);
    }
    let types: Vec<GgmlType> = match args.first() {
        Some(s) => s
            .split(',')
            .map(|t| t.parse().expect("type name"))
            .collect(),
        None => TYPES.to_vec(),
    };
    let isas: Vec<Isa> = match args.get(1) {
        Some(s) => available_isas()
            .into_iter()
            .filter(|i| s.split(',').any(|n| n == i.name()))
            .collect(),
        None => available_isas(),
    };
    println!(
        "threads {}, ISAs {:?}",
        rayon::current_num_threads(),
        isas.iter().map(|i| i.name()).collect::<Vec<_>>()
    );
    println!(
        "{:<13} {:>11} {:>4} {:<7} {:>10} {:>9} {:>10} {:>9}",
        "type", "rows x cols", "n", "isa", "us/call", "GB/s", "GFLOP/s", "cpu-GB/s"
    );
    let threads = rayon::current_num_threads() as f64;
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    for &ty in &types {
        for &(rows, cols) in &SHAPES {
            let Ok(rb) = ty.row_bytes(cols) else {
                continue; // 576 columns are not whole 256-value k-quant blocks
            };
            let bytes = rows * rb;
            let mut one = vec![0u8; bytes];
            let row: Vec<f32> = (0..cols).map(|_| rand()).collect();
            for r in 0..rows {
                quantize_row(ty, &row, &mut one[r * rb..(r + 1) * rb]).unwrap();
            }
            let copies = (256usize << 20).div_ceil(bytes).max(2);
            let all: Vec<u8> = one.iter().copied().cycle().take(bytes * copies).collect();
            // Packable types run twice: row layout, then 16-row strips (`+strips`).
            let strips = pagoda_kernels::packed::packable(ty, rows, cols).then(|| {
                let w = WeightMatrix::new(ty, rows, cols, &one).unwrap();
                let p = w.pack().unwrap();
                p.iter()
                    .copied()
                    .cycle()
                    .take(bytes * copies)
                    .collect::<Vec<u8>>()
            });
            for n in model_token_counts() {
                let x: Vec<f32> = (0..n * cols).map(|_| rand()).collect();
                let mut out = vec![0.0f32; n * rows];
                let runs = isas.iter().flat_map(|&isa| {
                    std::iter::once((isa, None)).chain(strips.as_ref().map(|p| (isa, Some(p))))
                });
                for (isa, packed) in runs {
                    let mut i = 0usize;
                    let mut call = || {
                        let at = (i % copies) * bytes..(i % copies + 1) * bytes;
                        let w = match packed {
                            Some(p) => WeightMatrix::packed(ty, rows, cols, &p[at]).unwrap(),
                            None => WeightMatrix::new(ty, rows, cols, &all[at]).unwrap(),
                        };
                        matmul_with_isa(isa, &w, &x, n, &mut out).unwrap();
                        i += 1;
                    };
                    call();
                    let budget = Duration::from_millis(if isa == Isa::Scalar { 150 } else { 300 });
                    let start = Instant::now();
                    let cpu0 = cpu_ns();
                    let mut calls = 0u32;
                    while start.elapsed() < budget || calls < 3 {
                        call();
                        calls += 1;
                    }
                    let per = start.elapsed().as_secs_f64() / calls as f64;
                    let cpu_per = (cpu_ns() - cpu0) as f64 * 1e-9 / calls as f64 / threads;
                    println!(
                        "{:<13} {:>5}x{:<5} {:>4} {:<7} {:>10.1} {:>9.2} {:>10.1} {:>9.2}",
                        format!(
                            "{}{}",
                            ty.name(),
                            if packed.is_some() { "+strips" } else { "" }
                        ),
                        rows,
                        cols,
                        n,
                        isa.name(),
                        per * 1e6,
                        bytes as f64 / per / 1e9,
                        2.0 * (rows * cols * n) as f64 / per / 1e9,
                        bytes as f64 / cpu_per / 1e9
                    );
                }
            }
        }
    }
}
