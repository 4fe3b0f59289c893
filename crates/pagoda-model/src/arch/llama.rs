//! The Llama forward pass, also used for Qwen2 (whose only difference, biases on Q, K and V,
//! is carried by [`Linear`](super::layers::Linear)).
//!
//! Per layer: `x += o(attn(rope(q(norm(x))), rope(k(norm(x))), v(norm(x))))`, then
//! `x += down(silu(gate(norm(x))) * up(norm(x)))`.

use super::layers::{Activation, AttentionWeights, GatedMlp, RmsNorm, Rope, Scratch};
use crate::weights::Weights;
use crate::{ModelConfig, ModelError, PagedKvCache};
use pagoda_kernels::ops;
use pagoda_kernels::paged_attention::SeqAttention;

#[derive(Debug, Clone)]
struct LlamaLayer {
    attn_norm: RmsNorm,
    attn: AttentionWeights,
    ffn_norm: RmsNorm,
    mlp: GatedMlp,
}

/// The decoder stack of a Llama-family model.
#[derive(Debug, Clone)]
pub struct LlamaLayers {
    layers: Vec<LlamaLayer>,
    rope: Rope,
}

impl LlamaLayers {
    pub fn load(weights: &Weights, cfg: &ModelConfig) -> Result<Self, ModelError> {
        let d = cfg.hidden_size;
        let layers = (0..cfg.n_layers)
            .map(|i| {
                Ok(LlamaLayer {
                    attn_norm: RmsNorm::load(
                        weights,
                        &format!("blk.{i}.attn_norm.weight"),
                        d,
                        cfg,
                    )?,
                    attn: AttentionWeights::load(weights, i, cfg)?,
                    ffn_norm: RmsNorm::load(weights, &format!("blk.{i}.ffn_norm.weight"), d, cfg)?,
                    mlp: GatedMlp::load(weights, i, cfg, Activation::Silu)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(LlamaLayers {
            layers,
            rope: Rope::new(cfg, cfg.rope_theta, &cfg.rope_scaling).with_freq_factors(weights)?,
        })
    }

    /// Runs the layers `layers` (all of them for a full forward pass) over the batch `x`
    /// (`[total, hidden]`, rows of the sequences `seqs`), in place, writing each layer's K/V
    /// into `cache`. `layers` is within `0..n_layers` (the caller checks).
    /// Every linear layer of the stack.
    pub fn linears(&self) -> impl Iterator<Item = &super::layers::Linear> {
        self.layers
            .iter()
            .flat_map(|l| l.attn.linears().into_iter().chain(l.mlp.linears()))
    }

    pub fn forward(
        &self,
        cfg: &ModelConfig,
        layers: std::ops::Range<usize>,
        x: &mut [f32],
        seqs: &[SeqAttention<'_>],
        cache: &mut PagedKvCache,
        s: &mut Scratch,
    ) -> Result<(), ModelError> {
        let total = x.len() / cfg.hidden_size;
        let mut normed = std::mem::take(&mut s.normed);
        let mut branch = std::mem::take(&mut s.branch);
        for (i, layer) in self
            .layers
            .iter()
            .enumerate()
            .take(layers.end)
            .skip(layers.start)
        {
            layer.attn_norm.forward(x, &mut normed);
            layer.attn.forward(
                cfg,
                i,
                &self.rope,
                None,
                &normed,
                seqs,
                cache,
                s,
                &mut branch,
            )?;
            ops::add_inplace(x, &branch);
            layer.ffn_norm.forward(x, &mut normed);
            layer.mlp.forward(&normed, total, s, &mut branch)?;
            ops::add_inplace(x, &branch);
        }
        s.normed = normed;
        s.branch = branch;
        Ok(())
    }
}
