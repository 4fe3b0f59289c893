//! Typed, error-naming reads of the two config sources a [`super::Family`] hook sees: GGUF
//! metadata under the file's `{arch}.` prefix ([`GgufKeys`]) and a `config.json` object
//! ([`HfKeys`]).
//!
//! Invariant: a key that is present with the wrong type is an error naming the key (and the
//! file), never read as absent.

use crate::config::{Mixer, ModelConfig};
use crate::gguf::{GgufFile, GgufValue};
use crate::ModelError;
use serde_json::{Map, Value};

/// A GGUF file's metadata, keys relative to its architecture prefix.
pub struct GgufKeys<'a> {
    pub file: &'a GgufFile,
    /// The file's `general.architecture`.
    pub arch: &'a str,
}

impl GgufKeys<'_> {
    /// The full key of `k`: `{arch}.{k}`.
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// A format error about this file.
    pub fn bad(&self, message: String) -> ModelError {
        ModelError::Format {
            path: self.file.path().to_path_buf(),
            message,
        }
    }

    pub fn has(&self, k: &str) -> bool {
        self.file.get(&self.key(k)).is_some()
    }

    pub fn is_array(&self, k: &str) -> bool {
        matches!(self.file.get(&self.key(k)), Some(GgufValue::Array(_)))
    }

    pub fn usize_opt(&self, k: &str) -> Result<Option<usize>, ModelError> {
        self.file.get_usize_opt(&self.key(k))
    }

    pub fn usize(&self, k: &str) -> Result<usize, ModelError> {
        self.file.get_usize(&self.key(k))
    }

    pub fn f32_opt(&self, k: &str) -> Result<Option<f32>, ModelError> {
        self.file.get_f32_opt(&self.key(k))
    }

    pub fn str_opt(&self, k: &str) -> Result<Option<&str>, ModelError> {
        self.file.get_str_opt(&self.key(k))
    }

    pub fn bool_opt(&self, k: &str) -> Result<Option<bool>, ModelError> {
        match self.file.get(&self.key(k)) {
            None => Ok(None),
            Some(GgufValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.bad(format!(
                "metadata key {:?} should be a bool, got {:?}",
                self.key(k),
                v.value_type()
            ))),
        }
    }

    pub fn i32_array(&self, k: &str) -> Result<Vec<i32>, ModelError> {
        self.file.get_i32_array(&self.key(k))
    }

    /// A per-layer key given as one number or an array whose entries are all equal.
    pub fn uniform(&self, k: &str) -> Result<Option<usize>, ModelError> {
        match self.file.get_usize_or_array_opt(&self.key(k))? {
            None => Ok(None),
            Some(v) => match v.split_first() {
                None => Err(self.bad(format!("metadata key {:?} is an empty array", self.key(k)))),
                Some((first, rest)) if rest.iter().all(|x| x == first) => Ok(Some(*first)),
                Some(_) => Err(self.bad(format!(
                    "metadata key {:?} varies per layer ({v:?}); only uniform layers are supported",
                    self.key(k)
                ))),
            },
        }
    }

    /// A per-layer key given as one number or an array: the first layer's value.
    pub fn first_of(&self, k: &str) -> Result<Option<usize>, ModelError> {
        match self.per_layer(k, usize::MAX)? {
            None => Ok(None),
            Some(v) => Ok(v.first().copied()),
        }
    }

    /// A per-layer key given as one number (the same for every layer) or an array of
    /// `n_layers` entries (`usize::MAX`: any length but empty), one value per layer.
    pub fn per_layer(&self, k: &str, n_layers: usize) -> Result<Option<Vec<usize>>, ModelError> {
        let Some(v) = self.file.get_usize_or_array_opt(&self.key(k))? else {
            return Ok(None);
        };
        match (v.len(), n_layers) {
            (0, _) => Err(self.bad(format!("metadata key {:?} is an empty array", self.key(k)))),
            (1, n) if n != usize::MAX && !self.is_array(k) => Ok(Some(vec![v[0]; n])),
            (len, n) if n == usize::MAX || len == n => Ok(Some(v)),
            (len, n) => Err(self.bad(format!("{} has {len} entries for {n} layers", self.key(k)))),
        }
    }

    /// The layers' token mixers of a hybrid whose GGUF marks its recurrent layers by zero
    /// K/V heads (`attention.head_count_kv` per layer: LFM2, Granite 4.0-H): `recurrent`
    /// where the count is 0, attention elsewhere; the attention layers' count becomes
    /// `cfg.n_kv_heads` (the query head count when no layer attends).
    pub fn mixers_from_kv_heads(
        &self,
        cfg: &mut ModelConfig,
        recurrent: Mixer,
    ) -> Result<Vec<Mixer>, ModelError> {
        let heads = self
            .per_layer("attention.head_count_kv", cfg.n_layers)?
            .unwrap_or_else(|| vec![cfg.n_kv_heads; cfg.n_layers]);
        cfg.n_kv_heads = heads
            .iter()
            .copied()
            .find(|&h| h > 0)
            .unwrap_or(cfg.n_heads);
        Ok(heads
            .iter()
            .map(|&h| if h == 0 { recurrent } else { Mixer::Attention })
            .collect())
    }

    /// Per-layer booleans given as an array of `n_layers` integers (non-zero = true).
    pub fn layer_flags(&self, k: &str, n_layers: usize) -> Result<Vec<bool>, ModelError> {
        let v = self.i32_array(k)?;
        if v.len() != n_layers {
            return Err(self.bad(format!(
                "{} has {} entries for {n_layers} layers",
                self.key(k),
                v.len()
            )));
        }
        Ok(v.into_iter().map(|x| x != 0).collect())
    }
}

/// A `config.json` object (a multimodal wrapper's `text_config` already merged in).
pub struct HfKeys<'a>(pub &'a Map<String, Value>);

/// An error about `config.json`.
pub fn hf_bad(msg: String) -> ModelError {
    ModelError::InvalidConfig(format!("config.json: {msg}"))
}

impl HfKeys<'_> {
    pub fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    pub fn usize_opt(&self, k: &str) -> Result<Option<usize>, ModelError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| hf_bad(format!("{k:?} should be a non-negative integer, got {v}"))),
        }
    }

    pub fn usize(&self, k: &str) -> Result<usize, ModelError> {
        self.usize_opt(k)?
            .ok_or_else(|| hf_bad(format!("{k:?} is missing")))
    }

    pub fn f32_opt(&self, k: &str) -> Result<Option<f32>, ModelError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| hf_bad(format!("{k:?} should be a number, got {v}"))),
        }
    }

    pub fn bool_opt(&self, k: &str) -> Result<Option<bool>, ModelError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| hf_bad(format!("{k:?} should be true or false, got {v}"))),
        }
    }

    pub fn str_opt(&self, k: &str) -> Option<&str> {
        self.get(k).and_then(Value::as_str)
    }

    /// `layer_types` (transformers' per-layer attention kinds): `Some(sliding flags)` when
    /// present. A hybrid's recurrent layers (`conv`, `linear_attention`) are not sliding (their
    /// family reads the kinds itself); any other entry is an error.
    pub fn layer_types(&self, n_layers: usize) -> Result<Option<Vec<bool>>, ModelError> {
        let Some(Value::Array(types)) = self.get("layer_types") else {
            return Ok(None);
        };
        if types.len() != n_layers {
            return Err(hf_bad(format!(
                "layer_types has {} entries for {n_layers} layers",
                types.len()
            )));
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention" | "conv" | "linear_attention") => Ok(false),
                // Granite 4.0-H (GraniteMoeHybrid).
                Some("attention" | "mamba") => Ok(false),
                _ => Err(hf_bad(format!("unknown layer type {t} in layer_types"))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}
