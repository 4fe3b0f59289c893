//! [`TrainError`]: every way training can fail, each carrying what the user needs to fix it
//! (the file, the line, the option, the tensor, or both sides of a mismatch).

use std::path::PathBuf;

/// An error of pagoda-train.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A model could not be read (the model crate names the file and tensor).
    #[error(transparent)]
    Model(#[from] pagoda_model::ModelError),
    /// Writing the output model failed (the compress crate names the file).
    #[error(transparent)]
    Compress(#[from] pagoda_compress::CompressError),
    /// A tensor operation failed (a shape bug or an allocation failure).
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An option out of its range, or options that do not go together.
    #[error("{0}")]
    InvalidOption(String),
    /// A data file that cannot be used: names the file and, for a bad line, its number.
    #[error("{0}")]
    Data(String),
    /// Teacher and student do not share a tokenizer.
    #[error("{0}")]
    TokenizerMismatch(String),
    /// A model the student cannot be built from (architecture, shapes).
    #[error("{0}")]
    Unsupported(String),
    /// A label cache or checkpoint made for other inputs, or damaged.
    #[error("{0}")]
    Stale(String),
    /// Training diverged (a non-finite loss or gradient).
    #[error("{0}")]
    Diverged(String),
}

impl TrainError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.into(),
            source,
        }
    }
}

/// pagoda-train's result.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;
