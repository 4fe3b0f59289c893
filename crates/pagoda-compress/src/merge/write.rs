//! Writing a merged model: [`merge_lora`] plans the merge, then streams every tensor of the
//! base to the output — a GGUF file (the base's metadata, untouched tensors byte for byte in
//! their own types) or a Hugging Face folder (one `model.safetensors` under the HF names,
//! config.json without its `quantization_config`, the tokenizer files copied).
//! [`write_edited`] is the same writer for any [`TensorEdits`] (pagoda-train writes a fully
//! fine-tuned student through it, with [`Replaced`] tensors).
//!
//! Invariants: nothing is written before the plan passed (an adapter that does not fit the
//! base leaves no file); the output appears only when complete (`OUT.partial`, renamed; on any
//! error removed); one tensor is made at a time, so peak memory is the mapped base plus one
//! tensor in f32 and its encoded copy; an edited 1-D tensor (a norm, a bias) is written in
//! F32 whatever the dtype, as llama.cpp's converter writes them.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use pagoda_kernels::GgmlType;
use pagoda_model::gguf::{GgufFile, GgufValue, GgufWriter};
use pagoda_model::hf::{hf_name, HfFolder};
use pagoda_model::lora::LoraAdapter;
use pagoda_model::safetensors::write_safetensors_streamed;
use pagoda_model::weights::{TensorView, Weights};
use serde_json::{json, Value};

use super::{encode, MergeBase, MergeDtype, MergePlan, PlannedModule};
use crate::quantize::hf_write::{io_error, write_folder_atomically, write_json, TOKENIZER_FILES};
use crate::quantize::write::{file_type_id, write_file_atomically};
use crate::CompressError;

/// What a written model changes of its base: LoRA modules merged in ([`MergePlan`]), or
/// whole tensors replaced ([`Replaced`]).
pub trait TensorEdits {
    /// Whether the base tensor `name` (canonical) is changed.
    fn touches(&self, name: &str) -> bool;
    /// `view`'s new values in f32, `None` for a tensor left as it is.
    fn edited(&self, view: &TensorView) -> Result<Option<Vec<f32>>, CompressError>;
}

impl TensorEdits for MergePlan {
    fn touches(&self, name: &str) -> bool {
        MergePlan::touches(self, name)
    }

    fn edited(&self, view: &TensorView) -> Result<Option<Vec<f32>>, CompressError> {
        self.merged(view)
    }
}

/// Whole tensors replaced by new f32 values (canonical name → values in the base's row
/// order and shape).
#[derive(Debug, Default)]
pub struct Replaced(pub BTreeMap<String, Vec<f32>>);

impl TensorEdits for Replaced {
    fn touches(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    fn edited(&self, view: &TensorView) -> Result<Option<Vec<f32>>, CompressError> {
        match self.0.get(&view.name) {
            None => Ok(None),
            Some(v) if v.len() != view.n_elements() => Err(CompressError::InvalidInput(format!(
                "{}: {} new values for a tensor of shape {:?}",
                view.name,
                v.len(),
                view.shape
            ))),
            Some(v) => Ok(Some(v.clone())),
        }
    }
}

/// The type an edited tensor is written in: `dtype`, but F32 for vectors.
fn edited_type(view: &TensorView, dtype: MergeDtype) -> GgmlType {
    if view.shape.len() <= 1 {
        GgmlType::F32
    } else {
        dtype.ggml()
    }
}

/// What the merged model is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    Gguf,
    HfFolder,
}

impl OutputKind {
    /// GGUF for a GGUF base (whatever OUT is called), a Hugging Face folder for a folder base;
    /// a folder base with an OUT ending in `.gguf` is refused (no GGUF metadata to start from).
    pub fn choose(base: &MergeBase, out: &Path) -> Result<OutputKind, CompressError> {
        let gguf_name = out
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        match (base.is_gguf(), gguf_name) {
            (true, _) => Ok(OutputKind::Gguf),
            (false, false) => Ok(OutputKind::HfFolder),
            (false, true) => Err(CompressError::InvalidInput(format!(
                "{} ends in .gguf, but the base {} is a Hugging Face folder: merging writes a \
                 folder of the same kind (GGUF output needs a GGUF base, whose metadata and \
                 tokenizer it copies). Name the output without .gguf, or merge into the GGUF \
                 of the same base model",
                out.display(),
                base.path().display()
            ))),
        }
    }
}

/// What [`merge_lora`] did.
#[derive(Debug, Clone)]
pub struct MergeReport {
    pub output: OutputKind,
    /// The merged modules, in canonical name order.
    pub modules: Vec<PlannedModule>,
    /// Tensors written.
    pub tensors: usize,
    /// Untouched tensors written in another type than the base's (quantized tensors of a
    /// GPTQ/AWQ base written to a folder, in the merge dtype).
    pub converted: usize,
    /// Bytes of the output's weights file.
    pub bytes: u64,
}

/// Merges `adapter` into `base` and writes the result to `out` in `dtype` (merged tensors;
/// see the module docs for the others). An existing `out` is an error unless `force`.
/// `progress(done, total)` is called after each tensor.
pub fn merge_lora(
    base: &MergeBase,
    adapter: &LoraAdapter,
    dtype: MergeDtype,
    out: &Path,
    force: bool,
    mut progress: impl FnMut(usize, usize),
) -> Result<MergeReport, CompressError> {
    let output = OutputKind::choose(base, out)?;
    if out.exists() && !force {
        return Err(CompressError::InvalidInput(format!(
            "{} already exists; choose another output or pass --force to replace it",
            out.display()
        )));
    }
    let plan = MergePlan::new(adapter, base.weights(), base.config(), base.is_gguf())?;
    let note = ("pagoda.lora_merged", adapter_note(adapter));
    let (bytes, tensors, converted) =
        write_output(base, &plan, dtype, out, force, note, &mut progress)?;
    Ok(MergeReport {
        output,
        modules: plan.modules().cloned().collect(),
        tensors,
        converted,
        bytes,
    })
}

/// Writes `base` with `edits` applied to `out` (the kind [`OutputKind::choose`] picks),
/// edited tensors in `dtype` (vectors in F32), untouched ones as [`merge_lora`] writes them;
/// a GGUF gets the metadata `note` (key, value). An existing `out` is an error unless
/// `force`. Returns (kind, weight bytes, tensors written, tensors converted).
pub fn write_edited(
    base: &MergeBase,
    edits: &dyn TensorEdits,
    dtype: MergeDtype,
    out: &Path,
    force: bool,
    note: (&str, String),
    mut progress: impl FnMut(usize, usize),
) -> Result<(OutputKind, u64, usize, usize), CompressError> {
    let output = OutputKind::choose(base, out)?;
    if out.exists() && !force {
        return Err(CompressError::InvalidInput(format!(
            "{} already exists; choose another output or pass --force to replace it",
            out.display()
        )));
    }
    let (bytes, tensors, converted) =
        write_output(base, edits, dtype, out, force, note, &mut progress)?;
    Ok((output, bytes, tensors, converted))
}

fn write_output(
    base: &MergeBase,
    edits: &dyn TensorEdits,
    dtype: MergeDtype,
    out: &Path,
    force: bool,
    note: (&str, String),
    progress: &mut impl FnMut(usize, usize),
) -> Result<(u64, usize, usize), CompressError> {
    Ok(match base {
        MergeBase::Gguf { file, weights, .. } => {
            let (bytes, n) = write_gguf(file, weights, edits, note, dtype, out, progress)?;
            (bytes, n, 0)
        }
        MergeBase::HfFolder(folder) => write_folder_atomically(out, force, |dir| {
            write_hf(folder, edits, dtype, dir, progress)
        })?,
    })
}

/// The bytes of `view` in the output: merged and encoded in `ty` when the plan touches it,
/// else re-encoded when `ty` differs from its own, else borrowed.
fn tensor_bytes<'a>(
    view: &'a TensorView,
    plan: &dyn TensorEdits,
    ty: GgmlType,
) -> Result<Cow<'a, [u8]>, CompressError> {
    if let Some(values) = plan.edited(view)? {
        return Ok(Cow::Owned(encode(&values, view.cols(), ty)?));
    }
    if view.ty == ty {
        return Ok(Cow::Borrowed(view.data()));
    }
    Ok(Cow::Owned(encode(&view.to_f32()?, view.cols(), ty)?))
}

/// A one-line description of the adapter for the output's metadata.
fn adapter_note(adapter: &LoraAdapter) -> String {
    let c = adapter.config();
    format!(
        "pagoda merge-lora: {} (r {}, alpha {}{}, {} modules)",
        adapter
            .dir()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        c.r,
        c.lora_alpha,
        if c.use_rslora { ", rsLoRA" } else { "" },
        adapter.modules().count()
    )
}

fn write_gguf(
    file: &GgufFile,
    weights: &Weights,
    plan: &dyn TensorEdits,
    note: (&str, String),
    dtype: MergeDtype,
    out: &Path,
    progress: &mut impl FnMut(usize, usize),
) -> Result<(u64, usize), CompressError> {
    let mut infos = Vec::with_capacity(file.tensors().len());
    let mut views = Vec::with_capacity(file.tensors().len());
    let mut bytes_by_type: BTreeMap<&'static str, (u64, GgmlType)> = BTreeMap::new();
    for info in file.tensors() {
        let view = weights.get(&info.name)?;
        let ty = if plan.touches(&view.name) {
            edited_type(view, dtype)
        } else {
            view.ty
        };
        let size = ty.row_bytes(view.cols())? as u64 * view.rows() as u64;
        bytes_by_type.entry(ty.name()).or_insert((0, ty)).0 += size;
        views.push(view);
        infos.push((view.name.as_str(), ty, view.shape.as_slice()));
    }
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        if key != "general.file_type" {
            w.add_metadata(key.clone(), value.clone());
        }
    }
    let main = bytes_by_type
        .values()
        .max_by_key(|(b, _)| *b)
        .map(|&(_, t)| t);
    if let Some(id) = main.and_then(file_type_id) {
        w.add_metadata("general.file_type", GgufValue::U32(id));
    }
    w.add_str(note.0, note.1);
    let total = infos.len();
    let n = write_file_atomically(out, |buf| {
        w.write_streamed(&infos, buf, |i| {
            let bytes = tensor_bytes(views[i], plan, infos[i].1)?;
            progress(i + 1, total);
            Ok::<_, CompressError>(bytes)
        })
    })?;
    Ok((n, total))
}

/// Writes the merged folder's files into `dir`; returns (weights bytes, tensors, converted).
fn write_hf(
    folder: &HfFolder,
    plan: &dyn TensorEdits,
    dtype: MergeDtype,
    dir: &Path,
    progress: &mut impl FnMut(usize, usize),
) -> Result<(u64, usize, usize), CompressError> {
    let arch = folder.config.arch;
    let mut names = Vec::new();
    let mut views = Vec::new();
    let mut types = Vec::new();
    let mut converted = 0;
    for view in folder.weights.iter() {
        let hf = hf_name(&view.name, arch).ok_or_else(|| {
            CompressError::InvalidInput(format!(
                "tensor {} of {} has no Hugging Face name Pagoda knows; this base cannot be \
                 written back as a folder",
                view.name,
                folder.path.display()
            ))
        })?;
        let ty = match view.ty {
            _ if plan.touches(&view.name) => edited_type(view, dtype),
            t @ (GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) => t,
            _ => {
                converted += 1;
                dtype.ggml()
            }
        };
        names.push(hf);
        views.push(view);
        types.push(ty);
    }
    let st_name = |ty: GgmlType| match ty {
        GgmlType::F32 => "F32",
        GgmlType::BF16 => "BF16",
        _ => "F16",
    };
    let infos: Vec<(&str, &str, &[usize])> = names
        .iter()
        .zip(&views)
        .zip(&types)
        .map(|((n, v), &t)| (n.as_str(), st_name(t), v.shape.as_slice()))
        .collect();
    let st_path = dir.join("model.safetensors");
    let file = std::fs::File::create(&st_path).map_err(|e| io_error(&st_path, e))?;
    let mut buf = std::io::BufWriter::new(file);
    let meta = serde_json::Map::from_iter([("format".to_string(), json!("pt"))]);
    let total = infos.len();
    let bytes = write_safetensors_streamed(&st_path, &infos, &meta, &mut buf, |i| {
        let bytes = tensor_bytes(views[i], plan, types[i])?;
        progress(i + 1, total);
        Ok::<_, CompressError>(bytes)
    })?;
    buf.flush().map_err(|e| io_error(&st_path, e))?;
    drop(buf);

    let mut config = folder.config_json.clone();
    let obj = config.as_object_mut().ok_or_else(|| {
        CompressError::InvalidInput(format!(
            "{}: config.json is not an object",
            folder.path.display()
        ))
    })?;
    obj.remove("quantization_config");
    obj.insert("torch_dtype".into(), Value::from(dtype.torch()));
    if obj.contains_key("dtype") {
        obj.insert("dtype".into(), Value::from(dtype.torch()));
    }
    write_json(&dir.join("config.json"), &config)?;
    for f in TOKENIZER_FILES {
        let from = folder.path.join(f);
        if from.is_file() {
            let to = dir.join(f);
            std::fs::copy(&from, &to).map_err(|e| io_error(&to, e))?;
        }
    }
    Ok((bytes, total, converted))
}
