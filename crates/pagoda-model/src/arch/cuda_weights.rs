//! The CUDA backend's weight matrices: which stay quantized in GPU memory and which become
//! bf16, their upload, the one multiply both kinds go through, and the GPU memory a model's
//! weights take (the fit check of [`super::cuda::Cuda::for_model`]).
//!
//! A matrix stored in a format pagoda-cuda multiplies in place ([`gpu_format`]: Q8_0, Q4_0,
//! Q4_1, Q4_K, Q5_K, Q6_K, INT8, INT4 of every group size, NF4, NF4_DQ) is uploaded as its
//! bytes ([`CudaWeight::Quantized`]); any other (F32, F16, BF16, Q5_0, Q5_1, Q2_K, Q3_K) is
//! dequantized to bf16 at load ([`CudaWeight::Bf16`]). `PAGODA_CUDA_WEIGHTS=bf16` makes
//! every matrix bf16 (for comparing the two paths on one model).
//!
//! Invariants:
//! - [`device_bytes`] counts what [`upload`] allocates for each tensor (its stored bytes when
//!   it stays quantized, 2 bytes per element as bf16, 4 for a vector kept in f32), so the
//!   fit check refuses a model by its real size.
//! - [`multiply`] is `y = x · Wᵀ` whatever the kind: bf16 weights through cuBLAS on the bf16
//!   staging copy of `x`; quantized ones through pagoda-cuda's `QuantKernels::matmul`: the
//!   GEMV (at most `GEMV_MAX_ROWS` rows, on the f32 `x`; int8 `dp4a` for Q8_0 and INT8) or
//!   the tiled GEMM (on the staging copy, tiles in the pass's `QuantWorkspace`).

use super::layers::expect_shape;
use crate::weights::{TensorView, Weights};
use crate::ModelError;
use half::bf16;
use pagoda_cuda::cudarc::driver::CudaSlice;
use pagoda_cuda::{GpuContext, QuantFormat, QuantWorkspace, QuantizedMatrix, GEMV_MAX_ROWS};
use pagoda_kernels::{GgmlType, WeightMatrix};
use rayon::prelude::*;

/// A weight matrix `[rows, cols]` in GPU memory.
#[derive(Debug)]
pub enum CudaWeight {
    /// Dequantized (or converted) to bf16, row-major.
    Bf16(CudaSlice<bf16>),
    /// The stored blocks, multiplied in place.
    Quantized(QuantizedMatrix),
}

/// The GPU format of weights stored as `ty`, if pagoda-cuda multiplies it in place.
pub fn gpu_format(ty: GgmlType) -> Option<QuantFormat> {
    Some(match ty {
        GgmlType::Q8_0 => QuantFormat::Q8_0,
        GgmlType::Q4_0 | GgmlType::Int4G32Sym => QuantFormat::Q4_0,
        GgmlType::Q4_1 | GgmlType::Int4G32 => QuantFormat::Q4_1,
        GgmlType::Q4_K => QuantFormat::Q4K,
        GgmlType::Q5_K => QuantFormat::Q5K,
        GgmlType::Q6_K => QuantFormat::Q6K,
        GgmlType::Int8 => QuantFormat::Int8,
        GgmlType::Int4G64 => QuantFormat::Int4G64,
        GgmlType::Int4G64Sym => QuantFormat::Int4G64Sym,
        GgmlType::Int4G128 => QuantFormat::Int4G128,
        GgmlType::Int4G128Sym => QuantFormat::Int4G128Sym,
        GgmlType::Nf4 => QuantFormat::Nf4,
        GgmlType::Nf4Dq => QuantFormat::Nf4Dq,
        GgmlType::Mxfp4 => QuantFormat::Mxfp4,
        GgmlType::F32
        | GgmlType::F16
        | GgmlType::BF16
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q8_1
        | GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q8_K => return None,
    })
}

/// Whether `PAGODA_CUDA_WEIGHTS=bf16` asks for every matrix in bf16.
fn all_bf16() -> bool {
    std::env::var("PAGODA_CUDA_WEIGHTS").is_ok_and(|v| v.eq_ignore_ascii_case("bf16"))
}

/// The format `t` stays in on the GPU, when it is a matrix of such a format.
fn kept_format(t: &TensorView) -> Option<QuantFormat> {
    if t.shape.len() != 2 || all_bf16() {
        return None;
    }
    gpu_format(t.ty)
}

/// Bytes of GPU memory the model's weights take once uploaded (see the module invariant).
pub fn device_bytes(weights: &Weights) -> u64 {
    weights.iter().map(tensor_device_bytes).sum()
}

/// Bytes of GPU memory one tensor takes once uploaded: its stored bytes when it stays
/// quantized, 2 per element for a matrix uploaded as bf16, 4 for a vector kept as f32.
pub fn tensor_device_bytes(t: &TensorView) -> u64 {
    match kept_format(t) {
        Some(_) => t.n_bytes() as u64,
        None if t.shape.len() >= 2 => t.n_elements() as u64 * 2,
        None => t.n_elements() as u64 * 4,
    }
}

fn tensor_error(name: &str, message: String) -> ModelError {
    ModelError::Tensor {
        path: Default::default(),
        tensor: name.to_string(),
        message,
    }
}

/// Uploads matrix `name` (`[rows, cols]`): as its blocks when [`gpu_format`] knows its type,
/// else as bf16.
pub fn upload(
    gpu: &GpuContext,
    weights: &Weights,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<CudaWeight, ModelError> {
    let t = weights.get(name)?;
    expect_shape(t, &[rows, cols])?;
    if let Some(format) = kept_format(t) {
        return Ok(CudaWeight::Quantized(QuantizedMatrix::upload(
            gpu.stream(),
            format,
            rows,
            cols,
            t.data(),
        )?));
    }
    let host = to_bf16(t, rows, cols)?;
    let dev = gpu
        .stream()
        .clone_htod(&host)
        .map_err(|e| pagoda_cuda::CudaError::Driver {
            call: "cuMemcpyHtoD",
            message: e.to_string(),
        })?;
    Ok(CudaWeight::Bf16(dev))
}

/// `t` dequantized to bf16, row-major, rows in parallel.
fn to_bf16(t: &TensorView, rows: usize, cols: usize) -> Result<Vec<bf16>, ModelError> {
    let m = WeightMatrix::new(t.ty, rows, cols, t.data())
        .map_err(|e| tensor_error(&t.name, e.to_string()))?;
    let mut out = vec![bf16::ZERO; rows * cols];
    out.par_chunks_mut(cols.max(1))
        .enumerate()
        .try_for_each_init(
            || vec![0.0f32; cols],
            |row, (r, dst)| {
                m.dequantize_row(r, row)?;
                for (d, &v) in dst.iter_mut().zip(row.iter()) {
                    *d = bf16::from_f32(v);
                }
                Ok::<(), pagoda_kernels::KernelError>(())
            },
        )
        .map_err(|e| tensor_error(&t.name, e.to_string()))?;
    Ok(out)
}

/// `y = x · Wᵀ` (`x`: `[m, k]` f32 and its bf16 copy `x16`; `y`: `[m, n]` f32; `W`:
/// `[n, k]`): see the module invariant.
#[allow(clippy::too_many_arguments)]
pub fn multiply(
    gpu: &GpuContext,
    w: &CudaWeight,
    x: &CudaSlice<f32>,
    x16: &CudaSlice<bf16>,
    y: &mut CudaSlice<f32>,
    m: usize,
    n: usize,
    k: usize,
    ws: &mut QuantWorkspace,
) -> Result<(), ModelError> {
    match w {
        CudaWeight::Bf16(w) => gpu.blas().gemm_bf16(x16, w, y, m, n, k, 1.0, 0.0)?,
        CudaWeight::Quantized(q) if (q.rows(), q.cols()) != (n, k) => {
            return Err(pagoda_cuda::CudaError::Shape {
                kernel: "quantized matmul",
                message: format!(
                    "a [{}, {}] matrix multiplied as [{n}, {k}]",
                    q.rows(),
                    q.cols()
                ),
            }
            .into())
        }
        CudaWeight::Quantized(q) => gpu.quant().matmul(gpu.blas(), q, x, x16, y, m, ws)?,
    }
    Ok(())
}

/// Bytes of the quantized workspace a pass of `rows` rows needs for matrices of at most
/// `widest` columns: the GEMM tile and the 8-bit GEMV's int8 activations.
pub fn workspace_bytes(rows: usize, widest: usize) -> u64 {
    let tile = QuantWorkspace::default().tile_bytes(usize::MAX, widest);
    let int8 = GEMV_MAX_ROWS.min(rows) * widest * 2;
    (tile + int8) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gpu_format_has_the_cpu_types_row_size() {
        for ty in GgmlType::ALL.into_iter().chain(GgmlType::INTERNAL) {
            let Some(format) = gpu_format(ty) else {
                continue;
            };
            for cols in [256, 512, 1536, 257 * 64 * 4] {
                assert_eq!(
                    format.row_bytes(cols),
                    Some(ty.row_bytes(cols).expect("whole blocks")),
                    "{ty} as {format} at {cols}"
                );
            }
        }
        for ty in [GgmlType::F16, GgmlType::Q5_0, GgmlType::Q3_K] {
            assert_eq!(gpu_format(ty), None, "{ty}");
        }
    }

    #[test]
    fn device_bytes_count_quantized_matrices_as_stored() {
        let (rows, cols) = (4, 256);
        let q = vec![0u8; rows * GgmlType::Q4_K.row_bytes(cols).expect("row")];
        let f = vec![0u8; rows * cols * 4];
        let mut w = Weights::new();
        w.insert(
            TensorView::owned("a.weight", GgmlType::Q4_K, vec![rows, cols], q.clone())
                .expect("view"),
        )
        .expect("insert");
        w.insert(TensorView::owned("b.weight", GgmlType::F32, vec![rows, cols], f).expect("view"))
            .expect("insert");
        w.insert(
            TensorView::owned("n.weight", GgmlType::F32, vec![cols], vec![0u8; cols * 4])
                .expect("view"),
        )
        .expect("insert");
        if all_bf16() {
            return;
        }
        assert_eq!(
            device_bytes(&w),
            q.len() as u64 + (rows * cols * 2) as u64 + (cols * 4) as u64
        );
    }
}
