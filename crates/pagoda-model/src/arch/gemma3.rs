//! The Gemma 3 forward pass.
//!
//! Differs from Llama in: embeddings scaled by `sqrt(hidden)`; RMSNorm after attention and
//! after the MLP as well as before each; per-head RMSNorm of Q and K; GeGLU; most layers
//! attend within a sliding window and rotate with a local RoPE base, every few a global layer
//! attends to everything with the global base (and the config's RoPE scaling).

use super::layers::{Activation, AttentionWeights, GatedMlp, RmsNorm, Rope, Scratch};
use crate::config::RopeScaling;
use crate::weights::Weights;
use crate::{ModelConfig, ModelError, PagedKvCache};
use pagoda_kernels::ops;
use pagoda_kernels::paged_attention::SeqAttention;

#[derive(Debug, Clone)]
struct Gemma3Layer {
    attn_norm: RmsNorm,
    attn: AttentionWeights,
    post_attn_norm: RmsNorm,
    ffn_norm: RmsNorm,
    mlp: GatedMlp,
    post_ffw_norm: RmsNorm,
    sliding: bool,
}

/// The decoder stack of a Gemma 3 model.
#[derive(Debug, Clone)]
pub struct Gemma3Layers {
    layers: Vec<Gemma3Layer>,
    rope_global: Rope,
    rope_local: Rope,
}

impl Gemma3Layers {
    pub fn load(weights: &Weights, cfg: &ModelConfig) -> Result<Self, ModelError> {
        let d = cfg.hidden_size;
        let norm =
            |i: usize, t: &str| RmsNorm::load(weights, &format!("blk.{i}.{t}.weight"), d, cfg);
        let layers = (0..cfg.n_layers)
            .map(|i| {
                Ok(Gemma3Layer {
                    attn_norm: norm(i, "attn_norm")?,
                    attn: AttentionWeights::load(weights, i, cfg)?,
                    post_attn_norm: norm(i, "post_attention_norm")?,
                    ffn_norm: norm(i, "ffn_norm")?,
                    mlp: GatedMlp::load(weights, i, cfg, Activation::GeluTanh)?,
                    post_ffw_norm: norm(i, "post_ffw_norm")?,
                    sliding: cfg.layer_is_sliding[i],
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let local_theta = cfg.rope_theta_local.unwrap_or(cfg.rope_theta);
        Ok(Gemma3Layers {
            layers,
            rope_global: Rope::new(cfg, cfg.rope_theta, &cfg.rope_scaling),
            rope_local: Rope::new(cfg, local_theta, &RopeScaling::None),
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
        let mut post = std::mem::take(&mut s.post);
        for (i, layer) in self
            .layers
            .iter()
            .enumerate()
            .take(layers.end)
            .skip(layers.start)
        {
            let (rope, window) = if layer.sliding {
                (&self.rope_local, cfg.sliding_window)
            } else {
                (&self.rope_global, None)
            };
            layer.attn_norm.forward(x, &mut normed);
            layer
                .attn
                .forward(cfg, i, rope, window, &normed, seqs, cache, s, &mut branch)?;
            layer.post_attn_norm.forward(&branch, &mut post);
            ops::add_inplace(x, &post);
            layer.ffn_norm.forward(x, &mut normed);
            layer.mlp.forward(&normed, total, s, &mut branch)?;
            layer.post_ffw_norm.forward(&branch, &mut post);
            ops::add_inplace(x, &post);
        }
        s.normed = normed;
        s.branch = branch;
        s.post = post;
        Ok(())
    }
}
