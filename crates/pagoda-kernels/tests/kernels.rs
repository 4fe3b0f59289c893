//! Integration tests of pagoda-kernels: bit-exact dequantization and quantization against
//! golden files made by gguf-py (`scripts/golden_dequant.py`), quantization round-trip error
//! bounds, the round trip of every weight format against a NumPy implementation
//! (`scripts/golden_formats.py`), one matmul test body run on every available ISA path, and
//! property tests for shapes and bad lengths.

use pagoda_kernels::{
    available_isas, best_isa, dequantize_row, matmul, matmul_with_isa, quantize_row, GgmlType, Isa,
    KernelError, WeightMatrix,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");

fn read(name: &str) -> Vec<u8> {
    std::fs::read(format!("{GOLDEN}/{name}")).unwrap_or_else(|e| panic!("golden file {name}: {e}"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Types gguf-py dequantizes, with golden files.
const DEQUANT_GOLDEN: [GgmlType; 13] = [
    GgmlType::Mxfp4,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    for ty in DEQUANT_GOLDEN {
        let raw = read(&format!("dequant_{ty}.bin"));
        let expected = f32s(&read(&format!("dequant_{ty}.f32")));
        assert!(!expected.is_empty(), "{ty}: empty golden file");
        let mut got = vec![f32::NAN; expected.len()];
        dequantize_row(ty, &raw, &mut got).unwrap();
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(
                g.to_bits(),
                e.to_bits(),
                "{ty} element {i}: got {g}, gguf-py {e}"
            );
        }
        // The same bytes at an odd address (an mmap slice need not be aligned).
        let mut shifted = vec![0u8; raw.len() + 1];
        shifted[1..].copy_from_slice(&raw);
        let mut got2 = vec![0.0f32; expected.len()];
        dequantize_row(ty, &shifted[1..], &mut got2).unwrap();
        assert_eq!(got, got2, "{ty}: unaligned source changed the result");
    }
}

#[test]
fn quantize_matches_gguf_py_bit_for_bit() {
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::BF16,
        GgmlType::F16,
        GgmlType::Mxfp4,
    ] {
        let x = f32s(&read(&format!("quant_{ty}.f32")));
        let expected = read(&format!("quant_{ty}.bin"));
        let mut got = vec![0u8; ty.row_bytes(x.len()).unwrap()];
        quantize_row(ty, &x, &mut got).unwrap();
        assert_eq!(got.len(), expected.len(), "{ty}");
        let bs = ty.type_size();
        for (i, (g, e)) in got.chunks(bs).zip(expected.chunks(bs)).enumerate() {
            assert_eq!(g, e, "{ty} block {i} differs from gguf-py");
        }
    }
}

/// The formats `scripts/golden_formats.py` round-trips in NumPy (gguf-py for the GGUF ones).
const FORMAT_GOLDEN: [GgmlType; 14] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Int8,
    GgmlType::Int4G32,
    GgmlType::Int4G64,
    GgmlType::Int4G128,
    GgmlType::Int4G32Sym,
    GgmlType::Int4G64Sym,
    GgmlType::Int4G128Sym,
    GgmlType::Nf4,
    GgmlType::Nf4Dq,
];

/// Elements whose round trip may differ from NumPy's (a value on a rounding tie, or a
/// scale one f32 ulp apart), as a fraction of a matrix; each such element differs by at
/// most one quantization step, bounded by twice NumPy's largest round-trip error.
const FORMAT_MISMATCH_FRACTION: f64 = 0.01;
/// Pagoda's RMSE and max |error| may exceed NumPy's by this factor (they are equal when no
/// element differs).
const FORMAT_ERROR_SLACK: f64 = 1.01;

#[test]
fn formats_round_trip_matches_the_numpy_goldens() {
    let summary: serde_json::Value =
        serde_json::from_slice(&read("formats/summary.json")).expect("summary.json");
    for m in ["gauss_outliers", "row_scales"] {
        let x = f32s(&read(&format!("formats/input_{m}.f32")));
        let (rows, cols) = (4, 256);
        assert_eq!(x.len(), rows * cols);
        for ty in FORMAT_GOLDEN {
            let want = f32s(&read(&format!("formats/{}_{m}.f32", ty.name())));
            let rb = ty.row_bytes(cols).unwrap();
            let mut got = vec![0.0f32; rows * cols];
            let mut q = vec![0u8; rb];
            for r in 0..rows {
                let span = r * cols..(r + 1) * cols;
                quantize_row(ty, &x[span.clone()], &mut q).unwrap();
                dequantize_row(ty, &q, &mut got[span]).unwrap();
            }
            let s = &summary[ty.name()][m];
            let (rmse, max_abs) = (s["rmse"].as_f64().unwrap(), s["max_abs"].as_f64().unwrap());
            let mismatches = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            let worst_diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (*a as f64 - *b as f64).abs())
                .fold(0.0, f64::max);
            let e: Vec<f64> = got
                .iter()
                .zip(&x)
                .map(|(a, b)| *a as f64 - *b as f64)
                .collect();
            let my_rmse = (e.iter().map(|v| v * v).sum::<f64>() / e.len() as f64).sqrt();
            let my_max = e.iter().fold(0.0f64, |a, v| a.max(v.abs()));
            eprintln!(
                "{ty} {m}: {mismatches} of {} differ from NumPy (max {worst_diff:.2e}); \
                 RMSE {my_rmse:.4e} vs {rmse:.4e}, max {my_max:.4e} vs {max_abs:.4e}",
                x.len()
            );
            assert!(
                mismatches as f64 <= FORMAT_MISMATCH_FRACTION * x.len() as f64,
                "{ty} {m}: {mismatches} values differ from NumPy's round trip"
            );
            assert!(
                worst_diff <= 2.0 * max_abs,
                "{ty} {m}: differs by {worst_diff}"
            );
            assert!(
                my_rmse <= rmse * FORMAT_ERROR_SLACK + 1e-12,
                "{ty} {m}: RMSE {my_rmse}"
            );
            assert!(
                my_max <= max_abs * FORMAT_ERROR_SLACK + 1e-12,
                "{ty} {m}: max {my_max}"
            );
        }
    }
}

/// Relative RMS round-trip error allowed per type and 256-value group of a Gaussian row
/// (measured worst cases are 70-90% of these; `--nocapture` prints them).
fn round_trip_tolerance(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 4e-4,
        GgmlType::BF16 => 3e-3,
        GgmlType::Q8_0 | GgmlType::Q8_1 => 9e-3,
        GgmlType::Q8_K => 0.012,
        GgmlType::Q6_K => 0.03,
        GgmlType::Q5_K => 0.055,
        GgmlType::Q5_0 | GgmlType::Q5_1 => 0.065,
        GgmlType::Q4_K => 0.11,
        GgmlType::Q4_1 => 0.12,
        GgmlType::Q4_0 => 0.14,
        // A power-of-two scale per 32 and eight magnitudes.
        GgmlType::Mxfp4 => 0.15,
        GgmlType::Q2_K | GgmlType::Q3_K => f64::NAN,
        // One scale per row: measured on rows without scale steps (see below).
        GgmlType::Int8 => 0.012,
        GgmlType::Int4G32 => 0.12,
        GgmlType::Int4G64 => 0.14,
        GgmlType::Int4G128 => 0.16,
        GgmlType::Int4G32Sym => 0.14,
        GgmlType::Int4G64Sym => 0.16,
        GgmlType::Int4G128Sym => 0.18,
        GgmlType::Nf4 | GgmlType::Nf4Dq => 0.12,
    }
}

/// Every type, GGUF and Pagoda-internal.
fn all_types() -> Vec<GgmlType> {
    GgmlType::ALL
        .into_iter()
        .chain(GgmlType::INTERNAL)
        .collect()
}

const QUANTIZABLE: [GgmlType; 23] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::Mxfp4,
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

fn gaussian(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            // Box-Muller: a normal sample from two uniforms.
            let u1: f64 = rng.gen_range(1e-12..1.0);
            let u2: f64 = rng.gen();
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

fn rel_rms(a: &[f32], b: &[f32]) -> f64 {
    let err: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    let norm: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    (err / norm.max(1e-300)).sqrt()
}

#[test]
fn quantize_round_trip_stays_within_named_tolerances() {
    let mut rng = StdRng::seed_from_u64(7);
    let n = 4096;
    for ty in QUANTIZABLE {
        let mut x = gaussian(&mut rng, n);
        // Blocks at different scales, as real weight rows have. Not 3000x apart for INT8,
        // whose one scale per row is the point, nor for NF4_DQ, whose linear int8 absmax
        // grid (step `max |absmax - mean| / 127`) cannot hold absmaxes far below the row's.
        let steps = match ty {
            GgmlType::Int8 => [1.0, 1.0, 1.0],
            GgmlType::Nf4Dq => [0.5, 1.0, 2.0],
            _ => [0.01, 1.0, 30.0],
        };
        for (i, v) in x.iter_mut().enumerate() {
            *v *= steps[(i / 256) % 3];
        }
        let mut q = vec![0u8; ty.row_bytes(n).unwrap()];
        quantize_row(ty, &x, &mut q).unwrap();
        let mut y = vec![0.0f32; n];
        dequantize_row(ty, &q, &mut y).unwrap();
        // Per 256-value group, so the large blocks do not hide the small ones.
        let mut worst = 0.0f64;
        for (g, (xs, ys)) in x.chunks(256).zip(y.chunks(256)).enumerate() {
            let e = rel_rms(xs, ys);
            worst = worst.max(e);
            let tol = round_trip_tolerance(ty);
            assert!(
                e <= tol,
                "{ty}: group {g} relative RMS error {e:.5} > {tol}"
            );
        }
        eprintln!("{ty}: worst relative RMS round-trip error {worst:.5}");
    }
    // Zeros quantize to zeros everywhere.
    for ty in QUANTIZABLE {
        let x = vec![0.0f32; 512];
        let mut q = vec![0u8; ty.row_bytes(512).unwrap()];
        quantize_row(ty, &x, &mut q).unwrap();
        let mut y = vec![1.0f32; 512];
        dequantize_row(ty, &q, &mut y).unwrap();
        assert!(y.iter().all(|v| *v == 0.0), "{ty}: zeros did not survive");
    }
}

#[test]
fn q2_k_and_q3_k_have_no_quantizer_and_say_so() {
    for ty in [GgmlType::Q2_K, GgmlType::Q3_K] {
        let x = vec![0.5f32; 256];
        let mut q = vec![0u8; ty.type_size()];
        assert_eq!(
            quantize_row(ty, &x, &mut q),
            Err(KernelError::Unsupported(ty))
        );
    }
}

/// Weight types matmul supports.
const MATMUL_TYPES: [GgmlType; 23] = [
    GgmlType::Mxfp4,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
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

/// Allowed |matmul - f32 reference| as a fraction of |w_r|·|x_t|: the error of quantizing
/// the activations to 8 bits (float weights use f32 activations and only round).
fn matmul_tolerance(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q2_K | GgmlType::Q3_K => 1e-5,
        // NF4's integer kernels also round the codebook to int8 (`nf4::I8_CODEBOOK_MAX_ERR`).
        GgmlType::Nf4 | GgmlType::Nf4Dq => 1.2e-2,
        _ => 8e-3,
    }
}
/// Allowed |SIMD - scalar| as a fraction of |w_r|·|x_t|: only the summation order differs.
const SIMD_VS_SCALAR_TOLERANCE: f64 = 2e-5;

/// A random weight matrix of `ty`: quantized from Gaussian rows where a quantizer exists,
/// else random blocks with moderate scales.
fn random_weights(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let mut data = vec![0u8; rows * rb];
    for r in 0..rows {
        let row = &mut data[r * rb..(r + 1) * rb];
        match ty {
            GgmlType::Q2_K | GgmlType::Q3_K => {
                rng.fill(row);
                let off = if ty == GgmlType::Q2_K {
                    [80, 82]
                } else {
                    [108, 108]
                };
                for blk in row.chunks_mut(ty.type_size()) {
                    for o in off {
                        let d = half::f16::from_f32(rng.gen_range(0.001..0.1));
                        blk[o..o + 2].copy_from_slice(&d.to_bits().to_le_bytes());
                    }
                }
            }
            _ => quantize_row(ty, &gaussian(rng, cols), row).unwrap(),
        }
    }
    data
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt()
}

#[test]
fn matmul_matches_f32_reference_on_every_isa() {
    let isas = available_isas();
    eprintln!("testing ISA paths {isas:?} (best {:?})", best_isa());
    let mut rng = StdRng::seed_from_u64(11);
    for ty in MATMUL_TYPES {
        let k = ty.block_size().max(32);
        // (rows, cols, n): single rows, rows that are not a multiple of any tile, prefill.
        let shapes = [
            (1, k, 1),
            (37, 3 * k, 3),
            (70, 2 * k.max(256), 17),
            (9, 4 * k, 1),
            // Long enough rows for prefill to split them into column segments.
            (5, 9 * 256, 10),
        ];
        for (rows, cols, n) in shapes {
            let data = random_weights(&mut rng, ty, rows, cols);
            // Odd address: weights straight from an mmap need not be aligned.
            let mut shifted = vec![0u8; data.len() + 3];
            shifted[3..].copy_from_slice(&data);
            let w = WeightMatrix::new(ty, rows, cols, &shifted[3..]).unwrap();
            let x = gaussian(&mut rng, n * cols);
            let mut wf = vec![0.0f32; rows * cols];
            for r in 0..rows {
                w.dequantize_row(r, &mut wf[r * cols..(r + 1) * cols])
                    .unwrap();
            }
            let mut scalar = vec![0.0f32; n * rows];
            for &isa in &isas {
                let mut out = vec![f32::NAN; n * rows];
                matmul_with_isa(isa, &w, &x, n, &mut out).unwrap();
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    for r in 0..rows {
                        let wr = &wf[r * cols..(r + 1) * cols];
                        let reference: f64 =
                            wr.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let scale = norm(wr) * norm(xt) + 1e-30;
                        let got = out[t * rows + r] as f64;
                        let err = (got - reference).abs() / scale;
                        assert!(
                            err <= matmul_tolerance(ty),
                            "{ty} {isa} {rows}x{cols} n={n} out[{t},{r}] = {got}, reference {reference} (rel {err:.2e})"
                        );
                        if isa == Isa::Scalar {
                            scalar[t * rows + r] = out[t * rows + r];
                        } else {
                            let d = (got - scalar[t * rows + r] as f64).abs() / scale;
                            assert!(
                                d <= SIMD_VS_SCALAR_TOLERANCE,
                                "{ty} {isa} {rows}x{cols} n={n} out[{t},{r}] = {got}, scalar {} (rel {d:.2e})",
                                scalar[t * rows + r]
                            );
                        }
                    }
                }
            }
            let mut best = vec![0.0f32; n * rows];
            matmul(&w, &x, n, &mut best).unwrap();
            assert!(
                best.iter().all(|v| v.is_finite()),
                "{ty}: non-finite output"
            );
        }
    }
}

#[test]
fn matmul_rejects_bad_shapes_with_errors() {
    let data = vec![0u8; 4 * GgmlType::Q4_0.row_bytes(64).unwrap()];
    assert!(matches!(
        WeightMatrix::new(GgmlType::Q4_0, 4, 64, &data[1..]),
        Err(KernelError::WrongByteLength { .. })
    ));
    assert!(matches!(
        WeightMatrix::new(GgmlType::Q4_0, 4, 63, &data),
        Err(KernelError::PartialBlock { .. })
    ));
    assert!(matches!(
        WeightMatrix::new(GgmlType::Q4_0, usize::MAX, 64, &data),
        Err(KernelError::SizeOverflow { .. })
    ));
    let w = WeightMatrix::new(GgmlType::Q4_0, 4, 64, &data).unwrap();
    assert_eq!(w.row_bytes(), 36);
    let mut out = vec![0.0; 8];
    assert!(matches!(
        matmul(&w, &[0.0; 127], 2, &mut out),
        Err(KernelError::Shape(_))
    ));
    assert!(matches!(
        matmul(&w, &[0.0; 128], 2, &mut out[..7]),
        Err(KernelError::Shape(_))
    ));
    assert!(matmul(&w, &[0.0; 128], 2, &mut out).is_ok());
    let mut row = vec![0.0; 64];
    assert!(w.dequantize_row(4, &mut row).is_err());
    assert!(w.dequantize_row(0, &mut row[..63]).is_err());
    // A hand-built matrix whose fields lie is caught too.
    let bad = WeightMatrix {
        ty: GgmlType::Q4_0,
        rows: 5,
        cols: 64,
        data: &data,
        layout: pagoda_kernels::WeightLayout::Rows,
    };
    assert!(matches!(
        matmul(&bad, &[0.0; 64], 1, &mut [0.0; 5]),
        Err(KernelError::WrongByteLength { .. })
    ));
    for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
        let r = matmul_with_isa(isa, &w, &[0.0; 64], 1, &mut [0.0; 4]);
        assert_eq!(r.is_ok(), isa.is_available(), "{isa}");
    }
    // n = 0 is an empty product, not an error.
    assert!(matmul(&w, &[], 0, &mut []).is_ok());
}

#[test]
fn regression_zero_weights_and_zero_activations_give_zero() {
    for ty in MATMUL_TYPES {
        let cols = ty.block_size().max(32) * 2;
        let mut data = vec![0u8; 3 * ty.row_bytes(cols).unwrap()];
        if ty.is_quantized() && ty != GgmlType::Q2_K && ty != GgmlType::Q3_K {
            for r in 0..3 {
                let rb = ty.row_bytes(cols).unwrap();
                quantize_row(ty, &vec![0.0; cols], &mut data[r * rb..(r + 1) * rb]).unwrap();
            }
        }
        let w = WeightMatrix::new(ty, 3, cols, &data).unwrap();
        for isa in available_isas() {
            let mut out = vec![f32::NAN; 6];
            matmul_with_isa(isa, &w, &vec![0.0; 2 * cols], 2, &mut out).unwrap();
            assert!(out.iter().all(|v| *v == 0.0), "{ty} {isa}: {out:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn dequantize_never_panics_and_checks_lengths(
        ty_idx in 0usize..GgmlType::ALL.len() + GgmlType::INTERNAL.len(),
        elements in 0usize..1200,
        extra in -3isize..3,
        seed in any::<u64>(),
    ) {
        let ty = all_types()[ty_idx];
        let mut rng = StdRng::seed_from_u64(seed);
        let mut dst = vec![0.0f32; elements];
        match ty.row_bytes(elements) {
            Ok(rb) => {
                let len = (rb as isize + extra).max(0) as usize;
                let mut src = vec![0u8; len];
                rng.fill(&mut src[..]);
                let r = dequantize_row(ty, &src, &mut dst);
                prop_assert_eq!(r.is_ok(), len == rb);
                if len != rb {
                    let is_wrong_length = matches!(r, Err(KernelError::WrongByteLength { .. }));
                    prop_assert!(is_wrong_length);
                }
            }
            Err(e) => {
                let is_partial = matches!(e, KernelError::PartialBlock { .. });
                prop_assert!(is_partial);
                prop_assert!(dequantize_row(ty, &[0u8; 64], &mut dst).is_err());
            }
        }
    }

    #[test]
    fn quantize_round_trips_any_whole_row(
        ty_idx in 0usize..QUANTIZABLE.len(),
        blocks in 0usize..5,
        scale in -6i32..8,
        seed in any::<u64>(),
        extra in -2isize..2,
    ) {
        let ty = QUANTIZABLE[ty_idx];
        let n = blocks * ty.block_size().max(32);
        let mut rng = StdRng::seed_from_u64(seed);
        let x: Vec<f32> = gaussian(&mut rng, n).iter().map(|v| v * 2f32.powi(scale)).collect();
        let rb = ty.row_bytes(n).unwrap();
        let len = (rb as isize + extra).max(0) as usize;
        let mut q = vec![0u8; len];
        let r = quantize_row(ty, &x, &mut q);
        prop_assert_eq!(r.is_ok(), len == rb);
        if len == rb {
            let mut y = vec![0.0f32; n];
            dequantize_row(ty, &q, &mut y).unwrap();
            for (xs, ys) in x.chunks(256).zip(y.chunks(256)) {
                prop_assert!(rel_rms(xs, ys) <= round_trip_tolerance(ty) * 1.5);
            }
        }
        // A row that is not whole blocks is an error, never a panic.
        if ty.block_size() > 1 {
            let mut q = vec![0u8; 1024];
            prop_assert!(quantize_row(ty, &x[..n.saturating_sub(1)], &mut q).is_err() || n == 0);
        }
    }
}

/// The Q4_K / Q6_K strip GEMMs' edge tiles: rows not a multiple of 8 (partial strips) and every
/// token count 2..=17 (partial token passes), against the scalar path.
#[test]
fn k_quant_prefill_edge_tiles_match_scalar() {
    let mut rng = StdRng::seed_from_u64(29);
    for (ty, rows, cols) in [GgmlType::Q4_K, GgmlType::Q6_K]
        .into_iter()
        .flat_map(|ty| [(ty, 1, 256), (ty, 8, 512), (ty, 13, 768), (ty, 21, 256)])
    {
        let data = random_weights(&mut rng, ty, rows, cols);
        let w = WeightMatrix::new(ty, rows, cols, &data).unwrap();
        for n in 2..=17 {
            let x = gaussian(&mut rng, n * cols);
            let mut scalar = vec![0.0f32; n * rows];
            matmul_with_isa(Isa::Scalar, &w, &x, n, &mut scalar).unwrap();
            for isa in available_isas() {
                let mut out = vec![f32::NAN; n * rows];
                matmul_with_isa(isa, &w, &x, n, &mut out).unwrap();
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    for r in 0..rows {
                        let mut wr = vec![0.0f32; cols];
                        w.dequantize_row(r, &mut wr).unwrap();
                        let scale = norm(&wr) * norm(xt) + 1e-30;
                        let (got, want) = (out[t * rows + r], scalar[t * rows + r]);
                        let d = (got as f64 - want as f64).abs() / scale;
                        assert!(
                            d <= SIMD_VS_SCALAR_TOLERANCE,
                            "{ty} {isa} {rows}x{cols} n={n} out[{t},{r}] = {got}, scalar {want}"
                        );
                    }
                }
            }
        }
    }
}

/// `tests/golden/mxfp4_blocks.json` (scripts/reference/golden_families.py `mxfp4-blocks`,
/// gguf-py's MXFP4): single blocks at the edges of the format — every code, the subnormal
/// exponents 0 and 1, 254, ties, saturation, an amax one ulp below a power of two (whose
/// float `log2` rounds up) — dequantized and quantized bit for bit, and the HF checkpoint
/// layout of each block converted to ggml's.
#[test]
fn mxfp4_edge_blocks_match_gguf_py_and_the_hf_layout() {
    use pagoda_kernels::quant::mxfp4::from_hf_block;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/golden/mxfp4_blocks.json"
    );
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("mxfp4_blocks.json")).expect("json");
    let hex = |c: &serde_json::Value| -> Vec<u8> {
        let s = c.as_str().expect("hex string");
        (0..s.len() / 2)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
            .collect()
    };
    let floats = |c: &serde_json::Value| -> Vec<f32> {
        serde_json::from_value::<Vec<f64>>(c.clone())
            .expect("values")
            .into_iter()
            .map(|x| x as f32)
            .collect()
    };
    let hf_to_ggml = |case: &serde_json::Value| {
        let hf: [u8; 16] = hex(&case["hf_blocks_hex"]).try_into().expect("16 bytes");
        let b = from_hf_block(case["scale"].as_u64().expect("scale") as u8, &hf);
        let mut bytes = vec![b.e];
        bytes.extend_from_slice(&b.qs);
        bytes
    };
    let dequant = v["dequant"].as_array().expect("dequant cases");
    assert!(dequant.len() >= 8);
    for case in dequant {
        let name = &case["name"];
        let block = hex(&case["block_hex"]);
        let want = floats(&case["values"]);
        let mut got = vec![f32::NAN; 32];
        dequantize_row(GgmlType::Mxfp4, &block, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // Code 8 is -0: ggml's integer codebook gives +0, and so does Pagoda.
            assert!(g == w, "{name} element {i}: {g} vs gguf-py {w}");
        }
        assert_eq!(hf_to_ggml(case), block, "{name}: HF layout");
    }
    let quant = v["quant"].as_array().expect("quant cases");
    assert!(quant.len() >= 8);
    for case in quant {
        let name = &case["name"];
        let x = floats(&case["values"]);
        let mut got = vec![0u8; 17];
        quantize_row(GgmlType::Mxfp4, &x, &mut got).unwrap();
        assert_eq!(got, hex(&case["block_hex"]), "{name}: quantized block");
        assert_eq!(hf_to_ggml(case), got, "{name}: HF layout");
    }
}
