//! AWQ (Lin et al., 2023), activation-aware weight quantization: before round-to-nearest,
//! scale each input channel `c` of a linear layer by `s_c = mean|x_c|^α` (normalised so
//! that `sqrt(max s · min s) = 1`), so the weights that meet large activations get a finer
//! share of the grid; the layer then computes `(x / s) · (W · diag s)ᵀ`, the `1 / s` folded
//! into whatever produces `x` (the preceding norm's weight, or the previous linear layer).
//!
//! `α` is searched on a grid in `[0, 1]` by the layer's output error on the calibration data
//! (measured through the inputs' [`Hessian`]: `Σ_r (w_r - ŵ_r)ᵀ H (w_r - ŵ_r)`, with `ŵ =
//! dequant(Q(W · diag s)) / s`). `α = 0` is plain RTN, so the result is never worse than RTN
//! on the calibration data.
//!
//! Invariant: `scales.len() == cols`, every scale finite and positive; `quantized` holds
//! `W · diag(scales)`, not `W`.

use super::gptq::Hessian;
#[cfg(test)]
use super::grid::GridKind;
use super::grid::{check_shape, rtn, GroupQuantized, GroupSpec};
use crate::CompressError;

/// The chosen per-channel scales and the quantized scaled weights.
#[derive(Debug, Clone)]
pub struct AwqResult {
    /// `[cols]`: multiply the weights' input channels by these, divide the inputs by them.
    pub scales: Vec<f32>,
    pub alpha: f32,
    /// `W · diag(scales)`, quantized.
    pub quantized: GroupQuantized,
    /// Output error of the choice, and of plain RTN (`α = 0`), on the calibration data.
    pub error: f64,
    pub rtn_error: f64,
}

impl AwqResult {
    /// The effective weights `dequant(Q(W · diag s)) / s`, `[rows, cols]`.
    pub fn effective_weights(&self) -> Vec<f32> {
        let cols = self.scales.len();
        let mut w = self.quantized.dequantize();
        for row in w.chunks_exact_mut(cols) {
            for (v, s) in row.iter_mut().zip(&self.scales) {
                *v /= s;
            }
        }
        w
    }
}

/// Searches `α` over `grid_points + 1` values in `[0, 1]` for `w: [rows, cols]`, given the
/// calibration inputs' per-channel mean absolute value and their Hessian.
pub fn awq_search(
    w: &[f32],
    rows: usize,
    cols: usize,
    act_absmean: &[f32],
    hessian: &Hessian,
    spec: GroupSpec,
    grid_points: usize,
) -> Result<AwqResult, CompressError> {
    spec.validate(cols)?;
    check_shape(w, rows, cols)?;
    if act_absmean.len() != cols || hessian.cols != cols {
        return Err(CompressError::InvalidInput(format!(
            "activation statistics of {} channels and a Hessian of {} for a matrix of {cols} \
             columns",
            act_absmean.len(),
            hessian.cols
        )));
    }
    if hessian.samples == 0 {
        return Err(CompressError::InvalidInput(
            "AWQ needs calibration data: no activations were recorded".into(),
        ));
    }
    let grid_points = grid_points.max(1);
    let mut best: Option<AwqResult> = None;
    let mut rtn_error = f64::NAN;
    for k in 0..=grid_points {
        let alpha = k as f32 / grid_points as f32;
        let scales = channel_scales(act_absmean, alpha);
        let mut scaled = w.to_vec();
        for row in scaled.chunks_exact_mut(cols) {
            for (v, s) in row.iter_mut().zip(&scales) {
                *v *= s;
            }
        }
        let quantized = rtn(&scaled, rows, cols, spec)?;
        let candidate = AwqResult {
            scales,
            alpha,
            quantized,
            error: 0.0,
            rtn_error: 0.0,
        };
        let error = hessian.output_error(w, &candidate.effective_weights());
        if k == 0 {
            rtn_error = error;
        }
        if best.as_ref().is_none_or(|b| error < b.error) {
            best = Some(AwqResult { error, ..candidate });
        }
    }
    let mut best = best.ok_or_else(|| CompressError::InvalidInput("empty AWQ grid".into()))?;
    best.rtn_error = rtn_error;
    Ok(best)
}

/// `mean|x|^α`, normalised to a geometric mid-range of 1; channels that never fired get the
/// smallest positive scale rather than 0.
fn channel_scales(act_absmean: &[f32], alpha: f32) -> Vec<f32> {
    let mut s: Vec<f32> = act_absmean
        .iter()
        .map(|&a| a.max(1e-4).powf(alpha))
        .collect();
    let (lo, hi) = s.iter().fold((f32::INFINITY, 0.0f32), |(lo, hi), &v| {
        (lo.min(v), hi.max(v))
    });
    let mid = (lo * hi).sqrt();
    if mid.is_finite() && mid > 0.0 {
        for v in &mut s {
            *v /= mid;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    /// Activations with a few salient (large) channels, as LLM activations have.
    fn problem(rows: usize, cols: usize, n: usize) -> (Vec<f32>, Vec<f32>, Hessian) {
        let mut g = Lcg(11);
        let w: Vec<f32> = (0..rows * cols).map(|_| g.next()).collect();
        let x: Vec<f32> = (0..n * cols)
            .map(|i| {
                let c = i % cols;
                g.next() * if c % 16 == 5 { 20.0 } else { 1.0 }
            })
            .collect();
        let mut absmean = vec![0.0f32; cols];
        for row in x.chunks_exact(cols) {
            for (m, v) in absmean.iter_mut().zip(row) {
                *m += v.abs() / n as f32;
            }
        }
        let mut h = Hessian::new(cols);
        h.add(&x).unwrap();
        (w, absmean, h)
    }

    #[test]
    fn awq_beats_rtn_when_some_channels_dominate() {
        let (rows, cols) = (16, 128);
        let (w, m, h) = problem(rows, cols, 128);
        let spec = GroupSpec {
            bits: 4,
            group_size: Some(32),
            symmetric: false,
            grid: GridKind::IntegerZero,
            clip_search: false,
        };
        let r = awq_search(&w, rows, cols, &m, &h, spec, 20).unwrap();
        let plain = rtn(&w, rows, cols, spec).unwrap();
        let plain_err = h.output_error(&w, &plain.dequantize());
        assert!((r.rtn_error - plain_err).abs() <= 1e-9 * plain_err.max(1.0));
        assert!(r.alpha > 0.0, "the search kept plain RTN");
        assert!(r.error < plain_err, "AWQ {} >= RTN {plain_err}", r.error);
        assert!(r.scales.iter().all(|s| s.is_finite() && *s > 0.0));
    }

    #[test]
    fn scales_are_normalised_and_alpha_zero_is_identity() {
        let s = channel_scales(&[0.5, 2.0, 8.0, 0.0], 0.0);
        assert!(s.iter().all(|&v| (v - 1.0).abs() < 1e-6));
        let s = channel_scales(&[1.0, 4.0], 1.0);
        assert!(((s[0] * s[1]).sqrt() - 1.0).abs() < 1e-6);
        assert!((s[1] / s[0] - 4.0).abs() < 1e-5);
    }

    #[test]
    fn mismatched_statistics_are_an_error() {
        let (w, m, h) = problem(2, 32, 8);
        let spec = GroupSpec {
            bits: 4,
            group_size: None,
            symmetric: false,
            grid: GridKind::IntegerZero,
            clip_search: false,
        };
        assert!(awq_search(&w, 2, 32, &m[..31], &h, spec, 4).is_err());
        let empty = Hessian::new(32);
        let e = awq_search(&w, 2, 32, &m, &empty, spec, 4).unwrap_err();
        assert!(e.to_string().contains("calibration"), "{e}");
    }
}
