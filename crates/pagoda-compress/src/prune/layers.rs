//! Layer dropping (`pagoda prune --method layers --drop N`): rank the decoder layers by how
//! little they matter and remove the `N` that matter least.
//!
//! Two rankings ([`LayerRanking`]):
//! - **Block influence** (ShortGPT, Men et al., 2024): `BI_l = 1 − mean_t cos(x_t, y_t)` for
//!   the hidden state `x_t` entering layer `l` and `y_t` leaving it, over every calibration
//!   token; a layer that barely turns the residual stream has a low BI. One pass over the
//!   calibration windows, one layer at a time ([`Model::forward_layer`]).
//! - **Perplexity impact**: the calibration text's perplexity with layer `l` alone removed;
//!   exact for one layer, `n_layers` evaluations of the model.
//!
//! Invariants: scores are computed on the unpruned model (one-shot, as ShortGPT ranks);
//! the dropped set is the `N` lowest scores, ties broken towards the later layer; dropping
//! nothing or every layer is refused before any work ([`check_drop`]).

use pagoda_model::weights::Weights;
use pagoda_model::{KvDtype, Model, ModelConfig};

use super::reshape::{reshape, Keep};
use crate::eval::perplexity::{perplexity, PerplexityOptions};
use crate::CompressError;

/// How layers are ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerRanking {
    /// ShortGPT's block influence.
    Influence,
    /// Calibration perplexity with the layer removed.
    Perplexity,
}

impl LayerRanking {
    pub fn as_str(self) -> &'static str {
        match self {
            LayerRanking::Influence => "influence",
            LayerRanking::Perplexity => "perplexity",
        }
    }
}

impl std::str::FromStr for LayerRanking {
    type Err = CompressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "influence" | "bi" => Ok(LayerRanking::Influence),
            "perplexity" | "ppl" => Ok(LayerRanking::Perplexity),
            other => Err(CompressError::InvalidInput(format!(
                "unknown layer ranking `{other}`; choose influence (ShortGPT's block \
                 influence) or perplexity"
            ))),
        }
    }
}

/// Refuses a drop count that leaves nothing to do or no model.
pub fn check_drop(drop: usize, n_layers: usize) -> Result<(), CompressError> {
    if drop == 0 {
        return Err(CompressError::InvalidInput(
            "--drop 0 removes no layer; give the number of decoder layers to remove".into(),
        ));
    }
    if drop >= n_layers {
        return Err(CompressError::InvalidInput(format!(
            "--drop {drop} would remove every layer of a {n_layers}-layer model; at most {} \
             can go",
            n_layers - 1
        )));
    }
    Ok(())
}

/// One layer's importance: lower means safer to drop.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerScore {
    pub layer: usize,
    /// Block influence, or perplexity without the layer.
    pub score: f64,
}

/// Every layer's block influence over `windows` (token windows of the calibration text).
pub fn block_influence(
    model: &Model,
    windows: &[&[u32]],
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<LayerScore>, CompressError> {
    let cfg = model.config();
    let d = cfg.hidden_size;
    let capacity = windows.iter().map(|w| w.len()).max().unwrap_or(1);
    let mut hidden: Vec<Vec<f32>> = windows
        .iter()
        .map(|w| model.embed(w))
        .collect::<Result<_, _>>()?;
    let mut cache = model.new_cache(capacity);
    let mut scores = Vec::with_capacity(cfg.n_layers);
    for layer in 0..cfg.n_layers {
        let (mut cos_sum, mut n) = (0.0f64, 0usize);
        for h in &mut hidden {
            let before = h.clone();
            model.forward_layer(layer, h, &mut cache)?;
            for (x, y) in before.chunks_exact(d).zip(h.chunks_exact(d)) {
                cos_sum += cosine(x, y);
                n += 1;
            }
        }
        scores.push(LayerScore {
            layer,
            score: 1.0 - cos_sum / n.max(1) as f64,
        });
        progress(layer + 1, cfg.n_layers);
    }
    Ok(scores)
}

/// `cos(x, y)`; 1 when either is zero (a zero vector is not turned).
fn cosine(x: &[f32], y: &[f32]) -> f64 {
    let (mut xy, mut xx, mut yy) = (0.0f64, 0.0f64, 0.0f64);
    for (&a, &b) in x.iter().zip(y) {
        let (a, b) = (a as f64, b as f64);
        xy += a * b;
        xx += a * a;
        yy += b * b;
    }
    if xx == 0.0 || yy == 0.0 {
        return 1.0;
    }
    xy / (xx.sqrt() * yy.sqrt())
}

/// Every layer's perplexity impact: the perplexity of `tokens` (windows of `window`) with
/// that layer alone removed.
pub fn perplexity_impact(
    weights: &Weights,
    cfg: &ModelConfig,
    tokens: &[u32],
    window: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<LayerScore>, CompressError> {
    let options = PerplexityOptions {
        ctx: Some(window.min(cfg.context_length).max(2)),
        stride: None,
        kv_dtype: KvDtype::F32,
    };
    let mut scores = Vec::with_capacity(cfg.n_layers);
    for layer in 0..cfg.n_layers {
        let (w, c) = reshape(weights, cfg, &keep_without(cfg, &[layer]))?;
        let model = Model::from_weights(&c, &w)?;
        let report = perplexity(&model, tokens, &options, &mut |_, _| {})?;
        scores.push(LayerScore {
            layer,
            score: report.perplexity,
        });
        progress(layer + 1, cfg.n_layers);
    }
    Ok(scores)
}

/// The `drop` layers with the lowest scores (ties: the later layer first), ascending.
pub fn choose_dropped(scores: &[LayerScore], drop: usize) -> Vec<usize> {
    let mut order: Vec<&LayerScore> = scores.iter().collect();
    order.sort_by(|a, b| a.score.total_cmp(&b.score).then(b.layer.cmp(&a.layer)));
    let mut dropped: Vec<usize> = order.iter().take(drop).map(|s| s.layer).collect();
    dropped.sort_unstable();
    dropped
}

/// Everything of `cfg` except the layers `dropped`.
pub fn keep_without(cfg: &ModelConfig, dropped: &[usize]) -> Keep {
    let mut keep = Keep::all(cfg);
    keep.layers.retain(|l| !dropped.contains(&l.source));
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_scores_are_dropped_and_bad_counts_refused() {
        let scores: Vec<LayerScore> = [0.5, 0.1, 0.3, 0.1, 0.9]
            .iter()
            .enumerate()
            .map(|(layer, &score)| LayerScore { layer, score })
            .collect();
        assert_eq!(choose_dropped(&scores, 1), vec![3]);
        assert_eq!(choose_dropped(&scores, 2), vec![1, 3]);
        assert_eq!(choose_dropped(&scores, 3), vec![1, 2, 3]);
        assert!(check_drop(0, 4)
            .unwrap_err()
            .to_string()
            .contains("removes no layer"));
        assert!(check_drop(4, 4)
            .unwrap_err()
            .to_string()
            .contains("every layer"));
        assert!(check_drop(3, 4).is_ok());
        assert_eq!(cosine(&[1.0, 0.0], &[2.0, 0.0]), 1.0);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-12);
        assert!("shortgpt".parse::<LayerRanking>().is_err());
    }
}
