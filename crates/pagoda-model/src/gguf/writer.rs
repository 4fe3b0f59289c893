//! GGUF v3 writer: metadata plus tensors, laid out as llama.cpp writes them (header, KV pairs,
//! tensor infos, padding to the alignment, tensor data each padded to the alignment).
//!
//! Invariant: every file this writer produces is accepted by [`super::GgufFile`]; tensors are
//! checked on insertion (a GGUF type — Pagoda-internal types are refused —, known size for
//! their type and shape, unique names).

use super::{GgufArray, GgufValue, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::ModelError;
use pagoda_kernels::GgmlType;
use std::io::Write;
use std::path::{Path, PathBuf};

struct PendingTensor {
    name: String,
    /// The GGUF id of its type (Pagoda-internal types have none and are refused).
    type_id: u32,
    /// GGUF order (innermost first).
    ne: Vec<u64>,
    data: Vec<u8>,
}

/// Builds a GGUF v3 file in memory and writes it out.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a metadata key (replacing an earlier value of the same key).
    pub fn add_metadata(&mut self, key: impl Into<String>, value: GgufValue) -> &mut Self {
        let key = key.into();
        self.metadata.retain(|(k, _)| *k != key);
        self.metadata.push((key, value));
        self
    }

    pub fn add_str(&mut self, key: impl Into<String>, v: impl Into<String>) -> &mut Self {
        self.add_metadata(key, GgufValue::String(v.into()))
    }

    pub fn add_u32(&mut self, key: impl Into<String>, v: u32) -> &mut Self {
        self.add_metadata(key, GgufValue::U32(v))
    }

    pub fn add_f32(&mut self, key: impl Into<String>, v: f32) -> &mut Self {
        self.add_metadata(key, GgufValue::F32(v))
    }

    pub fn add_bool(&mut self, key: impl Into<String>, v: bool) -> &mut Self {
        self.add_metadata(key, GgufValue::Bool(v))
    }

    pub fn add_str_array(&mut self, key: impl Into<String>, v: Vec<String>) -> &mut Self {
        self.add_metadata(key, GgufValue::Array(GgufArray::String(v)))
    }

    /// Adds a tensor; `shape` is outermost first (`[rows, cols]`), as in
    /// [`crate::weights::TensorView::shape`]. `data` must be exactly the tensor's byte size.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        shape: &[usize],
        data: Vec<u8>,
    ) -> Result<&mut Self, ModelError> {
        let name = name.into();
        let err = |message: String| ModelError::Tensor {
            path: PathBuf::from("<gguf writer>"),
            tensor: name.clone(),
            message,
        };
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(err("added twice".into()));
        }
        if shape.is_empty() || shape.len() > super::MAX_DIMS {
            return Err(err(format!("shape {shape:?} must have 1 to 4 dimensions")));
        }
        let type_id = gguf_type_id(ty).map_err(err)?;
        let inner = shape[shape.len() - 1];
        let row = ty.row_bytes(inner)?;
        let rows: usize = shape[..shape.len() - 1].iter().product();
        if row * rows != data.len() {
            return Err(err(format!(
                "shape {shape:?} of {ty} needs {} bytes, got {}",
                row * rows,
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            ne: shape.iter().rev().map(|&d| d as u64).collect(),
            name,
            type_id,
            data,
        });
        Ok(self)
    }

    /// Adds an F32 tensor from values.
    pub fn add_f32_tensor(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        values: &[f32],
    ) -> Result<&mut Self, ModelError> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, GgmlType::F32, shape, data)
    }

    fn alignment(&self) -> usize {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_i128())
            .filter(|&a| a > 0 && (a as usize).is_power_of_two())
            .map(|a| a as usize)
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_string(&mut out, k);
            out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            write_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            write_string(&mut out, &t.name);
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for &d in &t.ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.type_id.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset += (t.data.len() as u64).div_ceil(align as u64) * align as u64;
        }
        pad(&mut out, align);
        let base = out.len();
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            debug_assert_eq!(out.len() - base, off as usize);
            out.extend_from_slice(&t.data);
            pad(&mut out, align);
        }
        out
    }

    /// Streams this writer's metadata and `tensors` (borrowed: name, type, shape outermost
    /// first, bytes) to `out`, one tensor at a time, without building the file in memory
    /// (tensors added with [`GgufWriter::add_tensor`] are not written: use one or the other).
    /// Each tensor is checked as `add_tensor` checks it, before anything is written. Returns
    /// the bytes written.
    pub fn write_borrowed(
        &self,
        tensors: &[(&str, GgmlType, &[usize], &[u8])],
        out: &mut impl Write,
    ) -> Result<u64, ModelError> {
        for &(name, ty, shape, data) in tensors {
            let want = tensor_bytes(name, ty, shape)?;
            if want != data.len() {
                return Err(tensor_error(
                    name,
                    format!(
                        "shape {shape:?} of {ty} needs {want} bytes, got {}",
                        data.len()
                    ),
                ));
            }
        }
        let infos: Vec<(&str, GgmlType, &[usize])> = tensors
            .iter()
            .map(|&(name, ty, shape, _)| (name, ty, shape))
            .collect();
        self.write_streamed(&infos, out, |i| {
            Ok::<_, ModelError>(std::borrow::Cow::Borrowed(tensors[i].3))
        })
    }

    /// Streams this writer's metadata and the tensors described by `infos` (name, type, shape
    /// outermost first) to `out`; tensor `i`'s bytes are asked of `data(i)` only when it is
    /// written, in order, so a caller can make each tensor just in time (peak memory: one
    /// tensor). The header is computed from the shapes; bytes of another length than the
    /// shape needs are an error. Returns the bytes written.
    pub fn write_streamed<'a, E: From<ModelError>>(
        &self,
        infos: &[(&str, GgmlType, &[usize])],
        out: &mut impl Write,
        mut data: impl FnMut(usize) -> Result<std::borrow::Cow<'a, [u8]>, E>,
    ) -> Result<u64, E> {
        let align = self.alignment();
        let mut seen = std::collections::HashSet::new();
        let mut head = Vec::new();
        head.extend_from_slice(&GGUF_MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(infos.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_string(&mut head, k);
            head.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            write_value(&mut head, v);
        }
        let mut offset = 0u64;
        let mut sizes = Vec::with_capacity(infos.len());
        for &(name, ty, shape) in infos {
            if !seen.insert(name) {
                return Err(tensor_error(name, "added twice".into()).into());
            }
            let size = tensor_bytes(name, ty, shape)?;
            write_string(&mut head, name);
            head.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for &d in shape.iter().rev() {
                head.extend_from_slice(&(d as u64).to_le_bytes());
            }
            let id = gguf_type_id(ty).map_err(|m| tensor_error(name, m))?;
            head.extend_from_slice(&id.to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset += (size as u64).div_ceil(align as u64) * align as u64;
            sizes.push(size);
        }
        pad(&mut head, align);
        let io = |source| ModelError::Io {
            path: PathBuf::from("<gguf writer output>"),
            source,
        };
        out.write_all(&head).map_err(io)?;
        let zeros = vec![0u8; align];
        for (i, (&(name, ty, shape), &size)) in infos.iter().zip(&sizes).enumerate() {
            let bytes = data(i)?;
            if bytes.len() != size {
                return Err(tensor_error(
                    name,
                    format!(
                        "shape {shape:?} of {ty} needs {size} bytes, got {}",
                        bytes.len()
                    ),
                )
                .into());
            }
            out.write_all(&bytes).map_err(io)?;
            let padded = size.div_ceil(align) * align;
            out.write_all(&zeros[..padded - size]).map_err(io)?;
        }
        Ok(head.len() as u64 + offset)
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), ModelError> {
        let path = path.as_ref();
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = std::fs::File::create(path).map_err(io)?;
        f.write_all(&self.to_bytes()).map_err(io)?;
        f.flush().map_err(io)
    }
}

fn tensor_error(name: &str, message: String) -> ModelError {
    ModelError::Tensor {
        path: PathBuf::from("<gguf writer>"),
        tensor: name.to_string(),
        message,
    }
}

/// The byte size of a tensor of `ty` and `shape` (outermost first), checked as `add_tensor`
/// checks it.
fn tensor_bytes(name: &str, ty: GgmlType, shape: &[usize]) -> Result<usize, ModelError> {
    if shape.is_empty() || shape.len() > super::MAX_DIMS {
        return Err(tensor_error(
            name,
            format!("shape {shape:?} must have 1 to 4 dimensions"),
        ));
    }
    let rows = shape[..shape.len() - 1]
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d));
    let row = ty.row_bytes(shape[shape.len() - 1])?;
    rows.and_then(|r| r.checked_mul(row))
        .ok_or_else(|| tensor_error(name, format!("shape {shape:?} overflows")))
}

fn pad(out: &mut Vec<u8>, align: usize) {
    let n = out.len().div_ceil(align) * align;
    out.resize(n, 0);
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => write_string(out, s),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Array(a) => write_array(out, a),
    }
}

fn write_array(out: &mut Vec<u8>, a: &GgufArray) {
    out.extend_from_slice(&(a.element_type() as u32).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match a {
        GgufArray::U8(v) => out.extend_from_slice(v),
        GgufArray::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        GgufArray::U16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I16(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::U32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::F32(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::Bool(v) => out.extend(v.iter().map(|&x| x as u8)),
        GgufArray::String(v) => v.iter().for_each(|s| write_string(out, s)),
        GgufArray::U64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::I64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::F64(v) => v
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgufArray::Array(v) => v.iter().for_each(|x| write_array(out, x)),
    }
}

/// The GGUF id of `ty`, or why it has none: Pagoda-internal weight types (made by online
/// quantization) cannot be written to a GGUF file.
fn gguf_type_id(ty: GgmlType) -> Result<u32, String> {
    ty.id().ok_or_else(|| {
        format!(
            "{ty} is a Pagoda-internal weight type (made by online quantization) with no GGUF \
             id; it cannot be written to a GGUF file"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    #[test]
    fn streaming_borrowed_tensors_gives_the_same_file() {
        let a: Vec<u8> = (0..4 * 6).map(|i| i as u8).collect();
        let b: Vec<u8> = (0..34).map(|i| (i * 3) as u8).collect();
        let mut whole = GgufWriter::new();
        whole.add_str("general.architecture", "llama");
        let meta = GgufWriter {
            metadata: whole.metadata.clone(),
            tensors: Vec::new(),
        };
        whole
            .add_tensor("a", GgmlType::F32, &[2, 3], a.clone())
            .unwrap();
        whole
            .add_tensor("b", GgmlType::Q8_0, &[1, 32], b.clone())
            .unwrap();
        let mut streamed = Vec::new();
        let n = meta
            .write_borrowed(
                &[
                    ("a", GgmlType::F32, &[2, 3], &a),
                    ("b", GgmlType::Q8_0, &[1, 32], &b),
                ],
                &mut streamed,
            )
            .unwrap();
        assert_eq!(streamed, whole.to_bytes());
        assert_eq!(n as usize, streamed.len());
        let e = meta
            .write_borrowed(&[("a", GgmlType::F32, &[2, 2], &a)], &mut Vec::new())
            .unwrap_err();
        assert!(e.to_string().contains("needs 16 bytes"), "{e}");
    }

    #[test]
    fn round_trips_every_value_type_and_tensors() {
        let mut w = GgufWriter::new();
        w.add_str("general.architecture", "llama")
            .add_metadata("a.u8", GgufValue::U8(7))
            .add_metadata("a.i8", GgufValue::I8(-7))
            .add_metadata("a.u16", GgufValue::U16(700))
            .add_metadata("a.i16", GgufValue::I16(-700))
            .add_u32("a.u32", 70000)
            .add_metadata("a.i32", GgufValue::I32(-70000))
            .add_f32("a.f32", 1.5)
            .add_bool("a.bool", true)
            .add_metadata("a.u64", GgufValue::U64(1 << 40))
            .add_metadata("a.i64", GgufValue::I64(-(1 << 40)))
            .add_metadata("a.f64", GgufValue::F64(2.25))
            .add_str_array("a.strs", vec!["x".into(), "yz".into()])
            .add_metadata(
                "a.nested",
                GgufValue::Array(GgufArray::Array(vec![
                    GgufArray::I32(vec![1, 2]),
                    GgufArray::String(vec!["q".into()]),
                ])),
            );
        w.add_f32_tensor("t.a", &[2, 3], &[1., 2., 3., 4., 5., 6.])
            .unwrap();
        w.add_tensor("t.b", GgmlType::Q8_0, &[1, 32], vec![0u8; 34])
            .unwrap();
        let f = GgufFile::from_bytes("mem.gguf", w.to_bytes()).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.get_u32("a.u32").unwrap(), 70000);
        assert_eq!(f.get_u32("a.u16").unwrap(), 700);
        assert!(f.get_u32("a.i32").is_err());
        assert_eq!(f.get_i64("a.i64").unwrap(), -(1 << 40));
        assert_eq!(f.get_f32("a.f64").unwrap(), 2.25);
        assert!(f.get_bool("a.bool").unwrap());
        assert_eq!(f.get_str_array("a.strs").unwrap(), ["x", "yz"]);
        assert_eq!(f.get_str_opt("missing").unwrap(), None);
        let e = f.get_str("a.u32").unwrap_err().to_string();
        assert!(e.contains("a.u32") && e.contains("string"), "{e}");
        assert_eq!(f.tensors().len(), 2);
        assert_eq!(f.tensors()[0].shape(), vec![2, 3]);
        assert_eq!(f.tensors()[0].ne, vec![3, 2]);
        let d = f.tensor_data(&f.tensors()[0]);
        assert_eq!(&d[4..8], &2f32.to_le_bytes());
        assert_eq!(f.tensors()[1].offset % 32, 0);
    }

    #[test]
    fn rejects_wrong_data_length() {
        let mut w = GgufWriter::new();
        assert!(w.add_tensor("x", GgmlType::F32, &[3], vec![0; 8]).is_err());
        assert!(w
            .add_tensor("x", GgmlType::Q4_0, &[16], vec![0; 9])
            .is_err());
    }

    #[test]
    fn pagoda_internal_types_are_refused_with_a_clear_error() {
        let mut w = GgufWriter::new();
        for ty in GgmlType::INTERNAL {
            let bytes = ty.row_bytes(128).unwrap();
            let e = w
                .add_tensor("w", ty, &[1, 128], vec![0; bytes])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                e.contains("Pagoda-internal") && e.contains(ty.name()),
                "{e}"
            );
        }
        assert!(w.to_bytes().len() > 4);
    }
}
