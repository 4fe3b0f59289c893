//! The row operations of a BERT encoder that pagoda-kernels does not have: LayerNorm with
//! bias, exact (erf) GELU, and the sentence pooling (mean over tokens or the [CLS] row, then
//! optional L2 normalisation, as sentence-transformers' `Pooling` and `Normalize` modules).
//!
//! Invariants: functions take shapes from slice lengths and panic (a programming error) when
//! they disagree; sums are accumulated in f64, so results are within f32 rounding of the
//! PyTorch reference; `normalize` leaves a zero vector zero (divides by `max(norm, 1e-12)`, as
//! `torch.nn.functional.normalize`).

/// `x = (x - mean) / sqrt(var + eps) * weight + bias` for every row of `x` (`[n, dim]`,
/// `dim = weight.len()`), with the biased variance as `torch.nn.LayerNorm`.
pub fn layer_norm_inplace(x: &mut [f32], weight: &[f32], bias: &[f32], eps: f32) {
    let dim = weight.len();
    assert_eq!(bias.len(), dim);
    assert!(dim > 0 && x.len() % dim == 0);
    for row in x.chunks_exact_mut(dim) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
        let var = row
            .iter()
            .map(|&v| {
                let d = v as f64 - mean;
                d * d
            })
            .sum::<f64>()
            / dim as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for ((v, &w), &b) in row.iter_mut().zip(weight).zip(bias) {
            *v = ((*v as f64 - mean) * inv) as f32 * w + b;
        }
    }
}

/// `erfc(z)` with a fractional error below 1.2e-7 everywhere (Chebyshev fit, Numerical
/// Recipes' `erfcc`).
fn erfc(z: f64) -> f64 {
    let a = z.abs();
    let t = 1.0 / (1.0 + 0.5 * a);
    let poly = -a * a - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if z >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// `x = x * Φ(x) = 0.5 x erfc(-x / √2)` (the exact GELU of BERT's `hidden_act = "gelu"`).
pub fn gelu_erf_inplace(x: &mut [f32]) {
    for v in x.iter_mut() {
        let f = *v as f64;
        *v = (0.5 * f * erfc(-f * std::f64::consts::FRAC_1_SQRT_2)) as f32;
    }
}

/// Mean of the rows of `tokens` (`[n, dim]`, `n >= 1`) into `out` (`dim`).
pub fn mean_pool(tokens: &[f32], out: &mut [f32]) {
    let dim = out.len();
    assert!(dim > 0 && tokens.len() % dim == 0 && !tokens.is_empty());
    let n = tokens.len() / dim;
    let mut acc = vec![0f64; dim];
    for row in tokens.chunks_exact(dim) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += v as f64;
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = (a / n as f64) as f32;
    }
}

/// `x = x / max(|x|₂, 1e-12)`.
pub fn normalize_inplace(x: &mut [f32]) {
    let norm = x
        .iter()
        .map(|&v| (v as f64) * (v as f64))
        .sum::<f64>()
        .sqrt();
    let inv = 1.0 / norm.max(1e-12);
    for v in x.iter_mut() {
        *v = (*v as f64 * inv) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_matches_known_values() {
        // x * Φ(x) from Python's math.erfc.
        let cases = [
            (0.0f32, 0.0f64),
            (1.0, 0.8413447460685429),
            (-1.0, -0.15865525393145707),
            (3.0, 2.99595030590511),
            (-3.0, -0.004049694094890287),
            (0.5, 0.34573123063700656),
            (-6.0, -5.919525870226207e-09),
        ];
        for (x, want) in cases {
            let mut v = [x];
            gelu_erf_inplace(&mut v);
            let tol = 4e-7 * want.abs().max(1e-3);
            assert!(
                (v[0] as f64 - want).abs() <= tol,
                "gelu({x}) = {} want {want}",
                v[0]
            );
        }
    }

    #[test]
    fn layer_norm_pool_normalize() {
        let mut x = vec![1.0f32, 2.0, 3.0, 4.0, -1.0, -1.0, -1.0, -1.0];
        layer_norm_inplace(&mut x, &[1.0; 4], &[0.5; 4], 1e-12);
        let s = (1.25f64).sqrt();
        for (got, want) in x[..4].iter().zip([-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s]) {
            assert!((*got as f64 - 0.5 - want).abs() < 1e-6, "{got} {want}");
        }
        assert!(x[4..].iter().all(|&v| v == 0.5));
        let mut out = [0.0f32; 2];
        mean_pool(&[1.0, 2.0, 3.0, 6.0], &mut out);
        assert_eq!(out, [2.0, 4.0]);
        let mut v = [3.0f32, 4.0];
        normalize_inplace(&mut v);
        assert!((v[0] - 0.6).abs() < 1e-7 && (v[1] - 0.8).abs() < 1e-7);
        let mut z = [0.0f32; 3];
        normalize_inplace(&mut z);
        assert_eq!(z, [0.0; 3]);
    }
}
