//! Qwen3 dense (0.6B-32B): Qwen2 without the Q/K/V biases and with a per-head RMSNorm of Q
//! and K before RoPE (llama.cpp `qwen3`, transformers `Qwen3ForCausalLM`). `head_dim` is its
//! own key (128 unless said), not `hidden_size / num_attention_heads`.

use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::Architecture;
use pagoda_kernels::ops::RopeStyle;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Qwen3,
    display: "Qwen3",
    gguf_names: &["qwen3"],
    hf_classes: &["Qwen3ForCausalLM"],
    hf_model_types: &["qwen3"],
    block: Block {
        norms: NormPlacement::Pre,
        activation: Activation::Silu,
        qk_norm: QkNorm::PerHead,
        qkv_bias: false,
        v_norm: false,
        v_defaults_to_k: false,
    },
    gguf_rope_style: RopeStyle::Neox,
    hf_norm_offset: 0.0,
    gguf_rope_freqs: false,
    gguf_rms_eps: 1e-6,
    hf_defaults: HfDefaults {
        rope_theta: 10_000.0,
        context_length: 32_768,
        rms_eps: 1e-6,
        tie_word_embeddings: false,
        head_dim: Some(128),
    },
    gguf_varying_layers: false,
    gguf_extra: super::spec::nothing_gguf,
    split_fused: None,
    hf_extra: super::qwen2::qwen_window,
};
