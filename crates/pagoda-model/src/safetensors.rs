//! safetensors reader: parses the JSON header of a `.safetensors` file that is memory-mapped
//! once, and yields borrowed [`TensorView`]s (F32, F16, BF16) under the names the file uses.
//!
//! The file is untrusted input. Invariants checked before any view exists: the header length
//! fits in the file (and in [`MAX_HEADER_BYTES`]), the header is a JSON object, every tensor
//! has a supported dtype, `data_offsets` with `start <= end <= data length`, exactly
//! `product(shape) * dtype size` bytes, and no two tensors overlap. Errors name the file and
//! the tensor.

use crate::gguf::{map_file, Bytes};
use crate::weights::TensorView;
use crate::ModelError;
use pagoda_kernels::GgmlType;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest header accepted (the format's own limit is 100 MB).
pub const MAX_HEADER_BYTES: u64 = 100 << 20;

/// One opened safetensors file.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    tensors: Vec<TensorView>,
    metadata: serde_json::Map<String, serde_json::Value>,
}

impl SafetensorsFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let bytes = map_file(path)?;
        Self::parse(path.to_path_buf(), bytes)
    }

    /// Parses an in-memory file; `path` is only used in messages.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self, ModelError> {
        Self::parse(path.into(), Arc::new(Bytes::Owned(bytes)))
    }

    fn parse(path: PathBuf, bytes: Arc<Bytes>) -> Result<Self, ModelError> {
        let fmt = |message: String| ModelError::Format {
            path: path.clone(),
            message,
        };
        let file_len = bytes.len() as u64;
        if file_len < 8 {
            return Err(fmt(format!(
                "file truncated: {file_len} bytes, too short for a safetensors header"
            )));
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&bytes[..8]);
        let header_len = u64::from_le_bytes(n);
        if header_len > MAX_HEADER_BYTES || header_len > file_len - 8 {
            return Err(fmt(format!(
                "header claims {header_len} bytes but the file has {} after the length (limit {MAX_HEADER_BYTES})",
                file_len - 8
            )));
        }
        let data_start = 8 + header_len as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..data_start])
            .map_err(|e| fmt(format!("header is not valid JSON: {e}")))?;
        let serde_json::Value::Object(header) = header else {
            return Err(fmt("header is not a JSON object".into()));
        };
        let data_len = bytes.len() - data_start;
        let mut metadata = serde_json::Map::new();
        let mut tensors = Vec::with_capacity(header.len());
        let mut ranges: Vec<(usize, usize, String)> = Vec::with_capacity(header.len());
        for (name, info) in header {
            if name == "__metadata__" {
                if let serde_json::Value::Object(m) = info {
                    metadata = m;
                }
                continue;
            }
            let terr = |message: String| ModelError::Tensor {
                path: path.clone(),
                tensor: name.clone(),
                message,
            };
            let dtype = info
                .get("dtype")
                .and_then(|d| d.as_str())
                .ok_or_else(|| terr("has no dtype".into()))?;
            let ty = match dtype {
                "F32" => GgmlType::F32,
                "F16" => GgmlType::F16,
                "BF16" => GgmlType::BF16,
                other => {
                    return Err(terr(format!(
                        "dtype {other} is not supported (F32, F16, BF16)"
                    )))
                }
            };
            let shape: Vec<usize> = info
                .get("shape")
                .and_then(|s| s.as_array())
                .ok_or_else(|| terr("has no shape".into()))?
                .iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect::<Option<_>>()
                .ok_or_else(|| terr("shape is not a list of non-negative integers".into()))?;
            let offs: Vec<u64> = info
                .get("data_offsets")
                .and_then(|s| s.as_array())
                .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
                .unwrap_or_default();
            let [start, end] = offs[..] else {
                return Err(terr("data_offsets is not [start, end]".into()));
            };
            if start > end || end > data_len as u64 {
                return Err(terr(format!(
                    "data_offsets [{start}, {end}] fall outside the {data_len}-byte data section"
                )));
            }
            let (start, end) = (start as usize, end as usize);
            let view = TensorView::new(
                name.clone(),
                ty,
                shape.clone(),
                bytes.clone(),
                data_start + start,
                end - start,
            )
            .map_err(terr)?;
            ranges.push((start, end, name.clone()));
            tensors.push(view);
        }
        ranges.sort();
        for w in ranges.windows(2) {
            if w[0].1 > w[1].0 && w[0].1 > w[0].0 && w[1].1 > w[1].0 {
                return Err(ModelError::Tensor {
                    path: path.clone(),
                    tensor: w[1].2.clone(),
                    message: format!("data overlaps tensor {:?}", w[0].2),
                });
            }
        }
        Ok(SafetensorsFile {
            path,
            tensors,
            metadata,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tensors under the file's own names.
    pub fn tensors(&self) -> &[TensorView] {
        &self.tensors
    }

    pub fn into_tensors(self) -> Vec<TensorView> {
        self.tensors
    }

    /// The `__metadata__` object.
    pub fn metadata(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.metadata
    }
}

/// Writes a safetensors file (used by tests and, later, the compression tools).
pub fn write_safetensors(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, dtype, shape, data) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + data.len()]}),
        );
        offset += data.len();
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap_or_default();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + offset);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn reads_and_validates() {
        let bytes = write_safetensors(&[
            ("a", "F32", vec![2, 2], f32s(&[1., 2., 3., 4.])),
            ("b", "BF16", vec![2], vec![0x80, 0x3f, 0x00, 0x40]),
        ]);
        let f = SafetensorsFile::from_bytes("m.safetensors", bytes.clone()).unwrap();
        let a = f.tensors().iter().find(|t| t.name == "a").unwrap();
        assert_eq!(a.to_f32().unwrap(), vec![1., 2., 3., 4.]);
        let b = f.tensors().iter().find(|t| t.name == "b").unwrap();
        assert_eq!(b.to_f32().unwrap(), vec![1., 2.]);

        let mut trunc = bytes.clone();
        trunc.truncate(bytes.len() - 1);
        let e = SafetensorsFile::from_bytes("m.safetensors", trunc)
            .unwrap_err()
            .to_string();
        assert!(e.contains("m.safetensors") && e.contains('b'), "{e}");

        let bad = write_safetensors(&[("x", "I64", vec![1], vec![0; 8])]);
        let e = SafetensorsFile::from_bytes("m.safetensors", bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"x\"") && e.contains("I64"), "{e}");

        let mut huge = bytes;
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(SafetensorsFile::from_bytes("m.safetensors", huge).is_err());
    }
}
