//! The Llama forward pass, also used for Qwen2 (whose only difference, biases on Q, K and V,
//! is carried by the backend's linear layers). Written once over the device seam.
//!
//! Per layer: `x += o(attn(rope(q(norm(x))), rope(k(norm(x))), v(norm(x))))`, then
//! `x += down(silu(gate(norm(x))) * up(norm(x)))`.

use super::backend::{Activation, Activations, Backend};
use super::blocks::{attention_shape, AttentionWeights, GatedMlp};
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use std::ops::Range;

#[derive(Debug)]
struct LlamaLayer<B: Backend> {
    attn_norm: B::Norm,
    attn: AttentionWeights<B>,
    ffn_norm: B::Norm,
    mlp: GatedMlp<B>,
}

/// The decoder stack of a Llama-family model.
#[derive(Debug)]
pub struct LlamaLayers<B: Backend> {
    /// The first layer held: `layers[j]` is the model's layer `first + j`.
    first: usize,
    layers: Vec<LlamaLayer<B>>,
    rope: B::Rope,
}

impl<B: Backend> LlamaLayers<B> {
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
                Ok(LlamaLayer {
                    attn_norm: norm(i, "attn_norm")?,
                    attn: AttentionWeights::load(backend, weights, i, cfg)?,
                    ffn_norm: norm(i, "ffn_norm")?,
                    mlp: GatedMlp::load(backend, weights, i, cfg, Activation::Silu)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(LlamaLayers {
            first,
            layers,
            rope: backend.load_rope(weights, cfg, cfg.rope_theta, &cfg.rope_scaling, true)?,
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
        let shape = attention_shape(cfg, None);
        for i in layers {
            let layer = &self.layers[i - self.first];
            backend.rms_norm(&layer.attn_norm, &a.x, &mut a.normed)?;
            layer.attn.forward(
                backend,
                &shape,
                &self.rope,
                &mut kv[i - self.first],
                a,
                pass,
            )?;
            backend.add(&mut a.x, &a.branch)?;
            backend.rms_norm(&layer.ffn_norm, &a.x, &mut a.normed)?;
            layer.mlp.forward(backend, a, pass)?;
            backend.add(&mut a.x, &a.branch)?;
        }
        Ok(())
    }
}
