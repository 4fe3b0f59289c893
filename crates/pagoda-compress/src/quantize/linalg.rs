//! The small dense linear algebra GPTQ needs, in f64 on row-major square matrices:
//! Cholesky factorisation, the inverse of a lower-triangular matrix, and the upper Cholesky
//! factor of a symmetric positive-definite matrix's inverse.
//!
//! Invariant: inputs are `n * n` row-major; a matrix that is not positive definite is an
//! error (GPTQ dampens its Hessian first so that it is), never a NaN in the output.

use crate::CompressError;

/// Lower `L` with `a = L Lᵀ`.
pub fn cholesky_lower(a: &[f64], n: usize) -> Result<Vec<f64>, CompressError> {
    debug_assert_eq!(a.len(), n * n);
    let mut l = vec![0.0f64; n * n];
    for j in 0..n {
        let row_j = j * n;
        let mut d = a[row_j + j];
        for k in 0..j {
            d -= l[row_j + k] * l[row_j + k];
        }
        if d.is_nan() || d <= 0.0 {
            return Err(CompressError::InvalidInput(format!(
                "the calibration Hessian is not positive definite at column {j}; \
                 raise the dampening (--damp) or give more calibration text"
            )));
        }
        let d = d.sqrt();
        l[row_j + j] = d;
        for i in j + 1..n {
            let row_i = i * n;
            let mut s = a[row_i + j];
            for k in 0..j {
                s -= l[row_i + k] * l[row_j + k];
            }
            l[row_i + j] = s / d;
        }
    }
    Ok(l)
}

/// The inverse of a lower-triangular `l` (also lower triangular).
pub fn invert_lower(l: &[f64], n: usize) -> Vec<f64> {
    let mut inv = vec![0.0f64; n * n];
    for j in 0..n {
        inv[j * n + j] = 1.0 / l[j * n + j];
        for i in j + 1..n {
            let mut s = 0.0;
            for k in j..i {
                s -= l[i * n + k] * inv[k * n + j];
            }
            inv[i * n + j] = s / l[i * n + i];
        }
    }
    inv
}

/// Upper `U` with `a⁻¹ = Uᵀ U`, for symmetric positive-definite `a`.
pub fn inverse_upper_cholesky(a: &[f64], n: usize) -> Result<Vec<f64>, CompressError> {
    let l = cholesky_lower(a, n)?;
    let li = invert_lower(&l, n);
    // a⁻¹ = L⁻ᵀ L⁻¹: entry (i, j) = sum_k li[k][i] * li[k][j], k >= max(i, j).
    let mut inv = vec![0.0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            let mut s = 0.0;
            for k in i..n {
                s += li[k * n + i] * li[k * n + j];
            }
            inv[i * n + j] = s;
            inv[j * n + i] = s;
        }
    }
    let l2 = cholesky_lower(&inv, n)?;
    let mut u = vec![0.0f64; n * n];
    for i in 0..n {
        for j in i..n {
            u[i * n + j] = l2[j * n + i];
        }
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spd(n: usize) -> Vec<f64> {
        // B Bᵀ + n I from a fixed pseudo-random B.
        let b: Vec<f64> = (0..n * n)
            .map(|i| ((i * 7919 % 211) as f64 / 211.0) - 0.5)
            .collect();
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                let mut s = 0.0;
                for k in 0..n {
                    s += b[i * n + k] * b[j * n + k];
                }
                a[i * n + j] = s + if i == j { n as f64 } else { 0.0 };
            }
        }
        a
    }

    fn matmul(a: &[f64], b: &[f64], n: usize) -> Vec<f64> {
        let mut c = vec![0.0; n * n];
        for i in 0..n {
            for k in 0..n {
                for j in 0..n {
                    c[i * n + j] += a[i * n + k] * b[k * n + j];
                }
            }
        }
        c
    }

    fn transpose(a: &[f64], n: usize) -> Vec<f64> {
        let mut t = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                t[j * n + i] = a[i * n + j];
            }
        }
        t
    }

    #[test]
    fn cholesky_reconstructs_the_matrix() {
        let n = 9;
        let a = spd(n);
        let l = cholesky_lower(&a, n).unwrap();
        let r = matmul(&l, &transpose(&l, n), n);
        for (x, y) in a.iter().zip(&r) {
            assert!((x - y).abs() < 1e-9);
        }
    }

    #[test]
    fn inverse_upper_cholesky_gives_the_inverse() {
        let n = 12;
        let a = spd(n);
        let u = inverse_upper_cholesky(&a, n).unwrap();
        for i in 0..n {
            for j in 0..i {
                assert_eq!(u[i * n + j], 0.0, "not upper triangular");
            }
        }
        let inv = matmul(&transpose(&u, n), &u, n);
        let id = matmul(&a, &inv, n);
        for i in 0..n {
            for j in 0..n {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((id[i * n + j] - want).abs() < 1e-9, "({i},{j})");
            }
        }
    }

    #[test]
    fn indefinite_matrices_are_an_error_not_nan() {
        let a = [1.0, 2.0, 2.0, 1.0];
        let e = cholesky_lower(&a, 2).unwrap_err();
        assert!(e.to_string().contains("dampening"), "{e}");
    }
}
