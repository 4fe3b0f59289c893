//! Phi-3, Phi-3.5 and Phi-4-mini (llama.cpp `phi3`, transformers `Phi3ForCausalLM`): Llama
//! blocks whose files fuse Q/K/V into one projection (`attn_qkv`, HF `qkv_proj`) and gate and
//! up into one (`ffn_up` of twice the FFN width, gate first; HF `gate_up_proj`), split here
//! into views of the same bytes when a model is opened; partial rotary (Phi-4-mini rotates
//! 3/4 of each head); LongRoPE for their 128k contexts (HF `rope_scaling.long_factor` /
//! `short_factor`, GGUF tensors `rope_factors_long` / `rope_factors_short` and
//! `rope.scaling.attn_factor`). Sliding windows in Phi configs are ignored, as llama.cpp
//! does ("Phi SWA is currently disabled").

use super::keys::{GgufKeys, HfKeys};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, ModelConfig, RopeScaling};
use crate::weights::Weights;
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Phi3,
    display: "Phi-3",
    gguf_names: &["phi3"],
    hf_classes: &["Phi3ForCausalLM"],
    hf_model_types: &["phi3"],
    block: Block {
        norms: NormPlacement::Pre,
        activation: Activation::Silu,
        qk_norm: QkNorm::None,
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
    split_fused: Some(split_fused),
    hf_extra: hf,
};

const LONG: &str = "rope_factors_long.weight";
const SHORT: &str = "rope_factors_short.weight";

fn gguf(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    cfg.sliding_window = None;
    cfg.layer_is_sliding = vec![false; cfg.n_layers];
    if k.file.tensor(LONG).is_none() {
        return Ok(());
    }
    let weights = Weights::from_gguf(k.file)?;
    let factors = |name: &str| -> Result<Vec<f32>, ModelError> {
        weights
            .get(name)?
            .to_f32()
            .map_err(|e| k.bad(format!("{name}: {e}")))
    };
    let original_max_position = k
        .usize_opt("rope.scaling.original_context_length")?
        .ok_or_else(|| {
            k.bad(format!(
                "LongRoPE factors without {}",
                k.key("rope.scaling.original_context_length")
            ))
        })?;
    cfg.rope_scaling = RopeScaling::LongRope {
        long_factor: factors(LONG)?,
        short_factor: factors(SHORT)?,
        original_max_position,
        attention_factor: k.f32_opt("rope.scaling.attn_factor")?.unwrap_or(1.0),
    };
    Ok(())
}

fn hf(_: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    cfg.sliding_window = None;
    cfg.layer_is_sliding = vec![false; cfg.n_layers];
    Ok(())
}

/// Splits each layer's fused projections into the canonical tensors.
fn split_fused(cfg: &ModelConfig, w: &mut Weights) -> Result<(), ModelError> {
    let q_dim = cfg.n_heads * cfg.head_dim;
    let kv_dim = cfg.n_kv_heads * cfg.head_dim;
    let bad =
        |tensor: &str, message: String| ModelError::InvalidConfig(format!("{tensor}: {message}"));
    for i in 0..cfg.n_layers {
        let qkv = format!("blk.{i}.attn_qkv.weight");
        if let Some(t) = w.remove(&qkv) {
            if t.rows() != q_dim + 2 * kv_dim {
                return Err(bad(
                    &qkv,
                    format!(
                        "{} rows, but Q, K and V need {q_dim} + {kv_dim} + {kv_dim}",
                        t.rows()
                    ),
                ));
            }
            let parts = [
                ("attn_q", 0..q_dim),
                ("attn_k", q_dim..q_dim + kv_dim),
                ("attn_v", q_dim + kv_dim..q_dim + 2 * kv_dim),
            ];
            for (part, rows) in parts {
                let view = t
                    .row_range(format!("blk.{i}.{part}.weight"), rows)
                    .map_err(|m| bad(&qkv, m))?;
                w.insert(view).map_err(|m| bad(&qkv, m))?;
            }
        }
        let up = format!("blk.{i}.ffn_up.weight");
        if !w.contains(&format!("blk.{i}.ffn_gate.weight")) {
            if let Some(t) = w.remove(&up) {
                let f = cfg.ffn_dim;
                if t.rows() != 2 * f {
                    return Err(bad(
                        &up,
                        format!("{} rows, but fused gate and up need 2 × {f}", t.rows()),
                    ));
                }
                for (part, rows) in [("ffn_gate", 0..f), ("ffn_up", f..2 * f)] {
                    let view = t
                        .row_range(format!("blk.{i}.{part}.weight"), rows)
                        .map_err(|m| bad(&up, m))?;
                    w.insert(view).map_err(|m| bad(&up, m))?;
                }
            }
        }
    }
    Ok(())
}
