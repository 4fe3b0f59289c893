//! The one error type of pagoda-model. Variants name the file, tensor or key at fault, so a
//! user can tell which download is broken and what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
    #[error("{path}: tensor {tensor:?}: {message}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        message: String,
    },
    #[error("model is missing tensor {0:?}")]
    MissingTensor(String),
    #[error(
        "unsupported architecture {0:?} (Pagoda runs: {names}; docs/models.md lists the \
         families)",
        names = crate::family::gguf_names().join(", ")
    )]
    UnknownArchitecture(String),
    #[error(
        "{path}: unsupported architecture {arch:?} (Pagoda runs: {names}; docs/models.md \
         lists the families)",
        names = crate::family::gguf_names().join(", ")
    )]
    UnsupportedArchitecture { path: PathBuf, arch: String },
    #[error("{path}: tokenizer: {message}")]
    TokenizerFile { path: PathBuf, message: String },
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The device asked for cannot be used, or failed (names the device and what to do).
    #[error("{0}")]
    Device(String),
    /// A CUDA call failed (names the kernel or library call).
    #[error("GPU: {0}")]
    Gpu(#[from] pagoda_cuda::CudaError),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A template, or one render of it, crossed a limit of [`crate::chat_template`] (source
    /// size, fuel, output size): the message names the limit.
    #[error("chat template: {0}")]
    TemplateLimit(String),
    #[error("context full: {needed} positions needed but the KV cache holds {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("block table covers {covered} positions but the batch needs {needed}")]
    BlockTableTooShort { needed: usize, covered: usize },
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    #[error("token id {token} is outside the vocabulary of {vocab_size} tokens")]
    InvalidToken { token: u32, vocab_size: usize },
    #[error(transparent)]
    Kernel(#[from] pagoda_kernels::KernelError),
}
