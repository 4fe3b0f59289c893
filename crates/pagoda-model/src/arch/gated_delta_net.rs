//! Qwen3.5's gated DeltaNet, the token mixer of its linear-attention layers (transformers'
//! `Qwen3_5GatedDeltaNet`, llama.cpp's `build_layer_attn_linear`). Per row of a sequence:
//!
//! ```text
//! q, k, v = split(silu(conv(in_proj_qkv(x))))    causal depthwise convolution, `taps` taps
//! g       = -exp(A_log) · softplus(in_proj_a(x) + dt_bias)      per value head
//! beta    = sigmoid(in_proj_b(x))                               per value head
//! o       = gated delta rule(l2norm(q) / sqrt(d_k), l2norm(k), v, g, beta)
//! out     = out_proj(rmsnorm(o) · w · silu(in_proj_z(x)))         per value head
//! ```
//!
//! The convolution and the rule are pagoda-kernels' `recurrent::conv1d_causal_prefill` and
//! `recurrent::gated_delta_prefill` (tested against transformers' torch functions), the gates
//! `recurrent::gated_delta_gates`; the norm weight `w` is used as stored (not `1 + w`).
//!
//! Weights (canonical names; `family::qwen35` renames HF's): `blk.N.attn_qkv.weight`
//! `[conv_dim, hidden]` (q, k, v rows), `blk.N.attn_gate.weight` (z), `blk.N.ssm_beta.weight`,
//! `blk.N.ssm_alpha.weight`, `blk.N.ssm_conv1d.weight` `[conv_dim, taps]`, `blk.N.ssm_a_log`
//! (HF's `A_log`) or `blk.N.ssm_a` (GGUF's `-exp(A_log)`), `blk.N.ssm_dt.bias`,
//! `blk.N.ssm_norm.weight` `[d_v]`, `blk.N.ssm_out.weight`. When the file tiles its value
//! heads ([`DeltaNetConfig::tiled_value_heads`]) every weight is read in its file's order.
//!
//! The projections run on the backend; the rest is [`Backend::gated_delta_net`], on the CPU
//! `super::gated_delta_cpu` (which also owns the per-sequence state's layout).
//!
//! Invariant: a sequence's rows run in position order from the state its earlier rows left
//! (a segment at position 0 starts from zeros), so a prompt in one pass, in chunks, or a
//! token at a time gives the same outputs up to the rule's rounding.

use super::backend::{Activations, Backend};
use super::gated_delta_cpu::{DeltaNetParams, FileOrder};
use crate::config::DeltaNetConfig;
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};

/// One layer's gated DeltaNet on a backend.
#[derive(Debug)]
pub struct GatedDeltaNet<B: Backend> {
    qkv: B::Linear,
    z: B::Linear,
    beta: B::Linear,
    alpha: B::Linear,
    out: B::Linear,
    params: DeltaNetParams,
}

impl<B: Backend> GatedDeltaNet<B> {
    /// Layer `i`'s weights.
    pub fn load(
        backend: &B,
        weights: &Weights,
        i: usize,
        cfg: &ModelConfig,
        shape: DeltaNetConfig,
        taps: usize,
    ) -> Result<Self, ModelError> {
        let d = cfg.hidden_size;
        let (conv_dim, value_dim, heads) = (shape.conv_dim(), shape.value_dim(), shape.n_v_heads);
        let name = |t: &str| format!("blk.{i}.{t}");
        let bad = |tensor: String, message: String| ModelError::Tensor {
            path: Default::default(),
            tensor,
            message,
        };
        let conv = weights.conv_f32(&name("ssm_conv1d.weight"), conv_dim, taps)?;
        let a_log_name = name("ssm_a_log");
        let a_log = if weights.contains(&a_log_name) {
            weights.vector_f32(&a_log_name, heads)?
        } else {
            // GGUF: -exp(A_log).
            let a_name = name("ssm_a");
            let a = weights.vector_f32(&a_name, heads)?;
            if let Some(x) = a.iter().find(|x| !x.is_finite() || **x >= 0.0) {
                return Err(bad(a_name, format!("{x} is not negative (-exp(A_log))")));
            }
            a.iter().map(|x| (-x).ln()).collect()
        };
        let linear = |t: &str, rows: usize, cols: usize| {
            backend.load_linear(weights, &name(&format!("{t}.weight")), None, rows, cols)
        };
        Ok(GatedDeltaNet {
            qkv: linear("attn_qkv", conv_dim, d)?,
            z: linear("attn_gate", value_dim, d)?,
            beta: linear("ssm_beta", heads, d)?,
            alpha: linear("ssm_alpha", heads, d)?,
            out: linear("ssm_out", d, value_dim)?,
            params: DeltaNetParams::new(
                shape,
                taps,
                conv,
                FileOrder {
                    a_log: &a_log,
                    dt_bias: &weights.vector_f32(&name("ssm_dt.bias"), heads)?,
                },
                weights.vector_f32(&name("ssm_norm.weight"), shape.d_v)?,
                cfg.rms_eps,
            ),
        })
    }

    pub fn linears(&self) -> [&B::Linear; 5] {
        [&self.qkv, &self.z, &self.beta, &self.alpha, &self.out]
    }

    /// The layer's branch of `a.normed` into `a.branch`, through `state` (this layer's slots
    /// and the pass's slot per sequence).
    pub fn forward(
        &self,
        backend: &B,
        state: (usize, &mut [f32], &[u32]),
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        backend.linears(
            [&self.qkv, &self.z, &self.beta, &self.alpha],
            &a.normed,
            [&mut a.q, &mut a.gate, &mut a.k, &mut a.v],
            pass,
        )?;
        backend.gated_delta_net(
            &self.params,
            state,
            [&a.q, &a.gate, &a.k, &a.v],
            pass,
            &mut a.attn,
        )?;
        backend.linears([&self.out], &a.attn, [&mut a.branch], pass)
    }
}
