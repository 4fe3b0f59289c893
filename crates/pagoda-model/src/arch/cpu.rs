//! The CPU [`Backend`]: the seam's operations over pagoda-kernels, unchanged from before the
//! seam existed (activations are host `Vec<f32>`s, linears the file's quantized blocks in
//! strips, K/V in [`KvBlockStorage`]s of f16, f32 or FP8 in host memory, the pass's reusable
//! state a [`Scratch`]), and the host-memory KV cache ([`PagedKvCache::new`]).
//!
//! Invariants: each operation is the same kernel call, on the same buffers, that the forward
//! pass made before it was written over a backend, so the CPU keeps its speed and its
//! bit-exact outputs (golden tests against llama.cpp hold unchanged); a pass runs hot
//! (`pagoda_kernels::hot_pool::run_hot`: on a worker of the kernels' pool, helpers polling
//! between its parallel loops) with the LoRA batch of the scratch cleared before and after
//! it.

use super::adapter::{LoraBatch, LoraWeights};
use super::backend::{Activation, Activations, Backend};
use super::layers::{Linear, ObserverSlot, RmsNorm, Scratch};
use super::pass::DeviceKv;
use super::rope::Rope;
use crate::device::Device;
use crate::kv_cache::KvShape;
use crate::observer::LinearObserver;
use crate::weights::Weights;
use crate::{KvDtype, ModelConfig, ModelError, PagedKvCache};
use pagoda_kernels::attention::AttentionShape;
use pagoda_kernels::kv_blocks::KvBlockStorage;
use pagoda_kernels::ops;
use pagoda_kernels::paged_attention::{paged_attention_with_sinks, SeqAttention};
use std::ops::Range;
use std::sync::Arc;

/// One layer's keys and values in host memory, each `[n_blocks, block_size, kv_dim]`.
pub type CpuKvLayer = (KvBlockStorage, KvBlockStorage);

/// Zeroed K/V of `shape`'s blocks in host memory, one layer per entry of `kv_dims`.
fn host_layers(kv_dims: &[usize], shape: &KvShape) -> Vec<CpuKvLayer> {
    let storage =
        |kv_dim| KvBlockStorage::new(shape.dtype, shape.n_blocks, shape.block_size, kv_dim);
    kv_dims.iter().map(|&d| (storage(d), storage(d))).collect()
}

impl PagedKvCache {
    /// `n_blocks` blocks of `block_size` positions for every layer of a model shaped by `cfg`,
    /// in host memory (the CPU's cache; `Model::try_new_paged_cache` makes one on the model's
    /// device).
    ///
    /// Panics if `block_size` is zero (a caller bug, not an input error).
    pub fn new(cfg: &ModelConfig, n_blocks: usize, block_size: usize, dtype: KvDtype) -> Self {
        assert!(block_size > 0, "KV block size must be positive");
        let shape = KvShape {
            n_blocks,
            block_size,
            dtype,
            kv_dim: cfg.max_kv_dim(),
        };
        let kv_dims: Vec<usize> = (0..cfg.n_layers)
            .map(|i| cfg.layer_kv_cache_dim(i))
            .collect();
        let layers = host_layers(&kv_dims, &shape);
        let floats: Vec<usize> = (0..cfg.n_layers)
            .map(|i| cfg.layer_state_floats(i))
            .collect();
        let states = crate::recurrent_state::RecurrentStates::new(&floats, 1);
        PagedKvCache::with_storage(shape, Box::new(DeviceKv::new(Cpu, shape, layers, states)))
    }
}

/// The CPU backend (stateless: the kernels pick their SIMD path themselves).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

/// One CPU forward pass's batch: the sequences' rows, positions and block tables, the LoRA
/// adapters by rows, and the calibration observer.
pub struct CpuPass<'a> {
    pub seqs: &'a [SeqAttention<'a>],
    pub lora: &'a mut LoraBatch,
    pub observer: &'a ObserverSlot,
}

impl Backend for Cpu {
    const NAME: &'static str = "CPU";
    const ATTENTION_SINKS: bool = true;
    type Act = Vec<f32>;
    type Linear = Linear;
    type Norm = RmsNorm;
    type Rope = Rope;
    type KvLayer = CpuKvLayer;
    type Scratch = Scratch;
    type Pass<'a> = CpuPass<'a>;

    fn device(&self) -> Device {
        Device::Cpu
    }

    fn memory_info(&self) -> Result<Option<(u64, u64)>, ModelError> {
        Ok(None)
    }

    /// 0: the CPU's scratch is counted with the process.
    fn workspace_bytes(&self, _cfg: &ModelConfig, _rows: usize, _logit_rows: usize) -> u64 {
        0
    }

    fn new_kv_layers(
        &self,
        kv_dims: &[usize],
        shape: &KvShape,
    ) -> Result<Vec<CpuKvLayer>, ModelError> {
        Ok(host_layers(kv_dims, shape))
    }

    fn copy_kv_block(
        &self,
        kv: &mut [CpuKvLayer],
        _shape: &KvShape,
        src: u32,
        dst: u32,
    ) -> Result<(), ModelError> {
        for (k, v) in kv {
            k.copy_block(src, dst);
            v.copy_block(src, dst);
        }
        Ok(())
    }

    fn kv_bytes(&self, kv: &[CpuKvLayer], _shape: &KvShape) -> usize {
        kv.iter()
            .map(|(k, v)| k.memory_bytes() + v.memory_bytes())
            .sum()
    }

    fn host_kv(kv: &CpuKvLayer) -> Option<(&KvBlockStorage, &KvBlockStorage)> {
        Some((&kv.0, &kv.1))
    }

    fn kv_storage(&self, dtype: KvDtype) -> String {
        dtype.to_string()
    }

    fn kv_whereabouts(&self) -> String {
        "in host memory".into()
    }

    fn set_observer(scratch: &mut Scratch, observer: Option<Arc<dyn LinearObserver>>) {
        scratch.observer = ObserverSlot(observer);
    }

    fn with_pass<'s, R: Send>(
        &self,
        kv: &mut [CpuKvLayer],
        scratch: &mut Scratch,
        _block_size: usize,
        seqs: &[SeqAttention<'_>],
        adapters: impl Iterator<Item = Option<&'s LoraWeights>>,
        body: impl for<'p> FnOnce(
                &mut [CpuKvLayer],
                &mut Activations<Vec<f32>>,
                &mut CpuPass<'p>,
            ) -> Result<R, ModelError>
            + Send,
    ) -> Result<R, ModelError> {
        scratch.lora.clear();
        for (adapter, seq) in adapters.zip(seqs) {
            if let Some(a) = adapter {
                scratch.lora.push(seq.rows.clone(), a.clone());
            }
        }
        // The whole pass runs hot (`pagoda_kernels::hot_pool`): on a worker of the kernels'
        // rayon pool, with the hot pool's helpers polling between its parallel loops instead
        // of parking, so no kernel call waits for a sleeping thread (or a halted vCPU) to
        // wake. A caller already inside a pass runs it in place.
        pagoda_kernels::hot_pool::run_hot(|| {
            let mut pass = CpuPass {
                seqs,
                lora: &mut scratch.lora,
                observer: &scratch.observer,
            };
            let out = body(kv, &mut scratch.act, &mut pass);
            // The output head is never adapted (LoraWeights refuses lm_head targets).
            scratch.lora.clear();
            out
        })
    }

    fn short_conv(
        &self,
        weight: &[f32],
        taps: usize,
        (floats, slots, batch): (usize, &mut [f32], &[u32]),
        bcx: &Vec<f32>,
        pass: &CpuPass<'_>,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        super::short_conv::run_cpu(weight, taps, (floats, slots, batch), bcx, pass.seqs, out)
    }

    fn mamba2(
        &self,
        params: &super::mamba2_host::Mamba2Params,
        state: (usize, &mut [f32], &[u32]),
        zxbcdt: &Vec<f32>,
        pass: &CpuPass<'_>,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        super::mamba2_host::run_cpu(params, state, zxbcdt, pass.seqs, out)
    }

    fn gated_delta_net(
        &self,
        params: &super::gated_delta_cpu::DeltaNetParams,
        state: (usize, &mut [f32], &[u32]),
        [qkv, z, b, a]: [&Vec<f32>; 4],
        pass: &CpuPass<'_>,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        super::gated_delta_cpu::run_cpu(params, state, [qkv, z, b, a], pass.seqs, out)
    }

    fn load_linear(
        &self,
        weights: &Weights,
        name: &str,
        bias: Option<&str>,
        rows: usize,
        cols: usize,
    ) -> Result<Linear, ModelError> {
        Linear::load(weights, name, bias, rows, cols)
    }

    fn load_rows(
        &self,
        weights: &Weights,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Linear, ModelError> {
        Linear::load_rows(weights, name, rows, cols)
    }

    fn share(&self, linear: &Linear) -> Linear {
        linear.clone()
    }

    fn load_norm(
        &self,
        weights: &Weights,
        name: &str,
        dim: usize,
        cfg: &ModelConfig,
    ) -> Result<RmsNorm, ModelError> {
        RmsNorm::load(weights, name, dim, cfg)
    }

    fn place_rope(&self, rope: Rope) -> Result<Rope, ModelError> {
        Ok(rope)
    }

    fn linear_name(linear: &Linear) -> &str {
        linear.name()
    }

    fn linear_shape(linear: &Linear) -> (usize, usize) {
        (linear.rows, linear.cols)
    }

    fn linears<const N: usize>(
        &self,
        layers: [&Linear; N],
        x: &Vec<f32>,
        mut outs: [&mut Vec<f32>; N],
        pass: &mut CpuPass<'_>,
    ) -> Result<(), ModelError> {
        let n = x.len() / layers[0].cols;
        pass.observer.see(&layers, x, n);
        if let ([layer], [out]) = (&layers[..], &mut outs[..]) {
            layer.forward(x, n, out)?;
        } else {
            let group: [&mut Vec<f32>; N] = outs.each_mut().map(|o| &mut **o);
            Linear::forward_group(layers, x, n, group)?;
        }
        for (layer, out) in layers.iter().zip(outs) {
            layer.add_lora(pass.lora, x, out);
        }
        Ok(())
    }

    fn rms_norm(&self, norm: &RmsNorm, x: &Vec<f32>, out: &mut Vec<f32>) -> Result<(), ModelError> {
        norm.forward(x, out);
        Ok(())
    }

    fn rms_norm_heads(&self, norm: &RmsNorm, x: &mut Vec<f32>) -> Result<(), ModelError> {
        norm.forward_inplace(x);
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<(), ModelError> {
        ops::add_inplace(x, y);
        Ok(())
    }

    fn scale(&self, x: &mut Vec<f32>, s: f32) -> Result<(), ModelError> {
        ops::scale_inplace(x, s);
        Ok(())
    }

    fn zeros(&self, x: &mut Vec<f32>, len: usize) -> Result<(), ModelError> {
        x.clear();
        x.resize(len, 0.0);
        Ok(())
    }

    fn gather_rows(
        &self,
        x: &Vec<f32>,
        width: usize,
        rows: &[u32],
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        out.clear();
        for &r in rows {
            let r = r as usize;
            out.extend_from_slice(&x[r * width..(r + 1) * width]);
        }
        Ok(())
    }

    fn scatter_add_rows(
        &self,
        x: &mut Vec<f32>,
        width: usize,
        rows: &[u32],
        weights: &[f32],
        y: &Vec<f32>,
    ) -> Result<(), ModelError> {
        for ((&r, &w), src) in rows.iter().zip(weights).zip(y.chunks_exact(width)) {
            let r = r as usize;
            for (dst, &v) in x[r * width..(r + 1) * width].iter_mut().zip(src) {
                *dst += w * v;
            }
        }
        Ok(())
    }

    fn columns(
        &self,
        x: &Vec<f32>,
        width: usize,
        cols: Range<usize>,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        out.clear();
        for row in x.chunks_exact(width) {
            out.extend_from_slice(&row[cols.clone()]);
        }
        Ok(())
    }

    fn gated(
        &self,
        activation: Activation,
        gate: &mut Vec<f32>,
        up: &Vec<f32>,
    ) -> Result<(), ModelError> {
        match activation {
            Activation::Silu => ops::silu_mul(gate, up),
            Activation::GeluTanh => ops::gelu_tanh_mul(gate, up),
            Activation::SwigluOai => ops::swiglu_oai_mul(gate, up),
            Activation::Sigmoid => ops::sigmoid_mul(gate, up),
        }
        Ok(())
    }

    fn attention(
        &self,
        shape: &AttentionShape,
        rope: &Rope,
        q: &mut Vec<f32>,
        mut new_kv: Option<(&mut Vec<f32>, &Vec<f32>)>,
        sinks: Option<&[f32]>,
        kv: &mut (KvBlockStorage, KvBlockStorage),
        pass: &mut CpuPass<'_>,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let q_dim = shape.n_heads * shape.head_dim;
        let kv_dim = shape.n_kv_heads * shape.head_dim;
        let total = q.len() / q_dim;
        let (keys, values) = kv;
        for seq in pass.seqs {
            let (r, n) = (seq.rows.clone(), seq.rows.len());
            let q = &mut q[r.start * q_dim..r.end * q_dim]; // [n, q_dim]
            rope.apply_query(q, n, seq.start);
            if let Some((k, v)) = new_kv.as_mut() {
                let k = &mut k[r.start * kv_dim..r.end * kv_dim]; // [n, kv_dim]
                rope.apply(k, n, seq.start);
                keys.write(seq.block_table, seq.start, k);
                let v = &v[r.start * kv_dim..r.end * kv_dim]; // [n, kv_dim]
                values.write(seq.block_table, seq.start, v);
            }
        }
        out.clear();
        out.resize(total * q_dim, 0.0); // [total, q_dim]
        paged_attention_with_sinks(shape, sinks, q, keys, values, pass.seqs, out);
        Ok(())
    }

    fn copy_from_host(&self, host: &[f32], out: &mut Vec<f32>) -> Result<(), ModelError> {
        out.clear();
        out.extend_from_slice(host);
        Ok(())
    }

    fn to_host(&self, x: &Vec<f32>) -> Result<Vec<f32>, ModelError> {
        Ok(x.clone())
    }

    fn embed(
        &self,
        table: &Linear,
        tokens: &[u32],
        scale: Option<f32>,
        out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let d = table.cols;
        out.clear();
        out.resize(tokens.len() * d, 0.0); // [n, hidden]
        for (row, &tok) in out.chunks_exact_mut(d).zip(tokens) {
            table.row(tok as usize, row)?;
        }
        if let Some(scale) = scale {
            ops::scale_inplace(out, scale);
        }
        Ok(())
    }

    fn logits(
        &self,
        norm: &RmsNorm,
        head: &Linear,
        x: &Vec<f32>,
        rows: &[Range<usize>],
        softcap: Option<f32>,
        buffers: &mut Activations<Vec<f32>>,
        _pass: &mut CpuPass<'_>,
    ) -> Result<Vec<f32>, ModelError> {
        let d = head.cols;
        let gathered = &mut buffers.logit_rows;
        gathered.clear();
        for r in rows {
            gathered.extend_from_slice(&x[r.start * d..r.end * d]);
        }
        let n_out = gathered.len() / d; // [n_out, hidden]
        if n_out == 0 {
            return Ok(Vec::new());
        }
        norm.forward(gathered, &mut buffers.normed);
        let mut out = Vec::new();
        head.forward(&buffers.normed, n_out, &mut out)?; // [n_out, vocab]
        if let Some(cap) = softcap {
            ops::softcap_inplace(&mut out, cap);
        }
        Ok(out)
    }
}
