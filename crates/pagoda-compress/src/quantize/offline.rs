//! Offline quantization of a whole model (`pagoda quantize`): where the statistics come from
//! ([`Calibration`]: none for RTN, one pass over the unquantized model, or layer by layer) and
//! the drivers over every layer — [`quantize_layers`] (results to a sink, any output form),
//! [`quantize_model`] / [`quantize_model_with`] / [`quantize_model_sequential`] (GGUF blocks
//! in memory). One layer's work is `layer::quantize_layer`;
//! the layer-wise path is `sequential`'s; the options, report and results they share are
//! re-exported here, so callers name this module only.
//!
//! Invariant: every path hands each quantized matrix and folded tensor to the sink once, as
//! soon as its layer is done; `check_options` runs before any work.

use std::collections::BTreeMap;

use pagoda_model::weights::{TensorView, Weights};
use pagoda_model::ModelConfig;

pub use super::calibrate::check_model;
use super::calibrate::CalibrationStats;
use super::layer::{check_options, merge_weights, quantize_layer, quantized_view};
use super::sequential::{quantize_layers_sequential, SequentialCalibration};
use crate::CompressError;
use pagoda_kernels::GgmlType;

pub use super::layer::{
    gguf_grid, to_gguf_blocks, MatrixOutcome, Method, OfflineOptions, OfflineReport, OutputFormat,
    Quantized,
};

/// Where the statistics GPTQ and AWQ need come from.
#[derive(Debug, Clone, Copy)]
pub enum Calibration<'a> {
    /// No statistics: RTN only.
    None,
    /// Every layer's statistics gathered beforehand from the unquantized model in one pass
    /// ([`calibrate`](super::calibrate::calibrate)).
    OnePass(&'a CalibrationStats),
    /// Layer by layer, each layer's statistics from the outputs of the layers before it,
    /// already quantized ([`sequential`](super::sequential)); one layer's statistics alive
    /// at a time.
    Sequential(SequentialCalibration<'a>),
}

impl<'a> From<Option<&'a CalibrationStats>> for Calibration<'a> {
    fn from(stats: Option<&'a CalibrationStats>) -> Self {
        stats.map_or(Calibration::None, Calibration::OnePass)
    }
}

impl Calibration<'_> {
    fn is_some(&self) -> bool {
        !matches!(self, Calibration::None)
    }
}

/// Quantizes every layer's linear weights of `weights` (a model shaped by `cfg`) with
/// `opts` into GGUF blocks; `calib` is required for GPTQ and AWQ. `progress(done, total)`
/// after each layer. Returns the new weights (quantized and folded tensors owned, the rest
/// borrowed from `weights`).
pub fn quantize_model(
    weights: &Weights,
    cfg: &ModelConfig,
    calib: Option<&CalibrationStats>,
    opts: &OfflineOptions,
    progress: impl FnMut(usize, usize),
) -> Result<(Weights, OfflineReport), CompressError> {
    quantize_model_with(weights, cfg, &Calibration::from(calib), opts, progress)
}

/// [`quantize_model`] with any [`Calibration`].
pub fn quantize_model_with(
    weights: &Weights,
    cfg: &ModelConfig,
    calib: &Calibration<'_>,
    opts: &OfflineOptions,
    progress: impl FnMut(usize, usize),
) -> Result<(Weights, OfflineReport), CompressError> {
    let ty = opts.gguf_type()?;
    let mut replaced: BTreeMap<String, TensorView> = BTreeMap::new();
    let mut report = quantize_layers(weights, cfg, calib, opts, ty, progress, |item| {
        let view = quantized_view(&item, ty)?;
        replaced.insert(view.name.clone(), view);
        Ok(())
    })?;
    let out = merge_weights(weights, replaced)?;
    report.bytes_after = out.n_bytes();
    Ok((out, report))
}

/// The work of [`quantize_model`] for any output: each layer's sites quantized (AWQ scales
/// folded first), every matrix and folded tensor handed to `sink` as soon as its layer is
/// done, so that the caller keeps only the output form. `ty` is what the report names as
/// each matrix's type. The report's `bytes_after` is left for the caller.
///
/// Peak memory: the source weights (mapped), one layer in f32, the sink's output.
pub fn quantize_layers(
    weights: &Weights,
    cfg: &ModelConfig,
    calib: &Calibration<'_>,
    opts: &OfflineOptions,
    ty: GgmlType,
    mut progress: impl FnMut(usize, usize),
    mut sink: impl FnMut(Quantized) -> Result<(), CompressError>,
) -> Result<OfflineReport, CompressError> {
    check_options(cfg, calib.is_some(), opts)?;
    let stats = match calib {
        Calibration::Sequential(seq) => {
            return quantize_layers_sequential(weights, cfg, seq, opts, ty, progress, sink)
        }
        Calibration::OnePass(stats) => Some(*stats),
        Calibration::None => None,
    };
    let mut report = OfflineReport {
        bytes_before: weights.n_bytes(),
        ..OfflineReport::default()
    };
    for layer in 0..cfg.n_layers {
        quantize_layer(weights, layer, stats, opts, ty, &mut report, &mut sink)?;
        progress(layer + 1, cfg.n_layers);
    }
    Ok(report)
}

/// Quantizes `weights` (a model shaped by `cfg`) layer by layer with `opts` into GGUF blocks,
/// calibrating each layer on up to `max_windows` windows of `window` tokens of `tokens` run
/// through the layers before it, already quantized. `progress(done, total)` after each layer.
/// Returns the weights, the report and the calibration tokens used.
pub fn quantize_model_sequential(
    weights: &Weights,
    cfg: &ModelConfig,
    tokens: &[u32],
    window: usize,
    max_windows: usize,
    opts: &OfflineOptions,
    progress: impl FnMut(usize, usize),
) -> Result<(Weights, OfflineReport, usize), CompressError> {
    let seq = SequentialCalibration {
        tokens,
        window,
        max_windows,
    };
    let (out, report) =
        quantize_model_with(weights, cfg, &Calibration::Sequential(seq), opts, progress)?;
    let used = report.calibration_tokens.unwrap_or(0);
    Ok((out, report, used))
}
