//! The crate's one error type; variants name the file, tensor or limit at fault.

use pagoda_kernels::GgmlType;
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
    /// Writing an output file or folder failed.
    #[error("cannot write {}: {message}", path.display())]
    Write {
        path: std::path::PathBuf,
        message: String,
    },
    /// A quantization type name that is not one of the targets (the message lists them).
    #[error("unknown quantization type `{name}`{why}; choose one of: {valid}")]
    UnknownQuantType {
        name: String,
        /// Why a known GGUF type cannot be a target (empty for names that are no type at all).
        why: String,
        valid: String,
    },
    /// A weight holds NaN or infinity: quantizing it would spread the damage over its block,
    /// so the model file is refused rather than served wrong.
    #[error(
        "tensor {tensor:?} ({ty}) holds a non-finite value ({value}) at row {row}, column {col}; \
         the model file is damaged: re-download or re-convert it, or load it without --quantize"
    )]
    NonFinite {
        tensor: String,
        ty: GgmlType,
        row: usize,
        col: usize,
        value: f32,
    },
    /// A tensor whose quantized form could not be made (a shape no block type fits, a size
    /// that overflows); names the tensor and what went wrong.
    #[error("cannot quantize tensor {tensor:?} ({ty}, shape {shape:?}) to {to}: {message}")]
    Tensor {
        tensor: String,
        ty: GgmlType,
        shape: Vec<usize>,
        to: GgmlType,
        message: String,
    },

    // --- evaluation (eval/) ---
    /// A text to score for perplexity that tokenizes to fewer than two tokens (the first token
    /// has no context, so nothing could be scored).
    #[error("the text is {tokens} token(s) long; perplexity needs at least 2 tokens (is the file empty?)")]
    TextTooShort { tokens: usize },
    /// An evaluation window larger than the model can attend to.
    #[error("a window of {ctx} tokens is longer than the model's context of {context_length}; pass a smaller --ctx")]
    WindowTooLong { ctx: usize, context_length: usize },
    /// A line of a multiple-choice JSONL file that cannot be used (1-based line number).
    #[error("line {line}: {message}")]
    BadLine { line: usize, message: String },
    /// The model produced a NaN or infinite logit (broken weights or an overflow).
    #[error("the model produced a non-finite logit while scoring token {position}")]
    NonFiniteLogits { position: usize },
}
