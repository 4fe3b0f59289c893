//! Merging a PEFT LoRA adapter into a base model (`pagoda merge-lora`): `W += scaling · B·A`
//! for every adapted linear, what peft's `merge_and_unload` does, written as a new model.
//!
//! Owns: [`MergeBase`] (a base as read — GGUF file, or Hugging Face folder, quantized GPTQ/AWQ
//! included — without building a forward pass), [`MergePlan`] (every adapted module matched to
//! its base tensor, checked before any work), the merge of one tensor ([`MergePlan::merged`])
//! and [`MergeDtype`]; `write.rs` streams the result to a GGUF file or an HF folder.
//!
//! Invariants:
//! - Every module of the adapter is matched to a base tensor of the adapter's shape before
//!   anything is written; a module the base lacks, a shape that differs, or an adapter for
//!   Conv1D layouts (`fan_in_fan_out`) is an error naming the module and both shapes.
//! - PEFT module names are Hugging Face paths; they are mapped to the base's canonical (GGUF)
//!   names by [`pagoda_model::hf::canonical_name`]. A Llama GGUF's Q and K rows are in
//!   llama.cpp's interleaved RoPE order, so the adapter's `B` rows are put in that order
//!   ([`crate::quantize::hf_write::row_order_for`], the same permutation the HF writer undoes);
//!   Qwen2 and Gemma 3 GGUFs keep Hugging Face's order.
//! - A quantized base tensor (any block type) is dequantized to f32, merged, and written in
//!   the output dtype; one tensor is in f32 at a time (peak memory: the mapped base plus one
//!   tensor).

pub mod write;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pagoda_kernels::GgmlType;
use pagoda_model::gguf::GgufFile;
use pagoda_model::hf::{canonical_name, HfFolder};
use pagoda_model::lora::{merge_into, LoraAdapter, LoraPair};
use pagoda_model::weights::{TensorView, Weights};
use pagoda_model::ModelConfig;

use crate::quantize::hf_write::row_order_for;
use crate::CompressError;

pub use write::{merge_lora, write_edited, MergeReport, OutputKind, Replaced, TensorEdits};

/// The type merged tensors are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MergeDtype {
    #[default]
    F16,
    BF16,
    F32,
}

impl MergeDtype {
    pub fn ggml(self) -> GgmlType {
        match self {
            MergeDtype::F16 => GgmlType::F16,
            MergeDtype::BF16 => GgmlType::BF16,
            MergeDtype::F32 => GgmlType::F32,
        }
    }

    /// The safetensors dtype name.
    pub fn safetensors(self) -> &'static str {
        match self {
            MergeDtype::F16 => "F16",
            MergeDtype::BF16 => "BF16",
            MergeDtype::F32 => "F32",
        }
    }

    /// transformers' `torch_dtype` name.
    pub fn torch(self) -> &'static str {
        match self {
            MergeDtype::F16 => "float16",
            MergeDtype::BF16 => "bfloat16",
            MergeDtype::F32 => "float32",
        }
    }
}

impl std::str::FromStr for MergeDtype {
    type Err = CompressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f16" | "float16" | "fp16" => Ok(MergeDtype::F16),
            "bf16" | "bfloat16" => Ok(MergeDtype::BF16),
            "f32" | "float32" | "fp32" => Ok(MergeDtype::F32),
            other => Err(CompressError::InvalidInput(format!(
                "unknown --dtype {other:?}; choose f16, bf16 or f32"
            ))),
        }
    }
}

/// A base model as read for merging: its config and weights (canonical names), and what the
/// output needs from its source.
// One value per run: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub enum MergeBase {
    Gguf {
        file: GgufFile,
        config: ModelConfig,
        weights: Weights,
    },
    HfFolder(HfFolder),
}

impl MergeBase {
    /// Opens `path`: a file as GGUF (no tokenizer needed: its metadata is copied), a folder as
    /// a Hugging Face model folder (GPTQ/AWQ checkpoints are read as their blocks). A
    /// bitsandbytes (QLoRA) folder is refused with what to use instead.
    pub fn open(path: &Path) -> Result<MergeBase, CompressError> {
        let meta = std::fs::metadata(path).map_err(|source| pagoda_model::ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if meta.is_dir() {
            if let Some(e) = refuse_bitsandbytes_base(path) {
                return Err(e);
            }
            return Ok(MergeBase::HfFolder(HfFolder::open(path)?));
        }
        let file = GgufFile::open(path)?;
        let config = ModelConfig::from_gguf(&file)?;
        let weights = Weights::from_gguf(&file)?;
        Ok(MergeBase::Gguf {
            file,
            config,
            weights,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        match self {
            MergeBase::Gguf { config, .. } => config,
            MergeBase::HfFolder(f) => &f.config,
        }
    }

    pub fn weights(&self) -> &Weights {
        match self {
            MergeBase::Gguf { weights, .. } => weights,
            MergeBase::HfFolder(f) => &f.weights,
        }
    }

    pub fn is_gguf(&self) -> bool {
        matches!(self, MergeBase::Gguf { .. })
    }

    pub fn path(&self) -> PathBuf {
        match self {
            MergeBase::Gguf { file, .. } => file.path().to_path_buf(),
            MergeBase::HfFolder(f) => f.path.clone(),
        }
    }
}

/// A merge-specific refusal of a bitsandbytes base folder (the loader's own message tells
/// how to deploy; here the user is already merging, into the wrong base).
fn refuse_bitsandbytes_base(dir: &Path) -> Option<CompressError> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let q = v.get("quantization_config")?;
    pagoda_model::lora::is_bitsandbytes(q).then(|| {
        CompressError::InvalidInput(format!(
            "{}: the base is a bitsandbytes (load_in_4bit / NF4) checkpoint, whose packed \
             weights Pagoda does not read. Merge into the original unquantized base model \
             instead (QLoRA trains on it quantized at load; its name is the adapter's \
             base_model_name_or_path), as a Hugging Face folder or a GGUF file",
            dir.display()
        ))
    })
}

/// One adapted module matched to its base tensor.
#[derive(Debug, Clone)]
pub struct PlannedModule {
    /// The adapter's Hugging Face module path (`model.layers.0.self_attn.q_proj`).
    pub module: String,
    /// The base tensor's canonical name (`blk.0.attn_q.weight`).
    pub tensor: String,
    /// `[out, in]`.
    pub shape: [usize; 2],
    pub base_type: GgmlType,
    pub r: usize,
    pub scaling: f32,
    /// The pair to merge, `B`'s rows already in the base tensor's row order.
    pair: LoraPair,
    /// Whether `B`'s rows were permuted (a Llama GGUF's Q or K).
    pub permuted: bool,
}

/// Every adapted module matched to the base tensor it changes, by canonical name.
#[derive(Debug, Clone)]
pub struct MergePlan {
    modules: BTreeMap<String, PlannedModule>,
}

/// At most this many problems are listed in one error.
const MAX_LISTED: usize = 8;

impl MergePlan {
    /// Matches every module of `adapter` to a tensor of `weights` (see the module docs);
    /// `from_gguf` says whether the weights are in a GGUF's row order. All problems are
    /// collected and reported together.
    pub fn new(
        adapter: &LoraAdapter,
        weights: &Weights,
        cfg: &ModelConfig,
        from_gguf: bool,
    ) -> Result<MergePlan, CompressError> {
        let adir = adapter.dir().display();
        if adapter.config().fan_in_fan_out {
            return Err(CompressError::InvalidInput(format!(
                "{adir}: fan_in_fan_out = true is for GPT-2-style Conv1D layers ([in, out]); \
                 the {:?} base's linears are [out, in], so this adapter is not for this model",
                cfg.arch
            )));
        }
        let for_base = match &adapter.config().base_model_name_or_path {
            Some(b) if !b.is_empty() => format!(" (the adapter was trained on {b})"),
            _ => String::new(),
        };
        let mut modules = BTreeMap::new();
        let mut missing = Vec::new();
        let mut mismatched = Vec::new();
        for (module, pair) in adapter.modules() {
            let hf = format!("{module}.weight");
            let Some(tensor) = canonical_name(&hf, cfg.arch) else {
                missing.push(format!("{module} (not a weight of a text model)"));
                continue;
            };
            let Ok(view) = weights.get(&tensor) else {
                let tied = tensor == "output.weight" && weights.contains("token_embd.weight");
                missing.push(if tied {
                    format!("{module} (the base ties lm_head to the token embeddings)")
                } else {
                    format!("{module} (no tensor {tensor})")
                });
                continue;
            };
            let want = pair.weight_shape();
            if view.shape != want {
                mismatched.push(format!(
                    "{module}: the adapter's B·A is [{}, {}] (lora_B [{}, {}], lora_A [{}, {}]) \
                     but the base's {tensor} is {:?}",
                    want[0],
                    want[1],
                    pair.out_features,
                    pair.r,
                    pair.r,
                    pair.in_features,
                    view.shape
                ));
                continue;
            }
            let order = row_order_for(&tensor, want[0], cfg, from_gguf);
            let mut pair = pair.clone();
            if let Some(order) = &order {
                // HF row r is base row order[r]: B's row r moves there.
                let r = pair.r;
                let mut b = vec![0f32; pair.b.len()];
                for (hf_row, &base_row) in order.iter().enumerate() {
                    b[base_row * r..(base_row + 1) * r]
                        .copy_from_slice(&pair.b[hf_row * r..(hf_row + 1) * r]);
                }
                pair.b = b;
            }
            modules.insert(
                tensor.clone(),
                PlannedModule {
                    module: module.to_string(),
                    tensor,
                    shape: want,
                    base_type: view.ty,
                    r: pair.r,
                    scaling: pair.scaling,
                    pair,
                    permuted: order.is_some(),
                },
            );
        }
        let list = |v: &[String]| {
            let mut s = v
                .iter()
                .take(MAX_LISTED)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join("; ");
            if v.len() > MAX_LISTED {
                s.push_str(&format!("; and {} more", v.len() - MAX_LISTED));
            }
            s
        };
        if !mismatched.is_empty() {
            return Err(CompressError::InvalidInput(format!(
                "{adir}: the adapter does not fit this base{for_base}: {}",
                list(&mismatched)
            )));
        }
        if !missing.is_empty() {
            return Err(CompressError::InvalidInput(format!(
                "{adir}: the adapter targets {} module(s) the base lacks{for_base}: {}",
                missing.len(),
                list(&missing)
            )));
        }
        Ok(MergePlan { modules })
    }

    /// The planned modules, by canonical tensor name.
    pub fn modules(&self) -> impl Iterator<Item = &PlannedModule> {
        self.modules.values()
    }

    pub fn len(&self) -> usize {
        self.modules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// Whether the base tensor `name` (canonical) is changed by the merge.
    pub fn touches(&self, name: &str) -> bool {
        self.modules.contains_key(name)
    }

    /// `view` (a base tensor the plan touches) in f32 with the adapter merged in; `None` for
    /// a tensor the plan does not touch. A non-finite result is an error naming the module.
    pub fn merged(&self, view: &TensorView) -> Result<Option<Vec<f32>>, CompressError> {
        let Some(m) = self.modules.get(&view.name) else {
            return Ok(None);
        };
        let mut w = view.to_f32()?;
        merge_into(&mut w, m.shape[0], m.shape[1], &m.pair, m.scaling)?;
        if let Some(i) = w.iter().position(|x| !x.is_finite()) {
            return Err(CompressError::InvalidInput(format!(
                "merging {} into {} gives a non-finite value at row {}, column {}: the adapter \
                 holds NaN or infinity, or the sum overflows",
                m.module,
                m.tensor,
                i / m.shape[1],
                i % m.shape[1]
            )));
        }
        Ok(Some(w))
    }
}

/// `values` (rows of `cols`) as bytes of `ty` (F16 / BF16 / F32).
pub fn encode(values: &[f32], cols: usize, ty: GgmlType) -> Result<Vec<u8>, CompressError> {
    let cols = cols.max(1);
    let row_bytes = ty.row_bytes(cols)?;
    let mut out = vec![0u8; row_bytes * values.len().div_ceil(cols)];
    for (src, dst) in values.chunks(cols).zip(out.chunks_mut(row_bytes)) {
        pagoda_kernels::quantize_row(ty, src, dst)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_parse_and_unknown_ones_are_listed() {
        assert_eq!("bf16".parse::<MergeDtype>().unwrap(), MergeDtype::BF16);
        assert_eq!("F32".parse::<MergeDtype>().unwrap(), MergeDtype::F32);
        let e = "q4_0".parse::<MergeDtype>().unwrap_err().to_string();
        assert!(e.contains("f16, bf16 or f32"), "{e}");
    }
}
