//! Qwen3.5 dense (0.8B … 27B; llama.cpp `qwen35`, transformers `Qwen3_5ForCausalLM` and the
//! text model of `Qwen3_5ForConditionalGeneration`): a hybrid whose layers mix tokens by a
//! gated DeltaNet (three of every four: `arch::gated_delta_net`) or by gated attention (the
//! fourth), each followed by a SwiGLU MLP; pre-norms.
//!
//! Gated attention: `q_proj` gives, per head, `head_dim` query rows then `head_dim` output
//! gate rows (both files); [`prepare`] splits them into `attn_q` and `attn_gate_q`
//! (copies: the rows interleave), and the attention's output is multiplied by
//! `sigmoid(gate)` before `o_proj`. QK-norm per head; RoPE on the first
//! `partial_rotary_factor` of each head (0.25 unless said) in NeoX halves — the multimodal
//! RoPE sections of the files rotate text positions the same in every section.
//!
//! Norms: every RMSNorm scales by `1 + w` (HF stores `w`: the family's `hf_norm_offset`;
//! GGUF stores `1 + w`), except the DeltaNet's gated output norm (`ssm_norm`), which scales by
//! `w` in both files and is read without the offset.
//!
//! Files: GGUF names the recurrent layers (`attention.recurrent_layers`, else every layer but
//! each `full_attention_interval`-th), gives the DeltaNet shape as `ssm.*` keys, stores
//! `ssm_a = -exp(A_log)`, tiles the value heads (see [`DeltaNetConfig::tiled_value_heads`])
//! and calls the MLP's pre-norm `post_attention_norm`; HF lists `layer_types` and
//! `linear_*` keys and keeps `A_log`. [`prepare`] gives HF's `linear_attn.*` the GGUF names
//! (`A_log` as `ssm_a_log`). Multi-token-prediction layers (GGUF `nextn_predict_layers`, HF
//! `mtp.*`) are not run.
//!
//! Qwen3.5-MoE (35B-A3B, 122B-A10B …; llama.cpp `qwen35moe`, transformers
//! `Qwen3_5MoeForCausalLM`, [`MOE_SPEC`]): the same layers with every MLP a mixture of
//! experts — a softmax router over all experts, the top `num_experts_per_tok` always
//! renormalized (the family has no `norm_topk_prob` switch; llama.cpp renormalizes too) —
//! plus a shared expert scaled per token by `sigmoid(shared_expert_gate · x)`. HF folders
//! fuse each layer's experts (`mlp.experts.gate_up_proj` `[experts, 2 · ffn, hidden]`, gate
//! rows then up rows; `mlp.experts.down_proj` `[experts, hidden, ffn]`), which [`prepare`]
//! names as GGUF's stacked `ffn_gate_up_exps` / `ffn_down_exps` for `moe::split_experts`.

use super::keys::{hf_bad, GgufKeys, HfKeys};
use super::moe::{gguf_moe, hf_moe};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, DeltaNetConfig, Gating, HybridConfig, Mixer, ModelConfig};
use crate::weights::{TensorView, Weights};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Qwen35,
    display: "Qwen3.5",
    gguf_names: &["qwen35"],
    hf_classes: &["Qwen3_5ForCausalLM"],
    hf_model_types: &["qwen3_5_text", "qwen3_5"],
    block: Block {
        norms: NormPlacement::Pre,
        activation: Activation::Silu,
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
        rope_theta: 10_000_000.0,
        context_length: 32_768,
        rms_eps: 1e-6,
        tie_word_embeddings: false,
        head_dim: Some(256),
    },
    gguf_varying_layers: false,
    gguf_extra: gguf,
    split_fused: Some(prepare),
    hf_extra: hf,
};

pub(super) static MOE_SPEC: Family = Family {
    arch: Architecture::Qwen35Moe,
    display: "Qwen3.5-MoE",
    gguf_names: &["qwen35moe"],
    hf_classes: &["Qwen3_5MoeForCausalLM"],
    hf_model_types: &["qwen3_5_moe_text", "qwen3_5_moe"],
    gguf_extra: gguf_with_experts,
    hf_extra: hf_with_experts,
    ..SPEC
};

/// Qwen3.5's layers, then the experts (always renormalized: see the module doc).
fn gguf_with_experts(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    gguf(k, cfg)?;
    gguf_moe(k, cfg, Gating::Softmax, true)
}

/// Qwen3.5's layers, then the experts (always renormalized: see the module doc).
fn hf_with_experts(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    hf(c, cfg)?;
    hf_moe(c, cfg, "moe_intermediate_size", Gating::Softmax)?;
    if let Some(moe) = cfg.moe.as_mut() {
        moe.normalize_top_k = true;
    }
    Ok(())
}

/// transformers' `partial_rotary_factor` when a Qwen3.5 config does not say.
const DEFAULT_PARTIAL_ROTARY: f32 = 0.25;

/// The mixers of `n_layers` layers where every `interval`-th is attention.
fn interval_mixers(n_layers: usize, interval: usize) -> Vec<Mixer> {
    (0..n_layers)
        .map(|i| {
            if interval > 0 && (i + 1) % interval == 0 {
                Mixer::Attention
            } else {
                Mixer::GatedDeltaNet
            }
        })
        .collect()
}

/// Drops the last `n` layers (multi-token-prediction layers counted in `block_count`).
fn drop_last_layers(cfg: &mut ModelConfig, n: usize) {
    cfg.n_layers = cfg.n_layers.saturating_sub(n);
    cfg.layer_is_sliding.truncate(cfg.n_layers);
    cfg.layer_uses_rope.truncate(cfg.n_layers);
}

fn gguf(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    if let Some(nextn) = k.usize_opt("nextn_predict_layers")? {
        if nextn >= cfg.n_layers {
            return Err(k.bad(format!(
                "{} = {nextn} of {} layers leaves no decoder layer",
                k.key("nextn_predict_layers"),
                cfg.n_layers
            )));
        }
        drop_last_layers(cfg, nextn);
    }
    let mixers = if k.has("attention.recurrent_layers") {
        let all = k.i32_array("attention.recurrent_layers")?;
        if all.len() < cfg.n_layers {
            return Err(k.bad(format!(
                "{} has {} entries for {} layers",
                k.key("attention.recurrent_layers"),
                all.len(),
                cfg.n_layers
            )));
        }
        all[..cfg.n_layers]
            .iter()
            .map(|&r| {
                if r != 0 {
                    Mixer::GatedDeltaNet
                } else {
                    Mixer::Attention
                }
            })
            .collect()
    } else {
        let interval = k.usize_opt("full_attention_interval")?.unwrap_or(4);
        interval_mixers(cfg.n_layers, interval)
    };
    let need = |key: &str| {
        k.usize_opt(key)?
            .ok_or_else(|| k.bad(format!("{} is missing", k.key(key))))
    };
    let conv_kernel = need("ssm.conv_kernel")?;
    let d_k = need("ssm.state_size")?;
    let n_k_heads = need("ssm.group_count")?;
    let n_v_heads = need("ssm.time_step_rank")?;
    let inner = need("ssm.inner_size")?;
    if n_v_heads == 0 || inner % n_v_heads != 0 {
        return Err(k.bad(format!(
            "{} = {inner} is not a multiple of {} = {n_v_heads}",
            k.key("ssm.inner_size"),
            k.key("ssm.time_step_rank")
        )));
    }
    cfg.hybrid = Some(HybridConfig {
        mixers,
        conv_kernel,
        mamba2: None,
        delta_net: Some(DeltaNetConfig {
            n_k_heads,
            n_v_heads,
            d_k,
            d_v: inner / n_v_heads,
            tiled_value_heads: true,
        }),
    });
    Ok(())
}

fn hf(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    let in_rope_parameters = c
        .get("rope_parameters")
        .and_then(|p| p.get("partial_rotary_factor"))
        .is_some();
    if c.get("partial_rotary_factor").is_none() && !in_rope_parameters {
        cfg.rope_dim = ((cfg.head_dim as f32 * DEFAULT_PARTIAL_ROTARY) as usize) & !1;
    }
    if c.bool_opt("attention_bias")? == Some(true) {
        return Err(hf_bad(
            "attention_bias true is not supported (Qwen3.5's released models have no \
             attention biases)"
                .into(),
        ));
    }
    let mixers = match c.get("layer_types").and_then(|v| v.as_array()) {
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("linear_attention") => Ok(Mixer::GatedDeltaNet),
                Some("full_attention") => Ok(Mixer::Attention),
                other => Err(hf_bad(format!(
                    "layer type {other:?} is not one of \"linear_attention\", \"full_attention\""
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => interval_mixers(
            cfg.n_layers,
            c.usize_opt("full_attention_interval")?.unwrap_or(4),
        ),
    };
    let or = |key: &str, default: usize| -> Result<usize, ModelError> {
        Ok(c.usize_opt(key)?.unwrap_or(default))
    };
    cfg.hybrid = Some(HybridConfig {
        mixers,
        conv_kernel: or("linear_conv_kernel_dim", 4)?,
        mamba2: None,
        delta_net: Some(DeltaNetConfig {
            n_k_heads: or("linear_num_key_heads", 16)?,
            n_v_heads: or("linear_num_value_heads", 32)?,
            d_k: or("linear_key_head_dim", 128)?,
            d_v: or("linear_value_head_dim", 128)?,
            tiled_value_heads: false,
        }),
    });
    Ok(())
}

fn tensor_error(tensor: &str, message: String) -> ModelError {
    ModelError::Tensor {
        path: Default::default(),
        tensor: tensor.to_string(),
        message,
    }
}

/// Renames `from` to `to` when present (the bytes stay where they are).
fn rename(w: &mut Weights, from: &str, to: &str) -> Result<(), ModelError> {
    if let Some(mut t) = w.remove(from) {
        t.name = to.to_string();
        w.insert(t).map_err(|m| tensor_error(to, m))?;
    }
    Ok(())
}

/// Canonical names for HF's DeltaNet tensors, HF's fused experts and GGUF's MLP pre-norm;
/// HF's `[channels, 1, taps]` convolution as `[channels, taps]`; each attention layer's
/// interleaved query and gate rows split into `attn_q` and `attn_gate_q`.
fn prepare(cfg: &ModelConfig, w: &mut Weights) -> Result<(), ModelError> {
    for i in 0..cfg.n_layers {
        for (from, to) in [
            ("post_attention_norm.weight", "ffn_norm.weight"),
            ("linear_attn.in_proj_qkv.weight", "attn_qkv.weight"),
            ("linear_attn.in_proj_z.weight", "attn_gate.weight"),
            ("linear_attn.in_proj_a.weight", "ssm_alpha.weight"),
            ("linear_attn.in_proj_b.weight", "ssm_beta.weight"),
            ("linear_attn.conv1d.weight", "ssm_conv1d.weight"),
            ("linear_attn.A_log", "ssm_a_log"),
            ("linear_attn.dt_bias", "ssm_dt.bias"),
            ("linear_attn.norm.weight", "ssm_norm.weight"),
            ("linear_attn.out_proj.weight", "ssm_out.weight"),
            ("mlp.experts.gate_up_proj", "ffn_gate_up_exps.weight"),
            ("mlp.experts.down_proj", "ffn_down_exps.weight"),
        ] {
            rename(w, &format!("blk.{i}.{from}"), &format!("blk.{i}.{to}"))?;
        }
        let conv = format!("blk.{i}.ssm_conv1d.weight");
        if let Some(mut t) = w.remove(&conv) {
            if let [c, 1, k] = t.shape[..] {
                t.shape = vec![c, k];
            }
            w.insert(t).map_err(|m| tensor_error(&conv, m))?;
        }
        if cfg.layer_mixer(i) == Mixer::Attention {
            split_query_gate(cfg, w, i)?;
        }
    }
    Ok(())
}

/// Layer `i`'s `attn_q` (`[n_heads · 2 · head_dim, hidden]`: per head its query rows, then
/// its gate rows) as `attn_q` (the query rows) and `attn_gate_q` (the gate rows), copied
/// (every block format stores whole rows).
fn split_query_gate(cfg: &ModelConfig, w: &mut Weights, i: usize) -> Result<(), ModelError> {
    let name = format!("blk.{i}.attn_q.weight");
    let Some(t) = w.remove(&name) else {
        return Ok(());
    };
    let (heads, d) = (cfg.n_heads, cfg.head_dim);
    let [rows, cols] = t.shape[..] else {
        return Err(tensor_error(
            &name,
            format!("shape {:?} is not a matrix", t.shape),
        ));
    };
    if rows != 2 * heads * d {
        return Err(tensor_error(
            &name,
            format!("{rows} rows; {heads} heads of {d} query and {d} gate rows were expected"),
        ));
    }
    let row_bytes = t.n_bytes() / rows;
    let data = t.data();
    let half = |gate: bool| -> Vec<u8> {
        (0..heads)
            .flat_map(|h| {
                let first = (2 * h + usize::from(gate)) * d;
                &data[first * row_bytes..(first + d) * row_bytes]
            })
            .copied()
            .collect()
    };
    for (gate, part) in [(false, "attn_q"), (true, "attn_gate_q")] {
        let part_name = format!("blk.{i}.{part}.weight");
        let view = TensorView::owned(&part_name, t.ty, vec![heads * d, cols], half(gate))
            .map_err(|m| tensor_error(&name, m))?;
        w.insert(view).map_err(|m| tensor_error(&part_name, m))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fourth_layer_attends_by_default() {
        use Mixer::{Attention as A, GatedDeltaNet as D};
        assert_eq!(interval_mixers(8, 4), vec![D, D, D, A, D, D, D, A]);
    }
}
