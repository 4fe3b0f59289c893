//! Matmul throughput per weight type, shape, token count and ISA path.
//!
//! `cargo run --release -p pagoda-kernels --example matmul_bench [-- TYPE,TYPE.. [ISA,ISA..]]`
//!
//! Weights are cycled through enough copies (>= 256 MiB in all) that every call streams its
//! matrix from DRAM, as decode does with a real model; GB/s counts weight bytes read per
//! second, GFLOP/s counts 2·rows·cols·n. Threads: the rayon default (RAYON_NUM_THREADS).

use std::time::{Duration, Instant};

use pagoda_kernels::{available_isas, matmul_with_isa, quantize_row, GgmlType, Isa, WeightMatrix};

const TYPES: [GgmlType; 11] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// (rows, cols): SmolLM2-135M FFN up (576 -> 1536) and Qwen2.5-1.5B FFN up/down.
const SHAPES: [(usize, usize); 3] = [(1536, 576), (8960, 1536), (1536, 8960)];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
        "{:<6} {:>11} {:>4} {:<7} {:>10} {:>9} {:>10}",
        "type", "rows x cols", "n", "isa", "us/call", "GB/s", "GFLOP/s"
    );
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    for &ty in &types {
        for &(rows, cols) in &SHAPES {
            let rb = ty.row_bytes(cols).unwrap();
            let bytes = rows * rb;
            let mut one = vec![0u8; bytes];
            let row: Vec<f32> = (0..cols).map(|_| rand()).collect();
            for r in 0..rows {
                quantize_row(ty, &row, &mut one[r * rb..(r + 1) * rb]).unwrap();
            }
            let copies = (256usize << 20).div_ceil(bytes).max(2);
            let all: Vec<u8> = one.iter().copied().cycle().take(bytes * copies).collect();
            for n in [1usize, 64] {
                let x: Vec<f32> = (0..n * cols).map(|_| rand()).collect();
                let mut out = vec![0.0f32; n * rows];
                for &isa in &isas {
                    let mut i = 0usize;
                    let mut call = || {
                        let w = &all[(i % copies) * bytes..(i % copies + 1) * bytes];
                        let w = WeightMatrix::new(ty, rows, cols, w).unwrap();
                        matmul_with_isa(isa, &w, &x, n, &mut out).unwrap();
                        i += 1;
                    };
                    call();
                    let budget = Duration::from_millis(if isa == Isa::Scalar { 150 } else { 300 });
                    let start = Instant::now();
                    let mut calls = 0u32;
                    while start.elapsed() < budget || calls < 3 {
                        call();
                        calls += 1;
                    }
                    let per = start.elapsed().as_secs_f64() / calls as f64;
                    println!(
                        "{:<6} {:>5}x{:<5} {:>4} {:<7} {:>10.1} {:>9.2} {:>10.1}",
                        ty.name(),
                        rows,
                        cols,
                        n,
                        isa.name(),
                        per * 1e6,
                        bytes as f64 / per / 1e9,
                        2.0 * (rows * cols * n) as f64 / per / 1e9
                    );
                }
            }
        }
    }
}
