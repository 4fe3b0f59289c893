//! LoRA adapters served unmerged: `y = W x + scaling · B (A x)` on the rows of the batch whose
//! sequence asked for the adapter, so one forward pass serves segments with different adapters
//! and segments with none.
//!
//! Owns [`LoraWeights`], a PEFT adapter ([`LoraAdapter`]) prepared for one [`Model`]: its pairs
//! keyed by the model's canonical linear names (`blk.0.attn_q.weight`, through
//! [`hf::canonical_name`]), `B` pre-multiplied by the scaling, and for a Llama GGUF base
//! (interleaved RoPE) `B`'s Q/K rows permuted the way llama.cpp's converter permuted the base
//! weights; and [`LoraBatch`], the per-forward-pass map from rows to adapters that the linear
//! layers consult.
//!
//! Invariants:
//! - A `LoraWeights` was shape-checked against its model when built: every pair's `A` is
//!   `[r, cols]` and `B` is `[rows, r]` of the linear it names, so applying it cannot fail;
//!   [`LoraWeights::fits`] tells whether another model has the same shape.
//! - Every module an adapter names is applied, or the adapter is refused: the linears of a
//!   mixture-of-experts model's experts run over the rows routed to them, not the batch's
//!   rows that [`LoraBatch`] spans, so an adapter on an expert (`mlp.experts.3.gate_proj`) is
//!   an error naming the module. A MoE router runs over every row and is adapted like any
//!   linear.
//! - `LoraWeights` is cheap to clone (an `Arc`): requests in flight keep an adapter alive after
//!   it is unloaded.
//! - [`LoraBatch`] holds adapters only during a forward pass (set and cleared by
//!   [`Model::forward_batch`]).

use super::Model;
use crate::lora::LoraAdapter;
use crate::{hf, ModelConfig, ModelError};
use pagoda_kernels::f32_gemm::matmul_nt;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One adapted linear, ready to apply: `A: [r, cols]`, `B: [rows, r]` times the scaling.
#[derive(Debug)]
struct Pair {
    r: usize,
    a: Vec<f32>,
    b_scaled: Vec<f32>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    dir: PathBuf,
    /// Canonical linear name → pair.
    pairs: HashMap<String, Pair>,
    /// The shape of the model the pairs were checked against.
    config: ModelConfig,
    /// Non-zero; different for every load (the prefix cache's salt).
    salt: u64,
    rank: usize,
    n_values: usize,
}

/// A LoRA adapter prepared for one model (see the module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct LoraWeights(Arc<Inner>);

/// Loads are numbered so that two loads never share a prefix-cache salt.
static LOADS: AtomicU64 = AtomicU64::new(1);

impl LoraWeights {
    /// Opens the PEFT folder `dir` and prepares it for `model` under `name`.
    pub fn open(name: &str, dir: impl AsRef<Path>, model: &Model) -> Result<Self, ModelError> {
        let adapter = LoraAdapter::open(dir)?;
        Self::new(name, &adapter, model)
    }

    /// Prepares `adapter` for `model`. Errors name the adapter folder and the module: a module
    /// that is not a linear layer of the model (the embedding or the output head included),
    /// shapes that differ from the model's (an adapter made for another base model).
    pub fn new(name: &str, adapter: &LoraAdapter, model: &Model) -> Result<Self, ModelError> {
        let cfg = model.config();
        let err = |message: String| ModelError::Format {
            path: adapter.dir().to_path_buf(),
            message,
        };
        let mut pairs = HashMap::new();
        let (mut rank, mut n_values) = (0, 0);
        for (module, pair) in adapter.modules() {
            let last = module.rsplit('.').next().unwrap_or(module);
            if matches!(last, "embed_tokens" | "lm_head" | "wte" | "embed_in") {
                return Err(err(format!(
                    "module {module}: LoRA on the token embedding or the output head is not supported \
                     (adapt the attention and MLP linears, or merge the adapter with `pagoda merge-lora`)"
                )));
            }
            let canonical = hf::canonical_name(&format!("{module}.weight"), cfg.arch);
            if is_expert(module, canonical.as_deref()) {
                return Err(err(format!(
                    "module {module}: LoRA on the experts of a mixture-of-experts model is not \
                     supported (each expert runs over only the tokens routed to it); adapt the \
                     attention projections (q_proj, k_proj, v_proj, o_proj) or the router"
                )));
            }
            let Some((canonical, (linear_rows, linear_cols))) =
                canonical.and_then(|c| model.linear_shape(&c).map(|l| (c, l)))
            else {
                return Err(err(format!(
                    "module {module} is not a linear layer of this {} model (an adapter for another \
                     architecture?)",
                    cfg.arch.gguf_name()
                )));
            };
            if !pair.is_consistent()
                || pair.out_features != linear_rows
                || pair.in_features != linear_cols
            {
                return Err(err(format!(
                    "module {module}: the adapter is [out {}, in {}] (rank {}) but the model's \
                     {canonical} is [out {}, in {}]: an adapter made for another base model",
                    pair.out_features, pair.in_features, pair.r, linear_rows, linear_cols
                )));
            }
            let mut b_scaled: Vec<f32> = pair.b.iter().map(|v| v * pair.scaling).collect();
            if crate::rope_order::gguf_permutes_qk(cfg) {
                let heads = if canonical.ends_with(".attn_q.weight") {
                    Some(cfg.n_heads)
                } else if canonical.ends_with(".attn_k.weight") {
                    Some(cfg.n_kv_heads)
                } else {
                    None
                };
                if let Some(order) =
                    heads.and_then(|h| crate::rope_order::gguf_row_order(pair.out_features, h))
                {
                    b_scaled = crate::rope_order::reorder_rows(&b_scaled, pair.r, &order);
                }
            }
            rank = rank.max(pair.r);
            n_values += pair.a.len() + b_scaled.len();
            pairs.insert(
                canonical,
                Pair {
                    r: pair.r,
                    a: pair.a.clone(),
                    b_scaled,
                },
            );
        }
        let load = LOADS.fetch_add(1, Ordering::Relaxed);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (name, adapter.dir(), load).hash(&mut h);
        let salt = h.finish().max(1);
        Ok(LoraWeights(Arc::new(Inner {
            name: name.to_string(),
            dir: adapter.dir().to_path_buf(),
            pairs,
            config: cfg.clone(),
            salt,
            rank,
            n_values,
        })))
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn dir(&self) -> &Path {
        &self.0.dir
    }

    /// The largest rank of its pairs.
    pub fn rank(&self) -> usize {
        self.0.rank
    }

    /// The adapted linears, by canonical name, sorted.
    pub fn modules(&self) -> Vec<&str> {
        let mut m: Vec<&str> = self.0.pairs.keys().map(String::as_str).collect();
        m.sort_unstable();
        m
    }

    /// Bytes the adapter's f32 factors take.
    pub fn bytes(&self) -> usize {
        self.0.n_values * std::mem::size_of::<f32>()
    }

    /// A non-zero number that differs between adapters (and between two loads of one
    /// adapter): the prefix cache salts its block hashes with it so that KV computed under one
    /// adapter is never reused under another, or without one.
    pub fn cache_salt(&self) -> u64 {
        self.0.salt
    }

    /// Whether `model` has the shape this adapter was checked against.
    pub fn fits(&self, model: &Model) -> bool {
        model.config() == &self.0.config
    }

    /// The pair adapting linear `linear` (canonical name): `(r, A [r, cols], B·scaling
    /// [rows, r])`, for a backend that applies it itself.
    pub(crate) fn pair(&self, linear: &str) -> Option<(usize, &[f32], &[f32])> {
        let p = self.0.pairs.get(linear)?;
        Some((p.r, &p.a, &p.b_scaled))
    }

    /// Whether two handles are the same load.
    pub fn same(&self, other: &LoraWeights) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Whether `module` (an HF module path) is inside a mixture-of-experts layer's experts
/// (`mlp.experts.3.gate_proj`, Mixtral's `block_sparse_moe.experts.0.w1`, the fused
/// `mlp.experts`), or its canonical name is an expert's (`blk.0.ffn_gate_exp.3.weight`).
fn is_expert(module: &str, canonical: Option<&str>) -> bool {
    module.split('.').any(|part| part == "experts")
        || canonical.is_some_and(|c| c.contains("_exp.") || c.contains("_exps."))
}

/// Which rows of the current batch use which adapter (set for one forward pass).
#[derive(Debug, Default, Clone)]
pub struct LoraBatch {
    spans: Vec<(Range<usize>, LoraWeights)>,
    /// `[rows of a span, r]`: `x · Aᵀ`.
    tmp: Vec<f32>,
}

impl LoraBatch {
    /// Rows `rows` of the batch use `adapter`.
    pub(crate) fn push(&mut self, rows: Range<usize>, adapter: LoraWeights) {
        self.spans.push((rows, adapter));
    }

    /// Forgets every span (drops the batch's hold on its adapters).
    pub(crate) fn clear(&mut self) {
        self.spans.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Adds `scaling · B (A x)` to the output rows of the linear layer named `linear`
    /// (canonical name, `rows x cols`) whose span has an adapter that adapts it.
    /// `x`: `[total, cols]`, `out`: `[total, rows]`. The layers call it through
    /// `Linear::add_lora`, so this module needs nothing of theirs.
    pub fn apply(
        &mut self,
        linear: &str,
        (rows, cols): (usize, usize),
        x: &[f32],
        out: &mut [f32],
    ) {
        if self.spans.is_empty() {
            return;
        }
        for (span, adapter) in &self.spans {
            let Some(pair) = adapter.0.pairs.get(linear) else {
                continue;
            };
            let n = span.len();
            if span.end * cols > x.len() || span.end * rows > out.len() {
                debug_assert!(false, "LoRA span {span:?} outside the batch");
                continue;
            }
            self.tmp.resize(n * pair.r, 0.0);
            let xs = &x[span.start * cols..span.end * cols]; // [n, cols]
            matmul_nt(xs, &pair.a, &mut self.tmp, n, pair.r, cols, 1.0, false); // [n, r]
            let ys = &mut out[span.start * rows..span.end * rows]; // [n, rows]
            matmul_nt(&self.tmp, &pair.b_scaled, ys, n, rows, pair.r, 1.0, true);
        }
    }
}
