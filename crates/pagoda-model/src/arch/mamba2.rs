//! Mamba-2, the token mixer of Granite 4.0-H's recurrent layers (transformers'
//! `GraniteMoeHybridMambaLayer`, llama.cpp's `build_mamba2_layer`). Per row of a sequence:
//!
//! ```text
//! z, xBC, dt = split(in_proj(x))                 [d_inner, conv_dim, n_heads]
//! x, B, C    = split(silu(conv(xBC) + bias))     causal depthwise convolution, `taps` taps
//! y          = ssd(x, softplus(dt + dt_bias) clamped to dt_limit, A, B, C) + D · x
//! out        = out_proj(rmsnorm_per_group(y · silu(z)) · w)
//! ```
//!
//! The convolution and the scan are pagoda-kernels' `recurrent::conv1d_causal_prefill` and
//! `recurrent::ssd_prefill` (tested against transformers' torch functions), the time steps
//! `recurrent::ssd_dt`. The gate multiplies before the norm, and the norm takes each of the
//! `n_groups` groups of `d_inner / n_groups` values on its own (llama.cpp's reshape of
//! `ssm_norm` to `[n_groups, d_inner / n_groups]`, transformers' gated RMSNorm).
//!
//! Weights (canonical names; `family::granite_hybrid` renames HF's): `blk.N.ssm_in.weight`
//! `[in_proj_dim, hidden]`, `blk.N.ssm_conv1d.weight` `[conv_dim, taps]` and its optional
//! `.bias`, `blk.N.ssm_dt.bias`, `blk.N.ssm_a_log` (HF's `A_log`) or `blk.N.ssm_a` (GGUF's
//! `-exp(A_log)`), `blk.N.ssm_d` (optional), `blk.N.ssm_norm.weight` `[d_inner]`,
//! `blk.N.ssm_out.weight`.
//!
//! The layer's small parameters, its state layout and the CPU kernel are
//! [`super::mamba2_host`]'s; this module holds the two projections and drives the pass.

use super::backend::{Activations, Backend};
use super::mamba2_host::Mamba2Params;
use crate::config::Mamba2Config;
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};

/// One layer's Mamba-2 mixer on a backend.
#[derive(Debug)]
pub struct Mamba2<B: Backend> {
    in_proj: B::Linear,
    out_proj: B::Linear,
    params: Mamba2Params,
}

impl<B: Backend> Mamba2<B> {
    /// Layer `i`'s weights.
    pub fn load(
        backend: &B,
        weights: &Weights,
        i: usize,
        cfg: &ModelConfig,
        shape: Mamba2Config,
        taps: usize,
    ) -> Result<Self, ModelError> {
        let params = Mamba2Params::load(weights, i, cfg, shape, taps)?;
        let name = |t: &str| format!("blk.{i}.{t}");
        let linear = |t: &str, rows: usize, cols: usize| {
            let bias = name(&format!("{t}.bias"));
            backend.load_linear(
                weights,
                &name(&format!("{t}.weight")),
                Some(&bias),
                rows,
                cols,
            )
        };
        Ok(Mamba2 {
            in_proj: linear("ssm_in", shape.in_proj_dim(), cfg.hidden_size)?,
            out_proj: linear("ssm_out", cfg.hidden_size, shape.inner_dim())?,
            params,
        })
    }

    pub fn linears(&self) -> [&B::Linear; 2] {
        [&self.in_proj, &self.out_proj]
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
        backend.linears([&self.in_proj], &a.normed, [&mut a.q], pass)?;
        backend.mamba2(&self.params, state, &a.q, pass, &mut a.attn)?;
        backend.linears([&self.out_proj], &a.attn, [&mut a.branch], pass)
    }
}
