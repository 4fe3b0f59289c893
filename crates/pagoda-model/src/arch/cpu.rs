//! The CPU [`Backend`]: the seam's operations over pagoda-kernels, unchanged from before the
//! seam existed (activations are host `Vec<f32>`s, linears the file's quantized blocks in
//! strips, K/V in [`KvBlockStorage`]s of f16 or f32).
//!
//! Invariant: each operation is the same kernel call, on the same buffers, that the forward
//! pass made before it was written over a backend, so the CPU keeps its speed and its
//! bit-exact outputs (golden tests against llama.cpp hold unchanged).

use super::adapter::LoraBatch;
use super::backend::{Activation, Activations, Backend};
use super::layers::{Linear, ObserverSlot, RmsNorm, Rope};
use crate::config::RopeScaling;
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use pagoda_kernels::attention::AttentionShape;
use pagoda_kernels::kv_blocks::KvBlockStorage;
use pagoda_kernels::ops;
use pagoda_kernels::paged_attention::{paged_attention, SeqAttention};
use std::ops::Range;

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
    type Act = Vec<f32>;
    type Linear = Linear;
    type Norm = RmsNorm;
    type Rope = Rope;
    type KvLayer = (KvBlockStorage, KvBlockStorage);
    type Pass<'a> = CpuPass<'a>;

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

    fn load_rope(
        &self,
        weights: &Weights,
        cfg: &ModelConfig,
        theta: f32,
        scaling: &RopeScaling,
        freq_factors: bool,
    ) -> Result<Rope, ModelError> {
        let rope = Rope::new(cfg, theta, scaling);
        if freq_factors {
            rope.with_freq_factors(weights)
        } else {
            Ok(rope)
        }
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

    fn gated(
        &self,
        activation: Activation,
        gate: &mut Vec<f32>,
        up: &Vec<f32>,
    ) -> Result<(), ModelError> {
        match activation {
            Activation::Silu => ops::silu_mul(gate, up),
            Activation::GeluTanh => ops::gelu_tanh_mul(gate, up),
        }
        Ok(())
    }

    fn attention(
        &self,
        shape: &AttentionShape,
        rope: &Rope,
        q: &mut Vec<f32>,
        k: &mut Vec<f32>,
        v: &Vec<f32>,
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
            rope.apply(q, n, seq.start);
            let k = &mut k[r.start * kv_dim..r.end * kv_dim]; // [n, kv_dim]
            rope.apply(k, n, seq.start);
            keys.write(seq.block_table, seq.start, k);
            let v = &v[r.start * kv_dim..r.end * kv_dim]; // [n, kv_dim]
            values.write(seq.block_table, seq.start, v);
        }
        out.clear();
        out.resize(total * q_dim, 0.0); // [total, q_dim]
        paged_attention(shape, q, keys, values, pass.seqs, out);
        Ok(())
    }

    fn copy_from_host(&self, host: &[f32], out: &mut Vec<f32>) -> Result<(), ModelError> {
        out.clear();
        out.extend_from_slice(host);
        Ok(())
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
