//! Configuration planning: what the operator asks of an engine ([`EngineConfig`]) and the
//! KV geometry the engine runs with, planned from it, the model's shape and the machine's
//! memory ([`KvLayout::plan`]: pool size from `kv_cache_memory`, or
//! [`DEFAULT_KV_FRACTION`] of available RAM through [`crate::memory`]).
//!
//! A hybrid model's recurrent-state slots ([`StatePlan`]: one live slot per sequence that may
//! run, and with prefix caching half as many again for prefix snapshots) come out of the same
//! budget before the blocks do.
//!
//! Invariants: a planned pool has at least two blocks, or all the blocks one sequence of
//! `max_model_len` positions needs when that is fewer; its block size is at least 1; its
//! `max_model_len` is at least 2 and at most the model's context length. Planning reads the
//! machine's memory only when no budget is given.

use crate::scheduler::{BatchingMode, Policy};
use crate::speculative::SpeculativeConfig;
use crate::EngineError;
use pagoda_model::arch::Model;
use pagoda_model::{KvDtype, PagedKvCache};

/// How the engine batches, schedules and sizes its KV memory.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Most tokens (decode tokens + prefill chunk tokens) in one step.
    pub max_num_batched_tokens: usize,
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    pub policy: Policy,
    pub mode: BatchingMode,
    /// Priority (or SJF rank) gained per second of waiting, so nothing starves.
    pub aging_per_sec: f64,
    /// Tokens per KV block.
    pub block_size: usize,
    pub kv_dtype: KvDtype,
    /// Bytes of KV memory; `None` takes [`DEFAULT_KV_FRACTION`] of available RAM, capped at
    /// what `max_num_seqs` full-length sequences could use.
    pub kv_cache_memory: Option<u64>,
    pub prefix_caching: bool,
    /// Longest sequence (prompt + output); `None` = the model's context length.
    pub max_model_len: Option<usize>,
    /// Speculative decoding (off when `None`).
    pub speculative: Option<SpeculativeConfig>,
    /// On a GPU, the share of the card's memory the weights, the activation workspace and
    /// the KV cache may use together (vLLM's `--gpu-memory-utilization`); the KV cache gets
    /// the rest of that share. Ignored on the CPU and when `kv_cache_memory` is set.
    pub gpu_memory_utilization: f64,
}

/// Share of available RAM the KV pool takes when no budget is given.
pub const DEFAULT_KV_FRACTION: f64 = 0.4;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_batched_tokens: 512,
            max_num_seqs: 64,
            policy: Policy::default(),
            mode: BatchingMode::default(),
            aging_per_sec: 1.0,
            block_size: 16,
            kv_dtype: KvDtype::default(),
            kv_cache_memory: None,
            prefix_caching: true,
            max_model_len: None,
            speculative: None,
            gpu_memory_utilization: 0.9,
        }
    }
}

/// The KV geometry the engine runs with (reported by the handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub n_blocks: usize,
    pub block_size: usize,
    pub dtype: KvDtype,
    /// Bytes of the KV blocks (not counting `states`).
    pub bytes: usize,
    pub max_model_len: usize,
    /// A hybrid model's recurrent-state slots (`None` for transformers).
    pub states: Option<StatePlan>,
}

/// A hybrid model's recurrent-state slots, planned beside the KV blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatePlan {
    /// Slots in all: `max_num_seqs` live ones, plus snapshot ones with prefix caching.
    pub slots: usize,
    /// Bytes of one slot (every recurrent layer's convolution window and state matrix).
    pub slot_bytes: usize,
}

impl StatePlan {
    /// The slots `model` needs under `config`, or `None` for a model without recurrent
    /// layers: one per sequence that may run, and `max(2, max_num_seqs / 2)` more for prefix
    /// snapshots when prefix caching is on (a snapshot is only worth keeping for prefixes
    /// that recur; the least recently used are evicted first).
    pub fn for_model(model: &Model, config: &EngineConfig) -> Option<Self> {
        Self::for_config(model.config(), config.max_num_seqs, config.prefix_caching)
    }

    /// [`StatePlan::for_model`] from a model's config alone (`pagoda tune`'s estimate).
    pub fn for_config(
        cfg: &pagoda_model::ModelConfig,
        max_num_seqs: usize,
        prefix_caching: bool,
    ) -> Option<Self> {
        if !cfg.has_recurrent_state() {
            return None;
        }
        let live = max_num_seqs.max(1);
        let snapshots = if prefix_caching { (live / 2).max(2) } else { 0 };
        Some(StatePlan {
            slots: live + snapshots,
            slot_bytes: (0..cfg.n_layers)
                .map(|i| cfg.layer_state_floats(i) * 4)
                .sum(),
        })
    }

    pub fn bytes(&self) -> usize {
        self.slots.saturating_mul(self.slot_bytes)
    }
}

impl KvLayout {
    /// Sizes the pool for `model` under `config` (see [`EngineConfig::kv_cache_memory`]).
    pub fn plan(model: &Model, config: &EngineConfig) -> Result<Self, EngineError> {
        let cfg = model.config();
        if config.block_size == 0 {
            return Err(EngineError::InvalidConfig(
                "block size must be at least 1".into(),
            ));
        }
        let max_model_len = config
            .max_model_len
            .unwrap_or(cfg.context_length)
            .min(cfg.context_length)
            .max(2);
        let all_layers = PagedKvCache::bytes_per_block(cfg, config.block_size, config.kv_dtype);
        let states = StatePlan::for_model(model, config);
        let state_bytes = states.map_or(0, |s| s.bytes() as u64);
        let blocks_per_seq = max_model_len.div_ceil(config.block_size);
        let util = config.gpu_memory_utilization;
        if !(util > 0.0 && util <= 1.0) {
            return Err(EngineError::InvalidConfig(format!(
                "--gpu-memory-utilization {util}: a share of the GPU's memory, above 0 and at \
                 most 1 (default 0.9)"
            )));
        }
        let gpu = model.gpu_memory()?;
        // A model split between the CPU and a GPU keeps its CPU layers' K/V in host memory:
        // only its GPU layers' count against the card, the rest against RAM.
        let host_per_block = match gpu {
            Some(_) => {
                all_layers / cfg.n_layers.max(1)
                    * cfg.n_layers.saturating_sub(model.kv_layers_on_gpu())
            }
            None => 0,
        };
        let mut per_block = all_layers - host_per_block;
        if gpu.is_none() && (util - EngineConfig::default().gpu_memory_utilization).abs() > 1e-9 {
            tracing::warn!(
                gpu_memory_utilization = util,
                "--gpu-memory-utilization applies to a model on a GPU; this one runs on the CPU \
                 (size its KV cache with --kv-cache-memory)"
            );
        }
        if let (Some(_), Some(spec)) = (gpu, &config.speculative) {
            // The draft model's cache holds as many positions as the target's, in the same
            // GPU memory: size the two together.
            if let crate::ProposerConfig::Draft { model: draft, .. } = &spec.proposer {
                per_block += PagedKvCache::bytes_per_block(
                    draft.config(),
                    config.block_size,
                    config.kv_dtype,
                );
            }
        }
        let n_blocks = match (config.kv_cache_memory, gpu) {
            (Some(bytes), _) => {
                if bytes < state_bytes {
                    return Err(EngineError::InvalidConfig(format!(
                        "--kv-cache-memory {:.2} GiB is less than the recurrent states of \
                         --max-num-seqs {} sequences need ({:.2} GiB); raise \
                         --kv-cache-memory or lower --max-num-seqs",
                        gib(bytes),
                        config.max_num_seqs,
                        gib(state_bytes)
                    )));
                }
                ((bytes - state_bytes) / (per_block + host_per_block) as u64) as usize
            }
            (None, Some((free, total))) => {
                let workspace = model.workspace_bytes(
                    config.max_num_batched_tokens.max(1),
                    config.max_num_seqs.max(1) * (1 + spec_tokens(config)),
                );
                let share = (total as f64 * util) as u64;
                let used = total.saturating_sub(free);
                let budget = share.saturating_sub(used).saturating_sub(workspace);
                tracing::info!(
                    total_gib = gib(total),
                    in_use_gib = gib(used),
                    workspace_gib = gib(workspace),
                    kv_gib = gib(budget),
                    utilization = config.gpu_memory_utilization,
                    "GPU memory"
                );
                if budget < per_block as u64 * blocks_per_seq.min(2) as u64 {
                    return Err(EngineError::InvalidConfig(format!(
                        "GPU memory: {:.2} GiB x {} = {:.2} GiB for Pagoda, of which the weights \
                         (and anything else on the card) use {:.2} GiB and a step's activations \
                         {:.2} GiB, leaves {:.2} GiB for the KV cache: not even one sequence of \
                         {max_model_len} positions; raise --gpu-memory-utilization, lower \
                         --max-model-len or --max-num-batched-tokens, or use a smaller model",
                        gib(total),
                        config.gpu_memory_utilization,
                        gib(share),
                        gib(used),
                        gib(workspace),
                        gib(budget)
                    )));
                }
                let on_gpu = (budget / per_block.max(1) as u64) as usize;
                if host_per_block > 0 {
                    let host = crate::memory::available_memory()
                        .map_or(1 << 30, |m| (m as f64 * DEFAULT_KV_FRACTION) as u64);
                    on_gpu.min((host / host_per_block as u64) as usize)
                } else {
                    on_gpu
                }
            }
            (None, None) => {
                let budget = crate::memory::available_memory()
                    .map_or(1 << 30, |m| (m as f64 * DEFAULT_KV_FRACTION) as u64)
                    .saturating_sub(state_bytes);
                let want = blocks_per_seq * config.max_num_seqs.max(1);
                ((budget / per_block as u64) as usize).min(want)
            }
        };
        if n_blocks < blocks_per_seq.min(2) {
            return Err(EngineError::InvalidConfig(format!(
                "a KV cache of {n_blocks} blocks ({} bytes each) cannot hold even one sequence; \
                 raise --kv-cache-memory",
                per_block
            )));
        }
        Ok(KvLayout {
            n_blocks,
            block_size: config.block_size,
            dtype: config.kv_dtype,
            bytes: n_blocks * (per_block + host_per_block),
            max_model_len,
            states,
        })
    }

    /// Token positions the pool holds.
    pub fn capacity_tokens(&self) -> usize {
        self.n_blocks * self.block_size
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Logits rows a step can ask for per sequence beyond the first (speculative proposals).
fn spec_tokens(config: &EngineConfig) -> usize {
    config.speculative.as_ref().map_or(0, |s| s.num_tokens)
}
