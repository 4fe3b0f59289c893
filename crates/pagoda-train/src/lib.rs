//! pagoda-train: everything trainable in Pagoda — knowledge distillation of a student model
//! on a teacher's soft labels, on the CPU, with candle's autodiff.
//!
//! Kept apart from the serving crates so candle's compile cost stays out of them. Depends on
//! pagoda-model (files, tokenizer, the teacher's forward pass) and pagoda-compress (the
//! model writers and the LoRA merge).
//!
//! - [`student`] — the differentiable Llama/Qwen2 decoder built from a loaded model.
//! - [`lora`] — LoRA pairs and their export as a PEFT adapter.
//! - [`loss`] — forward / reverse / skew KL on the teacher's top-k, mixed with hard-label CE.
//! - [`optim`] — AdamW (checkpointable), warm-up + cosine schedule, gradient clipping.
//! - [`error`] — [`TrainError`].

#![deny(clippy::unwrap_used)]

pub mod error;
pub mod lora;
pub mod loss;
pub mod optim;
pub mod student;

pub use error::{Result, TrainError};
