//! The optimiser: AdamW as `torch.optim.AdamW` computes it, the learning-rate schedule
//! (linear warm-up, then cosine decay to a floor) and gradient clipping by global norm.
//!
//! Our own AdamW rather than `candle_nn::AdamW`: candle's keeps its moments private, and a
//! checkpoint must hold them to resume exactly. The update is torch's (decoupled weight
//! decay applied first, bias-corrected moments, `eps` added to `√v̂`), checked against
//! `torch.optim.AdamW` by the golden test.
//!
//! Invariants: the moments are keyed by the trainable tensor's name and have its shape;
//! weight decay applies to matrices only (2-D and up: not to norms and biases, as common
//! practice and Hugging Face's trainer do); `step` counts the updates made, so the bias
//! correction of a resumed run continues where it stopped.

use std::collections::BTreeMap;
use std::f64::consts::PI;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use crate::error::{Result, TrainError};

/// AdamW's hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamWConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<()> {
        for (name, b) in [("--beta1", self.beta1), ("--beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(TrainError::InvalidOption(format!(
                    "{name} must be in [0, 1), not {b}"
                )));
            }
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return Err(TrainError::InvalidOption(format!(
                "--weight-decay must be ≥ 0, not {}",
                self.weight_decay
            )));
        }
        if self.eps.is_nan() || self.eps <= 0.0 {
            return Err(TrainError::InvalidOption("eps must be positive".into()));
        }
        Ok(())
    }
}

/// AdamW state over named `Var`s.
#[derive(Debug)]
pub struct AdamW {
    pub config: AdamWConfig,
    /// Updates made so far.
    pub step: u64,
    /// First and second moments by tensor name.
    pub m: BTreeMap<String, Tensor>,
    pub v: BTreeMap<String, Tensor>,
}

/// Whether AdamW decays the tensor of `dims`.
pub fn decays(dims: &[usize]) -> bool {
    dims.len() >= 2
}

impl AdamW {
    /// Zero moments for `vars`.
    pub fn new(config: AdamWConfig, vars: &BTreeMap<String, Var>) -> Result<AdamW> {
        let mut m = BTreeMap::new();
        let mut v = BTreeMap::new();
        for (name, var) in vars {
            m.insert(name.clone(), var.as_tensor().zeros_like()?);
            v.insert(name.clone(), var.as_tensor().zeros_like()?);
        }
        Ok(AdamW {
            config,
            step: 0,
            m,
            v,
        })
    }

    /// One update of every var with gradient `grads[name]` (a var without a gradient is an
    /// error: the forward pass did not reach it) at learning rate `lr`.
    pub fn update(
        &mut self,
        vars: &BTreeMap<String, Var>,
        grads: &BTreeMap<String, Tensor>,
        lr: f64,
    ) -> Result<()> {
        self.step += 1;
        let c = self.config;
        let bc1 = 1.0 - c.beta1.powi(self.step as i32);
        let bc2 = 1.0 - c.beta2.powi(self.step as i32);
        for (name, var) in vars {
            let g = grads
                .get(name)
                .ok_or_else(|| TrainError::Diverged(format!("no gradient reached {name}")))?;
            let (m, v) = match (self.m.get_mut(name), self.v.get_mut(name)) {
                (Some(m), Some(v)) => (m, v),
                _ => return Err(TrainError::Stale(format!("no AdamW moments for {name}"))),
            };
            *m = ((&*m * c.beta1)? + (g * (1.0 - c.beta1))?)?;
            *v = ((&*v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let mut p = var.as_tensor().detach();
            if c.weight_decay > 0.0 && decays(p.dims()) {
                p = (p * (1.0 - lr * c.weight_decay))?;
            }
            let denom = ((v.sqrt()? / bc2.sqrt())? + c.eps)?;
            let upd = (m.div(&denom)? * (lr / bc1))?;
            var.set(&(p - upd)?)?;
        }
        Ok(())
    }
}

/// The learning rate schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    pub lr: f64,
    pub min_lr: f64,
    pub warmup: u64,
    pub total: u64,
}

impl Schedule {
    /// The rate of update `step` (0-based): `lr · (step + 1) / warmup` during the warm-up,
    /// then cosine from `lr` down to `min_lr` at the last step.
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.lr * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self
            .total
            .saturating_sub(self.warmup)
            .saturating_sub(1)
            .max(1);
        let progress = ((step - self.warmup) as f64 / span as f64).min(1.0);
        self.min_lr + (self.lr - self.min_lr) * 0.5 * (1.0 + (PI * progress).cos())
    }
}

/// Gradients of `vars` from `store`, by name (a var the loss does not reach gets zeros).
pub fn collect_grads(
    vars: &BTreeMap<String, Var>,
    store: &GradStore,
) -> Result<BTreeMap<String, Tensor>> {
    let mut out = BTreeMap::new();
    for (name, var) in vars {
        let g = match store.get(var.as_tensor()) {
            Some(g) => g.clone(),
            None => var.as_tensor().zeros_like()?,
        };
        out.insert(name.clone(), g);
    }
    Ok(out)
}

/// Adds `more` into `acc` (gradient accumulation).
pub fn accumulate(
    acc: &mut BTreeMap<String, Tensor>,
    more: BTreeMap<String, Tensor>,
) -> Result<()> {
    for (name, g) in more {
        let sum = match acc.remove(&name) {
            Some(a) => (a + g)?,
            None => g,
        };
        acc.insert(name, sum);
    }
    Ok(())
}

/// Scales `grads` so their global L2 norm is at most `max_norm` (`torch.nn.utils.
/// clip_grad_norm_`: factor `max_norm / (norm + 1e-6)` when below 1); `max_norm ≤ 0`
/// disables. Returns the norm before clipping; a non-finite norm is an error.
pub fn clip_grad_norm(grads: &mut BTreeMap<String, Tensor>, max_norm: f64) -> Result<f64> {
    let mut sq = 0f64;
    for g in grads.values() {
        sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    }
    let norm = sq.sqrt();
    if !norm.is_finite() {
        return Err(TrainError::Diverged(format!(
            "the gradient norm is {norm}: training diverged (try a lower --lr)"
        )));
    }
    if max_norm > 0.0 {
        let factor = max_norm / (norm + 1e-6);
        if factor < 1.0 {
            for g in grads.values_mut() {
                *g = (&*g * factor)?;
            }
        }
    }
    Ok(norm)
}
