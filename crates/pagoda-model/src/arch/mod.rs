//! Forward passes: token ids at positions in, logits out, over a [`KvCache`].
//!
//! [`Model`] holds the parts every architecture shares (token embedding, final norm, output
//! head) and one decoder stack per architecture ([`llama`] for Llama and Qwen2, [`gemma3`]).
//! Weights stay borrowed from the model file's mmap, in its own block formats.
//!
//! Invariant: `forward` is called with `start == cache.len()`; on success the cache holds
//! `start + tokens.len()` positions, on error it is unchanged in length.

pub mod gemma3;
pub mod layers;
pub mod llama;

use crate::source::ModelSource;
use crate::{Architecture, KvCache, ModelConfig, ModelError};
use layers::{Linear, RmsNorm, Scratch};

/// Which positions of a forward pass need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position (generation).
    Last,
    /// Every position (evaluation, golden tests).
    All,
}

#[derive(Debug, Clone)]
enum Stack {
    Llama(llama::LlamaLayers),
    Gemma3(gemma3::Gemma3Layers),
}

/// A model ready to run: config plus shape-checked weights.
#[derive(Debug, Clone)]
pub struct Model {
    config: ModelConfig,
    embedding: Linear,
    output_norm: RmsNorm,
    output: Linear,
    stack: Stack,
}

impl Model {
    /// Builds the forward pass for `source`, checking every tensor's presence and shape.
    pub fn from_source(source: &ModelSource) -> Result<Self, ModelError> {
        Self::build(&source.config, &source.weights).map_err(|e| match e {
            ModelError::Tensor {
                tensor, message, ..
            } => ModelError::Tensor {
                path: source.path.clone(),
                tensor,
                message,
            },
            ModelError::MissingTensor(t) => ModelError::Tensor {
                path: source.path.clone(),
                tensor: t,
                message: "missing from the model file".into(),
            },
            other => other,
        })
    }

    fn build(cfg: &ModelConfig, weights: &crate::weights::Weights) -> Result<Self, ModelError> {
        cfg.validate()?;
        let (v, d) = (cfg.vocab_size, cfg.hidden_size);
        let embedding = Linear::load(weights, "token_embd.weight", None, v, d)?;
        let output = if weights.contains("output.weight") && !cfg.tie_word_embeddings {
            Linear::load(weights, "output.weight", None, v, d)?
        } else {
            embedding.clone()
        };
        let stack = match cfg.arch {
            Architecture::Llama | Architecture::Qwen2 => {
                Stack::Llama(llama::LlamaLayers::load(weights, cfg)?)
            }
            Architecture::Gemma3 => Stack::Gemma3(gemma3::Gemma3Layers::load(weights, cfg)?),
        };
        Ok(Model {
            config: cfg.clone(),
            embedding,
            output_norm: RmsNorm::load(weights, "output_norm.weight", d, cfg)?,
            output,
            stack,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// A fresh cache for up to `capacity` positions (at most the model's context length).
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        KvCache::new(
            &self.config,
            capacity.min(self.config.context_length).max(1),
        )
    }

    /// Runs `tokens` at positions `start..` and returns logits, `[1, vocab]` for
    /// [`Logits::Last`] or `[tokens.len(), vocab]` for [`Logits::All`].
    pub fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        cache: &mut KvCache,
        logits: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.config;
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::InvalidConfig(
                "forward pass over zero tokens".into(),
            ));
        }
        cache.check_room(start, n)?;
        let d = cfg.hidden_size;
        let mut x = vec![0.0f32; n * d]; // [n, hidden]
        for (row, &tok) in x.chunks_exact_mut(d).zip(tokens) {
            if tok as usize >= cfg.vocab_size {
                return Err(ModelError::InvalidToken {
                    token: tok,
                    vocab_size: cfg.vocab_size,
                });
            }
            self.embedding.row(tok as usize, row)?;
        }
        if let Some(scale) = cfg.embedding_scale {
            pagoda_kernels::ops::scale_inplace(&mut x, scale);
        }
        let mut scratch = Scratch::default();
        match &self.stack {
            Stack::Llama(s) => s.forward(cfg, &mut x, n, start, cache, &mut scratch)?,
            Stack::Gemma3(s) => s.forward(cfg, &mut x, n, start, cache, &mut scratch)?,
        }
        cache.set_len(start + n);
        let rows = match logits {
            Logits::Last => &x[(n - 1) * d..],
            Logits::All => &x[..],
        };
        let n_out = rows.len() / d;
        let mut normed = Vec::new();
        self.output_norm.forward(rows, &mut normed);
        let mut out = Vec::new();
        self.output.forward(&normed, n_out, &mut out)?; // [n_out, vocab]
        if let Some(cap) = cfg.final_logit_softcap {
            pagoda_kernels::ops::softcap_inplace(&mut out, cap);
        }
        Ok(out)
    }
}
