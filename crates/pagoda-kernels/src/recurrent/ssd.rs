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
//! The step is one pass per state row (update and dot product together). The prefill runs the
//! chunked SSD form per chunk of [`SSD_CHUNK`] tokens: `C Bᵀ` once per group and chunk
//! (shared by the group's heads), then per head three products (`M x`, `C Sᵀ`, `xᵀ B`), with
//! decays from segment sums like torch's `segment_sum`. Prompts shorter than
//! [`STEP_PREFILL_BELOW`] tokens run the step. The prefill allocates scratch proportional to
//! its inputs, once per call.

use rayon::prelude::*;

use super::{check_len, dims, ensure, per_isa, softplus, MulAdd};
use crate::f32_gemm::{gemm_strided, View, ViewMut};
use crate::{Isa, KernelError};

/// Tokens per chunk of the prefill.
pub const SSD_CHUNK: usize = 64;

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
    let full = n / LANES * LANES;
    for (p, (row, o)) in s.chunks_exact_mut(n).zip(out.iter_mut()).enumerate() {
        let xdt = dt * x[p];
        let mut acc = [0.0f32; LANES];
        for ((r, bb), cc) in row[..full]
            .chunks_exact_mut(LANES)
            .zip(b[..full].chunks_exact(LANES))
            .zip(c[..full].chunks_exact(LANES))
        {
            for l in 0..LANES {
                r[l] = M::madd(xdt, bb[l], r[l] * decay);
                acc[l] = M::madd(r[l], cc[l], acc[l]);
            }
        }
        let mut y: f32 = acc.iter().sum();
        for i in full..n {
            row[i] = M::madd(xdt, b[i], row[i] * decay);
            y = M::madd(row[i], c[i], y);
        }
        *o = M::madd(d, x[p], y);
    }
}

per_isa! {
    /// One head's step.
    fn step_head => step_head_body(s: &mut [f32], x: &[f32], b: &[f32], c: &[f32], dt: f32,
        decay: f32, d: f32, out: &mut [f32])
}

/// A prefill of `n_tokens`: `x` holds `T` tokens, `state` is updated in place, `out`
/// `[T, H, P]`.
pub fn ssd_prefill(
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
    chunked(shape, p, n_tokens, x, state, out);
    Ok(())
}

/// The chunked prefill: `C Bᵀ` per (group, chunk) in parallel, then one task per head writing
/// its outputs `[T, P]`, scattered at the end.
fn chunked(
    shape: &SsdShape,
    p: &SsdParams<'_>,
    n_tokens: usize,
    x: &SsdInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) {
    const CH: usize = SSD_CHUNK;
    let (h_n, pd, n, g_n) = (
        shape.n_heads,
        shape.head_dim,
        shape.state_dim,
        shape.n_groups,
    );
    let n_chunks = n_tokens.div_ceil(CH);
    // cb[(g · n_chunks + c) · CH² ..]: the chunk's `C Bᵀ` `[l, l]`.
    let mut cb = vec![0.0f32; g_n * n_chunks * CH * CH];
    cb.par_chunks_mut(CH * CH).enumerate().for_each(|(i, m)| {
        let (g, c) = (i / n_chunks, i % n_chunks);
        let t0 = c * CH;
        let l = CH.min(n_tokens - t0);
        let at = (t0 * g_n + g) * n;
        gemm_strided(
            ViewMut::rows(&mut m[..l * l], l, l, l),
            None,
            View::rows(&x.c[at..], l, n, g_n * n),
            View::rows(&x.b[at..], l, n, g_n * n).t(),
            1.0,
        );
    });
    let hpg = shape.heads_per_group();
    let per_head: Vec<Vec<f32>> = state
        .par_chunks_mut(pd * n)
        .enumerate()
        .map(|(h, s)| {
            let g = h / hpg;
            let mut sc = Scratch {
                seg: vec![0.0; CH * CH],
                m: vec![0.0; CH * CH],
                cd: vec![0.0; CH * n],
                xd: vec![0.0; CH * pd],
            };
            let mut y = vec![0.0f32; n_tokens * pd];
            for c in 0..n_chunks {
                let t0 = c * CH;
                let l = CH.min(n_tokens - t0);
                let cb = &cb[(g * n_chunks + c) * CH * CH..][..l * l];
                chunk_head(
                    shape,
                    p,
                    x,
                    h,
                    t0,
                    l,
                    cb,
                    &mut sc,
                    s,
                    &mut y[t0 * pd..][..l * pd],
                );
            }
            y
        })
        .collect();
    for (h, y) in per_head.iter().enumerate() {
        for (dst, src) in out.chunks_exact_mut(h_n * pd).zip(y.chunks_exact(pd)) {
            dst[h * pd..(h + 1) * pd].copy_from_slice(src);
        }
    }
}

/// Per-head scratch of the chunked prefill (`C` = chunk length).
struct Scratch {
    /// `[C, C]` segment sums of `dt · A`: `seg[i][j] = Σ_{j<s<=i} dt_s A` (`j <= i`).
    seg: Vec<f32>,
    /// `[C, C]` `M[i][j] = (C_i·B_j) exp(seg[i][j]) dt_j`, `j <= i`, else 0.
    m: Vec<f32>,
    /// `[C, N]` `C` rows decayed from the chunk start.
    cd: Vec<f32>,
    /// `[C, P]` `x` rows decayed to the chunk end, times `dt`.
    xd: Vec<f32>,
}

/// Head `h` over the chunk `t0 .. t0 + l`: `y` `[l, P]` gets its outputs, `s` its state
/// after the chunk; `cb` is the group's `C Bᵀ` `[l, l]`.
#[allow(clippy::too_many_arguments)]
fn chunk_head(
    shape: &SsdShape,
    p: &SsdParams<'_>,
    x: &SsdInputs<'_>,
    h: usize,
    t0: usize,
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
    let dt = |i: usize| x.dt[(t0 + i) * h_n + h];
    for j in 0..l {
        let mut acc = 0.0f32;
        sc.seg[j * l + j] = 0.0;
        for i in j + 1..l {
            acc += dt(i) * a;
            sc.seg[i * l + j] = acc;
        }
    }
    // Decay from the chunk start (before token 0) to token i.
    let from_start = |sc: &Scratch, i: usize| (sc.seg[i * l] + dt(0) * a).exp();
    for i in 0..l {
        for j in 0..l {
            sc.m[i * l + j] = if j <= i {
                cb[i * l + j] * sc.seg[i * l + j].exp() * dt(j)
            } else {
                0.0
            };
        }
    }
    let xv = View::rows(&x.x[(t0 * h_n + h) * pd..], l, pd, h_n * pd);
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
        let c_row = &x.c[((t0 + i) * g_n + g) * n..][..n];
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
            let x_row = &x.x[((t0 + i) * h_n + h) * pd..][..pd];
            for (yv, &xv) in y[i * pd..(i + 1) * pd].iter_mut().zip(x_row) {
                *yv += d * xv;
            }
        }
    }
    // S = exp(Σ dt A) S + (diag(exp(seg[l-1][i]) dt_i) x)ᵀ B.
    for i in 0..l {
        let f = sc.seg[(l - 1) * l + i].exp() * dt(i);
        let x_row = &x.x[((t0 + i) * h_n + h) * pd..][..pd];
        for (d, &xv) in sc.xd[i * pd..(i + 1) * pd].iter_mut().zip(x_row) {
            *d = f * xv;
        }
    }
    let chunk_decay = from_start(sc, l - 1);
    gemm_strided(
        ViewMut::rows(s, pd, n, n),
        Some(chunk_decay),
        View::rows(&sc.xd[..l * pd], l, pd, pd).t(),
        View::rows(&x.b[(t0 * g_n + g) * n..], l, n, g_n * n),
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
