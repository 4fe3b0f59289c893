//! The mixture-of-experts feed-forward block ([`MoeBlock`]), written once over the device
//! seam: a router scores every expert for every row, [`route`] picks each row's top k on
//! the host and weighs them, and each expert then runs once over all the rows that chose it
//! (gathered, its gated MLP, scattered back weighted and summed) — so a step reads each
//! chosen expert's weights once however many rows chose it, and never reads an expert no row
//! chose (one sequence's decode step reads only its k experts).
//!
//! Routing (as llama.cpp's `build_moe_ffn` and transformers compute it): `Softmax` takes the
//! softmax over all experts and the top k of it; `SoftmaxOfTopK` the top k logits and a
//! softmax over those; `Sigmoid` the top k sigmoids. With `normalize_top_k` the k weights are
//! divided by their sum (at least 6.1e-5, llama.cpp's clamp); then times `weights_scale`.
//! Ties go to the lower expert index.

use super::backend::{Activation, Activations, Backend};
use super::blocks::GatedMlp;
use crate::config::{Gating, MoeConfig};
use crate::family::moe::{expert_bias_name, expert_name};
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};

/// One expert's share of a step: the rows that chose it and their weights.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExpertRows {
    pub rows: Vec<u32>,
    pub weights: Vec<f32>,
}

/// Each expert's rows for a step, from router `logits` (`[rows, n_experts]`).
pub fn route(logits: &[f32], moe: &MoeConfig) -> Vec<ExpertRows> {
    let n = moe.n_experts;
    let k = moe.n_used.min(n);
    let mut out = vec![ExpertRows::default(); n];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    let mut scores = vec![0.0f32; n];
    for (row, l) in logits.chunks_exact(n).enumerate() {
        match moe.gating {
            Gating::Softmax => softmax(l, &mut scores),
            Gating::SoftmaxOfTopK => scores.copy_from_slice(l),
            Gating::Sigmoid => {
                for (s, &x) in scores.iter_mut().zip(l) {
                    *s = 1.0 / (1.0 + (-x).exp());
                }
            }
        }
        order.clear();
        order.extend(0..n);
        // Highest score first; equal scores by expert index (a stable order).
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        let chosen = &order[..k];
        let mut weights: Vec<f32> = chosen.iter().map(|&e| scores[e]).collect();
        if moe.gating == Gating::SoftmaxOfTopK {
            let top = weights.clone();
            softmax(&top, &mut weights);
        }
        if moe.normalize_top_k {
            let sum = weights.iter().sum::<f32>().max(6.103_515_6e-5);
            for w in &mut weights {
                *w /= sum;
            }
        }
        for (&e, w) in chosen.iter().zip(weights) {
            out[e].rows.push(row as u32);
            out[e].weights.push(w * moe.weights_scale);
        }
    }
    out
}

fn softmax(x: &[f32], out: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - max).exp();
        sum += *o;
    }
    for o in out.iter_mut() {
        *o /= sum;
    }
}

/// A mixture-of-experts feed-forward layer on backend `B`.
#[derive(Debug)]
pub struct MoeBlock<B: Backend> {
    router: B::Linear,
    experts: Vec<GatedMlp<B>>,
    moe: MoeConfig,
}

impl<B: Backend> MoeBlock<B> {
    /// Layer `layer`'s router and experts (see `family::moe` for the tensor names).
    pub fn load(
        backend: &B,
        weights: &Weights,
        layer: usize,
        cfg: &ModelConfig,
        moe: &MoeConfig,
        activation: Activation,
    ) -> Result<Self, ModelError> {
        let (d, f) = (cfg.hidden_size, moe.expert_ffn_dim);
        let router = backend.load_linear(
            weights,
            &format!("blk.{layer}.ffn_gate_inp.weight"),
            Some(&format!("blk.{layer}.ffn_gate_inp.bias")),
            moe.n_experts,
            d,
        )?;
        let experts = (0..moe.n_experts)
            .map(|e| {
                // Biases where the file has them (gpt-oss).
                let linear = |proj: &str, rows, cols| {
                    let bias = expert_bias_name(layer, proj, e);
                    backend.load_linear(
                        weights,
                        &expert_name(layer, proj, e),
                        Some(&bias),
                        rows,
                        cols,
                    )
                };
                Ok(GatedMlp {
                    gate: linear("gate", f, d)?,
                    up: linear("up", f, d)?,
                    down: linear("down", d, f)?,
                    activation,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(MoeBlock {
            router,
            experts,
            moe: moe.clone(),
        })
    }

    /// `a.normed` (`[total, hidden]`) -> `a.branch` (`[total, hidden]`): each row's chosen
    /// experts, weighted and summed.
    pub fn forward(
        &self,
        backend: &B,
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        let d = B::linear_shape(&self.router).1;
        backend.linears([&self.router], &a.normed, [&mut a.router], pass)?;
        let logits = backend.to_host(&a.router)?;
        let total = logits.len() / self.moe.n_experts;
        backend.zeros(&mut a.branch, total * d)?;
        for (expert, chosen) in self.experts.iter().zip(route(&logits, &self.moe)) {
            if chosen.rows.is_empty() {
                continue;
            }
            backend.gather_rows(&a.normed, d, &chosen.rows, &mut a.expert_in)?;
            backend.linears(
                [&expert.gate, &expert.up],
                &a.expert_in,
                [&mut a.gate, &mut a.up],
                pass,
            )?;
            backend.gated(expert.activation, &mut a.gate, &a.up)?;
            backend.linears([&expert.down], &a.gate, [&mut a.expert_out], pass)?;
            backend.scatter_add_rows(
                &mut a.branch,
                d,
                &chosen.rows,
                &chosen.weights,
                &a.expert_out,
            )?;
        }
        Ok(())
    }

    /// The router and every expert's three projections.
    pub fn linears(&self) -> impl Iterator<Item = &B::Linear> {
        std::iter::once(&self.router).chain(self.experts.iter().flat_map(|e| e.linears()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moe(gating: Gating, normalize_top_k: bool) -> MoeConfig {
        MoeConfig {
            n_experts: 4,
            n_used: 2,
            expert_ffn_dim: 8,
            gating,
            normalize_top_k,
            weights_scale: 1.0,
            layers: vec![true],
        }
    }

    #[test]
    fn softmax_routing_takes_the_top_k_and_renormalizes_when_asked() {
        let logits = [1.0, 3.0, 2.0, 0.0, /* row 1 */ 0.0, 0.0, 5.0, 5.0];
        let plain = route(&logits, &moe(Gating::Softmax, false));
        let e = |x: f32| x.exp();
        let z0 = e(1.0) + e(3.0) + e(2.0) + e(0.0);
        assert_eq!(plain[1].rows, vec![0]);
        assert!((plain[1].weights[0] - e(3.0) / z0).abs() < 1e-6);
        assert_eq!(plain[2].rows, vec![0, 1]);
        // Row 1: experts 2 and 3 tie; both chosen, equal weights.
        assert_eq!(plain[3].rows, vec![1]);
        assert_eq!(plain[0].rows, Vec::<u32>::new());
        let norm = route(&logits, &moe(Gating::Softmax, true));
        let w1 = norm[1].weights[0] + norm[2].weights[0];
        assert!((w1 - 1.0).abs() < 1e-6, "{w1}");
        assert!((norm[1].weights[0] - e(3.0) / (e(3.0) + e(2.0))).abs() < 1e-6);
    }

    #[test]
    fn ties_go_to_the_lower_expert_and_every_row_gets_k_experts() {
        let logits = [0.0; 4 * 3];
        let routed = route(&logits, &moe(Gating::Softmax, false));
        assert_eq!(routed[0].rows, vec![0, 1, 2]);
        assert_eq!(routed[1].rows, vec![0, 1, 2]);
        assert!(routed[2].rows.is_empty() && routed[3].rows.is_empty());
    }

    #[test]
    fn softmax_of_top_k_and_sigmoid_gating() {
        let logits = [1.0, 3.0, 2.0, 0.0];
        let r = route(&logits, &moe(Gating::SoftmaxOfTopK, false));
        let (a, b) = (3.0f32.exp(), 2.0f32.exp());
        assert!((r[1].weights[0] - a / (a + b)).abs() < 1e-6);
        let s = route(&logits, &moe(Gating::Sigmoid, false));
        assert!((s[1].weights[0] - 1.0 / (1.0 + (-3.0f32).exp())).abs() < 1e-6);
    }
}
