//! OLMoE (OLMoE-1B-7B; llama.cpp `olmoe`, transformers `OlmoeForCausalLM`): Llama's block with
//! QK-norm over the whole Q and K projections (not per head) and a mixture of experts in
//! place of the MLP: a softmax router over all experts, the top `num_experts_per_tok` with
//! their softmax weights as they are (`norm_topk_prob` false; llama.cpp never renormalizes
//! for this architecture). The expert width is `intermediate_size` (GGUF
//! `feed_forward_length`). `clip_qkv` is refused.

use super::keys::{hf_bad, GgufKeys, HfKeys};
use super::moe::{gguf_moe, hf_moe};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, Gating, ModelConfig};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Olmoe,
    display: "OLMoE",
    gguf_names: &["olmoe"],
    hf_classes: &["OlmoeForCausalLM"],
    hf_model_types: &["olmoe"],
    block: Block {
        norms: NormPlacement::Pre,
        activation: Activation::Silu,
        qk_norm: QkNorm::Whole,
        qkv_bias: false,
        v_norm: false,
        v_defaults_to_k: false,
    },
    gguf_rope_style: RopeStyle::Neox,
    hf_norm_offset: 0.0,
    gguf_rope_freqs: false,
    gguf_rms_eps: 1e-5,
    hf_defaults: HfDefaults {
        rope_theta: 10_000.0,
        context_length: 4096,
        rms_eps: 1e-5,
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
    if c.f32_opt("clip_qkv")?.is_some() {
        return Err(hf_bad(
            "clip_qkv (clamping Q, K and V) is not supported".into(),
        ));
    }
    hf_moe(c, cfg, "intermediate_size", Gating::Softmax)?;
    // llama.cpp never renormalizes OLMoE's weights; transformers follows the flag.
    Ok(())
}
