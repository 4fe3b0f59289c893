//! Qwen2 and Qwen2.5: Llama with biases on Q, K and V, NeoX RoPE, optional sliding window on
//! the layers from `max_window_layers` on.

use super::keys::HfKeys;
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, ModelConfig};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Qwen2,
    display: "Qwen2",
    gguf_names: &["qwen2"],
    hf_classes: &["Qwen2ForCausalLM"],
    hf_model_types: &["qwen2"],
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
    hf_extra: qwen_window,
};

/// Qwen's older sliding-window keys (when `layer_types` is absent): `use_sliding_window`,
/// `sliding_window`, and the layers from `max_window_layers` on slide.
pub(super) fn qwen_window(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    if c.get("layer_types").is_some() || !c.bool_opt("use_sliding_window")?.unwrap_or(false) {
        return Ok(());
    }
    if let Some(w) = c.usize_opt("sliding_window")? {
        let from = c.usize_opt("max_window_layers")?.unwrap_or(cfg.n_layers);
        cfg.sliding_window = Some(w);
        cfg.layer_is_sliding = (0..cfg.n_layers).map(|i| i >= from).collect();
    }
    Ok(())
}
