//! Width pruning (`pagoda prune --method width`), as Minitron (Muralidharan et al., 2024)
//! ranks: one calibration pass records activation magnitudes, and every layer keeps its most
//! active MLP neurons and attention heads; optionally the residual stream keeps its most
//! active channels.
//!
//! Importance (all from the unpruned model, over every calibration token):
//! - an MLP neuron: the mean `|a|` of its activation (the input of `ffn_down`);
//! - a query head: the root mean square over tokens of the L2 norm of its attention output
//!   (the head's slice of `attn_output`'s input);
//! - a KV group: the sum of its query heads' importance;
//! - a residual channel: the mean `|x|` of the normalised hidden state entering attention and
//!   the MLP, summed over layers (Minitron's LayerNorm-output score).
//!
//! GQA is respected ([`plan_width`]): whole KV groups are dropped (`--kv-heads`), and every
//! kept group keeps the same number of its own query heads (`--heads` must be a multiple of
//! the kept KV heads); anything else is refused naming the numbers. Every layer keeps the same
//! widths (GGUF has one `feed_forward_length` and head count per model).
//!
//! Invariant: the observer holds per-channel sums only (no Hessians): memory is the sum of
//! the layers' input widths in f64, whatever the model.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use pagoda_model::{LinearObserver, Logits, Model, ModelConfig};

use super::reshape::{Keep, LayerKeep};
use crate::CompressError;

/// The target widths; `None` keeps that width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WidthTarget {
    pub ffn_dim: Option<usize>,
    pub n_heads: Option<usize>,
    pub n_kv_heads: Option<usize>,
    pub hidden: Option<usize>,
}

impl WidthTarget {
    /// Refuses targets that are no pruning or break the model's head groups; returns the
    /// `(ffn_dim, n_heads, n_kv_heads, hidden)` to keep.
    pub fn resolve(
        &self,
        cfg: &ModelConfig,
    ) -> Result<(usize, usize, usize, usize), CompressError> {
        let bad = |m: String| Err(CompressError::InvalidInput(m));
        if *self == WidthTarget::default() {
            return bad(
                "--method width needs a target: --ffn-dim, --heads, --kv-heads and/or --hidden"
                    .into(),
            );
        }
        let within = |what: &str, flag: &str, v: Option<usize>, full: usize| match v {
            Some(0) => Err(CompressError::InvalidInput(format!(
                "{flag} 0 would keep no {what}"
            ))),
            Some(v) if v > full => Err(CompressError::InvalidInput(format!(
                "{flag} {v} is more than the model's {full} {what}; pruning only removes"
            ))),
            Some(v) => Ok(v),
            None => Ok(full),
        };
        let ffn = within("MLP neurons", "--ffn-dim", self.ffn_dim, cfg.ffn_dim)?;
        let kv = within("KV heads", "--kv-heads", self.n_kv_heads, cfg.n_kv_heads)?;
        let group = cfg.n_heads / cfg.n_kv_heads;
        let heads = match self.n_heads {
            None => kv * group,
            h => within("attention heads", "--heads", h, cfg.n_heads)?,
        };
        let hidden = within(
            "residual channels",
            "--hidden",
            self.hidden,
            cfg.hidden_size,
        )?;
        if heads % kv != 0 {
            return bad(format!(
                "--heads {heads} does not split evenly over {kv} KV heads: with grouped-query \
                 attention every KV group keeps the same number of query heads; use a multiple \
                 of {kv}"
            ));
        }
        if heads / kv > group {
            return bad(format!(
                "--heads {heads} over {kv} KV heads needs {} query heads per group, but each \
                 group has only {group}; keep more KV heads (--kv-heads) or fewer heads",
                heads / kv
            ));
        }
        Ok((ffn, heads, kv, hidden))
    }
}

/// Per-channel sums of one linear input.
#[derive(Debug, Clone)]
struct ChannelSums {
    abs: Vec<f64>,
    sq: Vec<f64>,
    rows: usize,
}

/// The observer of the calibration pass: per site (keyed by its first weight), per input
/// channel, `Σ|x|` and `Σx²`.
#[derive(Default)]
struct ChannelObserver {
    sites: Mutex<BTreeMap<String, ChannelSums>>,
}

impl LinearObserver for ChannelObserver {
    fn observe(&self, weights: &[&str], x: &[f32], n: usize) {
        let (Some(first), true) = (weights.first(), n > 0) else {
            return;
        };
        let cols = x.len() / n;
        let mut sites = self.sites.lock().unwrap_or_else(PoisonError::into_inner);
        let site = sites
            .entry(first.to_string())
            .or_insert_with(|| ChannelSums {
                abs: vec![0.0; cols],
                sq: vec![0.0; cols],
                rows: 0,
            });
        if site.abs.len() != cols {
            return;
        }
        for row in x.chunks_exact(cols) {
            for ((a, s), &v) in site.abs.iter_mut().zip(&mut site.sq).zip(row) {
                let v = v as f64;
                *a += v.abs();
                *s += v * v;
            }
        }
        site.rows += n;
    }
}

/// Activation-based importance of every prunable unit.
#[derive(Debug, Clone, PartialEq)]
pub struct WidthImportance {
    /// `[layer][neuron]`.
    pub ffn: Vec<Vec<f64>>,
    /// `[layer][query head]`.
    pub heads: Vec<Vec<f64>>,
    /// `[channel]`.
    pub hidden: Vec<f64>,
}

/// Runs the calibration `windows` through `model` once and scores every neuron, head and
/// residual channel (see the module docs).
pub fn width_importance(
    model: &Model,
    windows: &[&[u32]],
    mut progress: impl FnMut(usize, usize),
) -> Result<WidthImportance, CompressError> {
    let cfg = model.config();
    let observer = Arc::new(ChannelObserver::default());
    let capacity = windows.iter().map(|w| w.len()).max().unwrap_or(1);
    let mut cache = model.new_cache(capacity);
    cache.set_observer(Some(observer.clone()));
    for (i, w) in windows.iter().enumerate() {
        cache.truncate(0);
        model.forward(w, 0, &mut cache, Logits::Last)?;
        progress(i + 1, windows.len());
    }
    cache.set_observer(None);
    drop(cache);
    let sites = Arc::try_unwrap(observer)
        .map_err(|_| CompressError::InvalidInput("the calibration observer is in use".into()))?
        .sites
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let site = |layer: usize, t: &str, width: usize| -> Result<&ChannelSums, CompressError> {
        let name = format!("blk.{layer}.{t}.weight");
        sites
            .get(&name)
            .filter(|s| s.abs.len() == width && s.rows > 0)
            .ok_or_else(|| {
                CompressError::InvalidInput(format!(
                    "calibration saw no input of {name} of width {width}"
                ))
            })
    };
    let mut imp = WidthImportance {
        ffn: Vec::with_capacity(cfg.n_layers),
        heads: Vec::with_capacity(cfg.n_layers),
        hidden: vec![0.0; cfg.hidden_size],
    };
    for layer in 0..cfg.n_layers {
        let down = site(layer, "ffn_down", cfg.ffn_dim)?;
        imp.ffn
            .push(down.abs.iter().map(|a| a / down.rows as f64).collect());
        let o = site(layer, "attn_output", cfg.n_heads * cfg.head_dim)?;
        imp.heads.push(
            o.sq.chunks_exact(cfg.head_dim)
                .map(|h| (h.iter().sum::<f64>() / o.rows as f64).sqrt())
                .collect(),
        );
        for t in ["attn_q", "ffn_gate"] {
            let s = site(layer, t, cfg.hidden_size)?;
            for (acc, a) in imp.hidden.iter_mut().zip(&s.abs) {
                *acc += a / s.rows as f64;
            }
        }
    }
    Ok(imp)
}

/// The `k` indices of the largest `scores` (ties: the lower index), ascending.
fn top(scores: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut kept: Vec<usize> = order.into_iter().take(k).collect();
    kept.sort_unstable();
    kept
}

/// What width pruning to `target` keeps, by `imp`.
pub fn plan_width(
    cfg: &ModelConfig,
    imp: &WidthImportance,
    target: &WidthTarget,
) -> Result<Keep, CompressError> {
    let (ffn, heads, kv, hidden) = target.resolve(cfg)?;
    let group = cfg.n_heads / cfg.n_kv_heads;
    let per_group = heads / kv;
    let layers = (0..cfg.n_layers)
        .map(|l| {
            let head_imp = &imp.heads[l];
            let group_imp: Vec<f64> = head_imp.chunks(group).map(|g| g.iter().sum()).collect();
            let kv_heads = top(&group_imp, kv);
            let q_heads = kv_heads
                .iter()
                .flat_map(|&g| {
                    let members = &head_imp[g * group..(g + 1) * group];
                    top(members, per_group)
                        .into_iter()
                        .map(move |h| g * group + h)
                })
                .collect();
            LayerKeep {
                source: l,
                q_heads,
                kv_heads,
                ffn: top(&imp.ffn[l], ffn),
            }
        })
        .collect();
    Ok(Keep {
        hidden: top(&imp.hidden, hidden),
        layers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_keeps_the_largest_in_order() {
        assert_eq!(top(&[0.1, 0.9, 0.5, 0.9], 2), vec![1, 3]);
        assert_eq!(top(&[0.1, 0.9, 0.5, 0.9], 3), vec![1, 2, 3]);
        assert_eq!(top(&[1.0, 1.0, 1.0], 1), vec![0]);
    }
}
