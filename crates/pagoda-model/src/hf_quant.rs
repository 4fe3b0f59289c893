//! GPTQ and AWQ checkpoints in Hugging Face folders, loaded directly: `config.json`'s
//! `quantization_config` (or a separate `quantize_config.json`) names the scheme, and each
//! quantized linear layer — `<module>.qweight`, `.qzeros`, `.scales` (and GPTQ's `.g_idx`) — is
//! turned into one weight matrix `<module>.weight` of a block format the kernels multiply by.
//!
//! The published packings, read exactly (`in` = in_features, `out` = out_features, `pack` =
//! 32 / bits, all integers little-endian `I32`, codes unsigned):
//!
//! ```text
//! GPTQ (AutoGPTQ / GPTQModel / optimum, `checkpoint_format` "gptq" = v1 or "gptq_v2"), bits 4 or 8
//!   qweight  I32 [in / pack, out]    q[i][j] = (qweight[i / pack][j] >> (bits * (i % pack))) & mask
//!   qzeros   I32 [groups, out / pack] z[g][j] = (qzeros[g][j / pack] >> (bits * (j % pack))) & mask
//!                                     v1 stores zero - 1: zero = z + 1 (not masked again, so a
//!                                     stored 0xF reads as 16, as AutoGPTQ's own kernels do); v2: zero = z
//!   scales   F16 [groups, out]
//!   g_idx    I32 [in]                 group of input column i (act-order / desc_act: not
//!                                     monotone); absent: i / group_size
//!   w[j][i] = scales[g][j] * (q[i][j] - zero[g][j]),  g = g_idx[i]
//! AWQ GEMM (AutoAWQ `version: gemm`, `zero_point: true`), bits 4
//!   qweight  I32 [in, out / 8]        packed along the OUTPUT dimension, interleaved: nibble p
//!                                     (bits 4p..4p+3) of word k holds column 8k + [0,2,4,6,1,3,5,7][p]
//!   qzeros   I32 [groups, out / 8]    same order
//!   scales   F16 [groups, out]        group of input column i: i / group_size
//!   w[j][i] = scales[g][j] * (q[i][j] - z[g][j])
//! group_size -1: one group for the whole input dimension.
//! ```
//!
//! What the kernels get (Pagoda's matrices are `[out, in]`, blocks of 32 input columns):
//! - 4 bits, every 32-column block inside one group → Q4_1, exact but for one rounding:
//!   `qs` = the codes, `d` = the scale (already f16), `m = -scale * zero` computed exactly in
//!   f32 and rounded to f16 — at most half an f16 ulp of `scale * zero` (≤ scale · 2^-7 for
//!   zero ≤ 16, under 1/128 of a quantization step; none at all for the symmetric zero 8).
//! - 8 bits → Q8_0. A one-group block whose `q - zero` all fit in i8 (always for symmetric,
//!   zero 128) is exact: `qs = q - zero`, `d` = scale.
//! - 4 bits with act-order (`g_idx` not in runs of 32, so blocks straddle groups) → Q8_0 for
//!   the whole matrix: one-group blocks exactly as above (`q - zero` ∈ [-16, 15]), straddling
//!   blocks dequantized to f32 and re-quantized by the kernels' reference Q8_0 quantizer (error
//!   ≤ half a step of 1/127 of the block's largest |w|). Re-quantizing to Q4_1 instead would add
//!   an error as large as GPTQ's own (measured on the tiny golden: logits 20% off against 2%),
//!   so such checkpoints take 1.7× the memory of Q4_1. [`CheckpointQuantReport`] counts the
//!   re-quantized blocks and a tracing line says so. (Future work: permute the input columns by
//!   `g_idx` once and the activations in the forward pass, which would keep act-order
//!   checkpoints exact in Q4_1.)
//! - 8-bit blocks whose offsets leave i8 (asymmetric) are re-quantized the same way.
//!
//! Invariants: the checkpoint is untrusted input — every shape is checked against the others
//! before any index is computed, `g_idx` entries are bounds-checked, and every error names the
//! file and the tensor at fault. Unsupported options (GPTQ bits other than 4/8, AWQ other than
//! 4-bit GEMM with zero points, Marlin/exllama/bitblas formats; group sizes that are not -1
//! or a multiple of 32; in_features not a multiple of 32) are errors naming the option.

use crate::safetensors::RawTensor;
use crate::weights::TensorView;
use crate::ModelError;
use half::f16;
use pagoda_kernels::quant::{blocks_as_bytes, Block, BlockQ4_1, BlockQ8_0};
use pagoda_kernels::GgmlType;
use rayon::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Which published packing a checkpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMethod {
    /// GPTQ; `v1` = AutoGPTQ's "gptq" checkpoint format (zeros stored minus one).
    Gptq { v1: bool },
    /// AutoAWQ GEMM packing.
    AwqGemm,
}

/// A checkpoint's `quantization_config`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointQuant {
    pub method: QuantMethod,
    pub bits: u32,
    /// `None`: one group per row (`group_size: -1`).
    pub group_size: Option<usize>,
    pub desc_act: bool,
    pub sym: bool,
}

/// What loading a quantized checkpoint did (shown by the loader).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointQuantReport {
    pub scheme: CheckpointQuant,
    /// Quantized linear layers converted.
    pub linears: usize,
    /// Of those, loaded as Q4_1 (the rest as Q8_0).
    pub linears_q4_1: usize,
    /// 32-column blocks carried over code for code.
    pub exact_blocks: u64,
    /// Blocks dequantized and re-quantized (act-order groups, 8-bit offsets outside i8).
    pub requantized_blocks: u64,
    /// Linear layers with at least one re-quantized block.
    pub requantized_linears: Vec<String>,
    /// Bytes of all the folder's weights as loaded (converted linears and the rest).
    pub weight_bytes: u64,
}

impl std::fmt::Display for CheckpointQuant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.method {
            QuantMethod::Gptq { v1: true } => "GPTQ",
            QuantMethod::Gptq { v1: false } => "GPTQ v2",
            QuantMethod::AwqGemm => "AWQ GEMM",
        };
        write!(f, "{name} {}-bit", self.bits)?;
        match self.group_size {
            Some(g) => write!(f, ", group {g}")?,
            None => write!(f, ", one group per row")?,
        }
        if self.desc_act {
            write!(f, ", act-order")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for CheckpointQuantReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let q8 = self.linears - self.linears_q4_1;
        let types = match (self.linears_q4_1, q8) {
            (_, 0) => "Q4_1".to_string(),
            (0, _) => "Q8_0".to_string(),
            (a, b) => format!("Q4_1 ({a}) and Q8_0 ({b})"),
        };
        write!(
            f,
            "{} checkpoint: {} linear layers loaded as {types}, {} blocks exact",
            self.scheme, self.linears, self.exact_blocks
        )?;
        if self.requantized_blocks > 0 {
            write!(
                f,
                ", {} blocks dequantized and re-quantized to Q8_0 (groups not in runs of 32 \
                 columns, or 8-bit offsets outside i8) in {} layers",
                self.requantized_blocks,
                self.requantized_linears.len()
            )?;
        }
        Ok(())
    }
}

impl CheckpointQuantReport {
    /// The block format most quantized linears became.
    pub fn target_type(&self) -> GgmlType {
        if self.linears_q4_1 * 2 > self.linears {
            GgmlType::Q4_1
        } else {
            GgmlType::Q8_0
        }
    }
}

/// The suffixes of a quantized linear's tensors.
const PARTS: [&str; 4] = ["qweight", "qzeros", "scales", "g_idx"];

/// `Some((module, part))` when `name` is one of a quantized linear's tensors.
pub fn split_part(name: &str) -> Option<(&str, &str)> {
    let (module, part) = name.rsplit_once('.')?;
    PARTS.contains(&part).then_some((module, part))
}

impl CheckpointQuant {
    /// The scheme of folder `dir` from `config_json`'s `quantization_config`, or from
    /// `quantize_config.json` (older AutoGPTQ); `Ok(None)` for an unquantized model.
    pub fn from_folder(dir: &Path, config_json: &Value) -> Result<Option<Self>, ModelError> {
        if let Some(q) = config_json.get("quantization_config") {
            return Self::parse(q, &dir.join("config.json"), None).map(Some);
        }
        let separate = dir.join("quantize_config.json");
        if separate.is_file() {
            let bytes = std::fs::read(&separate).map_err(|source| ModelError::Io {
                path: separate.clone(),
                source,
            })?;
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| ModelError::Format {
                path: separate.clone(),
                message: format!("not valid JSON: {e}"),
            })?;
            return Self::parse(&v, &separate, Some("gptq")).map(Some);
        }
        Ok(None)
    }

    /// Validates one `quantization_config` object; `path` names it in errors; `default_method`
    /// applies when it has no `quant_method`.
    pub fn parse(q: &Value, path: &Path, default_method: Option<&str>) -> Result<Self, ModelError> {
        let err = |message: String| ModelError::Format {
            path: path.to_path_buf(),
            message: format!("quantization_config: {message}"),
        };
        let method = q
            .get("quant_method")
            .and_then(Value::as_str)
            .or(default_method)
            .ok_or_else(|| err("no \"quant_method\"".into()))?
            .to_ascii_lowercase();
        let bits = q
            .get("bits")
            .and_then(Value::as_u64)
            .ok_or_else(|| err("no integer \"bits\"".into()))?;
        let group_size = match q.get("group_size").and_then(Value::as_i64) {
            Some(-1) => None,
            Some(g) if g > 0 && g % 32 == 0 => Some(g as usize),
            Some(g) => {
                return Err(err(format!(
                    "group_size {g} is not supported (-1 or a positive multiple of 32, as the \
                     32-column blocks of the kernels need)"
                )))
            }
            None => return Err(err("no integer \"group_size\"".into())),
        };
        let flag = |k: &str, default: bool| q.get(k).and_then(Value::as_bool).unwrap_or(default);
        match method.as_str() {
            "gptq" => {
                if bits != 4 && bits != 8 {
                    return Err(err(format!("GPTQ bits {bits} is not supported (4 or 8)")));
                }
                let format = q
                    .get("checkpoint_format")
                    .or_else(|| q.get("format"))
                    .and_then(Value::as_str)
                    .unwrap_or("gptq")
                    .to_ascii_lowercase();
                let v1 = match format.as_str() {
                    "gptq" => true,
                    "gptq_v2" => false,
                    other => {
                        return Err(err(format!(
                            "GPTQ checkpoint_format {other:?} is not supported (\"gptq\" or \
                             \"gptq_v2\")"
                        )))
                    }
                };
                Ok(CheckpointQuant {
                    method: QuantMethod::Gptq { v1 },
                    bits: bits as u32,
                    group_size,
                    desc_act: flag("desc_act", false),
                    sym: flag("sym", true),
                })
            }
            "awq" => {
                if bits != 4 {
                    return Err(err(format!("AWQ bits {bits} is not supported (4)")));
                }
                let version = q
                    .get("version")
                    .and_then(Value::as_str)
                    .unwrap_or("gemm")
                    .to_ascii_lowercase();
                if version != "gemm" {
                    return Err(err(format!(
                        "AWQ version {version:?} is not supported (\"gemm\"; GEMV, Marlin and \
                         exllama packings are not read)"
                    )));
                }
                if !flag("zero_point", true) {
                    return Err(err(
                        "AWQ zero_point false is not supported (zero_point true)".into(),
                    ));
                }
                Ok(CheckpointQuant {
                    method: QuantMethod::AwqGemm,
                    bits: 4,
                    group_size,
                    desc_act: false,
                    sym: false,
                })
            }
            other => Err(err(format!(
                "quant_method {other:?} is not supported (\"gptq\" or \"awq\")"
            ))),
        }
    }
}

/// One tensor of a quantized linear, with the file it came from.
#[derive(Debug)]
pub enum Part {
    Int(RawTensor, PathBuf),
    Float(TensorView, PathBuf),
}

impl Part {
    fn path(&self) -> &Path {
        match self {
            Part::Int(_, p) | Part::Float(_, p) => p,
        }
    }
}

/// The parts of every quantized linear of a folder, collected across shards by module name.
#[derive(Debug, Default)]
pub struct QuantLinears {
    modules: BTreeMap<String, BTreeMap<String, Part>>,
}

impl QuantLinears {
    /// Adds `part` under its name's module; a part seen twice is an error naming both files.
    pub fn add(&mut self, name: &str, part: Part) -> Result<(), ModelError> {
        let Some((module, kind)) = split_part(name) else {
            return Err(ModelError::Tensor {
                path: part.path().to_path_buf(),
                tensor: name.to_string(),
                message: "is not a part of a quantized linear layer".into(),
            });
        };
        let entry = self.modules.entry(module.to_string()).or_default();
        if let Some(prev) = entry.get(kind) {
            return Err(ModelError::Tensor {
                path: part.path().to_path_buf(),
                tensor: name.to_string(),
                message: format!("appears twice (also in {})", prev.path().display()),
            });
        }
        entry.insert(kind.to_string(), part);
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// Converts every collected linear into a `<module>.weight` view (HF names; the caller
    /// maps them), with the report.
    pub fn convert(
        self,
        scheme: &CheckpointQuant,
        dir: &Path,
    ) -> Result<(Vec<(TensorView, PathBuf)>, CheckpointQuantReport), ModelError> {
        let mut report = CheckpointQuantReport {
            scheme: *scheme,
            linears: 0,
            linears_q4_1: 0,
            exact_blocks: 0,
            requantized_blocks: 0,
            requantized_linears: Vec::new(),
            weight_bytes: 0,
        };
        let mut out = Vec::with_capacity(self.modules.len());
        for (module, parts) in self.modules {
            let (view, path, exact, requant) = convert_linear(scheme, &module, parts, dir)?;
            report.linears += 1;
            if view.ty == GgmlType::Q4_1 {
                report.linears_q4_1 += 1;
            }
            report.exact_blocks += exact;
            report.requantized_blocks += requant;
            if requant > 0 {
                report.requantized_linears.push(module);
            }
            out.push((view, path));
        }
        if report.requantized_blocks > 0 {
            tracing::warn!(
                scheme = %scheme,
                blocks = report.requantized_blocks,
                layers = report.requantized_linears.len(),
                "quantized checkpoint: some blocks straddle groups (act-order) or leave i8; \
                 dequantized and re-quantized to Q8_0, not exact"
            );
        }
        Ok((out, report))
    }
}

/// Decoded, validated integer and scale data of one linear.
struct Linear {
    bits: u32,
    in_f: usize,
    out_f: usize,
    groups: usize,
    /// Group of each input column.
    group_of: Vec<u32>,
    /// `[groups, out]` f32 (f16 values).
    scales: Vec<f32>,
    /// `[groups, out]` zero points as integers.
    zeros: Vec<i32>,
    /// `[out, in]` codes (row j = output j), unpacked.
    codes: Vec<u8>,
}

fn convert_linear(
    scheme: &CheckpointQuant,
    module: &str,
    mut parts: BTreeMap<String, Part>,
    dir: &Path,
) -> Result<(TensorView, PathBuf, u64, u64), ModelError> {
    let is_awq = scheme.method == QuantMethod::AwqGemm;
    let qweight_path = parts
        .get("qweight")
        .map(|p| p.path().to_path_buf())
        .unwrap_or_else(|| dir.to_path_buf());
    let mut take_int = |kind: &str| -> Result<Option<(RawTensor, PathBuf)>, ModelError> {
        match parts.remove(kind) {
            None => Ok(None),
            Some(Part::Int(t, p)) if t.dtype == "I32" => Ok(Some((t, p))),
            Some(Part::Int(t, p)) => Err(ModelError::Tensor {
                path: p,
                tensor: t.name.clone(),
                message: format!("dtype {} is not the I32 the packing needs", t.dtype),
            }),
            Some(Part::Float(t, p)) => Err(ModelError::Tensor {
                path: p,
                tensor: t.name.clone(),
                message: format!("dtype {} is not the I32 the packing needs", t.ty),
            }),
        }
    };
    let missing = |kind: &str| ModelError::Tensor {
        path: qweight_path.clone(),
        tensor: format!("{module}.{kind}"),
        message: format!(
            "missing: a {} linear layer needs {module}.qweight, .qzeros and .scales",
            if is_awq { "AWQ" } else { "GPTQ" }
        ),
    };
    let (qweight, qw_path) = take_int("qweight")?.ok_or_else(|| missing("qweight"))?;
    let (qzeros, qz_path) = take_int("qzeros")?.ok_or_else(|| missing("qzeros"))?;
    let g_idx = take_int("g_idx")?;
    let (scales, sc_path) = match parts.remove("scales") {
        Some(Part::Float(t, p)) => (t, p),
        Some(Part::Int(t, p)) => {
            return Err(ModelError::Tensor {
                path: p,
                tensor: t.name.clone(),
                message: format!("dtype {} is not a float type (F16)", t.dtype),
            })
        }
        None => return Err(missing("scales")),
    };
    let shape_err = |path: &Path, tensor: &str, message: String| ModelError::Tensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        message,
    };
    let bits = scheme.bits;
    let pack = (32 / bits) as usize;
    let mask = (1u32 << bits) - 1;
    let [qr, qc] = qweight.shape[..] else {
        return Err(shape_err(
            &qw_path,
            &qweight.name,
            format!("shape {:?} is not 2-D", qweight.shape),
        ));
    };
    // GPTQ packs along the input dimension, AWQ along the output one.
    let (in_f, out_f) = if is_awq {
        (qr, qc.saturating_mul(pack))
    } else {
        (qr.saturating_mul(pack), qc)
    };
    if in_f == 0 || out_f == 0 || in_f % 32 != 0 || in_f > 1 << 24 || out_f > 1 << 24 {
        return Err(shape_err(
            &qw_path,
            &qweight.name,
            format!(
                "shape {:?} gives in_features {in_f}, out_features {out_f}: both must be \
                 positive and at most 2^24, in_features a multiple of 32",
                qweight.shape
            ),
        ));
    }
    let [sg, so] = scales.shape[..] else {
        return Err(shape_err(
            &sc_path,
            &scales.name,
            format!("shape {:?} is not 2-D", scales.shape),
        ));
    };
    let groups = sg;
    let expect_groups = scheme.group_size.map_or(1, |g| in_f.div_ceil(g));
    // GPTQ with g_idx may have any number of groups the g_idx entries index; without, the
    // count follows from group_size.
    if so != out_f || groups == 0 || (g_idx.is_none() && groups != expect_groups) {
        return Err(shape_err(
            &sc_path,
            &scales.name,
            format!(
                "shape {:?} does not fit qweight {:?}: want [{expect_groups}, {out_f}]",
                scales.shape, qweight.shape
            ),
        ));
    }
    if qzeros.shape[..] != [groups, out_f / pack] || out_f % pack != 0 {
        return Err(shape_err(
            &qz_path,
            &qzeros.name,
            format!(
                "shape {:?} does not fit qweight {:?} and scales {:?}: want [{groups}, {}]",
                qzeros.shape,
                qweight.shape,
                scales.shape,
                out_f / pack
            ),
        ));
    }
    let group_of: Vec<u32> = match (&g_idx, is_awq) {
        (Some((g, g_path)), false) => {
            if g.shape[..] != [in_f] {
                return Err(shape_err(
                    g_path,
                    &g.name,
                    format!("shape {:?} is not [{in_f}] (in_features)", g.shape),
                ));
            }
            let vals = g.to_i32().unwrap_or_default();
            let mut out = Vec::with_capacity(in_f);
            for (i, &v) in vals.iter().enumerate() {
                if v < 0 || v as usize >= groups {
                    return Err(shape_err(
                        g_path,
                        &g.name,
                        format!("entry {i} is {v}, outside the {groups} groups of scales"),
                    ));
                }
                out.push(v as u32);
            }
            out
        }
        (Some((g, g_path)), true) => {
            return Err(shape_err(
                g_path,
                &g.name,
                "AWQ checkpoints have no g_idx".into(),
            ))
        }
        (None, _) => {
            let gs = scheme.group_size.unwrap_or(in_f);
            (0..in_f).map(|i| (i / gs) as u32).collect()
        }
    };
    if let Some((name, part)) = parts.into_iter().next() {
        return Err(shape_err(
            part.path(),
            &format!("{module}.{name}"),
            "unexpected part of a quantized linear layer".into(),
        ));
    }
    let scales_f32 = scales.to_f32()?;
    let qw = qweight.to_i32().unwrap_or_default();
    let qz = qzeros.to_i32().unwrap_or_default();
    let v1 = matches!(scheme.method, QuantMethod::Gptq { v1: true });
    // AWQ: column c of a word sits in nibble AWQ_NIBBLE[c] (the inverse of [0,2,4,6,1,3,5,7]).
    const AWQ_NIBBLE: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
    let code_along_out = |word: i32, j: usize| -> u32 {
        let shift = if is_awq {
            4 * AWQ_NIBBLE[j % 8]
        } else {
            bits * (j % pack) as u32
        };
        ((word as u32) >> shift) & mask
    };
    let mut zeros = vec![0i32; groups * out_f];
    for g in 0..groups {
        for j in 0..out_f {
            let z = code_along_out(qz[g * (out_f / pack) + j / pack], j) as i32;
            zeros[g * out_f + j] = if v1 { z + 1 } else { z };
        }
    }
    // [out, in] codes. Both packings keep neighbouring output columns in neighbouring words
    // of one input row, so each task takes a strip of output rows and walks the input rows:
    // reads stay contiguous and the strip's rows stay in cache.
    const STRIP: usize = 64;
    let mut codes = vec![0u8; out_f * in_f];
    codes
        .par_chunks_mut(in_f * STRIP)
        .enumerate()
        .for_each(|(s, strip)| {
            let j0 = s * STRIP;
            let rows = strip.len() / in_f;
            for i in 0..in_f {
                for r in 0..rows {
                    let j = j0 + r;
                    strip[r * in_f + i] = if is_awq {
                        code_along_out(qw[i * (out_f / pack) + j / pack], j) as u8
                    } else {
                        (((qw[(i / pack) * out_f + j] as u32) >> (bits * (i % pack) as u32)) & mask)
                            as u8
                    };
                }
            }
        });
    let lin = Linear {
        bits,
        in_f,
        out_f,
        groups,
        group_of,
        scales: scales_f32,
        zeros,
        codes,
    };
    let (ty, data, exact, requant) = lin.to_blocks();
    let view = TensorView::owned(format!("{module}.weight"), ty, vec![out_f, in_f], data)
        .map_err(|message| shape_err(&qw_path, &qweight.name, message))?;
    Ok((view, qw_path, exact, requant))
}

impl Linear {
    /// The matrix `[out, in]` as Q4_1 rows (4 bits, every block in one group) or Q8_0 rows;
    /// the type, the bytes, and the exact and re-quantized block counts.
    fn to_blocks(&self) -> (GgmlType, Vec<u8>, u64, u64) {
        let nb = self.in_f / 32;
        // The one group of each 32-column block, or None when the block straddles groups.
        let block_group: Vec<Option<u32>> = self
            .group_of
            .chunks_exact(32)
            .map(|c| c.iter().all(|&g| g == c[0]).then_some(c[0]))
            .collect();
        debug_assert!(block_group.len() == nb && self.groups > 0);
        let q4_1 = self.bits == 4 && block_group.iter().all(Option::is_some);
        let (ty, block_bytes) = if q4_1 {
            (GgmlType::Q4_1, BlockQ4_1::BYTES)
        } else {
            (GgmlType::Q8_0, BlockQ8_0::BYTES)
        };
        let row_bytes = nb * block_bytes;
        let mut data = vec![0u8; self.out_f * row_bytes];
        let counts: Vec<(u64, u64)> = data
            .par_chunks_mut(row_bytes)
            .enumerate()
            .map(|(j, row)| {
                if q4_1 {
                    self.row_q4_1(j, &block_group, row)
                } else {
                    self.row_q8_0(j, &block_group, row)
                }
            })
            .collect();
        let (exact, requant) = counts.iter().fold((0, 0), |(a, b), &(x, y)| (a + x, b + y));
        (ty, data, exact, requant)
    }

    fn weight(&self, j: usize, i: usize) -> f32 {
        let g = self.group_of[i] as usize * self.out_f + j;
        self.scales[g] * (self.codes[j * self.in_f + i] as i32 - self.zeros[g]) as f32
    }

    /// Row `j` as Q8_0: one-group blocks whose `q - zero` fit in i8 exactly, others
    /// re-quantized from f32.
    fn row_q8_0(&self, j: usize, block_group: &[Option<u32>], row: &mut [u8]) -> (u64, u64) {
        let (mut exact, mut requant) = (0u64, 0u64);
        let codes = &self.codes[j * self.in_f..(j + 1) * self.in_f];
        let mut x = [0f32; 32];
        let mut blocks = Vec::with_capacity(block_group.len());
        for (b, g) in block_group.iter().enumerate() {
            let c = &codes[b * 32..(b + 1) * 32];
            let exact_block = g.and_then(|g| {
                let k = g as usize * self.out_f + j;
                let (s, z) = (self.scales[k], self.zeros[k]);
                let mut qs = [0u8; 32];
                for (q, &code) in qs.iter_mut().zip(c) {
                    *q = i8::try_from(code as i32 - z).ok()? as u8;
                }
                Some(BlockQ8_0 {
                    d: f16::from_f32(s).to_le_bytes(),
                    qs,
                })
            });
            blocks.push(match exact_block {
                Some(blk) => {
                    exact += 1;
                    blk
                }
                None => {
                    requant += 1;
                    for (t, v) in x.iter_mut().enumerate() {
                        *v = self.weight(j, b * 32 + t);
                    }
                    BlockQ8_0::quantize(&x).unwrap_or(BlockQ8_0 {
                        d: [0; 2],
                        qs: [0; 32],
                    })
                }
            });
        }
        row.copy_from_slice(blocks_as_bytes(&blocks));
        (exact, requant)
    }

    /// Row `j` as Q4_1; every block lies in one group. A block whose `m` overflows f16 (a
    /// scale near f16's limit) is re-quantized from f32.
    fn row_q4_1(&self, j: usize, block_group: &[Option<u32>], row: &mut [u8]) -> (u64, u64) {
        let (mut exact, mut requant) = (0u64, 0u64);
        let codes = &self.codes[j * self.in_f..(j + 1) * self.in_f];
        let mut x = [0f32; 32];
        let mut blocks = Vec::with_capacity(block_group.len());
        for (b, g) in block_group.iter().enumerate() {
            let c = &codes[b * 32..(b + 1) * 32];
            let exact_block = g.and_then(|g| {
                let k = g as usize * self.out_f + j;
                let (s, z) = (self.scales[k], self.zeros[k]);
                // s is an f16 value and 0 <= z <= 16: s * z is exact in f32; rounding it to
                // f16 is the one inexact step.
                let m = f16::from_f32(-s * z as f32);
                if !m.is_finite() {
                    return None;
                }
                let mut qs = [0u8; 16];
                for (t, q) in qs.iter_mut().enumerate() {
                    *q = (c[t] & 0x0F) | (c[t + 16] << 4);
                }
                Some(BlockQ4_1 {
                    d: f16::from_f32(s).to_le_bytes(),
                    m: m.to_le_bytes(),
                    qs,
                })
            });
            blocks.push(match exact_block {
                Some(blk) => {
                    exact += 1;
                    blk
                }
                None => {
                    requant += 1;
                    for (t, v) in x.iter_mut().enumerate() {
                        *v = self.weight(j, b * 32 + t);
                    }
                    BlockQ4_1::quantize(&x).unwrap_or(BlockQ4_1 {
                        d: [0; 2],
                        m: [0; 2],
                        qs: [0; 16],
                    })
                }
            });
        }
        row.copy_from_slice(blocks_as_bytes(&blocks));
        (exact, requant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<CheckpointQuant, String> {
        CheckpointQuant::parse(&v, Path::new("config.json"), None).map_err(|e| e.to_string())
    }

    #[test]
    fn parses_supported_configs() {
        let q = parse(json!({"quant_method": "gptq", "bits": 4, "group_size": 128,
            "desc_act": true, "sym": true, "checkpoint_format": "gptq"}))
        .unwrap();
        assert_eq!(q.method, QuantMethod::Gptq { v1: true });
        assert_eq!(q.group_size, Some(128));
        assert!(q.desc_act);
        let q = parse(json!({"quant_method": "gptq", "bits": 8, "group_size": -1,
            "checkpoint_format": "gptq_v2"}))
        .unwrap();
        assert_eq!(q.method, QuantMethod::Gptq { v1: false });
        assert_eq!(q.group_size, None);
        let q = parse(json!({"quant_method": "awq", "bits": 4, "group_size": 64,
            "version": "GEMM", "zero_point": true}))
        .unwrap();
        assert_eq!(q.method, QuantMethod::AwqGemm);
    }

    #[test]
    fn unsupported_options_are_named() {
        for (v, needle) in [
            (
                json!({"quant_method": "gptq", "bits": 3, "group_size": 128}),
                "bits 3",
            ),
            (
                json!({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}),
                "\"gemv\"",
            ),
            (
                json!({"quant_method": "awq", "bits": 8, "group_size": 128}),
                "AWQ bits 8",
            ),
            (
                json!({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": false}),
                "zero_point",
            ),
            (
                json!({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}),
                "marlin",
            ),
            (
                json!({"quant_method": "gptq", "bits": 4, "group_size": 48}),
                "group_size 48",
            ),
            (
                json!({"quant_method": "bitsandbytes", "bits": 4, "group_size": 64}),
                "bitsandbytes",
            ),
        ] {
            let e = parse(v).unwrap_err();
            assert!(e.contains(needle) && e.contains("config.json"), "{e}");
        }
    }

    #[test]
    fn parts_are_recognised() {
        assert_eq!(
            split_part("model.layers.0.mlp.up_proj.qweight"),
            Some(("model.layers.0.mlp.up_proj", "qweight"))
        );
        assert_eq!(split_part("model.layers.0.mlp.up_proj.weight"), None);
    }
}
