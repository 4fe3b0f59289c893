//! The one integration-test binary of pagoda-model.

mod bad_files;
mod chat_templates;
mod common;
mod cuda;
mod embedding;
mod families;
mod forward_batch;
mod forward_golden;
mod ggml_vocab;
mod golden;
mod hf_quant;
mod lora;
mod lora_moe;
mod lora_serve;
mod mutations;
mod non_finite;
mod real_models;
