//! [`ModelConfig::from_gguf`]: the model shape from GGUF metadata (`{arch}.*` keys as written by
//! llama.cpp's converter).
//!
//! Findings that fix constants here:
//! - RoPE: llama.cpp's converter permutes Q/K rows of `llama` models into interleaved-pair order,
//!   so GGUF `llama` uses [`RopeStyle::Interleaved`]; `qwen2` and `gemma3` are left as in HF
//!   (NeoX halves).
//! - Gemma 3 norms: `convert_hf_to_gguf.py` (`Gemma3Model.modify_tensors`, "ref code in
//!   Gemma3RMSNorm") adds 1.0 to every `*norm.weight` when converting, so GGUF norm weights are
//!   already `1 + w` and `norm_weight_offset` is 0.0. The real gemma-3-270m Q4_K_M file agrees:
//!   its `blk.0.ffn_norm.weight` has minimum exactly 0.0 (a raw weight of -1.0 shifted by one)
//!   and `output_norm.weight` has mean 26 (a raw mean of 25).
//! - Gemma 3 attention scale: llama.cpp uses `1/sqrt(key_length)` except for the 27B model
//!   (62 layers), which uses `1/sqrt(hidden / n_heads)` (its `query_pre_attn_scalar`).
//! - Gemma 3 sliding layers: llama.cpp hard-codes a pattern of 6 (layer `i` is global iff
//!   `(i + 1) % 6 == 0`) unless `gemma3.attention.sliding_window_pattern` says otherwise, and
//!   a local RoPE base of 10 000.
//! - Llama 3 RoPE scaling is carried in GGUF by a `rope_freqs.weight` tensor, not by metadata;
//!   only `rope.scaling.type` linear/yarn are read here.

use super::{Architecture, ModelConfig, RopeScaling};
use crate::gguf::{GgufFile, GgufValue};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

impl ModelConfig {
    /// Reads the config from a GGUF file's metadata and checks it with [`ModelConfig::validate`].
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let arch_name = file.architecture()?;
        let arch = match arch_name {
            "llama" | "mistral" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "gemma3" => Architecture::Gemma3,
            other => {
                return Err(ModelError::UnsupportedArchitecture {
                    path: file.path().to_path_buf(),
                    arch: other.to_string(),
                })
            }
        };
        let a = arch_name;
        let key = |k: &str| format!("{a}.{k}");
        let bad = |message: String| ModelError::Format {
            path: file.path().to_path_buf(),
            message,
        };
        let uniform = |k: &str| -> Result<Option<usize>, ModelError> {
            match file.get_usize_or_array_opt(&key(k))? {
                None => Ok(None),
                Some(v) => match v.split_first() {
                    None => Err(bad(format!("metadata key {:?} is an empty array", key(k)))),
                    Some((first, rest)) if rest.iter().all(|x| x == first) => Ok(Some(*first)),
                    Some(_) => Err(bad(format!(
                        "metadata key {:?} varies per layer ({v:?}); only uniform layers are supported",
                        key(k)
                    ))),
                },
            }
        };
        let n_layers = file.get_usize(&key("block_count"))?;
        let hidden_size = file.get_usize(&key("embedding_length"))?;
        let n_heads = uniform("attention.head_count")?.ok_or_else(|| {
            bad(format!(
                "metadata key {:?} is missing",
                key("attention.head_count")
            ))
        })?;
        let n_kv_heads = uniform("attention.head_count_kv")?.unwrap_or(n_heads);
        let ffn_dim = uniform("feed_forward_length")?.ok_or_else(|| {
            bad(format!(
                "metadata key {:?} is missing",
                key("feed_forward_length")
            ))
        })?;
        if n_heads == 0 {
            return Err(bad(format!("{} is 0", key("attention.head_count"))));
        }
        let head_dim = match file.get_usize_opt(&key("attention.key_length"))? {
            Some(d) => d,
            None => hidden_size / n_heads,
        };
        if let Some(v) = file.get_usize_opt(&key("attention.value_length"))? {
            if v != head_dim {
                return Err(bad(format!(
                    "{} = {v} differs from the key length {head_dim}; not supported",
                    key("attention.value_length")
                )));
            }
        }
        let vocab_size = match file.get_usize_opt(&key("vocab_size"))? {
            Some(v) => v,
            None => match file.get("tokenizer.ggml.tokens") {
                Some(GgufValue::Array(t)) => t.len(),
                _ => file
                    .tensor("token_embd.weight")
                    .and_then(|t| t.shape().first().copied())
                    .ok_or_else(|| bad("cannot tell the vocabulary size: no vocab_size key, tokenizer.ggml.tokens or token_embd.weight".into()))?,
            },
        };
        let default_eps = if arch == Architecture::Gemma3 {
            1e-6
        } else {
            1e-5
        };
        let rms_eps = file
            .get_f32_opt(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(default_eps);
        let rope_theta = file
            .get_f32_opt(&key("rope.freq_base"))?
            .unwrap_or(10_000.0);
        let rope_dim = file
            .get_usize_opt(&key("rope.dimension_count"))?
            .unwrap_or(head_dim);
        let context_length = file.get_usize_opt(&key("context_length"))?.unwrap_or(2048);

        let rope_scaling = {
            let ty = file.get_str_opt(&key("rope.scaling.type"))?;
            let factor = match file.get_f32_opt(&key("rope.scaling.factor"))? {
                Some(f) => Some(f),
                None => file.get_f32_opt(&key("rope.scale_linear"))?,
            };
            let orig = file
                .get_usize_opt(&key("rope.scaling.original_context_length"))?
                .unwrap_or(context_length);
            match (ty, factor) {
                (Some("none"), _) | (None, None) => RopeScaling::None,
                (Some("linear") | None, Some(f)) if f != 1.0 => RopeScaling::Linear { factor: f },
                (Some("linear") | None, _) => RopeScaling::None,
                (Some("yarn"), f) => RopeScaling::Yarn {
                    factor: f.unwrap_or(1.0),
                    original_max_position: orig,
                    beta_fast: file
                        .get_f32_opt(&key("rope.scaling.yarn_beta_fast"))?
                        .unwrap_or(32.0),
                    beta_slow: file
                        .get_f32_opt(&key("rope.scaling.yarn_beta_slow"))?
                        .unwrap_or(1.0),
                },
                (Some(other), _) => {
                    return Err(bad(format!(
                        "{} = {other:?} is not supported (none, linear, yarn)",
                        key("rope.scaling.type")
                    )))
                }
            }
        };

        let rope_style = match arch {
            Architecture::Llama => RopeStyle::Interleaved,
            Architecture::Qwen2 | Architecture::Gemma3 => RopeStyle::Neox,
        };

        let mut cfg = ModelConfig {
            arch,
            n_layers,
            hidden_size,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            rms_eps,
            norm_weight_offset: 0.0,
            rope_theta,
            rope_theta_local: None,
            rope_scaling,
            rope_style,
            rope_dim,
            context_length,
            sliding_window: None,
            layer_is_sliding: vec![false; n_layers],
            attention_scale: 1.0 / (head_dim as f32).sqrt(),
            attn_logit_softcap: None,
            final_logit_softcap: None,
            embedding_scale: None,
            tie_word_embeddings: file.tensor("output.weight").is_none(),
        };

        if arch == Architecture::Gemma3 {
            cfg.sliding_window = file.get_usize_opt(&key("attention.sliding_window"))?;
            cfg.layer_is_sliding = match file.get(&key("attention.sliding_window_pattern")) {
                Some(GgufValue::Array(_)) => {
                    let v = file.get_i32_array(&key("attention.sliding_window_pattern"))?;
                    if v.len() != n_layers {
                        return Err(bad(format!(
                            "{} has {} entries for {n_layers} layers",
                            key("attention.sliding_window_pattern"),
                            v.len()
                        )));
                    }
                    v.into_iter().map(|x| x != 0).collect()
                }
                Some(_) => {
                    let p = file.get_usize(&key("attention.sliding_window_pattern"))?;
                    super::sliding_pattern(n_layers, p)
                }
                None => super::sliding_pattern(n_layers, 6),
            };
            if cfg.sliding_window.is_none() {
                cfg.layer_is_sliding = vec![false; n_layers];
            }
            cfg.rope_theta_local = Some(
                file.get_f32_opt(&key("rope.freq_base_swa"))?
                    .unwrap_or(10_000.0),
            );
            let q_scalar = if n_layers == 62 {
                hidden_size / n_heads
            } else {
                head_dim
            };
            cfg.attention_scale = 1.0 / (q_scalar as f32).sqrt();
            cfg.embedding_scale = Some((hidden_size as f32).sqrt());
            cfg.attn_logit_softcap = file.get_f32_opt(&key("attn_logit_softcapping"))?;
            cfg.final_logit_softcap = file.get_f32_opt(&key("final_logit_softcapping"))?;
        }
        cfg.validate().map_err(|e| bad(e.to_string()))?;
        Ok(cfg)
    }
}
