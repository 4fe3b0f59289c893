//! [`open_model`]: one entry point from a path on disk to everything a model needs —
//! config, borrowed weights, tokenizer, chat template, sampling defaults and a summary for
//! `pagoda show`. A file is read as GGUF, a folder as a Hugging Face model folder.
//!
//! Invariant: a [`ModelSource`] that exists passed `ModelConfig::validate`, and its weights and
//! tokenizer came from the same file or folder; tensor shapes are checked later, by the forward
//! pass that knows what it needs.

use crate::chat_template::ChatTemplate;
use crate::gguf::GgufFile;
use crate::hf::HfFolder;
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use pagoda_kernels::GgmlType;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where a model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    HfFolder,
}

/// Sampling defaults the model's authors suggest (`generation_config.json`, GGUF
/// `general.sampling.*`). `None` means "no suggestion".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

/// A human-facing summary of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    /// `llama`, `qwen2`, `gemma3`.
    pub architecture: String,
    pub parameter_count: u64,
    /// Parameters one token reads: `parameter_count` for a dense model; for a mixture of
    /// experts, without the experts a token does not choose (`n_used` of `n_experts` per
    /// layer).
    pub active_parameter_count: u64,
    /// Bytes of all weight tensors as read (a GPTQ/AWQ checkpoint's as converted at load);
    /// unlike `file_size`, no tokenizer or metadata.
    pub tensor_bytes: u64,
    /// Quantization / file type, e.g. `Q4_1`, `Q4_K_M`, `BF16`.
    pub file_type: String,
    /// Tensor count per element type.
    pub tensor_types: BTreeMap<String, usize>,
    pub context_length: usize,
    /// Bytes on disk (all shards for a folder).
    pub file_size: u64,
}

/// Parameters as model cards count them: every tensor once, and a tied output head once, as
/// the embedding matrix it is, also when the file stores a copy of it. Qwen2.5's own GGUFs
/// (qwen2.5-coder:1.5b among them) keep `output.weight` as a re-quantized copy of
/// `token_embd.weight`; counted twice, the 1.54B model read as 1.8B.
fn parameter_count(cfg: &ModelConfig, weights: &Weights) -> u64 {
    let total = weights.n_parameters();
    match weights.get("output.weight") {
        Ok(head) if cfg.tie_word_embeddings || head_copies_embedding(weights) => {
            total - head.n_elements() as u64
        }
        _ => total,
    }
}

/// Whether `output.weight` holds the embedding matrix again: the same shape, and rows spread
/// over the vocabulary pointing the same way (cosine above 0.95: re-quantization to another
/// type moves a row by a few percent, while an untied head's rows are unrelated to the
/// embedding's). Reads a few rows only.
fn head_copies_embedding(weights: &Weights) -> bool {
    const SAMPLED_ROWS: usize = 8;
    let (Ok(head), Ok(embedding)) = (
        weights.get("output.weight"),
        weights.get("token_embd.weight"),
    ) else {
        return false;
    };
    if head.shape != embedding.shape || head.shape.len() != 2 || head.rows() == 0 {
        return false;
    }
    let row = |t: &crate::weights::TensorView, r: usize| {
        t.row_range("row", r..r + 1)
            .ok()
            .and_then(|v| v.to_f32().ok())
    };
    let rows = head.rows();
    let mut compared = 0;
    for i in 0..SAMPLED_ROWS.min(rows) {
        let r = i * rows / SAMPLED_ROWS.min(rows);
        let (Some(a), Some(b)) = (row(head, r), row(embedding, r)) else {
            return false;
        };
        let dot: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        let (na, nb) = (norm(&a), norm(&b));
        if na == 0.0 || nb == 0.0 {
            // An unused token's zero row says nothing either way.
            continue;
        }
        if dot / (na * nb) < 0.95 {
            return false;
        }
        compared += 1;
    }
    compared > 0
}

/// Parameters one token reads (see [`ModelInfo::active_parameter_count`]): every expert
/// tensor (`*_exp.{e}.*`, `family::moe`) counts `n_used / n_experts` of its size.
fn active_parameters(cfg: &ModelConfig, weights: &Weights) -> u64 {
    let total = parameter_count(cfg, weights);
    let Some(moe) = &cfg.moe else {
        return total;
    };
    let experts: u64 = weights
        .iter()
        .filter(|t| t.name.contains("_exp."))
        .map(|t| t.n_elements() as u64)
        .sum();
    let unused = experts * (moe.n_experts - moe.n_used) as u64 / moe.n_experts as u64;
    total - unused
}

/// Everything read from a model file or folder.
#[derive(Debug)]
pub struct ModelSource {
    pub path: PathBuf,
    pub format: ModelFormat,
    pub config: ModelConfig,
    pub weights: Weights,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub generation: GenerationDefaults,
    pub info: ModelInfo,
    /// What loading a GPTQ/AWQ checkpoint folder did (`None` otherwise).
    pub checkpoint_quant: Option<crate::hf_quant::CheckpointQuantReport>,
}

impl ModelSource {
    /// The model's chat template, or the built-in ChatML one when it has none.
    pub fn chat_template_or_default(&self) -> ChatTemplate {
        match &self.chat_template {
            Some(t) => t.clone(),
            None => ChatTemplate::chatml(
                self.tokenizer.bos_token().unwrap_or("").to_string(),
                self.tokenizer.eos_token().unwrap_or("").to_string(),
            ),
        }
    }
}

/// Opens `path`: a file is read as GGUF, a folder as a Hugging Face model folder.
pub fn open_model(path: &Path) -> Result<ModelSource, ModelError> {
    let meta = std::fs::metadata(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.is_dir() {
        open_hf(path)
    } else {
        open_gguf(path)
    }
}

/// llama.cpp's `llama_ftype` names (`general.file_type`).
pub fn gguf_file_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}

fn tensor_types(weights: &Weights) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for t in weights.iter() {
        *m.entry(t.ty.name().to_string()).or_insert(0) += 1;
    }
    m
}

/// The type holding most of the weight bytes (the file type when metadata does not say).
fn dominant_type(weights: &Weights) -> Option<GgmlType> {
    let mut bytes: BTreeMap<&'static str, (u64, GgmlType)> = BTreeMap::new();
    for t in weights.iter() {
        let e = bytes.entry(t.ty.name()).or_insert((0, t.ty));
        e.0 += t.data().len() as u64;
    }
    bytes.values().max_by_key(|(b, _)| *b).map(|&(_, t)| t)
}

fn open_gguf(path: &Path) -> Result<ModelSource, ModelError> {
    let file = GgufFile::open(path)?;
    let config = ModelConfig::from_gguf(&file)?;
    let mut weights = Weights::from_gguf(&file)?;
    crate::family::prepare_weights(&config, &mut weights)?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let chat_template = match file.get_str_opt("tokenizer.chat_template")? {
        Some(src) => Some(
            ChatTemplate::new(
                src.to_string(),
                tokenizer.bos_token().unwrap_or("").to_string(),
                tokenizer.eos_token().unwrap_or("").to_string(),
            )
            .map_err(|e| ModelError::Format {
                path: path.to_path_buf(),
                message: format!("metadata key \"tokenizer.chat_template\": {e}"),
            })?,
        ),
        None => None,
    };
    let generation = GenerationDefaults {
        temperature: file.get_f32_opt("general.sampling.temp")?,
        top_p: file.get_f32_opt("general.sampling.top_p")?,
        top_k: file.get_usize_opt("general.sampling.top_k")?,
        min_p: file.get_f32_opt("general.sampling.min_p")?,
        repetition_penalty: file.get_f32_opt("general.sampling.penalty_repeat")?,
    };
    let file_type = match file.get_u32_opt("general.file_type")? {
        Some(id) => gguf_file_type_name(id)
            .map(String::from)
            .unwrap_or_else(|| format!("file type {id}")),
        None => dominant_type(&weights)
            .map(|t| t.name().to_string())
            .unwrap_or_default(),
    };
    let name = match file.get_str_opt("general.name")? {
        Some(n) => n.to_string(),
        None => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    let info = ModelInfo {
        name,
        architecture: file.architecture()?.to_string(),
        parameter_count: parameter_count(&config, &weights),
        active_parameter_count: active_parameters(&config, &weights),
        tensor_bytes: weights.n_bytes(),
        file_type,
        tensor_types: tensor_types(&weights),
        context_length: config.context_length,
        file_size: file.file_size() as u64,
    };
    Ok(ModelSource {
        path: path.to_path_buf(),
        format: ModelFormat::Gguf,
        config,
        weights,
        tokenizer,
        chat_template,
        generation,
        info,
        checkpoint_quant: None,
    })
}

fn open_hf(dir: &Path) -> Result<ModelSource, ModelError> {
    let f = HfFolder::open(dir)?;
    let g = f.generation_config.as_ref();
    let num = |k: &str| {
        g.and_then(|g| g.get(k))
            .and_then(Value::as_f64)
            .map(|x| x as f32)
    };
    let generation = GenerationDefaults {
        temperature: num("temperature"),
        top_p: num("top_p"),
        top_k: g
            .and_then(|g| g.get("top_k"))
            .and_then(Value::as_u64)
            .map(|x| x as usize),
        min_p: num("min_p"),
        repetition_penalty: num("repetition_penalty"),
    };
    let name = f
        .config_json
        .get("_name_or_path")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .or_else(|| dir.file_name().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let info = ModelInfo {
        name,
        architecture: f.config.arch.gguf_name().to_string(),
        parameter_count: parameter_count(&f.config, &f.weights),
        active_parameter_count: active_parameters(&f.config, &f.weights),
        tensor_bytes: f.weights.n_bytes(),
        file_type: match &f.checkpoint_quant {
            Some(r) => format!("{} ({})", r.scheme, r.target_type().name()),
            None => dominant_type(&f.weights)
                .map(|t| t.name().to_string())
                .unwrap_or_default(),
        },
        tensor_types: tensor_types(&f.weights),
        context_length: f.config.context_length,
        file_size: f.weights_file_size,
    };
    Ok(ModelSource {
        path: f.path,
        format: ModelFormat::HfFolder,
        config: f.config,
        weights: f.weights,
        tokenizer: f.tokenizer,
        chat_template: f.chat_template,
        generation,
        info,
        checkpoint_quant: f.checkpoint_quant,
    })
}

/// Runs every loader step on untrusted GGUF bytes — parse, tensor views, dequantization of
/// small tensors, config, tokenizer, encode/decode — discarding results. Must never panic;
/// shared by the mutation property test and the cargo-fuzz target `gguf_reader`.
#[doc(hidden)]
pub fn exercise_untrusted_gguf(bytes: Vec<u8>) {
    let Ok(file) = GgufFile::from_bytes("fuzz.gguf", bytes) else {
        return;
    };
    for t in file.tensors() {
        let _ = file.tensor_data(t).len();
    }
    if let Ok(w) = Weights::from_gguf(&file) {
        for t in w.iter() {
            let _ = t.data().last();
            if t.n_elements() <= 1 << 16 {
                let _ = t.to_f32();
            }
        }
    }
    let _ = ModelConfig::from_gguf(&file);
    if let Ok(tok) = Tokenizer::from_gguf(&file) {
        if let Ok(ids) = tok.encode("ab a<|im_end|> héllo", true) {
            let _ = tok.decode(&ids, false);
        }
        let _ = tok.decode(&[u32::MAX], true);
    }
    if let Ok(Some(src)) = file.get_str_opt("tokenizer.chat_template") {
        if let Ok(t) = ChatTemplate::new(src.to_string(), String::new(), String::new()) {
            let _ = t.render(
                &[crate::chat_template::ChatMessage::new("user", "hi")],
                true,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn loaded_parts_cross_threads() {
        // The engine shares these across its worker thread and the server's tasks.
        send_sync::<ModelSource>();
        send_sync::<Tokenizer>();
        send_sync::<ChatTemplate>();
        send_sync::<Weights>();
    }

    #[test]
    fn a_head_that_copies_the_embedding_is_found_and_an_untied_one_is_not() {
        let matrix = |name: &str, rows: usize, value: &dyn Fn(usize) -> f32| {
            let data: Vec<u8> = (0..rows * 4).flat_map(|i| value(i).to_le_bytes()).collect();
            crate::weights::TensorView::owned(name, GgmlType::F32, vec![rows, 4], data).unwrap()
        };
        let embedding = |i: usize| ((i * 7 % 13) as f32 - 6.0) * 0.01;
        let with_head = |head: crate::weights::TensorView| {
            let mut w = Weights::new();
            w.insert(matrix("token_embd.weight", 16, &embedding))
                .unwrap();
            w.insert(head).unwrap();
            w
        };
        // Re-quantized: each value a little off.
        let copy = with_head(matrix("output.weight", 16, &|i| {
            embedding(i) * 1.02 + 0.0005
        }));
        assert!(head_copies_embedding(&copy));
        let untied = with_head(matrix("output.weight", 16, &|i| -embedding(i)));
        assert!(!head_copies_embedding(&untied));
        let other_shape = with_head(matrix("output.weight", 8, &embedding));
        assert!(!head_copies_embedding(&other_shape));
        let zeros = with_head(matrix("output.weight", 16, &|_| 0.0));
        assert!(!head_copies_embedding(&zeros), "no row to compare");
    }

    #[test]
    fn file_type_names() {
        assert_eq!(gguf_file_type_name(3), Some("Q4_1"));
        assert_eq!(gguf_file_type_name(15), Some("Q4_K_M"));
        assert_eq!(gguf_file_type_name(4), None);
    }
}
