//! Layer-wise (sequential) calibration and quantization, as GPTQ's and AWQ's references run:
//! the calibration windows' hidden states go through the stack one decoder layer at a time;
//! layer `L`'s input statistics are recorded from the outputs of layers `0..L` *already
//! quantized*, so each layer's error compensation also corrects the error the layers before
//! it made; then layer `L` is quantized, its statistics dropped, and the windows run through
//! the quantized layer `L` to become layer `L + 1`'s inputs.
//!
//! Memory: the hidden states of the calibration windows (`tokens × hidden` f32), one layer's
//! statistics (its four sites' Hessians: for SmolLM2 27 MB of f64, against 400 MB for all 30
//! layers at once in [`calibrate`](super::calibrate::calibrate)), one layer in f32 while it is
//! quantized, and the output.
//!
//! Invariants: layer `L` is quantized from statistics of inputs produced by the quantized
//! layers `0..L` and the original embedding; at most one layer's statistics are alive; the
//! result is the same kind of [`Weights`] and [`OfflineReport`] as
//! [`quantize_model`](super::offline::quantize_model)'s.

use std::collections::BTreeMap;
use std::sync::Arc;

use pagoda_model::weights::{TensorView, Weights};
use pagoda_model::{Model, ModelConfig};

use super::calibrate::{calibration_windows, CalibrationStats, Recorder};
use super::offline::{check_options, merge_weights, quantize_layer, OfflineOptions, OfflineReport};
use crate::CompressError;

/// Quantizes `weights` (a model shaped by `cfg`) layer by layer with `opts`, calibrating each
/// layer on up to `max_windows` windows of `window` tokens of `tokens` run through the layers
/// before it, already quantized. `progress(done, total)` after each layer. Returns the
/// weights, the report and the calibration tokens used.
pub fn quantize_model_sequential(
    weights: &Weights,
    cfg: &ModelConfig,
    tokens: &[u32],
    window: usize,
    max_windows: usize,
    opts: &OfflineOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<(Weights, OfflineReport, usize), CompressError> {
    check_options(cfg, true, opts)?;
    let mut model = Model::from_weights(cfg, weights)?;
    let windows = calibration_windows(&model, tokens, window, max_windows)?;
    let used = windows.iter().map(|w| w.len()).sum();
    let capacity = windows.iter().map(|w| w.len()).max().unwrap_or(1);
    // [window_len, hidden] per window: the input of the next layer to quantize.
    let mut hidden: Vec<Vec<f32>> = windows
        .iter()
        .map(|w| model.embed(w))
        .collect::<Result<_, _>>()?;
    let mut cache = model.new_cache(capacity);
    let mut report = OfflineReport {
        bytes_before: weights.n_bytes(),
        ..OfflineReport::default()
    };
    let mut replaced: BTreeMap<String, TensorView> = BTreeMap::new();
    for layer in 0..cfg.n_layers {
        // This layer's input statistics, from the quantized layers before it.
        let recorder = Arc::new(Recorder::default());
        cache.set_observer(Some(recorder.clone()));
        for h in &hidden {
            let mut x = h.clone();
            model.forward_layer(layer, &mut x, &mut cache)?;
        }
        cache.set_observer(None);
        let stats = CalibrationStats {
            sites: Recorder::finish(recorder)?,
            tokens: used,
        };
        quantize_layer(
            weights,
            layer,
            Some(&stats),
            opts,
            &mut report,
            &mut replaced,
        )?;
        drop(stats);
        // The quantized layer's outputs: the next layer's inputs.
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
    report.bytes_after = out.n_bytes();
    Ok((out, report, used))
}
