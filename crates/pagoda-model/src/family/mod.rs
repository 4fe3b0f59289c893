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
mod gemma4;
mod gpt_oss;
mod granite_hybrid;
mod lfm2;
mod llama;
mod mistral3;
pub mod moe;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen35;
mod qwen3moe;
mod smollm3;

pub mod keys;
mod spec;

pub use spec::{Activation, Block, Family, HfDefaults, NormPlacement, QkNorm, SplitFused};

use crate::config::{Architecture, ModelConfig};
use crate::weights::Weights;
use crate::ModelError;

impl Architecture {
    /// The family spec of this architecture.
    pub fn family(self) -> &'static Family {
        of(self)
    }

    /// The name used by GGUF `general.architecture`.
    pub fn gguf_name(self) -> &'static str {
        self.family().gguf_name()
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
    &gemma4::SPEC,
    &qwen3moe::SPEC,
    &olmoe::SPEC,
    &gpt_oss::SPEC,
    &lfm2::SPEC,
    &qwen2moe::SPEC,
    &lfm2::MOE_SPEC,
    &granite_hybrid::SPEC,
    &qwen35::SPEC,
    &qwen35::MOE_SPEC,
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
/// families without fused projections), and opens stacked experts as one view per expert
/// ([`moe::split_experts`]).
pub fn prepare_weights(cfg: &ModelConfig, weights: &mut Weights) -> Result<(), ModelError> {
    if let Some(split) = cfg.arch.family().split_fused {
        split(cfg, weights)?;
    }
    moe::split_experts(cfg, weights)
}

/// The GGUF names of every family, for error messages.
pub fn gguf_names() -> Vec<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.gguf_names.iter().copied())
        .collect()
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
