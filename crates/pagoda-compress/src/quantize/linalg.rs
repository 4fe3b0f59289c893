//! The dense linear algebra GPTQ and AWQ need: in f64 on row-major square matrices,
//! Cholesky factorisation, the inverse of a lower-triangular matrix, and the upper Cholesky
//! factor of a symmetric positive-definite matrix's inverse; in f32 and f64, a strided
//! matrix product on the `gemm` crate (the O(rows · cols²) parts: Hessians, GPTQ's trailing
//! updates, output errors, and the factorisations' block updates).
//!
//! The factorisations are blocked (LAPACK's `potrf` / `trtri` shape): panels of [`NB`]
//! columns are factored with scalar loops, and everything else — O(n³) of the O(n³) work —
//! is matrix products on `gemm`, in parallel over row blocks. For GPTQ on a 4,864-wide
//! Hessian (Qwen2.5-Coder-0.5B's down projection) that is the difference between ~30 s and
//! ~2 s per factorisation.
//!
//! Invariant: inputs are `n * n` row-major; a matrix that is not positive definite is an
//! error (GPTQ dampens its Hessian first so that it is), never a NaN in the output.

use rayon::prelude::*;

use crate::CompressError;

/// Columns per panel of the blocked factorisations.
const NB: usize = 96;

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

fn not_positive_definite(column: usize) -> CompressError {
    CompressError::InvalidInput(format!(
        "the calibration Hessian is not positive definite at column {column}; \
         raise the dampening (--damp) or give more calibration text"
    ))
}

/// Lower `L` with `a = L Lᵀ`, or the first column where `a` is not positive definite.
///
/// Right-looking blocked Cholesky: for each panel of [`NB`] columns `k0..k1`, the diagonal
/// block is factored in place, the rows below it solved against it (rows in parallel), and
/// the trailing lower triangle updated by `A₂₂ −= L₂₁ L₂₁ᵀ` as one `gemm` per row block.
fn cholesky_in_place(l: &mut [f64], n: usize) -> Result<(), usize> {
    for k0 in (0..n).step_by(NB) {
        let k1 = (k0 + NB).min(n);
        // The diagonal block, column by column (its rows hold the trailing updates so far).
        for j in k0..k1 {
            let rj = &l[j * n + k0..j * n + j];
            let d = l[j * n + j] - dot(rj, rj);
            if d.is_nan() || d <= 0.0 {
                return Err(j);
            }
            let d = d.sqrt();
            l[j * n + j] = d;
            for i in j + 1..k1 {
                let v =
                    (l[i * n + j] - dot(&l[i * n + k0..i * n + j], &l[j * n + k0..j * n + j])) / d;
                l[i * n + j] = v;
            }
        }
        if k1 == n {
            break;
        }
        // The panel below it: row i solves L₁₁ xᵀ = a_iᵀ (forward substitution).
        let (head, tail) = l.split_at_mut(k1 * n);
        let diag = &head[k0 * n..];
        tail.par_chunks_mut(n).for_each(|row| {
            for j in k0..k1 {
                let lj = &diag[(j - k0) * n..];
                let v = (row[j] - dot(&row[k0..j], &lj[k0..j])) / lj[j];
                row[j] = v;
            }
        });
        // Trailing update of the lower triangle, row blocks in parallel: rows i0..i1,
        // columns k1..i1 −= P[i0..i1] · P[k1..i1]ᵀ, with P = L[k1.., k0..k1] copied out.
        let m = n - k1;
        let b = k1 - k0;
        let mut panel = vec![0.0f64; m * b];
        for (p, row) in panel.chunks_exact_mut(b).zip(tail.chunks_exact(n)) {
            p.copy_from_slice(&row[k0..k1]);
        }
        let panel = &panel;
        tail.par_chunks_mut(n * NB)
            .enumerate()
            .for_each(|(blk, rows)| {
                let r0 = blk * NB;
                let r1 = r0 + rows.len() / n;
                let a = MatRef::row_major(&panel[r0 * b..r1 * b], r1 - r0, b);
                let bt = MatRef::row_major(&panel[..r1 * b], r1, b).t();
                gemm_t(&mut rows[k1..], n, 1.0, a, bt, -1.0, false);
            });
    }
    // The strict upper triangle held `a`'s values; L is lower triangular.
    for i in 0..n {
        l[i * n + i + 1..(i + 1) * n].fill(0.0);
    }
    Ok(())
}

/// Lower `L` with `a = L Lᵀ` (blocked: see [`cholesky_in_place`]).
#[cfg(test)]
pub(crate) fn cholesky_lower(a: &[f64], n: usize) -> Result<Vec<f64>, CompressError> {
    debug_assert_eq!(a.len(), n * n);
    let mut l = a.to_vec();
    cholesky_in_place(&mut l, n).map_err(not_positive_definite)?;
    Ok(l)
}

/// The inverse of a lower-triangular `l` (also lower triangular).
///
/// Blocked by row panels `I` of [`NB`] rows: the diagonal block's inverse `X_II` by rows
/// (scalar), then for every column block `J` left of it (in parallel)
/// `X_IJ = −X_II · (L[I, J..I] · X[J..I, J])` as two `gemm`s — the rows above `I` are done.
pub fn invert_lower(l: &[f64], n: usize) -> Vec<f64> {
    let mut inv = vec![0.0f64; n * n];
    for i0 in (0..n).step_by(NB) {
        let i1 = (i0 + NB).min(n);
        let b = i1 - i0;
        // X_II, [b, b] row-major: row i is −(Σ_{k<i} l_ik · row_k) / l_ii, 1 / l_ii on the
        // diagonal.
        let mut xii = vec![0.0f64; b * b];
        for i in 0..b {
            let (done, rest) = xii.split_at_mut(i * b);
            let row = &mut rest[..b];
            for k in 0..i {
                let c = l[(i0 + i) * n + i0 + k];
                if c != 0.0 {
                    for (r, &v) in row[..=k].iter_mut().zip(&done[k * b..k * b + k + 1]) {
                        *r -= c * v;
                    }
                }
            }
            let d = l[(i0 + i) * n + i0 + i];
            for r in &mut row[..i] {
                *r /= d;
            }
            row[i] = 1.0 / d;
        }
        // X[I, J] for each column block J < I.
        let done = &inv[..i0 * n];
        let blocks: Vec<(usize, Vec<f64>)> = (0..i0)
            .step_by(NB)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|j0| {
                let j1 = (j0 + NB).min(i0);
                let w = j1 - j0;
                // T = L[I, j0..i0] · X[j0..i0, J]   ([b, w])
                let mut t = vec![0.0f64; b * w];
                let lij = MatRef {
                    data: &l[i0 * n + j0..],
                    rows: b,
                    cols: i0 - j0,
                    rs: n,
                    cs: 1,
                };
                let xj = MatRef {
                    data: &done[j0 * n + j0..],
                    rows: i0 - j0,
                    cols: w,
                    rs: n,
                    cs: 1,
                };
                gemm_t(&mut t, w, 0.0, lij, xj, 1.0, false);
                // X_IJ = −X_II · T
                let mut x = vec![0.0f64; b * w];
                gemm_t(
                    &mut x,
                    w,
                    0.0,
                    MatRef::row_major(&xii, b, b),
                    MatRef::row_major(&t, b, w),
                    -1.0,
                    false,
                );
                (j0, x)
            })
            .collect();
        for (j0, x) in blocks {
            let w = x.len() / b;
            for (r, xr) in x.chunks_exact(w).enumerate() {
                inv[(i0 + r) * n + j0..(i0 + r) * n + j0 + w].copy_from_slice(xr);
            }
        }
        for (r, xr) in xii.chunks_exact(b).enumerate() {
            inv[(i0 + r) * n + i0..(i0 + r) * n + i1].copy_from_slice(xr);
        }
    }
    inv
}

/// Upper `U` with `a⁻¹ = Uᵀ U`, for symmetric positive-definite `a`.
///
/// With `J` the order-reversing permutation, `J a J = L' L'ᵀ` (Cholesky) gives
/// `a = R Rᵀ` with `R = J L' J` upper triangular, so `a⁻¹ = R⁻ᵀ R⁻¹` and `U = R⁻¹ =
/// J L'⁻¹ J` — one Cholesky and one triangular inverse (the reference's
/// `cholesky_inverse` then `cholesky(upper)` takes two of each; `U` is the same matrix, the
/// unique upper factor with a positive diagonal). On a row-major buffer `J M J` is the
/// buffer reversed.
pub fn inverse_upper_cholesky(a: &[f64], n: usize) -> Result<Vec<f64>, CompressError> {
    debug_assert_eq!(a.len(), n * n);
    let mut l: Vec<f64> = a.iter().rev().copied().collect();
    cholesky_in_place(&mut l, n).map_err(|j| not_positive_definite(n - 1 - j))?;
    let mut u = invert_lower(&l, n);
    u.reverse();
    Ok(u)
}

/// A strided matrix view (f32 unless said): element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a, T = f32> {
    pub data: &'a [T],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// A row-major `[rows, cols]` matrix.
    pub fn row_major(data: &'a [T], rows: usize, cols: usize) -> Self {
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
    gemm_t(c, c_rs, alpha, a, b, beta, true);
}

/// [`gemm_f32`] for f32 or f64, on the rayon pool when `parallel` (callers already running
/// inside a parallel loop pass `false`).
fn gemm_t<T: Copy + PartialEq + Default + 'static>(
    c: &mut [T],
    c_rs: usize,
    alpha: T,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    beta: T,
    parallel: bool,
) {
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
    let parallelism = if parallel {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
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
            alpha != T::default(),
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
            parallelism,
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
        // Past the first panel, and through the reversed order of the inverse's factor: the
        // column named is the input's.
        let n = NB + 40;
        let mut a = spd(n);
        a[(n - 3) * n + n - 3] = -1.0;
        let e = cholesky_lower(&a, n).unwrap_err();
        assert!(e.to_string().contains(&format!("column {}", n - 3)), "{e}");
        let mut a = spd(n);
        a[5 * n + 5] = -1.0e6;
        let e = inverse_upper_cholesky(&a, n).unwrap_err();
        assert!(e.to_string().contains("not positive definite"), "{e}");
        assert!(
            cholesky_lower(&[f64::NAN], 1).is_err(),
            "a NaN is an error, not a NaN factor"
        );
    }

    /// The textbook (unblocked, column by column) Cholesky: the reference for the blocked one.
    fn naive_cholesky(a: &[f64], n: usize) -> Vec<f64> {
        let mut l = vec![0.0; n * n];
        for j in 0..n {
            let s: f64 = (0..j).map(|k| l[j * n + k] * l[j * n + k]).sum();
            l[j * n + j] = (a[j * n + j] - s).sqrt();
            for i in j + 1..n {
                let s: f64 = (0..j).map(|k| l[i * n + k] * l[j * n + k]).sum();
                l[i * n + j] = (a[i * n + j] - s) / l[j * n + j];
            }
        }
        l
    }

    /// A random symmetric positive-definite matrix, `B Bᵀ / n + ε I`, with uneven scales
    /// across rows (as Hessians of activations have).
    fn random_spd(n: usize, seed: u64) -> Vec<f64> {
        let mut state = seed | 1;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let b: Vec<f64> = (0..n * n)
            .map(|i| next() * if (i / n) % 5 == 0 { 8.0 } else { 1.0 })
            .collect();
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..=i {
                let s: f64 = (0..n).map(|k| b[i * n + k] * b[j * n + k]).sum::<f64>() / n as f64;
                a[i * n + j] = s;
                a[j * n + i] = s;
            }
            a[i * n + i] += 0.05;
        }
        a
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]

        /// The blocked factorisations agree with the unblocked textbook ones on sizes below,
        /// at and across panel boundaries.
        #[test]
        fn blocked_factorisations_match_the_unblocked_ones(
            n in 1usize..(3 * NB + 7),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let a = random_spd(n, seed);
            let want = naive_cholesky(&a, n);
            let l = cholesky_lower(&a, n).unwrap();
            let scale = a.iter().fold(0.0f64, |m, v| m.max(v.abs())).sqrt();
            for (i, (x, y)) in l.iter().zip(&want).enumerate() {
                proptest::prop_assert!(
                    (x - y).abs() <= 1e-10 * scale,
                    "n {} L[{}][{}]: blocked {} vs unblocked {}", n, i / n, i % n, x, y
                );
            }
            // L · L⁻¹ = I.
            let li = invert_lower(&l, n);
            let id = matmul(&l, &li, n);
            for i in 0..n {
                for j in 0..n {
                    let want = if i == j { 1.0 } else { 0.0 };
                    proptest::prop_assert!((id[i * n + j] - want).abs() < 1e-9, "({}, {})", i, j);
                }
            }
            // Uᵀ U = A⁻¹, U upper triangular with a positive diagonal.
            let u = inverse_upper_cholesky(&a, n).unwrap();
            for i in 0..n {
                proptest::prop_assert!(u[i * n + i] > 0.0);
                for j in 0..i {
                    proptest::prop_assert_eq!(u[i * n + j], 0.0);
                }
            }
            let id = matmul(&a, &matmul(&transpose(&u, n), &u, n), n);
            for i in 0..n {
                for j in 0..n {
                    let want = if i == j { 1.0 } else { 0.0 };
                    proptest::prop_assert!((id[i * n + j] - want).abs() < 1e-8, "({}, {})", i, j);
                }
            }
        }
    }
}
