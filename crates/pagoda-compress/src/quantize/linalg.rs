//! The dense linear algebra GPTQ and AWQ need: in f64 on row-major square matrices,
//! Cholesky factorisation, the inverse of a lower-triangular matrix, and the upper Cholesky
//! factor of a symmetric positive-definite matrix's inverse; in f32, a strided matrix product
//! on the `gemm` crate (the O(rows · cols²) parts: Hessians, GPTQ's trailing updates, output
//! errors).
//!
//! Invariant: inputs are `n * n` row-major; a matrix that is not positive definite is an
//! error (GPTQ dampens its Hessian first so that it is), never a NaN in the output.

use rayon::prelude::*;

use crate::CompressError;

/// `Σ a_i b_i` in four lanes (so the compiler may vectorize it; the order of additions is
/// fixed, so results are reproducible).
#[inline]
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..4 {
            acc[k] += x[k] * y[k];
        }
    }
    let tail: f64 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// Lower `L` with `a = L Lᵀ` (column by column; each column's rows in parallel).
pub fn cholesky_lower(a: &[f64], n: usize) -> Result<Vec<f64>, CompressError> {
    debug_assert_eq!(a.len(), n * n);
    let mut l = vec![0.0f64; n * n];
    for j in 0..n {
        let d = a[j * n + j] - dot(&l[j * n..j * n + j], &l[j * n..j * n + j]);
        if d.is_nan() || d <= 0.0 {
            return Err(CompressError::InvalidInput(format!(
                "the calibration Hessian is not positive definite at column {j}; \
                 raise the dampening (--damp) or give more calibration text"
            )));
        }
        let d = d.sqrt();
        l[j * n + j] = d;
        let (head, tail) = l.split_at_mut((j + 1) * n);
        let lj = &head[j * n..j * n + j];
        tail.par_chunks_mut(n).enumerate().for_each(|(k, row)| {
            let i = j + 1 + k;
            row[j] = (a[i * n + j] - dot(&row[..j], lj)) / d;
        });
    }
    Ok(l)
}

/// The inverse of a lower-triangular `l` (also lower triangular), row by row: row `i` is
/// `−(Σ_{k<i} l_ik · row_k) / l_ii` plus `1 / l_ii` on the diagonal (contiguous row updates).
pub fn invert_lower(l: &[f64], n: usize) -> Vec<f64> {
    let mut inv = vec![0.0f64; n * n];
    for i in 0..n {
        let (done, rest) = inv.split_at_mut(i * n);
        let row = &mut rest[..n];
        for k in 0..i {
            let c = l[i * n + k];
            if c != 0.0 {
                for (r, &v) in row[..=k].iter_mut().zip(&done[k * n..k * n + k + 1]) {
                    *r -= c * v;
                }
            }
        }
        let d = l[i * n + i];
        for r in &mut row[..i] {
            *r /= d;
        }
        row[i] = 1.0 / d;
    }
    inv
}

/// Upper `U` with `a⁻¹ = Uᵀ U`, for symmetric positive-definite `a`.
pub fn inverse_upper_cholesky(a: &[f64], n: usize) -> Result<Vec<f64>, CompressError> {
    let l = cholesky_lower(a, n)?;
    let li = invert_lower(&l, n);
    // a⁻¹ = L⁻ᵀ L⁻¹: entry (i, j) = sum_k li[k][i] * li[k][j], k >= max(i, j).
    // With liᵀ's rows (li's columns) contiguous, each entry is one dot product.
    let mut lt = vec![0.0f64; n * n];
    for k in 0..n {
        for i in 0..=k {
            lt[i * n + k] = li[k * n + i];
        }
    }
    let mut inv = vec![0.0f64; n * n];
    inv.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        for (j, v) in row.iter_mut().enumerate() {
            let k0 = i.max(j);
            *v = dot(&lt[i * n + k0..(i + 1) * n], &lt[j * n + k0..(j + 1) * n]);
        }
    });
    let l2 = cholesky_lower(&inv, n)?;
    let mut u = vec![0.0f64; n * n];
    for i in 0..n {
        for j in i..n {
            u[i * n + j] = l2[j * n + i];
        }
    }
    Ok(u)
}

/// A strided f32 matrix view: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major `[rows, cols]` matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        MatRef {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// `c = alpha · c + beta · a · b`, with `c` a `[a.rows, b.cols]` block of a row-major buffer of
/// row stride `c_rs` (so a column range of a wider matrix can be updated in place). Runs on
/// the rayon pool. Panics if a view does not fit its buffer (a programming error: callers
/// build the views from shapes they checked).
pub fn gemm_f32(c: &mut [f32], c_rs: usize, alpha: f32, a: MatRef<'_>, b: MatRef<'_>, beta: f32) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions differ");
    assert!(a.fits() && b.fits(), "a matrix view runs past its buffer");
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        (m - 1) * c_rs + n <= c.len(),
        "the output runs past its buffer"
    );
    // SAFETY: every element the product reads or writes is in bounds (asserted above), the
    // output does not alias the inputs (`&mut` against `&`).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_rs as isize,
            alpha != 0.0,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            alpha,
            beta,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
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
    fn gemm_matches_the_naive_product_on_strided_views() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 11) as f32 - 5.0).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 * 0.5).collect();
        // b = btᵀ, [k, n]; c is the middle 3 columns of a [m, 5] buffer.
        let mut c = vec![1.0f32; m * 5];
        gemm_f32(
            &mut c[1..],
            5,
            2.0,
            MatRef::row_major(&a, m, k),
            MatRef::row_major(&bt, n, k).t(),
            -1.0,
        );
        for i in 0..m {
            assert_eq!(c[i * 5], 1.0);
            assert_eq!(c[i * 5 + 4], 1.0);
            for j in 0..n {
                let dot: f32 = (0..k).map(|p| a[i * k + p] * bt[j * k + p]).sum();
                assert!((c[i * 5 + 1 + j] - (2.0 - dot)).abs() < 1e-4);
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
