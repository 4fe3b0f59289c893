//! pagoda-kernels: the numeric core of Pagoda.
//!
//! Owns tensor element types ([`GgmlType`]), the GGUF block formats and their dequantization,
//! the quantized matrix products that work directly on those blocks, and the row operations of
//! a transformer layer ([`ops`]). Knows nothing of models, files or scheduling.
//!
//! Architecture Invariant: no function here allocates per call on the hot path except the
//! activation quantization scratch inside `matmul`; weights are only ever borrowed.

pub mod dtype;
pub mod error;
pub mod ops;

pub use dtype::{GgmlType, QK_K};
pub use error::KernelError;
