//! Gemma 3: GeGLU, per-head QK-norm, RMSNorm before and after attention and MLP
//! ("sandwich"), embeddings scaled by `sqrt(hidden)`, most layers attending within a sliding
//! window with a local RoPE base and every few a global layer.
//!
//! Findings that fix constants here:
//! - Norms: `convert_hf_to_gguf.py` (`Gemma3Model.modify_tensors`) adds 1.0 to every
//!   `*norm.weight`, so GGUF norm weights are already `1 + w` (offset 0.0) while HF folders
//!   store `w` (offset 1.0). The real gemma-3-270m Q4_K_M file agrees: its
//!   `blk.0.ffn_norm.weight` has minimum exactly 0.0 and `output_norm.weight` mean 26.
//! - Attention scale: llama.cpp uses `1/sqrt(key_length)` except for the 27B model (62
//!   layers), which uses `1/sqrt(hidden / n_heads)` (its `query_pre_attn_scalar`); HF reads
//!   `query_pre_attn_scalar`.
//! - Sliding layers: llama.cpp hard-codes a pattern of 6 (layer `i` is global iff
//!   `(i + 1) % 6 == 0`) unless `gemma3.attention.sliding_window_pattern` says otherwise, and a
//!   local RoPE base of 10 000.

use super::keys::{hf_bad, GgufKeys, HfKeys};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{sliding_pattern, Architecture, ModelConfig};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Gemma3,
    display: "Gemma 3",
    gguf_names: &["gemma3"],
    hf_classes: &["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"],
    hf_model_types: &["gemma3_text", "gemma3"],
    block: Block {
        norms: NormPlacement::Sandwich,
        activation: Activation::GeluTanh,
        qk_norm: QkNorm::PerHead,
        qkv_bias: false,
        v_norm: false,
        v_defaults_to_k: false,
    },
    gguf_rope_style: RopeStyle::Neox,
    hf_norm_offset: 1.0,
    gguf_rope_freqs: false,
    gguf_rms_eps: 1e-6,
    hf_defaults: HfDefaults {
        rope_theta: 1_000_000.0,
        context_length: 131_072,
        rms_eps: 1e-6,
        tie_word_embeddings: true,
        head_dim: None,
    },
    gguf_varying_layers: false,
    gguf_extra: gguf,
    split_fused: None,
    hf_extra: hf,
};

/// llama.cpp's default layer pattern and local RoPE base.
const PATTERN: usize = 6;
const LOCAL_THETA: f32 = 10_000.0;

fn gguf(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    let n_layers = cfg.n_layers;
    cfg.sliding_window = k.usize_opt("attention.sliding_window")?;
    cfg.layer_is_sliding = if k.is_array("attention.sliding_window_pattern") {
        k.layer_flags("attention.sliding_window_pattern", n_layers)?
    } else if k.has("attention.sliding_window_pattern") {
        sliding_pattern(n_layers, k.usize("attention.sliding_window_pattern")?)
    } else {
        sliding_pattern(n_layers, PATTERN)
    };
    if cfg.sliding_window.is_none() {
        cfg.layer_is_sliding = vec![false; n_layers];
    }
    cfg.rope_theta_local = Some(k.f32_opt("rope.freq_base_swa")?.unwrap_or(LOCAL_THETA));
    let q_scalar = if n_layers == 62 {
        cfg.hidden_size / cfg.n_heads
    } else {
        cfg.head_dim
    };
    cfg.attention_scale = 1.0 / (q_scalar as f32).sqrt();
    cfg.embedding_scale = Some((cfg.hidden_size as f32).sqrt());
    cfg.attn_logit_softcap = k.f32_opt("attn_logit_softcapping")?;
    cfg.final_logit_softcap = k.f32_opt("final_logit_softcapping")?;
    Ok(())
}

fn hf(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    cfg.sliding_window = Some(c.usize_opt("sliding_window")?.unwrap_or(4096));
    if c.get("layer_types").is_none() {
        cfg.layer_is_sliding = sliding_pattern(
            cfg.n_layers,
            c.usize_opt("sliding_window_pattern")?.unwrap_or(PATTERN),
        );
    }
    if cfg.rope_theta_local.is_none() {
        cfg.rope_theta_local = Some(c.f32_opt("rope_local_base_freq")?.unwrap_or(LOCAL_THETA));
    }
    let q = c.f32_opt("query_pre_attn_scalar")?.unwrap_or(256.0);
    if q <= 0.0 {
        return Err(hf_bad(format!(
            "query_pre_attn_scalar {q} must be positive"
        )));
    }
    cfg.attention_scale = 1.0 / q.sqrt();
    cfg.embedding_scale = Some((cfg.hidden_size as f32).sqrt());
    cfg.final_logit_softcap = c.f32_opt("final_logit_softcapping")?;
    cfg.attn_logit_softcap = c.f32_opt("attn_logit_softcapping")?;
    Ok(())
}
