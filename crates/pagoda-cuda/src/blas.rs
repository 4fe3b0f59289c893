//! [`Blas`]: cuBLAS on the GPU context's stream, for the dense products of a forward pass.
//!
//! Layout (row-major everywhere on Pagoda's side): `x` is `[m, k]` (tokens × in features),
//! `w` is `[n, k]` (out features × in features: a PyTorch / GGUF weight as stored), `out` is
//! `[m, n]`. cuBLAS is column-major, where a row-major `[r, c]` matrix reads as its transpose,
//! so `out = x · wᵀ` is computed as `outᵀ (n × m) = w (n × k) · xᵀ (k × m)`:
//! `cublasGemmEx(OP_T, OP_N, n, m, k, w, lda = k, x, ldb = k, out, ldc = n)`, bf16 inputs
//! (`CUDA_R_16BF`), f32 output (`CUDA_R_32F`), f32 accumulation (`CUBLAS_COMPUTE_32F`),
//! the default algorithm.
//!
//! `gemm_bf16_raw` (crate-private, for the quantized GEMM's tiles) takes raw addresses and
//! an output row stride `ldc ≥ n`, so a GEMM over a block of `w`'s rows writes that block of
//! `out`'s columns; its callers check the buffers themselves.
//!
//! Invariants: sizes and buffer lengths are checked before the call (as for the kernels:
//! [`CudaError::Shape`], never an out-of-bounds access); the handle is bound to the context's
//! stream at creation and never rebound, so GEMMs are ordered with the kernels.

use crate::error::CudaError;
use crate::ops::Check;
use cudarc::cublas::{result as blas_result, sys as blas_sys, CudaBlas};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;
use std::sync::Arc;

/// cuBLAS bound to one stream.
#[derive(Debug)]
pub struct Blas {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
}

impl Blas {
    /// A cuBLAS handle on `stream`. The caller has checked that cuBLAS loads (cudarc panics
    /// otherwise).
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Self, CudaError> {
        let blas = CudaBlas::new(stream.clone()).map_err(|e| CudaError::Blas {
            call: "cublasCreate",
            message: e.to_string(),
        })?;
        Ok(Blas {
            blas,
            stream: stream.clone(),
        })
    }

    /// The stream the handle is bound to.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `out = alpha · x · wᵀ + beta · out` (`x`: `[m, k]` bf16, `w`: `[n, k]` bf16, `out`:
    /// `[m, n]` f32, all row-major; see the module doc). `beta = 1` accumulates into `out`
    /// (LoRA deltas); with `beta = 0` the old contents of `out` are ignored (even NaN).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16(
        &self,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<bf16>,
        out: &mut impl DevicePtrMut<f32>,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        beta: f32,
    ) -> Result<(), CudaError> {
        let c = Check {
            kernel: "gemm_bf16",
            stream: &self.stream,
        };
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return Err(c.shape(format!("m {m}, n {n}, k 0: k must be at least 1")));
        }
        let (xp, _x) = c.input("x", x, c.mul("x", m, k)?)?;
        let (wp, _w) = c.input("w", w, c.mul("w", n, k)?)?;
        let (op, _o) = c.output("out", out, c.mul("out", m, n)?)?;
        // SAFETY: each pointer covers the matrix cuBLAS reads or writes for these sizes
        // (checked above: w n·k, x m·k, out m·n elements, so ldc = n fits).
        unsafe { self.gemm_bf16_raw(xp, wp, op, m, n, k, n, alpha, beta) }
    }

    /// [`Blas::gemm_bf16`] on raw device addresses, with `out`'s row stride `ldc` (≥ `n`):
    /// `out[r * ldc + c]` for `r < m`, `c < n`; the other values of a row are not touched,
    /// so a GEMM of a block of `w`'s rows writes a block of `out`'s columns.
    ///
    /// # Safety
    /// `xp` must address `m·k` bf16 values, `wp` `n·k` bf16 values and `op`
    /// `(m - 1)·ldc + n` f32 values of this handle's context, alive until the GEMM has run
    /// (the stream's order), and `k ≥ 1`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gemm_bf16_raw(
        &self,
        xp: u64,
        wp: u64,
        op: u64,
        m: usize,
        n: usize,
        k: usize,
        ldc: usize,
        alpha: f32,
        beta: f32,
    ) -> Result<(), CudaError> {
        let c = Check {
            kernel: "gemm_bf16",
            stream: &self.stream,
        };
        if m == 0 || n == 0 {
            return Ok(());
        }
        if ldc < n {
            return Err(c.shape(format!("ldc {ldc} is less than n {n}")));
        }
        let (m_i, n_i, k_i) = (c.int("m", m)?, c.int("n", n)?, c.int("k", k)?);
        let ldc_i = c.int("ldc", ldc)?;
        // SAFETY: the handle is bound to this stream; the caller guarantees each pointer
        // covers what cuBLAS reads or writes for these sizes and leading dimensions; alpha
        // and beta are host f32 (the default pointer mode) matching CUBLAS_COMPUTE_32F.
        unsafe {
            blas_result::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                n_i,
                m_i,
                k_i,
                (&alpha) as *const f32 as *const _,
                wp as *const _,
                blas_sys::cudaDataType::CUDA_R_16BF,
                k_i,
                xp as *const _,
                blas_sys::cudaDataType::CUDA_R_16BF,
                k_i,
                (&beta) as *const f32 as *const _,
                op as *mut _,
                blas_sys::cudaDataType::CUDA_R_32F,
                ldc_i,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| CudaError::Blas {
            call: "cublasGemmEx",
            message: format!("{e} (m {m}, n {n}, k {k}, ldc {ldc})"),
        })
    }
}
