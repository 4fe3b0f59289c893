//! Causal depthwise short convolution: each of `C` channels convolves its own last `K` inputs
//! with its own `K` taps (Qwen3.5 / Qwen3-Next: `K = 4`, SiLU after, no bias; Mamba-2 /
//! Nemotron-H / Granite 4: `K = 4`, SiLU, bias; LFM2's ShortConv: `K = 3`, no activation,
//! optional bias).
//!
//! `out[t][c] = act(bias[c] + Σ_{j<K} weight[c][j] · in[t - (K-1) + j][c])`, where inputs
//! before the first token of this call come from the state. This is transformers'
//! `causal_conv1d_fn` (prefill from a zero state) and `causal_conv1d_update` (from a cached
//! state), i.e. `F.conv1d(..., groups=C, padding=K-1)` cut to the causal part.
//!
//! Layouts: `weight` `[C, K]` as checkpoints store it (torch's `[C, 1, K]`; GGUF's
//! `ssm_conv1d` / `shortconv.conv` rows), `bias` `[C]`, inputs and outputs `[T, C]`,
//! `state` `[K - 1, C]`: the last `K - 1` inputs, oldest first, token-major like the input
//! (transformers' cache keeps `[C, K]`, one dead oldest column more; a zero state is the start
//! of a sequence).
//!
//! Invariant: step and prefill run the same per-token body in the same order, so a prefill
//! equals the steps bit for bit on one ISA.

use rayon::prelude::*;

use super::{check_len, dims, ensure, per_isa, MulAdd};
use crate::KernelError;

/// What follows the convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvActivation {
    /// Nothing (LFM2).
    Identity,
    /// `x · sigmoid(x)` (Qwen3.5, Mamba-2: `hidden_act = "silu"`).
    Silu,
}

/// A layer's convolution weights.
#[derive(Debug, Clone, Copy)]
pub struct ConvWeights<'a> {
    /// `[channels, width]`.
    pub weight: &'a [f32],
    /// `[channels]`, or none.
    pub bias: Option<&'a [f32]>,
    /// `C` (at least 1).
    pub channels: usize,
    /// `K` (taps per channel, at least 1).
    pub width: usize,
}

impl ConvWeights<'_> {
    /// Values of one sequence's state: `(K - 1) · C`.
    pub fn state_len(&self) -> usize {
        self.width.saturating_sub(1) * self.channels
    }

    fn check(&self) -> Result<(), KernelError> {
        ensure(self.width >= 1 && self.channels >= 1, || {
            format!("conv1d: {} channels of width {}", self.channels, self.width)
        })?;
        check_len(
            "conv1d weight [C, K]",
            self.weight.len(),
            dims(&[self.channels, self.width])?,
        )?;
        if let Some(bias) = self.bias {
            check_len("conv1d bias [C]", bias.len(), self.channels)?;
        }
        Ok(())
    }
}

/// Tokens per parallel task of a prefill.
const TOKENS_PER_TASK: usize = 16;

/// One decode step: `x` `[C]` → `out` `[C]`; `state` `[K-1, C]` drops its oldest row and
/// appends `x`.
pub fn conv1d_causal_step(
    w: &ConvWeights<'_>,
    activation: ConvActivation,
    x: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    w.check()?;
    let c = w.channels;
    check_len("conv1d x [C]", x.len(), c)?;
    check_len("conv1d out [C]", out.len(), c)?;
    check_len("conv1d state [K-1, C]", state.len(), w.state_len())?;
    conv_tokens(crate::best_isa(), w, activation, state, x, 0, out);
    if !state.is_empty() {
        state.copy_within(c.., 0);
        let last = state.len() - c;
        state[last..].copy_from_slice(x);
    }
    Ok(())
}

/// A prefill of `n_tokens`: `x` `[T, C]` → `out` `[T, C]`; `state` `[K-1, C]` becomes the last
/// `K - 1` inputs of the history plus `x`.
pub fn conv1d_causal_prefill(
    w: &ConvWeights<'_>,
    activation: ConvActivation,
    n_tokens: usize,
    x: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    w.check()?;
    let c = w.channels;
    let n = dims(&[n_tokens, c])?;
    check_len("conv1d x [T, C]", x.len(), n)?;
    check_len("conv1d out [T, C]", out.len(), n)?;
    check_len("conv1d state [K-1, C]", state.len(), w.state_len())?;
    if n == 0 {
        return Ok(());
    }
    let isa = crate::best_isa();
    {
        let state: &[f32] = state;
        out.par_chunks_mut(TOKENS_PER_TASK * c)
            .enumerate()
            .for_each(|(i, o)| conv_tokens(isa, w, activation, state, x, i * TOKENS_PER_TASK, o));
    }
    // The new state: the last K-1 rows of [state; x].
    let keep = w.width - 1;
    if n_tokens >= keep {
        state.copy_from_slice(&x[(n_tokens - keep) * c..]);
    } else {
        state.copy_within(n_tokens * c.., 0);
        let from = (keep - n_tokens) * c;
        state[from..].copy_from_slice(x);
    }
    Ok(())
}

/// Outputs of tokens `t0 ..` (as many as `out` holds rows) of `x`, the history before `x`
/// being `state`.
fn conv_tokens(
    isa: crate::Isa,
    w: &ConvWeights<'_>,
    activation: ConvActivation,
    state: &[f32],
    x: &[f32],
    t0: usize,
    out: &mut [f32],
) {
    let silu = activation == ConvActivation::Silu;
    match w.width {
        2 => conv_k2(isa, w.weight, w.bias, silu, state, x, t0, out),
        3 => conv_k3(isa, w.weight, w.bias, silu, state, x, t0, out),
        4 => conv_k4(isa, w.weight, w.bias, silu, state, x, t0, out),
        _ => conv_any(isa, w.weight, w.bias, w.width, silu, state, x, t0, out),
    }
}

/// Row `r` of `[state; x]` (the extended input: `K - 1` history rows, then `x`).
#[inline(always)]
fn ext_row<'a>(state: &'a [f32], x: &'a [f32], keep: usize, c: usize, r: usize) -> &'a [f32] {
    if r < keep {
        &state[r * c..(r + 1) * c]
    } else {
        &x[(r - keep) * c..(r - keep + 1) * c]
    }
}

/// The body for a width known at compile time: channels vectorize, taps unroll.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_fixed<M: MulAdd, const K: usize>(
    weight: &[f32],
    bias: Option<&[f32]>,
    silu: bool,
    state: &[f32],
    x: &[f32],
    t0: usize,
    out: &mut [f32],
) {
    let c = weight.len() / K;
    let weight = &weight[..c * K];
    let bias = bias.map(|b| &b[..c]);
    for (i, o) in out.chunks_exact_mut(c).enumerate() {
        let t = t0 + i;
        // Rows sliced to `c` and taps walked by `chunks_exact(K)`: the compiler proves the
        // bounds, deinterleaves the taps (`vpermt2ps`) and vectorizes over channels.
        let rows: [&[f32]; K] = std::array::from_fn(|j| &ext_row(state, x, K - 1, c, t + j)[..c]);
        for (ch, (v, wc)) in o.iter_mut().zip(weight.chunks_exact(K)).enumerate() {
            let mut acc = bias.map_or(0.0, |b| b[ch]);
            for j in 0..K {
                acc = M::madd(wc[j], rows[j][ch], acc);
            }
            *v = acc;
        }
        if silu {
            super::silu_inplace(o);
        }
    }
}

/// The body for any width.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_any_body<M: MulAdd>(
    weight: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    silu: bool,
    state: &[f32],
    x: &[f32],
    t0: usize,
    out: &mut [f32],
) {
    let c = weight.len() / k;
    for (i, o) in out.chunks_exact_mut(c).enumerate() {
        let t = t0 + i;
        match bias {
            Some(b) => o.copy_from_slice(b),
            None => o.fill(0.0),
        }
        for j in 0..k {
            let row = ext_row(state, x, k - 1, c, t + j);
            for (ch, (v, &r)) in o.iter_mut().zip(row).enumerate() {
                *v = M::madd(weight[ch * k + j], r, *v);
            }
        }
        if silu {
            super::silu_inplace(o);
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_k2_body<M: MulAdd>(
    weight: &[f32],
    bias: Option<&[f32]>,
    silu: bool,
    state: &[f32],
    x: &[f32],
    t0: usize,
    out: &mut [f32],
) {
    conv_fixed::<M, 2>(weight, bias, silu, state, x, t0, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_k3_body<M: MulAdd>(
    weight: &[f32],
    bias: Option<&[f32]>,
    silu: bool,
    state: &[f32],
    x: &[f32],
    t0: usize,
    out: &mut [f32],
) {
    conv_fixed::<M, 3>(weight, bias, silu, state, x, t0, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn conv_k4_body<M: MulAdd>(
    weight: &[f32],
    bias: Option<&[f32]>,
    silu: bool,
    state: &[f32],
    x: &[f32],
    t0: usize,
    out: &mut [f32],
) {
    conv_fixed::<M, 4>(weight, bias, silu, state, x, t0, out)
}

per_isa! {
    fn conv_k2 => conv_k2_body(weight: &[f32], bias: Option<&[f32]>, silu: bool, state: &[f32],
        x: &[f32], t0: usize, out: &mut [f32])
}
per_isa! {
    fn conv_k3 => conv_k3_body(weight: &[f32], bias: Option<&[f32]>, silu: bool, state: &[f32],
        x: &[f32], t0: usize, out: &mut [f32])
}
per_isa! {
    fn conv_k4 => conv_k4_body(weight: &[f32], bias: Option<&[f32]>, silu: bool, state: &[f32],
        x: &[f32], t0: usize, out: &mut [f32])
}
per_isa! {
    fn conv_any => conv_any_body(weight: &[f32], bias: Option<&[f32]>, k: usize, silu: bool,
        state: &[f32], x: &[f32], t0: usize, out: &mut [f32])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, one output at a time.
    fn naive(w: &ConvWeights<'_>, silu: bool, state: &[f32], x: &[f32]) -> Vec<f32> {
        let (c, k) = (w.channels, w.width);
        let ext: Vec<f32> = state.iter().chain(x).copied().collect();
        let t = x.len() / c;
        let mut out = vec![0.0; t * c];
        for i in 0..t {
            for ch in 0..c {
                let mut acc = w.bias.map_or(0.0, |b| b[ch]);
                for j in 0..k {
                    acc += w.weight[ch * k + j] * ext[(i + j) * c + ch];
                }
                out[i * c + ch] = if silu {
                    acc / (1.0 + (-acc).exp())
                } else {
                    acc
                };
            }
        }
        out
    }

    #[test]
    fn every_width_and_isa_matches_the_definition() {
        let c = 37;
        for k in 1..=6 {
            let weight: Vec<f32> = (0..c * k).map(|i| (i as f32 * 0.31).sin()).collect();
            let bias: Vec<f32> = (0..c).map(|i| (i as f32 * 0.7).cos()).collect();
            let w = ConvWeights {
                weight: &weight,
                bias: Some(&bias),
                channels: c,
                width: k,
            };
            let state: Vec<f32> = (0..w.state_len()).map(|i| (i as f32 * 0.9).cos()).collect();
            let t = 5;
            let x: Vec<f32> = (0..t * c).map(|i| (i as f32 * 0.23).sin()).collect();
            let want = naive(&w, true, &state, &x);
            for isa in crate::available_isas() {
                let mut out = vec![0.0; t * c];
                conv_tokens(isa, &w, ConvActivation::Silu, &state, &x, 0, &mut out);
                let mut any = vec![0.0; t * c];
                conv_any(isa, &weight, Some(&bias), k, true, &state, &x, 0, &mut any);
                for (g, e) in out.iter().chain(&any).zip(want.iter().cycle()) {
                    assert!((g - e).abs() < 1e-5, "k {k} {isa}: {g} vs {e}");
                }
            }
        }
    }
}
