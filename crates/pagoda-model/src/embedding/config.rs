//! `BertConfig`: the shape of a BERT encoder, read from a Hugging Face `config.json`, plus the
//! sentence-transformers settings of the folder (`sentence_bert_config.json`'s
//! `max_seq_length`, `1_Pooling/config.json`'s mode, a `Normalize` entry in `modules.json`).
//!
//! Invariants: a `BertConfig` that [`BertConfig::from_json`] returned has every size non-zero
//! and bounded ([`MAX_DIM`], [`MAX_LAYERS`], [`MAX_POSITIONS`]), `hidden_size` a multiple of
//! `num_attention_heads`, `hidden_act` exact (erf) GELU, absolute position embeddings, and
//! `1 <= max_seq_len <= max_position_embeddings`.

use crate::ModelError;
use serde_json::Value;

/// Largest hidden or intermediate size accepted from an untrusted file.
pub const MAX_DIM: usize = 1 << 16;
/// Most layers accepted.
pub const MAX_LAYERS: usize = 256;
/// Most positions accepted.
pub const MAX_POSITIONS: usize = 1 << 16;

/// How token vectors become one sentence vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Mean over the tokens (sentence-transformers' `pooling_mode_mean_tokens`).
    Mean,
    /// The first token's vector (`pooling_mode_cls_token`).
    Cls,
}

/// A BERT encoder's shape and the sentence-embedding pipeline around it.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub vocab_size: usize,
    pub layer_norm_eps: f32,
    /// Longest input in tokens, [CLS] and [SEP] included; longer inputs are truncated.
    pub max_seq_len: usize,
    pub pooling: Pooling,
    /// L2-normalise the pooled vector.
    pub normalize: bool,
}

fn invalid(m: impl Into<String>) -> ModelError {
    ModelError::InvalidConfig(m.into())
}

fn size(v: &Value, key: &str, max: usize) -> Result<usize, ModelError> {
    let n = v
        .get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| invalid(format!("{key} is missing or not a non-negative integer")))?;
    match usize::try_from(n) {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(invalid(format!("{key} = {n} is outside 1..={max}"))),
    }
}

impl BertConfig {
    /// Reads `config.json` (`config`) and the optional sentence-transformers files:
    /// `sentence_bert` (`sentence_bert_config.json`), `pooling` (`1_Pooling/config.json`),
    /// `modules` (`modules.json`). Without `sentence_bert`, `max_seq_len` is
    /// `max_position_embeddings`; without `pooling`, mean pooling; without `modules`, vectors
    /// are normalised.
    pub fn from_json(
        config: &Value,
        sentence_bert: Option<&Value>,
        pooling: Option<&Value>,
        modules: Option<&Value>,
    ) -> Result<BertConfig, ModelError> {
        if let Some(t) = config.get("model_type").and_then(Value::as_str) {
            if t != "bert" {
                return Err(invalid(format!(
                    "model_type {t:?} is not a BERT encoder (\"bert\")"
                )));
            }
        }
        let hidden_size = size(config, "hidden_size", MAX_DIM)?;
        let num_hidden_layers = size(config, "num_hidden_layers", MAX_LAYERS)?;
        let num_attention_heads = size(config, "num_attention_heads", MAX_DIM)?;
        let intermediate_size = size(config, "intermediate_size", MAX_DIM)?;
        let max_position_embeddings = size(config, "max_position_embeddings", MAX_POSITIONS)?;
        let type_vocab_size = size(config, "type_vocab_size", MAX_POSITIONS)?;
        let vocab_size = size(config, "vocab_size", 1 << 24)?;
        if hidden_size % num_attention_heads != 0 {
            return Err(invalid(format!(
                "hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads}"
            )));
        }
        let act = config
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu");
        if act != "gelu" {
            return Err(invalid(format!(
                "hidden_act {act:?} is not supported (only \"gelu\", the exact erf GELU)"
            )));
        }
        let pos = config
            .get("position_embedding_type")
            .and_then(Value::as_str)
            .unwrap_or("absolute");
        if pos != "absolute" {
            return Err(invalid(format!(
                "position_embedding_type {pos:?} is not supported (only \"absolute\")"
            )));
        }
        let layer_norm_eps = match config.get("layer_norm_eps") {
            None => 1e-12,
            Some(v) => match v.as_f64() {
                Some(e) if e > 0.0 && e < 1.0 => e as f32,
                _ => return Err(invalid(format!("layer_norm_eps {v} is not in (0, 1)"))),
            },
        };
        let max_seq_len = match sentence_bert.and_then(|s| s.get("max_seq_length")) {
            None | Some(Value::Null) => max_position_embeddings,
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if (1..=max_position_embeddings).contains(&n) => n,
                _ => {
                    return Err(invalid(format!(
                        "max_seq_length {v} is outside 1..={max_position_embeddings}"
                    )))
                }
            },
        };
        let flag = |key: &str| {
            pooling
                .and_then(|p| p.get(key))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        let pooling = match (
            flag("pooling_mode_mean_tokens"),
            flag("pooling_mode_cls_token"),
            [
                "pooling_mode_max_tokens",
                "pooling_mode_mean_sqrt_len_tokens",
            ]
            .into_iter()
            .any(flag),
        ) {
            (_, _, true) => {
                return Err(invalid(
                    "pooling modes max_tokens and mean_sqrt_len_tokens are not supported",
                ))
            }
            (true, true, _) => {
                return Err(invalid(
                    "more than one pooling mode (mean and cls) is not supported",
                ))
            }
            (false, true, _) => Pooling::Cls,
            _ => Pooling::Mean,
        };
        let normalize = match modules.and_then(Value::as_array) {
            None => true,
            Some(list) => list.iter().any(|m| {
                m.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t.ends_with(".Normalize"))
            }),
        };
        Ok(BertConfig {
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            intermediate_size,
            max_position_embeddings,
            type_vocab_size,
            vocab_size,
            layer_norm_eps,
            max_seq_len,
            pooling,
            normalize,
        })
    }

    /// Dimensions of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn minilm() -> Value {
        json!({"model_type": "bert", "hidden_size": 384, "num_hidden_layers": 6,
            "num_attention_heads": 12, "intermediate_size": 1536,
            "max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522,
            "layer_norm_eps": 1e-12, "hidden_act": "gelu"})
    }

    #[test]
    fn reads_minilm() {
        let st = json!({"max_seq_length": 256});
        let pool = json!({"pooling_mode_mean_tokens": true});
        let modules = json!([{"type": "sentence_transformers.models.Transformer"},
            {"type": "sentence_transformers.models.Normalize"}]);
        let c = BertConfig::from_json(&minilm(), Some(&st), Some(&pool), Some(&modules)).unwrap();
        assert_eq!((c.hidden_size, c.head_dim(), c.max_seq_len), (384, 32, 256));
        assert_eq!(c.pooling, Pooling::Mean);
        assert!(c.normalize);
        let c = BertConfig::from_json(&minilm(), None, None, Some(&json!([]))).unwrap();
        assert_eq!(c.max_seq_len, 512);
        assert!(!c.normalize);
    }

    #[test]
    fn rejects_bad_configs() {
        let mut c = minilm();
        c["hidden_act"] = json!("relu");
        assert!(BertConfig::from_json(&c, None, None, None).is_err());
        let mut c = minilm();
        c["num_attention_heads"] = json!(7);
        assert!(BertConfig::from_json(&c, None, None, None).is_err());
        let mut c = minilm();
        c["hidden_size"] = json!(0);
        assert!(BertConfig::from_json(&c, None, None, None).is_err());
        let st = json!({"max_seq_length": 1000});
        assert!(BertConfig::from_json(&minilm(), Some(&st), None, None).is_err());
        let pool = json!({"pooling_mode_max_tokens": true});
        assert!(BertConfig::from_json(&minilm(), None, Some(&pool), None).is_err());
        let mut c = minilm();
        c["model_type"] = json!("llama");
        assert!(BertConfig::from_json(&c, None, None, None).is_err());
    }
}
