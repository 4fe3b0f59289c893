//! [`Kernels`]: the loaded CUDA kernels of one GPU context and their typed launches (the row
//! and elementwise ones here; paged attention in `attention.rs`).
//!
//! Buffers are cudarc's: inputs `&impl DevicePtr<T>` and outputs `&mut impl DevicePtrMut<T>`,
//! so a caller passes a whole [`CudaSlice`](cudarc::driver::CudaSlice) or a sub-view
//! (`slice.slice(a..b)` for an input, `&mut slice.slice_mut(a..b)` for an output). The
//! pointer is taken with `device_ptr(stream)` rather than pushed as a slice argument, which
//! is what lets one signature take slices and views alike.
//!
//! Invariants: every launch checks, before anything is enqueued, that each size fits the
//! kernel's `int` arguments, that each buffer holds at least the elements the kernel touches
//! (a buffer may be longer: the first elements are used) and belongs to this context; a
//! failure is [`CudaError::Shape`] naming the kernel and the sizes, never an out-of-bounds
//! access. Every launch is enqueued on the context's one stream (so calls are ordered) and a
//! launch failure is [`CudaError::Launch`] naming the kernel. A call with no element to touch
//! launches nothing.

use crate::error::CudaError;
use crate::kernels::{KernelCache, KernelModule, ATTENTION, ELEMENTWISE};
use cudarc::driver::{
    CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchConfig, SyncOnDrop,
};
use half::bf16;
use std::sync::Arc;

/// The activation of a gated MLP (`gate = act(gate) * up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedActivation {
    /// SwiGLU: `silu(g) = g / (1 + e^-g)`, as `pagoda_kernels::ops::silu_mul`.
    Silu,
    /// GeGLU with the tanh approximation, as `pagoda_kernels::ops::gelu_tanh_mul`.
    GeluTanh,
    /// gpt-oss's clamped SwiGLU, as `pagoda_kernels::ops::swiglu_oai_mul`.
    SwigluOai,
}

/// Which pairs of a head RoPE rotates (mirrors `pagoda_kernels::ops::RopeStyle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i + 1)` (llama.cpp's "normal" RoPE; the CPU's `Interleaved`).
    Normal,
    /// Halves `(i, i + half)`.
    Neox,
}

/// Threads of the 1-D grid-stride kernels.
const THREADS: u32 = 256;
/// Most blocks of a grid-stride launch (each thread then loops).
const MAX_BLOCKS: usize = 1 << 16;

/// One kernel's argument checks: sizes, buffer lengths and the buffers' context.
pub(crate) struct Check<'s> {
    pub(crate) kernel: &'static str,
    pub(crate) stream: &'s Arc<CudaStream>,
}

impl<'s> Check<'s> {
    pub(crate) fn shape(&self, message: String) -> CudaError {
        CudaError::Shape {
            kernel: self.kernel,
            message,
        }
    }

    /// `v` as a kernel's `int`.
    pub(crate) fn int(&self, name: &str, v: usize) -> Result<i32, CudaError> {
        i32::try_from(v).map_err(|_| self.shape(format!("{name} = {v} exceeds i32::MAX")))
    }

    /// `a * b`, or an error when it overflows.
    pub(crate) fn mul(&self, what: &str, a: usize, b: usize) -> Result<usize, CudaError> {
        a.checked_mul(b)
            .ok_or_else(|| self.shape(format!("{what}: {a} x {b} overflows")))
    }

    fn check_len<T>(
        &self,
        name: &str,
        buf: &impl DeviceSlice<T>,
        need: usize,
    ) -> Result<(), CudaError> {
        if buf.len() < need {
            return Err(self.shape(format!(
                "{name} holds {} elements; the call needs {need}",
                buf.len()
            )));
        }
        if !Arc::ptr_eq(buf.stream().context(), self.stream.context()) {
            return Err(self.shape(format!(
                "{name} was allocated in another CUDA context than this GPU context's"
            )));
        }
        Ok(())
    }

    /// The device address of input `buf`, after checking it holds `need` elements.
    pub(crate) fn input<'a, T>(
        &'a self,
        name: &str,
        buf: &'a impl DevicePtr<T>,
        need: usize,
    ) -> Result<(u64, SyncOnDrop<'a>), CudaError> {
        self.check_len(name, buf, need)?;
        Ok(buf.device_ptr(self.stream))
    }

    /// The device address of output `buf`, after checking it holds `need` elements.
    pub(crate) fn output<'a, T>(
        &'a self,
        name: &str,
        buf: &'a mut impl DevicePtrMut<T>,
        need: usize,
    ) -> Result<(u64, SyncOnDrop<'a>), CudaError> {
        self.check_len(name, buf, need)?;
        Ok(buf.device_ptr_mut(self.stream))
    }
}

/// Enqueues `$func` on `$stream` with `$cfg` and the arguments (references to `u64` device
/// addresses, `i32`, `i64` and `f32` values, in the kernel's parameter order).
macro_rules! launch {
    ($stream:expr, $kernel:expr, $func:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        use cudarc::driver::PushKernelArg;
        let mut builder = $stream.launch_builder($func);
        $( builder.arg($arg); )+
        // SAFETY: the arguments match the kernel's parameters in order and type (each
        // pointer a 64-bit device address, `int` as i32, `long long` as i64, `float` as f32),
        // and every buffer was checked to hold what the kernel touches for these sizes.
        unsafe { builder.launch($cfg) }
            .map(|_| ())
            .map_err(|e| CudaError::Launch { kernel: $kernel, message: e.to_string() })
            .and_then(|()| {
                if $crate::ops::sync_each_launch() {
                    $stream.synchronize().map_err(|e| CudaError::Launch {
                        kernel: $kernel,
                        message: format!("{e} (while it ran: PAGODA_CUDA_SYNC=1)"),
                    })
                } else {
                    Ok(())
                }
            })
    }};
}
pub(crate) use launch;

/// Whether every launch waits for its kernel (`PAGODA_CUDA_SYNC=1`): a kernel that faults
/// is then named in the error, instead of surfacing at the step's end as a driver error of
/// whichever call synchronized next. Slow; for locating a fault.
pub fn sync_each_launch() -> bool {
    static SYNC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SYNC.get_or_init(|| std::env::var("PAGODA_CUDA_SYNC").is_ok_and(|v| v == "1"))
}

/// A grid-stride launch over `n` elements (`n > 0`).
fn grid_1d(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block per row (`rows` in 1..=i32::MAX), threads for `width` values (a multiple of 32,
/// at most `max`).
fn grid_rows(rows: i32, width: usize, max: u32) -> LaunchConfig {
    let threads = (width.div_ceil(32) * 32).clamp(32, max as usize) as u32;
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The kernels of one GPU context, loaded and ready to launch on its stream.
#[derive(Debug)]
pub struct Kernels {
    pub(crate) stream: Arc<CudaStream>,
    embed: CudaFunction,
    rms_norm: CudaFunction,
    add: CudaFunction,
    add_bias: CudaFunction,
    silu_mul: CudaFunction,
    gelu_tanh_mul: CudaFunction,
    to_bf16: CudaFunction,
    softcap: CudaFunction,
    gather_rows: CudaFunction,
    rope: CudaFunction,
    kv_write: CudaFunction,
    kv_write_fp8: CudaFunction,
    scale: CudaFunction,
    copy_columns: CudaFunction,
    scatter_add_rows: CudaFunction,
    swiglu_oai_mul: CudaFunction,
    pub(crate) attn_decode: CudaFunction,
    pub(crate) attn_decode_reduce: CudaFunction,
    pub(crate) attn_prefill: CudaFunction,
    pub(crate) attn_decode_fp8: CudaFunction,
    pub(crate) attn_prefill_fp8: CudaFunction,
}

/// The static scales of an FP8 E4M3 K/V cache: a value `x` is stored as the code nearest
/// `x / scale` (saturating at ±448) and read as `code · scale` (`pagoda_kernels::kv_blocks`'
/// FP8 storage, whose bits the kernels reproduce).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8Scales {
    pub k: f32,
    pub v: f32,
}

impl Fp8Scales {
    /// An error naming `kernel` unless both scales are finite and positive.
    pub(crate) fn check(self, kernel: &'static str) -> Result<Self, CudaError> {
        if [self.k, self.v].iter().all(|s| s.is_finite() && *s > 0.0) {
            Ok(self)
        } else {
            Err(CudaError::Shape {
                kernel,
                message: format!(
                    "FP8 scales k {} and v {} must be finite and positive",
                    self.k, self.v
                ),
            })
        }
    }
}

/// The entry points of `module`, loaded into the stream's context, in `entries` order.
pub(crate) fn load_module(
    stream: &Arc<CudaStream>,
    cache: &KernelCache,
    arch: &'static str,
    module: &KernelModule,
) -> Result<Vec<CudaFunction>, CudaError> {
    let compiled = cache.ptx(module.name, module.source, arch)?;
    let loaded = stream
        .context()
        .load_module(compiled.ptx)
        .map_err(|e| CudaError::Driver {
            call: "cuModuleLoadData",
            message: format!(
                "{} ({}; delete it if it is damaged)",
                e,
                compiled.path.display()
            ),
        })?;
    module
        .entries
        .iter()
        .map(|entry| {
            loaded.load_function(entry).map_err(|e| CudaError::Driver {
                call: "cuModuleGetFunction",
                message: format!("{entry} of module {}: {e}", module.name),
            })
        })
        .collect()
}

impl Kernels {
    /// Compiles (or loads from `cache`) every kernel module for `arch` and loads it into the
    /// stream's context.
    pub(crate) fn load(
        stream: &Arc<CudaStream>,
        cache: &KernelCache,
        arch: &'static str,
    ) -> Result<Self, CudaError> {
        let mut e = load_module(stream, cache, arch, &ELEMENTWISE)?.into_iter();
        let mut a = load_module(stream, cache, arch, &ATTENTION)?.into_iter();
        let next = |it: &mut std::vec::IntoIter<CudaFunction>| {
            it.next().ok_or_else(|| CudaError::Driver {
                call: "cuModuleGetFunction",
                message: "a kernel module has fewer entry points than listed".to_string(),
            })
        };
        // The order of `ELEMENTWISE.entries` and `ATTENTION.entries`.
        Ok(Kernels {
            stream: stream.clone(),
            embed: next(&mut e)?,
            rms_norm: next(&mut e)?,
            add: next(&mut e)?,
            add_bias: next(&mut e)?,
            silu_mul: next(&mut e)?,
            gelu_tanh_mul: next(&mut e)?,
            to_bf16: next(&mut e)?,
            softcap: next(&mut e)?,
            gather_rows: next(&mut e)?,
            rope: next(&mut e)?,
            kv_write: next(&mut e)?,
            kv_write_fp8: next(&mut e)?,
            scale: next(&mut e)?,
            copy_columns: next(&mut e)?,
            scatter_add_rows: next(&mut e)?,
            swiglu_oai_mul: next(&mut e)?,
            attn_decode: next(&mut a)?,
            attn_decode_reduce: next(&mut a)?,
            attn_prefill: next(&mut a)?,
            attn_decode_fp8: next(&mut a)?,
            attn_prefill_fp8: next(&mut a)?,
        })
    }

    fn check(&self, kernel: &'static str) -> Check<'_> {
        Check {
            kernel,
            stream: &self.stream,
        }
    }

    /// `out[r] = table[tokens[r]] * scale` (`table`: `[vocab, d]` bf16, `tokens`: `[rows]`,
    /// `out`: `[rows, d]`; `scale` 1.0 for none). The vocabulary is `table.len() / d`; a
    /// token outside it gives a row of NaN (the device cannot return an error).
    pub fn embed(
        &self,
        table: &impl DevicePtr<bf16>,
        tokens: &impl DevicePtr<u32>,
        out: &mut impl DevicePtrMut<f32>,
        rows: usize,
        d: usize,
        scale: f32,
    ) -> Result<(), CudaError> {
        let c = self.check("embed_bf16");
        if rows == 0 || d == 0 {
            return Ok(());
        }
        let vocab = table.len() / d;
        if vocab == 0 {
            return Err(c.shape(format!(
                "table holds {} elements, less than one row of {d}",
                table.len()
            )));
        }
        let (rows_i, d_i) = (c.int("rows", rows)?, c.int("d", d)?);
        let vocab_i = c.int("vocab", vocab)?;
        let (t, _t) = c.input("table", table, vocab * d)?;
        let (k, _k) = c.input("tokens", tokens, rows)?;
        let (o, _o) = c.output("out", out, c.mul("out", rows, d)?)?;
        launch!(
            self.stream,
            c.kernel,
            &self.embed,
            grid_rows(rows_i, d, 256),
            &t,
            &k,
            &o,
            &rows_i,
            &d_i,
            &vocab_i,
            &scale
        )
    }

    /// `out = x / sqrt(mean(x²) + eps) * (weight + weight_offset)` per row of `dim` (`x`,
    /// `out`: `[rows, dim]`; `weight`: `[dim]`), as `pagoda_kernels::ops::rms_norm`.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        x: &impl DevicePtr<f32>,
        weight: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
        weight_offset: f32,
    ) -> Result<(), CudaError> {
        let c = self.check("rms_norm");
        if rows == 0 {
            return Ok(());
        }
        let (rows_i, dim_i) = self.norm_sizes(&c, rows, dim)?;
        let n = c.mul("x", rows, dim)?;
        let (xp, _x) = c.input("x", x, n)?;
        let (w, _w) = c.input("weight", weight, dim)?;
        let (o, _o) = c.output("out", out, n)?;
        launch!(
            self.stream,
            c.kernel,
            &self.rms_norm,
            grid_rows(rows_i, dim, 512),
            &xp,
            &w,
            &o,
            &rows_i,
            &dim_i,
            &eps,
            &weight_offset
        )
    }

    /// [`Kernels::rms_norm`] in place (per-head QK-norm: `rows` = tokens × heads, `dim` =
    /// head_dim).
    pub fn rms_norm_inplace(
        &self,
        x: &mut impl DevicePtrMut<f32>,
        weight: &impl DevicePtr<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
        weight_offset: f32,
    ) -> Result<(), CudaError> {
        let c = self.check("rms_norm");
        if rows == 0 {
            return Ok(());
        }
        let (rows_i, dim_i) = self.norm_sizes(&c, rows, dim)?;
        let n = c.mul("x", rows, dim)?;
        let (w, _w) = c.input("weight", weight, dim)?;
        let (xp, _x) = c.output("x", x, n)?;
        // The kernel reads each element before writing it, by the same thread.
        launch!(
            self.stream,
            c.kernel,
            &self.rms_norm,
            grid_rows(rows_i, dim, 512),
            &xp,
            &w,
            &xp,
            &rows_i,
            &dim_i,
            &eps,
            &weight_offset
        )
    }

    fn norm_sizes(&self, c: &Check<'_>, rows: usize, dim: usize) -> Result<(i32, i32), CudaError> {
        if dim == 0 {
            return Err(c.shape(format!("{rows} rows of dim 0")));
        }
        Ok((c.int("rows", rows)?, c.int("dim", dim)?))
    }

    /// `x += y` over `n` values.
    pub fn add(
        &self,
        x: &mut impl DevicePtrMut<f32>,
        y: &impl DevicePtr<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let c = self.check("add_f32");
        if n == 0 {
            return Ok(());
        }
        let n_l = n as i64;
        let (yp, _y) = c.input("y", y, n)?;
        let (xp, _x) = c.output("x", x, n)?;
        launch!(self.stream, c.kernel, &self.add, grid_1d(n), &xp, &yp, &n_l)
    }

    /// `x *= s` over `n` values, as `pagoda_kernels::ops::scale_inplace`.
    pub fn scale(&self, x: &mut impl DevicePtrMut<f32>, n: usize, s: f32) -> Result<(), CudaError> {
        let c = self.check("scale_f32");
        if n == 0 {
            return Ok(());
        }
        let n_l = n as i64;
        let (xp, _x) = c.output("x", x, n)?;
        launch!(
            self.stream,
            c.kernel,
            &self.scale,
            grid_1d(n),
            &xp,
            &n_l,
            &s
        )
    }

    /// `out[r, c] = x[r, cols.start + c]`: a block of columns of `x` (`[rows, width]`) into
    /// `out` (`[rows, cols.len()]`).
    pub fn copy_columns(
        &self,
        x: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<f32>,
        rows: usize,
        width: usize,
        cols: std::ops::Range<usize>,
    ) -> Result<(), CudaError> {
        let c = self.check("copy_columns");
        if cols.start > cols.end || cols.end > width {
            return Err(c.shape(format!("columns {cols:?} of rows {width} wide")));
        }
        let n = c.mul("out", rows, cols.len())?;
        if n == 0 {
            return Ok(());
        }
        let rows_l = rows as i64;
        let (width_i, col0, ncols) = (
            c.int("width", width)?,
            c.int("first column", cols.start)?,
            c.int("columns", cols.len())?,
        );
        let (xp, _x) = c.input("x", x, c.mul("x", rows, width)?)?;
        let (o, _o) = c.output("out", out, n)?;
        launch!(
            self.stream,
            c.kernel,
            &self.copy_columns,
            grid_1d(n),
            &xp,
            &o,
            &rows_l,
            &width_i,
            &col0,
            &ncols
        )
    }

    /// `x[rows[j]] += weights[j] * y[j]` for rows of `d` values (`y`: `[n, d]`, `rows` and
    /// `weights`: `[n]`; the rows must be distinct and within `x`, which holds `x_rows`).
    #[allow(clippy::too_many_arguments)]
    pub fn scatter_add_rows(
        &self,
        x: &mut impl DevicePtrMut<f32>,
        x_rows: usize,
        y: &impl DevicePtr<f32>,
        rows: &impl DevicePtr<i32>,
        weights: &impl DevicePtr<f32>,
        n: usize,
        d: usize,
    ) -> Result<(), CudaError> {
        let c = self.check("scatter_add_rows");
        let total = c.mul("y", n, d)?;
        if total == 0 {
            return Ok(());
        }
        let (n_i, d_i) = (c.int("n", n)?, c.int("d", d)?);
        let (yp, _y) = c.input("y", y, total)?;
        let (r, _r) = c.input("rows", rows, n)?;
        let (w, _w) = c.input("weights", weights, n)?;
        let (xp, _x) = c.output("x", x, c.mul("x", x_rows, d)?)?;
        launch!(
            self.stream,
            c.kernel,
            &self.scatter_add_rows,
            grid_1d(total),
            &xp,
            &yp,
            &r,
            &w,
            &n_i,
            &d_i
        )
    }

    /// `out[r, c] += bias[c]` (`out`: `[rows, cols]`).
    pub fn add_bias(
        &self,
        out: &mut impl DevicePtrMut<f32>,
        bias: &impl DevicePtr<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        let c = self.check("add_bias");
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let n = c.mul("out", rows, cols)?;
        let (rows_l, cols_i) = (rows as i64, c.int("cols", cols)?);
        let (b, _b) = c.input("bias", bias, cols)?;
        let (o, _o) = c.output("out", out, n)?;
        launch!(
            self.stream,
            c.kernel,
            &self.add_bias,
            grid_1d(n),
            &o,
            &b,
            &rows_l,
            &cols_i
        )
    }

    /// `gate = act(gate) * up` over `n` values, as `pagoda_kernels::ops::silu_mul` /
    /// `gelu_tanh_mul`.
    pub fn gated(
        &self,
        activation: GatedActivation,
        gate: &mut impl DevicePtrMut<f32>,
        up: &impl DevicePtr<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let (kernel, func) = match activation {
            GatedActivation::Silu => ("silu_mul", &self.silu_mul),
            GatedActivation::GeluTanh => ("gelu_tanh_mul", &self.gelu_tanh_mul),
            GatedActivation::SwigluOai => ("swiglu_oai_mul", &self.swiglu_oai_mul),
        };
        let c = self.check(kernel);
        if n == 0 {
            return Ok(());
        }
        let n_l = n as i64;
        let (u, _u) = c.input("up", up, n)?;
        let (g, _g) = c.output("gate", gate, n)?;
        launch!(self.stream, c.kernel, func, grid_1d(n), &g, &u, &n_l)
    }

    /// `out = bf16(x)` over `n` values, rounding to nearest even (as `half::bf16::from_f32`).
    pub fn to_bf16(
        &self,
        x: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<bf16>,
        n: usize,
    ) -> Result<(), CudaError> {
        let c = self.check("to_bf16");
        if n == 0 {
            return Ok(());
        }
        let n_l = n as i64;
        let (xp, _x) = c.input("x", x, n)?;
        let (o, _o) = c.output("out", out, n)?;
        launch!(
            self.stream,
            c.kernel,
            &self.to_bf16,
            grid_1d(n),
            &xp,
            &o,
            &n_l
        )
    }

    /// `x = cap * tanh(x / cap)` over `n` values, as `pagoda_kernels::ops::softcap_inplace`
    /// (`cap` must be finite and positive).
    pub fn softcap(
        &self,
        x: &mut impl DevicePtrMut<f32>,
        n: usize,
        cap: f32,
    ) -> Result<(), CudaError> {
        let c = self.check("softcap");
        if !(cap.is_finite() && cap > 0.0) {
            return Err(c.shape(format!("cap {cap} is not a finite positive number")));
        }
        if n == 0 {
            return Ok(());
        }
        let n_l = n as i64;
        let (xp, _x) = c.output("x", x, n)?;
        launch!(
            self.stream,
            c.kernel,
            &self.softcap,
            grid_1d(n),
            &xp,
            &n_l,
            &cap
        )
    }

    /// `out[i] = x[rows[i]]` (`x`: `[total, d]` with `total = x.len() / d`, `rows`: `[n]`,
    /// `out`: `[n, d]`); an index outside `0..total` gives a row of NaN.
    pub fn gather_rows(
        &self,
        x: &impl DevicePtr<f32>,
        rows: &impl DevicePtr<i32>,
        out: &mut impl DevicePtrMut<f32>,
        n: usize,
        d: usize,
    ) -> Result<(), CudaError> {
        let c = self.check("gather_rows");
        if n == 0 || d == 0 {
            return Ok(());
        }
        let total = x.len() / d;
        let (n_i, d_i) = (c.int("n", n)?, c.int("d", d)?);
        let total_i = c.int("rows of x", total)?;
        let (xp, _x) = c.input("x", x, total * d)?;
        let (r, _r) = c.input("rows", rows, n)?;
        let (o, _o) = c.output("out", out, c.mul("out", n, d)?)?;
        launch!(
            self.stream,
            c.kernel,
            &self.gather_rows,
            grid_rows(n_i, d, 256),
            &xp,
            &r,
            &o,
            &n_i,
            &d_i,
            &total_i
        )
    }

    /// Rotary embedding in place: row `r` of `x` (`[rows, heads * head_dim]`) at position
    /// `positions[r]`, angle `positions[r] * inv_freq[i]` (in f32, as the CPU), cos and sin
    /// times `mscale` (and, with `temperature: Some((beta, floor))`, times Llama 4's query
    /// temperature `1 + beta · ln(1 + floor(pos / floor))`); only the first `2 * half` values
    /// of each head rotate (`rope_dim < head_dim`). As `Rope::apply` / `Rope::apply_query` of
    /// pagoda-model (`pagoda_kernels::ops::rope`).
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &mut impl DevicePtrMut<f32>,
        positions: &impl DevicePtr<i32>,
        inv_freq: &impl DevicePtr<f32>,
        rows: usize,
        heads: usize,
        head_dim: usize,
        half: usize,
        style: RopeStyle,
        mscale: f32,
        temperature: Option<(f32, usize)>,
    ) -> Result<(), CudaError> {
        let c = self.check("rope");
        let (temp_beta, temp_floor) = match temperature {
            Some((beta, floor)) if floor > 0 => (beta, c.int("temperature floor", floor)?),
            Some((_, _)) => return Err(c.shape("a query temperature with floor 0".into())),
            None => (0.0f32, 0i32),
        };
        if half.checked_mul(2).is_none_or(|h2| h2 > head_dim) {
            return Err(c.shape(format!(
                "half {half}: 2 * half must be at most head_dim {head_dim}"
            )));
        }
        if rows == 0 || heads == 0 || half == 0 {
            return Ok(());
        }
        let row_len = c.mul("row", heads, head_dim)?;
        let n = c.mul("x", rows, row_len)?;
        c.int("x", n)?;
        let (rows_i, heads_i) = (c.int("rows", rows)?, c.int("heads", heads)?);
        let (hd_i, half_i) = (c.int("head_dim", head_dim)?, c.int("half", half)?);
        let neox: i32 = match style {
            RopeStyle::Normal => 0,
            RopeStyle::Neox => 1,
        };
        let (p, _p) = c.input("positions", positions, rows)?;
        let (f, _f) = c.input("inv_freq", inv_freq, half)?;
        let (xp, _x) = c.output("x", x, n)?;
        launch!(
            self.stream,
            c.kernel,
            &self.rope,
            grid_1d(rows * heads * half),
            &xp,
            &p,
            &f,
            &rows_i,
            &heads_i,
            &hd_i,
            &half_i,
            &neox,
            &mscale,
            &temp_beta,
            &temp_floor
        )
    }

    /// Stores K and V rows (`[rows, kv_dim]` f32) into the bf16 caches (`[n_slots, kv_dim]`)
    /// at `slots[r]` (the caller's `block * block_size + pos % block_size`; see
    /// `AttentionBatch::slots`). A slot < 0 is skipped, and so is one past the caches
    /// (`n_slots = min(k_cache.len(), v_cache.len()) / kv_dim`), since the device cannot
    /// return an error.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_write(
        &self,
        k: &impl DevicePtr<f32>,
        v: &impl DevicePtr<f32>,
        k_cache: &mut impl DevicePtrMut<bf16>,
        v_cache: &mut impl DevicePtrMut<bf16>,
        slots: &impl DevicePtr<i32>,
        rows: usize,
        kv_dim: usize,
    ) -> Result<(), CudaError> {
        let c = self.check("kv_write");
        if rows == 0 || kv_dim == 0 {
            return Ok(());
        }
        let n = c.mul("k", rows, kv_dim)?;
        let n_slots = (k_cache.len().min(v_cache.len()) / kv_dim).min(i32::MAX as usize);
        let (rows_i, kv_i) = (c.int("rows", rows)?, c.int("kv_dim", kv_dim)?);
        let n_slots_i = n_slots as i32;
        let (kp, _k) = c.input("k", k, n)?;
        let (vp, _v) = c.input("v", v, n)?;
        let (s, _s) = c.input("slots", slots, rows)?;
        let (kc, _kc) = c.output("k_cache", k_cache, n_slots * kv_dim)?;
        let (vc, _vc) = c.output("v_cache", v_cache, n_slots * kv_dim)?;
        launch!(
            self.stream,
            c.kernel,
            &self.kv_write,
            grid_rows(rows_i, kv_dim, 256),
            &kp,
            &vp,
            &kc,
            &vc,
            &s,
            &rows_i,
            &kv_i,
            &n_slots_i
        )
    }

    /// As [`Kernels::kv_write`] into FP8 E4M3 caches (codes as `u8`): each value stored as
    /// the code nearest `x / scale`, ties to even, saturating at ±448, NaN kept
    /// (`pagoda_kernels::fp8::E4m3::from_f32` bit for bit).
    #[allow(clippy::too_many_arguments)]
    pub fn kv_write_fp8(
        &self,
        k: &impl DevicePtr<f32>,
        v: &impl DevicePtr<f32>,
        k_cache: &mut impl DevicePtrMut<u8>,
        v_cache: &mut impl DevicePtrMut<u8>,
        slots: &impl DevicePtr<i32>,
        rows: usize,
        kv_dim: usize,
        scales: Fp8Scales,
    ) -> Result<(), CudaError> {
        let c = self.check("kv_write_fp8");
        let scales = scales.check("kv_write_fp8")?;
        if rows == 0 || kv_dim == 0 {
            return Ok(());
        }
        let n = c.mul("k", rows, kv_dim)?;
        let n_slots = (k_cache.len().min(v_cache.len()) / kv_dim).min(i32::MAX as usize);
        let (rows_i, kv_i) = (c.int("rows", rows)?, c.int("kv_dim", kv_dim)?);
        let n_slots_i = n_slots as i32;
        let (kp, _k) = c.input("k", k, n)?;
        let (vp, _v) = c.input("v", v, n)?;
        let (s, _s) = c.input("slots", slots, rows)?;
        let (kc, _kc) = c.output("k_cache", k_cache, n_slots * kv_dim)?;
        let (vc, _vc) = c.output("v_cache", v_cache, n_slots * kv_dim)?;
        launch!(
            self.stream,
            c.kernel,
            &self.kv_write_fp8,
            grid_rows(rows_i, kv_dim, 256),
            &kp,
            &vp,
            &kc,
            &vc,
            &s,
            &rows_i,
            &kv_i,
            &n_slots_i,
            &scales.k,
            &scales.v
        )
    }
}
