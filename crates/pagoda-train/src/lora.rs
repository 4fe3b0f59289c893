//! LoRA pairs for training and their export as a PEFT adapter folder.
//!
//! Owns: [`LoraSpec`] (rank, alpha, targeted linears), [`LoraSet`] (one `A [r, in]` /
//! `B [out, r]` pair of `Var`s per targeted linear, initialised as peft does: `A`
//! kaiming-uniform with `a = √5`, i.e. uniform in `±1/√in`, `B` zero, so training starts at
//! the base model), and [`LoraSet::write_peft`], which writes `adapter_config.json` +
//! `adapter_model.safetensors` under Hugging Face module names (what `pagoda merge-lora`
//! and `pagoda_compress::merge::merge_lora` read).
//!
//! Invariants: pairs live in the student's Hugging Face row order (so the written adapter is
//! a plain PEFT adapter; the merge puts a Llama GGUF's Q/K rows in llama.cpp's order);
//! `A` is drawn in (layer, target) order from one seeded generator, so a seed fixes the
//! initial adapter.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{Device, Tensor, Var};
use pagoda_model::hf::hf_name;
use pagoda_model::ModelConfig;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::error::{Result, TrainError};

/// The targets `--lora-targets` accepts, and the GGUF linear each names.
pub const TARGETS: [(&str, &str); 7] = [
    ("q", "attn_q"),
    ("k", "attn_k"),
    ("v", "attn_v"),
    ("o", "attn_output"),
    ("gate", "ffn_gate"),
    ("up", "ffn_up"),
    ("down", "ffn_down"),
];

/// What LoRA trains.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    pub rank: usize,
    pub alpha: f32,
    /// GGUF short names of the targeted linears (`attn_q`, `ffn_down`, ...), in
    /// [`TARGETS`] order, no repeats.
    pub targets: Vec<&'static str>,
}

impl LoraSpec {
    /// Parses `q,k,v,o,gate,up,down` (HF names such as `q_proj` are accepted too).
    pub fn new(rank: usize, alpha: f32, targets: &str) -> Result<LoraSpec> {
        if rank == 0 {
            return Err(TrainError::InvalidOption(
                "--lora-rank must be at least 1".into(),
            ));
        }
        if !(alpha.is_finite() && alpha > 0.0) {
            return Err(TrainError::InvalidOption(format!(
                "--lora-alpha must be a positive number, not {alpha}"
            )));
        }
        let mut wanted = Vec::new();
        for t in targets.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let short = t.strip_suffix("_proj").unwrap_or(t);
            let Some(&(_, gguf)) = TARGETS.iter().find(|(n, _)| *n == short) else {
                return Err(TrainError::InvalidOption(format!(
                    "unknown --lora-targets entry {t:?}; choose from q, k, v, o, gate, up, down"
                )));
            };
            wanted.push(gguf);
        }
        if wanted.is_empty() {
            return Err(TrainError::InvalidOption(
                "--lora-targets names no linear; choose from q, k, v, o, gate, up, down".into(),
            ));
        }
        let targets = TARGETS
            .iter()
            .map(|&(_, g)| g)
            .filter(|g| wanted.contains(g))
            .collect();
        Ok(LoraSpec {
            rank,
            alpha,
            targets,
        })
    }

    /// `alpha / rank`, peft's scaling.
    pub fn scaling(&self) -> f64 {
        self.alpha as f64 / self.rank as f64
    }
}

/// One trainable pair.
#[derive(Debug, Clone)]
pub struct LoraPair {
    /// `[rank, in]`.
    pub a: Var,
    /// `[out, rank]`.
    pub b: Var,
    pub scaling: f64,
}

/// The pairs of every targeted linear of every layer.
#[derive(Debug, Clone)]
pub struct LoraSet {
    spec: LoraSpec,
    arch: pagoda_model::Architecture,
    /// By (layer, GGUF short name).
    pairs: BTreeMap<(usize, &'static str), LoraPair>,
}

/// `(out, in)` of a decoder linear.
fn linear_shape(cfg: &ModelConfig, short: &str) -> (usize, usize) {
    let (d, f) = (cfg.hidden_size, cfg.ffn_dim);
    let q = cfg.n_heads * cfg.head_dim;
    let kv = cfg.n_kv_heads * cfg.head_dim;
    match short {
        "attn_q" => (q, d),
        "attn_k" | "attn_v" => (kv, d),
        "attn_output" => (d, q),
        "ffn_gate" | "ffn_up" => (f, d),
        _ => (d, f),
    }
}

impl LoraSet {
    /// Fresh pairs for `cfg` (`A` from `seed`, `B` zero).
    pub fn new(spec: &LoraSpec, cfg: &ModelConfig, seed: u64) -> Result<LoraSet> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x4c6f_5241);
        let mut pairs = BTreeMap::new();
        for layer in 0..cfg.n_layers {
            for &short in &spec.targets {
                let (out, inp) = linear_shape(cfg, short);
                let bound = 1.0 / (inp as f32).sqrt();
                let a: Vec<f32> = (0..spec.rank * inp)
                    .map(|_| rng.gen_range(-bound..bound))
                    .collect();
                let a = Var::from_tensor(&Tensor::from_vec(a, (spec.rank, inp), &Device::Cpu)?)?;
                let b = Var::zeros((out, spec.rank), candle_core::DType::F32, &Device::Cpu)?;
                pairs.insert(
                    (layer, short),
                    LoraPair {
                        a,
                        b,
                        scaling: spec.scaling(),
                    },
                );
            }
        }
        Ok(LoraSet {
            spec: spec.clone(),
            arch: cfg.arch,
            pairs,
        })
    }

    pub fn spec(&self) -> &LoraSpec {
        &self.spec
    }

    /// The pair on `blk.{layer}.{short}`, if targeted.
    pub fn get(&self, layer: usize, short: &str) -> Option<&LoraPair> {
        self.pairs
            .iter()
            .find(|((l, s), _)| *l == layer && *s == short)
            .map(|(_, p)| p)
    }

    /// `(name, var)` of every `A` and `B`: `blk.{layer}.{short}.lora_a` / `.lora_b`.
    pub fn vars(&self) -> Vec<(String, &Var)> {
        let mut out = Vec::with_capacity(2 * self.pairs.len());
        for ((layer, short), p) in &self.pairs {
            out.push((format!("blk.{layer}.{short}.lora_a"), &p.a));
            out.push((format!("blk.{layer}.{short}.lora_b"), &p.b));
        }
        out
    }

    /// The Hugging Face module path of a pair (`model.layers.0.self_attn.q_proj`).
    fn module(&self, layer: usize, short: &str) -> Result<String> {
        let canonical = format!("blk.{layer}.{short}.weight");
        let hf = hf_name(&canonical, self.arch).ok_or_else(|| {
            TrainError::Unsupported(format!("{canonical} has no Hugging Face name"))
        })?;
        Ok(hf.trim_end_matches(".weight").to_string())
    }

    /// Writes the adapter as peft's `save_pretrained` does into the existing folder `dir`.
    pub fn write_peft(&self, dir: &Path, base_model: &str) -> Result<()> {
        let mut tensors = HashMap::new();
        for ((layer, short), p) in &self.pairs {
            let module = self.module(*layer, short)?;
            tensors.insert(
                format!("base_model.model.{module}.lora_A.weight"),
                p.a.as_tensor().clone(),
            );
            tensors.insert(
                format!("base_model.model.{module}.lora_B.weight"),
                p.b.as_tensor().clone(),
            );
        }
        let st = dir.join("adapter_model.safetensors");
        candle_core::safetensors::save(&tensors, &st)?;
        let hf_targets: Vec<String> = self
            .spec
            .targets
            .iter()
            .filter_map(|s| self.module(0, s).ok())
            .filter_map(|m| m.rsplit('.').next().map(str::to_string))
            .collect();
        let config = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.spec.rank,
            "lora_alpha": self.spec.alpha,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "target_modules": hf_targets,
            "base_model_name_or_path": base_model,
        });
        let path = dir.join("adapter_config.json");
        let text = serde_json::to_string_pretty(&config)
            .map_err(|e| TrainError::Data(format!("adapter_config.json: {e}")))?;
        std::fs::write(&path, text).map_err(|e| TrainError::io(&path, e))
    }
}
