//! MXFP4 tensors of HF checkpoints (openai/gpt-oss-*: `quantization_config.quant_method` is
//! `"mxfp4"`). Each `<name>_blocks` (U8 `[..., rows, cols / 32, 16]`) with its
//! `<name>_scales` (U8 `[..., rows, cols / 32]`) becomes one GGUF MXFP4 matrix `<name>` of
//! shape `[product(...) · rows, cols]`: the same E2M1 codes and E8M0 exponents, the nibbles
//! reordered into ggml's block layout (`quant::mxfp4::from_hf_block`) — lossless, never
//! dequantized, the same size as the file's tensors. What a matrix's rows mean (gpt-oss's
//! experts interleave gate and up rows) is the family's business (`family/gpt_oss.rs`).
//!
//! Invariants: a pair converts only when both halves are present with shapes that agree
//! (`scales` is `blocks` without its last dimension of 16), else the folder is refused with
//! the tensor named; a `_blocks` or `_scales` tensor outside a pair is an error too, as is
//! any other U8 tensor in an MXFP4 folder (nothing is silently left out).

use crate::safetensors::RawTensor;
use crate::weights::TensorView;
use crate::ModelError;
use pagoda_kernels::quant::mxfp4::from_hf_block;
use pagoda_kernels::GgmlType;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Whether `quantization_config` (of config.json) declares MXFP4 weights.
pub fn is_mxfp4(quantization_config: Option<&Value>) -> bool {
    quantization_config
        .and_then(|q| q.get("quant_method"))
        .and_then(Value::as_str)
        .is_some_and(|m| m.eq_ignore_ascii_case("mxfp4"))
}

/// The `_blocks` / `_scales` halves of an MXFP4 folder's tensors, collected across shards.
#[derive(Debug, Default)]
pub struct Mxfp4Tensors {
    blocks: BTreeMap<String, (RawTensor, PathBuf)>,
    scales: BTreeMap<String, (RawTensor, PathBuf)>,
}

fn bad(path: &Path, tensor: &str, message: String) -> ModelError {
    ModelError::Tensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        message,
    }
}

impl Mxfp4Tensors {
    /// Takes `raw` (from shard `path`) when it is half of an MXFP4 pair; any other tensor of
    /// a dtype other than F32/F16/BF16 is refused with its name.
    pub fn add(&mut self, raw: RawTensor, path: &Path) -> Result<(), ModelError> {
        let name = raw.name.clone();
        let (map, base) = if let Some(base) = name.strip_suffix("_blocks") {
            (&mut self.blocks, base)
        } else if let Some(base) = name.strip_suffix("_scales") {
            (&mut self.scales, base)
        } else {
            return Err(bad(
                path,
                &name,
                format!(
                    "dtype {} is not read in an MXFP4 checkpoint (only `*_blocks`/`*_scales` \
                     pairs of U8 and F32/F16/BF16 tensors are)",
                    raw.dtype
                ),
            ));
        };
        if raw.dtype != "U8" {
            return Err(bad(
                path,
                &name,
                format!("MXFP4 halves are U8, this one is {}", raw.dtype),
            ));
        }
        map.insert(base.to_string(), (raw, path.to_path_buf()));
        Ok(())
    }

    /// The MXFP4 matrices of every pair, named by their base name (see the module doc).
    pub fn convert(self) -> Result<Vec<(TensorView, PathBuf)>, ModelError> {
        let mut scales = self.scales;
        let mut out = Vec::with_capacity(self.blocks.len());
        for (base, (blocks, path)) in self.blocks {
            let Some((scale, _)) = scales.remove(&base) else {
                return Err(bad(
                    &path,
                    &blocks.name,
                    format!("has no `{base}_scales` beside it"),
                ));
            };
            out.push((convert_pair(&base, &blocks, &scale, &path)?, path));
        }
        if let Some((base, (scale, path))) = scales.into_iter().next() {
            return Err(bad(
                &path,
                &scale.name,
                format!("has no `{base}_blocks` beside it"),
            ));
        }
        Ok(out)
    }
}

/// One pair into an MXFP4 matrix named `base`.
fn convert_pair(
    base: &str,
    blocks: &RawTensor,
    scales: &RawTensor,
    path: &Path,
) -> Result<TensorView, ModelError> {
    let shape_err = || {
        bad(
            path,
            &blocks.name,
            format!(
                "shape {:?} with scales {:?}: MXFP4 blocks are [..., rows, blocks, 16] and \
                 their scales [..., rows, blocks]",
                blocks.shape, scales.shape
            ),
        )
    };
    let (last, outer) = blocks.shape.split_last().ok_or_else(shape_err)?;
    if *last != 16 || outer.len() < 2 || scales.shape != outer {
        return Err(shape_err());
    }
    let n_blocks = outer[outer.len() - 1];
    let rows: usize = outer[..outer.len() - 1].iter().product();
    let cols = n_blocks * 32;
    let (codes, exps) = (blocks.data(), scales.data());
    let row_bytes = GgmlType::Mxfp4
        .row_bytes(cols)
        .map_err(|e| bad(path, &blocks.name, e.to_string()))?;
    let mut data = vec![0u8; rows * row_bytes];
    for (b, dst) in data.chunks_exact_mut(17).enumerate() {
        let packed: &[u8; 16] = codes[16 * b..16 * b + 16]
            .try_into()
            .map_err(|_| shape_err())?;
        let block = from_hf_block(exps[b], packed);
        dst[0] = block.e;
        dst[1..].copy_from_slice(&block.qs);
    }
    TensorView::owned(base, GgmlType::Mxfp4, vec![rows, cols], data)
        .map_err(|m| bad(path, &blocks.name, m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors::{write_safetensors, SafetensorsFile};
    use pagoda_kernels::quant::dequantize_row;
    use pagoda_kernels::quant::mxfp4::{e8m0_half, KVALUES};

    fn raws(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<RawTensor> {
        let file = SafetensorsFile::from_bytes_skipping_unsupported(
            "t.safetensors",
            write_safetensors(tensors),
        )
        .unwrap();
        file.into_parts().1
    }

    #[test]
    fn a_pair_becomes_an_mxfp4_matrix_with_the_same_values() {
        // 2 experts x 3 rows x 64 columns: element k of row r codes (k + r) % 16.
        let (experts, rows, nb) = (2usize, 3usize, 2usize);
        let mut codes = Vec::new();
        let mut exps = Vec::new();
        for r in 0..experts * rows {
            for b in 0..nb {
                exps.push(120 + (r + b) as u8);
                for i in 0..16 {
                    let c = |k: usize| ((32 * b + k + r) % 16) as u8;
                    codes.push(c(2 * i) | (c(2 * i + 1) << 4));
                }
            }
        }
        let mut t = Mxfp4Tensors::default();
        for raw in raws(&[
            ("x.w_blocks", "U8", vec![experts, rows, nb, 16], codes),
            ("x.w_scales", "U8", vec![experts, rows, nb], exps),
        ]) {
            t.add(raw, Path::new("t")).unwrap();
        }
        let out = t.convert().unwrap();
        let view = &out[0].0;
        assert_eq!((view.name.as_str(), view.ty), ("x.w", GgmlType::Mxfp4));
        assert_eq!(view.shape, vec![experts * rows, 64]);
        let rb = view.n_bytes() / (experts * rows);
        for r in 0..experts * rows {
            let mut y = vec![0.0f32; 64];
            dequantize_row(GgmlType::Mxfp4, &view.data()[r * rb..(r + 1) * rb], &mut y).unwrap();
            for (k, v) in y.iter().enumerate() {
                let want = KVALUES[(k + r) % 16] as f32 * e8m0_half(120 + (r + k / 32) as u8);
                assert_eq!(*v, want, "row {r} element {k}");
            }
        }
    }

    #[test]
    fn unpaired_or_misshapen_halves_and_other_integer_tensors_are_refused() {
        let one = |name: &str, dtype: &str, shape: Vec<usize>| {
            let width = if dtype == "I64" { 8 } else { 1 };
            let n: usize = shape.iter().product::<usize>() * width;
            let mut t = Mxfp4Tensors::default();
            let mut err = None;
            for raw in raws(&[(name, dtype, shape, vec![0u8; n])]) {
                err = t.add(raw, Path::new("t")).err();
            }
            err.map(|e| e.to_string())
                .unwrap_or_else(|| t.convert().unwrap_err().to_string())
        };
        assert!(one("a_blocks", "U8", vec![2, 1, 16]).contains("no `a_scales`"));
        assert!(one("a_scales", "U8", vec![2, 1]).contains("no `a_blocks`"));
        assert!(one("pos", "I64", vec![4]).contains("not read in an MXFP4"));
        let mut t = Mxfp4Tensors::default();
        for raw in raws(&[
            ("a_blocks", "U8", vec![2, 1, 16], vec![0; 32]),
            ("a_scales", "U8", vec![2, 2], vec![0; 4]),
        ]) {
            t.add(raw, Path::new("t")).unwrap();
        }
        assert!(t
            .convert()
            .unwrap_err()
            .to_string()
            .contains("[..., rows, blocks, 16]"));
    }
}
