//! The gated delta rule (Gated DeltaNet) of Qwen3.5 and Qwen3-Next's linear-attention layers:
//! transformers' `torch_recurrent_gated_delta_rule` (step) and `torch_chunk_gated_delta_rule`
//! (prefill, chunks of [`GATED_DELTA_CHUNK`]).
//!
//! Per value head `h` (query/key head `h / (H_v / H_k)`), with `q̂ = s_q · q`, `k̂ = s_k · k`:
//!
//! ```text
//! S = exp(g) · S                    decay, g = log decay <= 0
//! delta = beta · (v - Sᵀ k̂)        the delta rule's correction, beta in (0, 1)
//! S = S + k̂ ⊗ delta
//! o = Sᵀ q̂
//! ```
//!
//! Normalization: with `qk_l2norm` (Qwen3.5 and Qwen3-Next call the torch functions with
//! `use_qk_l2norm_in_kernel=True`) the kernel L2-normalizes every query and key row as
//! transformers' `l2norm` does (`x · rsqrt(Σx² + 1e-6)`); always, it scales queries by
//! `1/sqrt(d_k)`, as both torch functions do. So the caller hands in q and k straight from
//! the convolution (after SiLU), v the same, and `g`, `beta` from [`gated_delta_gates`].
//!
//! Grouped heads: Qwen3.5 has fewer query/key heads than value heads (`linear_num_key_heads`
//! 16, `linear_num_value_heads` 32 in the 2B..27B configs); value head `h` reads query/key head
//! `h / (H_v / H_k)` (torch's `repeat_interleave`: consecutive value heads share one key head).
//!
//! Layouts: `q`, `k` `[T, H_k, d_k]`, `v` `[T, H_v, d_v]`, `g`, `beta` `[T, H_v]`, output
//! `[T, H_v, d_v]` (what `norm(core_attn_out, z)` reads), state `[H_v, d_k, d_v]` (transformers'
//! recurrent state without the batch dimension; zeros = no history).
//!
//! The step fuses the decay into two passes over each 64-column tile of `S`: pass 1 reads
//! `Sᵀk` and `Sᵀq` of the old state, pass 2 writes `exp(g)·S + k̂ ⊗ delta`; the output is
//! `exp(g)·s_q·Sᵀq + (k̂·q̂)·delta` (columns of `S` are independent in the delta rule:
//! `delta[c]` reads only column `c`).
//!
//! The prefill runs in blocks of [`GATED_DELTA_CHUNK`] tokens, heads in parallel within a
//! block, by one of two forms ([`PrefillForm`]):
//! - chunked (the default): the WY / UT-transform form of the torch function per chunk: two
//!   `L x L` products of the chunk's keys and queries (shared by a key head's value heads), a
//!   unit lower-triangular solve, and four products against the state (`gemm` crate), with
//!   pairwise decays from segment sums (no differences of long cumulative sums). Chunks of 32:
//!   on the CPU measured, 15-20% faster than torch's 64, whose `L x L` work grows with `L`.
//! - scan: the step's tile body token after token, on a contiguous copy of each column tile
//!   that stays in L1 for the block; bit-identical to the steps.
//!
//! Prompts shorter than [`STEP_PREFILL_BELOW`] tokens run the step. Scratch is per block
//! (`H_v · C · d_v` outputs and per-task `C x C` / `C x d` matrices), not per prompt.

use rayon::prelude::*;

use super::{
    check_len, chunk_decays, dims, ensure, exp, forward_substitute, per_isa, sigmoid, softplus,
    MulAdd, PrefillForm, TILE,
};
use crate::f32_gemm::{gemm_strided, View, ViewMut};
use crate::ops::dot_f32;
use crate::{Isa, KernelError};

/// Tokens per chunk (and block) of the prefill; the torch function's default is 64 (any
/// chunk length gives the same results up to rounding).
pub const GATED_DELTA_CHUNK: usize = 32;
const _: () = assert!(GATED_DELTA_CHUNK <= super::CHUNK_MAX);

/// Below this many tokens the prefill runs step by step (cheaper than setting up a chunk).
pub const STEP_PREFILL_BELOW: usize = 4;

/// transformers' `l2norm` epsilon.
const L2NORM_EPS: f32 = 1e-6;

/// State values per parallel task of a step (smaller heads are grouped).
const STEP_TASK_VALUES: usize = 1 << 16;

/// Head counts and dimensions of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatedDeltaShape {
    /// Query/key heads `H_k` (`linear_num_key_heads`).
    pub n_k_heads: usize,
    /// Value heads `H_v` (`linear_num_value_heads`), a multiple of `H_k`.
    pub n_v_heads: usize,
    /// `d_k` (`linear_key_head_dim`).
    pub d_k: usize,
    /// `d_v` (`linear_value_head_dim`).
    pub d_v: usize,
    /// L2-normalize q and k rows in the kernel (`use_qk_l2norm_in_kernel`).
    pub qk_l2norm: bool,
}

impl GatedDeltaShape {
    /// Values of one sequence's state: `H_v · d_k · d_v`.
    pub fn state_len(&self) -> usize {
        self.n_v_heads * self.d_k * self.d_v
    }

    fn check(&self) -> Result<(), KernelError> {
        ensure(
            self.n_k_heads > 0 && self.n_v_heads > 0 && self.d_k > 0 && self.d_v > 0,
            || format!("gated delta: empty shape {self:?}"),
        )?;
        ensure(self.n_v_heads % self.n_k_heads == 0, || {
            format!(
                "gated delta: {} value heads are not a multiple of {} key heads",
                self.n_v_heads, self.n_k_heads
            )
        })?;
        dims(&[self.n_v_heads, self.d_k, self.d_v]).map(|_| ())
    }

    fn group(&self) -> usize {
        self.n_v_heads / self.n_k_heads
    }
}

/// One call's per-token inputs (`T` tokens; one for a step).
#[derive(Debug, Clone, Copy)]
pub struct GatedDeltaInputs<'a> {
    /// `[T, H_k, d_k]`, not normalized.
    pub q: &'a [f32],
    /// `[T, H_k, d_k]`, not normalized.
    pub k: &'a [f32],
    /// `[T, H_v, d_v]`.
    pub v: &'a [f32],
    /// Log decay `[T, H_v]`, `<= 0`.
    pub g: &'a [f32],
    /// `[T, H_v]`, in (0, 1).
    pub beta: &'a [f32],
}

fn check_call(
    shape: &GatedDeltaShape,
    n_tokens: usize,
    x: &GatedDeltaInputs<'_>,
    state: &[f32],
    out: &[f32],
) -> Result<(), KernelError> {
    shape.check()?;
    let qk = dims(&[n_tokens, shape.n_k_heads, shape.d_k])?;
    let vo = dims(&[n_tokens, shape.n_v_heads, shape.d_v])?;
    let gates = dims(&[n_tokens, shape.n_v_heads])?;
    check_len("gated delta q [T, H_k, d_k]", x.q.len(), qk)?;
    check_len("gated delta k [T, H_k, d_k]", x.k.len(), qk)?;
    check_len("gated delta v [T, H_v, d_v]", x.v.len(), vo)?;
    check_len("gated delta g [T, H_v]", x.g.len(), gates)?;
    check_len("gated delta beta [T, H_v]", x.beta.len(), gates)?;
    check_len(
        "gated delta state [H_v, d_k, d_v]",
        state.len(),
        shape.state_len(),
    )?;
    check_len("gated delta out [T, H_v, d_v]", out.len(), vo)
}

/// The gates of `Qwen3_5GatedDeltaNet.forward`, per token and value head (`[T, H_v]` each):
/// `g = -exp(a_log) · softplus(a + dt_bias)`, `beta = sigmoid(b)`, where `a` and `b` are the
/// `in_proj_a` / `in_proj_b` outputs and `a_log`, `dt_bias` (`[H_v]`) the layer's `A_log` and
/// `dt_bias`.
pub fn gated_delta_gates(
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    g: &mut [f32],
    beta: &mut [f32],
) -> Result<(), KernelError> {
    let h = a_log.len();
    ensure(h > 0, || "gated delta gates: no heads".to_string())?;
    check_len("gated delta dt_bias [H_v]", dt_bias.len(), h)?;
    ensure(a.len() % h == 0, || {
        format!("gated delta a: {} values, not [T, {h}]", a.len())
    })?;
    check_len("gated delta b [T, H_v]", b.len(), a.len())?;
    check_len("gated delta g [T, H_v]", g.len(), a.len())?;
    check_len("gated delta beta [T, H_v]", beta.len(), a.len())?;
    for (t, (ga, gb)) in a.chunks_exact(h).zip(b.chunks_exact(h)).enumerate() {
        for j in 0..h {
            g[t * h + j] = -a_log[j].exp() * softplus(ga[j] + dt_bias[j]);
            beta[t * h + j] = sigmoid(gb[j]);
        }
    }
    Ok(())
}

/// `(s_q, s_k)`: the factors that make `q̂ = s_q q` (normalized, then scaled by `1/sqrt(d_k)`)
/// and `k̂ = s_k k`.
fn qk_factors(shape: &GatedDeltaShape, q: &[f32], k: &[f32]) -> (f32, f32) {
    let scale = 1.0 / (shape.d_k as f32).sqrt();
    if shape.qk_l2norm {
        let inv = |x: &[f32]| 1.0 / (dot_f32(x, x) + L2NORM_EPS).sqrt();
        (inv(q) * scale, inv(k))
    } else {
        (scale, 1.0)
    }
}

/// One decode step: inputs of one token (`T = 1`), `state` updated in place, `out` `[H_v, d_v]`.
pub fn gated_delta_step(
    shape: &GatedDeltaShape,
    x: &GatedDeltaInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_call(shape, 1, x, state, out)?;
    step_token(crate::best_isa(), shape, x, 0, state, out);
    Ok(())
}

/// Token `t` of `x` through every head.
fn step_token(
    isa: Isa,
    shape: &GatedDeltaShape,
    x: &GatedDeltaInputs<'_>,
    t: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    let (hk, hv, dk, dv) = (shape.n_k_heads, shape.n_v_heads, shape.d_k, shape.d_v);
    let group = shape.group();
    let per_task = (STEP_TASK_VALUES / (dk * dv)).max(1);
    state
        .par_chunks_mut(dk * dv)
        .zip(out.par_chunks_mut(dv))
        .enumerate()
        .with_min_len(per_task)
        .for_each(|(h, (s, o))| {
            let kh = h / group;
            let q = &x.q[(t * hk + kh) * dk..][..dk];
            let k = &x.k[(t * hk + kh) * dk..][..dk];
            let v = &x.v[(t * hv + h) * dv..][..dv];
            step_head(isa, s, q, k, v, step_coef(shape, x, t, h), o);
        });
}

/// Head `h`'s scalars for token `t`.
fn step_coef(shape: &GatedDeltaShape, x: &GatedDeltaInputs<'_>, t: usize, h: usize) -> StepCoef {
    let (dk, hv) = (shape.d_k, shape.n_v_heads);
    let at = (t * shape.n_k_heads + h / shape.group()) * dk;
    let (q, k) = (&x.q[at..at + dk], &x.k[at..at + dk]);
    let (sq, sk) = qk_factors(shape, q, k);
    StepCoef {
        decay: x.g[t * hv + h].exp(),
        beta: x.beta[t * hv + h],
        sq,
        sk,
        qk: dot_f32(q, k),
    }
}

/// A head's scalars for one step.
#[derive(Clone, Copy)]
pub(crate) struct StepCoef {
    decay: f32,
    beta: f32,
    sq: f32,
    sk: f32,
    /// `q · k` of the raw rows.
    qk: f32,
}

#[inline(always)]
fn step_head_body<M: MulAdd>(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    c: StepCoef,
    out: &mut [f32],
) {
    let dv = v.len();
    let mut c0 = 0;
    while c0 < dv {
        let w = TILE.min(dv - c0);
        let (s, v, o) = (&mut s[c0..], &v[c0..c0 + w], &mut out[c0..c0 + w]);
        if w == TILE {
            step_tile::<M>(s, dv, q, k, v, c, o, TILE);
        } else {
            step_tile::<M>(s, dv, q, k, v, c, o, w);
        }
        c0 += w;
    }
}

/// The step on a tile of `w <= TILE` columns of a head's state: row `i` of the tile at
/// `s[i * stride ..][..w]`, `v` and `out` the tile's columns. Inlined with `w` a constant for
/// full tiles, so the accumulators live in registers.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn step_tile<M: MulAdd>(
    s: &mut [f32],
    stride: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    c: StepCoef,
    out: &mut [f32],
    w: usize,
) {
    let (v, out) = (&v[..w], &mut out[..w]);
    let mut sk = [0.0f32; TILE];
    let mut sq = [0.0f32; TILE];
    for (i, (&ki, &qi)) in k.iter().zip(q).enumerate() {
        let row = &s[i * stride..i * stride + w];
        for l in 0..w {
            sk[l] = M::madd(row[l], ki, sk[l]);
            sq[l] = M::madd(row[l], qi, sq[l]);
        }
    }
    let mut delta = [0.0f32; TILE];
    let kv_scale = c.decay * c.sk;
    for l in 0..w {
        delta[l] = (v[l] - kv_scale * sk[l]) * c.beta;
    }
    for (i, &ki) in k.iter().enumerate() {
        let kr = ki * c.sk;
        let row = &mut s[i * stride..i * stride + w];
        for l in 0..w {
            row[l] = M::madd(kr, delta[l], row[l] * c.decay);
        }
    }
    let (out_s, out_d) = (c.decay * c.sq, c.qk * c.sk * c.sq);
    for l in 0..w {
        out[l] = M::madd(out_d, delta[l], out_s * sq[l]);
    }
}

per_isa! {
    /// One head's step (see the module doc).
    fn step_head => step_head_body(s: &mut [f32], q: &[f32], k: &[f32], v: &[f32], c: StepCoef,
        out: &mut [f32])
}

/// One value head's inputs over a prefill, for the scan.
pub(crate) struct HeadRows<'a> {
    /// Query and key rows of its key head: token `t` at `t * qk_stride + qk_off`.
    q: &'a [f32],
    k: &'a [f32],
    qk_stride: usize,
    qk_off: usize,
    /// Value rows: token `t` at `t * v_stride + v_off`.
    v: &'a [f32],
    v_stride: usize,
    v_off: usize,
    /// Per token.
    coefs: &'a [StepCoef],
}

/// The step body over every token of one head, one column tile at a time. Columns of `S` are
/// independent in the delta rule (`delta[c]` reads only column `c`), so this is exactly the
/// steps' arithmetic; the tile (`d_k x 64`, 32 KiB at `d_k = 128`) is copied to a contiguous
/// buffer first, where it stays in L1 across all tokens (in place, its rows 4 lines of every
/// 8 at a power-of-two stride, it would use half of L1's sets and spill).
#[inline(always)]
fn scan_head_body<M: MulAdd>(s: &mut [f32], r: &HeadRows<'_>, dk: usize, out: &mut [f32]) {
    let dv = s.len() / dk;
    let mut tile = vec![0.0f32; dk * TILE.min(dv)];
    let mut c0 = 0;
    while c0 < dv {
        let w = TILE.min(dv - c0);
        let tile = &mut tile[..dk * w];
        for (t_row, s_row) in tile.chunks_exact_mut(w).zip(s.chunks_exact(dv)) {
            t_row.copy_from_slice(&s_row[c0..c0 + w]);
        }
        for (t, (c, o)) in r.coefs.iter().zip(out.chunks_exact_mut(dv)).enumerate() {
            let qk = t * r.qk_stride + r.qk_off;
            let q = &r.q[qk..qk + dk];
            let k = &r.k[qk..qk + dk];
            let v = &r.v[t * r.v_stride + r.v_off + c0..][..w];
            let o = &mut o[c0..c0 + w];
            if w == TILE {
                step_tile::<M>(tile, TILE, q, k, v, *c, o, TILE);
            } else {
                step_tile::<M>(tile, w, q, k, v, *c, o, w);
            }
        }
        for (t_row, s_row) in tile.chunks_exact(w).zip(s.chunks_exact_mut(dv)) {
            s_row[c0..c0 + w].copy_from_slice(t_row);
        }
        c0 += w;
    }
}

per_isa! {
    /// One head's scan over a prefill.
    fn scan_head => scan_head_body(s: &mut [f32], r: &HeadRows<'_>, dk: usize, out: &mut [f32])
}

/// One block of the scan: value head `h` over the block's `l` tokens (`xb`), its outputs to
/// `out` `[l, d_v]`.
fn scan_block(
    isa: Isa,
    shape: &GatedDeltaShape,
    xb: &GatedDeltaInputs<'_>,
    h: usize,
    l: usize,
    s: &mut [f32],
    out: &mut [f32],
) {
    let (hk, hv, dk, dv) = (shape.n_k_heads, shape.n_v_heads, shape.d_k, shape.d_v);
    let coefs: Vec<StepCoef> = (0..l).map(|t| step_coef(shape, xb, t, h)).collect();
    let rows = HeadRows {
        q: xb.q,
        k: xb.k,
        qk_stride: hk * dk,
        qk_off: h / shape.group() * dk,
        v: xb.v,
        v_stride: hv * dv,
        v_off: h * dv,
        coefs: &coefs,
    };
    scan_head(isa, s, &rows, dk, out);
}

/// A prefill of `n_tokens`: `x` holds `T` tokens, `state` is updated in place, `out`
/// `[T, H_v, d_v]`. Runs [`PrefillForm::DEFAULT`].
pub fn gated_delta_prefill(
    shape: &GatedDeltaShape,
    n_tokens: usize,
    x: &GatedDeltaInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    gated_delta_prefill_form(PrefillForm::DEFAULT, shape, n_tokens, x, state, out)
}

/// [`gated_delta_prefill`] by the given form.
pub fn gated_delta_prefill_form(
    form: PrefillForm,
    shape: &GatedDeltaShape,
    n_tokens: usize,
    x: &GatedDeltaInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_call(shape, n_tokens, x, state, out)?;
    let isa = crate::best_isa();
    if n_tokens < STEP_PREFILL_BELOW {
        let row = shape.n_v_heads * shape.d_v;
        for (t, o) in out.chunks_exact_mut(row).enumerate() {
            step_token(isa, shape, x, t, state, o);
        }
        return Ok(());
    }
    blocks(isa, form, shape, n_tokens, x, state, out);
    Ok(())
}

impl<'a> GatedDeltaInputs<'a> {
    /// Tokens `a..b`.
    fn tokens(&self, shape: &GatedDeltaShape, a: usize, b: usize) -> GatedDeltaInputs<'a> {
        let qk = shape.n_k_heads * shape.d_k;
        let (v, h) = (shape.n_v_heads * shape.d_v, shape.n_v_heads);
        GatedDeltaInputs {
            q: &self.q[a * qk..b * qk],
            k: &self.k[a * qk..b * qk],
            v: &self.v[a * v..b * v],
            g: &self.g[a * h..b * h],
            beta: &self.beta[a * h..b * h],
        }
    }
}

/// The prefill in blocks of [`GATED_DELTA_CHUNK`] tokens: within a block, heads run in
/// parallel (the chunked form: one task per key head, whose value heads share the chunk's
/// `K Kᵀ` and `Q Kᵀ`; the scan: one per value head), each writing its rows of a block buffer
/// `[H_v, C, d_v]` that is then copied to `out`. Scratch is per block, not per prompt.
fn blocks(
    isa: Isa,
    form: PrefillForm,
    shape: &GatedDeltaShape,
    n_tokens: usize,
    x: &GatedDeltaInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) {
    const C: usize = GATED_DELTA_CHUNK;
    let (hv, dk, dv) = (shape.n_v_heads, shape.d_k, shape.d_v);
    let group = shape.group();
    let mut buf = vec![0.0f32; hv * C * dv];
    for t0 in (0..n_tokens).step_by(C) {
        let l = C.min(n_tokens - t0);
        let xb = x.tokens(shape, t0, t0 + l);
        match form {
            PrefillForm::Scan => state
                .par_chunks_mut(dk * dv)
                .zip(buf.par_chunks_mut(C * dv))
                .enumerate()
                .for_each(|(h, (s, o))| scan_block(isa, shape, &xb, h, l, s, &mut o[..l * dv])),
            PrefillForm::Chunked => state
                .par_chunks_mut(group * dk * dv)
                .zip(buf.par_chunks_mut(group * C * dv))
                .enumerate()
                .for_each_init(
                    || Scratch::new(dk, dv),
                    |sc, (kh, (s, o))| key_head_chunk(isa, shape, &xb, kh, l, sc, s, o),
                ),
        }
        for (i, row) in out[t0 * hv * dv..(t0 + l) * hv * dv]
            .chunks_exact_mut(hv * dv)
            .enumerate()
        {
            for (h, dst) in row.chunks_exact_mut(dv).enumerate() {
                dst.copy_from_slice(&buf[(h * C + i) * dv..][..dv]);
            }
        }
    }
}

/// Per-task scratch of the chunked prefill (`C` = chunk length).
struct Scratch {
    /// `[C, C]` `K̂ K̂ᵀ`.
    kk: Vec<f32>,
    /// `[C, C]` `Q̂ K̂ᵀ`.
    qk: Vec<f32>,
    /// `[C, C]` per-head work matrix (system, then intra-chunk attention).
    a: Vec<f32>,
    /// `[C, C]` decays from token j to token i: `exp(Σ_{j<s<=i} g_s)` (`j <= i`, else 0).
    decay: Vec<f32>,
    /// `[C]` `Σ_{s<=i} g_s`: the log decay from the chunk start to token i.
    cum: Vec<f32>,
    /// `[C, d_v]` `beta·v`, solved in place to the chunk's values `U`, then `U - W S`.
    u: Vec<f32>,
    /// `[C, d_k]` `beta·exp(cum)·k̂`, solved in place to `W`; later the decayed keys.
    w: Vec<f32>,
    /// `[C]` `s_q`, `s_k` of the chunk's rows.
    sq: Vec<f32>,
    sk: Vec<f32>,
}

impl Scratch {
    fn new(dk: usize, dv: usize) -> Self {
        const C: usize = GATED_DELTA_CHUNK;
        Scratch {
            kk: vec![0.0; C * C],
            qk: vec![0.0; C * C],
            a: vec![0.0; C * C],
            decay: vec![0.0; C * C],
            cum: vec![0.0; C],
            u: vec![0.0; C * dv],
            w: vec![0.0; C * dk],
            sq: vec![0.0; C],
            sk: vec![0.0; C],
        }
    }
}

/// One chunk (`xb`, `l` tokens) of key head `kh` and its value heads: `s` their states,
/// `out` their block rows `[group, C, d_v]`.
#[allow(clippy::too_many_arguments)]
fn key_head_chunk(
    isa: Isa,
    shape: &GatedDeltaShape,
    xb: &GatedDeltaInputs<'_>,
    kh: usize,
    l: usize,
    sc: &mut Scratch,
    s: &mut [f32],
    out: &mut [f32],
) {
    const C: usize = GATED_DELTA_CHUNK;
    let (hk, dk, dv) = (shape.n_k_heads, shape.d_k, shape.d_v);
    let stride = hk * dk;
    let qc = View::rows(&xb.q[kh * dk..], l, dk, stride);
    let kc = View::rows(&xb.k[kh * dk..], l, dk, stride);
    for i in 0..l {
        let r = i * stride + kh * dk;
        (sc.sq[i], sc.sk[i]) = qk_factors(shape, &xb.q[r..r + dk], &xb.k[r..r + dk]);
    }
    gemm_strided(ViewMut::rows(&mut sc.kk, l, l, l), None, kc, kc.t(), 1.0);
    gemm_strided(ViewMut::rows(&mut sc.qk, l, l, l), None, qc, kc.t(), 1.0);
    for i in 0..l {
        for j in 0..=i {
            sc.kk[i * l + j] *= sc.sk[i] * sc.sk[j];
            sc.qk[i * l + j] *= sc.sq[i] * sc.sk[j];
        }
    }
    for (hl, (sh, o)) in s
        .chunks_exact_mut(dk * dv)
        .zip(out.chunks_exact_mut(C * dv))
        .enumerate()
    {
        let h = kh * shape.group() + hl;
        chunk_head(isa, shape, xb, h, l, sc, sh, &mut o[..l * dv]);
    }
}

/// One value head `h` over one chunk (`xb`, `l` tokens): `out` `[l, d_v]` gets its outputs,
/// `s` its state after the chunk. `sc.kk`, `sc.qk`, `sc.sq`, `sc.sk` hold the key head's
/// chunk products.
#[allow(clippy::too_many_arguments)]
fn chunk_head(
    isa: Isa,
    shape: &GatedDeltaShape,
    x: &GatedDeltaInputs<'_>,
    h: usize,
    l: usize,
    sc: &mut Scratch,
    s: &mut [f32],
    out: &mut [f32],
) {
    let (hk, hv, dk, dv) = (shape.n_k_heads, shape.n_v_heads, shape.d_k, shape.d_v);
    let kh = h / shape.group();
    let g = |i: usize| x.g[i * hv + h];
    let beta = |i: usize| x.beta[i * hv + h];
    let k_row = |i: usize| &x.k[(i * hk + kh) * dk..][..dk];
    chunk_decays(g, l, &mut sc.decay, &mut sc.cum);
    let from_start = |sc: &Scratch, i: usize| exp(sc.cum[i]);
    // The system (I + A) X = RHS, A[i][j] = beta_i (k̂_i·k̂_j) decay[i][j], j < i.
    for i in 0..l {
        let bi = beta(i);
        for j in 0..i {
            sc.a[i * l + j] = bi * sc.kk[i * l + j] * sc.decay[i * l + j];
        }
    }
    for i in 0..l {
        let bi = beta(i);
        let v = &x.v[(i * hv + h) * dv..][..dv];
        for (u, &vv) in sc.u[i * dv..(i + 1) * dv].iter_mut().zip(v) {
            *u = bi * vv;
        }
        let f = bi * from_start(sc, i) * sc.sk[i];
        for (w, &kk) in sc.w[i * dk..(i + 1) * dk].iter_mut().zip(k_row(i)) {
            *w = f * kk;
        }
    }
    forward_substitute(isa, &sc.a[..l * l], &mut sc.u[..l * dv], l, dv);
    forward_substitute(isa, &sc.a[..l * l], &mut sc.w[..l * dk], l, dk);
    let state = View::rows(s, dk, dv, dv);
    // U - W S: the new values, corrected by what the state before the chunk predicts.
    gemm_strided(
        ViewMut::rows(&mut sc.u[..l * dv], l, dv, dv),
        Some(1.0),
        View::rows(&sc.w[..l * dk], l, dk, dk),
        state,
        -1.0,
    );
    // o = diag(s_q exp(cum)) Q S + (Q̂ K̂ᵀ ∘ decay, j <= i) (U - W S).
    let qc = View::rows(&x.q[kh * dk..], l, dk, hk * dk);
    gemm_strided(ViewMut::rows(out, l, dv, dv), None, qc, state, 1.0);
    for i in 0..l {
        let f = sc.sq[i] * from_start(sc, i);
        for o in &mut out[i * dv..(i + 1) * dv] {
            *o *= f;
        }
    }
    for ((a, &qk), &d) in sc.a[..l * l].iter_mut().zip(&sc.qk[..l * l]).zip(&sc.decay) {
        // decay is 0 above the diagonal.
        *a = qk * d;
    }
    gemm_strided(
        ViewMut::rows(out, l, dv, dv),
        Some(1.0),
        View::rows(&sc.a[..l * l], l, l, l),
        View::rows(&sc.u[..l * dv], l, dv, dv),
        1.0,
    );
    // S = exp(Σg) S + (diag(s_k decay[l-1][i]) K)ᵀ (U - W S).
    for i in 0..l {
        let f = sc.sk[i] * sc.decay[(l - 1) * l + i];
        for (w, &kk) in sc.w[i * dk..(i + 1) * dk].iter_mut().zip(k_row(i)) {
            *w = f * kk;
        }
    }
    let chunk_decay = from_start(sc, l - 1);
    gemm_strided(
        ViewMut::rows(s, dk, dv, dv),
        Some(chunk_decay),
        View::rows(&sc.w[..l * dk], l, dk, dk).t(),
        View::rows(&sc.u[..l * dv], l, dv, dv),
        1.0,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(shape: &GatedDeltaShape, t: usize, seed: f32) -> [Vec<f32>; 5] {
        let f = |n: usize, m: f32| -> Vec<f32> {
            (0..n)
                .map(|i| ((i as f32 + seed) * m).sin())
                .collect::<Vec<f32>>()
        };
        let q = f(t * shape.n_k_heads * shape.d_k, 0.37);
        let k = f(t * shape.n_k_heads * shape.d_k, 0.61);
        let v = f(t * shape.n_v_heads * shape.d_v, 0.29);
        let g: Vec<f32> = f(t * shape.n_v_heads, 0.17)
            .iter()
            .map(|x| -0.5 * (x + 1.0))
            .collect();
        let beta: Vec<f32> = f(t * shape.n_v_heads, 0.43)
            .iter()
            .map(|&x| sigmoid(x))
            .collect();
        [q, k, v, g, beta]
    }

    #[test]
    fn step_is_the_same_on_every_isa() {
        let shape = GatedDeltaShape {
            n_k_heads: 2,
            n_v_heads: 4,
            d_k: 24,
            d_v: 80,
            qk_l2norm: true,
        };
        let [q, k, v, g, beta] = inputs(&shape, 1, 0.5);
        let x = GatedDeltaInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let s0: Vec<f32> = (0..shape.state_len())
            .map(|i| (i as f32 * 0.01).cos())
            .collect();
        let mut want_s = s0.clone();
        let mut want_o = vec![0.0; 4 * 80];
        step_token(Isa::Scalar, &shape, &x, 0, &mut want_s, &mut want_o);
        for isa in crate::available_isas() {
            let mut s = s0.clone();
            let mut o = vec![0.0; 4 * 80];
            step_token(isa, &shape, &x, 0, &mut s, &mut o);
            for (a, b) in s.iter().zip(&want_s).chain(o.iter().zip(&want_o)) {
                assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "{isa}: {a} vs {b}");
            }
        }
    }
}
