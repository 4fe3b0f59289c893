//! pagoda-model: model files and architectures.
//!
//! Owns reading GGUF files and Hugging Face folders (safetensors, config.json, tokenizer files)
//! by mmap, turning them into a [`ModelConfig`], borrowed weight views, a tokenizer and a chat
//! template, and the forward passes of the supported architectures over pagoda-kernels.
//!
//! Architecture Invariant: pagoda-model knows nothing of scheduling or sampling; a forward pass
//! maps token ids at positions to logits, given a KV cache it does not own the policy of.

#![deny(clippy::unwrap_used)]
// `usize::is_multiple_of` is newer than the workspace's rust-version (1.85).
#![allow(clippy::manual_is_multiple_of)]

pub mod arch;
pub mod chat_template;
pub mod config;
pub mod device;
pub mod embedding;
pub mod error;
pub mod family;
pub mod gguf;
pub mod hf;
pub mod hf_mxfp4;
pub mod hf_quant;
pub mod isolated;
pub mod kv_cache;
pub mod lora;
pub mod observer;
pub mod placement;
pub mod recurrent_state;
pub mod rope_order;
pub mod safetensors;
pub mod source;
pub mod template_check;
pub mod template_sandbox;
pub mod tokenizer;
pub mod validate;
pub mod weights;

pub use arch::{BatchSegment, Logits, Model};
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use device::{Device, DeviceChoice};
pub use embedding::{Embedded, EmbeddingModel};
pub use error::ModelError;
pub use kv_cache::{KvCache, KvDtype, PagedKvCache};
pub use observer::LinearObserver;
pub use source::{open_model, ModelFormat, ModelSource};
pub use validate::{validate_model, Validated};
