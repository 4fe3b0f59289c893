//! Tensor views over a memory-mapped model file (or an owned buffer), keyed by canonical
//! (GGUF) names.
//!
//! Invariants: a [`TensorView`]'s byte range was validated against its buffer when the view was
//! made (in bounds, exactly `ty.row_bytes(shape.last()) * rows` bytes), so [`TensorView::data`]
//! cannot fail or read out of bounds. Views of a file never copy it: they share the file's mmap
//! through an `Arc`. The one exception is a tensor made in memory — weights quantized online at
//! load time (pagoda-compress) — which owns its buffer ([`TensorView::owned`], same validation).
//! Shapes are outermost first: a matrix is `[rows = out_features, cols = in_features]` (GGUF
//! `ne` reversed; safetensors shapes as stored).

use crate::gguf::{Bytes, GgufFile};
use crate::ModelError;
use pagoda_kernels::GgmlType;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One tensor of a model file, borrowed from its mmap, or one made in memory that owns its
/// bytes ([`TensorView::owned`]).
#[derive(Clone)]
pub struct TensorView {
    pub name: String,
    pub ty: GgmlType,
    /// Outermost first: `[rows, cols]` for a matrix.
    pub shape: Vec<usize>,
    bytes: Arc<Bytes>,
    start: usize,
    len: usize,
}

impl std::fmt::Debug for TensorView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorView")
            .field("name", &self.name)
            .field("ty", &self.ty)
            .field("shape", &self.shape)
            .field("bytes", &self.len)
            .finish()
    }
}

impl TensorView {
    /// A view of `bytes[start..start + len]`; checks the range and the size for `ty` and `shape`.
    pub(crate) fn new(
        name: String,
        ty: GgmlType,
        shape: Vec<usize>,
        bytes: Arc<Bytes>,
        start: usize,
        len: usize,
    ) -> Result<TensorView, String> {
        // n_elements() and rows() multiply dimensions: every partial product must fit, even
        // when another dimension is zero.
        shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d.max(1)))
            .filter(|&n| n <= usize::MAX / 4)
            .ok_or_else(|| format!("shape {shape:?} is too large"))?;
        let inner = shape.last().copied().unwrap_or(1);
        let rows = shape
            .iter()
            .rev()
            .skip(1)
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| format!("shape {shape:?} overflows"))?;
        let row = ty.row_bytes(inner).map_err(|e| e.to_string())?;
        let want = row
            .checked_mul(rows)
            .ok_or_else(|| format!("shape {shape:?} overflows"))?;
        if want != len {
            return Err(format!(
                "shape {shape:?} of {ty} needs {want} bytes but the file gives it {len}"
            ));
        }
        if start.checked_add(len).is_none_or(|e| e > bytes.len()) {
            return Err(format!(
                "data ({len} bytes at file offset {start}) runs past the end of the file ({} bytes)",
                bytes.len()
            ));
        }
        Ok(TensorView {
            name,
            ty,
            shape,
            bytes,
            start,
            len,
        })
    }

    /// Rows `rows` of this matrix as a view of the same bytes, named `name` (no copy: every
    /// block format stores whole rows). `Err` for a range outside the matrix or a tensor that
    /// is not one.
    pub fn row_range(
        &self,
        name: impl Into<String>,
        rows: std::ops::Range<usize>,
    ) -> Result<TensorView, String> {
        let [n_rows, cols] = self.shape[..] else {
            return Err(format!(
                "{} is not a matrix: shape {:?}",
                self.name, self.shape
            ));
        };
        if rows.start > rows.end || rows.end > n_rows || n_rows == 0 {
            return Err(format!(
                "rows {rows:?} are outside {} ({n_rows} rows)",
                self.name
            ));
        }
        let row_bytes = self.len / n_rows;
        TensorView::new(
            name.into(),
            self.ty,
            vec![rows.len(), cols],
            self.bytes.clone(),
            self.start + rows.start * row_bytes,
            rows.len() * row_bytes,
        )
    }

    /// Slice `index` of a three-dimensional tensor (`[n, rows, cols]`) as a `[rows, cols]`
    /// matrix view of the same bytes, named `name` (no copy: every block format stores whole
    /// rows). `Err` for an index outside the tensor or a tensor that is not three-dimensional.
    pub fn outer_slice(&self, name: impl Into<String>, index: usize) -> Result<TensorView, String> {
        let [n, rows, cols] = self.shape[..] else {
            return Err(format!(
                "{} is not three-dimensional: shape {:?}",
                self.name, self.shape
            ));
        };
        if index >= n || rows == 0 {
            return Err(format!(
                "slice {index} is outside {} ({n} slices)",
                self.name
            ));
        }
        let slice_bytes = self.len / n;
        TensorView::new(
            name.into(),
            self.ty,
            vec![rows, cols],
            self.bytes.clone(),
            self.start + index * slice_bytes,
            slice_bytes,
        )
    }

    /// A view that owns `data`: a tensor made in memory (e.g. weights quantized at load time).
    /// `data` must be exactly `ty.row_bytes(shape.last()) * rows` bytes; `Err` says why not.
    pub fn owned(
        name: impl Into<String>,
        ty: GgmlType,
        shape: Vec<usize>,
        data: Vec<u8>,
    ) -> Result<TensorView, String> {
        let len = data.len();
        let name = name.into();
        TensorView::new(name, ty, shape, Arc::new(Bytes::Owned(data)), 0, len)
    }

    /// A view that owns `len` bytes starting at a 64-byte boundary (whole cache lines for
    /// SIMD loads), filled by `fill`; the same size rules as [`TensorView::owned`].
    pub fn owned_aligned<E>(
        name: impl Into<String>,
        ty: GgmlType,
        shape: Vec<usize>,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<TensorView, String>
    where
        E: std::fmt::Display,
    {
        let mut buf = vec![0u8; len + 63];
        let start = buf.as_ptr().align_offset(64).min(63);
        fill(&mut buf[start..start + len]).map_err(|e| e.to_string())?;
        TensorView::new(
            name.into(),
            ty,
            shape,
            Arc::new(Bytes::Owned(buf)),
            start,
            len,
        )
    }

    /// Drops the pages of `range` (bytes of this view's data) from the process's resident set
    /// when they are a file's mmap and a copy replaced them (weights repacked at load): the
    /// file stays mapped and the bytes readable, read again from the page cache if touched.
    /// No effect on owned bytes or an out-of-range `range`.
    pub fn release_pages(&self, range: std::ops::Range<usize>) {
        if range.start > range.end || range.end > self.len {
            return;
        }
        #[cfg(unix)]
        if let Bytes::Mmap(m) = &*self.bytes {
            // SAFETY: the mapping is a read-only private file mapping that nothing writes,
            // so after MADV_DONTNEED a read faults the same file bytes back in: every borrow
            // of the mapping keeps seeing the same contents.
            let released = unsafe {
                m.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    self.start + range.start,
                    range.len(),
                )
            };
            if let Err(e) = released {
                tracing::debug!(tensor = %self.name, error = %e, "madvise(DONTNEED) failed");
            }
        }
    }

    /// True when the view's bytes are an owned buffer (a tensor made in memory, or a file
    /// parsed from memory) rather than a file's mmap.
    pub fn is_owned(&self) -> bool {
        matches!(*self.bytes, Bytes::Owned(_))
    }

    /// Bytes of tensor data (`data().len()`).
    pub fn n_bytes(&self) -> usize {
        self.len
    }

    /// The raw bytes in the file's own format.
    pub fn data(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }

    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Rows of the tensor viewed as a matrix (product of all but the innermost dimension).
    pub fn rows(&self) -> usize {
        self.shape.iter().rev().skip(1).product()
    }

    /// The innermost dimension (`in_features` for a matrix).
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// The whole tensor dequantized to f32 (for small tensors such as norm weights).
    pub fn to_f32(&self) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0f32; self.n_elements()];
        let cols = self.cols();
        if cols == 0 {
            return Ok(out);
        }
        let row_bytes = self.ty.row_bytes(cols)?;
        for (src, dst) in self
            .data()
            .chunks_exact(row_bytes)
            .zip(out.chunks_exact_mut(cols))
        {
            pagoda_kernels::dequantize_row(self.ty, src, dst)?;
        }
        Ok(out)
    }
}

/// Every tensor of a model, by canonical name.
#[derive(Debug, Clone, Default)]
pub struct Weights {
    tensors: BTreeMap<String, TensorView>,
}

impl Weights {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a view; a second tensor of the same name is an error.
    pub fn insert(&mut self, view: TensorView) -> Result<(), String> {
        if self.tensors.contains_key(&view.name) {
            return Err(format!("tensor {:?} appears twice", view.name));
        }
        self.tensors.insert(view.name.clone(), view);
        Ok(())
    }

    /// Views of every tensor of a GGUF file (names are already canonical).
    pub fn from_gguf(file: &GgufFile) -> Result<Weights, ModelError> {
        let mut w = Weights::new();
        for info in file.tensors() {
            let view = TensorView::new(
                info.name.clone(),
                info.ty,
                info.shape(),
                file.bytes().clone(),
                file.data_offset() + info.offset as usize,
                info.size,
            )
            .map_err(|message| ModelError::Tensor {
                path: file.path().to_path_buf(),
                tensor: info.name.clone(),
                message,
            })?;
            w.insert(view).map_err(|message| ModelError::Tensor {
                path: file.path().to_path_buf(),
                tensor: info.name.clone(),
                message,
            })?;
        }
        Ok(w)
    }

    pub fn get(&self, name: &str) -> Result<&TensorView, ModelError> {
        self.tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Tensor `name` as `len` f32 values (a norm's weights, a bias, RoPE factors); an error
    /// naming the tensor when it has another number of elements.
    pub fn vector_f32(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let t = self.get(name)?;
        if t.n_elements() != len {
            return Err(ModelError::Tensor {
                path: Default::default(),
                tensor: name.to_string(),
                message: format!("{} elements, but the config implies {len}", t.n_elements()),
            });
        }
        t.to_f32()
    }

    /// A causal depthwise convolution's weights as f32, `[channels, taps]` (HF's `[channels,
    /// 1, taps]` reads the same), refused naming the shape expected when the element count
    /// differs (the recurrent layers' `ssm_conv1d`, LFM2's `shortconv.conv`).
    pub fn conv_f32(
        &self,
        name: &str,
        channels: usize,
        taps: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let t = self.get(name)?;
        if t.n_elements() != channels * taps {
            return Err(ModelError::Tensor {
                path: Default::default(),
                tensor: name.to_string(),
                message: format!(
                    "shape {:?}; a convolution of {taps} taps over {channels} channels was \
                     expected",
                    t.shape
                ),
            });
        }
        t.to_f32()
    }

    /// Takes a tensor out.
    pub fn remove(&mut self, name: &str) -> Option<TensorView> {
        self.tensors.remove(name)
    }

    /// Tensors in name order.
    pub fn iter(&self) -> impl Iterator<Item = &TensorView> {
        self.tensors.values()
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Total elements over all tensors (the parameter count).
    pub fn n_parameters(&self) -> u64 {
        self.tensors.values().map(|t| t.n_elements() as u64).sum()
    }

    /// Total bytes of tensor data.
    pub fn n_bytes(&self) -> u64 {
        self.tensors.values().map(|t| t.len as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufWriter;

    #[test]
    fn views_borrow_and_dequantize() {
        let mut w = GgufWriter::new();
        w.add_f32_tensor("n.weight", &[4], &[1., 2., 3., 4.])
            .unwrap();
        w.add_f32_tensor("m.weight", &[2, 3], &[1., 2., 3., 4., 5., 6.])
            .unwrap();
        let f = GgufFile::from_bytes("x.gguf", w.to_bytes()).unwrap();
        let ws = Weights::from_gguf(&f).unwrap();
        assert_eq!(ws.len(), 2);
        let m = ws.get("m.weight").unwrap();
        assert_eq!(m.shape, vec![2, 3]);
        assert_eq!((m.rows(), m.cols()), (2, 3));
        assert_eq!(m.to_f32().unwrap(), vec![1., 2., 3., 4., 5., 6.]);
        assert_eq!(
            ws.get("n.weight").unwrap().to_f32().unwrap(),
            vec![1., 2., 3., 4.]
        );
        assert!(matches!(ws.get("nope"), Err(ModelError::MissingTensor(n)) if n == "nope"));
        assert_eq!(ws.n_parameters(), 10);
    }

    #[test]
    fn owned_views_are_validated_like_file_views() {
        let v = TensorView::owned("q", GgmlType::F32, vec![2, 2], vec![0u8; 16]).unwrap();
        assert!(v.is_owned());
        assert_eq!((v.rows(), v.cols(), v.n_bytes()), (2, 2, 16));
        assert_eq!(v.to_f32().unwrap(), vec![0.0; 4]);
        let short = TensorView::owned("q", GgmlType::F32, vec![2, 2], vec![0u8; 15]);
        assert!(short.unwrap_err().contains("needs 16 bytes"));
        let partial = TensorView::owned("q", GgmlType::Q8_0, vec![1, 16], vec![0u8; 17]);
        assert!(partial.is_err(), "16 columns are not a whole Q8_0 block");
    }
}
