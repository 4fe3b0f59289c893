//! Plain f32 matrix products for the small dense factors that sit beside the quantized
//! weights (LoRA's `A` and `B`) and the chunk products of the recurrent kernels: safe wrappers
//! over the `gemm` crate ([`matmul_nt`]; `gemm_strided` over strided views, crate-internal).
//!
//! Invariant: every call checks its slice lengths against the shapes first (a mismatch is a
//! caller bug and panics before `gemm` reads anything), so the `unsafe` calls below only ever
//! address elements inside the slices.

/// `out[m, n] (+)= alpha · a[m, k] · b[n, k]ᵀ`, all row-major; `accumulate` adds to `out`
/// instead of overwriting it. Nothing happens when `m`, `n` or `k` is zero (`out` is zeroed
/// when `k` is zero and `accumulate` is off).
///
/// # Panics
/// If `a`, `b` or `out` is shorter than its shape says.
#[allow(clippy::too_many_arguments)]
pub fn matmul_nt(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    accumulate: bool,
) {
    assert!(a.len() >= m * k, "a: {} values for [{m}, {k}]", a.len());
    assert!(b.len() >= n * k, "b: {} values for [{n}, {k}]", b.len());
    assert!(
        out.len() >= m * n,
        "out: {} values for [{m}, {n}]",
        out.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            out[..m * n].fill(0.0);
        }
        return;
    }
    // SAFETY: out is [m, n] row-major (column stride 1, row stride n); a is [m, k] (column
    // stride 1, row stride k); bᵀ's element (p, j) is b[j * k + p] (column stride k, row
    // stride 1); all lengths were asserted above.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            k as isize,
            1,
            1.0,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// A read-only strided f32 matrix: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> View<'a> {
    /// Rows `rows` of `cols` values, `rs` apart (columns contiguous).
    pub fn rows(data: &'a [f32], rows: usize, cols: usize, rs: usize) -> Self {
        View {
            data,
            rows,
            cols,
            rs,
            cs: 1,
        }
    }

    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        View {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

/// A mutable strided f32 matrix, laid out as [`View`].
#[derive(Debug)]
pub(crate) struct ViewMut<'a> {
    pub data: &'a mut [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> ViewMut<'a> {
    /// Rows `rows` of `cols` values, `rs` apart (columns contiguous).
    pub fn rows(data: &'a mut [f32], rows: usize, cols: usize, rs: usize) -> Self {
        ViewMut {
            data,
            rows,
            cols,
            rs,
            cs: 1,
        }
    }
}

/// Whether every element of a `rows x cols` view with strides `rs`, `cs` lies in `len` values.
fn view_fits(len: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> bool {
    if rows == 0 || cols == 0 {
        return true;
    }
    let last = (rows - 1)
        .checked_mul(rs)
        .and_then(|r| (cols - 1).checked_mul(cs).and_then(|c| r.checked_add(c)));
    last.is_some_and(|last| last < len)
}

/// `dst = keep · dst + alpha · a · b` with `keep = dst_scale` (or `dst = alpha · a · b` when
/// `dst_scale` is `None`), over strided views; single-threaded.
///
/// # Panics
/// If the shapes disagree or a view addresses past its slice (a caller bug).
pub(crate) fn gemm_strided(
    dst: ViewMut<'_>,
    dst_scale: Option<f32>,
    a: View<'_>,
    b: View<'_>,
    alpha: f32,
) {
    let (m, n, k) = (dst.rows, dst.cols, a.cols);
    assert!(a.rows == m && b.rows == k && b.cols == n, "gemm shapes");
    assert!(view_fits(dst.data.len(), m, n, dst.rs, dst.cs), "gemm dst");
    assert!(view_fits(a.data.len(), m, k, a.rs, a.cs), "gemm lhs");
    assert!(view_fits(b.data.len(), k, n, b.rs, b.cs), "gemm rhs");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        let keep = dst_scale.unwrap_or(0.0);
        for i in 0..m {
            for j in 0..n {
                let e = &mut dst.data[i * dst.rs + j * dst.cs];
                *e = if dst_scale.is_some() { *e * keep } else { 0.0 };
            }
        }
        return;
    }
    // SAFETY: every element of the three views lies inside its slice (asserted above); dst
    // is borrowed mutably, so it cannot alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
            dst.cs as isize,
            dst.rs as isize,
            dst_scale.is_some(),
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            dst_scale.unwrap_or(0.0),
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[j * k + p]).sum();
            }
        }
        out
    }

    #[test]
    fn matches_the_naive_product_and_accumulates() {
        let (m, n, k) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let want = naive(&a, &b, m, n, k);
        let mut out = vec![9.0; m * n];
        matmul_nt(&a, &b, &mut out, m, n, k, 1.0, false);
        for (x, y) in out.iter().zip(&want) {
            assert!((x - y).abs() < 1e-5);
        }
        let mut acc = vec![1.0; m * n];
        matmul_nt(&a, &b, &mut acc, m, n, k, 2.0, true);
        for (x, y) in acc.iter().zip(&want) {
            assert!((x - (1.0 + 2.0 * y)).abs() < 1e-5);
        }
    }

    #[test]
    fn strided_views_transpose_and_scale_the_destination() {
        let (m, n, k) = (4, 3, 5);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        // a · bᵀ with b [n, k] read through a transposed view.
        let want = naive(&a, &b, m, n, k);
        let mut out = vec![1.0; m * n];
        gemm_strided(
            ViewMut::rows(&mut out, m, n, n),
            Some(0.5),
            View::rows(&a, m, k, k),
            View::rows(&b, n, k, k).t(),
            -2.0,
        );
        for (x, y) in out.iter().zip(&want) {
            assert!((x - (0.5 - 2.0 * y)).abs() < 1e-5);
        }
        let mut fresh = vec![f32::NAN; m * n];
        gemm_strided(
            ViewMut::rows(&mut fresh, m, n, n),
            None,
            View::rows(&a, m, 0, k),
            View::rows(&b, 0, n, n),
            1.0,
        );
        assert!(
            fresh.iter().all(|&v| v == 0.0),
            "k = 0 overwrites with zeros"
        );
    }
}
