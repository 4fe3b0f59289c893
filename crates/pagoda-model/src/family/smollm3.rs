//! SmolLM3: Llama whose every fourth layer has no position encoding (NoPE): llama.cpp
//! `smollm3` hard-codes the step of 4 (layer `i` rotates iff `(i + 1) % 4 != 0`);
//! transformers reads `no_rope_layers` (1 = rotate) or builds it from
//! `no_rope_layer_interval`.

use super::keys::{hf_bad, GgufKeys, HfKeys};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, ModelConfig};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;
use serde_json::Value;

/// llama.cpp's `n_no_rope_layer_step` for SmolLM3.
const NO_ROPE_STEP: usize = 4;

pub(super) static SPEC: Family = Family {
    arch: Architecture::SmolLM3,
    display: "SmolLM3",
    gguf_names: &["smollm3"],
    hf_classes: &["SmolLM3ForCausalLM"],
    hf_model_types: &["smollm3"],
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
    gguf_rope_freqs: false,
    gguf_rms_eps: 1e-6,
    hf_defaults: HfDefaults {
        rope_theta: 2_000_000.0,
        context_length: 32_768,
        rms_eps: 1e-6,
        tie_word_embeddings: true,
        head_dim: None,
    },
    gguf_varying_layers: false,
    gguf_extra: gguf_no_rope,
    split_fused: None,
    hf_extra: hf_no_rope,
};

fn every(n_layers: usize, step: usize) -> Vec<bool> {
    (0..n_layers).map(|i| (i + 1) % step != 0).collect()
}

fn gguf_no_rope(_: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    cfg.layer_uses_rope = every(cfg.n_layers, NO_ROPE_STEP);
    Ok(())
}

fn hf_no_rope(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    cfg.layer_uses_rope = match c.get("no_rope_layers") {
        Some(Value::Array(flags)) => {
            if flags.len() != cfg.n_layers {
                return Err(hf_bad(format!(
                    "no_rope_layers has {} entries for {} layers",
                    flags.len(),
                    cfg.n_layers
                )));
            }
            flags
                .iter()
                .map(|f| match f.as_u64() {
                    Some(0) => Ok(false),
                    Some(1) => Ok(true),
                    _ => Err(hf_bad(format!("no_rope_layers entry {f} is not 0 or 1"))),
                })
                .collect::<Result<_, _>>()?
        }
        Some(other) => {
            return Err(hf_bad(format!(
                "no_rope_layers should be a list, got {other}"
            )))
        }
        None => {
            let step = c
                .usize_opt("no_rope_layer_interval")?
                .unwrap_or(NO_ROPE_STEP);
            if step == 0 {
                return Err(hf_bad("no_rope_layer_interval is 0".into()));
            }
            every(cfg.n_layers, step)
        }
    };
    Ok(())
}
