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
//! - [`labels`] — the teacher's top-k log-probabilities, computed by Pagoda's engine, cached.
//! - [`optim`] — AdamW (checkpointable), warm-up + cosine schedule, gradient clipping.
//! - [`data`] — JSONL texts / conversations → token ids, truncated; the held-out split.
//! - [`generate`] — the teacher's continuations of prompts (sequence-level distillation).
//! - [`vocab`] — teacher and student must share a tokenizer.
//! - [`train`] — options, seeded data order, the optimiser step, held-out evaluation.
//! - [`checkpoint`] — atomic checkpoints and exact resume.
//! - [`output`] — the trained student written through pagoda-compress's writers.
//! - [`pipeline`] — `pagoda distill` end to end as one call.
//! - [`error`] — [`TrainError`].

#![deny(clippy::unwrap_used)]
// `u64::is_multiple_of` is newer than the workspace's rust-version (1.85).
#![allow(clippy::manual_is_multiple_of)]

pub mod checkpoint;
pub mod data;
pub mod error;
pub mod generate;
pub mod labels;
pub mod lora;
pub mod loss;
pub mod optim;
pub mod output;
pub mod pipeline;
pub mod student;
pub mod train;
pub mod vocab;

pub use error::{Result, TrainError};
