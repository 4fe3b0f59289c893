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

const NO_VOCAB_SIZE: &str =
    "cannot tell the vocabulary size: no vocab_size key, tokenizer.ggml.tokens or token_embd.weight";

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
                    .ok_or_else(|| bad(NO_VOCAB_SIZE.into()))?,
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

        super::check_limits(
            n_layers,
            hidden_size,
            n_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            context_length,
        )
        .map_err(bad)?;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufArray, GgufWriter};

    fn base(arch: &str) -> GgufWriter {
        let mut w = GgufWriter::new();
        let k = |s: &str| format!("{arch}.{s}");
        w.add_str("general.architecture", arch)
            .add_u32(k("block_count"), 12)
            .add_u32(k("embedding_length"), 64)
            .add_u32(k("attention.head_count"), 4)
            .add_u32(k("attention.head_count_kv"), 2)
            .add_u32(k("feed_forward_length"), 128)
            .add_u32(k("context_length"), 4096)
            .add_u32(k("vocab_size"), 100);
        w
    }

    fn parse(w: &GgufWriter) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_gguf(&GgufFile::from_bytes("t.gguf", w.to_bytes())?)
    }

    #[test]
    fn qwen2_is_neox_and_reads_yarn() {
        let mut w = base("qwen2");
        w.add_str("qwen2.rope.scaling.type", "yarn")
            .add_f32("qwen2.rope.scaling.factor", 4.0)
            .add_u32("qwen2.rope.scaling.original_context_length", 32768);
        let c = parse(&w).unwrap();
        assert_eq!(c.arch, Architecture::Qwen2);
        assert_eq!(c.rope_style, RopeStyle::Neox);
        assert_eq!(c.head_dim, 16);
        assert_eq!(
            c.rope_scaling,
            RopeScaling::Yarn {
                factor: 4.0,
                original_max_position: 32768,
                beta_fast: 32.0,
                beta_slow: 1.0
            }
        );
        assert!(c.tie_word_embeddings);
    }

    #[test]
    fn llama_linear_scaling_and_per_layer_arrays() {
        let mut w = base("llama");
        w.add_str("llama.rope.scaling.type", "linear")
            .add_f32("llama.rope.scaling.factor", 2.0)
            .add_metadata(
                "llama.attention.head_count_kv",
                GgufValue::Array(GgufArray::I32(vec![2; 12])),
            );
        let c = parse(&w).unwrap();
        assert_eq!(c.rope_style, RopeStyle::Interleaved);
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 });
        assert_eq!(c.n_kv_heads, 2);
        let mut kv = vec![2; 12];
        kv[3] = 4;
        w.add_metadata(
            "llama.attention.head_count_kv",
            GgufValue::Array(GgufArray::I32(kv)),
        );
        let e = parse(&w).unwrap_err().to_string();
        assert!(e.contains("head_count_kv") && e.contains("varies"), "{e}");
        w.add_u32("llama.attention.head_count_kv", 2);
        w.add_str("llama.rope.scaling.type", "longrope");
        assert!(parse(&w).unwrap_err().to_string().contains("longrope"));
    }

    #[test]
    fn gemma3_defaults_and_pattern_key() {
        let mut w = base("gemma3");
        w.add_u32("gemma3.attention.key_length", 32)
            .add_u32("gemma3.attention.value_length", 32)
            .add_u32("gemma3.attention.sliding_window", 512);
        let c = parse(&w).unwrap();
        let globals: Vec<usize> = (0..12).filter(|&i| !c.layer_is_sliding[i]).collect();
        assert_eq!(globals, vec![5, 11]);
        assert_eq!(c.attention_scale, 1.0 / 32f32.sqrt());
        assert_eq!(c.rms_eps, 1e-6);
        assert_eq!(c.norm_weight_offset, 0.0);
        w.add_u32("gemma3.attention.sliding_window_pattern", 3);
        let globals: Vec<usize> = (0..12)
            .filter(|&i| !parse(&w).unwrap().layer_is_sliding[i])
            .collect();
        assert_eq!(globals, vec![2, 5, 8, 11]);
        w.add_f32("gemma3.final_logit_softcapping", 30.0);
        assert_eq!(parse(&w).unwrap().final_logit_softcap, Some(30.0));
    }

    #[test]
    fn absurd_sizes_are_refused_before_allocating() {
        let mut w = base("llama");
        w.add_u32("llama.block_count", 2_113_929_217);
        let e = parse(&w).unwrap_err().to_string();
        assert!(e.contains("layers 2113929217"), "{e}");
        let mut w = base("llama");
        w.add_u32("llama.context_length", u32::MAX);
        assert!(parse(&w)
            .unwrap_err()
            .to_string()
            .contains("context length"));
    }

    #[test]
    fn missing_keys_name_the_key() {
        let mut w = GgufWriter::new();
        w.add_str("general.architecture", "llama");
        let e = parse(&w).unwrap_err().to_string();
        assert!(
            e.contains("t.gguf") && e.contains("llama.block_count"),
            "{e}"
        );
        let mut w = base("llama");
        w.add_u32("llama.attention.head_count", 0);
        assert!(parse(&w).is_err());
    }
}
