//! The Gemma 3 forward pass, written once over the device seam.
//!
//! Differs from Llama in: embeddings scaled by `sqrt(hidden)`; RMSNorm after attention and
//! after the MLP as well as before each; per-head RMSNorm of Q and K; GeGLU; most layers
//! attend within a sliding window and rotate with a local RoPE base, every few a global layer
//! attends to everything with the global base (and the config's RoPE scaling).

use super::backend::{Activation, Activations, Backend};
use super::blocks::{attention_shape, AttentionWeights, GatedMlp};
use crate::config::RopeScaling;
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use std::ops::Range;

#[derive(Debug)]
struct Gemma3Layer<B: Backend> {
    attn_norm: B::Norm,
    attn: AttentionWeights<B>,
    post_attn_norm: B::Norm,
    ffn_norm: B::Norm,
    mlp: GatedMlp<B>,
    post_ffw_norm: B::Norm,
    sliding: bool,
}

/// The decoder stack of a Gemma 3 model.
#[derive(Debug)]
pub struct Gemma3Layers<B: Backend> {
    /// The first layer held: `layers[j]` is the model's layer `first + j`.
    first: usize,
    layers: Vec<Gemma3Layer<B>>,
    rope_global: B::Rope,
    rope_local: B::Rope,
}

impl<B: Backend> Gemma3Layers<B> {
    /// Loads the decoder layers `owned` (all of `0..n_layers` for a model on one device; a
    /// part of a split model loads only its own).
    pub fn load(
        backend: &B,
        weights: &Weights,
        cfg: &ModelConfig,
        owned: Range<usize>,
    ) -> Result<Self, ModelError> {
        let d = cfg.hidden_size;
        let norm =
            |i: usize, t: &str| backend.load_norm(weights, &format!("blk.{i}.{t}.weight"), d, cfg);
        let first = owned.start;
        let layers = owned
            .map(|i| {
                Ok(Gemma3Layer {
                    attn_norm: norm(i, "attn_norm")?,
                    attn: AttentionWeights::load(backend, weights, i, cfg)?,
                    post_attn_norm: norm(i, "post_attention_norm")?,
                    ffn_norm: norm(i, "ffn_norm")?,
                    mlp: GatedMlp::load(backend, weights, i, cfg, Activation::GeluTanh)?,
                    post_ffw_norm: norm(i, "post_ffw_norm")?,
                    sliding: cfg.layer_is_sliding[i],
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let local_theta = cfg.rope_theta_local.unwrap_or(cfg.rope_theta);
        Ok(Gemma3Layers {
            first,
            layers,
            rope_global: backend.load_rope(
                weights,
                cfg,
                cfg.rope_theta,
                &cfg.rope_scaling,
                false,
            )?,
            rope_local: backend.load_rope(weights, cfg, local_theta, &RopeScaling::None, false)?,
        })
    }

    /// Every linear layer of the stack.
    pub fn linears(&self) -> impl Iterator<Item = &B::Linear> {
        self.layers
            .iter()
            .flat_map(|l| l.attn.linears().into_iter().chain(l.mlp.linears()))
    }

    /// Runs the layers `layers` (all the stack owns for a full forward pass) over the batch
    /// `a.x` (`[total, hidden]`), in place, writing layer `i`'s K/V into `kv[i - first]`
    /// (`kv` holds the owned layers' K/V, `first` the first owned layer). `layers` is within
    /// the owned layers (the caller checks).
    pub fn forward(
        &self,
        backend: &B,
        cfg: &ModelConfig,
        layers: std::ops::Range<usize>,
        kv: &mut [B::KvLayer],
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        for i in layers {
            let layer = &self.layers[i - self.first];
            let (rope, window) = if layer.sliding {
                (&self.rope_local, cfg.sliding_window)
            } else {
                (&self.rope_global, None)
            };
            let shape = attention_shape(cfg, window);
            backend.rms_norm(&layer.attn_norm, &a.x, &mut a.normed)?;
            layer
                .attn
                .forward(backend, &shape, rope, &mut kv[i - self.first], a, pass)?;
            backend.rms_norm(&layer.post_attn_norm, &a.branch, &mut a.post)?;
            backend.add(&mut a.x, &a.post)?;
            backend.rms_norm(&layer.ffn_norm, &a.x, &mut a.normed)?;
            layer.mlp.forward(backend, a, pass)?;
            backend.rms_norm(&layer.post_ffw_norm, &a.branch, &mut a.post)?;
            backend.add(&mut a.x, &a.post)?;
        }
        Ok(())
    }
}
