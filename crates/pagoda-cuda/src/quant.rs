//! Quantized weights in GPU memory: [`QuantizedMatrix`] (a weight matrix's rows exactly as the
//! CPU stores them, uploaded once) and [`QuantKernels`], its typed launches: the decode GEMV
//! (dequantize in registers; int8 `dp4a` for the 8-bit formats), the prefill GEMM
//! (dequantize tiles to bf16, then cuBLAS) and the embedding lookup, with their scratch
//! ([`QuantWorkspace`]). The kernels are `kernels/quant.cu`.
//!
//! Formats ([`QuantFormat`]): GGUF's Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K and Pagoda's INT8
//! (per-row f32 scale), INT4 in groups of 64 / 128 (symmetric or not; groups of 32 are Q4_0 /
//! Q4_1 blocks already), NF4 and NF4_DQ, and MXFP4 (gpt-oss's experts), with the byte layouts of pagoda-kernels' `quant/`
//! files (that crate is the reference; this one depends on it only in its tests).
//!
//! Invariants:
//! - A matrix's device buffer is the host bytes as given, not repacked: `rows` rows of
//!   [`QuantFormat::row_bytes`]`(cols)` bytes, so its GPU memory is the file's size of the
//!   tensor ([`QuantizedMatrix::bytes`]). The kernels read every format in place (each
//!   block's fields sit at even offsets except NF4_DQ's and MXFP4's 17-byte blocks, which
//!   are read by bytes).
//! - [`QuantKernels::matmul`] takes the GEMV for at most [`GEMV_MAX_ROWS`] activation rows
//!   and the tiled bf16 GEMM above (weights and activations rounded to bf16 as the dense
//!   path's, f32 accumulation, tiles in the caller's [`QuantWorkspace`]). The GEMV is
//!   [`QuantKernels::gemv`] (f32 activations, f32 products and sums: the CPU's
//!   dequantize-then-multiply up to the order of the sums) except for the 8-bit formats,
//!   which take [`QuantKernels::gemv_int8`]: activations quantized to int8 per 32 values
//!   (as the CPU's Q8_0 partner, with an f32 scale), `dp4a` integer dot products.
//! - As in `ops.rs`: every size, buffer length, alignment and the buffers' context are
//!   checked before a launch ([`CudaError::Shape`] naming the kernel); every launch is on
//!   the context's one stream.

use crate::blas::Blas;
use crate::error::CudaError;
use crate::kernels::{KernelCache, QUANT};
use crate::ops::{launch, Check};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};
use half::bf16;
use std::sync::Arc;

/// The most activation rows the GEMV takes; [`QuantKernels::matmul`] uses the GEMM above.
pub const GEMV_MAX_ROWS: usize = 8;

/// Weight rows per GEMV block (one warp each; `GEMV_WARPS` in quant.cu).
const GEMV_WARPS: usize = 4;

/// Threads of the dequantize and embedding launches.
const THREADS: u32 = 256;

/// Most blocks of the grid-stride dequantize launch.
const MAX_BLOCKS: usize = 1 << 16;

/// A weight format the GPU multiplies by in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// `[d: f16][qs: i8 x 32]`, 34 bytes per 32.
    Q8_0,
    /// `[d: f16][qs: 16]`, `x = d (q - 8)`, 18 bytes per 32 (also INT4 g32 symmetric).
    Q4_0,
    /// `[d: f16][m: f16][qs: 16]`, `x = d q + m`, 20 bytes per 32 (also INT4 g32).
    Q4_1,
    /// GGUF Q4_K, 144 bytes per 256.
    Q4K,
    /// GGUF Q5_K, 176 bytes per 256.
    Q5K,
    /// GGUF Q6_K, 210 bytes per 256.
    Q6K,
    /// A row `[s: f32][q: i8 x cols]`, `x = s q` (Pagoda's INT8 per channel).
    Int8,
    /// Groups of 64: `[d: f16][m: f16][codes: 32]`, `x = d q + m`.
    Int4G64,
    /// Groups of 64: `[d: f16][codes: 32]`, `x = d (q - 8)`.
    Int4G64Sym,
    /// Groups of 128: `[d: f16][m: f16][codes: 64]`.
    Int4G128,
    /// Groups of 128: `[d: f16][codes: 64]`.
    Int4G128Sym,
    /// NF4 blocks of 64: `[absmax: f32][codes: 32]`, `x = NF4[q] absmax`.
    Nf4,
    /// An NF4 row with double-quantized absmaxes: `[mean: f32][c: f32 per 256 blocks]
    /// [k: i8 per block][codes: 32 per block]`, `absmax = k c + mean`.
    Nf4Dq,
    /// MXFP4 blocks of 32: `[e: E8M0][codes: 16]`, `x = KVALUES[q] 2^(e - 128)` (17 bytes).
    Mxfp4,
}

impl QuantFormat {
    /// Every format, in the order of the kernels' format ids (`F_*` in quant.cu).
    pub const ALL: [QuantFormat; 14] = [
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q4K,
        QuantFormat::Q5K,
        QuantFormat::Q6K,
        QuantFormat::Int8,
        QuantFormat::Int4G64,
        QuantFormat::Int4G64Sym,
        QuantFormat::Int4G128,
        QuantFormat::Int4G128Sym,
        QuantFormat::Nf4,
        QuantFormat::Nf4Dq,
        QuantFormat::Mxfp4,
    ];

    /// The kernels' suffix (`qgemv_<name>`, ...), as in [`QUANT`]'s entries.
    pub fn name(self) -> &'static str {
        match self {
            QuantFormat::Q8_0 => "q8_0",
            QuantFormat::Q4_0 => "q4_0",
            QuantFormat::Q4_1 => "q4_1",
            QuantFormat::Q4K => "q4_k",
            QuantFormat::Q5K => "q5_k",
            QuantFormat::Q6K => "q6_k",
            QuantFormat::Int8 => "int8",
            QuantFormat::Int4G64 => "int4_g64",
            QuantFormat::Int4G64Sym => "int4_g64_sym",
            QuantFormat::Int4G128 => "int4_g128",
            QuantFormat::Int4G128Sym => "int4_g128_sym",
            QuantFormat::Nf4 => "nf4",
            QuantFormat::Nf4Dq => "nf4_dq",
            QuantFormat::Mxfp4 => "mxfp4",
        }
    }

    /// Elements per block (a row's length must be a multiple).
    pub fn block_elems(self) -> usize {
        match self {
            QuantFormat::Q8_0
            | QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Int8
            | QuantFormat::Mxfp4 => 32,
            QuantFormat::Int4G64 | QuantFormat::Int4G64Sym | QuantFormat::Nf4 => 64,
            QuantFormat::Nf4Dq => 64,
            QuantFormat::Int4G128 | QuantFormat::Int4G128Sym => 128,
            QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => 256,
        }
    }

    /// Bytes of a row of `cols` elements; `None` when `cols` is not a positive multiple of
    /// [`QuantFormat::block_elems`] (or the size overflows).
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        let be = self.block_elems();
        if cols == 0 || !cols.is_multiple_of(be) {
            return None;
        }
        let nb = cols / be;
        match self {
            QuantFormat::Int8 => cols.checked_add(4),
            QuantFormat::Nf4Dq => nb.checked_mul(33)?.checked_add(4 + 4 * nb.div_ceil(256)),
            _ => nb.checked_mul(match self {
                QuantFormat::Q8_0 => 34,
                QuantFormat::Q4_0 => 18,
                QuantFormat::Q4_1 => 20,
                QuantFormat::Q4K => 144,
                QuantFormat::Q5K => 176,
                QuantFormat::Q6K => 210,
                QuantFormat::Int4G64 => 36,
                QuantFormat::Int4G64Sym => 34,
                QuantFormat::Int4G128 => 68,
                QuantFormat::Int4G128Sym => 66,
                QuantFormat::Nf4 => 36,
                QuantFormat::Mxfp4 => 17,
                QuantFormat::Int8 | QuantFormat::Nf4Dq => return None,
            }),
        }
    }
}

impl std::fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A weight matrix `[rows, cols]` in GPU memory in its stored format (see the module doc).
#[derive(Debug)]
pub struct QuantizedMatrix {
    data: CudaSlice<u8>,
    format: QuantFormat,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

impl QuantizedMatrix {
    /// Uploads `bytes` (`rows` rows of `format.row_bytes(cols)` bytes, as the CPU holds them)
    /// on `stream`. The sizes are checked first ([`CudaError::Shape`]).
    pub fn upload(
        stream: &Arc<CudaStream>,
        format: QuantFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self, CudaError> {
        let shape = |message: String| CudaError::Shape {
            kernel: "quantized upload",
            message,
        };
        let row_bytes = format.row_bytes(cols).ok_or_else(|| {
            shape(format!(
                "{format}: {cols} columns are not a positive multiple of its {} elements per block",
                format.block_elems()
            ))
        })?;
        let need = rows
            .checked_mul(row_bytes)
            .ok_or_else(|| shape(format!("{format}: {rows} x {row_bytes} bytes overflows")))?;
        if rows == 0 || bytes.len() != need {
            return Err(shape(format!(
                "{format} [{rows}, {cols}] needs {need} bytes ({rows} rows of {row_bytes}), \
                 given {}",
                bytes.len()
            )));
        }
        let data = stream.clone_htod(bytes).map_err(|e| CudaError::Driver {
            call: "cuMemcpyHtoD",
            message: e.to_string(),
        })?;
        Ok(QuantizedMatrix {
            data,
            format,
            rows,
            cols,
            row_bytes,
        })
    }

    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Output features (weight rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (elements per row).
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// GPU memory the weights take: the stored size, `rows * row_bytes`.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The raw blocks.
    pub fn data(&self) -> &CudaSlice<u8> {
        &self.data
    }
}

/// One format's kernels.
#[derive(Debug)]
struct FormatKernels {
    gemv: CudaFunction,
    dequant: CudaFunction,
    embed: CudaFunction,
}

/// The quantized-weight kernels of one GPU context, ready to launch on its stream.
#[derive(Debug)]
pub struct QuantKernels {
    stream: Arc<CudaStream>,
    /// In [`QuantFormat::ALL`] order.
    formats: Vec<FormatKernels>,
    quantize_q8_act: CudaFunction,
    gemv8_q8_0: CudaFunction,
    gemv8_int8: CudaFunction,
}

/// Bf16 values of the GEMM's weight tile by default (32 MiB): large enough that each tile's
/// GEMM keeps the GPU busy, small beside the weights.
pub const DEFAULT_TILE_ELEMS: usize = 16 << 20;

/// Scratch of the quantized products, grown when a call needs more (never shrunk): the
/// GEMM's tile of dequantized weights (at most `tile_limit` values, or one row when a row
/// is longer) and the int8 activations of the 8-bit GEMV with their scales.
#[derive(Debug)]
pub struct QuantWorkspace {
    tile_limit: usize,
    tile: Option<CudaSlice<bf16>>,
    xq: Option<CudaSlice<i8>>,
    xs: Option<CudaSlice<f32>>,
}

impl Default for QuantWorkspace {
    fn default() -> Self {
        Self::with_tile_limit(DEFAULT_TILE_ELEMS)
    }
}

impl QuantWorkspace {
    pub fn new() -> Self {
        Self::default()
    }

    /// A workspace whose GEMM tiles hold at most `elems` bf16 values (whole rows; one row
    /// when a row is longer).
    pub fn with_tile_limit(elems: usize) -> Self {
        QuantWorkspace {
            tile_limit: elems,
            tile: None,
            xq: None,
            xs: None,
        }
    }

    /// Bytes of the tile of a `[rows, cols]` matrix: what [`QuantKernels::matmul`] allocates.
    pub fn tile_bytes(&self, rows: usize, cols: usize) -> usize {
        rows.saturating_mul(cols).min(self.tile_limit.max(cols)) * 2
    }

    /// Device memory it holds, in bytes.
    pub fn bytes(&self) -> usize {
        self.tile.as_ref().map_or(0, |t| t.len() * 2)
            + self.xq.as_ref().map_or(0, |t| t.len())
            + self.xs.as_ref().map_or(0, |t| t.len() * 4)
    }
}

/// `buf` holding at least `n` values (reallocated on `stream` when shorter).
fn grow<'a, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    buf: &'a mut Option<CudaSlice<T>>,
    stream: &Arc<CudaStream>,
    n: usize,
) -> Result<&'a mut CudaSlice<T>, CudaError> {
    if buf.as_ref().is_none_or(|b| b.len() < n) {
        *buf = None; // free first: the old buffer is not needed
        *buf = Some(
            stream
                .alloc_zeros::<T>(n.max(1))
                .map_err(|e| CudaError::Driver {
                    call: "cuMemAllocAsync (quantized workspace)",
                    message: format!("{e} ({n} values)"),
                })?,
        );
    }
    buf.as_mut().ok_or_else(|| CudaError::Driver {
        call: "cuMemAllocAsync (quantized workspace)",
        message: "buffer missing after allocation".to_string(),
    })
}

/// Whether device address `p` is a multiple of `align` bytes.
fn aligned(c: &Check<'_>, name: &str, p: u64, align: u64) -> Result<(), CudaError> {
    if !p.is_multiple_of(align) {
        return Err(c.shape(format!(
            "{name} is at device address {p:#x}, not {align}-byte aligned"
        )));
    }
    Ok(())
}

impl QuantKernels {
    /// Compiles (or loads from `cache`) `quant.cu` for `arch` into the stream's context.
    pub(crate) fn load(
        stream: &Arc<CudaStream>,
        cache: &KernelCache,
        arch: &'static str,
    ) -> Result<Self, CudaError> {
        let functions = crate::ops::load_module(stream, cache, arch, &QUANT)?;
        // QUANT's entries: per format in QuantFormat::ALL order, gemv, dequant, embed; then
        // quantize_q8_act, qgemv8_q8_0, qgemv8_int8.
        let per_format = 3 * QuantFormat::ALL.len();
        let [q8_act, gemv8_q8_0, gemv8_int8] = functions.get(per_format..).unwrap_or(&[]) else {
            return Err(CudaError::Driver {
                call: "cuModuleGetFunction",
                message: "the quant module has another number of entry points than listed"
                    .to_string(),
            });
        };
        let formats = functions[..per_format]
            .chunks_exact(3)
            .map(|f| FormatKernels {
                gemv: f[0].clone(),
                dequant: f[1].clone(),
                embed: f[2].clone(),
            })
            .collect();
        Ok(QuantKernels {
            stream: stream.clone(),
            formats,
            quantize_q8_act: q8_act.clone(),
            gemv8_q8_0: gemv8_q8_0.clone(),
            gemv8_int8: gemv8_int8.clone(),
        })
    }

    fn check(&self, kernel: &'static str) -> Check<'_> {
        Check {
            kernel,
            stream: &self.stream,
        }
    }

    fn of(&self, format: QuantFormat) -> Result<&FormatKernels, CudaError> {
        let i = QuantFormat::ALL
            .iter()
            .position(|f| *f == format)
            .unwrap_or(usize::MAX);
        self.formats.get(i).ok_or_else(|| CudaError::Driver {
            call: "cuModuleGetFunction",
            message: format!("no kernels loaded for {format}"),
        })
    }

    /// `out[r, i] = Σ_c W[i, c] · x[r, c]` for `m` activation rows, 1 ≤ `m` ≤
    /// [`GEMV_MAX_ROWS`] (`x`: `[m, cols]` f32, 16-byte aligned; `out`: `[m, rows]` f32),
    /// dequantizing in registers. `m = 0` launches nothing.
    pub fn gemv(
        &self,
        w: &QuantizedMatrix,
        x: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<f32>,
        m: usize,
    ) -> Result<(), CudaError> {
        let c = self.check("qgemv");
        if m == 0 {
            return Ok(());
        }
        if m > GEMV_MAX_ROWS {
            return Err(c.shape(format!(
                "{} activation rows: the GEMV takes at most {GEMV_MAX_ROWS}",
                m
            )));
        }
        let (n, k) = (w.rows, w.cols);
        let (n_i, k_i, m_i) = (c.int("rows", n)?, c.int("cols", k)?, c.int("m", m)?);
        let rb = w.row_bytes as i64;
        let (wp, _w) = c.input("w", &w.data, w.data.len())?;
        let (xp, _x) = c.input("x", x, c.mul("x", m, k)?)?;
        aligned(&c, "x", xp, 16)?;
        let (op, _o) = c.output("out", out, c.mul("out", m, n)?)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(GEMV_WARPS) as u32, 1, 1),
            block_dim: (GEMV_WARPS as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = &self.of(w.format)?.gemv;
        launch!(
            self.stream,
            c.kernel,
            f,
            cfg,
            &wp,
            &rb,
            &xp,
            &op,
            &n_i,
            &k_i,
            &m_i
        )
    }

    /// [`QuantKernels::gemv`] for the 8-bit formats (Q8_0, INT8) on int8 dot products: `x`
    /// is first quantized into `ws` (per 32 values, `s = amax / 127`, `q = round(x / s)`,
    /// as the CPU's Q8_0 activations but with an f32 scale), then two `dp4a` per 8 weights.
    /// The activations' rounding is the only difference from [`QuantKernels::gemv`].
    pub fn gemv_int8(
        &self,
        w: &QuantizedMatrix,
        x: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<f32>,
        m: usize,
        ws: &mut QuantWorkspace,
    ) -> Result<(), CudaError> {
        let (kernel, f) = match w.format {
            QuantFormat::Q8_0 => ("qgemv8_q8_0", &self.gemv8_q8_0),
            QuantFormat::Int8 => ("qgemv8_int8", &self.gemv8_int8),
            other => {
                return Err(CudaError::Shape {
                    kernel: "qgemv8",
                    message: format!("{other} weights: the int8 GEMV takes Q8_0 and INT8 only"),
                })
            }
        };
        let c = self.check(kernel);
        if m == 0 {
            return Ok(());
        }
        if m > GEMV_MAX_ROWS {
            return Err(c.shape(format!(
                "{m} activation rows: the GEMV takes at most {GEMV_MAX_ROWS}"
            )));
        }
        let (n, k) = (w.rows, w.cols);
        let (n_i, k_i, m_i) = (c.int("rows", n)?, c.int("cols", k)?, c.int("m", m)?);
        let len = c.mul("x", m, k)?;
        let nblocks = len / 32;
        let xq = grow(&mut ws.xq, &self.stream, len)?;
        let (qp, _q) = c.output("xq", xq, len)?;
        let xs = grow(&mut ws.xs, &self.stream, nblocks)?;
        let (sp, _s) = c.output("xs", xs, nblocks)?;
        aligned(&c, "xq", qp, 8)?;
        let (xp, _x) = c.input("x", x, len)?;
        let cfg = LaunchConfig {
            grid_dim: (
                (nblocks * 32)
                    .div_ceil(THREADS as usize)
                    .clamp(1, MAX_BLOCKS) as u32,
                1,
                1,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let nblocks_l = nblocks as i64;
        launch!(
            self.stream,
            "quantize_q8_act",
            &self.quantize_q8_act,
            cfg,
            &xp,
            &qp,
            &sp,
            &nblocks_l
        )?;
        let rb = w.row_bytes as i64;
        let (wp, _w) = c.input("w", &w.data, w.data.len())?;
        let (op, _o) = c.output("out", out, c.mul("out", m, n)?)?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(GEMV_WARPS) as u32, 1, 1),
            block_dim: (GEMV_WARPS as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            self.stream,
            c.kernel,
            f,
            cfg,
            &wp,
            &rb,
            &qp,
            &sp,
            &op,
            &n_i,
            &k_i,
            &m_i
        )
    }

    /// Rows `r0 .. r0 + nrows` of `w` as bf16 (round to nearest even) into `out`
    /// (`[nrows, cols]`, 16-byte aligned).
    pub fn dequantize(
        &self,
        w: &QuantizedMatrix,
        r0: usize,
        nrows: usize,
        out: &mut impl DevicePtrMut<bf16>,
    ) -> Result<(), CudaError> {
        let c = self.check("qdequant");
        self.dequantize_checked(&c, w, r0, nrows, out).map(|_| ())
    }

    /// [`QuantKernels::dequantize`]'s checks and launch; returns `out`'s address.
    fn dequantize_checked<'a>(
        &'a self,
        c: &'a Check<'a>,
        w: &'a QuantizedMatrix,
        r0: usize,
        nrows: usize,
        out: &'a mut impl DevicePtrMut<bf16>,
    ) -> Result<(u64, cudarc::driver::SyncOnDrop<'a>), CudaError> {
        let end = r0.checked_add(nrows).filter(|&e| e <= w.rows);
        if end.is_none() {
            return Err(c.shape(format!(
                "rows {r0}..{r0}+{nrows} of a matrix of {} rows",
                w.rows
            )));
        }
        let k = w.cols;
        let (r0_i, nrows_i, k_i) = (c.int("r0", r0)?, c.int("nrows", nrows)?, c.int("cols", k)?);
        let rb = w.row_bytes as i64;
        let (wp, _w) = c.input("w", &w.data, w.data.len())?;
        let (op, guard) = c.output("out", out, c.mul("out", nrows, k)?)?;
        aligned(c, "out", op, 16)?;
        if nrows > 0 {
            let groups = nrows * (k / 8);
            let cfg = LaunchConfig {
                grid_dim: (
                    groups.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32,
                    1,
                    1,
                ),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let f = &self.of(w.format)?.dequant;
            launch!(
                self.stream,
                c.kernel,
                f,
                cfg,
                &wp,
                &rb,
                &op,
                &r0_i,
                &nrows_i,
                &k_i
            )?;
        }
        Ok((op, guard))
    }

    /// `out[r] = W[tokens[r]] · scale` (`tokens`: `[rows]`, `out`: `[rows, cols]` f32); a
    /// token outside `0..w.rows()` gives a row of NaN (the device cannot return an error).
    pub fn embed(
        &self,
        w: &QuantizedMatrix,
        tokens: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<f32>,
        rows: usize,
        scale: f32,
    ) -> Result<(), CudaError> {
        let c = self.check("qembed");
        if rows == 0 {
            return Ok(());
        }
        let k = w.cols;
        let (rows_i, k_i, vocab_i) = (
            c.int("rows", rows)?,
            c.int("cols", k)?,
            c.int("vocab", w.rows)?,
        );
        let rb = w.row_bytes as i64;
        let (wp, _w) = c.input("w", &w.data, w.data.len())?;
        let (tp, _t) = c.input("tokens", tokens, rows)?;
        let (op, _o) = c.output("out", out, c.mul("out", rows, k)?)?;
        let cfg = LaunchConfig {
            grid_dim: (rows_i as u32, 1, 1),
            block_dim: ((k / 8).div_ceil(32).clamp(1, 8) as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = &self.of(w.format)?.embed;
        launch!(
            self.stream,
            c.kernel,
            f,
            cfg,
            &wp,
            &rb,
            &tp,
            &op,
            &rows_i,
            &k_i,
            &vocab_i,
            &scale
        )
    }

    /// `out = x · Wᵀ` (`x`: `[m, cols]`, `out`: `[m, rows]` f32). For `m` ≤
    /// [`GEMV_MAX_ROWS`] the GEMV on `x`: [`QuantKernels::gemv_int8`] for Q8_0 and INT8,
    /// [`QuantKernels::gemv`] for the others. Above, `W` dequantized to bf16 a tile of rows
    /// at a time into `ws` and multiplied by cuBLAS, reading `x16`, which must hold `x`
    /// rounded to bf16 (the caller's staging, shared by the linears of one input).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        blas: &Blas,
        w: &QuantizedMatrix,
        x: &impl DevicePtr<f32>,
        x16: &impl DevicePtr<bf16>,
        out: &mut impl DevicePtrMut<f32>,
        m: usize,
        ws: &mut QuantWorkspace,
    ) -> Result<(), CudaError> {
        if m <= GEMV_MAX_ROWS {
            return match w.format {
                QuantFormat::Q8_0 | QuantFormat::Int8 => self.gemv_int8(w, x, out, m, ws),
                _ => self.gemv(w, x, out, m),
            };
        }
        let c = self.check("quantized gemm");
        if !Arc::ptr_eq(blas.stream(), &self.stream) {
            return Err(c.shape(
                "the cuBLAS handle is bound to another stream than these kernels'".to_string(),
            ));
        }
        let (n, k) = (w.rows, w.cols);
        let tile_len = ws.tile_bytes(n, k) / 2;
        let tile = grow(&mut ws.tile, &self.stream, tile_len)?;
        let tile_rows = (tile.len() / k).min(n);
        if tile_rows == 0 {
            return Err(c.shape(format!(
                "the tile holds {} bf16 values, less than one row of {k}",
                tile.len()
            )));
        }
        let (xp, _x) = c.input("x16", x16, c.mul("x16", m, k)?)?;
        let (op, _o) = c.output("out", out, c.mul("out", m, n)?)?;
        let mut r0 = 0;
        while r0 < n {
            let nt = tile_rows.min(n - r0);
            let dc = self.check("qdequant");
            let (tp, _t) = self.dequantize_checked(&dc, w, r0, nt, tile)?;
            // SAFETY: x16 holds m·k bf16 values and out m·n f32 (checked above), so the
            // columns r0..r0+nt of out's m rows (stride n) lie inside it; the tile holds nt·k
            // values just written by the dequantize launch, ordered before the GEMM on the
            // one stream; k ≥ 1 (a format's block).
            unsafe { blas.gemm_bf16_raw(xp, tp, op + 4 * r0 as u64, m, nt, k, n, 1.0, 0.0)? };
            r0 += nt;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tile_is_whole_rows_within_the_limit_and_at_least_one_row() {
        let ws = QuantWorkspace::with_tile_limit(1000);
        assert_eq!(ws.tile_bytes(3, 100), 300 * 2, "a small matrix fits whole");
        assert_eq!(ws.tile_bytes(50, 100), 1000 * 2, "a large one: the limit");
        assert_eq!(
            ws.tile_bytes(50, 4096),
            4096 * 2,
            "a row longer than the limit"
        );
        assert_eq!(ws.bytes(), 0, "nothing allocated before a call");
        let default = QuantWorkspace::default();
        assert_eq!(default.tile_bytes(usize::MAX, 896), DEFAULT_TILE_ELEMS * 2);
    }

    #[test]
    fn row_sizes_refuse_partial_blocks_and_overflow() {
        for f in QuantFormat::ALL {
            assert_eq!(f.row_bytes(0), None, "{f}");
            assert_eq!(f.row_bytes(f.block_elems() / 2), None, "{f}");
            assert!(f.row_bytes(f.block_elems()).is_some(), "{f}");
        }
        // More bytes than elements: the size overflows.
        let huge = usize::MAX / 32 * 32;
        assert_eq!(QuantFormat::Q8_0.row_bytes(huge), None);
        // INT8 and NF4_DQ rows carry a header; the others are whole blocks.
        assert_eq!(QuantFormat::Int8.row_bytes(64), Some(68));
        assert_eq!(QuantFormat::Nf4Dq.row_bytes(576), Some(8 + 9 + 288));
        assert_eq!(QuantFormat::Q6K.row_bytes(512), Some(420));
    }
}
