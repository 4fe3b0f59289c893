//! The two blocks every decoder layer is made of, written once over the device seam
//! ([`Backend`]): self-attention ([`AttentionWeights`]) and the gated MLP ([`GatedMlp`]).
//!
//! Both work on a batch: `total` rows of activations, the concatenated new tokens of one or
//! more sequences. The linear layers run once over all rows (each weight read once per
//! step); only the backend's [`Backend::attention`] looks at which sequence a row is of.
//!
//! Invariant: the weights were shape-checked against the config when loaded, so a forward
//! call fails only for a device fault.

use super::backend::{Activation, Activations, Backend};
use crate::family::QkNorm;
use crate::weights::{TensorView, Weights};
use crate::{ModelConfig, ModelError};
use pagoda_kernels::attention::AttentionShape;
use pagoda_kernels::GgmlType;

/// The head layout of layer `layer` (`window`: its sliding window, if any).
pub fn attention_shape(cfg: &ModelConfig, layer: usize, window: Option<usize>) -> AttentionShape {
    AttentionShape {
        n_heads: cfg.n_heads,
        n_kv_heads: cfg.layer_n_kv_heads(layer),
        head_dim: cfg.layer_head_dim(layer),
        scale: cfg.attention_scale,
        softcap: cfg.attn_logit_softcap,
        window,
    }
}

/// An RMSNorm of `dim` ones (after the model's weight offset): a normalization without a
/// weight (Gemma 4's V norm) through the backend's one norm operation.
fn unit_norm<B: Backend>(
    backend: &B,
    dim: usize,
    cfg: &ModelConfig,
) -> Result<B::Norm, ModelError> {
    const NAME: &str = "unit_norm.weight";
    let ones: Vec<u8> = std::iter::repeat_n(1.0 - cfg.norm_weight_offset, dim)
        .flat_map(f32::to_le_bytes)
        .collect();
    let mut w = Weights::new();
    TensorView::owned(NAME, GgmlType::F32, vec![dim], ones)
        .and_then(|t| w.insert(t))
        .map_err(ModelError::InvalidConfig)?;
    backend.load_norm(&w, NAME, dim, cfg)
}

/// Gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Debug)]
pub struct GatedMlp<B: Backend> {
    pub gate: B::Linear,
    pub up: B::Linear,
    pub down: B::Linear,
    pub activation: Activation,
}

impl<B: Backend> GatedMlp<B> {
    pub fn load(
        backend: &B,
        weights: &Weights,
        layer: usize,
        cfg: &ModelConfig,
        activation: Activation,
    ) -> Result<Self, ModelError> {
        let (d, f) = (cfg.hidden_size, cfg.layer_ffn_dim(layer));
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        Ok(GatedMlp {
            gate: backend.load_linear(weights, &name("ffn_gate"), None, f, d)?,
            up: backend.load_linear(weights, &name("ffn_up"), None, f, d)?,
            down: backend.load_linear(weights, &name("ffn_down"), None, d, f)?,
            activation,
        })
    }

    /// `a.normed` (`[total, hidden]`) -> `a.branch` (`[total, hidden]`).
    pub fn forward(
        &self,
        backend: &B,
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        backend.linears(
            [&self.gate, &self.up],
            &a.normed,
            [&mut a.gate, &mut a.up],
            pass,
        )?;
        backend.gated(self.activation, &mut a.gate, &a.up)?;
        backend.linears([&self.down], &a.gate, [&mut a.branch], pass)
    }

    /// The three linears.
    pub fn linears(&self) -> [&B::Linear; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

/// The K and V projections of a layer that computes its own K/V.
#[derive(Debug)]
pub struct KvProjections<B: Backend> {
    pub k: B::Linear,
    /// V's projection; a second handle to `k` where the layer has none and the family takes
    /// V from K (`Block::v_defaults_to_k`).
    pub v: B::Linear,
    /// RMSNorm of keys, per head or over the whole projection (the family's `qk_norm`;
    /// both run as `rms_norm_heads` with the norm's width).
    pub k_norm: Option<B::Norm>,
    /// Per-head RMSNorm of values without a weight (the family's `v_norm`).
    pub v_norm: Option<B::Norm>,
}

/// Attention projections of one layer.
#[derive(Debug)]
pub struct AttentionWeights<B: Backend> {
    pub q: B::Linear,
    /// `None` for a layer that attends over an earlier layer's K/V (KV-shared layers).
    pub kv: Option<KvProjections<B>>,
    pub o: B::Linear,
    /// Per-head RMSNorm of queries (the family's `qk_norm`: Gemma 3/4, Qwen3).
    pub q_norm: Option<B::Norm>,
    /// Per query head, a logit in the softmax's denominator (gpt-oss's `attn_sinks`).
    pub sinks: Option<Vec<f32>>,
    /// The output gate (Qwen3.5's `attn_gate_q`, `[n_heads · head_dim, hidden]`): the
    /// attention's output is multiplied by `sigmoid(gate(x))` before `o`.
    pub output_gate: Option<B::Linear>,
}

impl<B: Backend> AttentionWeights<B> {
    pub fn load(
        backend: &B,
        weights: &Weights,
        layer: usize,
        cfg: &ModelConfig,
    ) -> Result<Self, ModelError> {
        let d = cfg.hidden_size;
        let head_dim = cfg.layer_head_dim(layer);
        let q_dim = cfg.layer_q_dim(layer);
        let kv_dim = cfg.layer_kv_dim(layer);
        let name = |t: &str| format!("blk.{layer}.{t}");
        let block = cfg.arch.family().block;
        // `whole`: the width of the projection the norm covers when it covers all heads.
        let norm = |t: &str, whole: usize| -> Result<Option<B::Norm>, ModelError> {
            let dim = match block.qk_norm {
                QkNorm::None => return Ok(None),
                QkNorm::PerHead => head_dim,
                QkNorm::Whole => whole,
            };
            Ok(Some(backend.load_norm(weights, &name(t), dim, cfg)?))
        };
        let projection = |t: &str, rows: usize| {
            let bias = name(&format!("{t}.bias"));
            backend.load_linear(weights, &name(&format!("{t}.weight")), Some(&bias), rows, d)
        };
        let kv = if layer < cfg.first_kv_shared() {
            let k = projection("attn_k", kv_dim)?;
            let v = if block.v_defaults_to_k && !weights.contains(&name("attn_v.weight")) {
                backend.share(&k)
            } else {
                projection("attn_v", kv_dim)?
            };
            Some(KvProjections {
                k,
                v,
                k_norm: norm("attn_k_norm.weight", kv_dim)?,
                v_norm: if block.v_norm {
                    Some(unit_norm(backend, head_dim, cfg)?)
                } else {
                    None
                },
            })
        } else {
            None
        };
        let sinks_name = name("attn_sinks.weight");
        let sinks = if weights.contains(&sinks_name) {
            if !B::ATTENTION_SINKS {
                return Err(ModelError::InvalidConfig(format!(
                    "{} attends with sinks, which the {} backend does not support yet; run \
                     it on the CPU (--device cpu)",
                    cfg.arch.family().display,
                    B::NAME
                )));
            }
            Some(weights.vector_f32(&sinks_name, cfg.n_heads)?)
        } else {
            None
        };
        Ok(AttentionWeights {
            q: projection("attn_q", q_dim)?,
            kv,
            o: backend.load_linear(
                weights,
                &name("attn_output.weight"),
                Some(&name("attn_output.bias")),
                d,
                q_dim,
            )?,
            q_norm: norm("attn_q_norm.weight", q_dim)?,
            sinks,
            output_gate: if weights.contains(&name("attn_gate_q.weight")) {
                if backend.device() != crate::device::Device::Cpu {
                    return Err(ModelError::InvalidConfig(format!(
                        "layer {layer} of this {} model gates its attention output, which runs \
                         on the CPU only; load it with --device cpu",
                        cfg.arch.family().display
                    )));
                }
                Some(backend.load_linear(weights, &name("attn_gate_q.weight"), None, q_dim, d)?)
            } else {
                None
            },
        })
    }

    /// Self-attention of a batch: projects all rows, normalizes Q, K and V per head, lets the
    /// backend rotate, store and attend over `kv` (this layer's, or for a KV-shared layer the
    /// source layer's, which this pass already wrote), and projects back. `a.normed`
    /// (`[total, hidden]`) -> `a.branch` (`[total, hidden]`).
    pub fn forward(
        &self,
        backend: &B,
        shape: &AttentionShape,
        rope: &B::Rope,
        kv: &mut B::KvLayer,
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        match &self.kv {
            Some(p) => {
                match &self.output_gate {
                    Some(g) => backend.linears(
                        [&self.q, g, &p.k, &p.v],
                        &a.normed,
                        [&mut a.q, &mut a.gate, &mut a.k, &mut a.v],
                        pass,
                    )?,
                    None => backend.linears(
                        [&self.q, &p.k, &p.v],
                        &a.normed,
                        [&mut a.q, &mut a.k, &mut a.v],
                        pass,
                    )?,
                }
                if let Some(norm) = &p.k_norm {
                    backend.rms_norm_heads(norm, &mut a.k)?;
                }
                if let Some(norm) = &p.v_norm {
                    backend.rms_norm_heads(norm, &mut a.v)?;
                }
            }
            None => {
                backend.linears([&self.q], &a.normed, [&mut a.q], pass)?;
                if let Some(g) = &self.output_gate {
                    backend.linears([g], &a.normed, [&mut a.gate], pass)?;
                }
            }
        }
        if let Some(norm) = &self.q_norm {
            backend.rms_norm_heads(norm, &mut a.q)?;
        }
        let new_kv = match self.kv {
            Some(_) => Some((&mut a.k, &a.v)),
            None => None,
        };
        backend.attention(
            shape,
            rope,
            &mut a.q,
            new_kv,
            self.sinks.as_deref(),
            kv,
            pass,
            &mut a.attn,
        )?;
        if self.output_gate.is_some() {
            backend.gated(Activation::Sigmoid, &mut a.gate, &a.attn)?;
            return backend.linears([&self.o], &a.gate, [&mut a.branch], pass);
        }
        backend.linears([&self.o], &a.attn, [&mut a.branch], pass)
    }

    /// The projections (two to five).
    pub fn linears(&self) -> Vec<&B::Linear> {
        let mut all = vec![&self.q];
        all.extend(&self.output_gate);
        if let Some(p) = &self.kv {
            all.extend([&p.k, &p.v]);
        }
        all.push(&self.o);
        all
    }
}
