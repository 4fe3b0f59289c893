//! Writing a quantized model as a Hugging Face folder in the GPTQ or AWQ layout that
//! transformers/optimum, AutoGPTQ, AutoAWQ and vLLM load: `config.json` with its
//! `quantization_config`, one `model.safetensors`, and the tokenizer files.
//!
//! The packings are the exact inverse of the loader's (`pagoda_model::hf_quant`, whose module
//! doc writes them down): for a matrix `[out, in]` of codes `q`, scales and integer zero points
//! per (output row, group) —
//!
//! ```text
//! GPTQ (checkpoint_format "gptq" = v1), bits 4 or 8, pack = 32 / bits
//!   qweight I32 [in / pack, out]     bits*(i % pack).. of word [i / pack][j] = q[j][i]
//!   qzeros  I32 [groups, out / pack] bits*(j % pack).. of word [g][j / pack] = zero[j][g] - 1
//!   scales  F16 [groups, out]
//!   g_idx   I32 [in]                 the group of each input column (act-order: not monotone)
//! AWQ GEMM (version "gemm", zero_point true), 4 bits
//!   qweight I32 [in, out / 8]        nibble p of word [i][k] = q[8k + ORDER[p]][i],
//!                                    ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
//!   qzeros  I32 [groups, out / 8]    same order, zero points as they are
//!   scales  F16 [groups, out]
//! ```
//!
//! GPTQ v1 stores `zero - 1`, so a group whose zero point is 0 (an asymmetric group with no
//! negative value worth a step) has no v1 encoding; when any group has one, the folder is
//! written as `checkpoint_format: "gptq_v2"` (zeros as they are), which Pagoda and GPTQModel
//! read, with a warning (symmetric grids, `--sym`, never have it).
//!
//! Every other tensor (embeddings, norms, the output head, biases) is written in F16 under
//! its Hugging Face name ([`pagoda_model::hf::hf_name`], the inverse of the loader's
//! mapping). A Llama GGUF's Q and K rows are in llama.cpp's interleaved RoPE order; they are
//! put back in Hugging Face's half-split order (whole rows move, so the grids are unchanged).
//!
//! Invariants: the folder appears only when complete — everything is written into
//! `OUT.partial` and renamed; on any error the partial folder is removed. Tensors are
//! streamed into the safetensors file one at a time (the header is computed from shapes
//! first), so the writer holds the packed linears (the size of the quantized model) and one
//! tensor in f32 at most.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use half::f16;
use pagoda_model::family::Activation;
use pagoda_model::hf::hf_name;
use pagoda_model::rope_order::hf_row_order;
use pagoda_model::tokenizer::Tokenizer;
use pagoda_model::weights::Weights;
use pagoda_model::{ModelConfig, RopeScaling};
use serde_json::{json, Map, Value};

use super::grid::{GroupQuantized, GroupSpec};
use super::offline::{
    quantize_layers, Calibration, OfflineOptions, OfflineReport, OutputFormat, Quantized,
};
use crate::CompressError;

/// AutoAWQ's GEMM nibble order: nibble `p` of a word holds output column `8k + AWQ_ORDER[p]`.
pub const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Tokenizer and generation files copied from a Hugging Face input folder when present.
pub const TOKENIZER_FILES: [&str; 10] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
];

/// One quantized linear in packed form; zero points stay unpacked until the checkpoint's
/// zero storage (GPTQ v1 or v2) is decided.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedLinear {
    /// Output features (rows of Pagoda's `[out, in]` matrix).
    pub out_features: usize,
    pub in_features: usize,
    pub groups: usize,
    /// GPTQ `[in / pack, out]`, AWQ `[in, out / 8]`.
    pub qweight: Vec<i32>,
    pub qweight_shape: [usize; 2],
    /// `[groups, out]` integer zero points.
    pub zeros: Vec<u8>,
    /// `[groups, out]`.
    pub scales: Vec<f16>,
    /// GPTQ only: `[in]`.
    pub g_idx: Option<Vec<i32>>,
}

fn invalid(message: String) -> CompressError {
    CompressError::InvalidInput(message)
}

/// Packs `q` (named `name` in errors) in `format`'s layout.
pub fn pack(
    q: &GroupQuantized,
    format: OutputFormat,
    name: &str,
) -> Result<PackedLinear, CompressError> {
    let (out, inn, bits) = (q.rows, q.cols, q.spec.bits as usize);
    let groups = q.groups();
    let (pack_in, pack_out) = match (format, bits) {
        (OutputFormat::Gptq, 4 | 8) => (32 / bits, 32 / bits),
        (OutputFormat::Awq, 4) => (1, 8),
        _ => {
            return Err(invalid(format!(
                "{name}: {bits}-bit grids have no {} packing",
                format.as_str()
            )))
        }
    };
    if inn % pack_in != 0 || out % pack_out != 0 || inn % 32 != 0 {
        return Err(invalid(format!(
            "{name}: a {out}x{inn} matrix does not fit the {} packing (input features a \
             multiple of 32, output features a multiple of {pack_out})",
            format.as_str()
        )));
    }
    let mut zeros = vec![0u8; groups * out];
    let mut scales = vec![f16::ZERO; groups * out];
    for j in 0..out {
        for g in 0..groups {
            let z = q.zeros[j * groups + g];
            if z.fract() != 0.0 || z < 0.0 || z > q.spec.maxq() as f32 {
                return Err(invalid(format!(
                    "{name}: zero point {z} of row {j} group {g} is not an integer code"
                )));
            }
            zeros[g * out + j] = z as u8;
            scales[g * out + j] = f16::from_f32(q.scales[j * groups + g]);
        }
    }
    let code = |j: usize, i: usize| q.codes[j * inn + i] as u32;
    let (qweight, qweight_shape, g_idx) = match format {
        OutputFormat::Awq => {
            let words = out / 8;
            let mut w = vec![0i32; inn * words];
            for i in 0..inn {
                for k in 0..words {
                    let mut word = 0u32;
                    for (p, &o) in AWQ_ORDER.iter().enumerate() {
                        word |= code(8 * k + o, i) << (4 * p);
                    }
                    w[i * words + k] = word as i32;
                }
            }
            (w, [inn, words], None)
        }
        _ => {
            let rows = inn / pack_in;
            let mut w = vec![0i32; rows * out];
            for r in 0..rows {
                for j in 0..out {
                    let mut word = 0u32;
                    for s in 0..pack_in {
                        word |= code(j, r * pack_in + s) << (bits * s);
                    }
                    w[r * out + j] = word as i32;
                }
            }
            let g_idx = q.g_idx.iter().map(|&g| g as i32).collect();
            (w, [rows, out], Some(g_idx))
        }
    };
    Ok(PackedLinear {
        out_features: out,
        in_features: inn,
        groups,
        qweight,
        qweight_shape,
        zeros,
        scales,
        g_idx,
    })
}

impl PackedLinear {
    /// Packed zero points: GPTQ `[groups, out / pack]` (`v1`: stored minus one), AWQ
    /// `[groups, out / 8]` in the interleaved order. `None` when `v1` is asked for and a zero
    /// point is 0.
    pub fn qzeros(&self, format: OutputFormat, bits: usize, v1: bool) -> Option<Vec<i32>> {
        let out = self.out_features;
        let per = 32 / bits;
        let words = out / per;
        let mut w = vec![0i32; self.groups * words];
        for g in 0..self.groups {
            let z = &self.zeros[g * out..(g + 1) * out];
            for k in 0..words {
                let mut word = 0u32;
                // The output column of each field of the word (per <= 8).
                let mut cols = [0usize; 8];
                for (p, c) in cols.iter_mut().enumerate().take(per) {
                    *c = match format {
                        OutputFormat::Awq => 8 * k + AWQ_ORDER[p],
                        _ => k * per + p,
                    };
                }
                for (p, &col) in cols.iter().enumerate().take(per) {
                    let mut v = z[col] as u32;
                    if v1 {
                        v = v.checked_sub(1)?;
                    }
                    word |= v << (bits * p);
                }
                w[g * words + k] = word as i32;
            }
        }
        Some(w)
    }

    /// Whether every zero point is at least 1 (storable as GPTQ v1).
    pub fn v1_storable(&self) -> bool {
        self.zeros.iter().all(|&z| z >= 1)
    }
}

/// `q` with its rows in `order` (row `r` of the result = row `order[r]` of `q`).
pub fn permute_rows(q: &GroupQuantized, order: &[usize]) -> GroupQuantized {
    let (cols, groups) = (q.cols, q.groups());
    let mut p = q.clone();
    for (r, &src) in order.iter().enumerate() {
        p.codes[r * cols..(r + 1) * cols].copy_from_slice(&q.codes[src * cols..(src + 1) * cols]);
        p.scales[r * groups..(r + 1) * groups]
            .copy_from_slice(&q.scales[src * groups..(src + 1) * groups]);
        p.zeros[r * groups..(r + 1) * groups]
            .copy_from_slice(&q.zeros[src * groups..(src + 1) * groups]);
    }
    p
}

/// The row order to write canonical tensor `name` in, when it differs from Pagoda's.
pub fn row_order_for(
    name: &str,
    rows: usize,
    cfg: &ModelConfig,
    from_gguf: bool,
) -> Option<Vec<usize>> {
    if !from_gguf || !pagoda_model::rope_order::gguf_permutes_qk(cfg) {
        return None;
    }
    let sub = name.split('.').nth(2)?;
    match sub {
        "attn_q" => hf_row_order(rows, cfg.n_heads),
        "attn_k" => hf_row_order(rows, cfg.n_kv_heads),
        _ => None,
    }
}

/// The quantized linears and folded tensors of a model, as [`HfExport`] takes them.
#[derive(Debug, Default)]
pub struct HfQuantized {
    /// By canonical name, rows already in Hugging Face order.
    pub packed: BTreeMap<String, PackedLinear>,
    /// By canonical name: (shape, values).
    pub folded: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    pub report: OfflineReport,
}

/// Quantizes `weights` (shaped by `cfg`, read from GGUF when `from_gguf`) with `opts` and
/// packs every matrix for `format` as soon as its layer is done (peak memory: one layer in
/// f32 plus the packed model).
pub fn quantize_for_hf(
    weights: &Weights,
    cfg: &ModelConfig,
    calib: &Calibration<'_>,
    opts: &OfflineOptions,
    format: OutputFormat,
    from_gguf: bool,
    progress: impl FnMut(usize, usize),
) -> Result<HfQuantized, CompressError> {
    let ty = opts.output_type(format)?;
    let mut packed = BTreeMap::new();
    let mut folded = BTreeMap::new();
    let mut report = quantize_layers(weights, cfg, calib, opts, ty, progress, |item| {
        match item {
            Quantized::Matrix { name, q } => {
                let q = match row_order_for(&name, q.rows, cfg, from_gguf) {
                    Some(order) => permute_rows(&q, &order),
                    None => q,
                };
                let p = pack(&q, format, &name)?;
                packed.insert(name, p);
            }
            Quantized::Folded {
                name,
                shape,
                values,
            } => {
                folded.insert(name, (shape, values));
            }
        }
        Ok(())
    })?;
    report.bytes_after = weights
        .iter()
        .map(|v| match packed.get(&v.name) {
            Some(p) => {
                4 * p.qweight.len() as u64
                    + (p.zeros.len() * opts.spec.bits as usize / 8) as u64
                    + 2 * p.scales.len() as u64
            }
            None => 2 * v.n_elements() as u64,
        })
        .sum();
    Ok(HfQuantized {
        packed,
        folded,
        report,
    })
}

/// Where the quantized model came from (what the folder's non-weight files are made from).
pub enum ExportSource<'a> {
    /// A GGUF file: config.json and the tokenizer files are generated from its metadata.
    Gguf {
        tokenizer: &'a Tokenizer,
        chat_template: Option<&'a str>,
    },
    /// A Hugging Face folder: config.json is its own with a `quantization_config`; the
    /// tokenizer files are copied.
    HfFolder {
        dir: &'a Path,
        config_json: &'a Value,
    },
}

/// What [`write_hf_folder`] writes.
pub struct HfExport<'a> {
    pub format: OutputFormat,
    pub spec: GroupSpec,
    pub act_order: bool,
    pub damp: f64,
    /// The source model's weights (canonical names) and shape.
    pub weights: &'a Weights,
    pub cfg: &'a ModelConfig,
    pub source: ExportSource<'a>,
    /// The quantized linears and folded tensors ([`quantize_for_hf`]).
    pub quantized: &'a HfQuantized,
}

/// What was written.
#[derive(Debug, Clone, PartialEq)]
pub struct HfWritten {
    pub bytes: u64,
    /// `"gptq"` (v1), `"gptq_v2"` or `"awq"`.
    pub checkpoint_format: &'static str,
}

/// `OUT.partial` next to `out`.
pub fn partial_path(out: &Path) -> PathBuf {
    let mut name = out
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".partial");
    out.with_file_name(name)
}

/// Writes the folder `out` (see the module docs); an existing `out` is replaced only when
/// `force` is set.
pub fn write_hf_folder(
    e: &HfExport<'_>,
    out: &Path,
    force: bool,
) -> Result<HfWritten, CompressError> {
    write_folder_atomically(out, force, |partial| write_into(e, partial))
}

/// Runs `body` on the folder `OUT.partial` (created empty first; a leftover of an interrupted
/// run is removed) and renames it to `out` when `body` succeeds; on any error the partial
/// folder is removed and `out` is left as it was. An existing `out` is an error unless
/// `force`, and is replaced only after `body` succeeded.
pub fn write_folder_atomically<T>(
    out: &Path,
    force: bool,
    body: impl FnOnce(&Path) -> Result<T, CompressError>,
) -> Result<T, CompressError> {
    if out.exists() && !force {
        return Err(invalid(format!(
            "{} already exists; choose another output or pass --force to replace it",
            out.display()
        )));
    }
    let partial = partial_path(out);
    if partial.exists() {
        // Left by an interrupted run of ours.
        std::fs::remove_dir_all(&partial)
            .or_else(|_| std::fs::remove_file(&partial))
            .map_err(|err| io_error(&partial, err))?;
    }
    let result = std::fs::create_dir_all(&partial)
        .map_err(|err| io_error(&partial, err))
        .and_then(|_| body(&partial))
        .and_then(|written| {
            if out.exists() {
                let removed = if out.is_dir() {
                    std::fs::remove_dir_all(out)
                } else {
                    std::fs::remove_file(out)
                };
                removed.map_err(|err| io_error(out, err))?;
            }
            std::fs::rename(&partial, out).map_err(|err| io_error(out, err))?;
            Ok(written)
        });
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&partial);
    }
    result
}

pub(crate) fn io_error(path: &Path, err: std::io::Error) -> CompressError {
    CompressError::Write {
        path: path.to_path_buf(),
        message: err.to_string(),
    }
}

/// A tensor of the safetensors file and how to make its bytes.
enum Entry<'a> {
    Ints(&'a [i32]),
    OwnedInts(Vec<i32>),
    Halves(&'a [f16]),
    /// A source or folded tensor converted to F16 (rows reordered when `order` is set).
    Float {
        canonical: &'a str,
        order: Option<Vec<usize>>,
    },
}

fn write_into(e: &HfExport<'_>, dir: &Path) -> Result<HfWritten, CompressError> {
    std::fs::create_dir_all(dir).map_err(|err| io_error(dir, err))?;
    let from_gguf = matches!(e.source, ExportSource::Gguf { .. });
    let family = e.cfg.arch.family();
    let cfg = e.cfg;
    if let Some(why) = cfg.irregular_layers() {
        return Err(CompressError::InvalidInput(format!(
            "Hugging Face output of a {} model is not supported yet: {why}",
            cfg.arch.family().display
        )));
    }
    if family.split_fused.is_some() {
        return Err(invalid(format!(
            "Hugging Face output of a {} model is not supported yet (its projections are \
             stored fused); quantize to GGUF is not supported either",
            family.display
        )));
    }
    if from_gguf && family.hf_norm_offset != 0.0 {
        return Err(invalid(format!(
            "Hugging Face output from a {0} GGUF is not supported (its norms are stored \
             with the +1 folded in); use --format gguf, or quantize the Hugging Face folder",
            family.display
        )));
    }
    if from_gguf && e.weights.contains("rope_freqs.weight") {
        return Err(invalid(
            "this GGUF carries Llama 3 RoPE scaling as a rope_freqs tensor, which config.json \
             would need as rope_scaling; Hugging Face output from it is not supported yet — \
             use --format gguf or quantize the Hugging Face folder"
                .into(),
        ));
    }
    let bits = e.spec.bits as usize;
    let checkpoint_format = match e.format {
        OutputFormat::Awq => "awq",
        OutputFormat::Gptq if e.quantized.packed.values().all(PackedLinear::v1_storable) => "gptq",
        OutputFormat::Gptq => {
            tracing::warn!(
                "some groups have zero point 0, which GPTQ v1 (zero - 1 stored) cannot hold: \
                 writing checkpoint_format gptq_v2 (Pagoda and GPTQModel read it; vLLM and \
                 AutoGPTQ may not). --sym avoids this"
            );
            "gptq_v2"
        }
        OutputFormat::Gguf => return Err(invalid("GGUF is not a folder format".into())),
    };
    let v1 = checkpoint_format == "gptq";

    // The tensor list, in the source's order.
    let mut entries: Vec<(String, &'static str, Vec<usize>, Entry<'_>)> = Vec::new();
    for view in e.weights.iter() {
        let canonical = view.name.as_str();
        if canonical == "rope_freqs.weight" {
            continue;
        }
        let hf = hf_name(canonical, e.cfg.arch).ok_or_else(|| {
            invalid(format!(
                "tensor {canonical} has no Hugging Face name; this model cannot be written \
                 as a {} folder",
                e.format.as_str()
            ))
        })?;
        if let Some(p) = e.quantized.packed.get(canonical) {
            let module = hf.strip_suffix(".weight").unwrap_or(&hf);
            let qz = p.qzeros(e.format, bits, v1).ok_or_else(|| {
                invalid(format!(
                    "{canonical}: a zero point 0 cannot be stored as GPTQ v1"
                ))
            })?;
            let per = 32 / bits;
            let zw = if e.format == OutputFormat::Awq {
                p.out_features / 8
            } else {
                p.out_features / per
            };
            entries.push((
                format!("{module}.qweight"),
                "I32",
                p.qweight_shape.to_vec(),
                Entry::Ints(&p.qweight),
            ));
            entries.push((
                format!("{module}.qzeros"),
                "I32",
                vec![p.groups, zw],
                Entry::OwnedInts(qz),
            ));
            entries.push((
                format!("{module}.scales"),
                "F16",
                vec![p.groups, p.out_features],
                Entry::Halves(&p.scales),
            ));
            if let Some(g) = &p.g_idx {
                entries.push((
                    format!("{module}.g_idx"),
                    "I32",
                    vec![p.in_features],
                    Entry::Ints(g),
                ));
            }
            continue;
        }
        let shape = match e.quantized.folded.get(canonical) {
            Some((s, _)) => s.clone(),
            None => view.shape.clone(),
        };
        let order = row_order_for(canonical, shape[0], e.cfg, from_gguf);
        entries.push((hf, "F16", shape, Entry::Float { canonical, order }));
    }

    // Header: offsets from the shapes alone.
    let mut header = Map::new();
    let mut offset = 0usize;
    for (name, dtype, shape, _) in &entries {
        let size = 2 * shape.iter().product::<usize>() * if *dtype == "I32" { 2 } else { 1 };
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}),
        );
        offset += size;
    }
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut header = serde_json::to_vec(&Value::Object(header))
        .map_err(|err| invalid(format!("safetensors header: {err}")))?;
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let st_path = dir.join("model.safetensors");
    let file = std::fs::File::create(&st_path).map_err(|err| io_error(&st_path, err))?;
    let mut w = BufWriter::new(file);
    let io = |err| io_error(&st_path, err);
    w.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&header).map_err(io)?;
    for (_, _, shape, entry) in &entries {
        match entry {
            Entry::Ints(v) => write_i32s(&mut w, v).map_err(io)?,
            Entry::OwnedInts(v) => write_i32s(&mut w, v).map_err(io)?,
            Entry::Halves(v) => write_f16s(&mut w, v.iter().copied()).map_err(io)?,
            Entry::Float { canonical, order } => {
                let owned;
                let values: &[f32] = match e.quantized.folded.get(*canonical) {
                    Some((_, v)) => v,
                    None => {
                        owned = e.weights.get(canonical)?.to_f32()?;
                        &owned
                    }
                };
                match order {
                    Some(order) => {
                        let cols = values.len() / shape[0].max(1);
                        let rows = order
                            .iter()
                            .flat_map(|&r| values[r * cols..(r + 1) * cols].iter().copied());
                        write_f16s(&mut w, rows.map(f16::from_f32)).map_err(io)?
                    }
                    None => {
                        write_f16s(&mut w, values.iter().map(|&x| f16::from_f32(x))).map_err(io)?
                    }
                }
            }
        }
    }
    w.flush().map_err(io)?;
    drop(w);
    let bytes = 8 + header.len() as u64 + offset as u64;

    write_config(e, dir, checkpoint_format)?;
    write_tokenizer_files(e, dir)?;
    Ok(HfWritten {
        bytes,
        checkpoint_format,
    })
}

fn write_i32s(w: &mut impl Write, v: &[i32]) -> std::io::Result<()> {
    for x in v {
        w.write_all(&x.to_le_bytes())?;
    }
    Ok(())
}

fn write_f16s(w: &mut impl Write, v: impl Iterator<Item = f16>) -> std::io::Result<()> {
    for x in v {
        w.write_all(&x.to_le_bytes())?;
    }
    Ok(())
}

pub(crate) fn write_json(path: &Path, v: &Value) -> Result<(), CompressError> {
    let text = serde_json::to_string_pretty(v).map_err(|err| invalid(err.to_string()))?;
    std::fs::write(path, text + "\n").map_err(|err| io_error(path, err))
}

/// The `quantization_config` object of the folder.
pub fn quantization_config(e: &HfExport<'_>, checkpoint_format: &str) -> Value {
    let group: i64 = e.spec.group_size.map_or(-1, |g| g as i64);
    match e.format {
        OutputFormat::Awq => json!({
            "quant_method": "awq",
            "bits": 4,
            "group_size": group,
            "zero_point": true,
            "version": "gemm",
            "modules_to_not_convert": null,
        }),
        _ => json!({
            "quant_method": "gptq",
            "bits": e.spec.bits,
            "group_size": group,
            "desc_act": e.act_order,
            "sym": e.spec.symmetric,
            "damp_percent": e.damp,
            "true_sequential": true,
            "static_groups": false,
            "checkpoint_format": checkpoint_format,
            "quantizer": ["pagoda"],
        }),
    }
}

fn write_config(
    e: &HfExport<'_>,
    dir: &Path,
    checkpoint_format: &str,
) -> Result<(), CompressError> {
    let mut config = match &e.source {
        ExportSource::HfFolder { config_json, .. } => (*config_json).clone(),
        ExportSource::Gguf { tokenizer, .. } => config_from_model(e.cfg, e.weights, tokenizer)?,
    };
    let obj = config
        .as_object_mut()
        .ok_or_else(|| invalid("config.json is not an object".into()))?;
    obj.insert("torch_dtype".into(), json!("float16"));
    if obj.contains_key("dtype") {
        obj.insert("dtype".into(), json!("float16"));
    }
    obj.insert(
        "quantization_config".into(),
        quantization_config(e, checkpoint_format),
    );
    write_json(&dir.join("config.json"), &config)
}

/// A transformers `config.json` for a Llama or Qwen2 model read from GGUF.
fn config_from_model(
    cfg: &ModelConfig,
    weights: &Weights,
    tokenizer: &Tokenizer,
) -> Result<Value, CompressError> {
    let family = cfg.arch.family();
    if family.hf_norm_offset != 0.0 || family.block.activation != Activation::Silu {
        return Err(invalid(format!(
            "config.json for {} from GGUF is not supported",
            family.display
        )));
    }
    let (arch, model_type) = (family.hf_class(), family.hf_model_type());
    let tied = !weights.contains("output.weight");
    let mut c = json!({
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.context_length,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": tied,
        "bos_token_id": tokenizer.bos_id(),
        "eos_token_id": tokenizer.eos_ids().first(),
        "use_cache": true,
    });
    let obj = c
        .as_object_mut()
        .ok_or_else(|| invalid("config.json is not an object".into()))?;
    if family.block.qkv_bias || family.block.qk_norm != pagoda_model::family::QkNorm::None {
        obj.insert("use_sliding_window".into(), json!(false));
    } else {
        obj.insert("attention_bias".into(), json!(false));
        obj.insert("mlp_bias".into(), json!(false));
    }
    if cfg.layer_uses_rope.iter().any(|&r| !r) {
        let flags: Vec<u8> = cfg.layer_uses_rope.iter().map(|&r| u8::from(r)).collect();
        obj.insert("no_rope_layers".into(), json!(flags));
    }
    let scaling = match cfg.rope_scaling {
        RopeScaling::None => Value::Null,
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position,
        }),
        RopeScaling::LongRope {
            ref long_factor,
            ref short_factor,
            original_max_position,
            attention_factor,
        } => json!({
            "rope_type": "longrope",
            "long_factor": long_factor,
            "short_factor": short_factor,
            "original_max_position_embeddings": original_max_position,
            "attention_factor": attention_factor,
        }),
        RopeScaling::Yarn {
            factor,
            original_max_position,
            beta_fast,
            beta_slow,
            attention_factor,
            ..
        } => json!({
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": original_max_position,
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
            "attention_factor": attention_factor,
        }),
    };
    obj.insert("rope_scaling".into(), scaling);
    Ok(c)
}

fn write_tokenizer_files(e: &HfExport<'_>, dir: &Path) -> Result<(), CompressError> {
    match &e.source {
        ExportSource::HfFolder { dir: src, .. } => {
            for f in TOKENIZER_FILES {
                let from = src.join(f);
                if from.is_file() {
                    let to = dir.join(f);
                    std::fs::copy(&from, &to).map_err(|err| io_error(&to, err))?;
                }
            }
            Ok(())
        }
        ExportSource::Gguf {
            tokenizer,
            chat_template,
        } => {
            let path = dir.join("tokenizer.json");
            std::fs::write(&path, tokenizer.to_tokenizer_json()?)
                .map_err(|err| io_error(&path, err))?;
            let mut tc = json!({
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": tokenizer.bos_token(),
                "eos_token": tokenizer.eos_token(),
                "add_bos_token": tokenizer.adds_bos(),
                "add_eos_token": false,
                "clean_up_tokenization_spaces": false,
                "model_max_length": e.cfg.context_length,
            });
            if let (Some(t), Some(obj)) = (chat_template, tc.as_object_mut()) {
                obj.insert("chat_template".into(), json!(t));
            }
            write_json(&dir.join("tokenizer_config.json"), &tc)?;
            let eos = tokenizer.eos_ids();
            write_json(
                &dir.join("generation_config.json"),
                &json!({
                    "bos_token_id": tokenizer.bos_id(),
                    "eos_token_id": if eos.len() == 1 { json!(eos[0]) } else { json!(eos) },
                }),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantize::grid::{rtn, GridKind};

    fn matrix(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| (((i * 7919) % 997) as f32 / 997.0 - 0.5) * 3.0)
            .collect()
    }

    /// The loader's reading of the packings, written from its module doc.
    fn unpack(p: &PackedLinear, format: OutputFormat, bits: usize, v1: bool) -> Vec<u8> {
        let (out, inn) = (p.out_features, p.in_features);
        let mask = (1u32 << bits) - 1;
        let qz = p.qzeros(format, bits, v1).unwrap();
        let per = 32 / bits;
        let zw = if format == OutputFormat::Awq {
            out / 8
        } else {
            out / per
        };
        for g in 0..p.groups {
            for j in 0..out {
                let (word, shift) = match format {
                    OutputFormat::Awq => {
                        let pos = AWQ_ORDER.iter().position(|&o| o == j % 8).unwrap();
                        (qz[g * zw + j / 8] as u32, 4 * pos)
                    }
                    _ => (qz[g * zw + j / per] as u32, bits * (j % per)),
                };
                let z = ((word >> shift) & mask) + v1 as u32;
                assert_eq!(z, p.zeros[g * out + j] as u32);
            }
        }
        let mut codes = vec![0u8; out * inn];
        for j in 0..out {
            for i in 0..inn {
                codes[j * inn + i] = match format {
                    OutputFormat::Awq => {
                        let pos = AWQ_ORDER.iter().position(|&o| o == j % 8).unwrap();
                        ((p.qweight[i * (out / 8) + j / 8] as u32 >> (4 * pos)) & mask) as u8
                    }
                    _ => {
                        ((p.qweight[(i / per) * out + j] as u32 >> (bits * (i % per))) & mask) as u8
                    }
                };
            }
        }
        codes
    }

    #[test]
    fn packings_unpack_to_the_codes_and_zeros() {
        for (format, bits, sym) in [
            (OutputFormat::Gptq, 4, false),
            (OutputFormat::Gptq, 4, true),
            (OutputFormat::Gptq, 8, true),
            (OutputFormat::Awq, 4, false),
        ] {
            let (rows, cols) = (16, 64);
            let spec = GroupSpec {
                bits,
                group_size: Some(32),
                symmetric: sym,
                grid: GridKind::IntegerZero,
                clip_search: false,
            };
            let q = rtn(&matrix(rows, cols), rows, cols, spec).unwrap();
            let p = pack(&q, format, "t").unwrap();
            let v1 = format == OutputFormat::Gptq && p.v1_storable();
            assert_eq!(unpack(&p, format, bits as usize, v1), q.codes, "{format:?}");
        }
    }

    #[test]
    fn zero_point_zero_has_no_v1_encoding() {
        // All values non-negative: the asymmetric grid's zero point is 0.
        let w: Vec<f32> = (0..8 * 32).map(|i| (i % 17) as f32).collect();
        let spec = GroupSpec {
            bits: 4,
            group_size: Some(32),
            symmetric: false,
            grid: GridKind::IntegerZero,
            clip_search: false,
        };
        let p = pack(&rtn(&w, 8, 32, spec).unwrap(), OutputFormat::Gptq, "t").unwrap();
        assert!(!p.v1_storable());
        assert!(p.qzeros(OutputFormat::Gptq, 4, true).is_none());
        assert!(p.qzeros(OutputFormat::Gptq, 4, false).is_some());
    }

    #[test]
    fn rope_row_order_undoes_llama_cpp_permute() {
        // llama.cpp: w.reshape(n_head, 2, hd/2, ...).swapaxes(1, 2): GGUF row (h, i, j) is HF
        // row (h, j, i).
        let (n_head, hd) = (2, 8);
        let hf: Vec<usize> = (0..n_head * hd).collect();
        let mut gguf = vec![0; hf.len()];
        for h in 0..n_head {
            for i in 0..hd / 2 {
                for j in 0..2 {
                    gguf[h * hd + i * 2 + j] = hf[h * hd + j * hd / 2 + i];
                }
            }
        }
        let order = hf_row_order(n_head * hd, n_head).unwrap();
        let back: Vec<usize> = order.iter().map(|&r| gguf[r]).collect();
        assert_eq!(back, hf);
    }

    #[test]
    fn bad_shapes_are_refused() {
        let spec = GroupSpec {
            bits: 4,
            group_size: None,
            symmetric: true,
            grid: GridKind::IntegerZero,
            clip_search: false,
        };
        let q = rtn(&matrix(4, 64), 4, 64, spec).unwrap();
        let e = pack(&q, OutputFormat::Awq, "blk.0.attn_q.weight").unwrap_err();
        assert!(e.to_string().contains("multiple of 8"), "{e}");
    }
}
