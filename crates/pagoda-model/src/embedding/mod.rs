//! Sentence embeddings with a BERT encoder (all-MiniLM-L6-v2 and other sentence-transformers
//! BERT models): [`EmbeddingModel`] loads a Hugging Face folder (config.json,
//! model.safetensors, tokenizer.json, the sentence-transformers config files) and turns texts
//! into pooled, L2-normalised vectors as sentence-transformers does; [`is_bert_folder`] tells
//! such a folder from a generative model's.
//!
//! Codemap: `config` ([`BertConfig`]: shapes and pipeline settings), `weights` (tensors,
//! shape-checked, borrowed from the mmap), `tokenize` (special tokens and truncation),
//! `forward` (the encoder over a batch), `ops` (LayerNorm, GELU, pooling), `tests` (a tiny
//! synthetic model in a temporary folder).
//!
//! Invariants: input is validated before any compute (empty sequences, ids outside the
//! vocabulary and over-long token input are errors or truncations, never panics); texts longer
//! than [`EmbeddingModel::max_seq_len`] tokens are truncated and say so in
//! [`Embedded::truncated`]; a batch is computed in groups of at most [`MAX_BATCH_TOKENS`]
//! rows, and every text's vector is the same as when it is embedded alone.

pub mod config;
pub mod forward;
pub mod ops;
pub mod tokenize;
pub mod weights;

#[cfg(test)]
pub(crate) mod tests;

pub use config::{BertConfig, Pooling};
pub use tokenize::{encode_truncated, EncodedText};
pub use weights::BertWeights;

use crate::tokenizer::Tokenizer;
use crate::ModelError;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Rows (tokens) of one forward pass; a larger batch is split (bounds the activations at
/// about `MAX_BATCH_TOKENS * intermediate_size * 4` bytes).
pub const MAX_BATCH_TOKENS: usize = 4096;

/// One text's embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// `dimensions()` values, L2-normalised when the model's pipeline normalises.
    pub vector: Vec<f32>,
    /// Tokens the encoder saw ([CLS] and [SEP] included, after truncation).
    pub tokens: usize,
    /// The input was longer than `max_seq_len()` tokens and was cut.
    pub truncated: bool,
}

/// A loaded sentence-embedding model.
#[derive(Debug)]
pub struct EmbeddingModel {
    path: PathBuf,
    config: BertConfig,
    weights: BertWeights,
    tokenizer: Tokenizer,
}

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ModelError::Format {
        path: path.to_path_buf(),
        message: format!("not valid JSON: {e}"),
    })
}

fn read_json_opt(path: &Path) -> Result<Option<Value>, ModelError> {
    if path.is_file() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// `dir/name`, else `dir/model/name` (sentence-transformers exports with a `model/` folder).
fn find_file(dir: &Path, name: &str) -> Result<PathBuf, ModelError> {
    [dir.join(name), dir.join("model").join(name)]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| ModelError::Format {
            path: dir.to_path_buf(),
            message: format!("not an embedding model folder: no {name} (nor model/{name})"),
        })
}

/// Whether `path` is a folder whose config.json (or model/config.json, as sentence-transformers
/// exports) describes a BERT encoder (`model_type: "bert"` or a `Bert*` architecture): an
/// embedding model for [`EmbeddingModel::load`] rather than a generative one. An unreadable
/// config counts as not BERT (the generative reader then reports it).
pub fn is_bert_folder(path: &Path) -> bool {
    let Some(config) = [
        path.join("config.json"),
        path.join("model").join("config.json"),
    ]
    .into_iter()
    .find_map(|p| std::fs::read(p).ok())
    .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok()) else {
        return false;
    };
    let bert_type = config.get("model_type").and_then(Value::as_str) == Some("bert");
    let bert_arch = config
        .get("architectures")
        .and_then(Value::as_array)
        .is_some_and(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .any(|x| x.starts_with("Bert"))
        });
    bert_type || bert_arch
}

impl EmbeddingModel {
    /// Loads the Hugging Face folder at `path`.
    pub fn load(path: &Path) -> Result<EmbeddingModel, ModelError> {
        if !path.is_dir() {
            return Err(ModelError::Format {
                path: path.to_path_buf(),
                message: "not a folder (an embedding model is a Hugging Face folder)".into(),
            });
        }
        let config_path = find_file(path, "config.json")?;
        let config_json = read_json(&config_path)?;
        let config = BertConfig::from_json(
            &config_json,
            read_json_opt(&path.join("sentence_bert_config.json"))?.as_ref(),
            read_json_opt(&path.join("1_Pooling").join("config.json"))?.as_ref(),
            read_json_opt(&path.join("modules.json"))?.as_ref(),
        )
        .map_err(|e| match e {
            ModelError::InvalidConfig(message) => ModelError::Format {
                path: config_path.clone(),
                message,
            },
            other => other,
        })?;
        let weights = BertWeights::load(&find_file(path, "model.safetensors")?, &config)?;
        let tok_path = find_file(path, "tokenizer.json")?;
        let tokenizer_config = read_json_opt(&path.join("tokenizer_config.json"))?;
        let tokenizer = Tokenizer::from_hf_files(
            &tok_path,
            tokenizer_config.as_ref(),
            None,
            Some(&config_json),
        )?;
        Ok(EmbeddingModel {
            path: path.to_path_buf(),
            config,
            weights,
            tokenizer,
        })
    }

    /// Embeds `texts` (each truncated to `max_seq_len()` tokens), in order.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Embedded>, ModelError> {
        let encoded = texts
            .iter()
            .map(|t| encode_truncated(&self.tokenizer, t, self.config.max_seq_len))
            .collect::<Result<Vec<_>, _>>()?;
        let seqs: Vec<&[u32]> = encoded.iter().map(|e| e.ids.as_slice()).collect();
        let vectors = self.run(&seqs)?;
        Ok(vectors
            .into_iter()
            .zip(encoded)
            .map(|(vector, e)| Embedded {
                vector,
                tokens: e.ids.len(),
                truncated: e.truncated,
            })
            .collect())
    }

    /// Embeds pre-tokenized inputs: ids as the encoder sees them, special tokens included (as
    /// `tokenizer().encode(text, true)` gives them). A sequence longer than `max_seq_len()` is
    /// cut to its first `max_seq_len()` ids; an empty one or an id outside the vocabulary is an
    /// error.
    pub fn embed_tokens(&self, ids: &[Vec<u32>]) -> Result<Vec<Embedded>, ModelError> {
        let max = self.config.max_seq_len;
        let seqs: Vec<&[u32]> = ids.iter().map(|s| &s[..s.len().min(max)]).collect();
        let vectors = self.run(&seqs)?;
        Ok(vectors
            .into_iter()
            .zip(ids)
            .map(|(vector, s)| Embedded {
                vector,
                tokens: s.len().min(max),
                truncated: s.len() > max,
            })
            .collect())
    }

    /// Pooled vectors of `seqs`, in groups of at most `MAX_BATCH_TOKENS` rows; every sequence
    /// is checked (non-empty, at most `max_seq_len`, ids in the vocabulary) before any runs.
    fn run(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>, ModelError> {
        for (i, s) in seqs.iter().enumerate() {
            if s.is_empty() {
                return Err(ModelError::InvalidBatch(format!(
                    "input {i} has no tokens (a text's encoding holds at least [CLS] and [SEP])"
                )));
            }
            if s.len() > self.config.max_seq_len {
                return Err(ModelError::InvalidBatch(format!(
                    "input {i} has {} tokens, more than the {} the encoder takes",
                    s.len(),
                    self.config.max_seq_len
                )));
            }
            if let Some(&token) = s.iter().find(|&&t| t as usize >= self.config.vocab_size) {
                return Err(ModelError::InvalidToken {
                    token,
                    vocab_size: self.config.vocab_size,
                });
            }
        }
        let h = self.config.hidden_size;
        let mut out = Vec::with_capacity(seqs.len());
        let mut rest = seqs;
        while !rest.is_empty() {
            let mut n = 0;
            let mut rows = 0;
            while n < rest.len() && (n == 0 || rows + rest[n].len() <= MAX_BATCH_TOKENS) {
                rows += rest[n].len();
                n += 1;
            }
            let (group, tail) = rest.split_at(n);
            let hidden = forward::encode(&self.config, &self.weights, group)?;
            let mut at = 0;
            for s in group {
                let tokens = &hidden[at * h..(at + s.len()) * h];
                at += s.len();
                let mut v = vec![0f32; h];
                match self.config.pooling {
                    Pooling::Mean => ops::mean_pool(tokens, &mut v),
                    Pooling::Cls => v.copy_from_slice(&tokens[..h]),
                }
                if self.config.normalize {
                    ops::normalize_inplace(&mut v);
                }
                out.push(v);
            }
            rest = tail;
        }
        Ok(out)
    }

    /// Length of an embedding vector.
    pub fn dimensions(&self) -> usize {
        self.config.hidden_size
    }

    /// Longest input in tokens ([CLS] and [SEP] included).
    pub fn max_seq_len(&self) -> usize {
        self.config.max_seq_len
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// The folder the model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
