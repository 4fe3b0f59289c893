//! The decoder stack of every family, written once over the device seam and driven by the
//! family's [`Block`](crate::family::Block) and the config's per-layer flags.
//!
//! Per layer `i`:
//! `x += post_attn?(o(attn(rope_i?(qk_norm?(q(n))), rope_i?(qk_norm?(k(n))), v(n))))` with
//! `n = attn_norm(x)`, then `x += post_ffw?(down(act(gate(m)) * up(m)))` with
//! `m = ffn_norm(x)`; in a mixture-of-experts layer (`cfg.layer_is_moe`) the MLP is the
//! router's chosen experts ([`super::moe`]). The `?` parts are the block's: post-norms for
//! [`NormPlacement::Sandwich`], QK-norm when the file has its weights, RoPE unless the layer
//! is a NoPE layer (`layer_uses_rope`: it gets [`Rope::identity`]), with the local base on sliding-window layers when the
//! family has one (`rope_theta_local`) and the global base and scaling elsewhere. A
//! sliding-window layer attends within `sliding_window`.
//!
//! Layers may differ ([`crate::config::LayerVariants`], Gemma 4): each layer's head shape,
//! RoPE width and FFN width are its own (`cfg.layer_*`), global layers get their own RoPE
//! table; a KV-shared layer projects only Q and attends over its source layer's K/V
//! (`cfg.kv_source`), which an earlier layer of the same pass wrote; after the MLP a layer may
//! add its per-layer input ([`super::per_layer`]) and scale its output
//! (`layer_output_scale`).
//!
//! In a hybrid model (`cfg.hybrid`) a layer's token mixer may be recurrent instead of
//! attention ([`crate::config::Mixer`]: LFM2's short convolution, [`super::short_conv`];
//! Granite 4.0-H's Mamba-2, [`super::mamba2`]; Qwen3.5's gated DeltaNet,
//! [`super::gated_delta_net`]): it reads and writes its sequences' state slots
//! ([`crate::recurrent_state`]) and keeps no K/V. Granite scales each block's output by
//! `cfg.residual_scale` before its residual add.

use super::backend::{Activations, Backend};
use super::blocks::{attention_shape, AttentionWeights, GatedMlp};
use super::gated_delta_net::GatedDeltaNet;
use super::mamba2::Mamba2;
use super::moe::MoeBlock;
use super::per_layer::PerLayerGate;
use super::rope::Rope;
use super::short_conv::ShortConv;
use crate::config::{Mixer, RopeScaling};
use crate::family::NormPlacement;
use crate::recurrent_state::RecurrentStates;
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use std::ops::Range;

/// Which rotation a layer applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerRope {
    Global,
    Local,
    None,
}

#[derive(Debug)]
struct DecoderLayer<B: Backend> {
    attn_norm: B::Norm,
    mixer: TokenMixer<B>,
    /// Sandwich norms: after attention and after the MLP.
    post_norms: Option<(B::Norm, B::Norm)>,
    ffn_norm: B::Norm,
    ffn: Ffn<B>,
    window: Option<usize>,
    rope: LayerRope,
    /// The layer whose K/V this one attends over (itself unless KV-shared).
    kv_source: usize,
    per_layer: Option<PerLayerGate<B>>,
    /// Multiplier on the layer's output (`layer_output_scale`), if the file has one.
    output_scale: Option<f32>,
}

/// What mixes a layer's tokens.
#[derive(Debug)]
enum TokenMixer<B: Backend> {
    Attention(AttentionWeights<B>),
    ShortConv(ShortConv<B>),
    Mamba2(Mamba2<B>),
    GatedDeltaNet(GatedDeltaNet<B>),
}

impl<B: Backend> TokenMixer<B> {
    fn linears(&self) -> Vec<&B::Linear> {
        match self {
            TokenMixer::Attention(a) => a.linears().into_iter().collect(),
            TokenMixer::ShortConv(c) => c.linears().into_iter().collect(),
            TokenMixer::Mamba2(m) => m.linears().into_iter().collect(),
            TokenMixer::GatedDeltaNet(n) => n.linears().into_iter().collect(),
        }
    }
}

/// A layer's feed-forward block.
#[derive(Debug)]
enum Ffn<B: Backend> {
    Dense(GatedMlp<B>),
    Experts(MoeBlock<B>),
}

impl<B: Backend> Ffn<B> {
    fn linears(&self) -> Box<dyn Iterator<Item = &B::Linear> + '_> {
        match self {
            Ffn::Dense(m) => Box::new(m.linears().into_iter()),
            Ffn::Experts(m) => Box::new(m.linears()),
        }
    }
}

/// The decoder stack of a model.
#[derive(Debug)]
pub struct DecoderLayers<B: Backend> {
    /// The first layer held: `layers[j]` is the model's layer `first + j`.
    first: usize,
    layers: Vec<DecoderLayer<B>>,
    rope_global: B::Rope,
    /// The local base of sliding-window layers (Gemma 3), when the family has one.
    rope_local: Option<B::Rope>,
    /// A rotation that leaves Q and K as they are, for NoPE layers (no frequencies).
    rope_none: Option<B::Rope>,
}

impl<B: Backend> DecoderLayers<B> {
    /// Loads the decoder layers `owned` (all of `0..n_layers` for a model on one device; a
    /// part of a split model loads only its own).
    pub fn load(
        backend: &B,
        weights: &Weights,
        cfg: &ModelConfig,
        owned: Range<usize>,
    ) -> Result<Self, ModelError> {
        let block = cfg.arch.family().block;
        let d = cfg.hidden_size;
        let norm =
            |i: usize, t: &str| backend.load_norm(weights, &format!("blk.{i}.{t}.weight"), d, cfg);
        let first = owned.start;
        let owned_start = owned.start;
        let layers = owned
            .map(|i| {
                let sliding = cfg.layer_is_sliding[i];
                let rope = if !cfg.layer_uses_rope[i] {
                    LayerRope::None
                } else if sliding && cfg.rope_theta_local.is_some() {
                    LayerRope::Local
                } else {
                    LayerRope::Global
                };
                let post_norms = match block.norms {
                    NormPlacement::Pre => None,
                    NormPlacement::Sandwich => {
                        Some((norm(i, "post_attention_norm")?, norm(i, "post_ffw_norm")?))
                    }
                };
                let kv_source = cfg.kv_source(i).ok_or_else(|| {
                    ModelError::InvalidConfig(format!("layer {i} has no layer to share K/V with"))
                })?;
                if kv_source < owned_start {
                    return Err(ModelError::InvalidConfig(format!(
                        "layer {i} shares the K/V of layer {kv_source}, which another part of \
                         a split model holds; load this model on one device"
                    )));
                }
                let scale_name = format!("blk.{i}.layer_output_scale.weight");
                let output_scale = if weights.contains(&scale_name) {
                    Some(weights.vector_f32(&scale_name, 1)?[0])
                } else {
                    None
                };
                let mixer = match (cfg.layer_mixer(i), &cfg.hybrid) {
                    (Mixer::ShortConv, Some(h)) => TokenMixer::ShortConv(ShortConv::load(
                        backend,
                        weights,
                        i,
                        cfg,
                        h.conv_kernel,
                    )?),
                    (Mixer::GatedDeltaNet, Some(h)) => {
                        let shape = h.delta_net.ok_or_else(|| {
                            ModelError::InvalidConfig(format!(
                                "layer {i} is a gated DeltaNet without its head shape"
                            ))
                        })?;
                        TokenMixer::GatedDeltaNet(GatedDeltaNet::load(
                            backend,
                            weights,
                            i,
                            cfg,
                            shape,
                            h.conv_kernel,
                        )?)
                    }
                    (Mixer::Mamba2, Some(h)) => {
                        let shape = h.mamba2.ok_or_else(|| {
                            ModelError::InvalidConfig(format!(
                                "layer {i} is a Mamba-2 layer without its shape"
                            ))
                        })?;
                        TokenMixer::Mamba2(Mamba2::load(
                            backend,
                            weights,
                            i,
                            cfg,
                            shape,
                            h.conv_kernel,
                        )?)
                    }
                    _ => TokenMixer::Attention(AttentionWeights::load(backend, weights, i, cfg)?),
                };
                if !matches!(mixer, TokenMixer::Attention(_))
                    && backend.device() != crate::device::Device::Cpu
                {
                    return Err(ModelError::InvalidConfig(format!(
                        "layer {i} of this {} model is recurrent, and recurrent layers run on \
                         the CPU only; load it with --device cpu",
                        cfg.arch.family().display
                    )));
                }
                Ok(DecoderLayer {
                    attn_norm: norm(i, "attn_norm")?,
                    mixer,
                    post_norms,
                    ffn_norm: norm(i, "ffn_norm")?,
                    ffn: match &cfg.moe {
                        Some(moe) if cfg.layer_is_moe(i) => Ffn::Experts(MoeBlock::load(
                            backend,
                            weights,
                            i,
                            cfg,
                            moe,
                            block.activation,
                        )?),
                        _ => {
                            Ffn::Dense(GatedMlp::load(backend, weights, i, cfg, block.activation)?)
                        }
                    },
                    window: if sliding { cfg.sliding_window } else { None },
                    rope,
                    kv_source,
                    per_layer: PerLayerGate::load(backend, weights, cfg, i)?,
                    output_scale,
                })
            })
            .collect::<Result<Vec<DecoderLayer<B>>, ModelError>>()?;
        // `rope_freqs.weight` (Llama 3.1+ GGUF files) scales the global rotation only, and
        // only in the families llama.cpp reads it for.
        let mut global = match &cfg.variants.global {
            Some(g) => Rope::with_dims(
                cfg,
                g.head_dim,
                g.rope_dim,
                cfg.rope_theta,
                &cfg.rope_scaling,
            )
            .rotating_only(g.rotated_dim),
            None => Rope::new(cfg, cfg.rope_theta, &cfg.rope_scaling),
        };
        if cfg.arch.family().gguf_rope_freqs {
            global = global.with_freq_factors(weights)?;
        }
        let rope_global = backend.place_rope(global)?;
        let rope_local = match cfg.rope_theta_local {
            Some(theta) if layers.iter().any(|l| l.rope == LayerRope::Local) => {
                Some(backend.place_rope(Rope::new(cfg, theta, &RopeScaling::None))?)
            }
            _ => None,
        };
        let rope_none = if layers.iter().any(|l| l.rope == LayerRope::None) {
            Some(backend.place_rope(Rope::identity(cfg))?)
        } else {
            None
        };
        Ok(DecoderLayers {
            first,
            layers,
            rope_global,
            rope_local,
            rope_none,
        })
    }

    /// Every linear layer of the stack.
    pub fn linears(&self) -> impl Iterator<Item = &B::Linear> {
        self.layers.iter().flat_map(|l| {
            l.mixer
                .linears()
                .into_iter()
                .chain(l.ffn.linears())
                .chain(l.per_layer.iter().flat_map(|p| p.linears()))
        })
    }

    /// Runs the layers `layers` (all the stack owns for a full forward pass) over the batch
    /// `a.x` (`[total, hidden]`), in place, writing layer `i`'s K/V into `kv[i - first]`
    /// (`kv` holds the owned layers' K/V, `first` the first owned layer) and a recurrent
    /// layer's state into `states`. `layers` is within the owned layers (the caller checks).
    pub fn forward(
        &self,
        backend: &B,
        cfg: &ModelConfig,
        layers: Range<usize>,
        (kv, states): (&mut [B::KvLayer], &mut RecurrentStates),
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        for i in layers {
            let layer = &self.layers[i - self.first];
            let rope = match (layer.rope, &self.rope_local, &self.rope_none) {
                (LayerRope::Local, Some(r), _) => r,
                (LayerRope::None, _, Some(r)) => r,
                _ => &self.rope_global,
            };
            backend.rms_norm(&layer.attn_norm, &a.x, &mut a.normed)?;
            match &layer.mixer {
                TokenMixer::Attention(attn) => {
                    let shape = attention_shape(cfg, i, layer.window);
                    let kv_layer = kv.get_mut(layer.kv_source - self.first).ok_or_else(|| {
                        ModelError::InvalidBatch(format!("no K/V for layer {}", layer.kv_source))
                    })?;
                    attn.forward(backend, &shape, rope, kv_layer, a, pass)?;
                }
                TokenMixer::ShortConv(conv) => {
                    conv.forward(backend, layer_state(states, i, self.first)?, a, pass)?
                }
                TokenMixer::GatedDeltaNet(net) => {
                    net.forward(backend, layer_state(states, i, self.first)?, a, pass)?
                }
                TokenMixer::Mamba2(mamba) => {
                    mamba.forward(backend, layer_state(states, i, self.first)?, a, pass)?
                }
            }
            if let Some(s) = cfg.residual_scale {
                backend.scale(&mut a.branch, s)?;
            }
            match &layer.post_norms {
                Some((post_attn, _)) => {
                    backend.rms_norm(post_attn, &a.branch, &mut a.post)?;
                    backend.add(&mut a.x, &a.post)?;
                }
                None => backend.add(&mut a.x, &a.branch)?,
            }
            backend.rms_norm(&layer.ffn_norm, &a.x, &mut a.normed)?;
            match &layer.ffn {
                Ffn::Dense(mlp) => mlp.forward(backend, a, pass)?,
                Ffn::Experts(moe) => moe.forward(backend, a, pass)?,
            }
            if let Some(s) = cfg.residual_scale {
                backend.scale(&mut a.branch, s)?;
            }
            match &layer.post_norms {
                Some((_, post_ffw)) => {
                    backend.rms_norm(post_ffw, &a.branch, &mut a.post)?;
                    backend.add(&mut a.x, &a.post)?;
                }
                None => backend.add(&mut a.x, &a.branch)?,
            }
            if let Some(p) = &layer.per_layer {
                p.forward(backend, cfg, i, a, pass)?;
            }
            if let Some(s) = layer.output_scale {
                backend.scale(&mut a.x, s)?;
            }
        }
        Ok(())
    }
}

/// Layer `i`'s recurrent state (its slots and the pass's slot per sequence) in `states`,
/// which hold the layers from `first` on.
fn layer_state(
    states: &mut RecurrentStates,
    i: usize,
    first: usize,
) -> Result<(usize, &mut [f32], &[u32]), ModelError> {
    states.layer_mut(i - first).ok_or_else(|| {
        ModelError::InvalidBatch(format!(
            "layer {i} is recurrent but the cache holds no state for it: make the cache with \
             the model's try_new_paged_cache"
        ))
    })
}
