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
//! Ties go to the lower expert index. A router with a selection bias (`exp_probs_b`,
//! DeepSeek-V3's `e_score_correction_bias`, LFM2-MoE's `expert_bias`) chooses the top k of
//! score + bias and weighs them with the unbiased scores.
//!
//! A shared expert (`MoeConfig::shared_ffn_dim`; `ffn_{gate,up,down}_shexp`) runs over every
//! row beside the routed ones and is added to their sum, scaled per row by
//! `sigmoid(ffn_gate_inp_shexp · x)` where the file has that gate (Qwen2-MoE, Qwen3.5-MoE) and
//! unscaled where it has none (DeepSeek, GLM), as llama.cpp reads those files.

use super::backend::{Activation, Activations, Backend};
use super::blocks::GatedMlp;
use crate::config::{Gating, MoeConfig};
use crate::family::moe::{
    expert_bias_name, expert_name, selection_bias_name, shared_expert_gate_name, shared_expert_name,
};
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};

/// One expert's share of a step: the rows that chose it and their weights.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExpertRows {
    pub rows: Vec<u32>,
    pub weights: Vec<f32>,
}

/// Each expert's rows for a step, from router `logits` (`[rows, n_experts]`); the top k are
/// chosen on score + `selection_bias` where the router has one (`n_experts` values).
pub fn route(logits: &[f32], moe: &MoeConfig, selection_bias: Option<&[f32]>) -> Vec<ExpertRows> {
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
        let key = |e: usize| scores[e] + selection_bias.map_or(0.0, |b| b[e]);
        // Highest first; equal keys by expert index (a stable order).
        order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
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
    /// Added to the scores to choose the top k, one per expert (kept on the host, where
    /// routing runs).
    selection_bias: Option<Vec<f32>>,
    experts: Vec<GatedMlp<B>>,
    shared: Option<SharedExpert<B>>,
    moe: MoeConfig,
}

/// The dense expert every row runs, with its optional per-row sigmoid gate (`[1, hidden]`).
#[derive(Debug)]
struct SharedExpert<B: Backend> {
    mlp: GatedMlp<B>,
    gate: Option<B::Linear>,
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
        let bias_name = selection_bias_name(layer);
        let selection_bias = if weights.contains(&bias_name) {
            Some(weights.vector_f32(&bias_name, moe.n_experts)?)
        } else {
            None
        };
        let shared = match moe.shared_ffn_dim {
            None => None,
            Some(f) => {
                let name = |proj: &str| shared_expert_name(layer, proj);
                let gate_name = shared_expert_gate_name(layer);
                Some(SharedExpert {
                    mlp: GatedMlp {
                        gate: backend.load_linear(weights, &name("gate"), None, f, d)?,
                        up: backend.load_linear(weights, &name("up"), None, f, d)?,
                        down: backend.load_linear(weights, &name("down"), None, d, f)?,
                        activation,
                    },
                    gate: if weights.contains(&gate_name) {
                        Some(backend.load_linear(weights, &gate_name, None, 1, d)?)
                    } else {
                        None
                    },
                })
            }
        };
        Ok(MoeBlock {
            router,
            selection_bias,
            experts,
            shared,
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
        let routed = route(&logits, &self.moe, self.selection_bias.as_deref());
        for (expert, chosen) in self.experts.iter().zip(routed) {
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
        if let Some(shared) = &self.shared {
            shared.add_to_branch(backend, a, total, pass)?;
        }
        Ok(())
    }

    /// The router, every expert's three projections, and the shared expert's.
    pub fn linears(&self) -> impl Iterator<Item = &B::Linear> {
        let shared = self
            .shared
            .iter()
            .flat_map(|s| s.mlp.linears().into_iter().chain(s.gate.as_ref()));
        std::iter::once(&self.router)
            .chain(self.experts.iter().flat_map(|e| e.linears()))
            .chain(shared)
    }
}

impl<B: Backend> SharedExpert<B> {
    /// `a.branch += g * mlp(a.normed)` over all `total` rows, `g` the row's gate (1 without).
    fn add_to_branch(
        &self,
        backend: &B,
        a: &mut Activations<B::Act>,
        total: usize,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        let d = B::linear_shape(&self.mlp.down).0;
        let mlp = &self.mlp;
        backend.linears(
            [&mlp.gate, &mlp.up],
            &a.normed,
            [&mut a.gate, &mut a.up],
            pass,
        )?;
        backend.gated(mlp.activation, &mut a.gate, &a.up)?;
        backend.linears([&mlp.down], &a.gate, [&mut a.expert_out], pass)?;
        let weights = match &self.gate {
            Some(gate) => {
                backend.linears([gate], &a.normed, [&mut a.router], pass)?;
                let mut g = backend.to_host(&a.router)?;
                for x in &mut g {
                    *x = 1.0 / (1.0 + (-*x).exp());
                }
                g
            }
            None => vec![1.0; total],
        };
        let rows: Vec<u32> = (0..total as u32).collect();
        backend.scatter_add_rows(&mut a.branch, d, &rows, &weights, &a.expert_out)
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
            shared_ffn_dim: None,
        }
    }

    #[test]
    fn softmax_routing_takes_the_top_k_and_renormalizes_when_asked() {
        let logits = [1.0, 3.0, 2.0, 0.0, /* row 1 */ 0.0, 0.0, 5.0, 5.0];
        let plain = route(&logits, &moe(Gating::Softmax, false), None);
        let e = |x: f32| x.exp();
        let z0 = e(1.0) + e(3.0) + e(2.0) + e(0.0);
        assert_eq!(plain[1].rows, vec![0]);
        assert!((plain[1].weights[0] - e(3.0) / z0).abs() < 1e-6);
        assert_eq!(plain[2].rows, vec![0, 1]);
        // Row 1: experts 2 and 3 tie; both chosen, equal weights.
        assert_eq!(plain[3].rows, vec![1]);
        assert_eq!(plain[0].rows, Vec::<u32>::new());
        let norm = route(&logits, &moe(Gating::Softmax, true), None);
        let w1 = norm[1].weights[0] + norm[2].weights[0];
        assert!((w1 - 1.0).abs() < 1e-6, "{w1}");
        assert!((norm[1].weights[0] - e(3.0) / (e(3.0) + e(2.0))).abs() < 1e-6);
    }

    #[test]
    fn ties_go_to_the_lower_expert_and_every_row_gets_k_experts() {
        let logits = [0.0; 4 * 3];
        let routed = route(&logits, &moe(Gating::Softmax, false), None);
        assert_eq!(routed[0].rows, vec![0, 1, 2]);
        assert_eq!(routed[1].rows, vec![0, 1, 2]);
        assert!(routed[2].rows.is_empty() && routed[3].rows.is_empty());
    }

    #[test]
    fn softmax_of_top_k_and_sigmoid_gating() {
        let logits = [1.0, 3.0, 2.0, 0.0];
        let r = route(&logits, &moe(Gating::SoftmaxOfTopK, false), None);
        let (a, b) = (3.0f32.exp(), 2.0f32.exp());
        assert!((r[1].weights[0] - a / (a + b)).abs() < 1e-6);
        let s = route(&logits, &moe(Gating::Sigmoid, false), None);
        assert!((s[1].weights[0] - 1.0 / (1.0 + (-3.0f32).exp())).abs() < 1e-6);
    }

    #[test]
    fn a_selection_bias_changes_the_choice_but_not_the_weights() {
        let logits = [2.0, 1.0, 0.0, -1.0];
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let plain = route(&logits, &moe(Gating::Sigmoid, false), None);
        assert_eq!((plain[0].rows.len(), plain[1].rows.len()), (1, 1));
        // A bias large enough to lift expert 3 above expert 0 and 1 but not 2's tie-break.
        let bias = [0.0, 0.0, 0.5, 1.0];
        let biased = route(&logits, &moe(Gating::Sigmoid, false), Some(&bias));
        let chosen: Vec<usize> = (0..4).filter(|&e| !biased[e].rows.is_empty()).collect();
        // Keys: 0.881, 0.731, 1.0, 1.269 -> experts 3 and 2.
        assert_eq!(chosen, vec![2, 3]);
        assert!((biased[3].weights[0] - sig(-1.0)).abs() < 1e-6);
        assert!((biased[2].weights[0] - sig(0.0)).abs() < 1e-6);
        let normed = route(&logits, &moe(Gating::Sigmoid, true), Some(&bias));
        let sum = sig(-1.0) + sig(0.0);
        assert!((normed[3].weights[0] - sig(-1.0) / sum).abs() < 1e-6);
    }
}
