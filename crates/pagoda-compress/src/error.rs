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
