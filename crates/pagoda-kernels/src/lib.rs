//! pagoda-kernels: the numeric core of Pagoda.
//!
//! Owns tensor element types ([`GgmlType`]), the GGUF block formats and their dequantization
//! ([`quant`]), the quantized matrix products that work directly on those blocks
//! ([`matmul()`], with SIMD paths picked at run time: [`cpu`], `simd`), and the row operations
//! of a transformer layer ([`ops`]). Knows nothing of models, files or scheduling.
//!
//! Architecture Invariant: no function here allocates per call on the hot path except the
//! activation quantization scratch inside `matmul`; weights are only ever borrowed.

// Block kernels index several arrays with one counter; iterator chains would hide the layout.
#![allow(clippy::needless_range_loop)]
// `usize::is_multiple_of` is newer than the workspace's rust-version (1.85).
#![allow(clippy::manual_is_multiple_of)]

pub mod attention;
pub mod cpu;
pub mod dtype;
pub mod error;
pub mod matmul;
pub mod ops;
pub mod quant;
mod simd;

pub use cpu::{available_isas, best_isa, Isa};
pub use dtype::{GgmlType, QK_K};
pub use error::KernelError;
pub use matmul::{matmul, matmul_with_isa, WeightMatrix};
pub use quant::{dequantize_row, quantize_row};
