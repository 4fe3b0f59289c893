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
//! Builds on `layer` only; `offline` dispatches here for
//! [`Calibration::Sequential`](super::offline::Calibration::Sequential), so this module does
//! not import it back.
//!
//! Invariants: layer `L` is quantized from statistics of inputs produced by the quantized
//! layers `0..L` and the original embedding; at most one layer's statistics and one layer's
//! quantized tensors (for running it) are alive here; every result goes to the caller's sink
//! exactly as [`quantize_layers`](super::offline::quantize_layers)' one-pass path sends it
//! (both hand on `layer::quantize_layer`'s results),
//! so GGUF and GPTQ/AWQ folder outputs both get it.

use std::collections::BTreeMap;

use pagoda_kernels::GgmlType;
use pagoda_model::weights::{TensorView, Weights};
use pagoda_model::{Model, ModelConfig};

use super::calibrate::{calibration_windows, record_layer};
use super::layer::{
    merge_weights, quantize_layer, quantized_view, to_gguf_blocks, OfflineOptions, OfflineReport,
    Quantized,
};
use crate::CompressError;

/// The calibration text of a layer-wise run: up to `max_windows` windows of `window` tokens
/// of `tokens`.
#[derive(Debug, Clone, Copy)]
pub struct SequentialCalibration<'a> {
    pub tokens: &'a [u32],
    pub window: usize,
    pub max_windows: usize,
}

/// The layer-wise driver of [`quantize_layers`](super::offline::quantize_layers): every
/// matrix and folded tensor goes to `sink` as the one-pass path sends them; `ty` is the type
/// the output's matrices load as (what the quantized layer runs with while it produces the
/// next layer's inputs; F32 where `ty` cannot hold a matrix's grid).
pub(crate) fn quantize_layers_sequential(
    weights: &Weights,
    cfg: &ModelConfig,
    seq: &SequentialCalibration<'_>,
    opts: &OfflineOptions,
    ty: GgmlType,
    mut progress: impl FnMut(usize, usize),
    mut sink: impl FnMut(Quantized) -> Result<(), CompressError>,
) -> Result<OfflineReport, CompressError> {
    let mut model = Model::from_weights(cfg, weights)?;
    let windows = calibration_windows(&model, seq.tokens, seq.window, seq.max_windows)?;
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
        calibration_tokens: Some(used),
        ..OfflineReport::default()
    };
    for layer in 0..cfg.n_layers {
        // This layer's input statistics, from the quantized layers before it.
        let stats = record_layer(&model, layer, &hidden, &mut cache, used)?;
        let mut layer_views: BTreeMap<String, TensorView> = BTreeMap::new();
        let last = layer + 1 == cfg.n_layers;
        quantize_layer(
            weights,
            layer,
            Some(&stats),
            opts,
            ty,
            &mut report,
            &mut |item: Quantized| {
                if !last {
                    let view = runnable_view(&item, ty)?;
                    layer_views.insert(view.name.clone(), view);
                }
                sink(item)
            },
        )?;
        drop(stats);
        // The quantized layer's outputs: the next layer's inputs.
        if !last {
            let current = merge_weights(weights, layer_views)?;
            model = Model::from_weights(cfg, &current)?;
            for h in &mut hidden {
                model.forward_layer(layer, h, &mut cache)?;
            }
        }
        progress(layer + 1, cfg.n_layers);
    }
    Ok(report)
}

/// A view of `item` the model can run: a matrix in `ty` blocks when `ty` holds its grid
/// exactly (what the output loads as), else its dequantized values in F32.
fn runnable_view(item: &Quantized, ty: GgmlType) -> Result<TensorView, CompressError> {
    match item {
        Quantized::Matrix { name, q } if to_gguf_blocks(q, ty).is_err() => quantized_view(
            &Quantized::Folded {
                name: name.clone(),
                shape: vec![q.rows, q.cols],
                values: q.dequantize(),
            },
            GgmlType::F32,
        ),
        _ => quantized_view(item, ty),
    }
}
