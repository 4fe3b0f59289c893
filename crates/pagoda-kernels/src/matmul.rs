//! The matrix product driver: `out[n, rows] = x[n, cols] · W[rows, cols]ᵀ` straight from the
//! weight blocks.
//!
//! Activations are quantized once per call into the weight type's partner format; weight
//! rows are never dequantized to a matrix. Work is split over row chunks on the global rayon
//! pool; within a chunk every token is computed against the same rows, so a chunk of weights
//! is read from memory once and then from cache for the remaining tokens (prefill).
//!
//! Q4_K and Q6_K prefill on AVX-512 VNNI instead repacks 8-row strips (`simd::avx512_q4k`).
//!
//! Matrices packed at load into 16-row strips (`crate::packed`'s format) are computed here
//! too (`matmul_strips`, and `compute_strips` for `matmul_group`): the AVX-512 VNNI strip
//! kernel (`simd::avx512_packed`) where it runs, else unpacked to rows per call.
//!
//! Invariant: chunks own disjoint row ranges, so each output element is written by exactly
//! one task; shapes are validated before any kernel runs, so kernels never see a short row.

use rayon::prelude::*;

use crate::packed::{
    block_geometry, format, not_packable, strip_header, unpack, WeightLayout, STRIP_ROWS,
};
use crate::quant::dequantize_row;
use crate::simd::{kernel, ActLayout, RowKernel, NT};
use crate::{GgmlType, Isa, KernelError};

/// A borrowed weight matrix: row `r` is output feature `r`, `cols` input features, each row
/// `ty.row_bytes(cols)` bytes. In the [`WeightLayout::Rows`] layout rows are contiguous, one
/// after the other; in [`WeightLayout::Strips16`] 16 rows are interleaved per strip
/// ([`crate::packed`]). `data` may be unaligned.
#[derive(Clone, Copy, Debug)]
pub struct WeightMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    pub layout: WeightLayout,
}

impl<'a> WeightMatrix<'a> {
    /// Checks that `cols` is whole blocks and that `data` holds exactly `rows` rows.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        let row_bytes = ty.row_bytes(cols)?;
        let expected = rows
            .checked_mul(row_bytes)
            .ok_or(KernelError::SizeOverflow { ty, elements: cols })?;
        if data.len() != expected {
            return Err(KernelError::WrongByteLength {
                ty,
                expected,
                actual: data.len(),
                what: format!("a {rows}x{cols} weight matrix"),
            });
        }
        Ok(WeightMatrix {
            ty,
            rows,
            cols,
            data,
            layout: WeightLayout::Rows,
        })
    }

    /// A matrix whose `data` is [`WeightMatrix::pack`]'s strips: checks that the type and
    /// shape are packable and that `data` holds exactly `rows` rows.
    pub fn packed(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        if !crate::packed::packable(ty, rows, cols) {
            return Err(KernelError::Shape(format!(
                "a {rows}x{cols} {} matrix cannot be in {}-row strips",
                ty.name(),
                crate::packed::STRIP_ROWS
            )));
        }
        let w = WeightMatrix::new(ty, rows, cols, data)?;
        Ok(WeightMatrix {
            layout: WeightLayout::Strips16,
            ..w
        })
    }

    /// Re-checks a matrix whose public fields may have been set by hand.
    pub(crate) fn validated(&self) -> Result<Self, KernelError> {
        match self.layout {
            WeightLayout::Rows => WeightMatrix::new(self.ty, self.rows, self.cols, self.data),
            WeightLayout::Strips16 => {
                WeightMatrix::packed(self.ty, self.rows, self.cols, self.data)
            }
        }
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.data.len().checked_div(self.rows).unwrap_or(0)
    }

    /// Bytes of row `r` (`r < rows`).
    #[inline]
    pub(crate) fn row(&self, r: usize, row_bytes: usize) -> &'a [u8] {
        &self.data[r * row_bytes..(r + 1) * row_bytes]
    }

    /// This matrix (row layout) reordered into [`crate::packed`]'s strips.
    pub fn pack(&self) -> Result<Vec<u8>, KernelError> {
        let mut out = vec![0u8; self.data.len()];
        self.pack_into(&mut out)?;
        Ok(out)
    }

    /// [`WeightMatrix::pack`] into `out` (exactly `data.len()` bytes; align it to 64 for the
    /// fastest loads).
    pub fn pack_into(&self, out: &mut [u8]) -> Result<(), KernelError> {
        if self.layout != WeightLayout::Rows {
            return Err(not_packable(self.ty, self.rows, self.cols));
        }
        crate::packed::pack_into(self.ty, self.rows, self.cols, self.data, out)
    }

    /// Dequantizes row `r` into `out` (`out.len() == cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        if r >= self.rows {
            return Err(KernelError::Shape(format!(
                "row {r} of a matrix with {} rows",
                self.rows
            )));
        }
        if out.len() != self.cols {
            return Err(KernelError::Shape(format!(
                "output of {} elements for a row of {} columns",
                out.len(),
                self.cols
            )));
        }
        let rb = self.ty.row_bytes(self.cols)?;
        match self.layout {
            WeightLayout::Rows => dequantize_row(self.ty, self.row(r, rb), out),
            WeightLayout::Strips16 => {
                // An embedding lookup per token: reuse one row of scratch per thread.
                thread_local! {
                    static ROW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
                }
                ROW.with_borrow_mut(|row| {
                    row.resize(rb, 0);
                    crate::packed::unpack_row(self.ty, self.cols, self.data, r, row);
                    dequantize_row(self.ty, row, out)
                })
            }
        }
    }
}

/// `out[t*rows + r] = dot(W[r, :], x[t, :])` for `x: [n, cols]`, `out: [n, rows]`, on the
/// fastest available ISA path.
pub fn matmul(
    w: &WeightMatrix<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    matmul_with_isa(crate::best_isa(), w, x, n, out)
}

/// Raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: tasks write disjoint elements only (row chunks are disjoint), see the module
// invariant; the pointer outlives the parallel section.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Writes element `i`.
    ///
    /// # Safety
    /// `i` is in bounds of the output and no other task writes it.
    #[inline]
    unsafe fn write(&self, i: usize, v: f32) {
        *self.0.add(i) = v;
    }

    /// Reads element `i`.
    ///
    /// # Safety
    /// As for `write`.
    #[inline]
    unsafe fn read(&self, i: usize) -> f32 {
        *self.0.add(i)
    }
}

/// Tokens from which Q4_K / Q6_K on AVX-512 VNNI takes the repacked strip GEMM (below it,
/// each token's result equals its one-token result: see [`crate::BATCH_INVARIANT_ROWS`]).
const Q4K_GEMM_MIN_TOKENS: usize = crate::BATCH_INVARIANT_ROWS;
/// Bytes of weights one chunk should cover when several tokens reuse it from cache.
const PREFILL_CHUNK_BYTES: usize = 96 * 1024;
/// Columns per segment when prefill splits long rows (keeps an 8-token activation tile of
/// one segment, about 19 KiB of Q8_K, in L1).
const SEGMENT_COLS: usize = 2048;
/// Below this many weight bytes a matrix gets one chunk per thread.
const SMALL_MATRIX_BYTES: usize = 1 << 20;
/// Chunks per thread for load balance.
const CHUNKS_PER_THREAD: usize = 4;

/// As [`matmul`], on path `isa` (an error when this CPU lacks it).
pub fn matmul_with_isa(
    isa: Isa,
    w: &WeightMatrix<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    if !isa.is_available() {
        return Err(KernelError::IsaUnavailable(isa.name()));
    }
    // Re-validate: the fields are public, so a matrix may not have come through `new`.
    let w = w.validated()?;
    let (rows, cols) = (w.rows, w.cols);
    if n.checked_mul(cols) != Some(x.len()) {
        return Err(KernelError::Shape(format!(
            "activations hold {} values, expected {n} tokens x {cols} columns",
            x.len()
        )));
    }
    if n.checked_mul(rows) != Some(out.len()) {
        return Err(KernelError::Shape(format!(
            "output holds {} values, expected {n} tokens x {rows} rows",
            out.len()
        )));
    }
    if n == 0 || rows == 0 {
        return Ok(());
    }
    if cols == 0 {
        out.fill(0.0);
        return Ok(());
    }
    if w.layout == WeightLayout::Strips16 {
        return matmul_strips(isa, &w, x, n, out);
    }
    let row_bytes = w.ty.row_bytes(cols)?;
    match kernel(isa, w.ty) {
        RowKernel::Quant {
            partner,
            quantize,
            dot,
        } => {
            let arow = partner.row_bytes(cols)?;
            // SAFETY: `isa` is available (checked above), so its `quantize` may run.
            let a = unsafe { quantize_activations(quantize, x, n, cols, arow) };
            // Q4_K / Q6_K prefill on VNNI: 8-row strips, one `vpdpbusd` per 8 codes x 8 rows.
            #[cfg(target_arch = "x86_64")]
            if isa == Isa::Avx512
                && matches!(w.ty, GgmlType::Q4_K | GgmlType::Q6_K)
                && n >= Q4K_GEMM_MIN_TOKENS
                && partner == ActLayout::Blocks(GgmlType::Q8_K)
                && crate::cpu::features().avx512_vnni
            {
                let nb = cols / 256;
                // SAFETY: AVX-512 is available (checked above) with VNNI; shapes were
                // validated: `rows` rows of `nb` Q4_K blocks, `n` Q8_K rows of `nb` blocks.
                unsafe {
                    if w.ty == GgmlType::Q4_K {
                        crate::simd::avx512_q4k::gemm(w.data, rows, nb, &a, n, out)
                    } else {
                        crate::simd::avx512_q4k::gemm_q6_k(w.data, rows, nb, &a, n, out)
                    }
                };
                return Ok(());
            }
            // Prefill over long rows: split each row into column segments so the token
            // tile's activations for one segment stay in L1 (block layouts only, where a
            // row slices cleanly by blocks).
            // Segments hold whole blocks of both the weights and the partner (block sizes
            // are powers of two, so the larger one divides the segment); row types (with a
            // header) are never split.
            let (segs, seg_cols, abb, pbs) = match partner {
                ActLayout::Blocks(pt)
                    if n >= crate::BATCH_INVARIANT_ROWS
                        && cols > SEGMENT_COLS
                        && w.ty.is_blockwise() =>
                {
                    let bs = pt.block_size().max(w.ty.block_size());
                    let sc = (SEGMENT_COLS / bs).max(1) * bs;
                    (cols.div_ceil(sc), sc, pt.type_size(), pt.block_size())
                }
                _ => (1, usize::MAX, 0, 1),
            };
            let (wbs, wbb) = (w.ty.block_size(), w.ty.type_size());
            run_chunks(&w, row_bytes, n, segs, out, |wrow, seg, t0, nt, o| {
                if segs == 1 {
                    // SAFETY: `isa` is available; `wrow` is a whole row and tokens
                    // t0..t0+nt have `arow` bytes each in `a`.
                    unsafe { dot(wrow, &a[t0 * arow..(t0 + nt) * arow], arow, nt, o) }
                } else {
                    let c0 = seg * seg_cols;
                    let c1 = (c0 + seg_cols).min(cols);
                    let (a0, a1) = (c0 / pbs * abb, c1 / pbs * abb);
                    let a_seg = &a[t0 * arow + a0..(t0 + nt - 1) * arow + a1];
                    // SAFETY: as above, for columns c0..c1 (whole blocks of both types) of
                    // the weight row and of each of the `nt` activation rows (`arow` bytes
                    // apart).
                    unsafe { dot(&wrow[c0 / wbs * wbb..c1 / wbs * wbb], a_seg, arow, nt, o) }
                }
            });
        }
        RowKernel::Float { dot } => {
            run_chunks(&w, row_bytes, n, 1, out, |wrow, _, t0, nt, o| {
                // SAFETY: as above, with `cols` f32 values per token.
                unsafe { dot(wrow, &x[t0 * cols..(t0 + nt) * cols], cols, nt, o) }
            });
        }
        RowKernel::Dequant => {
            // Per chunk: one row of f32 scratch, refilled for every weight row.
            run_dequant_chunks(&w, row_bytes, x, n, out)?;
        }
    }
    Ok(())
}

/// `[n, arow]` activation bytes: each of the `n` rows of `x` (`cols` values) quantized by
/// `quantize` into `arow` bytes.
///
/// # Safety
/// `quantize` belongs to an ISA this CPU has, and writes `arow` bytes for `cols` values.
pub(crate) unsafe fn quantize_activations(
    quantize: crate::simd::QuantizeRow,
    x: &[f32],
    n: usize,
    cols: usize,
    arow: usize,
) -> Vec<u8> {
    let mut a = vec![0u8; n * arow];
    if n < 8 {
        // Decode: a fork would cost more than quantizing a few rows.
        for (dst, src) in a.chunks_exact_mut(arow).zip(x.chunks_exact(cols)) {
            // SAFETY: the caller's contract; the lengths match.
            unsafe { quantize(src, dst) };
        }
    } else {
        a.par_chunks_mut(arow)
            .zip(x.par_chunks(cols))
            .with_min_len(4)
            // SAFETY: as above.
            .for_each(|(dst, src)| unsafe { quantize(src, dst) });
    }
    a
}

/// Splits the rows into chunks and, per chunk, computes every token against its rows,
/// [`NT`] tokens per kernel call. `f(row, seg, t0, nt, out)` fills `out[..nt]` with the dots
/// of column segment `seg` (of `segs`) of `row` and tokens `t0..t0 + nt`; segments are
/// summed into the output in order.
fn run_chunks<F>(
    w: &WeightMatrix<'_>,
    row_bytes: usize,
    n: usize,
    segs: usize,
    out: &mut [f32],
    f: F,
) where
    F: Fn(&[u8], usize, usize, usize, &mut [f32; NT]) + Sync,
{
    let rows = w.rows;
    let chunk = chunk_rows(rows, row_bytes, n);
    let n_chunks = rows.div_ceil(chunk);
    let ptr = OutPtr(out.as_mut_ptr());
    let body = |c: usize| {
        let r0 = c * chunk;
        // SAFETY: `out` is `[n, rows]` (validated by the caller) and only this chunk
        // touches rows r0..r1.
        unsafe { compute_rows(w, row_bytes, r0..(r0 + chunk).min(rows), n, segs, ptr, &f) };
    };
    if n_chunks == 1 {
        body(0);
    } else {
        crate::hot_pool::parallel_for(n_chunks, &body);
    }
}

/// Computes rows `rs` of `w` for all `n` tokens into `out` (`[n, w.rows]`), as
/// [`run_chunks`] describes: per column segment, per tile of [`NT`] tokens, per row. Each
/// output element's value depends only on its row, its token and `segs`, never on which
/// rows or tokens share the call.
///
/// # Safety
/// `out` points to `n * w.rows` elements, and no other task touches rows `rs` meanwhile.
pub(crate) unsafe fn compute_rows<F>(
    w: &WeightMatrix<'_>,
    row_bytes: usize,
    rs: std::ops::Range<usize>,
    n: usize,
    segs: usize,
    out: OutPtr,
    f: &F,
) where
    F: Fn(&[u8], usize, usize, usize, &mut [f32; NT]) + Sync,
{
    let rows = w.rows;
    let mut o = [0.0f32; NT];
    for seg in 0..segs {
        for t0 in (0..n).step_by(NT) {
            let nt = NT.min(n - t0);
            for r in rs.clone() {
                f(w.row(r, row_bytes), seg, t0, nt, &mut o);
                for (i, v) in o[..nt].iter().enumerate() {
                    let at = (t0 + i) * rows + r;
                    // SAFETY: `t0 + i < n`, `r < rows`, so in bounds of `out` ([n, rows]);
                    // only this task touches rows `rs` (caller's contract), and segment 0
                    // wrote the element before later segments add to it.
                    unsafe {
                        let prev = if seg == 0 { 0.0 } else { out.read(at) };
                        out.write(at, prev + *v)
                    };
                }
            }
        }
    }
}

fn run_dequant_chunks(
    w: &WeightMatrix<'_>,
    row_bytes: usize,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let (rows, cols) = (w.rows, w.cols);
    let chunk = chunk_rows(rows, row_bytes, n);
    let ptr = OutPtr(out.as_mut_ptr());
    (0..rows.div_ceil(chunk)).into_par_iter().try_for_each(|c| {
        let r0 = c * chunk;
        let r1 = (r0 + chunk).min(rows);
        let mut scratch = vec![0.0f32; cols];
        for r in r0..r1 {
            dequantize_row(w.ty, w.row(r, row_bytes), &mut scratch)?;
            for t in 0..n {
                let v = crate::ops::dot_f32(&scratch, &x[t * cols..(t + 1) * cols]);
                // SAFETY: as in `run_chunks`.
                unsafe { ptr.write(t * rows + r, v) };
            }
        }
        Ok(())
    })
}

/// Rows per chunk: enough chunks for every thread, and for several tokens few enough rows
/// that the chunk's weights stay in cache while all tokens pass over them.
pub(crate) fn chunk_rows(rows: usize, row_bytes: usize, n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let bytes = rows * row_bytes;
    // Small matrices (most of a small model): one chunk per thread, as few tasks as possible.
    let per_thread = if bytes < SMALL_MATRIX_BYTES {
        1
    } else {
        CHUNKS_PER_THREAD
    };
    let mut chunk = rows.div_ceil(threads * per_thread);
    if n > 1 {
        chunk = chunk.min((PREFILL_CHUNK_BYTES / row_bytes.max(1)).max(1));
    }
    // Tiny matrices: one chunk, no fork overhead.
    if bytes * n.max(1) < 16 * 1024 {
        chunk = rows;
    }
    chunk.max(1)
}

// ------------------------------------------------------------------ packed (strip) matrices

/// Each block's integer code sum of `n` `Split32` activation rows (`arow` bytes each, `cols`
/// values): `[n, cols / 32]`, what Q4_0-layout strips take their code offset off with.
pub(crate) fn block_sums(a: &[u8], arow: usize, n: usize, cols: usize) -> Vec<i32> {
    let mut sums = Vec::with_capacity(n * (cols / 32));
    for row in a.chunks_exact(arow).take(n) {
        sums.extend(
            row[..cols]
                .chunks_exact(32)
                .map(|b| b.iter().map(|&c| c as i8 as i32).sum::<i32>()),
        );
    }
    sums
}

/// Whether the strip kernel runs on `isa` (else packed matrices are unpacked per call).
pub(crate) fn strip_kernel_on(isa: Isa) -> bool {
    cfg!(target_arch = "x86_64") && isa == Isa::Avx512 && crate::cpu::features().avx512_vnni
}

/// Whether a packed matrix of `ty` needs the activations' [`block_sums`].
pub(crate) fn needs_isums(ty: GgmlType) -> bool {
    format(ty).is_some_and(|f| f.offset != 0)
}

/// Computes strips `ss` of the packed `w` for all `n` tokens into `out` (`[n, w.rows]`),
/// [`TOKENS`](crate::simd::avx512_packed::TOKENS) tokens per pass over a strip.
///
/// # Safety
/// The strip kernel runs on this CPU ([`strip_kernel_on`]); `w` was validated as packed;
/// `a` holds `n` rows of `w.cols` values in the type's partner layout (`Split32`, or Q8_K
/// blocks for Q4_K), `arow` bytes each, and `isums` their
/// [`block_sums`] if [`needs_isums`]; `out` points to `n * w.rows` elements of which no other
/// task touches the rows of `ss` meanwhile.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn compute_strips(
    w: &WeightMatrix<'_>,
    ss: std::ops::Range<usize>,
    n: usize,
    (a, arow, isums): (&[u8], usize, &[i32]),
    out: OutPtr,
) {
    use crate::simd::avx512_packed::{strip_kernel, TokenRow, TOKENS};
    let Some(f) = format(w.ty) else {
        return; // the caller validated a packed matrix
    };
    let nb = w.cols / f.block_cols();
    let (stride, d_in, m_in) = block_geometry(f);
    let strip_len = strip_header(f) + nb * stride;
    let empty = TokenRow {
        act: std::ptr::null(),
        isums: std::ptr::null(),
        out: std::ptr::null_mut(),
    };
    for t0 in (0..n).step_by(TOKENS) {
        let nt = TOKENS.min(n - t0);
        for s in ss.clone() {
            let mut tok = [empty; TOKENS];
            for (i, tr) in tok[..nt].iter_mut().enumerate() {
                let t = t0 + i;
                *tr = TokenRow {
                    act: a.as_ptr().add(t * arow),
                    isums: if f.offset == 0 {
                        std::ptr::null()
                    } else {
                        isums.as_ptr().add(t * nb)
                    },
                    out: out.0.add(t * w.rows + s * STRIP_ROWS),
                };
            }
            // SAFETY: the caller's contract: strip `s` is whole, the tokens' rows and sums
            // are in bounds, and outputs `16s..16s + 16` of each token are this task's.
            strip_kernel(
                f,
                w.data.as_ptr().add(s * strip_len),
                nb,
                (stride, d_in, m_in),
                &tok[..nt],
            );
        }
    }
}

/// Strips per task when `w` (packed, `n` tokens) is cut as `matmul` cuts row chunks.
pub(crate) fn strips_per_task(w: &WeightMatrix<'_>, n: usize) -> usize {
    let row_bytes = w.data.len() / w.rows.max(1);
    chunk_rows(w.rows, row_bytes, n).div_ceil(STRIP_ROWS).max(1)
}

/// `matmul` of a validated packed matrix (shapes checked by the caller).
pub(crate) fn matmul_strips(
    isa: Isa,
    w: &WeightMatrix<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    #[cfg(target_arch = "x86_64")]
    if strip_kernel_on(isa) {
        // The strips take the activations the type's row kernel takes.
        let RowKernel::Quant {
            partner, quantize, ..
        } = kernel(isa, w.ty)
        else {
            return Err(KernelError::Shape(format!(
                "no integer kernel for {}",
                w.ty
            )));
        };
        let arow = partner.row_bytes(w.cols)?;
        // SAFETY: `isa` is available (checked by the caller), so its quantizer may run.
        let a = unsafe { quantize_activations(quantize, x, n, w.cols, arow) };
        let isums = if needs_isums(w.ty) {
            block_sums(&a, arow, n, w.cols)
        } else {
            Vec::new()
        };
        let strips = w.rows / STRIP_ROWS;
        let per_task = strips_per_task(w, n);
        let ptr = OutPtr(out.as_mut_ptr());
        let body = |s0: usize| {
            let ss = s0..(s0 + per_task).min(strips);
            // SAFETY: the strip kernel runs here (checked); `w` is validated and packed,
            // `a` is `n` rows; tasks own disjoint strips of `out` (`[n, rows]`).
            unsafe { compute_strips(w, ss, n, (&a, arow, &isums), ptr) };
        };
        if per_task >= strips {
            body(0);
        } else {
            crate::hot_pool::parallel_for(strips.div_ceil(per_task), &|t| body(t * per_task));
        }
        return Ok(());
    }
    // Portable path: unpack to rows and take the row kernels.
    let rows = unpack(w.ty, w.rows, w.cols, w.data);
    let rw = WeightMatrix::new(w.ty, w.rows, w.cols, &rows)?;
    matmul_with_isa(isa, &rw, x, n, out)
}
