//! Writing a quantized model as a GGUF file: the source GGUF's metadata (with
//! `general.file_type` set to the new main type and a note of how it was made), then every
//! tensor in the source's order, from the new weights.
//!
//! Invariant: the output appears only when complete — it is written to `OUT.partial` and
//! renamed; on any error the partial file is removed and no file named `OUT` is created.

use std::path::Path;

use pagoda_kernels::GgmlType;
use pagoda_model::gguf::{GgufFile, GgufValue, GgufWriter};
use pagoda_model::weights::Weights;

use crate::CompressError;

/// llama.cpp's `general.file_type` for a model whose weights are mostly `ty`.
pub fn file_type_id(ty: GgmlType) -> Option<u32> {
    Some(match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q5_0 => 8,
        GgmlType::Q5_1 => 9,
        GgmlType::Q6_K => 18,
        GgmlType::BF16 => 32,
        _ => return None,
    })
}

/// Writes `weights` with `source`'s metadata to `out` (see the module docs). `note` goes
/// into `general.quantized_by` (method and options, for `pagoda show`).
pub fn write_gguf(
    source: &GgufFile,
    weights: &Weights,
    main_type: GgmlType,
    note: &str,
    out: &Path,
) -> Result<u64, CompressError> {
    let mut w = GgufWriter::new();
    for (key, value) in source.metadata() {
        if key == "general.file_type" || key == "general.quantized_by" {
            continue;
        }
        w.add_metadata(key.clone(), value.clone());
    }
    if let Some(id) = file_type_id(main_type) {
        w.add_metadata("general.file_type", GgufValue::U32(id));
    }
    w.add_str("general.quantized_by", format!("pagoda {note}"));
    for info in source.tensors() {
        let view = weights.get(&info.name)?;
        w.add_tensor(
            view.name.clone(),
            view.ty,
            &view.shape,
            view.data().to_vec(),
        )?;
    }
    let bytes = w.to_bytes();
    let partial = out.with_extension(match out.extension() {
        Some(e) => format!("{}.partial", e.to_string_lossy()),
        None => "partial".into(),
    });
    let result = std::fs::write(&partial, &bytes).and_then(|_| std::fs::rename(&partial, out));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(CompressError::InvalidInput(format!(
            "cannot write {}: {e}",
            out.display()
        )));
    }
    Ok(bytes.len() as u64)
}
