//! gpt-oss (gpt-oss-20b, gpt-oss-120b; llama.cpp `gpt-oss`, transformers `GptOssForCausalLM`):
//! Llama-style pre-norm layers with biases on Q, K, V and O, per-head attention sinks
//! (`attn_sinks`: a logit in each head's softmax denominator without a value), layers
//! alternating sliding (window 128) and full attention, YaRN RoPE on every layer, and a
//! mixture of experts: a router with a bias, the top k logits then a softmax over those k,
//! experts with biases and the clamped SwiGLU (`Activation::SwigluOai`).
//!
//! Files: llama.cpp's converter writes the FFN pre-norm as `post_attention_norm` (renamed to
//! `ffn_norm` when opened) and de-interleaves the HF checkpoints' fused experts into stacked
//! `ffn_{gate,up,down}_exps` with `.bias` tensors. HF folders store
//! `mlp.experts.gate_up_proj` (`[experts, hidden, 2 · ffn]`, used as `x · W`, gate in the even
//! and up in the odd columns) and `down_proj` (`[experts, ffn, hidden]`) with their biases:
//! [`prepare`] turns them into one matrix per expert and projection (a copy, f32). The
//! released checkpoints keep experts in MXFP4: GGUF files as stacked MXFP4 tensors (opened as
//! views like any block type), HF folders as `*_blocks`/`*_scales`, which `hf_mxfp4.rs` turns
//! into MXFP4 matrices `[experts · 2 · ffn, hidden]` (gate and up rows interleaved) and
//! `[experts · hidden, ffn]` (already output-major, unlike the float layout); [`prepare`]
//! then copies each expert's gate and up rows apart and views its down rows, never
//! dequantizing.
//! YaRN follows each file: HF `truncate: false` keeps the ramp's ends unrounded; GGUF files
//! carry no such key and are rounded as llama.cpp does.

use super::keys::{hf_bad, GgufKeys, HfKeys};
use super::moe::{expert_bias_name, expert_name, gguf_moe, hf_moe};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{sliding_pattern, Architecture, Gating, ModelConfig};
use crate::weights::{TensorView, Weights};
use crate::ModelError;
use pagoda_kernels::ops::{RopeStyle, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT};
use pagoda_kernels::GgmlType;

pub(super) static SPEC: Family = Family {
    arch: Architecture::GptOss,
    display: "gpt-oss",
    gguf_names: &["gpt-oss"],
    hf_classes: &["GptOssForCausalLM"],
    hf_model_types: &["gpt_oss"],
    block: Block {
        norms: NormPlacement::Pre,
        activation: Activation::SwigluOai,
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
        rope_theta: 150_000.0,
        context_length: 131_072,
        rms_eps: 1e-5,
        tie_word_embeddings: false,
        head_dim: Some(64),
    },
    gguf_varying_layers: false,
    gguf_extra: gguf,
    split_fused: Some(prepare),
    hf_extra: hf,
};

fn gguf(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    cfg.sliding_window = k.usize_opt("attention.sliding_window")?;
    if cfg.sliding_window.is_some() {
        // llama.cpp's default for this architecture: even layers slide.
        cfg.layer_is_sliding = if k.is_array("attention.sliding_window_pattern") {
            k.layer_flags("attention.sliding_window_pattern", cfg.n_layers)?
        } else {
            (0..cfg.n_layers).map(|i| i % 2 == 0).collect()
        };
    }
    gguf_moe(k, cfg, Gating::SoftmaxOfTopK, false)?;
    if let Some(moe) = &mut cfg.moe {
        // llama.cpp reads 0 (its default) as "no scale".
        if moe.weights_scale == 0.0 {
            moe.weights_scale = 1.0;
        }
    }
    Ok(())
}

fn hf(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    for (key, want) in [
        ("swiglu_limit", SWIGLU_OAI_LIMIT),
        ("swiglu_alpha", SWIGLU_OAI_ALPHA),
    ] {
        if let Some(v) = c.f32_opt(key)? {
            if v != want {
                return Err(hf_bad(format!(
                    "{key} {v} is not supported (gpt-oss uses {want})"
                )));
            }
        }
    }
    if c.get("layer_types").is_none() {
        if let Some(w) = c.usize_opt("sliding_window")? {
            cfg.sliding_window = Some(w);
            cfg.layer_is_sliding = sliding_pattern(cfg.n_layers, 2);
        }
    }
    // Every layer rotates with the one (YaRN) table.
    cfg.rope_theta_local = None;
    hf_moe(c, cfg, "intermediate_size", Gating::SoftmaxOfTopK)
}

fn bad(tensor: &str, message: String) -> ModelError {
    ModelError::Tensor {
        path: Default::default(),
        tensor: tensor.to_string(),
        message,
    }
}

/// Renames the GGUF FFN pre-norm, and turns an HF folder's fused experts into one matrix and
/// bias per expert and projection (see the module doc).
fn prepare(cfg: &ModelConfig, w: &mut Weights) -> Result<(), ModelError> {
    for i in 0..cfg.n_layers {
        if let Some(t) = w.remove(&format!("blk.{i}.post_attention_norm.weight")) {
            let name = format!("blk.{i}.ffn_norm.weight");
            let renamed = t
                .row_range(name.clone(), 0..t.rows())
                .or_else(|_| {
                    TensorView::owned(name.clone(), t.ty, t.shape.clone(), t.data().to_vec())
                })
                .map_err(|m| bad(&name, m))?;
            w.insert(renamed).map_err(|m| bad(&name, m))?;
        }
        split_hf_experts(cfg, w, i)?;
    }
    Ok(())
}

/// An f32 matrix tensor named `name`.
fn f32_tensor(
    name: String,
    rows: usize,
    cols: usize,
    data: &[f32],
) -> Result<TensorView, ModelError> {
    let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    TensorView::owned(name.clone(), GgmlType::F32, vec![rows, cols], bytes)
        .map_err(|m| bad(&name, m))
}

/// Layer `i`'s HF experts (`blk.{i}.mlp.experts.*`, as `hf.rs` leaves names it does not
/// know), if any, into per-expert canonical tensors.
fn split_hf_experts(cfg: &ModelConfig, w: &mut Weights, i: usize) -> Result<(), ModelError> {
    let fused = format!("blk.{i}.mlp.experts.gate_up_proj");
    let Some(gate_up) = w.remove(&fused) else {
        return Ok(());
    };
    let moe = cfg
        .moe
        .as_ref()
        .ok_or_else(|| bad(&fused, "experts in a model without experts".into()))?;
    let (e_n, d, f) = (moe.n_experts, cfg.hidden_size, moe.expert_ffn_dim);
    let down_name = format!("blk.{i}.mlp.experts.down_proj");
    let down = w
        .remove(&down_name)
        .ok_or_else(|| bad(&down_name, "missing".into()))?;
    let take = |w: &mut Weights, name: String, len: usize| -> Result<Vec<f32>, ModelError> {
        let t = w
            .remove(&name)
            .ok_or_else(|| bad(&name, "missing".into()))?;
        if t.n_elements() != len {
            return Err(bad(
                &name,
                format!("{} values, the config implies {len}", t.n_elements()),
            ));
        }
        t.to_f32()
    };
    let gu_bias = take(w, format!("{fused}_bias"), e_n * 2 * f)?; // [e, 2f]
    let down_bias = take(w, format!("{down_name}_bias"), e_n * d)?; // [e, d]
    let mats = if gate_up.ty == GgmlType::Mxfp4 {
        mxfp4_experts(i, &gate_up, &down, (e_n, d, f))?
    } else {
        float_experts(i, &gate_up, &down, (e_n, d, f))?
    };
    for (e, [gate, up, dn]) in mats.into_iter().enumerate() {
        let b = &gu_bias[e * 2 * f..(e + 1) * 2 * f];
        let gate_b: Vec<f32> = b.iter().step_by(2).copied().collect();
        let up_b: Vec<f32> = b.iter().skip(1).step_by(2).copied().collect();
        let down_b = &down_bias[e * d..(e + 1) * d];
        let bias_name = |proj: &str| expert_bias_name(i, proj, e);
        for t in [
            gate,
            up,
            dn,
            f32_tensor(bias_name("gate"), 1, f, &gate_b)?,
            f32_tensor(bias_name("up"), 1, f, &up_b)?,
            f32_tensor(bias_name("down"), 1, d, down_b)?,
        ] {
            let name = t.name.clone();
            w.insert(t).map_err(|m| bad(&name, m))?;
        }
    }
    Ok(())
}

/// Each expert's gate, up and down matrices from the float layout: `gate_up` `[e, d, 2f]`
/// (gate in the even columns), `down` `[e, f, d]`, both used as `x · W` (transposed here).
fn float_experts(
    i: usize,
    gate_up: &TensorView,
    down: &TensorView,
    (e_n, d, f): (usize, usize, usize),
) -> Result<Vec<[TensorView; 3]>, ModelError> {
    for (t, want) in [(gate_up, e_n * d * 2 * f), (down, e_n * f * d)] {
        if t.n_elements() != want {
            return Err(bad(
                &t.name,
                format!("{} values, the config implies {want}", t.n_elements()),
            ));
        }
    }
    let gu = gate_up.to_f32()?;
    let dn_all = down.to_f32()?;
    let mut out = Vec::with_capacity(e_n);
    for e in 0..e_n {
        let at = |c: usize, j: usize| gu[(e * d + c) * 2 * f + j];
        let mut gate = vec![0.0f32; f * d];
        let mut up = vec![0.0f32; f * d];
        for r in 0..f {
            for c in 0..d {
                gate[r * d + c] = at(c, 2 * r);
                up[r * d + c] = at(c, 2 * r + 1);
            }
        }
        let mut dn = vec![0.0f32; d * f];
        for r in 0..d {
            for c in 0..f {
                dn[r * f + c] = dn_all[(e * f + c) * d + r];
            }
        }
        out.push([
            f32_tensor(expert_name(i, "gate", e), f, d, &gate)?,
            f32_tensor(expert_name(i, "up", e), f, d, &up)?,
            f32_tensor(expert_name(i, "down", e), d, f, &dn)?,
        ]);
    }
    Ok(out)
}

/// Each expert's matrices from the MXFP4 layout (`hf_mxfp4.rs`): `gate_up` `[e · 2f, d]` with
/// gate and up rows interleaved (rows copied apart), `down` `[e · d, f]` (row views).
fn mxfp4_experts(
    i: usize,
    gate_up: &TensorView,
    down: &TensorView,
    (e_n, d, f): (usize, usize, usize),
) -> Result<Vec<[TensorView; 3]>, ModelError> {
    for (t, want) in [(gate_up, [e_n * 2 * f, d]), (down, [e_n * d, f])] {
        if t.ty != GgmlType::Mxfp4 || t.shape[..] != want {
            return Err(bad(
                &t.name,
                format!("{} {:?}; the config implies MXFP4 {want:?}", t.ty, t.shape),
            ));
        }
    }
    let rb = gate_up.n_bytes() / (e_n * 2 * f);
    let rows_of = |e: usize, parity: usize, name: String| {
        let mut bytes = Vec::with_capacity(f * rb);
        for r in 0..f {
            let row = e * 2 * f + 2 * r + parity;
            bytes.extend_from_slice(&gate_up.data()[row * rb..(row + 1) * rb]);
        }
        TensorView::owned(name.clone(), GgmlType::Mxfp4, vec![f, d], bytes)
            .map_err(|m| bad(&name, m))
    };
    (0..e_n)
        .map(|e| {
            let dn_name = expert_name(i, "down", e);
            Ok([
                rows_of(e, 0, expert_name(i, "gate", e))?,
                rows_of(e, 1, expert_name(i, "up", e))?,
                down.row_range(dn_name.clone(), e * d..(e + 1) * d)
                    .map_err(|m| bad(&dn_name, m))?,
            ])
        })
        .collect()
}
