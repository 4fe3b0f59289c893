//! The CUDA [`Backend`]: the seam's operations on an NVIDIA GPU through pagoda-cuda (NVRTC
//! kernels, cuBLAS GEMMs), and the GPU's K/V layers ([`CudaKvLayer`]) and pass scratch
//! ([`CudaScratch`]), which a KV cache on the GPU holds.
//!
//! Layout: weights are uploaded once (`cuda_weights.rs`): a matrix in a block format the GPU
//! multiplies in place (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, INT8, INT4, NF4, NF4_DQ) keeps
//! its stored bytes, any other is converted or dequantized to bf16 at load; biases and norm
//! weights are f32. Activations are f32 in GPU memory (the residual stream keeps f32's
//! range); a linear's input is rounded to bf16 into the pass's staging buffer; bf16 weights
//! are multiplied by cuBLAS with f32 accumulation and f32 output, quantized ones by
//! pagoda-cuda's GEMV (up to 8 rows, on the f32 input, dequantizing in registers) or its
//! tiled dequantize-then-cuBLAS GEMM (more rows, tiles in the pass's scratch); Q8_0 and
//! INT8 take an int8 (`dp4a`) GEMV on activations quantized per 32 values. K/V are bf16
//! (`--kv-cache-dtype f16`) or FP8 E4M3 codes (`fp8`: written with the CPU cache's static
//! scale, `FP8_DEFAULT_SCALE`, and its rounding, read by the FP8 attention kernels; software
//! conversion, so any GPU the backend runs on takes it), `[n_blocks * block_size, kv_dim]`
//! per layer: the same blocks and block tables as the CPU's cache, so the scheduler, the
//! block pool and the prefix cache never learn
//! the device. LoRA pairs are uploaded (bf16) the first time a pass uses them and applied
//! unmerged with two small GEMMs per adapted linear and span of rows.
//!
//! Invariants:
//! - One [`GpuContext`] per GPU per process ([`context`]): the main model, a draft model and
//!   their caches share its stream, so work is ordered without events.
//! - Nothing here synchronizes except [`Backend::logits`], which copies the logits to the
//!   host at the end of the pass: a failed kernel surfaces there at the latest, as a
//!   [`ModelError::Gpu`] naming it (and [`Backend::to_host`], which only
//!   `Model::first_non_finite` calls, between the stages it looks into).
//! - Uploading a model first checks the GPU memory its weights will take (stored bytes of the
//!   matrices kept quantized, bf16 for the others: `cuda_weights::device_bytes`) against the
//!   GPU's free memory, and refuses it with both sizes rather than failing halfway.

use super::adapter::LoraWeights;
use super::backend::{Activation, Activations, Backend};
use super::cuda_weights::{self, CudaWeight};
use super::rope::Rope;
use crate::device::Device;
use crate::kv_cache::KvShape;
use crate::weights::Weights;
use crate::{KvDtype, ModelConfig, ModelError};
use half::bf16;
use pagoda_cuda::cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use pagoda_cuda::{
    AttentionBatch, AttentionParams, AttentionWorkspace, Fp8Scales, GatedActivation, GpuContext,
    KernelCache, QuantWorkspace,
};
use pagoda_kernels::attention::AttentionShape;
use pagoda_kernels::kv_blocks::FP8_DEFAULT_SCALE;
use pagoda_kernels::ops::RopeStyle;
use pagoda_kernels::paged_attention::SeqAttention;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

/// The context of GPU `ordinal`, made on first use and shared by everything on that GPU.
pub fn context(ordinal: usize) -> Result<Arc<GpuContext>, ModelError> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<GpuContext>>>> = OnceLock::new();
    let contexts = CONTEXTS.get_or_init(Default::default);
    let mut contexts = contexts
        .lock()
        .map_err(|_| ModelError::Device("the GPU context registry was poisoned".into()))?;
    if let Some(ctx) = contexts.get(&ordinal) {
        return Ok(ctx.clone());
    }
    let ctx = Arc::new(GpuContext::new(
        ordinal,
        &KernelCache::new(KernelCache::default_dir()),
    )?);
    contexts.insert(ordinal, ctx.clone());
    Ok(ctx)
}

/// The CUDA backend: one GPU.
#[derive(Clone)]
pub struct Cuda {
    gpu: Arc<GpuContext>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cuda({})", self.gpu.gpu().name)
    }
}

impl Cuda {
    /// The backend of GPU `ordinal`, after checking that `weights` as uploaded (quantized
    /// matrices as stored, the others as bf16) fit in its free memory with `reserve` bytes
    /// to spare.
    pub fn for_model(ordinal: usize, weights: &Weights, reserve: u64) -> Result<Self, ModelError> {
        let gpu = context(ordinal)?;
        let need = weights_bytes(weights);
        let (free, total) = gpu.memory_info()?;
        if need + reserve > free {
            return Err(ModelError::Device(format!(
                "the model needs {:.2} GiB of GPU memory for its weights (+{:.2} GiB for \
                 activations), but cuda:{ordinal} ({}) has {:.2} GiB free of {:.2} GiB: use \
                 --device auto to run the layers that do not fit on the CPU, a smaller model, \
                 or --device cpu",
                gib(need),
                gib(reserve),
                gpu.gpu().name,
                gib(free),
                gib(total)
            )));
        }
        Ok(Cuda { gpu })
    }

    /// The backend of GPU `ordinal` without a size check: the GPU part of a split model,
    /// whose size [`crate::placement`] planned.
    pub fn on(ordinal: usize) -> Result<Self, ModelError> {
        Ok(Cuda {
            gpu: context(ordinal)?,
        })
    }

    pub fn gpu(&self) -> &Arc<GpuContext> {
        &self.gpu
    }

    fn upload<T: pagoda_cuda::cudarc::driver::DeviceRepr>(
        &self,
        host: &[T],
    ) -> Result<CudaSlice<T>, ModelError> {
        self.gpu
            .stream()
            .clone_htod(host)
            .map_err(|e| driver("cuMemcpyHtoD", e))
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn driver(call: &'static str, e: pagoda_cuda::cudarc::driver::DriverError) -> ModelError {
    ModelError::Gpu(pagoda_cuda::CudaError::Driver {
        call,
        message: e.to_string(),
    })
}

/// A linear layer on the GPU: weight `[rows, cols]` (bf16 or quantized), f32 bias.
#[derive(Debug)]
pub struct CudaLinear {
    name: String,
    rows: usize,
    cols: usize,
    weight: Arc<CudaWeight>,
    bias: Option<CudaSlice<f32>>,
}

/// An RMSNorm weight on the GPU.
#[derive(Debug)]
pub struct CudaNorm {
    weight: CudaSlice<f32>,
    dim: usize,
    eps: f32,
    offset: f32,
}

/// A RoPE table on the GPU.
#[derive(Debug)]
pub struct CudaRope {
    inv_freq: CudaSlice<f32>,
    half: usize,
    style: pagoda_cuda::RopeStyle,
    mscale: f32,
    /// Llama 4's query temperature `(beta, original context)`, for queries only.
    query_temperature: Option<(f32, usize)>,
}

/// An f32 activation in GPU memory: `len` values in a buffer that only grows.
#[derive(Debug, Default)]
pub struct CudaAct {
    buf: Option<CudaSlice<f32>>,
    len: usize,
}

impl CudaAct {
    /// Sizes the activation to `len` values (reallocating only to grow) and returns it.
    fn resize(&mut self, gpu: &GpuContext, len: usize) -> Result<&mut CudaSlice<f32>, ModelError> {
        let cap = self.buf.as_ref().map_or(0, |b| b.len());
        if cap < len || self.buf.is_none() {
            let grown = len.max(cap + cap / 2).max(1);
            self.buf = Some(
                gpu.stream()
                    .alloc_zeros::<f32>(grown)
                    .map_err(|e| driver("cuMemAlloc", e))?,
            );
        }
        self.len = len;
        self.buf
            .as_mut()
            .ok_or_else(|| ModelError::Device("activation buffer missing".into()))
    }

    fn get(&self) -> Result<&CudaSlice<f32>, ModelError> {
        self.buf
            .as_ref()
            .ok_or_else(|| ModelError::Device("an activation read before it was written".into()))
    }

    fn get_mut(&mut self) -> Result<&mut CudaSlice<f32>, ModelError> {
        self.buf
            .as_mut()
            .ok_or_else(|| ModelError::Device("an activation read before it was written".into()))
    }
}

/// A bf16 staging buffer that only grows.
#[derive(Debug, Default)]
struct Staging {
    buf: Option<CudaSlice<bf16>>,
}

impl Staging {
    fn at_least(
        &mut self,
        gpu: &GpuContext,
        len: usize,
    ) -> Result<&mut CudaSlice<bf16>, ModelError> {
        let cap = self.buf.as_ref().map_or(0, |b| b.len());
        if cap < len || self.buf.is_none() {
            self.buf = Some(
                gpu.stream()
                    .alloc_zeros::<bf16>(len.max(cap + cap / 2).max(1))
                    .map_err(|e| driver("cuMemAlloc", e))?,
            );
        }
        self.buf
            .as_mut()
            .ok_or_else(|| ModelError::Device("staging buffer missing".into()))
    }
}

/// One layer's K and V in GPU memory, `[n_blocks * block_size, kv_dim]` each: bf16, or FP8
/// E4M3 codes under static scales (every layer of a cache the same kind).
#[derive(Debug)]
pub enum CudaKvLayer {
    Bf16 {
        k: CudaSlice<bf16>,
        v: CudaSlice<bf16>,
    },
    Fp8 {
        k: CudaSlice<u8>,
        v: CudaSlice<u8>,
        scales: Fp8Scales,
    },
}

impl CudaKvLayer {
    /// Zeroed K and V of `len` values each, as `dtype` (f16 is kept as bf16; f32 refused by
    /// the caller).
    pub(crate) fn zeroed(gpu: &GpuContext, len: usize, fp8: bool) -> Result<Self, ModelError> {
        Ok(if fp8 {
            CudaKvLayer::Fp8 {
                k: zeros::<u8>(gpu, len)?,
                v: zeros::<u8>(gpu, len)?,
                scales: Fp8Scales {
                    k: FP8_DEFAULT_SCALE,
                    v: FP8_DEFAULT_SCALE,
                },
            }
        } else {
            CudaKvLayer::Bf16 {
                k: zeros::<bf16>(gpu, len)?,
                v: zeros::<bf16>(gpu, len)?,
            }
        })
    }

    /// Values per position of this layer in a cache of `shape` (0 for a layer that keeps no
    /// K/V: its buffers hold the one value an allocation needs).
    pub(crate) fn kv_dim(&self, shape: &KvShape) -> usize {
        let values = match self {
            CudaKvLayer::Bf16 { k, .. } => k.len(),
            CudaKvLayer::Fp8 { k, .. } => k.len(),
        };
        values / (shape.n_blocks * shape.block_size).max(1)
    }

    /// Copies `len` values of K and of V from `src` to `dst` (non-overlapping ranges).
    pub(crate) fn copy_within(
        &mut self,
        gpu: &GpuContext,
        src: usize,
        dst: usize,
        len: usize,
    ) -> Result<(), ModelError> {
        match self {
            CudaKvLayer::Bf16 { k, v } => {
                copy_within(gpu, k, src, dst, len)?;
                copy_within(gpu, v, src, dst, len)
            }
            CudaKvLayer::Fp8 { k, v, .. } => {
                copy_within(gpu, k, src, dst, len)?;
                copy_within(gpu, v, src, dst, len)
            }
        }
    }
}

/// LoRA pairs on the GPU by (adapter load, linear name): `(r, A [r, cols], B·s [rows, r])`.
type LoraPairs = HashMap<(u64, String), (usize, CudaSlice<bf16>, CudaSlice<bf16>)>;

/// The GPU forward pass's reusable state, kept in the KV cache between passes.
#[derive(Debug, Default)]
pub struct CudaScratch {
    pub(crate) act: Activations<CudaAct>,
    staging: Staging,
    lora_tmp: CudaAct,
    lora_tmp16: Staging,
    logits: CudaAct,
    workspace: AttentionWorkspace,
    /// LoRA pairs already uploaded, by (adapter load, linear name): `(r, A, B)`.
    lora_pairs: LoraPairs,
    /// Scratch of the quantized products (GEMM tiles, int8 activations).
    quant: QuantWorkspace,
}

/// One GPU forward pass's batch.
pub struct CudaPass<'a> {
    pub(crate) batch: AttentionBatch,
    pub(crate) block_size: usize,
    /// The LoRA adapters of the pass, by rows.
    pub(crate) lora: Vec<(Range<usize>, LoraWeights)>,
    pub(crate) scratch: ScratchParts<'a>,
}

/// The parts of [`CudaScratch`] a pass borrows beside the activations.
pub(crate) struct ScratchParts<'a> {
    staging: &'a mut Staging,
    lora_tmp: &'a mut CudaAct,
    lora_tmp16: &'a mut Staging,
    logits: &'a mut CudaAct,
    workspace: &'a mut AttentionWorkspace,
    lora_pairs: &'a mut LoraPairs,
    quant: &'a mut QuantWorkspace,
}

impl CudaScratch {
    /// The activations, and the rest for a pass.
    pub(crate) fn split(&mut self) -> (&mut Activations<CudaAct>, ScratchParts<'_>) {
        (
            &mut self.act,
            ScratchParts {
                staging: &mut self.staging,
                lora_tmp: &mut self.lora_tmp,
                lora_tmp16: &mut self.lora_tmp16,
                logits: &mut self.logits,
                workspace: &mut self.workspace,
                lora_pairs: &mut self.lora_pairs,
                quant: &mut self.quant,
            },
        )
    }
}

impl Cuda {
    /// Rotates `k` by its rows' positions and writes `k` and `v` into `kv` through the rows'
    /// slots (the store half of [`Backend::attention`]).
    fn store_kv(
        &self,
        shape: &AttentionShape,
        rope: &CudaRope,
        k: &mut CudaAct,
        v: &CudaAct,
        kv: &mut CudaKvLayer,
        pass: &CudaPass<'_>,
    ) -> Result<(), ModelError> {
        let kernels = self.gpu.kernels();
        let rows = pass.batch.total_rows();
        let hd = shape.head_dim;
        kernels.rope(
            k.get_mut()?,
            pass.batch.positions(),
            &rope.inv_freq,
            rows,
            shape.n_kv_heads,
            hd,
            rope.half,
            rope.style,
            rope.mscale,
            None,
        )?;
        let kv_dim = shape.n_kv_heads * hd;
        match kv {
            CudaKvLayer::Bf16 { k: kc, v: vc } => {
                kernels.kv_write(k.get()?, v.get()?, kc, vc, pass.batch.slots(), rows, kv_dim)?
            }
            CudaKvLayer::Fp8 {
                k: kc,
                v: vc,
                scales,
            } => kernels.kv_write_fp8(
                k.get()?,
                v.get()?,
                kc,
                vc,
                pass.batch.slots(),
                rows,
                kv_dim,
                *scales,
            )?,
        }
        Ok(())
    }
}

impl Backend for Cuda {
    const NAME: &'static str = "GPU";
    const ATTENTION_SINKS: bool = true;
    type Act = CudaAct;
    type Linear = CudaLinear;
    type Norm = CudaNorm;
    type Rope = CudaRope;
    type KvLayer = CudaKvLayer;
    type Scratch = CudaScratch;
    type Pass<'a> = CudaPass<'a>;

    fn device(&self) -> Device {
        Device::Cuda(self.gpu.gpu().ordinal)
    }

    fn memory_info(&self) -> Result<Option<(u64, u64)>, ModelError> {
        Ok(Some(self.gpu.memory_info()?))
    }

    fn workspace_bytes(&self, cfg: &ModelConfig, rows: usize, logit_rows: usize) -> u64 {
        workspace_bytes(cfg, rows, logit_rows)
    }

    /// K/V as bf16 (a 16-bit dtype is stored as bf16 here) or FP8 E4M3 codes; f32 is
    /// refused.
    fn new_kv_layers(
        &self,
        kv_dims: &[usize],
        shape: &KvShape,
    ) -> Result<Vec<CudaKvLayer>, ModelError> {
        let fp8 = match shape.dtype {
            KvDtype::F16 => false,
            KvDtype::Fp8E4m3 => true,
            KvDtype::F32 => {
                return Err(ModelError::InvalidConfig(format!(
                    "a KV cache of {} on the GPU: the CUDA path stores K/V as bf16 or \
                     FP8; use --kv-cache-dtype f16 (kept as bf16 on the GPU) or fp8",
                    shape.dtype
                )))
            }
        };
        let positions = shape.n_blocks * shape.block_size;
        kv_dims
            .iter()
            .map(|&d| CudaKvLayer::zeroed(&self.gpu, positions * d, fp8))
            .collect()
    }

    fn copy_kv_block(
        &self,
        kv: &mut [CudaKvLayer],
        shape: &KvShape,
        src: u32,
        dst: u32,
    ) -> Result<(), ModelError> {
        if src == dst {
            return Ok(());
        }
        for layer in kv {
            let block = shape.block_size * layer.kv_dim(shape);
            if block > 0 {
                let (s, d) = (src as usize * block, dst as usize * block);
                layer.copy_within(&self.gpu, s, d, block)?;
            }
        }
        Ok(())
    }

    // bf16 for f16: the same bytes per value as the dtype says.
    fn kv_bytes(&self, kv: &[CudaKvLayer], shape: &KvShape) -> usize {
        let positions = shape.n_blocks * shape.block_size;
        kv.iter()
            .map(|l| 2 * positions * l.kv_dim(shape) * shape.dtype.bytes())
            .sum()
    }

    fn kv_storage(&self, dtype: KvDtype) -> String {
        let kind = match dtype {
            KvDtype::Fp8E4m3 => "fp8",
            _ => "bf16",
        };
        format!("{kind} on cuda:{}", self.gpu.gpu().ordinal)
    }

    fn kv_whereabouts(&self) -> String {
        format!("in GPU memory ({})", self.gpu.gpu().name)
    }

    fn with_pass<'s, R: Send>(
        &self,
        kv: &mut [CudaKvLayer],
        scratch: &mut CudaScratch,
        block_size: usize,
        seqs: &[SeqAttention<'_>],
        adapters: impl Iterator<Item = Option<&'s LoraWeights>>,
        body: impl for<'p> FnOnce(
                &mut [CudaKvLayer],
                &mut Activations<CudaAct>,
                &mut CudaPass<'p>,
            ) -> Result<R, ModelError>
            + Send,
    ) -> Result<R, ModelError> {
        let spans: Vec<pagoda_cuda::SeqSpan<'_>> = seqs
            .iter()
            .map(|s| pagoda_cuda::SeqSpan {
                first_row: s.rows.start,
                rows: s.rows.len(),
                start: s.start,
                block_table: s.block_table,
            })
            .collect();
        let batch = AttentionBatch::upload(&self.gpu, &spans, block_size)?;
        let lora = adapters
            .zip(seqs)
            .filter_map(|(adapter, seq)| Some((seq.rows.clone(), adapter?.clone())))
            .collect();
        let (act, parts_of_scratch) = scratch.split();
        let mut pass = CudaPass {
            batch,
            block_size,
            lora,
            scratch: parts_of_scratch,
        };
        body(kv, act, &mut pass)
    }

    fn short_conv(
        &self,
        _weight: &[f32],
        _taps: usize,
        _state: (usize, &mut [f32], &[u32]),
        _bcx: &CudaAct,
        _pass: &CudaPass<'_>,
        _out: &mut CudaAct,
    ) -> Result<(), ModelError> {
        Err(ModelError::Device(
            "recurrent (hybrid) layers run on the CPU only; load this model with --device cpu"
                .into(),
        ))
    }

    fn mamba2(
        &self,
        _params: &super::mamba2_host::Mamba2Params,
        _state: (usize, &mut [f32], &[u32]),
        _zxbcdt: &CudaAct,
        _pass: &CudaPass<'_>,
        _out: &mut CudaAct,
    ) -> Result<(), ModelError> {
        Err(ModelError::Device(
            "recurrent (hybrid) layers run on the CPU only; load this model with --device cpu"
                .into(),
        ))
    }

    fn gated_delta_net(
        &self,
        _params: &super::gated_delta_cpu::DeltaNetParams,
        _state: (usize, &mut [f32], &[u32]),
        _inputs: [&CudaAct; 4],
        _pass: &CudaPass<'_>,
        _out: &mut CudaAct,
    ) -> Result<(), ModelError> {
        Err(ModelError::Device(
            "recurrent (hybrid) layers run on the CPU only; load this model with --device cpu"
                .into(),
        ))
    }

    fn load_linear(
        &self,
        weights: &Weights,
        name: &str,
        bias: Option<&str>,
        rows: usize,
        cols: usize,
    ) -> Result<CudaLinear, ModelError> {
        let weight = cuda_weights::upload(&self.gpu, weights, name, rows, cols)?;
        let bias = match bias {
            Some(b) if weights.contains(b) => Some(self.upload(&weights.vector_f32(b, rows)?)?),
            _ => None,
        };
        Ok(CudaLinear {
            name: name.to_string(),
            rows,
            cols,
            weight: Arc::new(weight),
            bias,
        })
    }

    fn load_rows(
        &self,
        weights: &Weights,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<CudaLinear, ModelError> {
        self.load_linear(weights, name, None, rows, cols)
    }

    fn share(&self, linear: &CudaLinear) -> CudaLinear {
        CudaLinear {
            name: linear.name.clone(),
            rows: linear.rows,
            cols: linear.cols,
            weight: linear.weight.clone(),
            bias: None,
        }
    }

    fn load_norm(
        &self,
        weights: &Weights,
        name: &str,
        dim: usize,
        cfg: &ModelConfig,
    ) -> Result<CudaNorm, ModelError> {
        Ok(CudaNorm {
            weight: self.upload(&weights.vector_f32(name, dim)?)?,
            dim,
            eps: cfg.rms_eps,
            offset: cfg.norm_weight_offset,
        })
    }

    fn place_rope(&self, rope: Rope) -> Result<CudaRope, ModelError> {
        Ok(CudaRope {
            inv_freq: self.upload(rope.inv_freq())?,
            half: rope.inv_freq().len(),
            style: match rope.style() {
                RopeStyle::Interleaved => pagoda_cuda::RopeStyle::Normal,
                RopeStyle::Neox => pagoda_cuda::RopeStyle::Neox,
            },
            mscale: rope.mscale(),
            query_temperature: rope
                .query_temperature()
                .map(|t| (t.beta, t.original_context)),
        })
    }

    fn linear_name(linear: &CudaLinear) -> &str {
        &linear.name
    }

    fn linear_shape(linear: &CudaLinear) -> (usize, usize) {
        (linear.rows, linear.cols)
    }

    fn linears<const N: usize>(
        &self,
        layers: [&CudaLinear; N],
        x: &CudaAct,
        outs: [&mut CudaAct; N],
        pass: &mut CudaPass<'_>,
    ) -> Result<(), ModelError> {
        let cols = layers[0].cols;
        let rows = x.len / cols.max(1);
        let (k, blas) = (self.gpu.kernels(), self.gpu.blas());
        let staging = pass.scratch.staging.at_least(&self.gpu, rows * cols)?;
        k.to_bf16(x.get()?, staging, rows * cols)?;
        for (layer, out) in layers.iter().zip(outs) {
            let y = out.resize(&self.gpu, rows * layer.rows)?;
            cuda_weights::multiply(
                &self.gpu,
                &layer.weight,
                x.get()?,
                staging,
                y,
                rows,
                layer.rows,
                cols,
                pass.scratch.quant,
            )?;
            if let Some(b) = &layer.bias {
                k.add_bias(y, b, rows, layer.rows)?;
            }
            for (span, adapter) in &pass.lora {
                let Some((r, a, b)) = adapter.pair(&layer.name) else {
                    continue;
                };
                let key = (adapter.cache_salt(), layer.name.clone());
                if !pass.scratch.lora_pairs.contains_key(&key) {
                    let a: Vec<bf16> = a.iter().map(|&v| bf16::from_f32(v)).collect();
                    let b: Vec<bf16> = b.iter().map(|&v| bf16::from_f32(v)).collect();
                    let pair = (r, self.upload(&a)?, self.upload(&b)?);
                    pass.scratch.lora_pairs.insert(key.clone(), pair);
                }
                let Some((r, a, b)) = pass.scratch.lora_pairs.get(&key) else {
                    continue;
                };
                let (n, r) = (span.len(), *r);
                // tmp = x[span] · Aᵀ  ([n, r]), then y[span] += tmp · Bᵀ (B pre-scaled).
                let tmp = pass.scratch.lora_tmp.resize(&self.gpu, n * r)?;
                let xs = staging.slice(span.start * cols..span.end * cols);
                blas.gemm_bf16(&xs, a, tmp, n, r, cols, 1.0, 0.0)?;
                let tmp16 = pass.scratch.lora_tmp16.at_least(&self.gpu, n * r)?;
                k.to_bf16(&*tmp, tmp16, n * r)?;
                let mut ys = y.slice_mut(span.start * layer.rows..span.end * layer.rows);
                blas.gemm_bf16(&*tmp16, b, &mut ys, n, layer.rows, r, 1.0, 1.0)?;
            }
        }
        Ok(())
    }

    fn rms_norm(&self, norm: &CudaNorm, x: &CudaAct, out: &mut CudaAct) -> Result<(), ModelError> {
        let rows = x.len / norm.dim;
        let y = out.resize(&self.gpu, x.len)?;
        Ok(self.gpu.kernels().rms_norm(
            x.get()?,
            &norm.weight,
            y,
            rows,
            norm.dim,
            norm.eps,
            norm.offset,
        )?)
    }

    fn rms_norm_heads(&self, norm: &CudaNorm, x: &mut CudaAct) -> Result<(), ModelError> {
        let rows = x.len / norm.dim;
        Ok(self.gpu.kernels().rms_norm_inplace(
            x.get_mut()?,
            &norm.weight,
            rows,
            norm.dim,
            norm.eps,
            norm.offset,
        )?)
    }

    fn add(&self, x: &mut CudaAct, y: &CudaAct) -> Result<(), ModelError> {
        let n = x.len;
        Ok(self.gpu.kernels().add(x.get_mut()?, y.get()?, n)?)
    }

    fn scale(&self, x: &mut CudaAct, s: f32) -> Result<(), ModelError> {
        let n = x.len;
        Ok(self.gpu.kernels().scale(x.get_mut()?, n, s)?)
    }

    fn zeros(&self, x: &mut CudaAct, len: usize) -> Result<(), ModelError> {
        let buf = x.resize(&self.gpu, len)?;
        self.gpu
            .stream()
            .memset_zeros(&mut buf.slice_mut(0..len))
            .map_err(|e| driver("cuMemsetD8", e))
    }

    fn gather_rows(
        &self,
        x: &CudaAct,
        width: usize,
        rows: &[u32],
        out: &mut CudaAct,
    ) -> Result<(), ModelError> {
        let index: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        let index = self.upload(&index)?;
        let o = out.resize(&self.gpu, rows.len() * width)?;
        Ok(self
            .gpu
            .kernels()
            .gather_rows(x.get()?, &index, o, rows.len(), width)?)
    }

    fn scatter_add_rows(
        &self,
        x: &mut CudaAct,
        width: usize,
        rows: &[u32],
        weights: &[f32],
        y: &CudaAct,
    ) -> Result<(), ModelError> {
        let index: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        let (index, weights) = (self.upload(&index)?, self.upload(weights)?);
        let x_rows = x.len / width.max(1);
        Ok(self.gpu.kernels().scatter_add_rows(
            x.get_mut()?,
            x_rows,
            y.get()?,
            &index,
            &weights,
            rows.len(),
            width,
        )?)
    }

    fn columns(
        &self,
        x: &CudaAct,
        width: usize,
        cols: Range<usize>,
        out: &mut CudaAct,
    ) -> Result<(), ModelError> {
        let rows = x.len / width.max(1);
        let o = out.resize(&self.gpu, rows * cols.len())?;
        Ok(self
            .gpu
            .kernels()
            .copy_columns(x.get()?, o, rows, width, cols)?)
    }

    fn gated(
        &self,
        activation: Activation,
        gate: &mut CudaAct,
        up: &CudaAct,
    ) -> Result<(), ModelError> {
        let n = gate.len;
        let activation = match activation {
            Activation::Silu => GatedActivation::Silu,
            Activation::GeluTanh => GatedActivation::GeluTanh,
            Activation::SwigluOai => GatedActivation::SwigluOai,
            Activation::Sigmoid => {
                return Err(ModelError::Device(
                    "the sigmoid output gate (Qwen3.5's attention) runs on the CPU only; load \
                     this model with --device cpu"
                        .into(),
                ))
            }
        };
        Ok(self
            .gpu
            .kernels()
            .gated(activation, gate.get_mut()?, up.get()?, n)?)
    }

    fn attention(
        &self,
        shape: &AttentionShape,
        rope: &CudaRope,
        q: &mut CudaAct,
        new_kv: Option<(&mut CudaAct, &CudaAct)>,
        sinks: Option<&[f32]>,
        kv: &mut CudaKvLayer,
        pass: &mut CudaPass<'_>,
        out: &mut CudaAct,
    ) -> Result<(), ModelError> {
        // A few floats per layer and step (gpt-oss's sinks), copied as the pass is enqueued.
        let sinks = match sinks {
            Some(s) => Some(self.upload(s)?),
            None => None,
        };
        let kernels = self.gpu.kernels();
        let rows = pass.batch.total_rows();
        let hd = shape.head_dim;
        let positions = pass.batch.positions();
        kernels.rope(
            q.get_mut()?,
            positions,
            &rope.inv_freq,
            rows,
            shape.n_heads,
            hd,
            rope.half,
            rope.style,
            rope.mscale,
            rope.query_temperature,
        )?;
        if let Some((k, v)) = new_kv {
            self.store_kv(shape, rope, k, v, kv, pass)?;
        }
        let o = out.resize(&self.gpu, rows * shape.n_heads * hd)?;
        let params = AttentionParams {
            n_heads: shape.n_heads,
            n_kv_heads: shape.n_kv_heads,
            head_dim: hd,
            block_size: pass.block_size,
            scale: shape.scale,
            softcap: shape.softcap,
            window: shape.window,
        };
        match kv {
            CudaKvLayer::Bf16 { k, v } => kernels.paged_attention(
                &pass.batch,
                q.get()?,
                k,
                v,
                o,
                params,
                sinks.as_ref(),
                pass.scratch.workspace,
            )?,
            CudaKvLayer::Fp8 { k, v, scales } => kernels.paged_attention_fp8(
                &pass.batch,
                q.get()?,
                k,
                v,
                o,
                params,
                *scales,
                sinks.as_ref(),
                pass.scratch.workspace,
            )?,
        }
        Ok(())
    }

    fn copy_from_host(&self, host: &[f32], out: &mut CudaAct) -> Result<(), ModelError> {
        let x = out.resize(&self.gpu, host.len())?;
        self.gpu
            .stream()
            .memcpy_htod(host, &mut x.slice_mut(0..host.len()))
            .map_err(|e| driver("cuMemcpyHtoD", e))
    }

    fn to_host(&self, x: &CudaAct) -> Result<Vec<f32>, ModelError> {
        let host = self
            .gpu
            .stream()
            .clone_dtoh(&x.get()?.slice(0..x.len))
            .map_err(|e| driver("cuMemcpyDtoH", e))?;
        self.gpu.synchronize()?;
        Ok(host)
    }

    fn embed(
        &self,
        table: &CudaLinear,
        tokens: &[u32],
        scale: Option<f32>,
        out: &mut CudaAct,
    ) -> Result<(), ModelError> {
        let ids = self.upload(tokens)?;
        let d = table.cols;
        let x = out.resize(&self.gpu, tokens.len() * d)?;
        let scale = scale.unwrap_or(1.0);
        match &*table.weight {
            CudaWeight::Bf16(w) => self
                .gpu
                .kernels()
                .embed(w, &ids, x, tokens.len(), d, scale)?,
            CudaWeight::Quantized(q) => self.gpu.quant().embed(q, &ids, x, tokens.len(), scale)?,
        }
        Ok(())
    }

    fn logits(
        &self,
        norm: &CudaNorm,
        head: &CudaLinear,
        x: &CudaAct,
        rows: &[Range<usize>],
        softcap: Option<f32>,
        buffers: &mut Activations<CudaAct>,
        pass: &mut CudaPass<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        let d = head.cols;
        let picked: Vec<i32> = rows
            .iter()
            .flat_map(|r| r.clone())
            .map(|r| r as i32)
            .collect();
        let n_out = picked.len();
        if n_out == 0 {
            return Ok(Vec::new());
        }
        let kernels = self.gpu.kernels();
        let ids = self.upload(&picked)?;
        let gathered = buffers.logit_rows.resize(&self.gpu, n_out * d)?;
        kernels.gather_rows(x.get()?, &ids, gathered, n_out, d)?;
        self.rms_norm(norm, &buffers.logit_rows, &mut buffers.normed)?;
        let staging = pass.scratch.staging.at_least(&self.gpu, n_out * d)?;
        kernels.to_bf16(buffers.normed.get()?, staging, n_out * d)?;
        let vocab = head.rows;
        let logits = pass.scratch.logits.resize(&self.gpu, n_out * vocab)?;
        cuda_weights::multiply(
            &self.gpu,
            &head.weight,
            buffers.normed.get()?,
            staging,
            logits,
            n_out,
            vocab,
            d,
            pass.scratch.quant,
        )?;
        if let Some(cap) = softcap {
            kernels.softcap(logits, n_out * vocab, cap)?;
        }
        // A kernel of this step that faulted surfaces here, as the driver's error.
        let step_failed = |e: String| {
            ModelError::Device(format!(
                "a CUDA kernel of this forward pass failed: {e}; rerun with PAGODA_CUDA_SYNC=1 \
                 to name it"
            ))
        };
        let host = self
            .gpu
            .stream()
            .clone_dtoh(&logits.slice(0..n_out * vocab))
            .map_err(|e| step_failed(e.to_string()))?;
        self.gpu
            .synchronize()
            .map_err(|e| step_failed(e.to_string()))?;
        Ok(host)
    }
}

/// Bytes `weights` take on the GPU once uploaded: quantized matrices as stored, the others
/// as bf16 (see [`cuda_weights::device_bytes`]). The upload check and `pagoda tune`'s
/// estimate both use it.
pub fn weights_bytes(weights: &Weights) -> u64 {
    cuda_weights::device_bytes(weights)
}

/// Bytes of GPU memory one pass of up to `rows` rows, `logit_rows` of them with logits,
/// needs beside the weights and the KV cache (activations, staging, the logits, the tile of
/// dequantized weights of the quantized GEMM, and a margin for cuBLAS's and the attention
/// kernels' workspaces).
pub fn workspace_bytes(cfg: &ModelConfig, rows: usize, logit_rows: usize) -> u64 {
    let q_dim = cfg.max_q_dim();
    let kv_dim = cfg.max_kv_dim();
    let ffn_dim = cfg.max_ffn_dim();
    let per_layer = cfg
        .variants
        .per_layer_input
        .map_or(0, |w| w * (cfg.n_layers + 2));
    let widest = cfg.hidden_size.max(ffn_dim).max(q_dim).max(per_layer);
    let per_row =
        4 * (6 * cfg.hidden_size + 2 * q_dim + 2 * kv_dim + 2 * ffn_dim + per_layer) + 2 * widest;
    let logits = logit_rows * cfg.vocab_size * 4 + logit_rows * cfg.hidden_size * 8;
    (rows * per_row + logits) as u64 + cuda_weights::workspace_bytes(rows, widest) + (256u64 << 20)
}

/// `len` zeroed values on `gpu`.
pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    gpu: &GpuContext,
    len: usize,
) -> Result<CudaSlice<T>, ModelError> {
    gpu.stream()
        .alloc_zeros::<T>(len.max(1))
        .map_err(|e| driver("cuMemAlloc", e))
}

/// Copies `len` values of `slice` from `src` to `dst` (non-overlapping ranges).
fn copy_within<T: DeviceRepr>(
    gpu: &GpuContext,
    slice: &mut CudaSlice<T>,
    src: usize,
    dst: usize,
    len: usize,
) -> Result<(), ModelError> {
    let stream = gpu.stream();
    if src < dst {
        let (a, mut b) = slice.split_at_mut(dst);
        stream
            .memcpy_dtod(&a.slice(src..src + len), &mut b.slice_mut(0..len))
            .map_err(|e| driver("cuMemcpyDtoD", e))
    } else {
        let (mut a, b) = slice.split_at_mut(src);
        stream
            .memcpy_dtod(&b.slice(0..len), &mut a.slice_mut(dst..dst + len))
            .map_err(|e| driver("cuMemcpyDtoD", e))
    }
}
