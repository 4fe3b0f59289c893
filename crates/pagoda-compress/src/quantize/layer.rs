//! Offline quantization of one decoder layer's linear weights with RTN, GPTQ or AWQ, into
//! GGUF block formats the kernels run directly: the options ([`OfflineOptions`], [`Method`],
//! [`OutputFormat`]), the report, the sites in AWQ folding order, [`quantize_layer`] and the
//! results it hands to a sink ([`Quantized`], [`to_gguf_blocks`]). The drivers over a whole
//! model build on it: `offline` (one pass, and the dispatch) and `sequential` (layer-wise);
//! this module imports neither.
//!
//! The group-wise grids of [`grid`](super::grid) map exactly onto GGUF blocks when the group
//! size is a multiple of 32 and groups are contiguous (no act-order): 4-bit symmetric →
//! Q4_0 (`d · (q − 8)`), 4-bit asymmetric → Q4_1 (`d · q + m`, `m = −d · zero`), 8-bit
//! symmetric → Q8_0 (`d · (q − 128)`); the only change is the scale (and Q4_1's minimum
//! `m = −f16(d) · zero`) rounded to f16, as the formats store them (relative error ≤ 2⁻¹¹).
//! The same grids go to Hugging Face GPTQ/AWQ folders through `offline::quantize_layers` and
//! `hf_write`; Pagoda's loader turns those back into exactly these blocks.
//!
//! Which tensors: the attention (Q, K, V, O) and MLP (gate, up, down) weights of every layer;
//! embeddings, the output head and norms stay as they are (as GPTQ and AWQ checkpoints do).
//! AWQ's per-channel scales are folded into what produces each site's input: the attention and
//! MLP norms' weights (Q/K/V and gate/up), the up projection's rows (down), and V's rows (O,
//! only when V and O's input have the same width, i.e. no grouped-query attention) — so the
//! model computes the same function before quantization.
//!
//! Invariants: a layer's matrices are dequantized to f32 one layer at a time and handed on in
//! their output form as soon as the layer is done (peak extra memory: one layer in f32 plus
//! the output); tensors not quantized keep their bytes.

use std::collections::BTreeMap;
use std::str::FromStr;

use half::f16;
use pagoda_kernels::GgmlType;
use pagoda_model::weights::{TensorView, Weights};
use pagoda_model::ModelConfig;

use super::awq::awq_search;
use super::calibrate::CalibrationStats;
use super::gptq::{dump_for_reference, gptq_with_factor, GptqFactor, GptqOptions, Hessian};
use super::grid::{rtn, GridKind, GroupQuantized, GroupSpec};
use crate::CompressError;

/// The quantization algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Round to nearest, no calibration.
    Rtn,
    Gptq,
    Awq,
    /// AWQ's channel scales folded first, then GPTQ on the scaled weights against the
    /// scaled inputs' Hessian (`diag(1/s) H diag(1/s)`) instead of RTN.
    AwqGptq,
}

impl Method {
    pub fn needs_calibration(self) -> bool {
        self != Method::Rtn
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Method::Rtn => "rtn",
            Method::Gptq => "gptq",
            Method::Awq => "awq",
            Method::AwqGptq => "awq-gptq",
        }
    }

    /// Whether AWQ's channel scales are searched and folded.
    pub fn scales_channels(self) -> bool {
        matches!(self, Method::Awq | Method::AwqGptq)
    }

    /// Whether the weights are rounded by GPTQ (else by RTN).
    pub fn compensates(self) -> bool {
        matches!(self, Method::Gptq | Method::AwqGptq)
    }
}

impl FromStr for Method {
    type Err = CompressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "rtn" => Ok(Method::Rtn),
            "gptq" => Ok(Method::Gptq),
            "awq" => Ok(Method::Awq),
            "awq-gptq" | "awq_gptq" => Ok(Method::AwqGptq),
            other => Err(CompressError::InvalidInput(format!(
                "unknown quantization method `{other}`; choose rtn, gptq, awq or awq-gptq"
            ))),
        }
    }
}

/// Where the quantized matrices go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// One GGUF file of Q4_0 / Q4_1 / Q8_0 blocks.
    Gguf,
    /// A Hugging Face folder in AutoGPTQ's v1 packing (`checkpoint_format: "gptq"`).
    Gptq,
    /// A Hugging Face folder in AutoAWQ's GEMM packing.
    Awq,
}

impl OutputFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputFormat::Gguf => "gguf",
            OutputFormat::Gptq => "gptq",
            OutputFormat::Awq => "awq",
        }
    }
}

impl FromStr for OutputFormat {
    type Err = CompressError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "gguf" => Ok(OutputFormat::Gguf),
            "gptq" => Ok(OutputFormat::Gptq),
            "awq" => Ok(OutputFormat::Awq),
            other => Err(CompressError::InvalidInput(format!(
                "unknown output format `{other}`; choose gguf, gptq or awq"
            ))),
        }
    }
}

/// What `offline::quantize_model` does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OfflineOptions {
    pub method: Method,
    pub spec: GroupSpec,
    /// GPTQ: process columns by decreasing Hessian diagonal (not representable in GGUF).
    pub act_order: bool,
    /// GPTQ dampening (fraction of the mean Hessian diagonal).
    pub damp: f64,
    /// AWQ: grid points of the scale exponent search.
    pub awq_grid: usize,
}

/// The grid that suits a GGUF output of `bits` bits: Q4_1 (4-bit asymmetric) holds a float
/// minimum per block, which [`GridKind::FloatMin`] uses in full (an integer zero point wastes
/// up to half a step at the bottom of every group, and cannot reproduce a Q4_1 source);
/// Q4_0 and Q8_0 are symmetric ([`GridKind::IntegerZero`] with a fixed zero). GPTQ/AWQ
/// checkpoint layouts store integer zeros (`qzeros`) and need [`GridKind::IntegerZero`].
pub fn gguf_grid(bits: u8, symmetric: bool) -> GridKind {
    if bits == 4 && !symmetric {
        GridKind::FloatMin
    } else {
        GridKind::IntegerZero
    }
}

impl OfflineOptions {
    /// The block type the matrices have once written in `format` and loaded by Pagoda (for
    /// GGUF: the file's type; for GPTQ/AWQ: what `hf_quant` converts them to), or why the
    /// format cannot hold the options.
    pub fn output_type(&self, format: OutputFormat) -> Result<GgmlType, CompressError> {
        let layout = match format {
            OutputFormat::Gguf => return self.gguf_type(),
            OutputFormat::Gptq => "GPTQ",
            OutputFormat::Awq => "AWQ",
        };
        if self.spec.grid == GridKind::FloatMin {
            return Err(CompressError::InvalidInput(format!(
                "{layout} output stores integer zero points (qzeros): quantize on the \
                 integer-zero grid, not the float-minimum one"
            )));
        }
        if let Some(g) = self.spec.group_size {
            if g == 0 || g % 32 != 0 {
                return Err(CompressError::InvalidInput(format!(
                    "group size {g} is not supported in {layout} output: use a multiple of 32 \
                     (32, 64, 128) or 0 for one group per row"
                )));
            }
        }
        match format {
            OutputFormat::Awq => {
                if self.spec.bits != 4 {
                    return Err(CompressError::InvalidInput(format!(
                        "AWQ output is 4-bit only (AutoAWQ's GEMM packing); {}-bit: use \
                         --format gptq or --format gguf",
                        self.spec.bits
                    )));
                }
                if self.act_order {
                    return Err(CompressError::InvalidInput(
                        "AWQ output has no act-order (no g_idx in its layout); drop \
                         --act-order or use --format gptq"
                            .into(),
                    ));
                }
                Ok(GgmlType::Q4_1)
            }
            _ => match self.spec.bits {
                4 if !self.act_order => Ok(GgmlType::Q4_1),
                4 | 8 => Ok(GgmlType::Q8_0),
                b => Err(CompressError::InvalidInput(format!(
                    "{b}-bit GPTQ output is not supported: use --bits 4 or --bits 8 (the \
                     packings Pagoda's loader and vLLM's GPTQ kernels read)"
                ))),
            },
        }
    }

    /// The GGUF block type the options produce, or why none can hold them.
    pub fn gguf_type(&self) -> Result<GgmlType, CompressError> {
        if self.act_order {
            return Err(CompressError::InvalidInput(
                "act-order scatters each group's columns, which GGUF blocks (32 contiguous \
                 columns) cannot hold; drop --act-order for GGUF output"
                    .into(),
            ));
        }
        if let Some(g) = self.spec.group_size {
            if g == 0 || g % 32 != 0 {
                return Err(CompressError::InvalidInput(format!(
                    "group size {g} does not fit GGUF blocks of 32 columns; use 32, 64 or 128"
                )));
            }
        }
        if self.spec.grid == GridKind::FloatMin && (self.spec.bits != 4 || self.spec.symmetric) {
            return Err(CompressError::InvalidInput(format!(
                "a float-minimum grid maps onto Q4_1 only (4-bit asymmetric), not {}-bit {}",
                self.spec.bits,
                if self.spec.symmetric {
                    "symmetric"
                } else {
                    "asymmetric"
                }
            )));
        }
        match (self.spec.bits, self.spec.symmetric) {
            (4, true) => Ok(GgmlType::Q4_0),
            (4, false) => Ok(GgmlType::Q4_1),
            (8, true) => Ok(GgmlType::Q8_0),
            (8, false) => Err(CompressError::InvalidInput(
                "8-bit output is symmetric in GGUF (Q8_0); add --sym".into(),
            )),
            (b, _) => Err(CompressError::InvalidInput(format!(
                "{b}-bit output is not supported; use --bits 4 or --bits 8"
            ))),
        }
    }
}

/// One quantized matrix in the report.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixOutcome {
    pub name: String,
    pub ty: GgmlType,
    /// Output error on the calibration data (`Σ (w − ŵ)ᵀ H (w − ŵ)`) of the method and of
    /// plain RTN at the same grid; `None` without calibration.
    pub error: Option<f64>,
    pub rtn_error: Option<f64>,
    /// AWQ's chosen scale exponent.
    pub awq_alpha: Option<f32>,
}

/// What `offline::quantize_model` did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OfflineReport {
    pub matrices: Vec<MatrixOutcome>,
    /// Norm or projection tensors rewritten to fold AWQ scales.
    pub folded: Vec<String>,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Calibration tokens a layer-wise run used (the one-pass statistics carry their own).
    pub calibration_tokens: Option<usize>,
}

impl OfflineReport {
    /// Sums of the calibration output errors, (method, RTN), over the matrices that have them.
    pub fn total_errors(&self) -> Option<(f64, f64)> {
        let mut any = false;
        let (mut m, mut r) = (0.0, 0.0);
        for o in &self.matrices {
            if let (Some(e), Some(re)) = (o.error, o.rtn_error) {
                m += e;
                r += re;
                any = true;
            }
        }
        any.then_some((m, r))
    }
}

/// The Hessian of inputs `x / s` given that of `x`: `H_ij / (s_i s_j)`.
fn scaled_hessian(h: &Hessian, scales: &[f32]) -> Hessian {
    let n = h.cols;
    let mut out = h.clone();
    for (i, row) in out.h.chunks_exact_mut(n.max(1)).enumerate() {
        let si = f64::from(scales[i]);
        for (v, &sj) in row.iter_mut().zip(scales) {
            *v /= si * f64::from(sj);
        }
    }
    out
}

/// The weights of one layer's sites, in the order AWQ folds them (a site's scales change
/// the weights of an earlier-listed site, never of one already quantized).
const SITES: [(&[&str], &str); 4] = [
    (&["ffn_down"], "ffn_up"),
    (&["ffn_gate", "ffn_up"], "ffn_norm"),
    (&["attn_output"], "attn_v"),
    (&["attn_q", "attn_k", "attn_v"], "attn_norm"),
];

/// One result of `quantize_layer` (and so of `offline::quantize_layers`), handed to its
/// sink as soon as it is made.
#[derive(Debug)]
pub enum Quantized {
    /// A linear weight `[rows, cols]` (canonical name) on its integer grid.
    Matrix { name: String, q: GroupQuantized },
    /// A norm or projection rewritten in f32 to fold AWQ scales (canonical name, shape).
    Folded {
        name: String,
        shape: Vec<usize>,
        values: Vec<f32>,
    },
}

/// `item` as a tensor: a matrix in `ty` blocks, a folded tensor in F32.
pub(crate) fn quantized_view(item: &Quantized, ty: GgmlType) -> Result<TensorView, CompressError> {
    match item {
        Quantized::Matrix { name, q } => {
            let shape = vec![q.rows, q.cols];
            let data = to_gguf_blocks(q, ty)?;
            TensorView::owned(name.clone(), ty, shape.clone(), data)
                .map_err(|m| tensor_error(name, &shape, ty, m))
        }
        Quantized::Folded {
            name,
            shape,
            values,
        } => {
            let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
            TensorView::owned(name.clone(), GgmlType::F32, shape.clone(), bytes)
                .map_err(|m| tensor_error(name, shape, GgmlType::F32, m))
        }
    }
}

/// `weights` with the tensors of `replaced` in place of their originals (same order).
pub(crate) fn merge_weights(
    weights: &Weights,
    mut replaced: BTreeMap<String, TensorView>,
) -> Result<Weights, CompressError> {
    let mut out = Weights::new();
    for v in weights.iter() {
        let view = replaced.remove(&v.name).unwrap_or_else(|| v.clone());
        out.insert(view).map_err(CompressError::InvalidInput)?;
    }
    Ok(out)
}

/// Checks `opts` against the model before any work: calibration is there when the method
/// needs it, AWQ is not asked of Gemma 3.
pub(crate) fn check_options(
    cfg: &ModelConfig,
    has_calibration: bool,
    opts: &OfflineOptions,
) -> Result<(), CompressError> {
    if opts.method.needs_calibration() && !has_calibration {
        return Err(CompressError::InvalidInput(format!(
            "{} needs calibration data; give --calibration FILE or use --method rtn",
            opts.method.as_str()
        )));
    }
    let family = cfg.arch.family();
    if opts.method.scales_channels() && family.hf_norm_offset != 0.0 {
        return Err(CompressError::InvalidInput(format!(
            "AWQ scale folding into {}'s (1 + w) norms is not supported yet; use gptq or rtn",
            family.display
        )));
    }
    Ok(())
}

/// Quantizes layer `layer`'s linear weights of `weights` with `opts` (AWQ scales folded
/// first), handing every matrix and folded tensor to `sink` and the outcomes to `report`.
/// `calib` must hold this layer's statistics when the method needs calibration.
pub(crate) fn quantize_layer(
    weights: &Weights,
    layer: usize,
    calib: Option<&CalibrationStats>,
    opts: &OfflineOptions,
    ty: GgmlType,
    report: &mut OfflineReport,
    sink: &mut impl FnMut(Quantized) -> Result<(), CompressError>,
) -> Result<(), CompressError> {
    {
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        // The layer's tensors in f32, modified in place by AWQ folding, then quantized.
        let mut work: BTreeMap<String, (Vec<usize>, Vec<f32>)> = BTreeMap::new();
        for t in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
            "attn_norm",
            "ffn_norm",
        ] {
            let n = name(t);
            let view = weights.get(&n)?;
            // A hostile file may give a "matrix" one dimension (or a norm two): refuse it here
            // rather than index a shape it does not have.
            let want_dims = if t.ends_with("norm") { 1 } else { 2 };
            if view.shape.len() != want_dims || view.shape.contains(&0) {
                return Err(CompressError::InvalidInput(format!(
                    "tensor {n} has shape {:?}; a {} was expected — the model file is damaged \
                     or not a Llama-family model",
                    view.shape,
                    if want_dims == 1 { "vector" } else { "matrix" }
                )));
            }
            work.insert(n, (view.shape.clone(), view.to_f32()?));
        }
        let mut outcomes: BTreeMap<String, MatrixOutcome> = BTreeMap::new();
        for (site, prev) in SITES {
            let names: Vec<String> = site.iter().map(|t| name(t)).collect();
            let stats = calib.and_then(|c| c.site_of(&names[0]));
            if opts.method.needs_calibration() && stats.is_none() {
                return Err(CompressError::InvalidInput(format!(
                    "calibration saw no input of {}; the calibration run did not cover this \
                     model's layers",
                    names[0]
                )));
            }
            // AWQ: one scale vector for the whole site, folded into `prev`.
            let mut site_scales: Option<(Vec<f32>, f32)> = None;
            if opts.method.scales_channels() {
                let prev_name = name(prev);
                let v_bias = weights.contains(&format!("blk.{layer}.attn_v.bias"));
                let foldable = match work.get(&prev_name) {
                    Some(_) if prev.ends_with("norm") => true,
                    // A projection's rows feed the site's columns one to one (not with GQA,
                    // nor through V's bias, which would need the same scaling).
                    Some((shape, _)) => {
                        shape.len() == 2
                            && shape[0] == work[&names[0]].0[1]
                            && !(prev == "attn_v" && v_bias)
                    }
                    None => false,
                };
                if let (true, Some(st)) = (foldable, stats) {
                    let (w_cat, rows, cols) = concat_rows(&work, &names)?;
                    let r = awq_search(
                        &w_cat,
                        rows,
                        cols,
                        &st.absmean,
                        &st.hessian,
                        opts.spec,
                        opts.awq_grid,
                    )?;
                    // Fold: weights' columns × s, prev's outputs ÷ s.
                    for n in &names {
                        if let Some((shape, w)) = work.get_mut(n) {
                            let c = shape[1];
                            for row in w.chunks_exact_mut(c) {
                                for (v, s) in row.iter_mut().zip(&r.scales) {
                                    *v *= s;
                                }
                            }
                        }
                    }
                    if let Some((shape, p)) = work.get_mut(&prev_name) {
                        let c = *shape.last().unwrap_or(&1);
                        for (i, row) in p.chunks_exact_mut(c.max(1)).enumerate() {
                            if shape.len() == 1 {
                                for (v, s) in row.iter_mut().zip(&r.scales) {
                                    *v /= s;
                                }
                            } else {
                                let s = r.scales[i];
                                for v in row.iter_mut() {
                                    *v /= s;
                                }
                            }
                        }
                    }
                    report.folded.push(prev_name);
                    site_scales = Some((r.scales, r.alpha));
                }
            }
            let gptq_opts = GptqOptions {
                spec: opts.spec,
                act_order: opts.act_order,
                damp: opts.damp,
            };
            // One factor of the site's Hessian for all of its matrices; after AWQ's folding
            // the site's inputs are x / s, so their Hessian is diag(1/s) H diag(1/s).
            let factor = match (opts.method.compensates(), stats) {
                (true, Some(st)) => Some(match &site_scales {
                    Some((s, _)) => GptqFactor::new(&scaled_hessian(&st.hessian, s), &gptq_opts)?,
                    None => GptqFactor::new(&st.hessian, &gptq_opts)?,
                }),
                _ => None,
            };
            for n in &names {
                let (shape, w) = &work[n];
                let (rows, cols) = (shape[0], shape[1]);
                let q = match opts.method {
                    Method::Gptq | Method::AwqGptq => {
                        let f = factor.as_ref().ok_or_else(|| missing_stats(n))?;
                        let q = gptq_with_factor(w, rows, cols, f, &gptq_opts)?;
                        if let (Some(st), None) = (stats, &site_scales) {
                            dump_for_reference(n, w, rows, cols, &st.hessian, &q, &gptq_opts);
                        }
                        q
                    }
                    Method::Rtn | Method::Awq => rtn(w, rows, cols, opts.spec)?,
                };
                // Errors against the layer as it computes: for AWQ the scaled weights
                // divided back (the function of the folded model).
                let (error, rtn_error) = match stats {
                    Some(st) => {
                        let unscale = |mut v: Vec<f32>| {
                            if let Some((s, _)) = &site_scales {
                                for row in v.chunks_exact_mut(cols) {
                                    for (x, k) in row.iter_mut().zip(s) {
                                        *x /= k;
                                    }
                                }
                            }
                            v
                        };
                        let orig = unscale(w.clone());
                        let mine = unscale(q.dequantize());
                        let plain = rtn(&orig, rows, cols, opts.spec)?.dequantize();
                        (
                            Some(st.hessian.output_error(&orig, &mine)),
                            Some(st.hessian.output_error(&orig, &plain)),
                        )
                    }
                    None => (None, None),
                };
                sink(Quantized::Matrix { name: n.clone(), q })?;
                outcomes.insert(
                    n.clone(),
                    MatrixOutcome {
                        name: n.clone(),
                        ty,
                        error,
                        rtn_error,
                        awq_alpha: site_scales.as_ref().map(|(_, a)| *a),
                    },
                );
            }
        }
        // Folded norms are written back as F32.
        for prev in ["attn_norm", "ffn_norm"] {
            let n = name(prev);
            if report.folded.contains(&n) {
                if let Some((shape, values)) = work.remove(&n) {
                    sink(Quantized::Folded {
                        name: n,
                        shape,
                        values,
                    })?;
                }
            }
        }
        report.matrices.extend(outcomes.into_values());
    }
    Ok(())
}

fn missing_stats(name: &str) -> CompressError {
    CompressError::InvalidInput(format!("no calibration statistics for {name}"))
}

fn tensor_error(name: &str, shape: &[usize], to: GgmlType, message: String) -> CompressError {
    CompressError::Tensor {
        tensor: name.to_string(),
        ty: GgmlType::F32,
        shape: shape.to_vec(),
        to,
        message,
    }
}

/// The site's matrices stacked by rows (they share the input width).
fn concat_rows(
    work: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    names: &[String],
) -> Result<(Vec<f32>, usize, usize), CompressError> {
    let cols = work
        .get(&names[0])
        .map(|(s, _)| s[1])
        .ok_or_else(|| missing_stats(&names[0]))?;
    let mut all = Vec::new();
    let mut rows = 0;
    for n in names {
        let (shape, w) = work.get(n).ok_or_else(|| missing_stats(n))?;
        if shape[1] != cols {
            return Err(CompressError::InvalidInput(format!(
                "{n} has {} input columns, its site {cols}",
                shape[1]
            )));
        }
        all.extend_from_slice(w);
        rows += shape[0];
    }
    Ok((all, rows, cols))
}

/// The GGUF bytes of `q` as `ty` (see the module docs for the exact mapping).
pub fn to_gguf_blocks(q: &GroupQuantized, ty: GgmlType) -> Result<Vec<u8>, CompressError> {
    let gs = q.spec.group_size.unwrap_or(q.cols);
    let contiguous = q
        .g_idx
        .iter()
        .enumerate()
        .all(|(c, &g)| g as usize == c / gs);
    if !contiguous || q.cols % 32 != 0 || gs % 32 != 0 {
        return Err(CompressError::InvalidInput(format!(
            "a {}x{} matrix with groups of {gs}{} does not map onto 32-column GGUF blocks",
            q.rows,
            q.cols,
            if contiguous { "" } else { " in act-order" }
        )));
    }
    let blocks_per_row = q.cols / 32;
    let mut out = Vec::with_capacity(q.rows * blocks_per_row * ty.type_size());
    for r in 0..q.rows {
        for b in 0..blocks_per_row {
            let c0 = b * 32;
            let grid = q.grid(r, c0 / gs);
            let codes = &q.codes[r * q.cols + c0..r * q.cols + c0 + 32];
            let d = f16::from_f32(grid.scale).to_le_bytes();
            match (ty, q.spec.bits, q.spec.symmetric) {
                (GgmlType::Q4_0, 4, true) => {
                    out.extend_from_slice(&d);
                    for j in 0..16 {
                        out.push((codes[j] & 0x0F) | (codes[j + 16] << 4));
                    }
                }
                (GgmlType::Q4_1, 4, false) => {
                    out.extend_from_slice(&d);
                    // Integer zero: `m` from the f16 scale, as a GPTQ/AWQ loader computes it
                    // from the stored scale, so both routes give the same blocks. Float
                    // minimum: the grid's own minimum (already an f16 value).
                    let m = match grid.kind {
                        GridKind::IntegerZero => -f16::from_f32(grid.scale).to_f32() * grid.zero,
                        GridKind::FloatMin => grid.min(),
                    };
                    out.extend_from_slice(&f16::from_f32(m).to_le_bytes());
                    for j in 0..16 {
                        out.push((codes[j] & 0x0F) | (codes[j + 16] << 4));
                    }
                }
                (GgmlType::Q8_0, 8, true) => {
                    out.extend_from_slice(&d);
                    out.extend(codes.iter().map(|&c| (c as i32 - 128) as i8 as u8));
                }
                _ => {
                    return Err(CompressError::InvalidInput(format!(
                        "{}-bit {} grids do not map onto {ty}",
                        q.spec.bits,
                        if q.spec.symmetric {
                            "symmetric"
                        } else {
                            "asymmetric"
                        }
                    )))
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_kernels::dequantize_row;

    fn matrix(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| (((i * 7919) % 997) as f32 / 997.0 - 0.5) * 3.0)
            .collect()
    }

    #[test]
    fn gguf_blocks_dequantize_to_the_grid_values_up_to_f16_scales() {
        for (bits, sym, ty, group) in [
            (4, true, GgmlType::Q4_0, Some(32)),
            (4, false, GgmlType::Q4_1, Some(64)),
            (8, true, GgmlType::Q8_0, None),
            (4, false, GgmlType::Q4_1, Some(128)),
        ] {
            let (rows, cols) = (5, 128);
            let w = matrix(rows, cols);
            let spec = GroupSpec {
                bits,
                group_size: group,
                symmetric: sym,
                grid: GridKind::IntegerZero,
                clip_search: false,
            };
            let q = rtn(&w, rows, cols, spec).unwrap();
            let want = q.dequantize();
            let bytes = to_gguf_blocks(&q, ty).unwrap();
            let rb = ty.row_bytes(cols).unwrap();
            assert_eq!(bytes.len(), rows * rb);
            let mut got = vec![0.0f32; cols];
            for r in 0..rows {
                dequantize_row(ty, &bytes[r * rb..(r + 1) * rb], &mut got).unwrap();
                for c in 0..cols {
                    let scale = q.grid(r, q.g_idx[c] as usize).scale;
                    let tol = scale * 2f32.powi(-10) * (1 << bits) as f32;
                    assert!(
                        (got[c] - want[r * cols + c]).abs() <= tol,
                        "{ty} row {r} col {c}: {} vs {}",
                        got[c],
                        want[r * cols + c]
                    );
                }
            }
        }
    }

    /// A Q4_1 source (the shipped SmolLM2) re-quantized by RTN on the float-minimum grid at
    /// its own group size comes back bit for bit; on the integer zero-point grid it does not.
    #[test]
    fn float_min_rtn_reproduces_q4_1_blocks_exactly() {
        use pagoda_kernels::quantize_row;
        let (rows, cols) = (4, 128);
        let src = matrix(rows, cols);
        let rb = GgmlType::Q4_1.row_bytes(cols).unwrap();
        let mut q41 = vec![0u8; rows * rb];
        let mut w = vec![0.0f32; rows * cols];
        for r in 0..rows {
            quantize_row(
                GgmlType::Q4_1,
                &src[r * cols..(r + 1) * cols],
                &mut q41[r * rb..(r + 1) * rb],
            )
            .unwrap();
            dequantize_row(
                GgmlType::Q4_1,
                &q41[r * rb..(r + 1) * rb],
                &mut w[r * cols..(r + 1) * cols],
            )
            .unwrap();
        }
        let spec = |grid| GroupSpec {
            bits: 4,
            group_size: Some(32),
            symmetric: false,
            grid,
            clip_search: false,
        };
        let q = rtn(&w, rows, cols, spec(gguf_grid(4, false))).unwrap();
        let mut back = vec![0.0f32; rows * cols];
        let bytes = to_gguf_blocks(&q, GgmlType::Q4_1).unwrap();
        for r in 0..rows {
            dequantize_row(
                GgmlType::Q4_1,
                &bytes[r * rb..(r + 1) * rb],
                &mut back[r * cols..(r + 1) * cols],
            )
            .unwrap();
        }
        assert_eq!(back, w);
        let int = rtn(&w, rows, cols, spec(GridKind::IntegerZero))
            .unwrap()
            .dequantize();
        assert!(int.iter().zip(&w).any(|(a, b)| (a - b).abs() > 1e-3));
    }

    #[test]
    fn unsupported_outputs_say_what_to_use() {
        let opts = |bits, sym, group, act_order| OfflineOptions {
            method: Method::Gptq,
            spec: GroupSpec {
                bits,
                group_size: group,
                symmetric: sym,
                grid: GridKind::IntegerZero,
                clip_search: false,
            },
            act_order,
            damp: 0.01,
            awq_grid: 20,
        };
        assert_eq!(
            opts(4, false, Some(128), false).gguf_type().unwrap(),
            GgmlType::Q4_1
        );
        for (o, needle) in [
            (opts(4, false, Some(128), true), "act-order"),
            (opts(4, false, Some(48), false), "group size 48"),
            (opts(3, false, None, false), "3-bit"),
            (opts(8, false, None, false), "--sym"),
            (
                OfflineOptions {
                    spec: GroupSpec {
                        grid: GridKind::FloatMin,
                        ..opts(8, true, None, false).spec
                    },
                    ..opts(8, true, None, false)
                },
                "Q4_1 only",
            ),
        ] {
            let e = o.gguf_type().unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        assert!("gptq".parse::<Method>().is_ok());
        assert!("bnb"
            .parse::<Method>()
            .unwrap_err()
            .to_string()
            .contains("rtn"));
    }
}
