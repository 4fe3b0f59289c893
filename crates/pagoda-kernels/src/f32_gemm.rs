//! Plain f32 matrix products for the small dense factors that sit beside the quantized
//! weights (LoRA's `A` and `B`): one safe wrapper over the `gemm` crate.
//!
//! Invariant: every call checks its slice lengths against the shapes first (a mismatch is a
//! caller bug and panics before `gemm` reads anything), so the `unsafe` call below only ever
//! addresses elements inside the slices.

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
}
