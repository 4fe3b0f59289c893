//! Pruning (`pagoda prune`): setting the least useful weights of every decoder layer's linear
//! matrices to zero, unstructured or N:M, by magnitude, Wanda or SparseGPT ([`mask`]), layer by
//! layer on calibration data run through the layers already pruned — the same windows,
//! observer ([`Recorder`]) and layer-wise loop as `pagoda quantize`'s
//! [`sequential`](crate::quantize::sequential) path.
//!
//! - [`PruneOptions`] (method, sparsity, [`Pattern`]) and their checks.
//! - Structured pruning, which makes the model smaller rather than sparser: [`layers`]
//!   (dropping whole decoder layers), [`width`] (MLP neurons, attention heads by GQA group,
//!   residual channels), both cut by [`reshape`].
//! - [`prune_model`] — the driver; [`PruneReport`] — zeros and calibration output error of
//!   every matrix, against magnitude pruning at the same pattern.
//!
//! Which tensors: the attention (Q, K, V, O) and MLP (gate, up, down) weights of every layer;
//! embeddings, the output head and norms are kept byte for byte (as the papers do).
//! Pruned matrices are stored as F16 (exact zeros, no block format to re-fit); an out-of-range
//! or non-finite value is an error naming the tensor.
//!
//! Invariants: layer `L` is pruned from statistics of inputs produced by the already-pruned
//! layers `0..L` (the SparseGPT and Wanda references' sequential calibration); at most one
//! layer's statistics are alive; options are checked before any work
//! ([`PruneOptions::validate`]); every mask prunes an exact count (see [`mask`]), so the
//! achieved sparsity is the requested one up to the floor of each row or block.

// `usize::is_multiple_of` is newer than the workspace's rust-version (1.85).
#![allow(clippy::manual_is_multiple_of)]

pub mod layers;
pub mod mask;
pub mod reshape;
pub mod width;

use std::collections::BTreeMap;
use std::str::FromStr;

use half::f16;
use pagoda_kernels::GgmlType;
use pagoda_model::weights::{TensorView, Weights};
use pagoda_model::{Model, ModelConfig};

use crate::quantize::calibrate::{calibration_windows, record_layer};
use crate::quantize::layer::merge_weights;
use crate::quantize::sequential::SequentialCalibration;
use crate::CompressError;

/// How weights are chosen for removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneMethod {
    /// Smallest `|W|` per output row.
    Magnitude,
    /// Smallest `|W| · ‖X‖₂` per output row (Sun et al., 2023).
    Wanda,
    /// OBS-style pruning with Hessian-inverse error compensation (Frantar & Alistarh, 2023).
    SparseGpt,
}

impl PruneMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            PruneMethod::Magnitude => "magnitude",
            PruneMethod::Wanda => "wanda",
            PruneMethod::SparseGpt => "sparsegpt",
        }
    }
}

impl FromStr for PruneMethod {
    type Err = CompressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "magnitude" => Ok(PruneMethod::Magnitude),
            "wanda" => Ok(PruneMethod::Wanda),
            "sparsegpt" => Ok(PruneMethod::SparseGpt),
            other => Err(CompressError::InvalidInput(format!(
                "unknown pruning method `{other}`; choose magnitude, wanda or sparsegpt (or layers / width: structured pruning)"
            ))),
        }
    }
}

/// Where the zeros may fall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Anywhere (per output row, or per SparseGPT block).
    Unstructured,
    /// At most `n` non-zero weights in every `m` consecutive input columns of a row
    /// (`2:4` — NVIDIA's semi-structured sparsity).
    NM { n: usize, m: usize },
}

impl Pattern {
    /// The fraction of weights this pattern removes, if fixed by the pattern.
    pub fn fixed_sparsity(self) -> Option<f64> {
        match self {
            Pattern::Unstructured => None,
            Pattern::NM { n, m } => Some((m - n) as f64 / m as f64),
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Unstructured => f.write_str("unstructured"),
            Pattern::NM { n, m } => write!(f, "{n}:{m}"),
        }
    }
}

impl FromStr for Pattern {
    type Err = CompressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        if s == "unstructured" {
            return Ok(Pattern::Unstructured);
        }
        let bad = || {
            CompressError::InvalidInput(format!(
                "unknown sparsity pattern `{s}`; use unstructured or N:M (2:4, 4:8: at most N \
                 non-zero weights in every M)"
            ))
        };
        let (n, m) = s.split_once(':').ok_or_else(bad)?;
        let n: usize = n.trim().parse().map_err(|_| bad())?;
        let m: usize = m.trim().parse().map_err(|_| bad())?;
        if n == 0 || n >= m {
            return Err(CompressError::InvalidInput(format!(
                "pattern {n}:{m}: N must be at least 1 and less than M (N non-zero weights \
                 kept in every M; 2:4 and 4:8 are usual)"
            )));
        }
        if m > 256 {
            return Err(CompressError::InvalidInput(format!(
                "pattern {n}:{m}: M above 256 is not supported"
            )));
        }
        Ok(Pattern::NM { n, m })
    }
}

/// What [`prune_model`] does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PruneOptions {
    pub method: PruneMethod,
    /// Fraction of each matrix's weights set to zero, in `[0, 1)`; for N:M it must be
    /// `(M − N) / M` (the pattern fixes it).
    pub sparsity: f64,
    pub pattern: Pattern,
    /// SparseGPT dampening (fraction of the mean Hessian diagonal).
    pub damp: f64,
    /// SparseGPT: columns per block (the mask of an unstructured block is chosen at once).
    pub block: usize,
}

impl PruneOptions {
    /// Options for `method` and `pattern`; `sparsity` may be left out for N:M (the pattern
    /// fixes it) and defaults to 0.5 for unstructured.
    pub fn new(
        method: PruneMethod,
        pattern: Pattern,
        sparsity: Option<f64>,
    ) -> Result<Self, CompressError> {
        let sparsity = match (pattern.fixed_sparsity(), sparsity) {
            (Some(fixed), Some(s)) if (s - fixed).abs() > 1e-9 => {
                return Err(CompressError::InvalidInput(format!(
                    "pattern {pattern} prunes {fixed} of the weights; --sparsity {s} \
                     contradicts it (leave --sparsity out with an N:M pattern)"
                )))
            }
            (Some(fixed), _) => fixed,
            (None, s) => s.unwrap_or(0.5),
        };
        let opts = PruneOptions {
            method,
            sparsity,
            pattern,
            damp: 0.01,
            block: 128,
        };
        opts.validate()?;
        Ok(opts)
    }

    /// Refuses what cannot be done: sparsity outside `[0, 1)`, a bad dampening or block.
    pub fn validate(&self) -> Result<(), CompressError> {
        if !(self.sparsity.is_finite() && (0.0..1.0).contains(&self.sparsity)) {
            return Err(CompressError::InvalidInput(format!(
                "sparsity {} is outside [0, 1): give the fraction of weights to remove, e.g. \
                 0.5",
                self.sparsity
            )));
        }
        if let Pattern::NM { n, m } = self.pattern {
            if n == 0 || n >= m {
                return Err(CompressError::InvalidInput(format!(
                    "pattern {n}:{m}: N must be at least 1 and less than M"
                )));
            }
        }
        if !(self.damp.is_finite() && self.damp > 0.0) {
            return Err(CompressError::InvalidInput(format!(
                "dampening {} must be a positive number (0.01 is usual)",
                self.damp
            )));
        }
        if self.block == 0 {
            return Err(CompressError::InvalidInput(
                "the SparseGPT block must be at least one column".into(),
            ));
        }
        Ok(())
    }
}

/// One pruned matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct PrunedMatrix {
    pub name: String,
    pub zeros: usize,
    pub total: usize,
    /// Output error on the calibration data, `Σ_r (w_r − ŵ_r)ᵀ H (w_r − ŵ_r)`, of the method
    /// and of magnitude pruning at the same pattern and sparsity.
    pub error: f64,
    pub magnitude_error: f64,
}

/// What [`prune_model`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PruneReport {
    pub matrices: Vec<PrunedMatrix>,
    pub calibration_tokens: usize,
}

impl PruneReport {
    /// The matrices' kind (`attn_q`, `ffn_down`, ...) → (zeros, total, error, magnitude's
    /// error), in name order.
    pub fn by_kind(&self) -> BTreeMap<String, (usize, usize, f64, f64)> {
        let mut out: BTreeMap<String, (usize, usize, f64, f64)> = BTreeMap::new();
        for m in &self.matrices {
            let kind = m
                .name
                .split('.')
                .nth(2)
                .unwrap_or(m.name.as_str())
                .to_string();
            let e = out.entry(kind).or_default();
            e.0 += m.zeros;
            e.1 += m.total;
            e.2 += m.error;
            e.3 += m.magnitude_error;
        }
        out
    }

    /// Zeros over weights of every pruned matrix.
    pub fn sparsity(&self) -> f64 {
        let (z, t) = self
            .matrices
            .iter()
            .fold((0, 0), |(z, t), m| (z + m.zeros, t + m.total));
        z as f64 / t.max(1) as f64
    }

    /// (method's, magnitude's) summed calibration output errors.
    pub fn total_errors(&self) -> (f64, f64) {
        self.matrices
            .iter()
            .fold((0.0, 0.0), |(a, b), m| (a + m.error, b + m.magnitude_error))
    }
}

/// The linear weights of a decoder layer that are pruned.
pub const MATRICES: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// Prunes one matrix with `opts` against its input `hessian`; returns the pruned values and
/// the report line.
pub fn prune_matrix(
    name: &str,
    w: &[f32],
    rows: usize,
    cols: usize,
    hessian: &crate::quantize::gptq::Hessian,
    opts: &PruneOptions,
) -> Result<(Vec<f32>, PrunedMatrix), CompressError> {
    let by_magnitude = mask::magnitude(w, rows, cols, opts)?;
    let pruned = match opts.method {
        PruneMethod::Magnitude => by_magnitude.clone(),
        PruneMethod::Wanda => mask::wanda(w, rows, cols, hessian, opts)?,
        PruneMethod::SparseGpt => {
            let f = mask::sparsegpt_factor(hessian, opts.damp)?;
            mask::sparsegpt(w, rows, cols, &f, opts)?
        }
    };
    let line = PrunedMatrix {
        name: name.to_string(),
        zeros: pruned.iter().filter(|v| **v == 0.0).count(),
        total: pruned.len(),
        error: hessian.output_error(w, &pruned),
        magnitude_error: hessian.output_error(w, &by_magnitude),
    };
    Ok((pruned, line))
}

/// `values` (`shape`) as an F16 tensor named `name`, or why F16 cannot hold them.
pub(crate) fn f16_view(
    name: &str,
    shape: &[usize],
    values: &[f32],
) -> Result<TensorView, CompressError> {
    let mut bytes = Vec::with_capacity(values.len() * 2);
    for (i, &v) in values.iter().enumerate() {
        if !v.is_finite() || v.abs() > f16::MAX.to_f32() {
            let cols = shape.last().copied().unwrap_or(1).max(1);
            return Err(CompressError::NonFinite {
                tensor: name.to_string(),
                ty: GgmlType::F16,
                row: i / cols,
                col: i % cols,
                value: v,
            });
        }
        bytes.extend_from_slice(&f16::from_f32(v).to_le_bytes());
    }
    TensorView::owned(name.to_string(), GgmlType::F16, shape.to_vec(), bytes).map_err(|message| {
        CompressError::Tensor {
            tensor: name.to_string(),
            ty: GgmlType::F32,
            shape: shape.to_vec(),
            to: GgmlType::F16,
            message,
        }
    })
}

/// Prunes every decoder layer's linear weights of `weights` (a model shaped by `cfg`), layer
/// by layer on `seq`'s calibration windows run through the layers already pruned. Returns
/// the new weights (pruned matrices F16 and owned, the rest borrowed) and the report.
/// `progress(done, total)` after each layer.
pub fn prune_model(
    weights: &Weights,
    cfg: &ModelConfig,
    seq: &SequentialCalibration<'_>,
    opts: &PruneOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<(Weights, PruneReport), CompressError> {
    opts.validate()?;
    if let Some(why) = cfg.irregular_layers() {
        return Err(CompressError::InvalidInput(format!(
            "pruning a {} model is not supported yet: {why}",
            cfg.arch.family().display
        )));
    }
    let mut model = Model::from_weights(cfg, weights)?;
    let windows = calibration_windows(&model, seq.tokens, seq.window, seq.max_windows)?;
    let used = windows.iter().map(|w| w.len()).sum();
    let capacity = windows.iter().map(|w| w.len()).max().unwrap_or(1);
    let mut hidden: Vec<Vec<f32>> = windows
        .iter()
        .map(|w| model.embed(w))
        .collect::<Result<_, _>>()?;
    let mut cache = model.new_cache(capacity);
    let mut report = PruneReport {
        calibration_tokens: used,
        ..PruneReport::default()
    };
    let mut replaced: BTreeMap<String, TensorView> = BTreeMap::new();
    for layer in 0..cfg.n_layers {
        // This layer's input statistics, from the pruned layers before it.
        let stats = record_layer(&model, layer, &hidden, &mut cache, used)?;
        for t in MATRICES {
            let name = format!("blk.{layer}.{t}.weight");
            let view = weights.get(&name)?;
            if view.shape.len() != 2 || view.shape.contains(&0) {
                return Err(CompressError::InvalidInput(format!(
                    "tensor {name} has shape {:?}; a matrix was expected — the model file is \
                     damaged or not a Llama-family model",
                    view.shape
                )));
            }
            let (rows, cols) = (view.shape[0], view.shape[1]);
            let site = stats.site_of(&name).ok_or_else(|| {
                CompressError::InvalidInput(format!(
                    "calibration saw no input of {name}; the calibration run did not cover \
                     this model's layers"
                ))
            })?;
            let w = view.to_f32()?;
            let (pruned, line) = prune_matrix(&name, &w, rows, cols, &site.hessian, opts)?;
            replaced.insert(name.clone(), f16_view(&name, &view.shape, &pruned)?);
            report.matrices.push(line);
        }
        drop(stats);
        if layer + 1 < cfg.n_layers {
            let current = merge_weights(weights, replaced.clone())?;
            model = Model::from_weights(cfg, &current)?;
            for h in &mut hidden {
                model.forward_layer(layer, h, &mut cache)?;
            }
        }
        progress(layer + 1, cfg.n_layers);
    }
    let out = merge_weights(weights, replaced)?;
    Ok((out, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_are_refused_with_the_reason() {
        for (s, needle) in [
            ("2:2", "less than M"),
            ("4:2", "less than M"),
            ("0:4", "at least 1"),
            ("2-4", "unknown sparsity pattern"),
        ] {
            let e = s.parse::<Pattern>().unwrap_err().to_string();
            assert!(e.contains(needle), "{s}: {e}");
        }
        assert_eq!(
            "4:8".parse::<Pattern>().unwrap(),
            Pattern::NM { n: 4, m: 8 }
        );
        for s in [1.0, -0.1, 1.5, f64::NAN] {
            let e = PruneOptions::new(PruneMethod::Wanda, Pattern::Unstructured, Some(s))
                .unwrap_err()
                .to_string();
            assert!(e.contains("outside [0, 1)"), "{s}: {e}");
        }
        let e = PruneOptions::new(PruneMethod::Wanda, Pattern::NM { n: 2, m: 4 }, Some(0.7))
            .unwrap_err()
            .to_string();
        assert!(e.contains("contradicts"), "{e}");
        let o = PruneOptions::new(PruneMethod::Wanda, Pattern::NM { n: 1, m: 4 }, None).unwrap();
        assert_eq!(o.sparsity, 0.75);
        let e = "obs".parse::<PruneMethod>().unwrap_err().to_string();
        assert!(e.contains("magnitude, wanda or sparsegpt"), "{e}");
    }
}
