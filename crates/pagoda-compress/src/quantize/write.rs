//! Writing a quantized model as a GGUF file: the source GGUF's metadata (with
//! `general.file_type` set to the new main type and a note of how it was made), then every
//! tensor in the source's order, from the new weights.
//!
//! Peak memory: the tensors are streamed from the weights (the source's mapping, the quantized
//! blocks) into the file; no copy of the whole model is built.
//!
//! Invariant: the output appears only when complete — it is written to `OUT.partial` and
//! renamed; on any error the partial file is removed and no file named `OUT` is created
//! ([`write_file_atomically`], shared with `pagoda merge-lora`).

use std::io::Write;
use std::path::{Path, PathBuf};

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
    let mut tensors = Vec::with_capacity(source.tensors().len());
    for info in source.tensors() {
        let view = weights.get(&info.name)?;
        tensors.push((
            view.name.as_str(),
            view.ty,
            view.shape.as_slice(),
            view.data(),
        ));
    }
    // Streamed: the tensors go from the weights (mapped or quantized) to the file, with no
    // copy of the whole model in memory.
    write_file_atomically(out, |buf| {
        w.write_borrowed(&tensors, buf)
            .map_err(|e| CompressError::Write {
                path: out.to_path_buf(),
                message: e.to_string(),
            })
    })
}

/// `OUT.partial` for a file `out` (`model.gguf` → `model.gguf.partial`).
pub fn partial_file_path(out: &Path) -> PathBuf {
    out.with_extension(match out.extension() {
        Some(e) => format!("{}.partial", e.to_string_lossy()),
        None => "partial".into(),
    })
}

/// Runs `body` on a buffered `OUT.partial` and renames it to `out` when `body` succeeds
/// (replacing a file `out`); on any error the partial file is removed and no file named `out`
/// is created. Errors of the file itself are [`CompressError::Write`] naming `out`.
pub fn write_file_atomically(
    out: &Path,
    body: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<u64, CompressError>,
) -> Result<u64, CompressError> {
    let partial = partial_file_path(out);
    let write_err = |e: std::io::Error| CompressError::Write {
        path: out.to_path_buf(),
        message: e.to_string(),
    };
    let result = std::fs::File::create(&partial)
        .map_err(write_err)
        .and_then(|f| {
            let mut buf = std::io::BufWriter::new(f);
            let n = body(&mut buf)?;
            buf.flush().map_err(write_err)?;
            Ok(n)
        })
        .and_then(|n| std::fs::rename(&partial, out).map(|_| n).map_err(write_err));
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_model::weights::TensorView;

    #[test]
    fn writes_the_source_metadata_and_the_new_tensors_and_leaves_no_partial() {
        let mut src = GgufWriter::new();
        src.add_str("general.architecture", "llama")
            .add_u32("general.file_type", 0);
        src.add_f32_tensor("a", &[2, 32], &[0.5; 64]).unwrap();
        src.add_f32_tensor("n", &[4], &[1.0; 4]).unwrap();
        let source = GgufFile::from_bytes("src.gguf", src.to_bytes()).unwrap();
        let mut weights = Weights::new();
        let q8 = vec![1u8; 2 * GgmlType::Q8_0.row_bytes(32).unwrap()];
        weights
            .insert(TensorView::owned("a", GgmlType::Q8_0, vec![2, 32], q8.clone()).unwrap())
            .unwrap();
        let n = Weights::from_gguf(&source).unwrap();
        weights.insert(n.get("n").unwrap().clone()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.gguf");
        let written = write_gguf(&source, &weights, GgmlType::Q8_0, "rtn", &out).unwrap();
        let back = GgufFile::open(&out).unwrap();
        assert_eq!(written, std::fs::metadata(&out).unwrap().len());
        assert_eq!(back.get_u32("general.file_type").unwrap(), 7);
        assert_eq!(back.get_str("general.quantized_by").unwrap(), "pagoda rtn");
        let a = back.tensor("a").unwrap();
        assert_eq!(back.tensor_data(a), &q8[..]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // A folder in the way: an error naming the output, and no partial file left.
        let blocked = dir.path().join("blocked.gguf");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("x"), "x").unwrap();
        let e = write_gguf(&source, &weights, GgmlType::Q8_0, "rtn", &blocked).unwrap_err();
        assert!(e.to_string().contains("blocked.gguf"), "{e}");
        assert!(!dir.path().join("blocked.gguf.partial").exists());
    }
}
