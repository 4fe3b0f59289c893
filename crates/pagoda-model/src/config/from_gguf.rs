//! [`ModelConfig::from_gguf`]: the model shape from GGUF metadata (`{arch}.*` keys as written by
//! llama.cpp's converter). The keys every family shares are read here; the file's
//! [`Family`](crate::family::Family) gives the defaults and RoPE pair order and reads the rest
//! (its `gguf_extra` hook).
//!
//! Llama 3 RoPE scaling is carried in GGUF by a `rope_freqs.weight` tensor, not by metadata;
//! only `rope.scaling.type` linear/yarn are read here.

use super::{yarn_mscale, ModelConfig, RopeScaling};
use crate::family::{self, keys::GgufKeys};
use crate::gguf::{GgufFile, GgufValue};
use crate::ModelError;

const NO_VOCAB_SIZE: &str =
    "cannot tell the vocabulary size: no vocab_size key, tokenizer.ggml.tokens or token_embd.weight";

impl ModelConfig {
    /// Reads the config from a GGUF file's metadata and checks it with [`ModelConfig::validate`].
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let arch_name = file.architecture()?;
        let fam =
            family::by_gguf_name(arch_name).ok_or_else(|| ModelError::UnsupportedArchitecture {
                path: file.path().to_path_buf(),
                arch: arch_name.to_string(),
            })?;
        let k = GgufKeys {
            file,
            arch: arch_name,
        };
        let missing = |name: &str| k.bad(format!("metadata key {:?} is missing", k.key(name)));
        let n_layers = k.usize("block_count")?;
        let hidden_size = k.usize("embedding_length")?;
        let n_heads = k
            .uniform("attention.head_count")?
            .ok_or_else(|| missing("attention.head_count"))?;
        // Layer 0's value where the family reads the per-layer arrays itself.
        let per_layer = |name: &str| {
            if fam.gguf_varying_layers {
                k.first_of(name)
            } else {
                k.uniform(name)
            }
        };
        let n_kv_heads = per_layer("attention.head_count_kv")?.unwrap_or(n_heads);
        // Absent in files whose every MLP is a mixture (Qwen3.5-MoE): `validate` refuses a
        // dense layer left without a width.
        let ffn_dim = per_layer("feed_forward_length")?.unwrap_or(0);
        if n_heads == 0 {
            return Err(k.bad(format!("{} is 0", k.key("attention.head_count"))));
        }
        let head_dim = match k.usize_opt("attention.key_length")? {
            Some(d) => d,
            None => hidden_size / n_heads,
        };
        if let Some(v) = k.usize_opt("attention.value_length")? {
            if v != head_dim {
                return Err(k.bad(format!(
                    "{} = {v} differs from the key length {head_dim}; not supported",
                    k.key("attention.value_length")
                )));
            }
        }
        let vocab_size = match k.usize_opt("vocab_size")? {
            Some(v) => v,
            None => match file.get("tokenizer.ggml.tokens") {
                Some(GgufValue::Array(t)) => t.len(),
                _ => file
                    .tensor("token_embd.weight")
                    .and_then(|t| t.shape().first().copied())
                    .ok_or_else(|| k.bad(NO_VOCAB_SIZE.into()))?,
            },
        };
        let rms_eps = k
            .f32_opt("attention.layer_norm_rms_epsilon")?
            .unwrap_or(fam.gguf_rms_eps);
        let rope_theta = k.f32_opt("rope.freq_base")?.unwrap_or(10_000.0);
        let rope_dim = k.usize_opt("rope.dimension_count")?.unwrap_or(head_dim);
        let context_length = k.usize_opt("context_length")?.unwrap_or(2048);

        super::check_limits(
            n_layers,
            hidden_size,
            n_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            context_length,
        )
        .map_err(|m| k.bad(m))?;

        let rope_scaling = rope_scaling(&k, context_length)?;
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
            norm_weight_offset: 0.0,
            rope_theta,
            rope_theta_local: None,
            rope_scaling,
            rope_style: fam.gguf_rope_style,
            rope_dim,
            context_length,
            sliding_window: None,
            layer_is_sliding: vec![false; n_layers],
            layer_uses_rope: vec![true; n_layers],
            query_temperature: None,
            attention_scale: 1.0 / (head_dim as f32).sqrt(),
            attn_logit_softcap: None,
            final_logit_softcap: None,
            embedding_scale: None,
            residual_scale: None,
            logit_scale: None,
            tie_word_embeddings: file.tensor("output.weight").is_none(),
            variants: Default::default(),
            moe: None,
            hybrid: None,
        };
        (fam.gguf_extra)(&k, &mut cfg)?;
        cfg.validate().map_err(|e| k.bad(e.to_string()))?;
        Ok(cfg)
    }
}

/// `rope.scaling.*`: none, linear or YaRN.
fn rope_scaling(k: &GgufKeys<'_>, context_length: usize) -> Result<RopeScaling, ModelError> {
    let ty = k.str_opt("rope.scaling.type")?;
    let factor = match k.f32_opt("rope.scaling.factor")? {
        Some(f) => Some(f),
        None => k.f32_opt("rope.scale_linear")?,
    };
    let orig = k
        .usize_opt("rope.scaling.original_context_length")?
        .unwrap_or(context_length);
    Ok(match (ty, factor) {
        (Some("none"), _) | (None, None) => RopeScaling::None,
        (Some("linear") | None, Some(f)) if f != 1.0 => RopeScaling::Linear { factor: f },
        (Some("linear") | None, _) => RopeScaling::None,
        (Some("yarn"), f) => {
            let factor = f.unwrap_or(1.0);
            // llama.cpp (llama-context.cpp): with `yarn_log_multiplier` m the temperature is
            // get_mscale(factor, 1) / get_mscale(factor, m), else get_mscale(factor, 1).
            let attention_factor = match k.f32_opt("rope.scaling.yarn_log_multiplier")? {
                Some(m) if m != 0.0 => yarn_mscale(factor, 1.0) / yarn_mscale(factor, m),
                _ => yarn_mscale(factor, 1.0),
            };
            RopeScaling::Yarn {
                factor,
                original_max_position: orig,
                beta_fast: k.f32_opt("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                beta_slow: k.f32_opt("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                attention_factor,
                // GGUF has no key for it; llama.cpp always rounds.
                truncate: true,
            }
        }
        (Some(other), _) => {
            return Err(k.bad(format!(
                "{} = {other:?} is not supported (none, linear, yarn)",
                k.key("rope.scaling.type")
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Architecture;
    use crate::gguf::{GgufArray, GgufWriter};
    use pagoda_kernels::ops::RopeStyle;

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
                beta_slow: 1.0,
                attention_factor: yarn_mscale(4.0, 1.0),
                truncate: true,
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
