//! Granite 4.0-H dense (IBM Granite 4.0-H-Micro / -1B / -350M; llama.cpp `granitehybrid`,
//! transformers `GraniteMoeHybridForCausalLM`, `model_type` `granitemoehybrid`): a hybrid whose
//! layers mix tokens either by Mamba-2 (`arch::mamba2`) or by attention without position
//! encoding, each followed by the dense "shared" SwiGLU MLP; pre-norms.
//!
//! Granite's four multipliers: the embeddings times `embedding_multiplier`, q·k times
//! `attention_multiplier` (in place of `1/sqrt(head_dim)`), each block's output times
//! `residual_multiplier` before its residual add, the logits divided by `logits_scaling`
//! (GGUF `embedding_scale`, `attention.scale`, `residual_scale`, `logit_scale`; 0 or absent:
//! none, as llama.cpp reads them; HF's absent keys default to 1 as transformers' config).
//!
//! Position encoding: HF rotates only when `position_embedding_type` is `"rope"` (the
//! released hybrids say `"nope"`); GGUF rotates unless `rope.scaling.finetuned` is false,
//! which is how llama.cpp's converter and loader switch RoPE off for this architecture.
//!
//! Files: GGUF marks the Mamba-2 layers with `head_count_kv` 0 in its per-layer array and
//! gives their shape as `ssm.{conv_kernel, state_size, group_count, inner_size,
//! time_step_rank}`; HF lists `layer_types` (`mamba` / `attention`) and `mamba_*` keys.
//! The variants with routed experts (`num_local_experts` > 0, GGUF `expert_count` > 0:
//! Granite 4.0-H-Tiny / -Small) are refused by name. [`prepare`] gives HF's names
//! (`mamba.*`, `shared_mlp.*`) the canonical ones, splits `shared_mlp.input_linear` into
//! `ffn_gate` (first half of its rows) and `ffn_up` (second half), and reads both files'
//! convolution as `[channels, taps]`.

use super::keys::{hf_bad, GgufKeys, HfKeys};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, HybridConfig, Mamba2Config, Mixer, ModelConfig};
use crate::weights::Weights;
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;
use serde_json::Value;

pub(super) static SPEC: Family = Family {
    arch: Architecture::GraniteHybrid,
    display: "Granite 4.0-H",
    gguf_names: &["granitehybrid"],
    hf_classes: &["GraniteMoeHybridForCausalLM"],
    hf_model_types: &["granitemoehybrid"],
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
    gguf_rms_eps: 1e-5,
    hf_defaults: HfDefaults {
        rope_theta: 10_000.0,
        context_length: 2048,
        rms_eps: 1e-6,
        tie_word_embeddings: false,
        head_dim: None,
    },
    gguf_varying_layers: true,
    gguf_extra: gguf,
    split_fused: Some(prepare),
    hf_extra: hf,
};

const EXPERTS_REFUSED: &str = "Granite 4.0-H with routed experts (Tiny, Small) is not \
                               supported yet; the dense variants (Micro, 1B, 350M) are";

/// A multiplier as llama.cpp reads it: 0 (or absent) means none.
fn multiplier(v: Option<f32>) -> Option<f32> {
    v.filter(|&s| s != 0.0 && s != 1.0)
}

/// The hybrid config of `mixers`, `None` when every layer attends (Granite 4.0-Micro's
/// layout under this class).
fn hybrid(mixers: Vec<Mixer>, conv_kernel: usize, m: Mamba2Config) -> Option<HybridConfig> {
    mixers.contains(&Mixer::Mamba2).then_some(HybridConfig {
        mixers,
        conv_kernel,
        mamba2: Some(m),
        delta_net: None,
    })
}

fn gguf(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    if k.usize_opt("expert_count")?.is_some_and(|n| n > 0) {
        return Err(k.bad(format!(
            "{} is set: {EXPERTS_REFUSED}",
            k.key("expert_count")
        )));
    }
    cfg.embedding_scale = multiplier(k.f32_opt("embedding_scale")?);
    cfg.residual_scale = multiplier(k.f32_opt("residual_scale")?);
    cfg.logit_scale = multiplier(k.f32_opt("logit_scale")?);
    if let Some(s) = k.f32_opt("attention.scale")?.filter(|&s| s != 0.0) {
        cfg.attention_scale = s;
    }
    if k.bool_opt("rope.scaling.finetuned")? == Some(false) {
        cfg.layer_uses_rope = vec![false; cfg.n_layers];
    }
    let mixers = k.mixers_from_kv_heads(cfg, Mixer::Mamba2)?;
    if !mixers.contains(&Mixer::Mamba2) {
        return Ok(());
    }
    let need = |name: &str| {
        k.usize_opt(name)?
            .ok_or_else(|| k.bad(format!("{} is missing", k.key(name))))
    };
    let n_heads = need("ssm.time_step_rank")?;
    let inner = need("ssm.inner_size")?;
    if n_heads == 0 || inner % n_heads != 0 {
        return Err(k.bad(format!(
            "{} = {inner} is not a multiple of {} = {n_heads}",
            k.key("ssm.inner_size"),
            k.key("ssm.time_step_rank")
        )));
    }
    let m = Mamba2Config {
        n_heads,
        head_dim: inner / n_heads,
        state_dim: need("ssm.state_size")?,
        n_groups: need("ssm.group_count")?,
        // llama.cpp clamps no time step.
        dt_limit: (0.0, f32::INFINITY),
    };
    cfg.hybrid = hybrid(mixers, need("ssm.conv_kernel")?, m);
    Ok(())
}

/// A number of `config.json` that may be written as transformers 5 serializes non-finite
/// floats (`{"__float__": "Infinity"}`) or as a string.
fn json_number(v: &Value) -> Option<f32> {
    let text = match v {
        Value::Number(n) => return n.as_f64().map(|x| x as f32),
        Value::Object(o) => o.get("__float__")?.as_str()?,
        Value::String(s) => s,
        _ => return None,
    };
    match text.trim().to_ascii_lowercase().as_str() {
        "infinity" | "inf" | "+infinity" | "+inf" => Some(f32::INFINITY),
        "-infinity" | "-inf" => Some(f32::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

/// `time_step_limit` (`[lo, hi]`), `(0, inf)` when absent.
fn dt_limit(c: &HfKeys<'_>) -> Result<(f32, f32), ModelError> {
    let Some(v) = c.get("time_step_limit") else {
        return Ok((0.0, f32::INFINITY));
    };
    match v
        .as_array()
        .map(|a| a.iter().map(json_number).collect::<Vec<_>>())
    {
        Some(limits) => match limits[..] {
            [Some(lo), Some(hi)] if lo <= hi => Ok((lo, hi)),
            _ => Err(hf_bad(format!(
                "time_step_limit should be two increasing numbers, got {v}"
            ))),
        },
        None => Err(hf_bad(format!("time_step_limit should be a list, got {v}"))),
    }
}

fn hf(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    // transformers' default is 8 experts: only an explicit 0 is the dense model.
    if c.usize_opt("num_local_experts")? != Some(0) {
        return Err(hf_bad(format!(
            "num_local_experts is not 0: {EXPERTS_REFUSED}"
        )));
    }
    for key in ["attention_bias", "mamba_proj_bias"] {
        if c.bool_opt(key)? == Some(true) {
            return Err(hf_bad(format!(
                "{key} true is not supported (Granite 4.0-H's released models have no such \
                 biases)"
            )));
        }
    }
    // The dense MLP is transformers' `shared_mlp`, sized by this key (default 1024).
    cfg.ffn_dim = c.usize_opt("shared_intermediate_size")?.unwrap_or(1024);
    if cfg.ffn_dim == 0 {
        return Err(hf_bad("shared_intermediate_size is 0".into()));
    }
    let scale = |k: &str| -> Result<f32, ModelError> { Ok(c.f32_opt(k)?.unwrap_or(1.0)) };
    cfg.embedding_scale = multiplier(Some(scale("embedding_multiplier")?));
    cfg.residual_scale = multiplier(Some(scale("residual_multiplier")?));
    cfg.logit_scale = multiplier(Some(scale("logits_scaling")?));
    cfg.attention_scale = scale("attention_multiplier")?;
    if cfg.logit_scale == Some(0.0) {
        return Err(hf_bad("logits_scaling is 0".into()));
    }
    let rope = c.str_opt("position_embedding_type") == Some("rope");
    cfg.layer_uses_rope = vec![rope; cfg.n_layers];
    let mixers = match c.get("layer_types") {
        // transformers: every layer Mamba-2 when the config does not say.
        None => vec![Mixer::Mamba2; cfg.n_layers],
        Some(Value::Array(types)) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("mamba") => Ok(Mixer::Mamba2),
                Some("attention") => Ok(Mixer::Attention),
                _ => Err(hf_bad(format!(
                    "layer type {t} is not one of \"mamba\", \"attention\""
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => return Err(hf_bad(format!("layer_types should be a list, got {other}"))),
    };
    let n_heads = c.usize_opt("mamba_n_heads")?.unwrap_or(128);
    let expand = c.usize_opt("mamba_expand")?.unwrap_or(2);
    let inner = expand * cfg.hidden_size;
    let head_dim = match c.get("mamba_d_head") {
        None => None,
        Some(Value::String(s)) if s == "auto" => None,
        Some(_) => c.usize_opt("mamba_d_head")?,
    };
    let head_dim = match head_dim {
        Some(d) => d,
        None if n_heads > 0 && inner % n_heads == 0 => inner / n_heads,
        None => {
            return Err(hf_bad(format!(
                "mamba_n_heads {n_heads} does not divide mamba_expand × hidden_size = {inner}"
            )))
        }
    };
    if head_dim * n_heads != inner {
        return Err(hf_bad(format!(
            "mamba_n_heads × mamba_d_head = {} differs from mamba_expand × hidden_size = {inner}",
            head_dim * n_heads
        )));
    }
    let m = Mamba2Config {
        n_heads,
        head_dim,
        state_dim: c.usize_opt("mamba_d_state")?.unwrap_or(256),
        n_groups: c.usize_opt("mamba_n_groups")?.unwrap_or(1),
        dt_limit: dt_limit(c)?,
    };
    let conv_kernel = c.usize_opt("mamba_d_conv")?.unwrap_or(4);
    cfg.hybrid = hybrid(mixers, conv_kernel, m);
    Ok(())
}

/// Renames `from` to `to` when present (the bytes stay where they are).
fn rename(w: &mut Weights, from: &str, to: &str) -> Result<(), ModelError> {
    if let Some(mut t) = w.remove(from) {
        t.name = to.to_string();
        insert(w, t)?;
    }
    Ok(())
}

fn insert(w: &mut Weights, t: crate::weights::TensorView) -> Result<(), ModelError> {
    let tensor = t.name.clone();
    w.insert(t).map_err(|message| ModelError::Tensor {
        path: Default::default(),
        tensor,
        message,
    })
}

/// Canonical names for HF's tensors; `shared_mlp.input_linear` split into gate and up; the
/// convolution as `[channels, taps]`.
fn prepare(cfg: &ModelConfig, w: &mut Weights) -> Result<(), ModelError> {
    for i in 0..cfg.n_layers {
        for (from, to) in [
            ("mamba.in_proj.weight", "ssm_in.weight"),
            ("mamba.in_proj.bias", "ssm_in.bias"),
            ("mamba.conv1d.weight", "ssm_conv1d.weight"),
            ("mamba.conv1d.bias", "ssm_conv1d.bias"),
            ("mamba.dt_bias", "ssm_dt.bias"),
            ("mamba.A_log", "ssm_a_log"),
            ("mamba.D", "ssm_d"),
            ("mamba.norm.weight", "ssm_norm.weight"),
            ("mamba.out_proj.weight", "ssm_out.weight"),
            ("mamba.out_proj.bias", "ssm_out.bias"),
            ("shared_mlp.output_linear.weight", "ffn_down.weight"),
        ] {
            rename(w, &format!("blk.{i}.{from}"), &format!("blk.{i}.{to}"))?;
        }
        let fused = format!("blk.{i}.shared_mlp.input_linear.weight");
        if let Some(t) = w.remove(&fused) {
            let f = cfg.ffn_dim;
            if t.rows() != 2 * f {
                return Err(ModelError::Tensor {
                    path: Default::default(),
                    tensor: fused,
                    message: format!("{} rows, but gate and up need 2 × {f}", t.rows()),
                });
            }
            for (part, rows) in [("ffn_gate", 0..f), ("ffn_up", f..2 * f)] {
                let view = t
                    .row_range(format!("blk.{i}.{part}.weight"), rows)
                    .map_err(|message| ModelError::Tensor {
                        path: Default::default(),
                        tensor: fused.clone(),
                        message,
                    })?;
                insert(w, view)?;
            }
        }
        let conv = format!("blk.{i}.ssm_conv1d.weight");
        if let Some(mut t) = w.remove(&conv) {
            if let [c, 1, k] = t.shape[..] {
                t.shape = vec![c, k];
            }
            insert(w, t)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transformers_non_finite_floats_are_numbers() {
        let v: Value = serde_json::json!([0.0, {"__float__": "Infinity"}]);
        let got: Vec<_> = v.as_array().unwrap().iter().map(json_number).collect();
        assert_eq!(got, vec![Some(0.0), Some(f32::INFINITY)]);
        assert_eq!(
            json_number(&serde_json::json!("-inf")),
            Some(f32::NEG_INFINITY)
        );
        assert_eq!(json_number(&serde_json::json!({"x": 1})), None);
    }
}
