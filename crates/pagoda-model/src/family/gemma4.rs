//! Gemma 4 dense (E2B, E4B, 31B; llama.cpp `gemma4`, transformers `Gemma4ForCausalLM` and the
//! text model of `Gemma4ForConditionalGeneration`): Gemma 3's sandwich block with layers that
//! differ from each other ([`LayerVariants`]):
//! - **Global layers** (full attention) have their own head size (`global_head_dim`, GGUF
//!   `attention.key_length`) and, in the `attention_k_eq_v` models, their own KV head count
//!   and no V projection (V is K's projection, [`Block::v_defaults_to_k`]); sliding layers use
//!   `head_dim` (GGUF `attention.key_length_swa`).
//! - **RoPE**: sliding layers rotate fully with base 10 000 (`rope.freq_base_swa`); global
//!   layers use "proportional" RoPE: of the `global_head_dim / 2` frequency pairs only the
//!   first `partial_rotary_factor` share rotate, with exponents over the whole head, the rest
//!   keep angle 0. HF folders say so in `rope_parameters.full_attention`; llama.cpp's
//!   converter writes `rope.dimension_count = global_head_dim` and a `rope_freqs.weight` of
//!   1 for the rotated pairs and 1e30 for the others (frequency ≈ 0), which Pagoda applies as
//!   llama.cpp does.
//! - **Shared KV**: the last `num_kv_shared_layers` layers (GGUF `attention.shared_kv_layers`)
//!   compute no K/V and attend over the last earlier layer of their kind; with
//!   `use_double_wide_mlp` their MLP is twice as wide (GGUF `feed_forward_length` per layer).
//! - **Per-layer embeddings** (E2B/E4B, `hidden_size_per_layer_input`, GGUF
//!   `embedding_length_per_layer_input`): see `arch::per_layer`.
//! - Q, K and V are RMS-normalized per head (V without a weight); the attention scale is 1;
//!   each layer's output is multiplied by its `layer_scalar` (`layer_output_scale`);
//!   embeddings are scaled by `sqrt(hidden)`; the logits may be soft-capped.
//! - Norm weights are used as stored (`w`, not Gemma 3's `1 + w`) in both formats: the
//!   converter's `Gemma4Model.norm_shift` is 0.
//!
//! Not supported (refused by name): the MoE variant (26B-A4B, `enable_moe_block`) and
//! bidirectional attention over text (`use_bidirectional_attention: "all"`).

use super::keys::{hf_bad, GgufKeys, HfKeys};
use super::spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm};
use crate::config::{Architecture, GlobalAttention, ModelConfig};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;
use serde_json::Value;

pub(super) static SPEC: Family = Family {
    arch: Architecture::Gemma4,
    display: "Gemma 4",
    gguf_names: &["gemma4"],
    hf_classes: &["Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"],
    hf_model_types: &["gemma4_text", "gemma4"],
    block: Block {
        norms: NormPlacement::Sandwich,
        activation: Activation::GeluTanh,
        qk_norm: QkNorm::PerHead,
        qkv_bias: false,
        v_norm: true,
        v_defaults_to_k: true,
    },
    gguf_rope_style: RopeStyle::Neox,
    hf_norm_offset: 0.0,
    gguf_rope_freqs: true,
    gguf_rms_eps: 1e-6,
    hf_defaults: HfDefaults {
        rope_theta: 1_000_000.0,
        context_length: 131_072,
        rms_eps: 1e-6,
        tie_word_embeddings: true,
        head_dim: Some(256),
    },
    gguf_varying_layers: true,
    gguf_extra: gguf,
    split_fused: None,
    hf_extra: hf,
};

/// transformers' defaults (`Gemma4TextConfig`).
const LOCAL_THETA: f32 = 10_000.0;
const GLOBAL_HEAD_DIM: usize = 512;
const PER_LAYER_INPUT: usize = 256;
const SLIDING_WINDOW: usize = 512;

fn gguf(k: &GgufKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    let n = cfg.n_layers;
    cfg.sliding_window = k.usize_opt("attention.sliding_window")?;
    cfg.layer_is_sliding = k.layer_flags("attention.sliding_window_pattern", n)?;
    if cfg.sliding_window.is_none() && cfg.layer_is_sliding.iter().any(|&s| s) {
        return Err(k.bad(format!(
            "{} marks sliding layers but {} is missing",
            k.key("attention.sliding_window_pattern"),
            k.key("attention.sliding_window")
        )));
    }
    // The shared reader read the global layers' head size (`key_length`) and RoPE width.
    let global_head_dim = cfg.head_dim;
    let global_rope_dim = cfg.rope_dim;
    cfg.head_dim = k
        .usize_opt("attention.key_length_swa")?
        .unwrap_or(global_head_dim);
    if let Some(v) = k.usize_opt("attention.value_length_swa")? {
        if v != cfg.head_dim {
            return Err(k.bad(format!(
                "{} = {v} differs from the sliding layers' key length {}; not supported",
                k.key("attention.value_length_swa"),
                cfg.head_dim
            )));
        }
    }
    cfg.rope_dim = k
        .usize_opt("rope.dimension_count_swa")?
        .unwrap_or(cfg.head_dim);
    let kv_heads = k
        .per_layer("attention.head_count_kv", n)?
        .unwrap_or_else(|| vec![cfg.n_heads; n]);
    let of_kind = |sliding: bool| {
        (0..n)
            .find(|&i| cfg.layer_is_sliding[i] == sliding)
            .map(|i| kv_heads[i])
    };
    cfg.n_kv_heads = of_kind(true).unwrap_or(kv_heads[0]);
    let global_kv_heads = of_kind(false).unwrap_or(cfg.n_kv_heads);
    if (0..n).any(|i| {
        kv_heads[i]
            != if cfg.layer_is_sliding[i] {
                cfg.n_kv_heads
            } else {
                global_kv_heads
            }
    }) {
        return Err(k.bad(format!(
            "{} varies within sliding or within global layers ({kv_heads:?}); not supported",
            k.key("attention.head_count_kv")
        )));
    }
    cfg.variants.global = Some(GlobalAttention {
        head_dim: global_head_dim,
        n_kv_heads: global_kv_heads,
        rope_dim: global_rope_dim,
        // The file's `rope_freqs.weight` stops the pairs that do not rotate.
        rotated_dim: global_rope_dim,
    });
    let ffn = k
        .per_layer("feed_forward_length", n)?
        .unwrap_or_else(|| vec![cfg.ffn_dim; n]);
    if ffn.iter().any(|&f| f != ffn[0]) {
        cfg.variants.ffn_dims = ffn;
    }
    cfg.variants.kv_shared = k.usize_opt("attention.shared_kv_layers")?.unwrap_or(0);
    cfg.variants.per_layer_input = k
        .usize_opt("embedding_length_per_layer_input")?
        .filter(|&w| w > 0);
    cfg.rope_theta_local = Some(k.f32_opt("rope.freq_base_swa")?.unwrap_or(LOCAL_THETA));
    cfg.attention_scale = 1.0;
    cfg.embedding_scale = Some((cfg.hidden_size as f32).sqrt());
    cfg.final_logit_softcap = k.f32_opt("final_logit_softcapping")?;
    if k.has("expert_count") && k.usize("expert_count")? > 0 {
        return Err(moe_refused());
    }
    Ok(())
}

fn moe_refused() -> ModelError {
    ModelError::InvalidConfig(
        "Gemma 4's mixture-of-experts variant (26B-A4B) is not supported yet; the dense \
         models (E2B, E4B, 31B) are"
            .into(),
    )
}

fn hf(c: &HfKeys<'_>, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    if c.bool_opt("enable_moe_block")?.unwrap_or(false) {
        return Err(moe_refused());
    }
    if c.str_opt("use_bidirectional_attention") == Some("all") {
        return Err(hf_bad(
            "use_bidirectional_attention \"all\" (a non-causal encoder) is not supported".into(),
        ));
    }
    let n = cfg.n_layers;
    if c.get("layer_types").is_none() {
        // transformers: five sliding layers, then a global one; the last is always global.
        cfg.layer_is_sliding = (0..n).map(|i| (i + 1) % 6 != 0 && i + 1 != n).collect();
    }
    cfg.sliding_window = Some(c.usize_opt("sliding_window")?.unwrap_or(SLIDING_WINDOW));
    let rope = c.get("rope_parameters").and_then(Value::as_object);
    let kind = |name: &str, key: &str| -> Result<Option<f32>, ModelError> {
        match rope.and_then(|r| r.get(name)).and_then(|p| p.get(key)) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| hf_bad(format!("rope_parameters.{name}.{key} should be a number"))),
        }
    };
    cfg.rope_theta_local = Some(kind("sliding_attention", "rope_theta")?.unwrap_or(LOCAL_THETA));
    let local_partial = kind("sliding_attention", "partial_rotary_factor")?.unwrap_or(1.0);
    cfg.rope_dim = ((cfg.head_dim as f32 * local_partial) as usize) & !1;
    let global_head_dim = c.usize_opt("global_head_dim")?.unwrap_or(GLOBAL_HEAD_DIM);
    let k_eq_v = c.bool_opt("attention_k_eq_v")?.unwrap_or(false);
    let global_kv_heads = match c.usize_opt("num_global_key_value_heads")? {
        Some(h) if k_eq_v => h,
        _ => cfg.n_kv_heads,
    };
    let global_partial = kind("full_attention", "partial_rotary_factor")?.unwrap_or(1.0);
    // transformers' proportional RoPE: int(partial * head_dim // 2) rotating pairs.
    let rotated_pairs = (global_partial * global_head_dim as f32 / 2.0) as usize;
    cfg.variants.global = Some(GlobalAttention {
        head_dim: global_head_dim,
        n_kv_heads: global_kv_heads,
        rope_dim: global_head_dim,
        rotated_dim: 2 * rotated_pairs.min(global_head_dim / 2),
    });
    let shared = c.usize_opt("num_kv_shared_layers")?.unwrap_or(0);
    cfg.variants.kv_shared = shared;
    if c.bool_opt("use_double_wide_mlp")?.unwrap_or(false) && shared > 0 {
        let first_shared = n.saturating_sub(shared);
        cfg.variants.ffn_dims = (0..n)
            .map(|i| {
                if i >= first_shared {
                    2 * cfg.ffn_dim
                } else {
                    cfg.ffn_dim
                }
            })
            .collect();
    }
    cfg.variants.per_layer_input = match c.get("hidden_size_per_layer_input") {
        None if c.0.contains_key("hidden_size_per_layer_input") => None,
        None => Some(PER_LAYER_INPUT),
        Some(_) => c
            .usize_opt("hidden_size_per_layer_input")?
            .filter(|&w| w > 0),
    };
    if let Some(v) = c.usize_opt("vocab_size_per_layer_input")? {
        if cfg.variants.per_layer_input.is_some() && v != cfg.vocab_size {
            return Err(hf_bad(format!(
                "vocab_size_per_layer_input {v} differs from vocab_size {}; not supported",
                cfg.vocab_size
            )));
        }
    }
    cfg.attention_scale = 1.0;
    cfg.embedding_scale = Some((cfg.hidden_size as f32).sqrt());
    cfg.final_logit_softcap = c.f32_opt("final_logit_softcapping")?;
    Ok(())
}
