//! LFM2 (Liquid AI LFM2-350M … 2.6B, LFM2.5; llama.cpp `lfm2`, transformers
//! `Lfm2ForCausalLM`): a hybrid whose layers mix tokens either by attention (QK-norm per head,
//! NeoX RoPE) or by a gated short convolution (`arch::short_conv`), each followed by a SwiGLU
//! MLP; pre-norms, the final norm after the last layer.
//!
//! Files: GGUF marks the convolution layers with `head_count_kv` 0 in its per-layer array and
//! gives the taps as `shortconv.l_cache`; HF lists `layer_types` (`conv` / `full_attention`)
//! and `conv_L_cache`, and derives the MLP width from `intermediate_size` when
//! `block_auto_adjust_ff_dim` is set (two thirds, times `block_ffn_dim_multiplier`, rounded up
//! to `block_multiple_of`), as transformers' `Lfm2MLP` does. [`prepare`] gives HF's names
//! (`operator_norm`, `feed_forward.w1/w3/w2`, `self_attn.out_proj`, `q_layernorm`,
//! `conv.*`) and both files' final norm (`embedding_norm` / `token_embd_norm`, applied after
//! the last layer despite the name) the canonical names.
//!
//! LFM2-MoE (LFM2-8B-A1B, LFM2-24B-A2B; llama.cpp `lfm2moe`, transformers
//! `Lfm2MoeForCausalLM`, [`MOE_SPEC`]): the same layers, with a mixture of experts in place of
//! the MLP after the first `num_dense_layers` (GGUF `leading_dense_block_count`): a sigmoid
//! router whose top k are chosen with a per-expert selection bias (`expert_bias`, GGUF
//! `exp_probs_b`) and weighed by the unbiased sigmoids, renormalized (llama.cpp always
//! renormalizes for this architecture), times `routed_scaling_factor` (HF; llama.cpp reads
//! none, and the released models say 1).

use super::keys::{hf_bad, GgufKeys, HfKeys};
use super::moe::{gguf_moe, hf_moe};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, Gating, HybridConfig, Mixer, ModelConfig};
use crate::weights::Weights;
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Lfm2,
    display: "LFM2",
    gguf_names: &["lfm2"],
    hf_classes: &["Lfm2ForCausalLM"],
    hf_model_types: &["lfm2"],
    block: Block {
        norms: NormPlacement::Pre,
        activation: Activation::Silu,
        qk_norm: QkNorm::PerHead,
        qkv_bias: false,
        v_norm: false,
        v_defaults_to_k: false,
    },
    gguf_rope_style: RopeStyle::Neox,
    hf_norm_offset: 0.0,
    gguf_rope_freqs: false,
    gguf_rms_eps: 1e-5,
    hf_defaults: HfDefaults {
        rope_theta: 1_000_000.0,
        context_length: 128_000,
        rms_eps: 1e-5,
        tie_word_embeddings: true,
        head_dim: None,
    },
    gguf_varying_layers: true,
    gguf_extra: gguf,
    split_fused: Some(prepare),
    hf_extra: hf,
};

pub(super) static MOE_SPEC: Family = Family {
    arch: Architecture::Lfm2Moe,
    display: "LFM2-MoE",
    gguf_names: &["lfm2moe"],
    hf_classes: &["Lfm2MoeForCausalLM"],
    hf_model_types: &["lfm2_moe"],
    gguf_extra: gguf_moe_layers,
    hf_extra: hf_moe_layers,
    ..SPEC
};

/// LFM2's layers, then the experts: GGUF's gating function (`expert_gating_func`: 2 is the
/// sigmoid LFM2-MoE uses, 1 a softmax) and its leading dense layers.
fn gguf_moe_layers(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    gguf(k, cfg)?;
    let gating = match k.usize_opt("expert_gating_func")? {
        None | Some(2) => Gating::Sigmoid,
        Some(1) => Gating::Softmax,
        Some(g) => {
            return Err(k.bad(format!(
                "{} {g} is not a gating Pagoda knows (1 softmax, 2 sigmoid)",
                k.key("expert_gating_func")
            )))
        }
    };
    gguf_moe(k, cfg, gating, true)?;
    let dense = k.usize_opt("leading_dense_block_count")?.unwrap_or(0);
    leading_dense(cfg, dense);
    Ok(())
}

/// LFM2's layers, then the experts: `num_dense_layers` dense ones first,
/// `routed_scaling_factor` on the weights.
fn hf_moe_layers(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    hf(c, cfg)?;
    hf_moe(c, cfg, "moe_intermediate_size", Gating::Sigmoid)?;
    let dense = c.usize_opt("num_dense_layers")?.unwrap_or(0);
    leading_dense(cfg, dense);
    if let (Some(moe), Some(scale)) = (&mut cfg.moe, c.f32_opt("routed_scaling_factor")?) {
        moe.weights_scale = scale;
    }
    Ok(())
}

/// The first `dense` layers keep a dense MLP.
fn leading_dense(cfg: &mut ModelConfig, dense: usize) {
    if let Some(moe) = &mut cfg.moe {
        for (i, sparse) in moe.layers.iter_mut().enumerate() {
            *sparse = i >= dense;
        }
    }
}

/// Layer mixers from per-layer K/V head counts (0: a convolution layer); the attention
/// layers' count becomes the model's.
fn gguf(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    let mixers = k.mixers_from_kv_heads(cfg, Mixer::ShortConv)?;
    let conv_kernel = k
        .usize_opt("shortconv.l_cache")?
        .ok_or_else(|| k.bad(format!("{} is missing", k.key("shortconv.l_cache"))))?;
    // llama.cpp's LFM2 may make its attention layers sliding-window; not read here yet, so
    // refused rather than run with full attention.
    if k.usize_opt("attention.sliding_window")?
        .is_some_and(|w| w > 0)
    {
        return Err(k.bad(format!(
            "{} is set: sliding-window attention in LFM2 is not supported yet",
            k.key("attention.sliding_window")
        )));
    }
    cfg.hybrid = Some(HybridConfig {
        mixers,
        conv_kernel,
        mamba2: None,
        delta_net: None,
    });
    Ok(())
}

fn hf(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    if let Some(eps) = c.f32_opt("norm_eps")? {
        cfg.rms_eps = eps;
    }
    if c.bool_opt("conv_bias")? == Some(true) {
        return Err(hf_bad(
            "conv_bias true is not supported (LFM2's released models have no convolution \
             biases)"
                .into(),
        ));
    }
    let types = c
        .get("layer_types")
        .and_then(|v| v.as_array())
        .ok_or_else(|| hf_bad("layer_types is missing".into()))?;
    let mixers = types
        .iter()
        .map(|t| match t.as_str() {
            Some("conv") => Ok(Mixer::ShortConv),
            Some("full_attention") => Ok(Mixer::Attention),
            other => Err(hf_bad(format!(
                "layer type {other:?} is not one of \"conv\", \"full_attention\""
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let conv_kernel = c
        .usize_opt("conv_L_cache")?
        .ok_or_else(|| hf_bad("conv_L_cache is missing".into()))?;
    if c.bool_opt("block_auto_adjust_ff_dim")? == Some(true) {
        let mut ff = 2 * cfg.ffn_dim / 3;
        if let Some(m) = c.f32_opt("block_ffn_dim_multiplier")? {
            ff = (m * ff as f32) as usize;
        }
        let multiple = c.usize_opt("block_multiple_of")?.unwrap_or(256).max(1);
        cfg.ffn_dim = ff.div_ceil(multiple) * multiple;
        if cfg.ffn_dim == 0 {
            return Err(hf_bad(
                "the MLP width derived from intermediate_size and block_ffn_dim_multiplier is 0"
                    .into(),
            ));
        }
    }
    if c.usize_opt("sliding_window")?.is_some_and(|w| w > 0) {
        return Err(hf_bad(
            "sliding_window is set: sliding-window attention in LFM2 is not supported yet".into(),
        ));
    }
    cfg.hybrid = Some(HybridConfig {
        mixers,
        conv_kernel,
        mamba2: None,
        delta_net: None,
    });
    Ok(())
}

/// Renames `from` to `to` when present (the bytes stay where they are).
fn rename(w: &mut Weights, from: &str, to: &str) -> Result<(), ModelError> {
    if let Some(mut t) = w.remove(from) {
        t.name = to.to_string();
        w.insert(t).map_err(|message| ModelError::Tensor {
            path: Default::default(),
            tensor: to.to_string(),
            message,
        })?;
    }
    Ok(())
}

/// Canonical names for HF's tensors and both files' final norm; HF's `[hidden, 1, taps]`
/// convolution as `[hidden, taps]`.
fn prepare(cfg: &ModelConfig, w: &mut Weights) -> Result<(), ModelError> {
    for from in ["token_embd_norm.weight", "embedding_norm.weight"] {
        rename(w, from, "output_norm.weight")?;
    }
    for i in 0..cfg.n_layers {
        for (from, to) in [
            ("operator_norm", "attn_norm"),
            ("feed_forward.w1", "ffn_gate"),
            ("feed_forward.w3", "ffn_up"),
            ("feed_forward.w2", "ffn_down"),
            ("self_attn.out_proj", "attn_output"),
            ("self_attn.q_layernorm", "attn_q_norm"),
            ("self_attn.k_layernorm", "attn_k_norm"),
            ("conv.conv", "shortconv.conv"),
            ("conv.in_proj", "shortconv.in_proj"),
            ("conv.out_proj", "shortconv.out_proj"),
            ("feed_forward.gate", "ffn_gate_inp"),
        ] {
            rename(
                w,
                &format!("blk.{i}.{from}.weight"),
                &format!("blk.{i}.{to}.weight"),
            )?;
        }
        // LFM2-MoE's folder: the router's selection bias and per-expert w1/w3/w2.
        rename(
            w,
            &format!("blk.{i}.feed_forward.expert_bias"),
            &super::moe::selection_bias_name(i),
        )?;
        if let Some(moe) = &cfg.moe {
            for e in 0..moe.n_experts {
                for (from, proj) in [("w1", "gate"), ("w3", "up"), ("w2", "down")] {
                    rename(
                        w,
                        &format!("blk.{i}.feed_forward.experts.{e}.{from}.weight"),
                        &super::moe::expert_name(i, proj, e),
                    )?;
                }
            }
        }
        let conv = format!("blk.{i}.shortconv.conv.weight");
        if let Some(mut t) = w.remove(&conv) {
            if let [c, 1, k] = t.shape[..] {
                t.shape = vec![c, k];
            }
            w.insert(t).map_err(|message| ModelError::Tensor {
                path: Default::default(),
                tensor: conv.clone(),
                message,
            })?;
        }
    }
    Ok(())
}
