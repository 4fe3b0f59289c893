//! A model split between the CPU and a GPU, and the load that decides it.
//!
//! [`Split`] holds two [`Parts`]: the CPU's (the token embedding and decoder layers `0..k`)
//! and the other device's (layers `k..n`, the final norm and the output head), each loaded
//! with only what it owns. Its KV cache ([`PagedKvCache::split`]) keeps the first `k` layers'
//! K/V in host memory and the rest on the GPU, with one set of blocks and block tables, so
//! the engine's scheduler, block pool and prefix cache never learn the model is split. A
//! step runs the CPU layers over the batch, copies the hidden state `[rows, hidden]` (f32) to
//! the GPU once, runs the GPU layers and the head there, and brings the logits back as a
//! model wholly on the GPU does.
//!
//! [`place`] decides where a model goes for `--device` and `--gpu-layers`: it resolves the
//! device, measures the model as the GPU would store it ([`model_sizes`]) and asks
//! [`crate::placement::plan`] where each part goes; `Model::from_source_placed` builds the
//! model there (on the CPU, the GPU, or both, through the device registry).
//!
//! Invariants: the two parts' layer ranges are `0..k` and `k..n` of one model, and a split
//! cache's halves hold exactly those layers (checked each pass: an error, not a panic); the
//! driver is generic over the second part's backend, so the same code runs a split of two
//! CPU parts, whose logits are bit-identical to the unsplit CPU model's (this module's
//! tests); LoRA adapters apply in both parts through each backend's own pass;
//! `first_non_finite` runs each part's stages on its own device, the hidden state handed
//! over through host memory.

use super::backend::Backend;
use super::cpu::Cpu;
use super::cuda;
use super::parts::{fresh_sequence, PartSpec, Parts};
use super::pass::with_pass;
use super::placed::{BatchSegment, NonFiniteStage, Placed};
use crate::device::{Device, DeviceChoice};
use crate::placement::{self, GpuMemory, ModelSizes, Placement, PlacementRequest};
use crate::source::ModelSource;
use crate::weights::Weights;
use crate::{KvCache, KvDtype, ModelConfig, ModelError, PagedKvCache};
use pagoda_kernels::paged_attention::SeqAttention;
use std::any::Any;
use std::ops::Range;

/// A model's layers `0..k` (and embedding) on the CPU, `k..n` (and head) on backend `G`.
#[derive(Debug)]
pub(crate) struct Split<G: Backend> {
    front: Parts<Cpu>,
    back: Parts<G>,
}

impl<G: Backend> Split<G> {
    /// Loads `weights` split at layer `gpu_from`: the CPU part first, then `back`'s.
    pub(crate) fn load(
        cfg: &ModelConfig,
        weights: &Weights,
        back: G,
        gpu_from: usize,
    ) -> Result<Self, ModelError> {
        let n = cfg.n_layers;
        if gpu_from > n {
            return Err(ModelError::InvalidConfig(format!(
                "a split at layer {gpu_from} of a model with {n} layers"
            )));
        }
        let front_spec = PartSpec {
            layers: 0..gpu_from,
            embedding: true,
            head: false,
        };
        let back_spec = PartSpec {
            layers: gpu_from..n,
            embedding: false,
            head: true,
        };
        Ok(Split {
            front: Parts::load_part(Cpu, cfg, weights, &front_spec)?,
            back: Parts::load_part(back, cfg, weights, &back_spec)?,
        })
    }

    /// The layers on the second device.
    #[cfg(test)]
    pub(crate) fn back_layers(&self) -> Range<usize> {
        self.back.layers.clone()
    }

    /// A KV cache for this split: the CPU layers' K/V in host memory as `dtype`, the rest
    /// made by `back` (its device's memory).
    fn cache_with(
        &self,
        cfg: &ModelConfig,
        n_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
        back: impl FnOnce(&ModelConfig) -> Result<PagedKvCache, ModelError>,
    ) -> Result<PagedKvCache, ModelError> {
        // The caches size themselves by `n_layers`: each half gets its own count.
        let with_layers = |layers: usize| ModelConfig {
            n_layers: layers,
            ..cfg.clone()
        };
        let front = PagedKvCache::new(
            &with_layers(self.front.layers.len()),
            n_blocks,
            block_size,
            dtype,
        );
        PagedKvCache::split(front, back(&with_layers(self.back.layers.len()))?)
    }
}

impl<G: Backend> Split<G> {
    /// The forward pass of a validated batch (see the module docs).
    pub(crate) fn run(
        &self,
        cfg: &ModelConfig,
        segments: &[BatchSegment<'_>],
        seqs: &[SeqAttention<'_>],
        logit_rows: &[Range<usize>],
        cache: &mut PagedKvCache,
    ) -> Result<Vec<f32>, ModelError> {
        let (front, back) = cache.split_mut()?;
        if front.n_layers() != self.front.layers.len() || back.n_layers() != self.back.layers.len()
        {
            return Err(ModelError::InvalidBatch(format!(
                "a KV cache split after layer {} for a model split after layer {}: make the \
                 cache with the model's try_new_paged_cache",
                front.n_layers(),
                self.front.layers.len()
            )));
        }
        let front_parts = &self.front;
        let hidden = with_pass(
            &Cpu,
            front,
            segments.iter().map(|s| s.adapter),
            seqs,
            |kv, states, a, pass| {
                front_parts.embed_segments(cfg, segments, a, pass)?;
                front_parts.run_layers(cfg, kv, states, a, pass)?;
                // [total, hidden]: handed over, the buffer regrows next step.
                Ok(std::mem::take(&mut a.x))
            },
        )?;
        let back_parts = &self.back;
        with_pass(
            &back_parts.backend,
            back,
            segments.iter().map(|s| s.adapter),
            seqs,
            |kv, states, a, pass| {
                back_parts.backend.copy_from_host(&hidden, &mut a.x)?;
                back_parts.run_layers(cfg, kv, states, a, pass)?;
                back_parts.run_head(cfg, logit_rows, a, pass)
            },
        )
    }
}

/// A model split between the CPU and `G`'s device.
impl<G: Backend> Placed for Split<G> {
    fn forward_batch(
        &self,
        cfg: &ModelConfig,
        segments: &[BatchSegment<'_>],
        seqs: &[SeqAttention<'_>],
        logit_rows: &[Range<usize>],
        cache: &mut PagedKvCache,
    ) -> Result<Vec<f32>, ModelError> {
        self.run(cfg, segments, seqs, logit_rows, cache)
    }

    /// The split KV cache: the CPU layers' K/V in host memory, the rest on `G`'s device.
    fn new_cache(
        &self,
        cfg: &ModelConfig,
        n_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Result<PagedKvCache, ModelError> {
        self.cache_with(cfg, n_blocks, block_size, dtype, |back_cfg| {
            self.back.new_cache(back_cfg, n_blocks, block_size, dtype)
        })
    }

    fn device(&self) -> Device {
        self.back.backend.device()
    }

    fn memory_info(&self) -> Result<Option<(u64, u64)>, ModelError> {
        self.back.backend.memory_info()
    }

    fn workspace_bytes(&self, cfg: &ModelConfig, rows: usize, logit_rows: usize) -> u64 {
        self.back.backend.workspace_bytes(cfg, rows, logit_rows)
    }

    fn kv_layers_on_device(&self) -> usize {
        self.front.kv_layers_on_device() + self.back.kv_layers_on_device()
    }

    fn linear_shape(&self, name: &str) -> Option<(usize, usize)> {
        self.front
            .linear_shape(name)
            .or_else(|| self.back.linear_shape(name))
    }

    fn first_non_finite(
        &self,
        cfg: &ModelConfig,
        tokens: &[u32],
        dtype: KvDtype,
    ) -> Result<Option<NonFiniteStage>, ModelError> {
        let mut x = self.front.embed_to_host(cfg, tokens)?;
        if !x.iter().all(|v| v.is_finite()) {
            return Ok(Some(NonFiniteStage::Embedding));
        }
        let table = fresh_sequence(cfg, tokens.len())?;
        let mut cache = Placed::new_cache(self, cfg, table.len(), KvCache::BLOCK_SIZE, dtype)?;
        let (front, back) = cache.split_mut()?;
        if let Some(stage) = self.front.locate_non_finite(cfg, &mut x, front, &table)? {
            return Ok(Some(stage));
        }
        self.back.locate_non_finite(cfg, &mut x, back, &table)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The layer a tensor name belongs to (`blk.12.attn_q.weight` → 12).
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// `weights` measured as the GPU would hold them, with the K/V of [`placement::MIN_KV_TOKENS`]
/// positions per layer (bf16) and the workspace of a default engine step.
pub fn model_sizes(cfg: &ModelConfig, weights: &Weights) -> ModelSizes {
    let mut layers = vec![0u64; cfg.n_layers];
    let (mut embedding, mut head) = (0, 0);
    let tied = !weights.contains("output.weight") || cfg.tie_word_embeddings;
    for view in weights.iter() {
        let bytes = super::cuda_weights::tensor_device_bytes(view);
        match layer_of(&view.name) {
            Some(i) if i < layers.len() => layers[i] += bytes,
            // The head of a tied model is the embedding's one copy.
            _ if view.name == "token_embd.weight" && tied => head += bytes,
            _ if view.name == "token_embd.weight" => embedding += bytes,
            _ if view.name == "output.weight" && tied => {}
            _ => head += bytes,
        }
    }
    let tokens = placement::MIN_KV_TOKENS.min(cfg.context_length) as u64;
    ModelSizes {
        layers,
        embedding,
        head,
        kv_per_layer: 2 * tokens * (cfg.n_kv_heads * cfg.head_dim) as u64 * 2,
        workspace: cuda::workspace_bytes(cfg, 2048, 256),
    }
}

/// Where `source`'s model would go for `device` and `gpu_layers` (`--device`,
/// `--gpu-layers`), without building it: the device resolved and the [`Placement`], with the
/// reason for the start-up report (see [`crate::placement`]). `auto` puts as many layers on
/// the GPU as fit and the rest on the CPU; `cuda` all on the GPU or an error; `cpu` the CPU.
///
/// Errors: `--gpu-layers` above the layer count or with `--device cpu`; `cuda` without the
/// GPU, or with a model that does not fit it.
pub fn place(
    source: &ModelSource,
    device: DeviceChoice,
    gpu_layers: Option<usize>,
) -> Result<(Device, Placement), ModelError> {
    let cfg = &source.config;
    cfg.validate()?;
    let n = cfg.n_layers;
    if let (DeviceChoice::Cpu, Some(k @ 1..)) = (device, gpu_layers) {
        return Err(ModelError::InvalidConfig(format!(
            "--gpu-layers {k} with --device cpu: use --device auto or cuda to put layers on a \
             GPU"
        )));
    }
    let resolved = device.resolve()?;
    let placement = match resolved.device {
        Device::Cpu => {
            let why = resolved
                .cpu_because
                .unwrap_or_else(|| format!("--device {device}"));
            let ignored = match gpu_layers {
                Some(k @ 1..) => format!(" (--gpu-layers {k} needs one)"),
                _ => String::new(),
            };
            Placement::cpu(n, format!("cpu: {why}{ignored}"))
        }
        Device::Cuda(ordinal) => {
            let gpu = cuda::context(ordinal)?;
            let (free, total) = gpu.memory_info()?;
            let memory = GpuMemory {
                device: format!("cuda:{ordinal}"),
                name: gpu.gpu().name.clone(),
                free,
                total,
            };
            let request = match (gpu_layers, device) {
                (Some(k), _) => PlacementRequest::Layers(k),
                (None, DeviceChoice::Auto) => PlacementRequest::Auto,
                (None, _) => PlacementRequest::AllOnGpu,
            };
            placement::plan(&model_sizes(cfg, &source.weights), &memory, request)?
        }
    };
    Ok((resolved.device, placement))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{Logits, Model};
    use crate::open_model;
    use std::path::PathBuf;

    fn golden(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/golden")
            .join(name)
    }

    /// Deterministic token ids below `vocab`.
    fn tokens(seed: u32, n: usize, vocab: usize) -> Vec<u32> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % vocab as u32)
            .collect()
    }

    /// A two-segment step (a prefill of one sequence, a later chunk of another already
    /// cached) through `run`, then a decode row of each: the logits of every row asked.
    fn two_steps(
        vocab: usize,
        cache: &mut PagedKvCache,
        mut run: impl FnMut(&[BatchSegment<'_>], &mut PagedKvCache) -> Result<Vec<f32>, ModelError>,
    ) -> Vec<f32> {
        let (a, b) = (tokens(1, 11, vocab), tokens(2, 7, vocab));
        let (table_a, table_b): (Vec<u32>, Vec<u32>) = ((0..4).collect(), (4..8).collect());
        fn seg<'a>(
            tokens: &'a [u32],
            start: usize,
            block_table: &'a [u32],
            logits: Option<Logits>,
        ) -> BatchSegment<'a> {
            BatchSegment {
                tokens,
                start,
                block_table,
                logits,
                adapter: None,
                state_slot: None,
            }
        }
        let mut out = run(&[seg(&b[..4], 0, &table_b, None)], cache).expect("first chunk of b");
        out.extend(
            run(
                &[
                    seg(&a, 0, &table_a, Some(Logits::All)),
                    seg(&b[4..], 4, &table_b, Some(Logits::Last)),
                ],
                cache,
            )
            .expect("prefill step"),
        );
        out.extend(
            run(
                &[
                    seg(&[3], 7, &table_b, Some(Logits::Last)),
                    seg(&[5], 11, &table_a, Some(Logits::Last)),
                ],
                cache,
            )
            .expect("decode step"),
        );
        out
    }

    #[test]
    fn a_model_whose_layers_share_kv_is_refused_a_split_by_name() {
        let source = open_model(&golden("tiny-gemma4")).expect("open");
        for k in 1..source.config.n_layers {
            let err = Split::load(&source.config, &source.weights, Cpu, k)
                .expect_err("a split of a Gemma 4 model");
            assert!(err.to_string().contains("Gemma 4"), "{err}");
        }
    }

    #[test]
    fn a_split_of_two_cpu_parts_gives_the_unsplit_logits_bit_for_bit() {
        for name in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
            let source = open_model(&golden(name)).expect("open");
            let whole = Model::from_source(&source).expect("model");
            let cfg = whole.config().clone();
            let (n, vocab) = (cfg.n_layers, cfg.vocab_size);
            let dtype = KvDtype::F32;
            let mut cache = whole.new_paged_cache(8, 4, dtype);
            let expected = two_steps(vocab, &mut cache, |s, c| whole.forward_batch(s, c));
            assert!(!expected.is_empty() && expected.iter().all(|x| x.is_finite()));
            for k in 0..=n {
                let split = Split::load(&cfg, &source.weights, Cpu, k).expect("split");
                assert_eq!(split.back_layers(), k..n);
                let mut cache = split
                    .cache_with(&cfg, 8, 4, dtype, |c| Ok(PagedKvCache::new(c, 8, 4, dtype)))
                    .expect("split cache");
                assert_eq!(cache.n_layers(), n);
                let got = two_steps(vocab, &mut cache, |segments, c| {
                    let seqs = whole.plan_batch(segments, c)?;
                    let rows = super::super::logit_rows(segments, &seqs);
                    split.run(&cfg, segments, &seqs, &rows, c)
                });
                assert_eq!(got.len(), expected.len(), "{name}, split at {k}");
                let same = got
                    .iter()
                    .zip(&expected)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{name}, split at {k}: logits differ from the unsplit model"
                );
                // The CPU half's K/V are the unsplit cache's.
                if k > 0 {
                    let (kk, _) = cache.layer(0).expect("layer 0 on the CPU");
                    assert_eq!(kk.memory_bytes(), whole_layer_bytes(&whole, dtype));
                }
            }
        }
    }

    fn whole_layer_bytes(model: &Model, dtype: KvDtype) -> usize {
        let c = model.new_paged_cache(8, 4, dtype);
        c.layer(0).expect("cpu").0.memory_bytes()
    }

    #[test]
    fn a_split_cache_of_another_split_point_or_device_is_an_error() {
        let source = open_model(&golden("tiny-llama")).expect("open");
        let cfg = source.config.clone();
        let n = cfg.n_layers;
        assert!(n >= 2, "the tiny model has layers to split");
        let split = Split::load(&cfg, &source.weights, Cpu, 1).expect("split");
        let other = Split::load(&cfg, &source.weights, Cpu, n).expect("split");
        let model = Model::from_source(&source).expect("model");
        let dtype = KvDtype::F32;
        let mut wrong = other
            .cache_with(&cfg, 4, 4, dtype, |c| Ok(PagedKvCache::new(c, 4, 4, dtype)))
            .expect("cache");
        let toks = [1u32, 2, 3];
        let table = [0u32];
        let seg = [BatchSegment {
            tokens: &toks,
            start: 0,
            block_table: &table,
            logits: Some(Logits::Last),
            adapter: None,
            state_slot: None,
        }];
        let seqs = model.plan_batch(&seg, &wrong).expect("valid batch");
        let rows = super::super::logit_rows(&seg, &seqs);
        let e = split
            .run(&cfg, &seg, &seqs, &rows, &mut wrong)
            .expect_err("split point differs");
        assert!(e.to_string().contains("split after layer"), "{e}");
        // A one-device cache given to a split model, and a split cache to a one-device model.
        let mut plain = model.new_paged_cache(4, 4, dtype);
        let e = split
            .run(&cfg, &seg, &seqs, &rows, &mut plain)
            .expect_err("not split");
        assert!(e.to_string().contains("split model"), "{e}");
        let e = model
            .forward_batch(&seg, &mut wrong)
            .expect_err("split cache");
        assert!(e.to_string().contains("split between"), "{e}");
        // Halves of different shapes are refused.
        let e = PagedKvCache::split(
            PagedKvCache::new(&cfg, 4, 4, dtype),
            PagedKvCache::new(&cfg, 5, 4, dtype),
        )
        .expect_err("shapes differ");
        assert!(e.to_string().contains("differ"), "{e}");
        assert!(Split::load(&cfg, &source.weights, Cpu, n + 1).is_err());
    }

    #[test]
    fn sizes_count_each_layer_and_the_head_as_the_gpu_stores_them() {
        let source = open_model(&golden("tiny-llama")).expect("open");
        let cfg = &source.config;
        let sizes = model_sizes(cfg, &source.weights);
        assert_eq!(sizes.layers.len(), cfg.n_layers);
        let (d, f) = (cfg.hidden_size as u64, cfg.ffn_dim as u64);
        let (q, kv) = (
            (cfg.n_heads * cfg.head_dim) as u64,
            (cfg.n_kv_heads * cfg.head_dim) as u64,
        );
        // Q, K, V, O and gate, up, down as bf16; two norms as f32 (no biases in Llama).
        let layer = 2 * (d * q + 2 * d * kv + q * d + 3 * d * f) + 4 * 2 * d;
        assert!(
            sizes.layers.iter().all(|&b| b == layer),
            "{sizes:?} vs {layer}"
        );
        let table = 2 * cfg.vocab_size as u64 * d;
        let tied = !source.weights.contains("output.weight") || cfg.tie_word_embeddings;
        if tied {
            assert_eq!((sizes.embedding, sizes.head), (0, table + 4 * d));
        } else {
            assert_eq!((sizes.embedding, sizes.head), (table, table + 4 * d));
        }
        let tokens = placement::MIN_KV_TOKENS.min(cfg.context_length) as u64;
        assert_eq!(sizes.kv_per_layer, 2 * tokens * kv * 2);
        assert_eq!(layer_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_of("output.weight"), None);
        assert_eq!(layer_of("blk.x.attn_q.weight"), None);
    }

    #[test]
    fn gpu_layers_with_device_cpu_is_refused_and_cpu_is_reported() {
        let source = open_model(&golden("tiny-llama")).expect("open");
        let e = Model::from_source_placed(&source, DeviceChoice::Cpu, Some(2))
            .expect_err("no GPU asked");
        assert!(e.to_string().contains("--gpu-layers 2"), "{e}");
        let (model, placement) =
            Model::from_source_placed(&source, DeviceChoice::Cpu, None).expect("cpu");
        assert_eq!(model.device(), Device::Cpu);
        assert!(placement.all_cpu());
        assert_eq!(placement.reason, "cpu: --device cpu");
        assert_eq!(model.kv_layers_on_gpu(), 0);
        // Without a GPU, auto is the CPU with the reason; with one, a placement on it.
        let (model, placement) =
            Model::from_source_placed(&source, DeviceChoice::Auto, None).expect("auto");
        match pagoda_cuda::list_gpus() {
            // The CUDA interpreter is never auto's choice.
            Ok(gpus) if gpus.iter().any(|g| !g.interpreted) => {
                assert!(!placement.all_cpu(), "{placement:?}")
            }
            _ => {
                assert_eq!(model.device(), Device::Cpu);
                assert!(
                    placement.reason.starts_with("cpu: "),
                    "{}",
                    placement.reason
                );
            }
        }
    }
}
