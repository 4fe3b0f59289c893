//! Integration tests of pagoda-train, one binary: the student against Pagoda's own forward
//! pass, one training step against PyTorch (golden), and distillation end to end on the tiny
//! golden models (loss decreases, determinism, resume, bad input).

mod common;
mod distill;
mod golden_step;
mod student_logits;
