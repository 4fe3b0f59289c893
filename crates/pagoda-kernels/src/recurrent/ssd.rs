//! The Mamba-2 selective scan (SSD) of Mamba-2, Nemotron-H and Granite 4 (GraniteMoeHybrid):
//! transformers' `mamba2_selective_state_update` (step) and `mamba2_chunk_scan` (prefill; the
//! three models' copies are the same code).
//!
//! Per head `h` (B/C group `h / (H / G)`, torch's `repeat_interleave`), per token:
//!
//! ```text
//! S = exp(dt · A) · S + dt · x ⊗ B        S: [head_dim, state_dim], x: [head_dim], B: [state_dim]
//! y = S · C + D · x
//! ```
//!
//! `dt` is the processed time step `clamp(softplus(dt_raw + dt_bias), dt_limit)`, made by
//! [`ssd_dt`] from the `in_proj` output (the torch functions do it inside, from
//! `dt_softplus=True` and the layer's `dt_bias`; the chunk scan clamps to `time_step_limit`,
//! the step does not, which is the same for the default `(0, inf)` every listed config uses).
//! `A = -exp(A_log)` per head (negative), `D` per head (optional). The gate `z` and the gated
//! RMSNorm after the scan are not part of this kernel.
//!
//! Layouts: `x` `[T, H, P]` (`P` = head_dim), `dt` `[T, H]`, `B`, `C` `[T, G, N]`
//! (`N` = state_dim), output `[T, H, P]`, state `[H, P, N]` (transformers' `ssm_states`
//! without the batch dimension; zeros = no history).
//!
//! The step is one pass per state row (update and dot product together, two accumulator
//! vectors and a tree sum). The prefill runs in blocks of [`SSD_CHUNK`] tokens, heads in
//! parallel within a block, by one of two forms ([`PrefillForm`]):
//! - chunked (the default): the SSD chunk form of `mamba2_chunk_scan`: `C Bᵀ` once per group
//!   and chunk (shared by the group's heads), then per head three products (`M x`, `C Sᵀ`,
//!   `xᵀ B`, `gemm` crate), with decays from segment sums like torch's `segment_sum`;
//! - scan: the step body token after token per head, its state (`P x N`, 32 KiB for
//!   Nemotron-H's 64 x 128) in L1 for the block; bit-identical to the steps.
//!
//! Prompts shorter than [`STEP_PREFILL_BELOW`] tokens run the step. Scratch is per block, not
//! per prompt.

use rayon::prelude::*;

use super::{check_len, chunk_decays, dims, ensure, exp, per_isa, softplus, MulAdd, PrefillForm};
use crate::f32_gemm::{gemm_strided, View, ViewMut};
use crate::{Isa, KernelError};

/// Tokens per chunk (and block) of the prefill (any chunk length gives the same results up to
/// rounding; 32 measured no faster here).
pub const SSD_CHUNK: usize = 64;
const _: () = assert!(SSD_CHUNK <= super::CHUNK_MAX);

/// Below this many tokens the prefill runs step by step.
pub const STEP_PREFILL_BELOW: usize = 4;

/// State values per parallel task of a step (smaller heads are grouped).
const STEP_TASK_VALUES: usize = 1 << 16;

/// Head counts and dimensions of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsdShape {
    /// `H` (`num_heads` / `mamba_num_heads`).
    pub n_heads: usize,
    /// `P` (`head_dim` / `mamba_head_dim`).
    pub head_dim: usize,
    /// `N` (`state_size` / `ssm_state_size`).
    pub state_dim: usize,
    /// `G` (`n_groups`), dividing `H`.
    pub n_groups: usize,
}

impl SsdShape {
    /// Values of one sequence's state: `H · P · N`.
    pub fn state_len(&self) -> usize {
        self.n_heads * self.head_dim * self.state_dim
    }

    fn check(&self) -> Result<(), KernelError> {
        ensure(
            self.n_heads > 0 && self.n_groups > 0 && self.head_dim > 0 && self.state_dim > 0,
            || format!("ssd: empty shape {self:?}"),
        )?;
        ensure(self.n_heads % self.n_groups == 0, || {
            format!(
                "ssd: {} heads are not a multiple of {} groups",
                self.n_heads, self.n_groups
            )
        })?;
        dims(&[self.n_heads, self.head_dim, self.state_dim]).map(|_| ())
    }

    fn heads_per_group(&self) -> usize {
        self.n_heads / self.n_groups
    }
}

/// A layer's per-head parameters.
#[derive(Debug, Clone, Copy)]
pub struct SsdParams<'a> {
    /// `A = -exp(A_log)`, `[H]`.
    pub a: &'a [f32],
    /// The skip `D`, `[H]`, or none.
    pub d: Option<&'a [f32]>,
}

/// One call's per-token inputs (`T` tokens; one for a step).
#[derive(Debug, Clone, Copy)]
pub struct SsdInputs<'a> {
    /// `[T, H, P]` (after the convolution).
    pub x: &'a [f32],
    /// Processed time steps `[T, H]` ([`ssd_dt`]).
    pub dt: &'a [f32],
    /// `[T, G, N]`.
    pub b: &'a [f32],
    /// `[T, G, N]`.
    pub c: &'a [f32],
}

fn check_call(
    shape: &SsdShape,
    p: &SsdParams<'_>,
    n_tokens: usize,
    x: &SsdInputs<'_>,
    state: &[f32],
    out: &[f32],
) -> Result<(), KernelError> {
    shape.check()?;
    let xo = dims(&[n_tokens, shape.n_heads, shape.head_dim])?;
    let bc = dims(&[n_tokens, shape.n_groups, shape.state_dim])?;
    check_len("ssd A [H]", p.a.len(), shape.n_heads)?;
    if let Some(d) = p.d {
        check_len("ssd D [H]", d.len(), shape.n_heads)?;
    }
    check_len("ssd x [T, H, P]", x.x.len(), xo)?;
    check_len(
        "ssd dt [T, H]",
        x.dt.len(),
        dims(&[n_tokens, shape.n_heads])?,
    )?;
    check_len("ssd B [T, G, N]", x.b.len(), bc)?;
    check_len("ssd C [T, G, N]", x.c.len(), bc)?;
    check_len("ssd state [H, P, N]", state.len(), shape.state_len())?;
    check_len("ssd out [T, H, P]", out.len(), xo)
}

/// The processed time steps, in place over `dt` (`[T, H]`, the `in_proj` output):
/// `clamp(softplus(dt + dt_bias[h]), lo, hi)` with `(lo, hi)` the layer's `time_step_limit`
/// (`(0.0, f32::INFINITY)` by default).
pub fn ssd_dt(dt: &mut [f32], dt_bias: &[f32], limit: (f32, f32)) -> Result<(), KernelError> {
    let h = dt_bias.len();
    ensure(h > 0, || "ssd dt: no heads".to_string())?;
    ensure(dt.len() % h == 0, || {
        format!("ssd dt: {} values, not [T, {h}]", dt.len())
    })?;
    ensure(limit.0 <= limit.1, || format!("ssd dt: limit {limit:?}"))?;
    for row in dt.chunks_exact_mut(h) {
        for (v, &b) in row.iter_mut().zip(dt_bias) {
            *v = softplus(*v + b).clamp(limit.0, limit.1);
        }
    }
    Ok(())
}

/// One decode step: inputs of one token, `state` updated in place, `out` `[H, P]`.
pub fn ssd_step(
    shape: &SsdShape,
    p: &SsdParams<'_>,
    x: &SsdInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_call(shape, p, 1, x, state, out)?;
    step_token(crate::best_isa(), shape, p, x, 0, state, out);
    Ok(())
}

fn step_token(
    isa: Isa,
    shape: &SsdShape,
    p: &SsdParams<'_>,
    x: &SsdInputs<'_>,
    t: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    let (h_n, pd, n, g_n) = (
        shape.n_heads,
        shape.head_dim,
        shape.state_dim,
        shape.n_groups,
    );
    let hpg = shape.heads_per_group();
    let per_task = (STEP_TASK_VALUES / (pd * n)).max(1);
    state
        .par_chunks_mut(pd * n)
        .zip(out.par_chunks_mut(pd))
        .enumerate()
        .with_min_len(per_task)
        .for_each(|(h, (s, o))| {
            let g = h / hpg;
            let dt = x.dt[t * h_n + h];
            step_head(
                isa,
                s,
                &x.x[(t * h_n + h) * pd..][..pd],
                &x.b[(t * g_n + g) * n..][..n],
                &x.c[(t * g_n + g) * n..][..n],
                dt,
                (dt * p.a[h]).exp(),
                p.d.map_or(0.0, |d| d[h]),
                o,
            );
        });
}

/// Lanes of the dot-product accumulators (one AVX-512 vector, two AVX2 ones).
const LANES: usize = 16;

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn step_head_body<M: MulAdd>(
    s: &mut [f32],
    x: &[f32],
    b: &[f32],
    c: &[f32],
    dt: f32,
    decay: f32,
    d: f32,
    out: &mut [f32],
) {
    let n = b.len();
    let (b, c) = (&b[..n], &c[..n]);
    for (p, (row, o)) in s.chunks_exact_mut(n).zip(out.iter_mut()).enumerate() {
        let y = update_row::<M>(row, b, c, dt * x[p], decay);
        *o = M::madd(d, x[p], y);
    }
}

/// `row = decay · row + xdt · b`, then `row · c`. Two accumulator vectors over 32-wide
/// steps (two independent FMA chains), then a 16-wide step, a scalar tail and a tree sum:
/// a sequential sum of the lanes would cost more than the row.
#[inline(always)]
fn update_row<M: MulAdd>(row: &mut [f32], b: &[f32], c: &[f32], xdt: f32, decay: f32) -> f32 {
    const W: usize = 2 * LANES;
    let n = row.len();
    let (b, c) = (&b[..n], &c[..n]);
    let mut acc = [0.0f32; W];
    let mut k = 0;
    while k + W <= n {
        let r = &mut row[k..k + W];
        let (bb, cc) = (&b[k..k + W], &c[k..k + W]);
        for l in 0..W {
            r[l] = M::madd(xdt, bb[l], r[l] * decay);
            acc[l] = M::madd(r[l], cc[l], acc[l]);
        }
        k += W;
    }
    if k + LANES <= n {
        let r = &mut row[k..k + LANES];
        let (bb, cc) = (&b[k..k + LANES], &c[k..k + LANES]);
        for l in 0..LANES {
            r[l] = M::madd(xdt, bb[l], r[l] * decay);
            acc[l] = M::madd(r[l], cc[l], acc[l]);
        }
        k += LANES;
    }
    let mut tail = 0.0f32;
    for i in k..n {
        row[i] = M::madd(xdt, b[i], row[i] * decay);
        tail = M::madd(row[i], c[i], tail);
    }
    tree_sum(&mut acc) + tail
}

/// Pairwise sum of 32 lanes (halving, so the compiler adds whole vector halves).
#[inline(always)]
fn tree_sum(a: &mut [f32; 2 * LANES]) -> f32 {
    let mut w = a.len() / 2;
    while w > 0 {
        for l in 0..w {
            a[l] += a[l + w];
        }
        w /= 2;
    }
    a[0]
}

per_isa! {
    /// One head's step.
    fn step_head => step_head_body(s: &mut [f32], x: &[f32], b: &[f32], c: &[f32], dt: f32,
        decay: f32, d: f32, out: &mut [f32])
}

/// A prefill of `n_tokens`: `x` holds `T` tokens, `state` is updated in place, `out`
/// `[T, H, P]`. Runs [`PrefillForm::DEFAULT`].
pub fn ssd_prefill(
    shape: &SsdShape,
    p: &SsdParams<'_>,
    n_tokens: usize,
    x: &SsdInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    ssd_prefill_form(PrefillForm::DEFAULT, shape, p, n_tokens, x, state, out)
}

/// [`ssd_prefill`] by the given form.
pub fn ssd_prefill_form(
    form: PrefillForm,
    shape: &SsdShape,
    p: &SsdParams<'_>,
    n_tokens: usize,
    x: &SsdInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_call(shape, p, n_tokens, x, state, out)?;
    let isa = crate::best_isa();
    if n_tokens < STEP_PREFILL_BELOW {
        let row = shape.n_heads * shape.head_dim;
        for (t, o) in out.chunks_exact_mut(row).enumerate() {
            step_token(isa, shape, p, x, t, state, o);
        }
        return Ok(());
    }
    blocks(isa, form, shape, p, n_tokens, x, state, out);
    Ok(())
}

/// One head's inputs over a prefill, for the scan: token `t`'s `x` at `t * x_stride + x_off`,
/// `B`/`C` at `t * bc_stride + bc_off`, `dt` at `t * dt_stride + dt_off`.
pub(crate) struct HeadRows<'a> {
    /// `P` and `N`.
    head_dim: usize,
    state_dim: usize,
    x: &'a [f32],
    x_stride: usize,
    x_off: usize,
    b: &'a [f32],
    c: &'a [f32],
    bc_stride: usize,
    bc_off: usize,
    dt: &'a [f32],
    dt_stride: usize,
    dt_off: usize,
    a: f32,
    d: f32,
}

/// The step body over every token of one head; the head's state (`P x N`, 32 KiB for
/// Nemotron-H's 64 x 128) stays in L1 across the tokens.
#[inline(always)]
fn scan_head_body<M: MulAdd>(s: &mut [f32], r: &HeadRows<'_>, out: &mut [f32]) {
    let (p, n) = (r.head_dim, r.state_dim);
    for (t, o) in out.chunks_exact_mut(p).enumerate() {
        let dt = r.dt[t * r.dt_stride + r.dt_off];
        let bc = t * r.bc_stride + r.bc_off;
        step_head_body::<M>(
            s,
            &r.x[t * r.x_stride + r.x_off..][..p],
            &r.b[bc..bc + n],
            &r.c[bc..bc + n],
            dt,
            (dt * r.a).exp(),
            r.d,
            o,
        );
    }
}

per_isa! {
    /// One head's scan over a prefill.
    fn scan_head => scan_head_body(s: &mut [f32], r: &HeadRows<'_>, out: &mut [f32])
}

impl<'a> SsdInputs<'a> {
    /// Tokens `a..b`.
    fn tokens(&self, shape: &SsdShape, a: usize, b: usize) -> SsdInputs<'a> {
        let xr = shape.n_heads * shape.head_dim;
        let (h, bc) = (shape.n_heads, shape.n_groups * shape.state_dim);
        SsdInputs {
            x: &self.x[a * xr..b * xr],
            dt: &self.dt[a * h..b * h],
            b: &self.b[a * bc..b * bc],
            c: &self.c[a * bc..b * bc],
        }
    }
}

/// The prefill in blocks of [`SSD_CHUNK`] tokens: within a block, the chunked form first
/// makes `C Bᵀ` per group (in parallel), then heads run in parallel, each writing its rows of
/// a block buffer `[H, C, P]` that is then copied to `out`. Scratch is per block, not per
/// prompt.
#[allow(clippy::too_many_arguments)]
fn blocks(
    isa: Isa,
    form: PrefillForm,
    shape: &SsdShape,
    p: &SsdParams<'_>,
    n_tokens: usize,
    x: &SsdInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) {
    const C: usize = SSD_CHUNK;
    let (h_n, pd, n, g_n) = (
        shape.n_heads,
        shape.head_dim,
        shape.state_dim,
        shape.n_groups,
    );
    let hpg = shape.heads_per_group();
    let mut buf = vec![0.0f32; h_n * C * pd];
    let mut cb = match form {
        PrefillForm::Chunked => vec![0.0f32; g_n * C * C],
        PrefillForm::Scan => Vec::new(),
    };
    for t0 in (0..n_tokens).step_by(C) {
        let l = C.min(n_tokens - t0);
        let xb = x.tokens(shape, t0, t0 + l);
        match form {
            PrefillForm::Scan => state
                .par_chunks_mut(pd * n)
                .zip(buf.par_chunks_mut(C * pd))
                .enumerate()
                .for_each(|(h, (s, o))| {
                    let rows = HeadRows {
                        head_dim: pd,
                        state_dim: n,
                        x: xb.x,
                        x_stride: h_n * pd,
                        x_off: h * pd,
                        b: xb.b,
                        c: xb.c,
                        bc_stride: g_n * n,
                        bc_off: h / hpg * n,
                        dt: xb.dt,
                        dt_stride: h_n,
                        dt_off: h,
                        a: p.a[h],
                        d: p.d.map_or(0.0, |d| d[h]),
                    };
                    scan_head(isa, s, &rows, &mut o[..l * pd]);
                }),
            PrefillForm::Chunked => {
                cb.par_chunks_mut(C * C).enumerate().for_each(|(g, m)| {
                    gemm_strided(
                        ViewMut::rows(&mut m[..l * l], l, l, l),
                        None,
                        View::rows(&xb.c[g * n..], l, n, g_n * n),
                        View::rows(&xb.b[g * n..], l, n, g_n * n).t(),
                        1.0,
                    );
                });
                let cb = &cb;
                state
                    .par_chunks_mut(pd * n)
                    .zip(buf.par_chunks_mut(C * pd))
                    .enumerate()
                    .for_each_init(
                        || Scratch::new(pd, n),
                        |sc, (h, (s, o))| {
                            let cb = &cb[h / hpg * C * C..][..l * l];
                            chunk_head(shape, p, &xb, h, l, cb, sc, s, &mut o[..l * pd]);
                        },
                    );
            }
        }
        for (i, row) in out[t0 * h_n * pd..(t0 + l) * h_n * pd]
            .chunks_exact_mut(h_n * pd)
            .enumerate()
        {
            for (h, dst) in row.chunks_exact_mut(pd).enumerate() {
                dst.copy_from_slice(&buf[(h * C + i) * pd..][..pd]);
            }
        }
    }
}

/// Per-task scratch of the chunked prefill (`C` = chunk length).
struct Scratch {
    /// `[C, C]` decays from token j to token i: `exp(Σ_{j<s<=i} dt_s A)` (`j <= i`, else 0).
    decay: Vec<f32>,
    /// `[C]` `Σ_{s<=i} dt_s A`.
    cum: Vec<f32>,
    /// `[C, C]` `M[i][j] = (C_i·B_j) decay[i][j] dt_j`, `j <= i`, else 0.
    m: Vec<f32>,
    /// `[C, N]` `C` rows decayed from the chunk start.
    cd: Vec<f32>,
    /// `[C, P]` `x` rows decayed to the chunk end, times `dt`.
    xd: Vec<f32>,
}

impl Scratch {
    fn new(pd: usize, n: usize) -> Self {
        const C: usize = SSD_CHUNK;
        Scratch {
            decay: vec![0.0; C * C],
            cum: vec![0.0; C],
            m: vec![0.0; C * C],
            cd: vec![0.0; C * n],
            xd: vec![0.0; C * pd],
        }
    }
}

/// Head `h` over one chunk (`x`, `l` tokens): `y` `[l, P]` gets its outputs, `s` its state
/// after the chunk; `cb` is the group's `C Bᵀ` `[l, l]`.
#[allow(clippy::too_many_arguments)]
fn chunk_head(
    shape: &SsdShape,
    p: &SsdParams<'_>,
    x: &SsdInputs<'_>,
    h: usize,
    l: usize,
    cb: &[f32],
    sc: &mut Scratch,
    s: &mut [f32],
    y: &mut [f32],
) {
    let (h_n, pd, n, g_n) = (
        shape.n_heads,
        shape.head_dim,
        shape.state_dim,
        shape.n_groups,
    );
    let g = h / shape.heads_per_group();
    let a = p.a[h];
    let dt = |i: usize| x.dt[i * h_n + h];
    chunk_decays(|i| dt(i) * a, l, &mut sc.decay, &mut sc.cum);
    // Decay from the chunk start (before token 0) to token i.
    let from_start = |sc: &Scratch, i: usize| exp(sc.cum[i]);
    for i in 0..l {
        for j in 0..l {
            // decay is 0 above the diagonal.
            sc.m[i * l + j] = cb[i * l + j] * sc.decay[i * l + j] * dt(j);
        }
    }
    let xv = View::rows(&x.x[h * pd..], l, pd, h_n * pd);
    // Within the chunk: y = M x.
    gemm_strided(
        ViewMut::rows(y, l, pd, pd),
        None,
        View::rows(&sc.m[..l * l], l, l, l),
        xv,
        1.0,
    );
    // From the state before the chunk: y += diag(exp(cum)) C Sᵀ.
    for i in 0..l {
        let f = from_start(sc, i);
        let c_row = &x.c[(i * g_n + g) * n..][..n];
        for (d, &c) in sc.cd[i * n..(i + 1) * n].iter_mut().zip(c_row) {
            *d = f * c;
        }
    }
    gemm_strided(
        ViewMut::rows(y, l, pd, pd),
        Some(1.0),
        View::rows(&sc.cd[..l * n], l, n, n),
        View::rows(s, pd, n, n).t(),
        1.0,
    );
    if let Some(d) = p.d {
        let d = d[h];
        for i in 0..l {
            let x_row = &x.x[(i * h_n + h) * pd..][..pd];
            for (yv, &xv) in y[i * pd..(i + 1) * pd].iter_mut().zip(x_row) {
                *yv += d * xv;
            }
        }
    }
    // S = exp(Σ dt A) S + (diag(decay[l-1][i] dt_i) x)ᵀ B.
    for i in 0..l {
        let f = sc.decay[(l - 1) * l + i] * dt(i);
        let x_row = &x.x[(i * h_n + h) * pd..][..pd];
        for (d, &xv) in sc.xd[i * pd..(i + 1) * pd].iter_mut().zip(x_row) {
            *d = f * xv;
        }
    }
    let chunk_decay = from_start(sc, l - 1);
    gemm_strided(
        ViewMut::rows(s, pd, n, n),
        Some(chunk_decay),
        View::rows(&sc.xd[..l * pd], l, pd, pd).t(),
        View::rows(&x.b[g * n..], l, n, g_n * n),
        1.0,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_is_the_same_on_every_isa() {
        let shape = SsdShape {
            n_heads: 4,
            head_dim: 6,
            state_dim: 37,
            n_groups: 2,
        };
        let f = |n: usize, m: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * m).sin()).collect() };
        let (xs, b, c) = (f(24, 0.3), f(74, 0.7), f(74, 0.11));
        let dt: Vec<f32> = f(4, 0.9).iter().map(|v| softplus(*v)).collect();
        let a = [-1.0, -2.0, -0.5, -4.0];
        let d = [0.5, 1.0, -1.0, 2.0];
        let p = SsdParams { a: &a, d: Some(&d) };
        let x = SsdInputs {
            x: &xs,
            dt: &dt,
            b: &b,
            c: &c,
        };
        let s0 = f(shape.state_len(), 0.05);
        let mut want_s = s0.clone();
        let mut want_o = vec![0.0; 24];
        step_token(Isa::Scalar, &shape, &p, &x, 0, &mut want_s, &mut want_o);
        for isa in crate::available_isas() {
            let mut s = s0.clone();
            let mut o = vec![0.0; 24];
            step_token(isa, &shape, &p, &x, 0, &mut s, &mut o);
            for (u, v) in s.iter().zip(&want_s).chain(o.iter().zip(&want_o)) {
                assert!((u - v).abs() < 1e-5 * (1.0 + v.abs()), "{isa}: {u} vs {v}");
            }
        }
    }
}
