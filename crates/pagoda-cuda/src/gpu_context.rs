//! [`GpuContext`]: one GPU ready for a forward pass: its CUDA context, the one stream all
//! work goes on, the kernels compiled for its architecture and loaded (the row, attention
//! and quantized-weight ones), and cuBLAS on that stream.
//!
//! Invariants: nothing calls into a CUDA library before [`Libraries::find`](crate::libraries::Libraries::find) has seen every
//! one load (cudarc panics on a missing library), so a machine without them gets
//! [`CudaError::MissingLibraries`]. Every kernel launch, GEMM and copy of this context is on
//! [`GpuContext::stream`], so they run in the order they are enqueued; cudarc's event
//! tracking (events recorded per buffer per launch, to order work across streams) is turned
//! off for this context because there is no second stream to order against: allocate
//! buffers with `ctx.stream().alloc_zeros(..)` / `clone_htod(..)` and never use another
//! stream of this context.

use crate::blas::Blas;
use crate::error::CudaError;
use crate::gpu::Gpu;
use crate::kernels::{arch_for, KernelCache};
use crate::ops::Kernels;
use crate::quant::QuantKernels;
use cudarc::driver::{CudaContext, CudaStream};
use std::sync::Arc;

/// One GPU: context, stream, kernels and cuBLAS.
#[derive(Debug)]
pub struct GpuContext {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    gpu: Gpu,
    kernels: Kernels,
    quant: QuantKernels,
    blas: Blas,
}

fn driver(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        message: e.to_string(),
    }
}

impl GpuContext {
    /// Opens GPU `ordinal`: probes the libraries first ([`CudaError::MissingLibraries`],
    /// [`CudaError::NoDevice`], [`CudaError::NoSuchDevice`] otherwise), creates the context
    /// and its stream, compiles or loads the kernels through `cache` for the GPU's
    /// architecture, and creates cuBLAS on the stream. Needs compute capability 8.0 or newer
    /// (bf16 GEMMs).
    pub fn new(ordinal: usize, cache: &KernelCache) -> Result<Self, CudaError> {
        let missing = crate::interpret::find_libraries()?.missing();
        if !missing.is_empty() {
            return Err(CudaError::MissingLibraries(missing));
        }
        let count = CudaContext::device_count().map_err(driver("cuDeviceGetCount"))?;
        if count <= 0 {
            return Err(CudaError::NoDevice);
        }
        if ordinal >= count as usize {
            return Err(CudaError::NoSuchDevice {
                ordinal,
                count: count as usize,
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("cuCtxCreate"))?;
        let gpu = Gpu {
            ordinal,
            name: ctx.name().map_err(driver("cuDeviceGetName"))?,
            memory_bytes: ctx.total_mem().map_err(driver("cuDeviceTotalMem"))? as u64,
            compute_capability: ctx
                .compute_capability()
                .map_err(driver("cuDeviceGetAttribute"))?,
            interpreted: crate::interpret::installed(),
        };
        let unsupported = |reason| CudaError::Unsupported {
            name: gpu.name.clone(),
            capability: gpu.compute_capability,
            reason,
        };
        if gpu.compute_capability.0 < 8 {
            return Err(unsupported(
                "Pagoda's GPU path needs compute capability 8.0 or newer (Ampere: bf16 GEMMs)",
            ));
        }
        let arch = arch_for(gpu.compute_capability).ok_or_else(|| {
            unsupported("no NVRTC architecture is known for it (kernels::arch_for)")
        })?;
        // SAFETY: event tracking orders work across streams of one context; this context's
        // work all goes on the one stream created below (module invariant), where launch
        // order is execution order, and no buffer exists yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let kernels = Kernels::load(&stream, cache, arch)?;
        let quant = QuantKernels::load(&stream, cache, arch)?;
        let blas = Blas::new(&stream)?;
        Ok(GpuContext {
            ctx,
            stream,
            gpu,
            kernels,
            quant,
            blas,
        })
    }

    /// The stream every launch, GEMM and copy of this context goes on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The GPU: ordinal, name, memory, compute capability.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// `(free, total)` device memory in bytes.
    pub fn memory_info(&self) -> Result<(u64, u64), CudaError> {
        let (free, total) = self.ctx.mem_get_info().map_err(driver("cuMemGetInfo"))?;
        Ok((free as u64, total as u64))
    }

    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// The quantized-weight kernels (GEMV, tiled GEMM, embedding).
    pub fn quant(&self) -> &QuantKernels {
        &self.quant
    }

    pub fn blas(&self) -> &Blas {
        &self.blas
    }

    /// Waits until everything enqueued on the stream has run; an asynchronous error of an
    /// earlier launch surfaces here.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }
}
