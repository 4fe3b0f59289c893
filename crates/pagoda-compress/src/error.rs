//! The crate's one error type; variants name the file, tensor or limit at fault.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CompressError {
    #[error(transparent)]
    Model(#[from] pagoda_model::ModelError),
    #[error(transparent)]
    Kernel(#[from] pagoda_kernels::KernelError),
    /// Input the user supplied (a file, a flag value) that cannot be used; the message says
    /// what to do instead.
    #[error("{0}")]
    InvalidInput(String),
}
