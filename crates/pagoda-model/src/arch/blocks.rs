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
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use pagoda_kernels::attention::AttentionShape;

/// The head layout of one attention layer (`window`: its sliding window, if any).
pub fn attention_shape(cfg: &ModelConfig, window: Option<usize>) -> AttentionShape {
    AttentionShape {
        n_heads: cfg.n_heads,
        n_kv_heads: cfg.n_kv_heads,
        head_dim: cfg.head_dim,
        scale: cfg.attention_scale,
        softcap: cfg.attn_logit_softcap,
        window,
    }
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
        let (d, f) = (cfg.hidden_size, cfg.ffn_dim);
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

/// Attention projections of one layer.
#[derive(Debug)]
pub struct AttentionWeights<B: Backend> {
    pub q: B::Linear,
    pub k: B::Linear,
    pub v: B::Linear,
    pub o: B::Linear,
    /// Per-head RMSNorm of queries and keys (the family's `qk_norm`: Gemma 3, Qwen3).
    pub q_norm: Option<B::Norm>,
    pub k_norm: Option<B::Norm>,
}

impl<B: Backend> AttentionWeights<B> {
    pub fn load(
        backend: &B,
        weights: &Weights,
        layer: usize,
        cfg: &ModelConfig,
    ) -> Result<Self, ModelError> {
        let d = cfg.hidden_size;
        let q_dim = cfg.n_heads * cfg.head_dim;
        let kv_dim = cfg.n_kv_heads * cfg.head_dim;
        let name = |t: &str| format!("blk.{layer}.{t}");
        let qk_norm = cfg.arch.family().block.qk_norm;
        let norm = |t: &str| -> Result<Option<B::Norm>, ModelError> {
            if qk_norm {
                Ok(Some(backend.load_norm(
                    weights,
                    &name(t),
                    cfg.head_dim,
                    cfg,
                )?))
            } else {
                Ok(None)
            }
        };
        let projection = |t: &str, rows: usize| {
            let bias = name(&format!("{t}.bias"));
            backend.load_linear(weights, &name(&format!("{t}.weight")), Some(&bias), rows, d)
        };
        Ok(AttentionWeights {
            q: projection("attn_q", q_dim)?,
            k: projection("attn_k", kv_dim)?,
            v: projection("attn_v", kv_dim)?,
            o: backend.load_linear(weights, &name("attn_output.weight"), None, d, q_dim)?,
            q_norm: norm("attn_q_norm.weight")?,
            k_norm: norm("attn_k_norm.weight")?,
        })
    }

    /// Self-attention of a batch: projects all rows, normalizes Q and K per head, lets the
    /// backend rotate, store and attend, and projects back. `a.normed` (`[total, hidden]`)
    /// -> `a.branch` (`[total, hidden]`).
    pub fn forward(
        &self,
        backend: &B,
        shape: &AttentionShape,
        rope: &B::Rope,
        kv: &mut B::KvLayer,
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        backend.linears(
            [&self.q, &self.k, &self.v],
            &a.normed,
            [&mut a.q, &mut a.k, &mut a.v],
            pass,
        )?;
        if let Some(norm) = &self.q_norm {
            backend.rms_norm_heads(norm, &mut a.q)?;
        }
        if let Some(norm) = &self.k_norm {
            backend.rms_norm_heads(norm, &mut a.k)?;
        }
        backend.attention(shape, rope, &mut a.q, &mut a.k, &a.v, kv, pass, &mut a.attn)?;
        backend.linears([&self.o], &a.attn, [&mut a.branch], pass)
    }

    /// The four projections.
    pub fn linears(&self) -> [&B::Linear; 4] {
        [&self.q, &self.k, &self.v, &self.o]
    }
}
