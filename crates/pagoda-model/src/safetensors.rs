//! safetensors reader: parses the JSON header of a `.safetensors` file that is memory-mapped
//! once, and yields borrowed [`TensorView`]s (F32, F16, BF16) under the names the file uses.
//!
//! The file is untrusted input. Invariants checked before any view exists: the header length
//! fits in the file (and in [`MAX_HEADER_BYTES`]), the header is a JSON object, every tensor
//! has a supported dtype, `data_offsets` with `start <= end <= data length`, exactly
//! `product(shape) * dtype size` bytes, and no two tensors overlap. Errors name the file and
//! the tensor. [`SafetensorsFile::open_skipping_unsupported`] instead leaves out tensors of
//! other dtypes (integer buffers such as BERT's `position_ids`), after the same bounds and
//! overlap checks, and lists their names in [`SafetensorsFile::skipped`]; those checked
//! integer tensors stay readable as [`RawTensor`]s (GPTQ/AWQ packed `I32` weights, see
//! `hf_quant.rs`). Writers: [`write_safetensors`] (a whole file in memory, for tests) and
//! [`write_safetensors_streamed`] (header from the shapes, then one tensor at a time).

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
    /// Tensors of unsupported dtypes left out (only by `open_skipping_unsupported`).
    skipped: Vec<String>,
    /// The same tensors' checked bytes.
    raw: Vec<RawTensor>,
}

/// A tensor of a dtype no [`TensorView`] is made of (`I32`, `U8`, ...): its byte range was
/// checked against the file (in bounds, exactly `product(shape) * dtype size` bytes, no
/// overlap) before it was made, so [`RawTensor::data`] cannot read out of bounds.
#[derive(Clone)]
pub struct RawTensor {
    pub name: String,
    /// The safetensors dtype string, e.g. `"I32"`.
    pub dtype: String,
    pub shape: Vec<usize>,
    bytes: Arc<Bytes>,
    start: usize,
    len: usize,
}

impl std::fmt::Debug for RawTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawTensor")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish()
    }
}

impl RawTensor {
    /// The tensor's bytes (little-endian elements).
    pub fn data(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }

    /// The elements of an `I32` tensor; `None` for any other dtype.
    pub fn to_i32(&self) -> Option<Vec<i32>> {
        if self.dtype != "I32" {
            return None;
        }
        Some(
            self.data()
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        )
    }
}

/// Bytes per element of the safetensors dtypes no [`TensorView`] is made of.
fn other_dtype_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "I16" | "U16" => 2,
        "I32" | "U32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

impl SafetensorsFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let bytes = map_file(path)?;
        Self::parse(path.to_path_buf(), bytes, false)
    }

    /// As [`open`](Self::open), but tensors of dtypes other than F32, F16 and BF16 are checked
    /// (bounds, size, overlap) and then left out instead of failing the file.
    pub fn open_skipping_unsupported(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let bytes = map_file(path)?;
        Self::parse(path.to_path_buf(), bytes, true)
    }

    /// [`from_bytes`](Self::from_bytes) as [`open_skipping_unsupported`](Self::open_skipping_unsupported)
    /// reads a file.
    pub fn from_bytes_skipping_unsupported(
        path: impl Into<PathBuf>,
        bytes: Vec<u8>,
    ) -> Result<Self, ModelError> {
        Self::parse(path.into(), Arc::new(Bytes::Owned(bytes)), true)
    }

    /// Parses an in-memory file; `path` is only used in messages.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self, ModelError> {
        Self::parse(path.into(), Arc::new(Bytes::Owned(bytes)), false)
    }

    fn parse(path: PathBuf, bytes: Arc<Bytes>, skip_other: bool) -> Result<Self, ModelError> {
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
        let mut skipped = Vec::new();
        let mut raw = Vec::new();
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
                "F32" => Some(GgmlType::F32),
                "F16" => Some(GgmlType::F16),
                "BF16" => Some(GgmlType::BF16),
                other if skip_other && other_dtype_size(other).is_some() => None,
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
            let Some(ty) = ty else {
                let size = other_dtype_size(dtype).unwrap_or(1);
                let want = shape
                    .iter()
                    .try_fold(size, |a, &d| a.checked_mul(d))
                    .ok_or_else(|| terr(format!("shape {shape:?} overflows")))?;
                if want != end - start {
                    return Err(terr(format!(
                        "shape {shape:?} of {dtype} needs {want} bytes but the file gives it {}",
                        end - start
                    )));
                }
                ranges.push((start, end, name.clone()));
                skipped.push(name.clone());
                raw.push(RawTensor {
                    name: name.clone(),
                    dtype: dtype.to_string(),
                    shape,
                    bytes: bytes.clone(),
                    start: data_start + start,
                    len: end - start,
                });
                continue;
            };
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
            skipped,
            raw,
        })
    }

    /// Names of the tensors left out for their dtype (empty unless opened with
    /// [`open_skipping_unsupported`](Self::open_skipping_unsupported)).
    pub fn skipped(&self) -> &[String] {
        &self.skipped
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

    /// The float tensors and the checked tensors of other dtypes (the latter empty unless
    /// opened with [`open_skipping_unsupported`](Self::open_skipping_unsupported)).
    pub fn into_parts(self) -> (Vec<TensorView>, Vec<RawTensor>) {
        (self.tensors, self.raw)
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

/// Bytes per element of a safetensors dtype name, `None` for a name this writer does not know.
fn dtype_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" => 1,
        _ => return None,
    })
}

/// Streams a safetensors file to `out`: the header from `infos` (name, dtype name such as
/// `"F16"`, shape) and `metadata` (`__metadata__`, string values), then tensor `i`'s bytes
/// from `data(i)`, in order, so that a caller makes each tensor just in time (peak memory: one
/// tensor). `path` names the file in errors; bytes of another length than dtype and shape
/// need are an error. Returns the bytes written.
pub fn write_safetensors_streamed<'a, E: From<ModelError>>(
    path: &Path,
    infos: &[(&str, &str, &[usize])],
    metadata: &serde_json::Map<String, serde_json::Value>,
    out: &mut impl std::io::Write,
    mut data: impl FnMut(usize) -> Result<std::borrow::Cow<'a, [u8]>, E>,
) -> Result<u64, E> {
    let terr = |tensor: &str, message: String| ModelError::Tensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        message,
    };
    let mut header = serde_json::Map::new();
    let mut sizes = Vec::with_capacity(infos.len());
    let mut offset = 0usize;
    for &(name, dtype, shape) in infos {
        let elem = dtype_size(dtype).ok_or_else(|| terr(name, format!("unknown dtype {dtype}")))?;
        let size = shape
            .iter()
            .try_fold(elem, |a, &d| a.checked_mul(d))
            .ok_or_else(|| terr(name, format!("shape {shape:?} overflows")))?;
        if header.contains_key(name) || name == "__metadata__" {
            return Err(terr(name, "written twice".into()).into());
        }
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}),
        );
        offset += size;
        sizes.push(size);
    }
    if !metadata.is_empty() {
        header.insert(
            "__metadata__".into(),
            serde_json::Value::Object(metadata.clone()),
        );
    }
    let mut h =
        serde_json::to_vec(&serde_json::Value::Object(header)).map_err(|e| ModelError::Format {
            path: path.to_path_buf(),
            message: format!("safetensors header: {e}"),
        })?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    out.write_all(&(h.len() as u64).to_le_bytes()).map_err(io)?;
    out.write_all(&h).map_err(io)?;
    for (i, (&(name, dtype, shape), &size)) in infos.iter().zip(&sizes).enumerate() {
        let bytes = data(i)?;
        if bytes.len() != size {
            return Err(terr(
                name,
                format!(
                    "shape {shape:?} of {dtype} needs {size} bytes, got {}",
                    bytes.len()
                ),
            )
            .into());
        }
        out.write_all(&bytes).map_err(io)?;
    }
    Ok(8 + h.len() as u64 + offset as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn streamed_writer_reads_back_and_checks_lengths() {
        let shape: &[usize] = &[2, 2];
        let infos = [("a", "F32", shape), ("b", "BF16", &[2][..])];
        let datas = [f32s(&[1., 2., 3., 4.]), vec![0x80, 0x3f, 0x00, 0x40]];
        let mut out = Vec::new();
        let meta = serde_json::Map::from_iter([("format".to_string(), "pt".into())]);
        let n =
            write_safetensors_streamed(Path::new("m.safetensors"), &infos, &meta, &mut out, |i| {
                Ok::<_, ModelError>(std::borrow::Cow::Borrowed(&datas[i][..]))
            })
            .unwrap();
        assert_eq!(n as usize, out.len());
        let f = SafetensorsFile::from_bytes("m.safetensors", out).unwrap();
        assert_eq!(f.tensors()[0].to_f32().unwrap(), vec![1., 2., 3., 4.]);
        assert_eq!(f.metadata()["format"], "pt");
        let e = write_safetensors_streamed(
            Path::new("m.safetensors"),
            &infos,
            &meta,
            &mut Vec::new(),
            |_| Ok::<_, ModelError>(std::borrow::Cow::Owned(vec![0u8; 3])),
        )
        .unwrap_err();
        assert!(e.to_string().contains("needs 16 bytes, got 3"), "{e}");
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

        let mixed = write_safetensors(&[
            ("ids", "I64", vec![1, 2], vec![0; 16]),
            ("a", "F32", vec![1], f32s(&[5.])),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        std::fs::write(&path, &mixed).unwrap();
        assert!(SafetensorsFile::open(&path).is_err());
        let f = SafetensorsFile::open_skipping_unsupported(&path).unwrap();
        assert_eq!(f.skipped(), ["ids".to_string()]);
        assert_eq!(f.tensors().len(), 1);
        let (_, raw) = f.into_parts();
        assert_eq!(raw[0].shape, [1, 2]);
        assert_eq!(raw[0].data().len(), 16);
        assert_eq!(raw[0].to_i32(), None);
        let ints = write_safetensors(&[(
            "q",
            "I32",
            vec![2],
            vec![1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
        )]);
        let f = SafetensorsFile::parse("m".into(), Arc::new(Bytes::Owned(ints)), true).unwrap();
        assert_eq!(f.into_parts().1[0].to_i32(), Some(vec![1, -1]));
        let short = write_safetensors(&[("ids", "I64", vec![3], vec![0; 16])]);
        assert!(SafetensorsFile::parse("m".into(), Arc::new(Bytes::Owned(short)), true).is_err());

        let mut huge = bytes;
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(SafetensorsFile::from_bytes("m.safetensors", huge).is_err());
    }
}
