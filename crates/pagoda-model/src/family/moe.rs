//! What every mixture-of-experts family shares: reading the expert keys ([`gguf_moe`],
//! [`hf_moe`]) and opening the experts as one linear per expert ([`split_experts`]).
//!
//! Tensor layout, canonical: the router `blk.{i}.ffn_gate_inp.weight` (`[n_experts, hidden]`)
//! and per expert `e` `blk.{i}.ffn_{gate,up}_exp.{e}.weight` (`[expert_ffn, hidden]`) and
//! `blk.{i}.ffn_down_exp.{e}.weight` (`[hidden, expert_ffn]`). GGUF files stack each
//! projection's experts in one tensor (`ffn_gate_exps`, `[n_experts, expert_ffn, hidden]`),
//! which [`split_experts`] turns into per-expert views of the same bytes (no copy, any block
//! format); Hugging Face folders store per-expert tensors, which `hf.rs` names as above.

use super::keys::{hf_bad, GgufKeys, HfKeys};
use crate::config::{Gating, ModelConfig, MoeConfig};
use crate::weights::Weights;
use crate::ModelError;

/// Upper bound on experts read from a file (the largest models have a few hundred).
const MAX_EXPERTS: usize = 4096;

fn check_counts(n_experts: usize, n_used: usize) -> Result<(), String> {
    if n_experts == 0 || n_experts > MAX_EXPERTS || n_used == 0 || n_used > n_experts {
        return Err(format!(
            "{n_used} of {n_experts} experts per token (at most {MAX_EXPERTS} experts)"
        ));
    }
    Ok(())
}

/// The experts of a GGUF file: `expert_count`, `expert_used_count`, and the expert width
/// from `expert_feed_forward_length`, else `feed_forward_length` (OLMoE's files).
/// `normalize_top_k` is the family's (llama.cpp fixes it per architecture).
pub(super) fn gguf_moe(
    k: &GgufKeys<'_>,
    cfg: &mut ModelConfig,
    gating: Gating,
    normalize_top_k: bool,
) -> Result<(), ModelError> {
    let n_experts = k.usize("expert_count")?;
    let n_used = k.usize("expert_used_count")?;
    check_counts(n_experts, n_used).map_err(|m| k.bad(m))?;
    let expert_ffn_dim = k
        .usize_opt("expert_feed_forward_length")?
        .unwrap_or(cfg.ffn_dim);
    cfg.moe = Some(MoeConfig {
        n_experts,
        n_used,
        expert_ffn_dim,
        gating,
        normalize_top_k,
        weights_scale: k.f32_opt("expert_weights_scale")?.unwrap_or(1.0),
        layers: vec![true; cfg.n_layers],
        shared_ffn_dim: k
            .usize_opt("expert_shared_feed_forward_length")?
            .filter(|&f| f > 0),
    });
    Ok(())
}

/// The experts of a `config.json`: `num_experts` (or `num_local_experts`),
/// `num_experts_per_tok`, the expert width from `width_key`, `norm_topk_prob`, and which
/// layers are sparse (`decoder_sparse_step`, `mlp_only_layers`).
pub(super) fn hf_moe(
    c: &HfKeys<'_>,
    cfg: &mut ModelConfig,
    width_key: &str,
    gating: Gating,
) -> Result<(), ModelError> {
    let n_experts = match c.usize_opt("num_experts")? {
        Some(n) => n,
        None => c.usize("num_local_experts")?,
    };
    let n_used = c.usize("num_experts_per_tok")?;
    check_counts(n_experts, n_used).map_err(hf_bad)?;
    let step = c.usize_opt("decoder_sparse_step")?.unwrap_or(1).max(1);
    let dense: Vec<usize> = match c.get("mlp_only_layers") {
        None => Vec::new(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            hf_bad(format!(
                "mlp_only_layers should be a list of layers, got {v}"
            ))
        })?,
    };
    cfg.moe = Some(MoeConfig {
        n_experts,
        n_used,
        expert_ffn_dim: c.usize(width_key)?,
        gating,
        normalize_top_k: c.bool_opt("norm_topk_prob")?.unwrap_or(false),
        weights_scale: 1.0,
        layers: (0..cfg.n_layers)
            .map(|i| !dense.contains(&i) && (i + 1) % step == 0)
            .collect(),
        shared_ffn_dim: c
            .usize_opt("shared_expert_intermediate_size")?
            .filter(|&f| f > 0),
    });
    Ok(())
}

/// The canonical name of expert `e`'s projection `proj` (`gate`, `up`, `down`) in layer `i`.
pub fn expert_name(i: usize, proj: &str, e: usize) -> String {
    format!("blk.{i}.ffn_{proj}_exp.{e}.weight")
}

/// The canonical name of expert `e`'s bias of projection `proj` in layer `i` (gpt-oss).
pub fn expert_bias_name(i: usize, proj: &str, e: usize) -> String {
    format!("blk.{i}.ffn_{proj}_exp.{e}.bias")
}

/// The canonical name of the shared expert's projection `proj` (`gate`, `up`, `down`) in
/// layer `i` (`[shared_ffn, hidden]`, down `[hidden, shared_ffn]`).
pub fn shared_expert_name(i: usize, proj: &str) -> String {
    format!("blk.{i}.ffn_{proj}_shexp.weight")
}

/// The canonical name of the shared expert's sigmoid gate in layer `i` (`[1, hidden]`; GGUF
/// files store it as a `[hidden]` vector, [`split_experts`] reshapes it).
pub fn shared_expert_gate_name(i: usize) -> String {
    format!("blk.{i}.ffn_gate_inp_shexp.weight")
}

/// The canonical name of the router's selection bias in layer `i` (`[n_experts]`).
pub fn selection_bias_name(i: usize) -> String {
    format!("blk.{i}.exp_probs_b.bias")
}

/// Replaces each stacked expert tensor of a mixture-of-experts model with one view per
/// expert (a no-op for a dense model and for folders, whose experts are already apart).
pub fn split_experts(cfg: &ModelConfig, w: &mut Weights) -> Result<(), ModelError> {
    let Some(moe) = &cfg.moe else {
        return Ok(());
    };
    for i in 0..cfg.n_layers {
        let gate = shared_expert_gate_name(i);
        if let Some(mut t) = w.remove(&gate) {
            if t.shape.len() == 1 {
                t.shape = vec![1, t.shape[0]];
            }
            w.insert(t).map_err(|message| ModelError::Tensor {
                path: Default::default(),
                tensor: gate.clone(),
                message,
            })?;
        }
        split_gate_up(moe.n_experts, w, i)?;
        for proj in ["gate", "up", "down"] {
            let stacked = format!("blk.{i}.ffn_{proj}_exps.weight");
            let Some(t) = w.remove(&stacked) else {
                continue;
            };
            let bad = |message: String| ModelError::Tensor {
                path: Default::default(),
                tensor: stacked.clone(),
                message,
            };
            if t.shape.len() != 3 || t.shape[0] != moe.n_experts {
                return Err(bad(format!(
                    "shape {:?}, but the config has {} experts",
                    t.shape, moe.n_experts
                )));
            }
            for e in 0..moe.n_experts {
                let view = t.outer_slice(expert_name(i, proj, e), e).map_err(bad)?;
                w.insert(view).map_err(bad)?;
            }
            // Per-expert biases (gpt-oss): `[n_experts, width]`, a row each.
            let stacked_bias = format!("blk.{i}.ffn_{proj}_exps.bias");
            if let Some(b) = w.remove(&stacked_bias) {
                for e in 0..moe.n_experts {
                    let name = expert_bias_name(i, proj, e);
                    let view = b.row_range(name, e..e + 1).map_err(bad)?;
                    w.insert(view).map_err(bad)?;
                }
            }
        }
    }
    Ok(())
}

/// Layer `i`'s fused `ffn_gate_up_exps` (`[n_experts, 2 · ffn, hidden]`: per expert its gate
/// rows, then its up rows; llama.cpp's `--fuse-gate-up-exps` files and Qwen3.5-MoE's HF
/// folders), if any, as per-expert gate and up views of the same bytes.
fn split_gate_up(n_experts: usize, w: &mut Weights, i: usize) -> Result<(), ModelError> {
    let fused = format!("blk.{i}.ffn_gate_up_exps.weight");
    let Some(t) = w.remove(&fused) else {
        return Ok(());
    };
    let bad = |message: String| ModelError::Tensor {
        path: Default::default(),
        tensor: fused.clone(),
        message,
    };
    let [n, rows, _] = t.shape[..] else {
        return Err(bad(format!("shape {:?} is not three-dimensional", t.shape)));
    };
    if n != n_experts || rows % 2 != 0 {
        return Err(bad(format!(
            "shape {:?}: {n_experts} experts of an even number of rows (gate, then up) were \
             expected",
            t.shape
        )));
    }
    let ffn = rows / 2;
    for e in 0..n_experts {
        let expert = t.outer_slice(format!("{fused}.{e}"), e).map_err(bad)?;
        for (proj, range) in [("gate", 0..ffn), ("up", ffn..rows)] {
            let view = expert
                .row_range(expert_name(i, proj, e), range)
                .map_err(bad)?;
            w.insert(view).map_err(bad)?;
        }
    }
    Ok(())
}
