//! Round-trip error of every target type on random weight-like matrices, against bounds
//! derived from each format, and the identity of quantizing to the type a tensor has.
//!
//! Notation: `A` is the largest |x| of the block the format scales by (32 values for the
//! legacy types, the 256-value super-block for K-quants), `R` its max − min, `u = 2^-11` the
//! relative rounding of an f16-stored scale or minimum.
//!
//! - Q8_0: `d = A/127`, codes round to nearest: `|err| <= d/2`, and the f16 scale moves a
//!   code of at most 127 by `127·d·u`: bound `A/127·(1/2 + 127u)`.
//! - Q4_0 / Q5_0: `d = A/8` (`A/16`); the extreme maps exactly, the other sign clamps at
//!   7 (15) codes, so one full step: bound `A/8·(1 + 8u)` (`A/16·(1 + 16u)`).
//! - Q4_1 / Q5_1: `d = R/15` (`R/31`) above the minimum: bound `R/15·(1/2 + 15u) + A·u`.
//! - K-quants (loose): one full step of the sub-block grid (the scale search may clip one
//!   code), plus the rounding of the 6-bit (Q6_K: 8-bit) sub-block scale times the largest
//!   code, plus half a step of the 6-bit minimum: Q4_K `0.16·A`, Q5_K `0.09·A`, Q6_K
//!   `0.04·A`.
//! - F16 / BF16: `|x|·2^-11` / `|x|·2^-8`, plus the f16 subnormal spacing; F32 is exact.
//! - INT8 (per channel): `A` is the row's largest |x|, `d = A/127` in f32: `A/127·(1/2 + u)`.
//! - INT4 asymmetric (any group): as Q4_1 over the group; symmetric: as Q4_0 over the group
//!   (codes come from the stored f16 scale, so the extreme still maps within a step).
//! - NF4: half the widest codebook gap (`(1 - 0.6962)/2 = 0.152`) times the f32 absmax.
//! - NF4_DQ: NF4's bound on the double-quantized absmax, plus how far that absmax moved
//!   (half a step of the row's int8 absmax grid, at most `A_row/254`) where values clip.
//!
//! The RMS error is checked too, against what rounding to a grid predicts: errors spread
//! evenly over ±b for a half-step bound b (Q8_0, Q4_1, Q5_1, floats) have RMS b/√3 ≈ 0.58 b;
//! for the full-step bounds of Q4_0/Q5_0 (the clamp costs one step only at one end) the
//! spread is still half a step, RMS ≈ b/(2√3) ≈ 0.29 b. K-quant bounds are loose sums, so
//! their RMS only has to stay under half of it. Each limit is the prediction plus 10%
//! (measured ratios are printed with `--nocapture`).

use crate::common::{f32_tensor, typed_tensor, weight_like, weights};
use pagoda_compress::quantize::{quantize_weights, QuantOptions, QuantTarget, TARGETS};
use pagoda_kernels::GgmlType;

const U: f32 = 1.0 / 2048.0;

/// The worst-case |error| of `ty` for a block with largest magnitude `a`, range `r`, in a
/// row with largest magnitude `row_a`.
fn bound(ty: GgmlType, a: f32, r: f32, row_a: f32) -> f32 {
    match ty {
        GgmlType::Int8 => row_a / 127.0 * (0.5 + U),
        GgmlType::Int4G32 | GgmlType::Int4G64 | GgmlType::Int4G128 => {
            r / 15.0 * (0.5 + 15.0 * U) + a * U
        }
        GgmlType::Int4G32Sym | GgmlType::Int4G64Sym | GgmlType::Int4G128Sym => {
            a / 8.0 * (1.0 + 8.0 * U)
        }
        GgmlType::Nf4 => 0.1520 * a * (1.0 + 1e-6),
        GgmlType::Nf4Dq => 0.1520 * (a + row_a / 254.0) + row_a / 254.0,
        GgmlType::Q8_0 => a / 127.0 * (0.5 + 127.0 * U),
        GgmlType::Q4_0 => a / 8.0 * (1.0 + 8.0 * U),
        GgmlType::Q5_0 => a / 16.0 * (1.0 + 16.0 * U),
        GgmlType::Q4_1 => r / 15.0 * (0.5 + 15.0 * U) + a * U,
        GgmlType::Q5_1 => r / 31.0 * (0.5 + 31.0 * U) + a * U,
        GgmlType::Q4_K => 0.16 * a,
        GgmlType::Q5_K => 0.09 * a,
        GgmlType::Q6_K => 0.04 * a,
        GgmlType::F16 => a * U + 6e-8,
        GgmlType::BF16 => a / 256.0,
        GgmlType::F32 => 0.0,
        other => panic!("no bound for {other}"),
    }
}

/// Max and RMS error of `ty` on `x` (rows of `cols`), as (max / bound, rms / rms-bound).
fn round_trip(ty: GgmlType, x: &[f32], rows: usize, cols: usize) -> (f32, f32) {
    let name = "blk.0.ffn_up.weight";
    let w = weights([f32_tensor(name, &[rows, cols], x)]);
    let target = QuantTarget::new(ty).unwrap();
    let (q, report) = quantize_weights(&w, target, &QuantOptions::default()).unwrap();
    let t = q.get(name).unwrap();
    assert_eq!(t.ty, ty, "no fallback expected for {cols} columns");
    // F32 to F32 is the one case with nothing to convert.
    assert_eq!(
        report.n_converted(),
        usize::from(ty != GgmlType::F32),
        "{ty}"
    );
    assert_eq!(report.bytes_after(), t.n_bytes() as u64);
    let y = t.to_f32().unwrap();
    // Per-element bounds are per block (elements of one block share a scale); floats bound
    // each element by its own magnitude.
    let block = if ty.is_quantized() {
        ty.block_size()
    } else {
        1
    };
    let (mut worst, mut sum_e2, mut sum_b2) = (0.0f32, 0.0f64, 0.0f64);
    for (i, (xb, yb)) in x.chunks(block).zip(y.chunks(block)).enumerate() {
        let a = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let lo = xb.iter().fold(f32::INFINITY, |m, &v| m.min(v));
        let hi = xb.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let row = i * block / cols;
        let row_a = x[row * cols..(row + 1) * cols]
            .iter()
            .fold(0.0f32, |m, v| m.max(v.abs()));
        let b = bound(ty, a, hi - lo, row_a);
        for (xv, yv) in xb.iter().zip(yb) {
            let e = (xv - yv).abs();
            // A tiny absolute slack for f32 arithmetic inside the quantizers.
            assert!(
                e <= b * 1.0001 + 1e-9,
                "{ty}: |{xv} - {yv}| = {e} > bound {b} (block max {a})"
            );
            worst = worst.max(if b > 0.0 { e / b } else { 0.0 });
            sum_e2 += (e as f64).powi(2);
            sum_b2 += (b as f64).powi(2);
        }
    }
    let rms_ratio = if sum_b2 > 0.0 {
        (sum_e2 / sum_b2).sqrt() as f32
    } else {
        0.0
    };
    (worst, rms_ratio)
}

/// The largest RMS error accepted, as a fraction of the RMS of the worst-case bounds.
fn rms_limit(ty: GgmlType) -> f32 {
    let half_step = 1.0 / 3f32.sqrt();
    1.1 * match ty {
        GgmlType::Q4_0
        | GgmlType::Q5_0
        | GgmlType::Int4G32Sym
        | GgmlType::Int4G64Sym
        | GgmlType::Int4G128Sym => half_step / 2.0,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => 0.5,
        _ => half_step,
    }
}

#[test]
fn every_target_stays_within_its_format_bound() {
    let (rows, cols) = (48, 512);
    let x = weight_like(rows, cols, 7);
    let measured: Vec<(GgmlType, f32)> = TARGETS
        .iter()
        .map(|&ty| {
            let (worst, rms) = round_trip(ty, &x, rows, cols);
            println!("{ty}: worst |err| / bound = {worst:.3}, RMS err / RMS bound = {rms:.3}");
            (ty, rms)
        })
        .collect();
    for (ty, rms) in measured {
        assert!(
            rms <= rms_limit(ty),
            "{ty}: RMS error is {rms} of the worst-case bound (limit {})",
            rms_limit(ty)
        );
    }
}

/// Relative RMS error of `ty` on `x`.
fn relative_rms(ty: GgmlType, x: &[f32], rows: usize, cols: usize) -> f64 {
    let w = weights([f32_tensor("blk.0.attn_q.weight", &[rows, cols], x)]);
    let (q, _) = quantize_weights(&w, QuantTarget::new(ty).unwrap(), &Default::default()).unwrap();
    let y = q.get("blk.0.attn_q.weight").unwrap().to_f32().unwrap();
    let e2: f64 = x
        .iter()
        .zip(&y)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let x2: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
    (e2 / x2).sqrt()
}

#[test]
fn more_bits_mean_less_error() {
    let (rows, cols) = (32, 256);
    let x = weight_like(rows, cols, 11);
    let err = |t| relative_rms(t, &x, rows, cols);
    let order = [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::BF16,
        GgmlType::F16,
        GgmlType::F32,
    ];
    for pair in order.windows(2) {
        assert!(err(pair[0]) > err(pair[1]), "{} vs {}", pair[0], pair[1]);
    }
    for pair in [
        [GgmlType::Q4_K, GgmlType::Q5_K],
        [GgmlType::Q5_K, GgmlType::Q6_K],
        [GgmlType::Q6_K, GgmlType::Q8_0],
        [GgmlType::Q4_0, GgmlType::Q4_K],
    ] {
        assert!(err(pair[0]) > err(pair[1]), "{} vs {}", pair[0], pair[1]);
    }
    assert_eq!(err(GgmlType::F32), 0.0);
    // Smaller groups, and a minimum, mean less error; NF4 beats plain symmetric INT4 of the
    // same group, and 8 bits beat 4.
    for pair in [
        [GgmlType::Int4G128, GgmlType::Int4G64],
        [GgmlType::Int4G64, GgmlType::Int4G32],
        [GgmlType::Int4G128Sym, GgmlType::Int4G64Sym],
        [GgmlType::Int4G64Sym, GgmlType::Int4G32Sym],
        [GgmlType::Int4G64Sym, GgmlType::Int4G64],
        [GgmlType::Int4G64Sym, GgmlType::Nf4],
        [GgmlType::Nf4, GgmlType::Int8],
        [GgmlType::Int4G32, GgmlType::Int8],
    ] {
        assert!(err(pair[0]) > err(pair[1]), "{} vs {}", pair[0], pair[1]);
    }
}

#[test]
fn quantizing_to_the_type_a_tensor_has_is_byte_identical() {
    let (rows, cols) = (8, 256);
    let x = weight_like(rows, cols, 3);
    for ty in TARGETS {
        let name = "blk.0.attn_k.weight";
        let original = typed_tensor(name, ty, &[rows, cols], &x);
        // Alone: nothing to do, the very same bytes come back.
        let w = weights([original.clone()]);
        let (q, report) =
            quantize_weights(&w, QuantTarget::new(ty).unwrap(), &Default::default()).unwrap();
        assert_eq!(report.n_converted(), 0, "{ty}");
        assert_eq!(q.get(name).unwrap().data(), original.data(), "{ty}");
        // Next to a tensor that is converted: kept tensors are copied, still byte for byte.
        let other = if ty == GgmlType::F32 {
            typed_tensor("blk.0.attn_q.weight", GgmlType::F16, &[rows, cols], &x)
        } else {
            f32_tensor("blk.0.attn_q.weight", &[rows, cols], &x)
        };
        let w = weights([original.clone(), other]);
        let (q, report) =
            quantize_weights(&w, QuantTarget::new(ty).unwrap(), &Default::default()).unwrap();
        assert_eq!(report.n_converted(), 1, "{ty}");
        let kept = q.get(name).unwrap();
        assert_eq!((kept.ty, kept.data()), (ty, original.data()), "{ty}");
        assert!(kept.is_owned());
    }
}

#[test]
fn gguf_types_are_dequantized_then_quantized() {
    // A Q4_1 matrix (as in SmolLM2's file) to Q8_0: the result is within Q8_0's bound of the
    // Q4_1 values it was made from (re-quantizing cannot recover what Q4_1 lost).
    let (rows, cols) = (16, 256);
    let x = weight_like(rows, cols, 5);
    let q41 = typed_tensor("blk.0.ffn_down.weight", GgmlType::Q4_1, &[rows, cols], &x);
    let from = q41.to_f32().unwrap();
    let (q, report) = quantize_weights(
        &weights([q41]),
        "q8_0".parse().unwrap(),
        &Default::default(),
    )
    .unwrap();
    assert_eq!(report.types_before()["Q4_1"], 1);
    assert_eq!(report.types_after()["Q8_0"], 1);
    let y = q.get("blk.0.ffn_down.weight").unwrap().to_f32().unwrap();
    for (fb, yb) in from.chunks(32).zip(y.chunks(32)) {
        let a = fb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (f, v) in fb.iter().zip(yb) {
            assert!((f - v).abs() <= bound(GgmlType::Q8_0, a, 0.0, a) * 1.0001 + 1e-9);
        }
    }
}
