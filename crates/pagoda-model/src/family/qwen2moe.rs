//! Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B; llama.cpp `qwen2moe`, transformers
//! `Qwen2MoeForCausalLM`): Qwen2's attention (biases on Q, K and V) with a mixture of experts
//! in place of the MLP — a softmax router over all experts, the top `num_experts_per_tok`,
//! renormalized only when the config says `norm_topk_prob` (llama.cpp never renormalizes for
//! this architecture, and the released configs say false) — plus a shared expert of its own
//! width (`shared_expert_intermediate_size`) scaled per token by a sigmoid gate.

use super::keys::{GgufKeys, HfKeys};
use super::moe::{gguf_moe, hf_moe};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, Gating, ModelConfig};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Qwen2Moe,
    display: "Qwen2-MoE",
    gguf_names: &["qwen2moe"],
    hf_classes: &["Qwen2MoeForCausalLM"],
    hf_model_types: &["qwen2_moe"],
    block: Block {
        norms: NormPlacement::Pre,
        activation: Activation::Silu,
        qk_norm: QkNorm::None,
        qkv_bias: true,
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
        head_dim: None,
    },
    gguf_varying_layers: false,
    gguf_extra: gguf,
    split_fused: None,
    hf_extra: hf,
};

fn gguf(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    gguf_moe(k, cfg, Gating::Softmax, false)
}

fn hf(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    super::qwen2::qwen_window(c, cfg)?;
    hf_moe(c, cfg, "moe_intermediate_size", Gating::Softmax)
}
