//! [`ModelConfig::from_hf_config`]: the model shape from a Hugging Face `config.json`. The keys
//! every family shares are read here (multimodal wrappers keep them in a nested
//! `text_config`, merged over the top level); the [`Family`](crate::family::Family) found by
//! `architectures` / `model_type` gives the defaults and reads the rest (its `hf_extra` hook).
//!
//! Invariants: HF checkpoints keep Q/K in NeoX order, so every HF folder gets
//! [`RopeStyle::Neox`]; norm weights get the family's `hf_norm_offset`. Defaults are those of
//! the transformers config classes. transformers 5 writes `rope_parameters` (theta and
//! scaling in one object; per layer kind for families with local layers) beside the older
//! `rope_theta` + `rope_scaling`; `layer_types` beside older per-family keys.

use super::{yarn_mscale, ModelConfig, RopeScaling};
use crate::family::{
    self,
    keys::{hf_bad as bad, HfKeys as Cfg},
};
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;
use serde_json::Value;

impl ModelConfig {
    /// Reads the config from a parsed `config.json` and checks it with [`ModelConfig::validate`].
    pub fn from_hf_config(json: &Value) -> Result<ModelConfig, ModelError> {
        let top = json
            .as_object()
            .ok_or_else(|| bad("the top level is not an object".into()))?;
        // Multimodal wrappers keep the language model's settings in text_config; merge them
        // over the top level (so `architectures` and `tie_word_embeddings` still come through).
        let mut merged = top.clone();
        if let Some(Value::Object(text)) = top.get("text_config") {
            for (k, v) in text {
                merged.insert(k.clone(), v.clone());
            }
        }
        let c = Cfg(&merged);
        let arch_names: Vec<String> = match top.get("architectures") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect(),
            _ => Vec::new(),
        };
        let model_type = c.str_opt("model_type").unwrap_or("").to_string();
        let Some(fam) = family::by_hf(&arch_names, &model_type) else {
            let name = arch_names.first().cloned().unwrap_or(model_type);
            return Err(ModelError::UnknownArchitecture(if name.is_empty() {
                "<config.json names no architecture>".into()
            } else {
                name
            }));
        };
        let d = fam.hf_defaults;

        let n_layers = c.usize("num_hidden_layers")?;
        let hidden_size = c.usize("hidden_size")?;
        let n_heads = c.usize("num_attention_heads")?;
        if n_heads == 0 {
            return Err(bad("num_attention_heads is 0".into()));
        }
        let n_kv_heads = c.usize_opt("num_key_value_heads")?.unwrap_or(n_heads);
        let head_dim = match c.usize_opt("head_dim")? {
            Some(h) => h,
            None => d.head_dim.unwrap_or(hidden_size / n_heads),
        };
        // Absent in configs whose every MLP is a mixture (Qwen3.5-MoE): `validate` refuses a
        // dense layer left without a width.
        let ffn_dim = c.usize_opt("intermediate_size")?.unwrap_or(0);
        let vocab_size = c.usize("vocab_size")?;
        let rms_eps = c.f32_opt("rms_norm_eps")?.unwrap_or(d.rms_eps);
        let rope_params = c.get("rope_parameters").and_then(Value::as_object);
        let (global_params, local_params) = match rope_params {
            Some(p) if p.contains_key("full_attention") || p.contains_key("sliding_attention") => (
                p.get("full_attention").and_then(Value::as_object),
                p.get("sliding_attention").and_then(Value::as_object),
            ),
            Some(p) => (Some(p), None),
            None => (None, None),
        };
        let rope_theta = match global_params {
            Some(p) => match Cfg(p).f32_opt("rope_theta")? {
                Some(t) => t,
                None => c.f32_opt("rope_theta")?.unwrap_or(d.rope_theta),
            },
            None => c.f32_opt("rope_theta")?.unwrap_or(d.rope_theta),
        };
        let context_length = c
            .usize_opt("max_position_embeddings")?
            .unwrap_or(d.context_length);
        // transformers 5 keeps partial_rotary_factor in rope_parameters.
        let partial = match c.f32_opt("partial_rotary_factor")? {
            Some(p) => p,
            None => match global_params {
                Some(p) => Cfg(p).f32_opt("partial_rotary_factor")?.unwrap_or(1.0),
                None => 1.0,
            },
        };
        let rope_dim = ((head_dim as f32 * partial) as usize) & !1;
        let rope_scaling = match global_params {
            Some(p) => parse_rope_scaling(Some(&Value::Object(p.clone())), context_length)?,
            None => parse_rope_scaling(c.get("rope_scaling"), context_length)?,
        };
        let rope_theta_local = match local_params {
            Some(p) => Cfg(p).f32_opt("rope_theta")?,
            None => None,
        };
        let tie_word_embeddings = c
            .bool_opt("tie_word_embeddings")?
            .unwrap_or(d.tie_word_embeddings);

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

        let layer_is_sliding = c
            .layer_types(n_layers)?
            .unwrap_or_else(|| vec![false; n_layers]);
        let sliding_window = if layer_is_sliding.iter().any(|&s| s) {
            c.usize_opt("sliding_window")?
        } else {
            None
        };
        let mut cfg = ModelConfig {
            arch: fam.arch,
            n_layers,
            hidden_size,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            rms_eps,
            norm_weight_offset: fam.hf_norm_offset,
            rope_theta,
            rope_theta_local,
            rope_scaling,
            rope_style: RopeStyle::Neox,
            rope_dim,
            context_length,
            sliding_window,
            layer_is_sliding,
            layer_uses_rope: vec![true; n_layers],
            query_temperature: None,
            attention_scale: 1.0 / (head_dim as f32).sqrt(),
            attn_logit_softcap: None,
            final_logit_softcap: None,
            embedding_scale: None,
            residual_scale: None,
            logit_scale: None,
            tie_word_embeddings,
            variants: Default::default(),
            moe: None,
            hybrid: None,
        };
        (fam.hf_extra)(&c, &mut cfg)?;
        cfg.validate()?;
        Ok(cfg)
    }
}

fn parse_rope_scaling(v: Option<&Value>, context_length: usize) -> Result<RopeScaling, ModelError> {
    let Some(v) = v else {
        return Ok(RopeScaling::None);
    };
    let o = v
        .as_object()
        .ok_or_else(|| bad(format!("rope_scaling should be an object, got {v}")))?;
    let c = Cfg(o);
    let ty = c
        .str_opt("rope_type")
        .or(c.str_opt("type"))
        .unwrap_or("default");
    let factor = c.f32_opt("factor")?.unwrap_or(1.0);
    let orig = c
        .usize_opt("original_max_position_embeddings")?
        .unwrap_or(context_length);
    Ok(match ty {
        "default" => RopeScaling::None,
        // Gemma 4's partial rotation: which dimensions rotate is the family's to read
        // (`GlobalAttention::rotated_dim`); the frequencies are divided by `factor`.
        "proportional" if factor == 1.0 => RopeScaling::None,
        "proportional" => RopeScaling::Linear { factor },
        "linear" => RopeScaling::Linear { factor },
        "llama3" => RopeScaling::Llama3 {
            factor,
            low_freq_factor: c.f32_opt("low_freq_factor")?.unwrap_or(1.0),
            high_freq_factor: c.f32_opt("high_freq_factor")?.unwrap_or(4.0),
            original_max_position: c
                .usize_opt("original_max_position_embeddings")?
                .unwrap_or(8192),
        },
        "yarn" => RopeScaling::Yarn {
            factor,
            original_max_position: orig,
            beta_fast: c.f32_opt("beta_fast")?.unwrap_or(32.0),
            beta_slow: c.f32_opt("beta_slow")?.unwrap_or(1.0),
            // transformers' `_compute_yarn_parameters`: `attention_factor` when given, else
            // the ratio of the two mscales when both are given, else get_mscale(factor).
            attention_factor: match (
                c.f32_opt("attention_factor")?,
                c.f32_opt("mscale")?,
                c.f32_opt("mscale_all_dim")?,
            ) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) => yarn_mscale(factor, m) / yarn_mscale(factor, all),
                _ => yarn_mscale(factor, 1.0),
            },
            truncate: c.bool_opt("truncate")?.unwrap_or(true),
        },
        "longrope" | "su" => {
            let list = |k: &str| -> Result<Vec<f32>, ModelError> {
                match c.get(k) {
                    Some(Value::Array(a)) => a
                        .iter()
                        .map(|x| {
                            x.as_f64()
                                .map(|x| x as f32)
                                .filter(|x| *x > 0.0)
                                .ok_or_else(|| {
                                    bad(format!("{k} entry {x} is not a positive number"))
                                })
                        })
                        .collect(),
                    _ => Err(bad(format!("LongRoPE rope_scaling needs the list {k}"))),
                }
            };
            let orig = c.usize("original_max_position_embeddings")?;
            // transformers' `_compute_longrope_parameters`: the factor defaults to the ratio
            // of the context to the original one; the attention factor to
            // sqrt(1 + ln(factor) / ln(original)).
            let factor = match c.f32_opt("factor")? {
                Some(f) => f,
                None => context_length as f32 / orig.max(1) as f32,
            };
            let attention_factor = match c.f32_opt("attention_factor")? {
                Some(a) => a,
                None if factor <= 1.0 || orig <= 1 => 1.0,
                None => (1.0 + factor.ln() / (orig as f32).ln()).sqrt(),
            };
            RopeScaling::LongRope {
                long_factor: list("long_factor")?,
                short_factor: list("short_factor")?,
                original_max_position: orig,
                attention_factor,
            }
        }
        other => {
            return Err(bad(format!(
                "rope_scaling type {other:?} is not supported (linear, llama3, yarn, longrope)"
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Architecture;
    use serde_json::json;

    #[test]
    fn smollm_style_llama() {
        let c = ModelConfig::from_hf_config(&json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
            "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
            "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
            "tie_word_embeddings": true, "rope_scaling": null
        }))
        .unwrap();
        assert_eq!(c.arch, Architecture::Llama);
        assert_eq!((c.head_dim, c.rope_dim, c.n_kv_heads), (64, 64, 3));
        assert_eq!(c.rope_style, RopeStyle::Neox);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.rope_scaling, RopeScaling::None);
    }

    #[test]
    fn llama3_scaling_and_unknown_arch() {
        let c = ModelConfig::from_hf_config(&json!({
            "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
            "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 10,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        }))
        .unwrap();
        assert!(
            matches!(c.rope_scaling, RopeScaling::Llama3 { factor, original_max_position: 8192, .. } if factor == 8.0)
        );
        let e = ModelConfig::from_hf_config(&json!({"architectures": ["BertModel"]})).unwrap_err();
        assert!(e.to_string().contains("BertModel"), "{e}");
    }

    #[test]
    fn gemma3_nested_text_config() {
        let c = ModelConfig::from_hf_config(&json!({
            "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "text_config": {
                "model_type": "gemma3_text", "num_hidden_layers": 12, "hidden_size": 640,
                "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                "intermediate_size": 2048, "vocab_size": 262144, "sliding_window": 512,
                "query_pre_attn_scalar": 256, "rope_local_base_freq": 10000.0,
                "rope_theta": 1000000.0, "max_position_embeddings": 32768
            }
        }))
        .unwrap();
        assert_eq!(c.arch, Architecture::Gemma3);
        assert_eq!(c.norm_weight_offset, 1.0);
        assert_eq!(c.sliding_window, Some(512));
        let globals: Vec<usize> = (0..12).filter(|&i| !c.layer_is_sliding[i]).collect();
        assert_eq!(globals, vec![5, 11]);
        assert_eq!(c.attention_scale, 1.0 / 16.0);
        assert_eq!(c.embedding_scale, Some(640f32.sqrt()));
        assert_eq!(c.rope_theta_local, Some(10000.0));
        assert!(c.tie_word_embeddings);
    }

    #[test]
    fn transformers5_rope_parameters() {
        let c = ModelConfig::from_hf_config(&json!({
            "architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
            "intermediate_size": 128, "vocab_size": 10,
            "rope_parameters": {
                "full_attention": {"rope_theta": 500000.0, "rope_type": "linear", "factor": 8.0},
                "sliding_attention": {"rope_theta": 20000.0, "rope_type": "default"}
            }
        }))
        .unwrap();
        assert_eq!(c.rope_theta, 500000.0);
        assert_eq!(c.rope_theta_local, Some(20000.0));
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
        let c = ModelConfig::from_hf_config(&json!({
            "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "hidden_size": 64,
            "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 10,
            "rope_parameters": {"rope_theta": 123.0, "rope_type": "default"}
        }))
        .unwrap();
        assert_eq!(c.rope_theta, 123.0);
        assert_eq!(c.rope_scaling, RopeScaling::None);
    }

    #[test]
    fn gemma3_layer_types_win() {
        let mut types = vec!["sliding_attention"; 4];
        types[1] = "full_attention";
        let c = ModelConfig::from_hf_config(&json!({
            "architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 4, "hidden_size": 64,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
            "intermediate_size": 128, "vocab_size": 10, "layer_types": types
        }))
        .unwrap();
        assert_eq!(c.layer_is_sliding, vec![true, false, true, true]);
    }
}
