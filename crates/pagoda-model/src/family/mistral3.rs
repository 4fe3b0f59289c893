//! Ministral 3 and Mistral Small 3.x (llama.cpp `mistral3`; transformers
//! `Ministral3ForCausalLM`, or the text model inside `Mistral3ForConditionalGeneration`):
//! Llama blocks with YaRN RoPE scaling and, in Ministral 3, Llama 4's query temperature —
//! queries at position `p` are multiplied by `1 + beta · ln(1 + floor(p / original_context))`
//! (HF `rope_parameters.llama_4_scaling_beta` over `original_max_position_embeddings`; GGUF
//! `attention.temperature_scale` over `rope.scaling.original_context_length`).
//! llama.cpp's converter writes `mscale_all_dim` as `rope.scaling.yarn_log_multiplier`, from
//! which the YaRN attention factor is read (config/from_gguf.rs).

use super::keys::{hf_bad, GgufKeys, HfKeys};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, ModelConfig, QueryTemperature, RopeScaling};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Mistral3,
    display: "Mistral 3",
    gguf_names: &["mistral3"],
    hf_classes: &["Ministral3ForCausalLM", "Mistral3ForConditionalGeneration"],
    hf_model_types: &["ministral3", "mistral3"],
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
        rope_theta: 1_000_000.0,
        context_length: 262_144,
        rms_eps: 1e-5,
        tie_word_embeddings: false,
        head_dim: None,
    },
    gguf_varying_layers: false,
    gguf_extra: gguf,
    split_fused: None,
    hf_extra: hf,
};

fn temperature(beta: f32, original_context: Option<usize>) -> Result<QueryTemperature, String> {
    match original_context {
        Some(n) if n > 0 => Ok(QueryTemperature {
            beta,
            original_context: n,
        }),
        _ => Err("a query temperature needs the original context length".into()),
    }
}

fn gguf(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    if let Some(beta) = k.f32_opt("attention.temperature_scale")? {
        if beta != 0.0 {
            let orig = k.usize_opt("rope.scaling.original_context_length")?;
            cfg.query_temperature = Some(temperature(beta, orig).map_err(|m| k.bad(m))?);
        }
    }
    Ok(())
}

fn hf(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    let params = c
        .get("rope_parameters")
        .or_else(|| c.get("rope_scaling"))
        .and_then(|v| v.as_object());
    let Some(params) = params else {
        return Ok(());
    };
    let p = HfKeys(params);
    if let Some(beta) = p.f32_opt("llama_4_scaling_beta")? {
        if beta != 0.0 {
            let orig = match cfg.rope_scaling {
                RopeScaling::Yarn {
                    original_max_position,
                    ..
                } => Some(original_max_position),
                _ => p.usize_opt("original_max_position_embeddings")?,
            };
            cfg.query_temperature = Some(temperature(beta, orig).map_err(hf_bad)?);
        }
    }
    Ok(())
}
