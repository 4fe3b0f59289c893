//! The one error type of pagoda-kernels.

use crate::GgmlType;

/// What can go wrong in a kernel call. Every variant names the type or shape at fault.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    #[error("{elements} elements of {ty} is not a whole number of {}-element blocks", ty.block_size())]
    PartialBlock { ty: GgmlType, elements: usize },
    #[error("{elements} elements of {ty} overflow the addressable size")]
    SizeOverflow { ty: GgmlType, elements: usize },
    #[error("unknown tensor type name {0:?}")]
    UnknownTypeName(String),
    #[error("{ty} data holds {actual} bytes but {expected} are needed for {what}")]
    WrongByteLength {
        ty: GgmlType,
        expected: usize,
        actual: usize,
        what: String,
    },
    #[error("shape mismatch: {0}")]
    Shape(String),
    #[error("tensor type {0} is not supported by this operation")]
    Unsupported(GgmlType),
    #[error("instruction set {0} is not available on this CPU")]
    IsaUnavailable(&'static str),
}
