//! Llama (1-3.x), Mistral 7B-style and SmolLM 1/2: GQA, RoPE, RMSNorm before attention and
//! MLP, SwiGLU. Llama 3.1+ RoPE scaling comes as HF `rope_scaling.rope_type = "llama3"` or,
//! in GGUF, as the `rope_freqs.weight` tensor (read by the forward pass when present).

use super::keys::HfKeys;
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, ModelConfig};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Llama,
    display: "Llama",
    gguf_names: &["llama", "mistral"],
    hf_classes: &["LlamaForCausalLM", "MistralForCausalLM"],
    hf_model_types: &["llama", "mistral", "smollm"],
    block: Block {
        norms: NormPlacement::Pre,
        activation: Activation::Silu,
        qk_norm: QkNorm::None,
        qkv_bias: false,
        v_norm: false,
        v_defaults_to_k: false,
    },
    gguf_rope_style: RopeStyle::Interleaved,
    hf_norm_offset: 0.0,
    gguf_rope_freqs: true,
    gguf_rms_eps: 1e-5,
    hf_defaults: HfDefaults {
        rope_theta: 10_000.0,
        context_length: 2048,
        rms_eps: 1e-6,
        tie_word_embeddings: false,
        head_dim: None,
    },
    gguf_varying_layers: false,
    gguf_extra: super::spec::nothing_gguf,
    split_fused: None,
    hf_extra: mistral_window,
};

/// Mistral-style configs: a window (when set and shorter than the context) applies to every
/// layer.
fn mistral_window(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    if let Some(w) = c.usize_opt("sliding_window")? {
        if w < cfg.context_length && c.get("layer_types").is_none() {
            cfg.sliding_window = Some(w);
            cfg.layer_is_sliding = vec![true; cfg.n_layers];
        }
    }
    Ok(())
}
