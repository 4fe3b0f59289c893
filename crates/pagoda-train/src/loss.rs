//! The distillation loss: a divergence between the teacher's and the student's next-token
//! distributions on the teacher's top-k support, mixed with the hard-label cross-entropy.
//!
//! Notation, per position: the teacher kept its top-k token ids `S` and their
//! log-probabilities `ℓᵢ = log softmax(z_teacher / T)ᵢ` (over the full vocabulary, at
//! temperature `T`). The student's logits are `z`.
//!
//! - `p` — the teacher renormalised over `S`: `pᵢ = exp(ℓᵢ) / Σ_{j∈S} exp(ℓⱼ)`.
//! - `log qᵢ = log softmax(z / T)ᵢ` — the student over the **full** vocabulary.
//! - `q̃` — the student renormalised over `S`: `q̃ᵢ = qᵢ / Σ_{j∈S} qⱼ`.
//!
//! Divergences (each multiplied by `T²`, as Hinton et al. do, so gradients keep their scale
//! when `T` changes):
//! - **forward** KL (the default): `Σ_{i∈S} pᵢ (log pᵢ − log qᵢ)`. The student is not
//!   renormalised, so mass it puts outside `S` is penalised (`Σ_S q ≤ 1` makes this ≥ 0).
//! - **reverse** KL: `Σ_{i∈S} q̃ᵢ (log q̃ᵢ − log pᵢ)` — mode seeking (MiniLLM), on the support.
//! - **skew** KL (DistiLLM's skew forward KL): `Σ_{i∈S} pᵢ (log pᵢ − log mᵢ)` with
//!   `m = α p + (1 − α) q̃` (`α = --skew-alpha`, default 0.1); bounded where plain KL is
//!   not.
//!
//! Hard labels: `CE = −log softmax(z)[next token]` at temperature 1.
//!
//! The loss of an optimiser step is `λ · mean(CE) + (1 − λ) · mean(KD)` (`λ` =
//! `--hard-weight`), each mean over the step's positions that have one: a padding position
//! has neither; the last real position of a sequence has a KD term (the teacher predicted
//! the token after it) but no CE term (its next token is not in the data). The means are
//! over the whole step — every micro-batch of a gradient accumulation divides by the
//! step's counts — so accumulating gives the gradient of one large batch.

use candle_core::{Tensor, D};

use crate::error::{Result, TrainError};
use crate::student::log_softmax_last;

/// Which divergence the KD term is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Divergence {
    Forward,
    Reverse,
    /// Skew forward KL with mixing weight `alpha` on the teacher.
    Skew {
        alpha: f64,
    },
}

impl Divergence {
    /// `forward`, `reverse` or `skew` (with `alpha`).
    pub fn parse(name: &str, alpha: f64) -> Result<Divergence> {
        if !(0.0..1.0).contains(&alpha) {
            return Err(TrainError::InvalidOption(format!(
                "--skew-alpha must be in [0, 1), not {alpha}"
            )));
        }
        match name {
            "forward" | "fkl" | "kl" => Ok(Divergence::Forward),
            "reverse" | "rkl" => Ok(Divergence::Reverse),
            "skew" | "skl" => Ok(Divergence::Skew { alpha }),
            other => Err(TrainError::InvalidOption(format!(
                "unknown --loss {other:?}; choose forward, reverse or skew"
            ))),
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            Divergence::Forward => "forward",
            Divergence::Reverse => "reverse",
            Divergence::Skew { .. } => "skew",
        }
    }
}

/// How the loss is made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossSpec {
    pub divergence: Divergence,
    /// `T` (> 0).
    pub temperature: f64,
    /// `λ` in `[0, 1]`.
    pub hard_weight: f64,
}

impl LossSpec {
    /// Checks the ranges.
    pub fn new(divergence: Divergence, temperature: f64, hard_weight: f64) -> Result<LossSpec> {
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(TrainError::InvalidOption(format!(
                "--temperature must be a positive number, not {temperature}"
            )));
        }
        if !(0.0..=1.0).contains(&hard_weight) {
            return Err(TrainError::InvalidOption(format!(
                "--hard-weight must be in [0, 1], not {hard_weight}"
            )));
        }
        Ok(LossSpec {
            divergence,
            temperature,
            hard_weight,
        })
    }
}

/// The targets of `n` positions (`n` = batch × seq, row-major).
#[derive(Debug, Clone)]
pub struct Targets {
    /// Teacher top-k ids `[n, k]` u32 (padding positions: any valid id).
    pub top_ids: Tensor,
    /// Their log-probabilities at temperature T, `[n, k]` f32.
    pub top_logprobs: Tensor,
    /// 1 where the position has a KD term, `[n]` f32.
    pub kd_mask: Tensor,
    /// The next token, `[n]` u32 (any valid id where `ce_mask` is 0).
    pub next: Tensor,
    /// 1 where the position has a CE term, `[n]` f32.
    pub ce_mask: Tensor,
}

/// What one call computed.
#[derive(Debug)]
pub struct LossParts {
    /// `λ·ΣCE/ce_count + (1−λ)·ΣKD/kd_count` over this call's positions: differentiable.
    pub total: Tensor,
    /// Σ KD and Σ CE over this call's positions (detached values, for logging).
    pub kd_sum: f64,
    pub ce_sum: f64,
}

/// Per-position KD `[n]` of logits `[n, vocab]` (not masked, times `T²`).
pub fn kd_per_position(logits: &Tensor, t: &Targets, spec: &LossSpec) -> Result<Tensor> {
    kd_with(logits, None, t, spec)
}

/// [`kd_per_position`], reusing `log_softmax(logits)` when given and `T = 1` (one
/// full-vocabulary log-softmax for both terms).
fn kd_with(
    logits: &Tensor,
    log_sm: Option<&Tensor>,
    t: &Targets,
    spec: &LossSpec,
) -> Result<Tensor> {
    let temp = spec.temperature;
    // Teacher renormalised over its support (constants: no gradient).
    let lt = t.top_logprobs.detach();
    let log_p = lt.broadcast_sub(&logsumexp_keepdim(&lt)?)?;
    let p = log_p.exp()?;
    let scaled = (logits / temp)?;
    let kd = match spec.divergence {
        Divergence::Forward => {
            let full = match log_sm {
                Some(l) if temp == 1.0 => l.clone(),
                _ => log_softmax_last(&scaled)?,
            };
            let log_q = full.gather(&t.top_ids, 1)?;
            (&p * (&log_p - log_q)?)?.sum(D::Minus1)?
        }
        Divergence::Reverse => {
            let z = scaled.gather(&t.top_ids, 1)?;
            let log_qt = z.broadcast_sub(&logsumexp_keepdim(&z)?)?;
            (log_qt.exp()? * (&log_qt - &log_p)?)?.sum(D::Minus1)?
        }
        Divergence::Skew { alpha } => {
            let z = scaled.gather(&t.top_ids, 1)?;
            let log_qt = z.broadcast_sub(&logsumexp_keepdim(&z)?)?;
            let m = ((&p * alpha)? + (log_qt.exp()? * (1.0 - alpha))?)?;
            (&p * (&log_p - m.log()?)?)?.sum(D::Minus1)?
        }
    };
    Ok((kd * (temp * temp))?)
}

/// Per-position hard-label CE `[n]` (not masked).
pub fn ce_per_position(logits: &Tensor, t: &Targets) -> Result<Tensor> {
    ce_from_log_softmax(&log_softmax_last(logits)?, t)
}

fn ce_from_log_softmax(log_sm: &Tensor, t: &Targets) -> Result<Tensor> {
    let n = t.next.dim(0)?;
    let log_q = log_sm.gather(&t.next.reshape((n, 1))?, 1)?;
    Ok(log_q.squeeze(1)?.neg()?)
}

/// The loss of `logits [n, vocab]` against `targets`, the sums divided by the step's
/// `kd_count` and `ce_count` (see the module doc).
pub fn loss(
    logits: &Tensor,
    targets: &Targets,
    spec: &LossSpec,
    kd_count: f64,
    ce_count: f64,
) -> Result<LossParts> {
    let lambda = spec.hard_weight;
    let log_sm = log_softmax_last(logits)?;
    let kd = (kd_with(logits, Some(&log_sm), targets, spec)? * &targets.kd_mask)?.sum_all()?;
    let kd_sum = kd.to_scalar::<f32>()? as f64;
    let mut total = (kd * ((1.0 - lambda) / kd_count.max(1.0)))?;
    let ce_sum;
    // CE is computed for logging even when λ = 0, but only differentiated when it counts.
    let ce = (ce_from_log_softmax(&log_sm, targets)? * &targets.ce_mask)?.sum_all()?;
    if lambda > 0.0 {
        ce_sum = ce.to_scalar::<f32>()? as f64;
        total = (total + (ce * (lambda / ce_count.max(1.0)))?)?;
    } else {
        ce_sum = ce.detach().to_scalar::<f32>()? as f64;
    }
    Ok(LossParts {
        total,
        kd_sum,
        ce_sum,
    })
}

/// `log Σ exp(x)` over the last dimension, kept.
fn logsumexp_keepdim(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let s = x
        .broadcast_sub(&max)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?;
    Ok((s + max)?)
}
