//! Model families as data: one [`Family`] per architecture, each in its own file, read by
//! everything that needs to know a family — the config readers (GGUF metadata and Hugging
//! Face `config.json`), the tensor-name maps (`hf.rs`), the GGUF/HF writers of pagoda-compress,
//! the distillation student of pagoda-train and the forward pass (one decoder stack for all
//! families, [`crate::arch::decoder`], driven by [`Block`]).
//!
//! A family is:
//! - its **names**: GGUF `general.architecture` values, HF `architectures` class names and
//!   `model_type`s (the first of each is what writers write);
//! - its **block** ([`Block`]): norm placement, gate activation, whether Q/K are normalized per
//!   head and whether Q/K/V carry biases;
//! - its **file conventions**: the RoPE pair order of its GGUF files (llama.cpp's converter
//!   permutes the Q/K rows of the families it runs with "normal" RoPE), the offset its HF norm
//!   weights are stored with, defaults the reference implementations use for absent keys;
//! - **hooks** for what the shared readers cannot know: which layers slide or skip RoPE,
//!   soft-caps, embedding scale, attention scale ([`Family::gguf_extra`],
//!   [`Family::hf_extra`]), run after the shared keys are read.
//!
//! Adding a family: a file here with its `SPEC` (copy the nearest family), an
//! [`Architecture`] variant, an entry in [`FAMILIES`], and its goldens (ARCHITECTURE.md, "Adding
//! a model family"). Invariant: every [`Architecture`] has exactly one entry in [`FAMILIES`]
//! and no two families share a GGUF name, HF class or model type (unit-tested).

mod gemma3;
mod llama;
mod mistral3;
mod phi3;
mod qwen2;
mod qwen3;
mod smollm3;

pub mod keys;

use crate::config::{Architecture, ModelConfig};
use crate::weights::Weights;
use crate::ModelError;
use keys::{GgufKeys, HfKeys};
use pagoda_kernels::ops::RopeStyle;

/// The gate's activation of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen, SmolLM).
    Silu,
    /// GeGLU with the tanh approximation (Gemma).
    GeluTanh,
}

/// Where a decoder layer normalizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// RMSNorm before attention and before the MLP (Llama): tensors `attn_norm`, `ffn_norm`.
    Pre,
    /// Also after each, before the residual add (Gemma 2/3): `post_attention_norm`,
    /// `post_ffw_norm` besides the two pre-norms.
    Sandwich,
}

/// What a decoder layer of a family is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub norms: NormPlacement,
    pub activation: Activation,
    /// Per-head RMSNorm of queries and keys before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Q, K and V projections carry biases.
    pub qkv_bias: bool,
}

/// Defaults for keys a `config.json` may omit: the transformers config class's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HfDefaults {
    pub rope_theta: f32,
    pub context_length: usize,
    pub rms_eps: f32,
    pub tie_word_embeddings: bool,
    /// `head_dim` when absent (`None`: `hidden_size / num_attention_heads`).
    pub head_dim: Option<usize>,
}

/// A family's hook that splits fused projections ([`Family::split_fused`]).
pub type SplitFused = fn(&ModelConfig, &mut Weights) -> Result<(), ModelError>;

/// One model family: see the module doc.
#[derive(Debug)]
pub struct Family {
    pub arch: Architecture,
    /// For people: "Qwen3", "Gemma 3".
    pub display: &'static str,
    /// GGUF `general.architecture` names read; the first is written.
    pub gguf_names: &'static [&'static str],
    /// HF `architectures` class names read (a prefix match: multimodal wrappers such as
    /// `Gemma3ForConditionalGeneration` count); the first is written.
    pub hf_classes: &'static [&'static str],
    /// HF `model_type` values read (top level or `text_config`); the first is written.
    pub hf_model_types: &'static [&'static str],
    pub block: Block,
    /// Pair order RoPE rotates in this family's GGUF files. llama.cpp's converter permutes
    /// the Q/K rows of "normal"-RoPE families into interleaved pairs; HF folders are always
    /// NeoX halves.
    pub gguf_rope_style: RopeStyle,
    /// Added to every RMSNorm weight of an HF folder (Gemma stores `w` and uses `1 + w`;
    /// its GGUF files already hold `1 + w`).
    pub hf_norm_offset: f32,
    /// llama.cpp reads Llama 3 RoPE scaling from this family's GGUF files as the
    /// `rope_freqs.weight` tensor (and so does Pagoda; other families ignore the tensor).
    pub gguf_rope_freqs: bool,
    /// RMSNorm epsilon of a GGUF file that does not say.
    pub gguf_rms_eps: f32,
    pub hf_defaults: HfDefaults,
    /// Reads what only this family has from GGUF metadata, after the shared keys.
    pub gguf_extra: fn(&GgufKeys<'_>, &mut ModelConfig) -> Result<(), ModelError>,
    /// Reads what only this family has from `config.json`, after the shared keys.
    pub hf_extra: fn(&HfKeys<'_>, &mut ModelConfig) -> Result<(), ModelError>,
    /// For families whose files fuse projections (Phi-3's `attn_qkv`, and `ffn_up` holding
    /// gate and up): splits them into the canonical `attn_q`/`attn_k`/`attn_v` and
    /// `ffn_gate`/`ffn_up` views of the same bytes, when a model is opened. Writers refuse
    /// such families (they would have to fuse again for llama.cpp).
    pub split_fused: Option<SplitFused>,
}

impl Family {
    /// The GGUF `general.architecture` a writer writes.
    pub fn gguf_name(&self) -> &'static str {
        self.gguf_names[0]
    }

    /// The HF class name (`architectures[0]`) a writer writes.
    pub fn hf_class(&self) -> &'static str {
        self.hf_classes[0]
    }

    /// The HF `model_type` a writer writes.
    pub fn hf_model_type(&self) -> &'static str {
        self.hf_model_types[0]
    }
}

/// Every family Pagoda runs.
pub static FAMILIES: &[&Family] = &[
    &llama::SPEC,
    &qwen2::SPEC,
    &gemma3::SPEC,
    &qwen3::SPEC,
    &smollm3::SPEC,
    &mistral3::SPEC,
    &phi3::SPEC,
];

/// The family of `arch`.
pub fn of(arch: Architecture) -> &'static Family {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.arch == arch)
        .unwrap_or(&llama::SPEC)
}

/// The family a GGUF `general.architecture` names.
pub fn by_gguf_name(name: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.gguf_names.contains(&name))
}

/// The family of an HF `config.json`: by class name first (`architectures`), else by
/// `model_type`.
pub fn by_hf(classes: &[String], model_type: &str) -> Option<&'static Family> {
    let by_class = classes.iter().find_map(|c| {
        FAMILIES.iter().copied().find(|f| {
            f.hf_classes.iter().any(|k| {
                c == k || c.starts_with(&format!("{}For", k.trim_end_matches("ForCausalLM")))
            })
        })
    });
    by_class.or_else(|| {
        FAMILIES
            .iter()
            .copied()
            .find(|f| f.hf_model_types.contains(&model_type))
    })
}

/// Applies the family's [`Family::split_fused`] to freshly opened weights (a no-op for
/// families without fused projections).
pub fn prepare_weights(cfg: &ModelConfig, weights: &mut Weights) -> Result<(), ModelError> {
    match cfg.arch.family().split_fused {
        Some(split) => split(cfg, weights),
        None => Ok(()),
    }
}

/// The GGUF names of every family, for error messages.
pub fn gguf_names() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.gguf_names.iter().copied())
        .collect()
}

/// No hook: the family has nothing beyond the shared keys.
fn nothing_gguf(_: &GgufKeys<'_>, _: &mut ModelConfig) -> Result<(), ModelError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_architecture_has_one_family_and_names_are_unique() {
        for arch in Architecture::ALL {
            let n = FAMILIES.iter().filter(|f| f.arch == *arch).count();
            assert_eq!(n, 1, "{arch:?} has {n} families");
            assert_eq!(of(*arch).arch, *arch);
        }
        assert_eq!(FAMILIES.len(), Architecture::ALL.len());
        // Unique within each namespace (a GGUF name may equal a model type: "llama").
        let namespaces: [fn(&Family) -> &'static [&'static str]; 3] =
            [|f| f.gguf_names, |f| f.hf_classes, |f| f.hf_model_types];
        for names in namespaces {
            let mut seen = HashSet::new();
            for f in FAMILIES {
                assert!(!names(f).is_empty(), "{:?} names nothing", f.arch);
                for name in names(f) {
                    assert!(seen.insert(*name), "{name} is claimed twice");
                }
            }
        }
    }

    #[test]
    fn lookups() {
        assert_eq!(
            by_gguf_name("mistral").map(|f| f.arch),
            Some(Architecture::Llama)
        );
        assert_eq!(
            by_gguf_name("qwen3").map(|f| f.arch),
            Some(Architecture::Qwen3)
        );
        assert!(by_gguf_name("bert").is_none());
        let classes = |s: &str| vec![s.to_string()];
        assert_eq!(
            by_hf(&classes("Gemma3ForConditionalGeneration"), "").map(|f| f.arch),
            Some(Architecture::Gemma3)
        );
        assert_eq!(
            by_hf(&classes("Qwen3ForCausalLM"), "qwen3").map(|f| f.arch),
            Some(Architecture::Qwen3)
        );
        assert_eq!(
            by_hf(&[], "smollm3").map(|f| f.arch),
            Some(Architecture::SmolLM3)
        );
        // Qwen2 must not claim Qwen2.5-VL's or Qwen3's classes by prefix.
        assert_eq!(
            by_hf(&classes("Qwen3ForCausalLM"), "").map(|f| f.arch),
            Some(Architecture::Qwen3)
        );
        assert!(by_hf(&classes("BertModel"), "bert").is_none());
    }
}
