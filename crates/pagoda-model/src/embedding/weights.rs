//! The tensors of a BERT encoder, from a `model.safetensors` under the Hugging Face names
//! (`embeddings.word_embeddings.weight`, `encoder.layer.N.attention.self.query.weight`, ...),
//! with or without a `bert.` prefix.
//!
//! Invariants: every tensor is shape-checked against the [`BertConfig`] at load, so the forward
//! pass cannot fail on a shape; matrices stay borrowed from the mmap (as [`Linear`]s), only
//! vectors (biases, LayerNorm parameters) and the small position / token-type tables are copied
//! to f32. Tensors the encoder does not use (`pooler.*`, `position_ids`, MLM heads) are ignored.

use super::config::BertConfig;
use crate::arch::layers::Linear;
use crate::safetensors::SafetensorsFile;
use crate::weights::Weights;
use crate::ModelError;
use std::path::Path;

/// LayerNorm parameters.
#[derive(Debug, Clone)]
pub struct LayerNormWeights {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

/// One encoder layer.
#[derive(Debug, Clone)]
pub struct BertLayer {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub attn_out: Linear,
    pub attn_norm: LayerNormWeights,
    pub intermediate: Linear,
    pub output: Linear,
    pub out_norm: LayerNormWeights,
}

/// Every tensor the encoder reads.
#[derive(Debug, Clone)]
pub struct BertWeights {
    /// `[vocab, hidden]`, looked up row by row.
    pub word_embeddings: Linear,
    /// `[max_positions, hidden]`.
    pub position_embeddings: Vec<f32>,
    /// Row 0 of `token_type_embeddings` (every input is segment A).
    pub token_type_0: Vec<f32>,
    pub embed_norm: LayerNormWeights,
    pub layers: Vec<BertLayer>,
}

/// The tensors of `path` under their names without the `bert.` prefix.
fn read_tensors(path: &Path) -> Result<Weights, ModelError> {
    let file = SafetensorsFile::open_skipping_unsupported(path)?;
    let mut weights = Weights::new();
    for mut view in file.into_tensors() {
        if let Some(rest) = view.name.strip_prefix("bert.") {
            view.name = rest.to_string();
        }
        weights.insert(view).map_err(|message| ModelError::Format {
            path: path.to_path_buf(),
            message,
        })?;
    }
    Ok(weights)
}

fn vector(w: &Weights, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let t = w.get(name)?;
    if t.shape != [len] {
        return Err(ModelError::Tensor {
            path: Default::default(),
            tensor: name.to_string(),
            message: format!("shape {:?}, but the config implies [{len}]", t.shape),
        });
    }
    t.to_f32()
}

fn layer_norm(w: &Weights, prefix: &str, len: usize) -> Result<LayerNormWeights, ModelError> {
    Ok(LayerNormWeights {
        weight: vector(w, &format!("{prefix}.weight"), len)?,
        bias: vector(w, &format!("{prefix}.bias"), len)?,
    })
}

/// A linear layer with its (required) bias.
fn linear(w: &Weights, prefix: &str, rows: usize, cols: usize) -> Result<Linear, ModelError> {
    let bias = format!("{prefix}.bias");
    w.get(&bias)?;
    let l = Linear::load(w, &format!("{prefix}.weight"), Some(&bias), rows, cols)?;
    vector(w, &bias, rows)?;
    Ok(l)
}

impl BertWeights {
    /// Loads and checks the encoder tensors of the safetensors file at `path`.
    pub fn load(path: &Path, c: &BertConfig) -> Result<BertWeights, ModelError> {
        let w = read_tensors(path)?;
        Self::from_weights(&w, c).map_err(|e| match e {
            ModelError::Tensor {
                path: p,
                tensor,
                message,
            } if p.as_os_str().is_empty() => ModelError::Tensor {
                path: path.to_path_buf(),
                tensor,
                message,
            },
            other => other,
        })
    }

    /// The encoder tensors of `w` (names without the `bert.` prefix).
    pub fn from_weights(w: &Weights, c: &BertConfig) -> Result<BertWeights, ModelError> {
        let h = c.hidden_size;
        let word_embeddings = Linear::load(
            w,
            "embeddings.word_embeddings.weight",
            None,
            c.vocab_size,
            h,
        )?;
        let position_embeddings = w.get("embeddings.position_embeddings.weight")?;
        if position_embeddings.shape != [c.max_position_embeddings, h] {
            return Err(ModelError::Tensor {
                path: Default::default(),
                tensor: position_embeddings.name.clone(),
                message: format!(
                    "shape {:?}, but the config implies [{}, {h}]",
                    position_embeddings.shape, c.max_position_embeddings
                ),
            });
        }
        let position_embeddings = position_embeddings.to_f32()?;
        let token_type = w.get("embeddings.token_type_embeddings.weight")?;
        if token_type.shape != [c.type_vocab_size, h] {
            return Err(ModelError::Tensor {
                path: Default::default(),
                tensor: token_type.name.clone(),
                message: format!(
                    "shape {:?}, but the config implies [{}, {h}]",
                    token_type.shape, c.type_vocab_size
                ),
            });
        }
        let mut token_type_0 = token_type.to_f32()?;
        token_type_0.truncate(h);
        let embed_norm = layer_norm(w, "embeddings.LayerNorm", h)?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let p = format!("encoder.layer.{i}");
                let f = c.intermediate_size;
                Ok(BertLayer {
                    query: linear(w, &format!("{p}.attention.self.query"), h, h)?,
                    key: linear(w, &format!("{p}.attention.self.key"), h, h)?,
                    value: linear(w, &format!("{p}.attention.self.value"), h, h)?,
                    attn_out: linear(w, &format!("{p}.attention.output.dense"), h, h)?,
                    attn_norm: layer_norm(w, &format!("{p}.attention.output.LayerNorm"), h)?,
                    intermediate: linear(w, &format!("{p}.intermediate.dense"), f, h)?,
                    output: linear(w, &format!("{p}.output.dense"), h, f)?,
                    out_norm: layer_norm(w, &format!("{p}.output.LayerNorm"), h)?,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(BertWeights {
            word_embeddings,
            position_embeddings,
            token_type_0,
            embed_norm,
            layers,
        })
    }
}
