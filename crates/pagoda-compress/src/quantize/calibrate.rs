//! Calibration: run text through a model and record, for every group of linear layers that
//! share an input (Q/K/V, gate/up, O, down: a *site*), the statistics GPTQ and AWQ need —
//! the inputs' [`Hessian`] (`2/n · XᵀX`) and their per-channel mean absolute value.
//!
//! [`calibrate`] takes them from the unquantized model in one pass over windows of the
//! calibration tokens (each window a fresh sequence, as GPTQ's reference samples random
//! windows), every site's Hessian in memory at once (`pagoda quantize --one-pass`); the
//! default is [`sequential`](super::sequential), which records one layer at a time with the
//! same [`Recorder`] on the outputs of the layers already quantized.
//!
//! Invariants: every site's Hessian has seen the same rows (`rows`), its mean absolute values
//! are over those rows; a site is keyed by its first weight's name, and lists every weight it
//! feeds in forward order.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use pagoda_model::{LinearObserver, Logits, Model, ModelConfig};

use super::gptq::Hessian;
use crate::CompressError;

/// The statistics of one site.
#[derive(Debug, Clone)]
pub struct SiteStats {
    /// The weights this input feeds (`blk.0.attn_q.weight`, `blk.0.attn_k.weight`, ...).
    pub weights: Vec<String>,
    pub hessian: Hessian,
    /// `[cols]`: mean |x| per input channel.
    pub absmean: Vec<f32>,
    abssum: Vec<f64>,
}

impl SiteStats {
    /// Rows (tokens) seen.
    pub fn rows(&self) -> usize {
        self.hessian.samples
    }
}

/// Statistics of every site, keyed by the site's first weight name.
#[derive(Debug, Clone, Default)]
pub struct CalibrationStats {
    pub sites: BTreeMap<String, SiteStats>,
    /// Calibration tokens run through the model.
    pub tokens: usize,
}

impl CalibrationStats {
    /// The site feeding `weight`, if calibration saw it.
    pub fn site_of(&self, weight: &str) -> Option<&SiteStats> {
        self.sites
            .values()
            .find(|s| s.weights.iter().any(|w| w == weight))
    }
}

/// The observer that accumulates [`SiteStats`].
#[derive(Default)]
pub(crate) struct Recorder {
    sites: Mutex<BTreeMap<String, SiteStats>>,
}

impl Recorder {
    /// The statistics recorded, means taken (the recorder must no longer be shared).
    pub(crate) fn finish(
        recorder: Arc<Recorder>,
    ) -> Result<BTreeMap<String, SiteStats>, CompressError> {
        let recorder = Arc::try_unwrap(recorder).map_err(|_| {
            CompressError::InvalidInput("the calibration observer is still in use".into())
        })?;
        let mut sites = recorder
            .sites
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        for site in sites.values_mut() {
            let rows = site.hessian.samples.max(1) as f64;
            site.absmean = site.abssum.iter().map(|s| (s / rows) as f32).collect();
        }
        Ok(sites)
    }
}

/// Layer `layer`'s input statistics over the calibration windows `hidden` (each the hidden
/// state entering that layer): the layer runs once per window with a [`Recorder`] observing
/// its linears; `hidden` is left unchanged. Layer-by-layer quantization and pruning share it.
pub(crate) fn record_layer(
    model: &pagoda_model::Model,
    layer: usize,
    hidden: &[Vec<f32>],
    cache: &mut pagoda_model::KvCache,
    tokens: usize,
) -> Result<CalibrationStats, CompressError> {
    let recorder = Arc::new(Recorder::default());
    cache.set_observer(Some(recorder.clone()));
    let run = hidden.iter().try_for_each(|h| {
        let mut x = h.clone();
        model.forward_layer(layer, &mut x, cache)
    });
    cache.set_observer(None);
    run?;
    Ok(CalibrationStats {
        sites: Recorder::finish(recorder)?,
        tokens,
    })
}

impl LinearObserver for Recorder {
    fn observe(&self, weights: &[&str], x: &[f32], n: usize) {
        let Some(first) = weights.first() else {
            return;
        };
        if n == 0 {
            return;
        }
        let cols = x.len() / n;
        let mut sites = self.sites.lock().unwrap_or_else(PoisonError::into_inner);
        let site = sites.entry(first.to_string()).or_insert_with(|| SiteStats {
            weights: weights.iter().map(|w| w.to_string()).collect(),
            hessian: Hessian::new(cols),
            absmean: vec![0.0; cols],
            abssum: vec![0.0; cols],
        });
        if site.hessian.cols != cols {
            debug_assert!(false, "site {first} changed width");
            return;
        }
        // The shape was checked by the forward pass; `add` only fails on a ragged input.
        if site.hessian.add(&x[..n * cols]).is_err() {
            return;
        }
        for row in x.chunks_exact(cols) {
            for (s, v) in site.abssum.iter_mut().zip(row) {
                *s += v.abs() as f64;
            }
        }
    }
}

/// `tokens` cut into up to `max_windows` windows of `window` tokens (at most the context), or
/// why the text is too short.
pub fn calibration_windows<'a>(
    model: &Model,
    tokens: &'a [u32],
    window: usize,
    max_windows: usize,
) -> Result<Vec<&'a [u32]>, CompressError> {
    let window = window.min(model.config().context_length).max(1);
    if tokens.len() < window.min(64) || tokens.is_empty() {
        return Err(CompressError::InvalidInput(format!(
            "the calibration text is too short: {} tokens, need at least {}; give a longer \
             text or JSONL file (a few thousand tokens of text like the model's use)",
            tokens.len(),
            window.min(64)
        )));
    }
    Ok(tokens.chunks(window).take(max_windows.max(1)).collect())
}

/// Refuses, before any work, a model the offline quantizers (RTN, GPTQ, AWQ: layer by layer,
/// every layer the same projections) cannot run: one whose layers differ in shape or share
/// K/V and per-layer inputs (Gemma 4). [`super::quantize_weights`], which requantizes a file
/// tensor by tensor, does not depend on the layers.
pub fn check_model(cfg: &ModelConfig) -> Result<(), CompressError> {
    match cfg.irregular_layers() {
        None => Ok(()),
        Some(why) => Err(CompressError::InvalidInput(format!(
            "calibrated or layer-by-layer quantization of a {} model is not supported yet: \
             {why}",
            cfg.arch.family().display
        ))),
    }
}

/// Runs up to `max_windows` windows of `window` tokens of `tokens` through `model` and
/// returns every site's statistics. `progress(done, total)` is called after each window.
pub fn calibrate(
    model: &Model,
    tokens: &[u32],
    window: usize,
    max_windows: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<CalibrationStats, CompressError> {
    check_model(model.config())?;
    let windows = calibration_windows(model, tokens, window, max_windows)?;
    let window = windows.iter().map(|w| w.len()).max().unwrap_or(1);
    let recorder = Arc::new(Recorder::default());
    let mut cache = model.new_cache(window);
    cache.set_observer(Some(recorder.clone()));
    let mut used = 0;
    for (i, w) in windows.iter().enumerate() {
        cache.truncate(0);
        model.forward(w, 0, &mut cache, Logits::Last)?;
        used += w.len();
        progress(i + 1, windows.len());
    }
    cache.set_observer(None);
    drop(cache);
    let sites = Recorder::finish(recorder)?;
    Ok(CalibrationStats {
        sites,
        tokens: used,
    })
}
