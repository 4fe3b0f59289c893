//! Writing a quantized model as a GGUF file: the source GGUF's metadata (with
//! `general.file_type` set to the new main type and a note of how it was made), then every
//! tensor in the source's order, from the new weights ([`write_gguf`]); or, for a Hugging Face
//! folder, metadata made by [`gguf_meta`](super::gguf_meta) and the tensors in llama.cpp's
//! layout ([`write_gguf_from_hf`]): a Llama model's Q and K rows (weights and biases) moved
//! into llama.cpp's interleaved RoPE order (whole rows move, so quantized blocks are
//! unchanged), norms and biases in F32, no `output.weight` when `config.json` ties the
//! embeddings, and Llama 3 RoPE scaling as a `rope_freqs.weight` tensor.
//!
//! Peak memory: the tensors are streamed from the weights (the source's mapping, the quantized
//! blocks) into the file; no copy of the whole model is built.
//!
//! Invariant: the output appears only when complete — it is written to `OUT.partial` and
//! renamed; on any error the partial file is removed and no file named `OUT` is created
//! ([`write_file_atomically`], shared with `pagoda merge-lora`).

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};

use pagoda_kernels::GgmlType;
use pagoda_model::gguf::{GgufFile, GgufValue, GgufWriter};
use pagoda_model::hf::hf_name;
use pagoda_model::weights::Weights;

use super::gguf_meta::{hf_gguf_metadata, llama3_rope_factors, HfGgufSource};
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
    write_atomically(&w, &tensors, out)
}

/// The metadata keys that carry a model's shape, under `{arch}.`: replaced, never copied,
/// by [`write_gguf_reshaped`].
const SHAPE_KEYS: [&str; 8] = [
    "block_count",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.sliding_window_pattern",
];

/// Writes `weights` of a model reshaped by structured pruning to `cfg` with `source`'s
/// metadata, its shape keys set from `cfg`: layer count, widths, head counts, `key_length`
/// and `value_length` (always: llama.cpp would otherwise take `hidden / heads` as the head
/// size), and for Gemma 3 the per-layer sliding-window flags as a bool array (gguf-py's
/// form) when they are not the default pattern of 6. Tensors are written in llama.cpp's
/// order, in their own types. `main_type` sets `general.file_type` (`None`: the source's).
pub fn write_gguf_reshaped(
    source: &GgufFile,
    cfg: &pagoda_model::ModelConfig,
    weights: &Weights,
    main_type: Option<GgmlType>,
    note: &str,
    out: &Path,
) -> Result<u64, CompressError> {
    let arch = source.get_str("general.architecture")?.to_string();
    let shape_key = |key: &str| {
        key.strip_prefix(arch.as_str())
            .and_then(|k| k.strip_prefix('.'))
            .is_some_and(|k| SHAPE_KEYS.contains(&k))
    };
    let mut w = GgufWriter::new();
    for (key, value) in source.metadata() {
        let retyped = key == "general.file_type" && main_type.is_some();
        if retyped || key == "general.quantized_by" || shape_key(key) {
            continue;
        }
        w.add_metadata(key.clone(), value.clone());
    }
    let u32_of = |what: &str, v: usize| {
        u32::try_from(v)
            .map_err(|_| CompressError::InvalidInput(format!("{what} {v} is too large")))
    };
    w.add_u32(
        format!("{arch}.block_count"),
        u32_of("layers", cfg.n_layers)?,
    )
    .add_u32(
        format!("{arch}.embedding_length"),
        u32_of("width", cfg.hidden_size)?,
    )
    .add_u32(
        format!("{arch}.feed_forward_length"),
        u32_of("MLP width", cfg.ffn_dim)?,
    )
    .add_u32(
        format!("{arch}.attention.head_count"),
        u32_of("heads", cfg.n_heads)?,
    )
    .add_u32(
        format!("{arch}.attention.head_count_kv"),
        u32_of("KV heads", cfg.n_kv_heads)?,
    )
    .add_u32(
        format!("{arch}.attention.key_length"),
        u32_of("head size", cfg.head_dim)?,
    )
    .add_u32(
        format!("{arch}.attention.value_length"),
        u32_of("head size", cfg.head_dim)?,
    );
    if cfg.arch == pagoda_model::Architecture::Gemma3
        && cfg.sliding_window.is_some()
        && cfg.layer_is_sliding
            != (0..cfg.n_layers)
                .map(|i| (i + 1) % 6 != 0)
                .collect::<Vec<_>>()
    {
        w.add_metadata(
            format!("{arch}.attention.sliding_window_pattern"),
            GgufValue::Array(pagoda_model::gguf::GgufArray::Bool(
                cfg.layer_is_sliding.clone(),
            )),
        );
    }
    if let Some(id) = main_type.and_then(file_type_id) {
        w.add_metadata("general.file_type", GgufValue::U32(id));
    }
    w.add_str("general.quantized_by", format!("pagoda {note}"));
    let mut views: Vec<_> = weights.iter().collect();
    views.sort_by_key(|v| tensor_rank(&v.name));
    let tensors: Vec<(&str, GgmlType, &[usize], &[u8])> = views
        .iter()
        .map(|v| (v.name.as_str(), v.ty, v.shape.as_slice(), v.data()))
        .collect();
    write_atomically(&w, &tensors, out)
}

/// Streams `w`'s metadata and `tensors` to `OUT.partial`, then renames it to `out`; on any
/// error the partial file is removed.
fn write_atomically(
    w: &GgufWriter,
    tensors: &[(&str, GgmlType, &[usize], &[u8])],
    out: &Path,
) -> Result<u64, CompressError> {
    // Streamed: the tensors go from the weights (mapped or quantized) to the file, with no
    // copy of the whole model in memory.
    write_file_atomically(out, |buf| {
        w.write_borrowed(tensors, buf)
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

/// A tensor of the output: name, type, shape (outermost first), bytes (borrowed from the
/// weights, or made here: permuted, widened to F32, RoPE factors).
type OutTensor<'a> = (String, GgmlType, Vec<usize>, Cow<'a, [u8]>);

/// Where a tensor goes in llama.cpp's usual order: embeddings, RoPE factors, the layers in
/// number order, the final norm, the output head.
fn tensor_rank(name: &str) -> (usize, usize, String) {
    match name {
        "token_embd.weight" => (0, 0, String::new()),
        "rope_freqs.weight" => (1, 0, String::new()),
        "output_norm.weight" => (3, 0, String::new()),
        "output.weight" => (4, 0, String::new()),
        _ => {
            let layer = name
                .strip_prefix("blk.")
                .and_then(|r| r.split_once('.'))
                .and_then(|(l, _)| l.parse::<usize>().ok())
                .unwrap_or(usize::MAX);
            (2, layer, name.to_string())
        }
    }
}

/// Writes `weights` — a Hugging Face folder's tensors under their canonical names, in the
/// folder's row order, some quantized — as a GGUF file with metadata made from the folder
/// (see the module docs). Every refusal (architecture, tokenizer, a tensor GGUF has no name
/// for) happens before `out` or `OUT.partial` is created.
pub fn write_gguf_from_hf(
    src: &HfGgufSource<'_>,
    weights: &Weights,
    main_type: GgmlType,
    note: &str,
    out: &Path,
) -> Result<u64, CompressError> {
    let cfg = src.cfg;
    let mut w = GgufWriter::new();
    for (key, value) in hf_gguf_metadata(src)? {
        w.add_metadata(key, value);
    }
    if let Some(id) = file_type_id(main_type) {
        w.add_metadata("general.file_type", GgufValue::U32(id));
    }
    if !matches!(main_type, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        w.add_metadata("general.quantization_version", GgufValue::U32(2));
    }
    w.add_str("general.quantized_by", format!("pagoda {note}"));

    let tied = src
        .config_json
        .get("tie_word_embeddings")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    let mut views: Vec<_> = weights
        .iter()
        .filter(|v| !(tied && v.name == "output.weight"))
        .collect();
    views.sort_by_key(|v| tensor_rank(&v.name));
    let mut owned: Vec<OutTensor<'_>> = Vec::new();
    let permutes = pagoda_model::rope_order::family_permutes_in_gguf(cfg.arch);
    if let Some(factors) = llama3_rope_factors(cfg) {
        let bytes = factors.iter().flat_map(|x| x.to_le_bytes()).collect();
        owned.push((
            "rope_freqs.weight".into(),
            GgmlType::F32,
            vec![factors.len()],
            Cow::Owned(bytes),
        ));
    }
    for view in views {
        let name = view.name.as_str();
        if hf_name(name, cfg.arch).is_none() {
            return Err(CompressError::InvalidInput(format!(
                "tensor {name} has no llama.cpp counterpart; this folder cannot be written as                  GGUF"
            )));
        }
        let (ty, data): (GgmlType, Cow<'_, [u8]>) =
            if view.shape.len() == 1 && view.ty != GgmlType::F32 {
                let values = view.to_f32()?;
                let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
                (GgmlType::F32, Cow::Owned(bytes))
            } else {
                (view.ty, Cow::Borrowed(view.data()))
            };
        let heads = match name.rsplit_once('.').map(|(stem, _)| stem) {
            Some(stem) if permutes && stem.ends_with(".attn_q") => Some(cfg.n_heads),
            Some(stem) if permutes && stem.ends_with(".attn_k") => Some(cfg.n_kv_heads),
            _ => None,
        };
        let data = match heads {
            None => data,
            Some(n_head) => {
                let rows = view.shape[0];
                let order =
                    pagoda_model::rope_order::gguf_row_order(rows, n_head).ok_or_else(|| {
                        CompressError::InvalidInput(format!(
                            "{name}: {rows} rows do not split into {n_head} heads of an even size"
                        ))
                    })?;
                let row_bytes = data.len() / rows;
                let mut p = Vec::with_capacity(data.len());
                for &r in &order {
                    p.extend_from_slice(&data[r * row_bytes..(r + 1) * row_bytes]);
                }
                Cow::Owned(p)
            }
        };
        owned.push((name.to_string(), ty, view.shape.clone(), data));
    }
    let tensors: Vec<(&str, GgmlType, &[usize], &[u8])> = owned
        .iter()
        .map(|(n, ty, s, d)| (n.as_str(), *ty, s.as_slice(), d.as_ref()))
        .collect();
    write_atomically(&w, &tensors, out)
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
