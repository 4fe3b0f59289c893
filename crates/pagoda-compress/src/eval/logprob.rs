//! Log-probabilities of target tokens from rows of logits, in f64.
//!
//! The model's logits are f32; the log-softmax is taken in f64 (max-shifted log-sum-exp) so
//! that summing thousands of log-probabilities loses nothing to rounding. Invariant: a
//! non-finite logit in a row is an error, never a NaN perplexity.

use crate::CompressError;

/// `log softmax(row)[target]`, computed in f64. `position` (the scored token's index, for the
/// error) is reported if the row holds a NaN or an infinity.
///
/// Panics if `target >= row.len()` (the caller checked tokens against the vocabulary).
pub fn log_prob(row: &[f32], target: u32, position: usize) -> Result<f64, CompressError> {
    let mut max = f64::NEG_INFINITY;
    for &x in row {
        if !x.is_finite() {
            return Err(CompressError::NonFiniteLogits { position });
        }
        max = max.max(f64::from(x));
    }
    let sum: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
    Ok(f64::from(row[target as usize]) - max - sum.ln())
}

/// Index of the largest value, the first one on ties (NumPy's `argmax`, as lm-eval uses it).
/// `None` for an empty slice.
pub fn argmax_first(values: &[f64]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &v) in values.iter().enumerate() {
        match best {
            Some(b) if values[b] >= v => {}
            _ => best = Some(i),
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_prob_matches_the_definition() {
        let row = [1.0f32, 2.0, 3.0];
        let z: f64 = row.iter().map(|&x| f64::from(x).exp()).sum();
        for t in 0..3 {
            let want = f64::from(row[t]) - z.ln();
            assert!((log_prob(&row, t as u32, 0).unwrap() - want).abs() < 1e-12);
        }
    }

    #[test]
    fn log_prob_is_stable_for_large_logits() {
        let row = [1000.0f32, 1000.0];
        let lp = log_prob(&row, 1, 0).unwrap();
        assert!((lp - (0.5f64).ln()).abs() < 1e-12);
    }

    #[test]
    fn non_finite_logits_are_an_error() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let e = log_prob(&[0.0, bad], 0, 7).unwrap_err();
            assert!(matches!(e, CompressError::NonFiniteLogits { position: 7 }));
        }
    }

    #[test]
    fn argmax_takes_the_first_of_ties() {
        assert_eq!(argmax_first(&[]), None);
        assert_eq!(argmax_first(&[-3.0, -1.0, -1.0, -2.0]), Some(1));
        assert_eq!(argmax_first(&[5.0]), Some(0));
    }
}
