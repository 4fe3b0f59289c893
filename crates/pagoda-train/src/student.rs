//! The trainable student: a Llama (SmolLM2) or Qwen2 (Qwen2.5, with Q/K/V biases) decoder
//! written with candle's differentiable tensor ops only (matmul, broadcast, exp, sum,
//! narrow, cat, gather...), so `backward()` reaches every weight. Built from a model Pagoda
//! loaded (`pagoda_model::open_model`): every tensor, whatever its stored type, dequantized
//! to f32.
//!
//! Owns: the student's tensors by canonical (GGUF) name, which of them are trainable
//! (`Var`s: all of them in full fine-tuning; only the LoRA pairs with [`crate::lora`]), the
//! RoPE table, and the forward pass `[batch, seq]` token ids → `[batch, seq, vocab]` logits.
//!
//! Invariants:
//! - Q and K rows are held in Hugging Face order (RoPE rotates halves, `rotate_half`): a
//!   Llama GGUF stores them in llama.cpp's interleaved order, so they are reordered on load
//!   ([`pagoda_model::rope_order::hf_row_order`]) and back by [`Student::export`]; Qwen2 and
//!   HF folders keep their order.
//! - The RoPE frequencies are Pagoda's own (`pagoda_model::arch::rope::Rope`, scaling and
//!   GGUF `rope_freqs` included), so the student computes what `Model::forward` computes.
//! - No fused candle custom op (they have no backward pass): softmax and RMSNorm are spelled
//!   out here.
//! - Blocks other than Llama-style ones (read from the family spec: Gemma 3, Qwen3, SmolLM3)
//!   and partial RoPE are refused when the student is built, naming what is missing.

use std::collections::BTreeMap;

use candle_core::{Device, Tensor, Var, D};
use pagoda_model::arch::rope::Rope;
use pagoda_model::family::{Activation, NormPlacement, QkNorm};
use pagoda_model::rope_order::{gguf_permutes_qk, gguf_row_order, hf_row_order, reorder_rows};
use pagoda_model::source::{ModelFormat, ModelSource};
use pagoda_model::ModelConfig;

use crate::error::{Result, TrainError};
use crate::lora::{LoraSet, LoraSpec};

/// How the student is trained.
#[derive(Debug, Clone, PartialEq)]
pub enum TrainMode {
    /// Every weight is trainable.
    Full,
    /// Base weights frozen; a LoRA pair on each targeted linear is trainable.
    Lora(LoraSpec),
}

/// The seven linears of a decoder layer, by their GGUF short name.
pub const LINEARS: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// A decoder that candle can differentiate.
pub struct Student {
    cfg: ModelConfig,
    /// Every weight by canonical name (Q/K rows in Hugging Face order).
    tensors: BTreeMap<String, Tensor>,
    /// Trainable tensors by name: the canonical names in full fine-tuning, the LoRA pairs'
    /// names otherwise. Sorted, so every walk over them has one order.
    trainable: BTreeMap<String, Var>,
    lora: Option<LoraSet>,
    inv_freq: Vec<f32>,
    mscale: f32,
    /// The source was a Llama GGUF whose Q/K rows were reordered on load.
    permuted_qk: bool,
}

impl std::fmt::Debug for Student {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Student")
            .field("arch", &self.cfg.arch)
            .field("tensors", &self.tensors.len())
            .field("trainable", &self.trainable.len())
            .finish()
    }
}

/// Refuses what the student does not implement, naming it.
pub fn check_supported(cfg: &ModelConfig) -> Result<()> {
    let family = cfg.arch.family();
    let block = family.block;
    let missing = [
        (block.norms != NormPlacement::Pre, "post-norms"),
        (block.activation != Activation::Silu, "GeGLU"),
        (block.qk_norm != QkNorm::None, "QK-norm"),
        (
            cfg.layer_uses_rope.iter().any(|&r| !r),
            "layers without RoPE",
        ),
        (
            cfg.layer_is_sliding.iter().any(|&s| s),
            "sliding-window layers",
        ),
        (
            !cfg.has_uniform_layers(),
            "layers of different shapes, shared K/V, per-layer inputs or experts",
        ),
    ];
    let lacking: Vec<&str> = missing
        .iter()
        .filter(|(m, _)| *m)
        .map(|(_, w)| *w)
        .collect();
    if !lacking.is_empty() {
        return Err(TrainError::Unsupported(format!(
            "the student is a {} model ({}): the trainable decoder implements Llama-style blocks \
             (pre-norm, SwiGLU, optional Q/K/V biases: SmolLM2, Qwen2.5 students), not its {}; \
             a {} model can be the teacher of such a student that shares its tokenizer",
            family.display,
            family.gguf_name(),
            lacking.join(", "),
            family.display
        )));
    }
    if cfg.rope_dim != cfg.head_dim {
        return Err(TrainError::Unsupported(format!(
            "the student rotates {} of {} dimensions per head (partial RoPE), which the \
             trainable decoder does not implement",
            cfg.rope_dim, cfg.head_dim
        )));
    }
    if cfg.attn_logit_softcap.is_some() || cfg.final_logit_softcap.is_some() {
        return Err(TrainError::Unsupported(
            "the student soft-caps logits, which the trainable decoder does not implement".into(),
        ));
    }
    if cfg.layer_is_sliding.iter().any(|&s| s) {
        return Err(TrainError::Unsupported(
            "the student has sliding-window layers, which the trainable decoder does not \
             implement"
                .into(),
        ));
    }
    Ok(())
}

impl Student {
    /// Builds the student from `source` for `mode`; LoRA `A` matrices are drawn from `seed`.
    pub fn load(source: &ModelSource, mode: &TrainMode, seed: u64) -> Result<Student> {
        let permuted_qk = source.format == ModelFormat::Gguf && gguf_permutes_qk(&source.config);
        let mut tensors = BTreeMap::new();
        for view in source.weights.iter() {
            if view.name == "rope_freqs.weight" {
                continue;
            }
            let mut values = view.to_f32()?;
            if permuted_qk {
                if let Some(heads) = qk_heads(&source.config, &view.name) {
                    let order = hf_row_order(view.rows(), heads).ok_or_else(|| {
                        TrainError::Unsupported(format!(
                            "{}: {} rows do not split into {heads} heads of an even size",
                            view.name,
                            view.rows()
                        ))
                    })?;
                    values = reorder_rows(&values, view.cols().max(1), &order);
                }
            }
            let t = Tensor::from_vec(values, view.shape.as_slice(), &Device::Cpu)?;
            tensors.insert(view.name.clone(), t);
        }
        let rope = Rope::new(
            &source.config,
            source.config.rope_theta,
            &source.config.rope_scaling,
        )
        .with_freq_factors(&source.weights)?;
        Student::from_tensors(
            source.config.clone(),
            tensors,
            rope.inv_freq().to_vec(),
            rope.mscale(),
            permuted_qk,
            mode,
            seed,
        )
    }

    /// Builds the student from f32 tensors already in Hugging Face row order.
    pub fn from_tensors(
        cfg: ModelConfig,
        mut tensors: BTreeMap<String, Tensor>,
        inv_freq: Vec<f32>,
        mscale: f32,
        permuted_qk: bool,
        mode: &TrainMode,
        seed: u64,
    ) -> Result<Student> {
        check_supported(&cfg)?;
        check_shapes(&cfg, &tensors)?;
        let mut trainable = BTreeMap::new();
        let lora = match mode {
            TrainMode::Full => {
                for (name, t) in tensors.iter_mut() {
                    let var = Var::from_tensor(t)?;
                    *t = var.as_tensor().clone();
                    trainable.insert(name.clone(), var);
                }
                None
            }
            TrainMode::Lora(spec) => {
                let set = LoraSet::new(spec, &cfg, seed)?;
                for (name, var) in set.vars() {
                    trainable.insert(name, var.clone());
                }
                Some(set)
            }
        };
        Ok(Student {
            cfg,
            tensors,
            trainable,
            lora,
            inv_freq,
            mscale,
            permuted_qk,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The trainable tensors, by name, in name order.
    pub fn trainable(&self) -> &BTreeMap<String, Var> {
        &self.trainable
    }

    /// The LoRA pairs, when training LoRA.
    pub fn lora(&self) -> Option<&LoraSet> {
        self.lora.as_ref()
    }

    /// A tensor by canonical name (Hugging Face row order), trained or not.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Every tensor's canonical name and shape, in name order.
    pub fn shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.dims().to_vec()))
            .collect()
    }

    /// The weights in the source's row order (a Llama GGUF's Q/K rows put back in llama.cpp's
    /// order), by canonical name, f32: what a full fine-tune writes.
    pub fn export(&self) -> Result<BTreeMap<String, Vec<f32>>> {
        let mut out = BTreeMap::new();
        for (name, t) in &self.tensors {
            let mut values = t.flatten_all()?.to_vec1::<f32>()?;
            if self.permuted_qk {
                if let Some(heads) = qk_heads(&self.cfg, name) {
                    let (rows, cols) = t.dims2()?;
                    let order = gguf_row_order(rows, heads).ok_or_else(|| {
                        TrainError::Unsupported(format!("{name}: rows not in heads"))
                    })?;
                    values = reorder_rows(&values, cols, &order);
                }
            }
            out.insert(name.clone(), values);
        }
        Ok(out)
    }

    fn get(&self, name: &str) -> Result<&Tensor> {
        self.tensors
            .get(name)
            .ok_or_else(|| TrainError::Unsupported(format!("the student has no tensor {name}")))
    }

    /// `x [n, in] · Wᵀ (+ b) (+ scaling · x·Aᵀ·Bᵀ)` for the linear `blk.{layer}.{short}`.
    fn linear(&self, x: &Tensor, layer: usize, short: &str) -> Result<Tensor> {
        let base = format!("blk.{layer}.{short}");
        let w = self.get(&format!("{base}.weight"))?;
        let mut y = x.matmul(&w.t()?)?;
        if let Some(b) = self.tensors.get(&format!("{base}.bias")) {
            y = y.broadcast_add(b)?;
        }
        if let Some(pair) = self.lora.as_ref().and_then(|l| l.get(layer, short)) {
            let delta = x.matmul(&pair.a.as_tensor().t()?)?;
            let delta = delta.matmul(&pair.b.as_tensor().t()?)?;
            y = (y + (delta * pair.scaling)?)?;
        }
        Ok(y)
    }

    /// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) · (w + offset)`.
    fn rms_norm(&self, x: &Tensor, name: &str) -> Result<Tensor> {
        let w = self.get(name)?;
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
        let r = (ms + self.cfg.rms_eps as f64)?.sqrt()?.recip()?;
        let mut w = w.clone();
        if self.cfg.norm_weight_offset != 0.0 {
            w = (w + self.cfg.norm_weight_offset as f64)?;
        }
        Ok(x.broadcast_mul(&r)?.broadcast_mul(&w)?)
    }

    /// `cos` and `sin` tables `[seq, head_dim]` for positions `0..seq` (halves repeated, as
    /// `rotate_half` pairs dimension `i` with `i + head_dim/2`).
    fn rope_tables(&self, seq: usize) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let hd = 2 * half;
        let mut cos = Vec::with_capacity(seq * hd);
        let mut sin = Vec::with_capacity(seq * hd);
        for p in 0..seq {
            for _ in 0..2 {
                for &f in &self.inv_freq {
                    let angle = p as f32 * f;
                    cos.push(angle.cos() * self.mscale);
                    sin.push(angle.sin() * self.mscale);
                }
            }
        }
        Ok((
            Tensor::from_vec(cos, (seq, hd), &Device::Cpu)?,
            Tensor::from_vec(sin, (seq, hd), &Device::Cpu)?,
        ))
    }

    /// Logits `[batch, seq, vocab]` of token ids `[batch, seq]` (u32), every position
    /// attending causally to the positions before it in its row (padding goes at the end of
    /// a row, where it changes nothing before it).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let cfg = &self.cfg;
        let (h, kvh, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
        let emb = self.get("token_embd.weight")?;
        let mut x = emb.index_select(&ids.flatten_all()?, 0)?; // [b*t, d]
        if let Some(s) = cfg.embedding_scale {
            x = (x * s as f64)?;
        }
        let (cos, sin) = self.rope_tables(t)?;
        let mask = causal_mask(t)?;
        for layer in 0..cfg.n_layers {
            let normed = self.rms_norm(&x, &format!("blk.{layer}.attn_norm.weight"))?;
            let q = self.linear(&normed, layer, "attn_q")?;
            let k = self.linear(&normed, layer, "attn_k")?;
            let v = self.linear(&normed, layer, "attn_v")?;
            // [b, heads, t, hd]
            let q = q.reshape((b, t, h, hd))?.transpose(1, 2)?.contiguous()?;
            let k = k.reshape((b, t, kvh, hd))?.transpose(1, 2)?.contiguous()?;
            let v = v.reshape((b, t, kvh, hd))?.transpose(1, 2)?.contiguous()?;
            let q = rotate(&q, &cos, &sin)?;
            let k = repeat_kv(&rotate(&k, &cos, &sin)?, h / kvh)?;
            let v = repeat_kv(&v, h / kvh)?;
            let scores =
                (q.matmul(&k.transpose(2, 3)?.contiguous()?)? * cfg.attention_scale as f64)?;
            let scores = scores.broadcast_add(&mask)?;
            let p = softmax_last(&scores)?;
            let attn = p.matmul(&v)?; // [b, h, t, hd]
            let attn = attn
                .transpose(1, 2)?
                .contiguous()?
                .reshape((b * t, h * hd))?;
            x = (x + self.linear(&attn, layer, "attn_output")?)?;
            let normed = self.rms_norm(&x, &format!("blk.{layer}.ffn_norm.weight"))?;
            let gate = self.linear(&normed, layer, "ffn_gate")?.silu()?;
            let up = self.linear(&normed, layer, "ffn_up")?;
            x = (x + self.linear(&(gate * up)?, layer, "ffn_down")?)?;
        }
        let x = self.rms_norm(&x, "output_norm.weight")?;
        let head = match self.tensors.get("output.weight") {
            Some(w) => w,
            None => emb,
        };
        let logits = x.matmul(&head.t()?)?;
        Ok(logits.reshape((b, t, cfg.vocab_size))?)
    }
}

/// Heads of the Q or K matrix `name`, `None` for any other tensor.
fn qk_heads(cfg: &ModelConfig, name: &str) -> Option<usize> {
    if name.ends_with(".attn_q.weight") {
        Some(cfg.n_heads)
    } else if name.ends_with(".attn_k.weight") {
        Some(cfg.n_kv_heads)
    } else {
        None
    }
}

/// Every tensor the forward pass reads exists with the shape the config implies.
fn check_shapes(cfg: &ModelConfig, tensors: &BTreeMap<String, Tensor>) -> Result<()> {
    let (d, f, v) = (cfg.hidden_size, cfg.ffn_dim, cfg.vocab_size);
    let q = cfg.n_heads * cfg.head_dim;
    let kv = cfg.n_kv_heads * cfg.head_dim;
    let mut want: Vec<(String, Vec<usize>)> = vec![
        ("token_embd.weight".into(), vec![v, d]),
        ("output_norm.weight".into(), vec![d]),
    ];
    if tensors.contains_key("output.weight") {
        want.push(("output.weight".into(), vec![v, d]));
    }
    for i in 0..cfg.n_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        want.extend([
            (n("attn_norm.weight"), vec![d]),
            (n("ffn_norm.weight"), vec![d]),
            (n("attn_q.weight"), vec![q, d]),
            (n("attn_k.weight"), vec![kv, d]),
            (n("attn_v.weight"), vec![kv, d]),
            (n("attn_output.weight"), vec![d, q]),
            (n("ffn_gate.weight"), vec![f, d]),
            (n("ffn_up.weight"), vec![f, d]),
            (n("ffn_down.weight"), vec![d, f]),
        ]);
        for (s, rows) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
            let bias = n(&format!("{s}.bias"));
            if tensors.contains_key(&bias) {
                want.push((bias, vec![rows]));
            }
        }
    }
    for (name, shape) in &want {
        match tensors.get(name) {
            None => {
                return Err(TrainError::Unsupported(format!(
                    "the student has no tensor {name}"
                )))
            }
            Some(t) if t.dims() != shape.as_slice() => {
                return Err(TrainError::Unsupported(format!(
                    "the student's {name} is {:?}, but its config implies {shape:?}",
                    t.dims()
                )))
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = tensors.keys().find(|n| !want.iter().any(|(w, _)| w == *n)) {
        return Err(TrainError::Unsupported(format!(
            "the student has a tensor the trainable decoder does not use: {extra}"
        )));
    }
    Ok(())
}

/// `[t, t]`: 0 where a position may attend, a large negative number above the diagonal.
fn causal_mask(t: usize) -> Result<Tensor> {
    let mut m = vec![0f32; t * t];
    for i in 0..t {
        for j in i + 1..t {
            m[i * t + j] = -1e9;
        }
    }
    Ok(Tensor::from_vec(m, (t, t), &Device::Cpu)?)
}

/// Softmax over the last dimension (max subtracted, detached: it cancels out).
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
}

/// Log-softmax over the last dimension.
pub fn log_softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(shifted.broadcast_sub(&lse)?)
}

/// RoPE, `rotate_half` pairing: `x·cos + rotate_half(x)·sin` over `[b, heads, t, hd]`.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let hd = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, hd / 2)?;
    let x2 = x.narrow(D::Minus1, hd / 2, hd / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?)?)
}

/// `[b, kv, t, hd]` → `[b, kv·group, t, hd]`, each KV head repeated for its query heads.
fn repeat_kv(x: &Tensor, group: usize) -> Result<Tensor> {
    if group == 1 {
        return Ok(x.clone());
    }
    let (b, kv, t, hd) = x.dims4()?;
    Ok(x.unsqueeze(2)?
        .broadcast_as((b, kv, group, t, hd))?
        .contiguous()?
        .reshape((b, kv * group, t, hd))?)
}
