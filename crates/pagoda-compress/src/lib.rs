//! Making models cheaper and measuring what it costs: quantization of weights (at load time
//! and offline), merging LoRA adapters into their base, and evaluation of a model's accuracy
//! (perplexity, multiple choice, ...).
//!
//! Depends on pagoda-model (files, weights, forward passes) and pagoda-kernels (block formats);
//! knows nothing of scheduling or serving.
//!
//! - [`quantize`] — weight quantization: target formats, round-to-nearest over a whole model.
//! - [`prune`] — unstructured and N:M pruning (magnitude, Wanda, SparseGPT), calibrated as
//!   quantization is.
//! - [`merge`] — a PEFT LoRA adapter merged into a base model, written as GGUF or an HF folder.
//! - [`eval`] — accuracy evaluation of a loaded model.

#![deny(clippy::unwrap_used)]
pub mod error;
pub mod eval;
pub mod merge;
pub mod prune;
pub mod quantize;

pub use error::CompressError;
