//! GGUF reader: parses the header, metadata and tensor table of a GGUF v2/v3 file that is
//! memory-mapped once; tensor data is never copied (see [`crate::weights`]).
//!
//! The file is untrusted input. Invariants established by [`GgufFile::open`] /
//! [`GgufFile::from_bytes`] before any tensor can be reached:
//! - every read is bounds-checked against the file length (a [`Cursor`] never reads past the end);
//! - no allocation is sized from an untrusted count without first checking that the remaining
//!   bytes could hold that many elements;
//! - nested arrays are at most [`MAX_ARRAY_DEPTH`] deep;
//! - every tensor has a known type, at most 4 dimensions, a whole number of blocks per row, an
//!   offset that is a multiple of the alignment, and a byte range inside the file that overlaps
//!   no other tensor; names are unique.
//!
//! Errors name the file and the key or tensor at fault ([`ModelError::Format`] / [`ModelError::Tensor`]).

pub mod writer;

use crate::ModelError;
use pagoda_kernels::GgmlType;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use writer::GgufWriter;

/// `"GGUF"` as a little-endian u32.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// Deepest nesting of arrays inside arrays that the reader accepts.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// GGML's maximum tensor rank.
pub const MAX_DIMS: usize = 4;

/// GGUF metadata value type ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl GgufValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use GgufValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Smallest number of bytes one value of this type occupies in the file.
    fn min_size(self) -> usize {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    pub fn name(self) -> &'static str {
        use GgufValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A typed array of metadata values (kept typed so that 262 144 scores stay a `Vec<f32>`).
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    /// An array of arrays (any element types).
    Array(Vec<GgufArray>),
}

impl GgufArray {
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
            GgufArray::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn element_type(&self) -> GgufValueType {
        match self {
            GgufArray::U8(_) => GgufValueType::U8,
            GgufArray::I8(_) => GgufValueType::I8,
            GgufArray::U16(_) => GgufValueType::U16,
            GgufArray::I16(_) => GgufValueType::I16,
            GgufArray::U32(_) => GgufValueType::U32,
            GgufArray::I32(_) => GgufValueType::I32,
            GgufArray::F32(_) => GgufValueType::F32,
            GgufArray::Bool(_) => GgufValueType::Bool,
            GgufArray::String(_) => GgufValueType::String,
            GgufArray::U64(_) => GgufValueType::U64,
            GgufArray::I64(_) => GgufValueType::I64,
            GgufArray::F64(_) => GgufValueType::F64,
            GgufArray::Array(_) => GgufValueType::Array,
        }
    }

    /// Element `i` as an i128 when the array holds integers (used for lossless conversions).
    fn int_at(&self, i: usize) -> Option<i128> {
        Some(match self {
            GgufArray::U8(v) => v[i] as i128,
            GgufArray::I8(v) => v[i] as i128,
            GgufArray::U16(v) => v[i] as i128,
            GgufArray::I16(v) => v[i] as i128,
            GgufArray::U32(v) => v[i] as i128,
            GgufArray::I32(v) => v[i] as i128,
            GgufArray::U64(v) => v[i] as i128,
            GgufArray::I64(v) => v[i] as i128,
            GgufArray::Bool(v) => v[i] as i128,
            _ => return None,
        })
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// A description like `u32` or `array of string` for error messages.
    pub fn type_description(&self) -> String {
        match self {
            GgufValue::Array(a) => format!("array of {}", a.element_type().name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as an integer, whatever integer width it was stored with.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v as i128,
            GgufValue::I8(v) => v as i128,
            GgufValue::U16(v) => v as i128,
            GgufValue::I16(v) => v as i128,
            GgufValue::U32(v) => v as i128,
            GgufValue::I32(v) => v as i128,
            GgufValue::U64(v) => v as i128,
            GgufValue::I64(v) => v as i128,
            _ => return None,
        })
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
}

/// One entry of the tensor table, validated against the file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// GGUF order: `ne[0]` is the innermost (contiguous) dimension.
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes of data (validated: `ty.row_bytes(ne[0]) * ne[1..].product()`).
    pub size: usize,
}

impl GgufTensorInfo {
    /// Shape outermost first (a matrix is `[rows, cols]`): `ne` reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn n_elements(&self) -> usize {
        self.ne.iter().map(|&d| d as usize).product()
    }
}

/// An opened GGUF file: parsed metadata and tensor table over a shared mmap.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    data: Arc<Bytes>,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    alignment: usize,
    /// Absolute file offset of the tensor data section.
    data_offset: usize,
}

/// The bytes of a model file: a read-only mmap, or an owned buffer (tests, fuzzing).
#[derive(Debug)]
pub enum Bytes {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mmap(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Maps `path` read-only.
pub(crate) fn map_file(path: &Path) -> Result<Arc<Bytes>, ModelError> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len == 0 {
        // mmap of an empty file fails on some platforms; an empty buffer parses to a clear error.
        return Ok(Arc::new(Bytes::Owned(Vec::new())));
    }
    // SAFETY: the map is read-only; the usual mmap caveat applies (another process truncating
    // or rewriting the file while it is mapped). Model files are treated as immutable.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Arc::new(Bytes::Mmap(map)))
}

/// A bounds-checked little-endian reader over untrusted bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, message: String) -> ModelError {
        ModelError::Format {
            path: self.path.to_path_buf(),
            message,
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], ModelError> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "file truncated: {} needs {n} bytes at offset {} but the file has {} bytes",
                what(),
                self.pos,
                self.buf.len()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], ModelError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, ModelError> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, ModelError> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, ModelError> {
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(self.err(format!(
                "{} claims a {len}-byte string at offset {} but only {} bytes remain",
                what(),
                self.pos,
                self.remaining()
            )));
        }
        let bytes = self.take(len as usize, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(self.err(format!("{} is not valid UTF-8: {e}", what()))),
        }
    }

    /// Checks that `count` elements of at least `min_size` bytes could fit in the rest of the file.
    fn check_count(
        &self,
        count: u64,
        min_size: usize,
        what: &dyn Fn() -> String,
    ) -> Result<usize, ModelError> {
        let max = (self.remaining() / min_size.max(1)) as u64;
        if count > max {
            return Err(self.err(format!(
                "{} claims {count} elements but the {} bytes left in the file hold at most {max}",
                what(),
                self.remaining()
            )));
        }
        Ok(count as usize)
    }

    fn value_type(&mut self, what: &dyn Fn() -> String) -> Result<GgufValueType, ModelError> {
        let id = self.u32(what)?;
        GgufValueType::from_id(id)
            .ok_or_else(|| self.err(format!("{} has unknown value type id {id}", what())))
    }

    fn value(
        &mut self,
        ty: GgufValueType,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> Result<GgufValue, ModelError> {
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(self.array::<1>(what)?[0]),
            GgufValueType::I8 => GgufValue::I8(self.array::<1>(what)?[0] as i8),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            GgufValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.array(what)?)),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            GgufValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.array(what)?)),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            GgufValueType::Bool => {
                let b = self.array::<1>(what)?[0];
                match b {
                    0 => GgufValue::Bool(false),
                    1 => GgufValue::Bool(true),
                    _ => return Err(self.err(format!("{} has invalid bool byte {b}", what()))),
                }
            }
            GgufValueType::String => GgufValue::String(self.string(what)?),
            GgufValueType::Array => GgufValue::Array(self.array_value(depth + 1, what)?),
        })
    }

    fn array_value(
        &mut self,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> Result<GgufArray, ModelError> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(self.err(format!(
                "{} nests arrays deeper than {MAX_ARRAY_DEPTH} levels",
                what()
            )));
        }
        let ety = self.value_type(what)?;
        let count = self.u64(what)?;
        let n = self.check_count(count, ety.min_size(), what)?;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let bytes = self.take(n * std::mem::size_of::<$t>(), what)?;
                GgufArray::$variant(
                    bytes
                        .chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or_default()))
                        .collect(),
                )
            }};
        }
        Ok(match ety {
            GgufValueType::U8 => GgufArray::U8(self.take(n, what)?.to_vec()),
            GgufValueType::I8 => {
                GgufArray::I8(self.take(n, what)?.iter().map(|&b| b as i8).collect())
            }
            GgufValueType::U16 => fixed!(U16, u16),
            GgufValueType::I16 => fixed!(I16, i16),
            GgufValueType::U32 => fixed!(U32, u32),
            GgufValueType::I32 => fixed!(I32, i32),
            GgufValueType::F32 => fixed!(F32, f32),
            GgufValueType::U64 => fixed!(U64, u64),
            GgufValueType::I64 => fixed!(I64, i64),
            GgufValueType::F64 => fixed!(F64, f64),
            GgufValueType::Bool => {
                let bytes = self.take(n, what)?;
                let mut v = Vec::with_capacity(n);
                for (i, &b) in bytes.iter().enumerate() {
                    match b {
                        0 => v.push(false),
                        1 => v.push(true),
                        _ => {
                            return Err(self
                                .err(format!("{} element {i} has invalid bool byte {b}", what())))
                        }
                    }
                }
                GgufArray::Bool(v)
            }
            GgufValueType::String => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.string(&|| format!("{} element {i}", what()))?);
                }
                GgufArray::String(v)
            }
            GgufValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.array_value(depth + 1, &|| format!("{} element {i}", what()))?);
                }
                GgufArray::Array(v)
            }
        })
    }
}

impl GgufFile {
    /// Memory-maps and parses the GGUF file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, ModelError> {
        let path = path.as_ref();
        let data = map_file(path)?;
        Self::parse(path.to_path_buf(), data)
    }

    /// Parses GGUF from an owned buffer; `path` is only used in error messages.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile, ModelError> {
        Self::parse(path.into(), Arc::new(Bytes::Owned(bytes)))
    }

    fn parse(path: PathBuf, data: Arc<Bytes>) -> Result<GgufFile, ModelError> {
        let buf: &[u8] = &data;
        let mut c = Cursor {
            buf,
            pos: 0,
            path: &path,
        };
        let magic = c.array::<4>(&|| "the GGUF magic".to_string())?;
        if magic != GGUF_MAGIC {
            return Err(c.err(format!(
                "not a GGUF file (starts with {:02x?}, expected \"GGUF\")",
                magic
            )));
        }
        let version = c.u32(&|| "the GGUF version".to_string())?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(c.err(
                    "GGUF version 1 is not supported (32-bit counts); re-convert the model with a current llama.cpp"
                        .to_string(),
                ))
            }
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                return Err(c.err(format!(
                    "big-endian GGUF (version {}) is not supported",
                    v.swap_bytes()
                )))
            }
            v => return Err(c.err(format!("unsupported GGUF version {v} (supported: 2, 3)"))),
        }
        let n_tensors = c.u64(&|| "the tensor count".to_string())?;
        let n_kv = c.u64(&|| "the metadata count".to_string())?;
        // Each KV takes at least 8 (key length) + 4 (type) + 1 bytes.
        let n_kv = c.check_count(n_kv, 13, &|| "the header's metadata count".to_string())?;

        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata key #{i}"))?;
            let what = || format!("metadata key {key:?}");
            let ty = c.value_type(&what)?;
            let value = c.value(ty, 0, &what)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(c.err(format!("metadata key {key:?} appears twice")));
            }
        }

        // Each tensor info takes at least 8 (name len) + 4 (n_dims) + 4 (type) + 8 (offset).
        let n_tensors =
            c.check_count(n_tensors, 24, &|| "the header's tensor count".to_string())?;
        let mut raw = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string(&|| format!("name of tensor #{i}"))?;
            let what = || format!("tensor {name:?}");
            let n_dims = c.u32(&what)?;
            if n_dims as usize > MAX_DIMS {
                return Err(tensor_err(
                    &path,
                    &name,
                    format!("has {n_dims} dimensions (at most {MAX_DIMS})"),
                ));
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                ne.push(c.u64(&what)?);
            }
            let ty_id = c.u32(&what)?;
            let offset = c.u64(&what)?;
            raw.push((name, ne, ty_id, offset));
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_i128() {
                Some(a) if a > 0 && a <= 1 << 20 && (a as usize).is_power_of_two() => a as usize,
                _ => {
                    return Err(c.err(format!(
                        "general.alignment must be a power of two integer, got {v:?}"
                    )))
                }
            },
        };
        let data_offset = c.pos.div_ceil(alignment) * alignment;
        let file_len = buf.len();
        if data_offset > file_len && n_tensors > 0 {
            return Err(c.err(format!(
                "file truncated: tensor data would start at offset {data_offset} but the file has {file_len} bytes"
            )));
        }
        let data_len = file_len.saturating_sub(data_offset);

        let mut tensors = Vec::with_capacity(raw.len());
        let mut names = HashSet::with_capacity(raw.len());
        for (name, ne, ty_id, offset) in raw {
            let info = validate_tensor(&path, name, ne, ty_id, offset, alignment, data_len)?;
            if !names.insert(info.name.clone()) {
                return Err(tensor_err(
                    &path,
                    &info.name,
                    "appears twice in the tensor table".into(),
                ));
            }
            tensors.push(info);
        }

        // No two tensors may share bytes.
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|&i| tensors[i].offset);
        for w in order.windows(2) {
            let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
            if a.offset + a.size as u64 > b.offset && a.size > 0 && b.size > 0 {
                return Err(tensor_err(
                    &path,
                    &b.name,
                    format!(
                        "data at offset {} overlaps tensor {:?} (offset {}, {} bytes)",
                        b.offset, a.name, a.offset, a.size
                    ),
                ));
            }
        }

        Ok(GgufFile {
            path,
            data,
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Absolute file offset where tensor data begins.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Size of the file in bytes.
    pub fn file_size(&self) -> usize {
        self.data.len()
    }

    /// The shared bytes of the file (tensor views borrow from it).
    pub(crate) fn bytes(&self) -> &Arc<Bytes> {
        &self.data
    }

    /// The data of tensor `info` (validated at open, so in bounds).
    pub fn tensor_data(&self, info: &GgufTensorInfo) -> &[u8] {
        // Infos from this file were validated at open; anything else gets an empty slice
        // rather than a panic.
        (self.data_offset as u64)
            .checked_add(info.offset)
            .and_then(|s| usize::try_from(s).ok())
            .and_then(|s| self.data.get(s..s.checked_add(info.size)?))
            .unwrap_or(&[])
    }

    /// The architecture named by `general.architecture`.
    pub fn architecture(&self) -> Result<&str, ModelError> {
        self.get_str("general.architecture")
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.metadata.contains_key(key)
    }

    fn missing(&self, key: &str, expected: &str) -> ModelError {
        ModelError::Format {
            path: self.path.clone(),
            message: format!("metadata key {key:?} ({expected}) is missing"),
        }
    }

    fn wrong_type(&self, key: &str, expected: &str, got: &GgufValue) -> ModelError {
        ModelError::Format {
            path: self.path.clone(),
            message: format!(
                "metadata key {key:?} should be {expected} but is {}",
                got.type_description()
            ),
        }
    }

    fn int_in_range(
        &self,
        key: &str,
        expected: &str,
        min: i128,
        max: i128,
    ) -> Result<Option<i128>, ModelError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => match v.as_i128() {
                Some(i) if i >= min && i <= max => Ok(Some(i)),
                Some(i) => Err(ModelError::Format {
                    path: self.path.clone(),
                    message: format!("metadata key {key:?} = {i} does not fit in {expected}"),
                }),
                None => Err(self.wrong_type(key, expected, v)),
            },
        }
    }

    /// An integer of any stored width that fits in u32; `None` when absent.
    pub fn get_u32_opt(&self, key: &str) -> Result<Option<u32>, ModelError> {
        Ok(self
            .int_in_range(key, "u32", 0, u32::MAX as i128)?
            .map(|i| i as u32))
    }

    pub fn get_u32(&self, key: &str) -> Result<u32, ModelError> {
        self.get_u32_opt(key)?
            .ok_or_else(|| self.missing(key, "u32"))
    }

    pub fn get_u64_opt(&self, key: &str) -> Result<Option<u64>, ModelError> {
        Ok(self
            .int_in_range(key, "u64", 0, u64::MAX as i128)?
            .map(|i| i as u64))
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, ModelError> {
        self.get_u64_opt(key)?
            .ok_or_else(|| self.missing(key, "u64"))
    }

    pub fn get_i64_opt(&self, key: &str) -> Result<Option<i64>, ModelError> {
        Ok(self
            .int_in_range(key, "i64", i64::MIN as i128, i64::MAX as i128)?
            .map(|i| i as i64))
    }

    pub fn get_i64(&self, key: &str) -> Result<i64, ModelError> {
        self.get_i64_opt(key)?
            .ok_or_else(|| self.missing(key, "i64"))
    }

    /// A count or size: a non-negative integer that fits in usize.
    pub fn get_usize_opt(&self, key: &str) -> Result<Option<usize>, ModelError> {
        Ok(self
            .int_in_range(key, "usize", 0, usize::MAX as i128)?
            .map(|i| i as usize))
    }

    pub fn get_usize(&self, key: &str) -> Result<usize, ModelError> {
        self.get_usize_opt(key)?
            .ok_or_else(|| self.missing(key, "usize"))
    }

    /// An f32 or f64 (or an integer) as f32.
    pub fn get_f32_opt(&self, key: &str) -> Result<Option<f32>, ModelError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| self.wrong_type(key, "f32", v)),
        }
    }

    pub fn get_f32(&self, key: &str) -> Result<f32, ModelError> {
        self.get_f32_opt(key)?
            .ok_or_else(|| self.missing(key, "f32"))
    }

    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>, ModelError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(GgufValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong_type(key, "bool", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, ModelError> {
        self.get_bool_opt(key)?
            .ok_or_else(|| self.missing(key, "bool"))
    }

    pub fn get_str_opt(&self, key: &str) -> Result<Option<&str>, ModelError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(GgufValue::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong_type(key, "string", v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, ModelError> {
        self.get_str_opt(key)?
            .ok_or_else(|| self.missing(key, "string"))
    }

    pub fn get_array_opt(&self, key: &str) -> Result<Option<&GgufArray>, ModelError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.wrong_type(key, "array", v)),
        }
    }

    pub fn get_str_array_opt(&self, key: &str) -> Result<Option<&[String]>, ModelError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(GgufArray::String(a))) => Ok(Some(a)),
            // An empty array of any element type is an empty string array.
            Some(GgufValue::Array(a)) if a.is_empty() => Ok(Some(&[])),
            Some(v) => Err(self.wrong_type(key, "array of string", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<&[String], ModelError> {
        self.get_str_array_opt(key)?
            .ok_or_else(|| self.missing(key, "array of string"))
    }

    /// An array of f32 (f64 and integer arrays are converted).
    pub fn get_f32_array_opt(&self, key: &str) -> Result<Option<Vec<f32>>, ModelError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(GgufArray::F32(a))) => Ok(Some(a.clone())),
            Some(GgufValue::Array(GgufArray::F64(a))) => {
                Ok(Some(a.iter().map(|&x| x as f32).collect()))
            }
            Some(GgufValue::Array(a))
                if a.element_type() != GgufValueType::String
                    && a.element_type() != GgufValueType::Array =>
            {
                let mut out = Vec::with_capacity(a.len());
                for i in 0..a.len() {
                    match a.int_at(i) {
                        Some(x) => out.push(x as f32),
                        None => {
                            return Err(self.wrong_type(
                                key,
                                "array of f32",
                                &GgufValue::Array(a.clone()),
                            ))
                        }
                    }
                }
                Ok(Some(out))
            }
            Some(v) => Err(self.wrong_type(key, "array of f32", v)),
        }
    }

    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, ModelError> {
        self.get_f32_array_opt(key)?
            .ok_or_else(|| self.missing(key, "array of f32"))
    }

    /// An array of integers of any width that all fit in i32.
    pub fn get_i32_array_opt(&self, key: &str) -> Result<Option<Vec<i32>>, ModelError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(GgufArray::I32(a))) => Ok(Some(a.clone())),
            Some(GgufValue::Array(a)) => {
                let mut out = Vec::with_capacity(a.len());
                for i in 0..a.len() {
                    match a.int_at(i) {
                        Some(x) if x >= i32::MIN as i128 && x <= i32::MAX as i128 => out.push(x as i32),
                        _ => {
                            return Err(ModelError::Format {
                                path: self.path.clone(),
                                message: format!(
                                    "metadata key {key:?} should be an array of i32 but is an array of {} (element {i} does not fit)",
                                    a.element_type().name()
                                ),
                            })
                        }
                    }
                }
                Ok(Some(out))
            }
            Some(v) => Err(self.wrong_type(key, "array of i32", v)),
        }
    }

    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, ModelError> {
        self.get_i32_array_opt(key)?
            .ok_or_else(|| self.missing(key, "array of i32"))
    }

    /// A per-layer count stored either as one integer or as an array with one entry per layer.
    pub fn get_usize_or_array_opt(&self, key: &str) -> Result<Option<Vec<usize>>, ModelError> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(GgufValue::Array(_)) => {
                let v = self.get_i32_array(key)?;
                v.into_iter()
                    .map(|x| {
                        usize::try_from(x).map_err(|_| ModelError::Format {
                            path: self.path.clone(),
                            message: format!("metadata key {key:?} has negative entry {x}"),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)
            }
            Some(_) => Ok(Some(vec![self.get_usize(key)?])),
        }
    }
}

fn tensor_err(path: &Path, tensor: &str, message: String) -> ModelError {
    ModelError::Tensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        message,
    }
}

fn validate_tensor(
    path: &Path,
    name: String,
    ne: Vec<u64>,
    ty_id: u32,
    offset: u64,
    alignment: usize,
    data_len: usize,
) -> Result<GgufTensorInfo, ModelError> {
    let ty = GgmlType::from_id(ty_id)
        .ok_or_else(|| tensor_err(path, &name, format!("has unknown tensor type id {ty_id}")))?;
    // Every partial product of the dimensions must fit (zero dimensions included: a [0, 2^40,
    // 2^40] tensor holds nothing but would overflow a product of its other dimensions).
    let mut n: u64 = 1;
    for &d in &ne {
        n = n.checked_mul(d.max(1)).ok_or_else(|| {
            tensor_err(
                path,
                &name,
                format!("dimensions {ne:?} overflow the element count"),
            )
        })?;
    }
    if n > usize::MAX as u64 / 4 {
        return Err(tensor_err(
            path,
            &name,
            format!("dimensions {ne:?} are too large"),
        ));
    }
    let ne0 = ne.first().copied().unwrap_or(1) as usize;
    let row = ty.row_bytes(ne0).map_err(|_| {
        tensor_err(
            path,
            &name,
            format!(
                "row length {ne0} of type {ty} is not a whole number of {}-element blocks",
                ty.block_size()
            ),
        )
    })?;
    let rows: u64 = ne.iter().skip(1).product();
    let size = (row as u64)
        .checked_mul(rows)
        .filter(|&s| s <= usize::MAX as u64)
        .ok_or_else(|| tensor_err(path, &name, format!("size of {ne:?} {ty} overflows")))?;
    if offset % alignment as u64 != 0 {
        return Err(tensor_err(
            path,
            &name,
            format!("data offset {offset} is not a multiple of the alignment {alignment}"),
        ));
    }
    let end = offset.checked_add(size);
    if end.is_none_or(|e| e > data_len as u64) {
        return Err(tensor_err(
            path,
            &name,
            format!(
                "data ({size} bytes at offset {offset} of the data section) runs past the end of the file (data section holds {data_len} bytes)"
            ),
        ));
    }
    Ok(GgufTensorInfo {
        name,
        ne,
        ty,
        offset,
        size: size as usize,
    })
}
