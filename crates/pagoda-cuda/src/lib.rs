//! pagoda-cuda: NVIDIA GPUs, reached at run time.
//!
//! Map: [`libraries`] (which of the CUDA libraries Pagoda needs can be loaded: the driver,
//! NVRTC, cuBLAS), [`gpu`] (the GPUs the driver reports, with their memory and compute
//! capability), [`kernels`] (the CUDA C sources, compiled by NVRTC at first use, cached on
//! disk by source hash and architecture), [`gpu_context`] (one GPU ready for a forward pass:
//! context, stream, loaded kernels, cuBLAS), [`ops`] (the row and elementwise kernels' typed
//! launches), [`attention`] (paged attention: the batch's device metadata and the decode /
//! prefill kernels), [`quant`] (weights kept in their quantized block formats: the decode
//! GEMV, the tiled dequantize-then-GEMM of prefill, the embedding lookup), [`blas`] (the
//! bf16 GEMM), [`error`] (what is missing or failed, in words
//! that say what to do), [`interpret`] (the CUDA interpreter: all of the above run on the
//! CPU, for machines and CI without a GPU).
//!
//! Architecture Invariant: nothing here links against CUDA. The libraries are opened with
//! `dlopen` when first asked for (cudarc's dynamic loading), and only after
//! [`libraries::Libraries::find`] has seen that they load, so a machine without a GPU or a
//! driver builds and runs everything else and gets a [`CudaError`] naming the missing piece
//! (cudarc itself panics when asked for a library that is not there). Depends on no other
//! Pagoda crate.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod attention;
pub mod blas;
pub mod error;
pub mod gpu;
pub mod gpu_context;
pub mod interpret;
pub mod kernels;
pub mod libraries;
pub mod ops;
pub mod quant;

pub use attention::{AttentionBatch, AttentionParams, AttentionWorkspace, SeqSpan};
pub use blas::Blas;
/// The CUDA bindings the device buffers are typed by (`CudaSlice`, `DevicePtr`), for the crates that hold them.
pub use cudarc;
pub use error::CudaError;
pub use gpu::{list_gpus, Gpu};
pub use gpu_context::GpuContext;
pub use kernels::{arch_for, KernelCache};
pub use libraries::{Libraries, LibraryVersions, LoadedLibrary};
pub use ops::{Fp8Scales, GatedActivation, Kernels, RopeStyle};
pub use quant::{
    QuantFormat, QuantKernels, QuantWorkspace, QuantizedMatrix, DEFAULT_TILE_ELEMS, GEMV_MAX_ROWS,
};
