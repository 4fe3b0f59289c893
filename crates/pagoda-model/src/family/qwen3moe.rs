//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B; llama.cpp `qwen3moe`,
//! transformers `Qwen3MoeForCausalLM`): Qwen3's attention (per-head QK-norm, no biases, its
//! own `head_dim`) with a mixture of experts in place of the MLP: a softmax router over all
//! experts, the top `num_experts_per_tok`, their weights renormalized to sum to 1
//! (`norm_topk_prob`; llama.cpp always renormalizes for this architecture).

use super::keys::{GgufKeys, HfKeys};
use super::moe::{gguf_moe, hf_moe};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, Gating, ModelConfig};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Qwen3Moe,
    display: "Qwen3-MoE",
    gguf_names: &["qwen3moe"],
    hf_classes: &["Qwen3MoeForCausalLM"],
    hf_model_types: &["qwen3_moe"],
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
    gguf_extra: gguf,
    split_fused: None,
    hf_extra: hf,
};

fn gguf(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    gguf_moe(k, cfg, Gating::Softmax, true)
}

fn hf(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    super::qwen2::qwen_window(c, cfg)?;
    hf_moe(c, cfg, "moe_intermediate_size", Gating::Softmax)
}
