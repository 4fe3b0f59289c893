//! KV caches: [`PagedKvCache`], the paged keys and values of every layer shared by many
//! sequences, and [`KvCache`], one sequence's cache built on it (one private block table).
//!
//! Layout: per layer a K and a V [`KvBlockStorage`] of `n_blocks` blocks of `block_size` token
//! rows of `kv_dim = n_kv_heads * head_dim` values (`[n_blocks, block_size, kv_dim]`), stored
//! as f16, f32 or FP8 E4M3 with a static scale ([`KvDtype`]; on a GPU f16 is kept as bf16,
//! FP8 as the same codes). A block's bytes follow the dtype ([`PagedKvCache::bytes_per_block`]),
//! so FP8 holds twice f16's blocks in the same memory. A sequence's position `p` lives in block `table[p / block_size]`,
//! slot `p % block_size`; which blocks a sequence owns is the caller's policy (the engine's
//! block pool), never this module's.
//!
//! A model split between the CPU and a GPU gets a cache of two caches ([`PagedKvCache::split`]):
//! its CPU layers' K/V in host memory, its GPU layers' in the GPU's, one set of blocks.
//!
//! Invariants: every layer's K and V storages share the cache's shape and dtype; a
//! [`KvCache`]'s positions `0..len` are valid in every layer once a forward pass over them
//! returned; `truncate` only shortens (a conversation that diverges recomputes from the common
//! prefix). The activation scratch of the forward pass lives here too, because the cache is the
//! one `&mut` a forward pass gets: buffers grow to the largest batch seen and are reused.

use crate::arch::cuda::{CudaKvLayer, CudaScratch};
use crate::arch::layers::Scratch;
use crate::{ModelConfig, ModelError};
use pagoda_cuda::GpuContext;
use pagoda_kernels::kv_blocks::KvBlockStorage;
pub use pagoda_kernels::kv_blocks::KvDtype;
use std::sync::Arc;

/// Block size of a single-sequence [`KvCache`] (the engine's default too, so both run the same
/// attention path).
const SINGLE_SEQUENCE_BLOCK_SIZE: usize = 16;

/// One layer's keys and values in host memory.
pub(crate) type CpuKvLayer = (KvBlockStorage, KvBlockStorage);

/// Paged keys and values of every layer.
#[derive(Debug)]
pub struct PagedKvCache {
    n_blocks: usize,
    block_size: usize,
    dtype: KvDtype,
    kv_dim: usize,
    n_layers: usize,
    store: KvStore,
}

/// Where the K/V live: in host memory for a CPU model, in the GPU's for a CUDA one (the
/// cache is made by the model, on the model's device).
#[derive(Debug)]
enum KvStore {
    Cpu {
        /// Per layer: (keys, values), each `[n_blocks, block_size, kv_dim]`.
        layers: Vec<(KvBlockStorage, KvBlockStorage)>,
        /// The CPU forward pass's reusable state.
        scratch: Box<Scratch>,
    },
    Cuda {
        /// Per layer: bf16 keys and values in GPU memory, `[n_blocks * block_size, kv_dim]`.
        layers: Vec<CudaKvLayer>,
        /// The GPU forward pass's reusable state.
        scratch: Box<CudaScratch>,
        gpu: Arc<GpuContext>,
    },
    /// A model split between devices (`arch::split`): the first layers' K/V in `front` (host
    /// memory), the rest in `back` (the GPU's); one set of blocks, indexed by the same block
    /// tables in both.
    Split {
        front: Box<PagedKvCache>,
        back: Box<PagedKvCache>,
    },
}

impl PagedKvCache {
    /// `n_blocks` blocks of `block_size` positions for every layer of a model shaped by `cfg`.
    ///
    /// Panics if `block_size` is zero (a caller bug, not an input error).
    pub fn new(cfg: &ModelConfig, n_blocks: usize, block_size: usize, dtype: KvDtype) -> Self {
        assert!(block_size > 0, "KV block size must be positive");
        let kv_dim = cfg.n_kv_heads * cfg.head_dim;
        let storage = || KvBlockStorage::new(dtype, n_blocks, block_size, kv_dim);
        PagedKvCache {
            n_blocks,
            block_size,
            dtype,
            kv_dim,
            n_layers: cfg.n_layers,
            store: KvStore::Cpu {
                layers: (0..cfg.n_layers).map(|_| (storage(), storage())).collect(),
                scratch: Box::default(),
            },
        }
    }

    /// `n_blocks` blocks of `block_size` positions for every layer, in `gpu`'s memory, K/V
    /// as bf16 (a 16-bit `dtype` is stored as bf16 there) or FP8 E4M3 codes; f32 is refused.
    pub(crate) fn new_cuda(
        cfg: &ModelConfig,
        n_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
        gpu: &Arc<GpuContext>,
    ) -> Result<Self, ModelError> {
        let fp8 = match dtype {
            KvDtype::F16 => false,
            KvDtype::Fp8E4m3 => true,
            KvDtype::F32 => {
                return Err(ModelError::InvalidConfig(format!(
                    "a KV cache of {dtype} on the GPU: the CUDA path stores K/V as bf16 or \
                     FP8; use --kv-cache-dtype f16 (kept as bf16 on the GPU) or fp8"
                )))
            }
        };
        let kv_dim = cfg.n_kv_heads * cfg.head_dim;
        let len = n_blocks * block_size * kv_dim;
        let layers = (0..cfg.n_layers)
            .map(|_| CudaKvLayer::zeroed(gpu, len, fp8))
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(PagedKvCache {
            n_blocks,
            block_size,
            dtype,
            kv_dim,
            n_layers: cfg.n_layers,
            store: KvStore::Cuda {
                layers,
                scratch: Box::default(),
                gpu: gpu.clone(),
            },
        })
    }

    /// One cache of `front`'s layers followed by `back`'s, for a model split between
    /// devices (`arch::split`): both must have the same blocks, block size and K/V width, so
    /// one block table indexes both.
    pub(crate) fn split(front: PagedKvCache, back: PagedKvCache) -> Result<Self, ModelError> {
        let shape = |c: &PagedKvCache| (c.n_blocks, c.block_size, c.kv_dim);
        if shape(&front) != shape(&back) {
            return Err(ModelError::InvalidConfig(format!(
                "the two halves of a split KV cache differ: (blocks, block size, K/V width) \
                 {:?} and {:?}",
                shape(&front),
                shape(&back)
            )));
        }
        Ok(PagedKvCache {
            n_blocks: front.n_blocks,
            block_size: front.block_size,
            dtype: front.dtype,
            kv_dim: front.kv_dim,
            n_layers: front.n_layers + back.n_layers,
            store: KvStore::Split {
                front: Box::new(front),
                back: Box::new(back),
            },
        })
    }

    /// The halves of a split cache: the first layers', and the rest's.
    pub(crate) fn split_mut(
        &mut self,
    ) -> Result<(&mut PagedKvCache, &mut PagedKvCache), ModelError> {
        match &mut self.store {
            KvStore::Split { front, back } => Ok((&mut **front, &mut **back)),
            _ => Err(ModelError::InvalidBatch(
                "a split model's forward pass over a KV cache on one device: make the cache \
                 with the model's try_new_paged_cache"
                    .into(),
            )),
        }
    }

    /// Bytes one block takes over all layers, K and V together.
    pub fn bytes_per_block(cfg: &ModelConfig, block_size: usize, dtype: KvDtype) -> usize {
        2 * cfg.n_layers * block_size * cfg.n_kv_heads * cfg.head_dim * dtype.bytes()
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// `n_kv_heads * head_dim`: values per position per layer, for K and for V each.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Layers held.
    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    /// Bytes of K/V storage held (not counting the reusable activation scratch).
    pub fn memory_bytes(&self) -> usize {
        match &self.store {
            KvStore::Cpu { layers, .. } => layers
                .iter()
                .map(|(k, v)| k.memory_bytes() + v.memory_bytes())
                .sum(),
            // bf16 for f16: the same bytes per value as the dtype says.
            KvStore::Cuda { layers, .. } => {
                layers.len() * 2 * self.layer_values() * self.dtype.bytes()
            }
            KvStore::Split { front, back } => front.memory_bytes() + back.memory_bytes(),
        }
    }

    /// Copies every slot of block `src` into block `dst`, in every layer, K and V
    /// (copy-on-write before a shared block is appended to). Errors if either is out of
    /// range (or the device fails).
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), ModelError> {
        for b in [src, dst] {
            if b as usize >= self.n_blocks {
                return Err(ModelError::InvalidBatch(format!(
                    "block copy names block {b}, but the KV cache has {} blocks",
                    self.n_blocks
                )));
            }
        }
        match &mut self.store {
            KvStore::Cpu { layers, .. } => {
                for (k, v) in layers {
                    k.copy_block(src, dst);
                    v.copy_block(src, dst);
                }
            }
            KvStore::Cuda { layers, gpu, .. } => {
                let block = self.block_size * self.kv_dim;
                let (src, dst) = (src as usize * block, dst as usize * block);
                if src != dst {
                    for layer in layers {
                        layer.copy_within(gpu, src, dst, block)?;
                    }
                }
            }
            KvStore::Split { front, back } => {
                front.copy_block(src, dst)?;
                back.copy_block(src, dst)?;
            }
        }
        Ok(())
    }

    /// Keys and values of `layer` of a CPU cache (reading back positions in tests and
    /// debugging); `None` for a cache in GPU memory (and a split cache's GPU layers).
    pub fn layer(&self, layer: usize) -> Option<(&KvBlockStorage, &KvBlockStorage)> {
        match &self.store {
            KvStore::Cpu { layers, .. } => layers.get(layer).map(|(k, v)| (k, v)),
            KvStore::Cuda { .. } => None,
            KvStore::Split { front, .. } => front.layer(layer),
        }
    }

    /// The layers and the forward pass's scratch of a CPU cache.
    pub(crate) fn cpu_parts_mut(
        &mut self,
    ) -> Result<(&mut [CpuKvLayer], &mut Scratch), ModelError> {
        match &mut self.store {
            KvStore::Cpu { layers, scratch } => Ok((layers, &mut **scratch)),
            KvStore::Cuda { gpu, .. } => Err(ModelError::InvalidBatch(format!(
                "a CPU forward pass over a KV cache in GPU memory ({}): make the cache with \
                 the model's try_new_paged_cache",
                gpu.gpu().name
            ))),
            KvStore::Split { .. } => Err(split_cache_error("CPU")),
        }
    }

    /// The layers and the forward pass's scratch of a cache in GPU memory.
    pub(crate) fn cuda_parts_mut(
        &mut self,
    ) -> Result<(&mut [CudaKvLayer], &mut CudaScratch), ModelError> {
        match &mut self.store {
            KvStore::Cuda {
                layers, scratch, ..
            } => Ok((layers, &mut **scratch)),
            KvStore::Cpu { .. } => Err(ModelError::InvalidBatch(
                "a GPU forward pass over a KV cache in host memory: make the cache with the \
                 model's try_new_paged_cache"
                    .into(),
            )),
            KvStore::Split { .. } => Err(split_cache_error("GPU")),
        }
    }

    /// Values per layer of K (or of V).
    fn layer_values(&self) -> usize {
        self.n_blocks * self.block_size * self.kv_dim
    }

    /// Where the K/V live and as what, for reports: `f16`, `f32`, `fp8`, `bf16 on cuda:0`,
    /// `fp8 on cuda:0`.
    pub fn storage(&self) -> String {
        match &self.store {
            KvStore::Cpu { .. } => self.dtype.to_string(),
            KvStore::Cuda { gpu, .. } => {
                let kind = match self.dtype {
                    KvDtype::Fp8E4m3 => "fp8",
                    _ => "bf16",
                };
                format!("{kind} on cuda:{}", gpu.gpu().ordinal)
            }
            KvStore::Split { front, back } => format!(
                "{} for layers 0..{}, {} for the rest",
                front.storage(),
                front.n_layers,
                back.storage()
            ),
        }
    }

    /// Makes every later forward pass over this cache report its linear layers' inputs to
    /// `observer` (calibration; CPU caches only — a no-op elsewhere).
    pub(crate) fn set_observer(
        &mut self,
        observer: Option<std::sync::Arc<dyn crate::arch::layers::LinearObserver>>,
    ) {
        match &mut self.store {
            KvStore::Cpu { scratch, .. } => {
                scratch.observer = crate::arch::layers::ObserverSlot(observer)
            }
            KvStore::Cuda { .. } => {}
            KvStore::Split { front, .. } => front.set_observer(observer),
        }
    }

    /// Checks that `block_table` can hold positions `0..end` and names only blocks of this
    /// cache.
    pub(crate) fn check_table(&self, block_table: &[u32], end: usize) -> Result<(), ModelError> {
        let covered = block_table.len().saturating_mul(self.block_size);
        if covered < end {
            return Err(ModelError::BlockTableTooShort {
                needed: end,
                covered,
            });
        }
        let used = end.div_ceil(self.block_size);
        if let Some(&bad) = block_table[..used]
            .iter()
            .find(|&&b| b as usize >= self.n_blocks)
        {
            return Err(ModelError::InvalidBatch(format!(
                "block table names block {bad}, but the KV cache has {} blocks",
                self.n_blocks
            )));
        }
        Ok(())
    }
}

/// The error of a one-device forward pass over a split cache.
fn split_cache_error(device: &str) -> ModelError {
    ModelError::InvalidBatch(format!(
        "a {device} forward pass over a KV cache split between the CPU and a GPU: make the \
         cache with the model's try_new_paged_cache"
    ))
}

/// Keys and values of one sequence, for every layer: a [`PagedKvCache`] whose blocks all
/// belong to this sequence, in order.
#[derive(Debug)]
pub struct KvCache {
    paged: PagedKvCache,
    /// `0, 1, .., n_blocks - 1`: covers `capacity` positions.
    block_table: Vec<u32>,
    capacity: usize,
    len: usize,
}

impl KvCache {
    /// A cache for up to `capacity` positions of a model shaped by `config`, stored as f16
    /// (llama.cpp's default).
    pub fn new(config: &ModelConfig, capacity: usize) -> Self {
        Self::with_dtype(config, capacity, KvDtype::F16)
    }

    /// A cache of one sequence over `paged`, whose blocks must cover `capacity` positions.
    pub(crate) fn over(paged: PagedKvCache, capacity: usize) -> Self {
        KvCache {
            block_table: (0..paged.n_blocks() as u32).collect(),
            paged,
            capacity,
            len: 0,
        }
    }

    /// Block size of a single-sequence cache.
    pub(crate) const BLOCK_SIZE: usize = SINGLE_SEQUENCE_BLOCK_SIZE;

    /// A cache for up to `capacity` positions stored as `dtype`, in host memory.
    pub fn with_dtype(config: &ModelConfig, capacity: usize, dtype: KvDtype) -> Self {
        let bs = SINGLE_SEQUENCE_BLOCK_SIZE;
        let n_blocks = capacity.div_ceil(bs);
        KvCache {
            paged: PagedKvCache::new(config, n_blocks, bs, dtype),
            block_table: (0..n_blocks as u32).collect(),
            capacity,
            len: 0,
        }
    }

    /// Positions currently cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Makes every later forward pass over this cache report its linear layers' inputs to
    /// `observer` (calibration for GPTQ/AWQ); `None` stops it.
    pub fn set_observer(
        &mut self,
        observer: Option<std::sync::Arc<dyn crate::arch::layers::LinearObserver>>,
    ) {
        self.paged.set_observer(observer);
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most positions this cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn dtype(&self) -> KvDtype {
        self.paged.dtype()
    }

    /// Bytes held by the cache's K/V storage.
    pub fn memory_bytes(&self) -> usize {
        self.paged.memory_bytes()
    }

    /// Forgets every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Checks that `n` more positions starting at `start` fit.
    pub(crate) fn check_room(&self, start: usize, n: usize) -> Result<(), ModelError> {
        if start != self.len {
            return Err(ModelError::InvalidConfig(format!(
                "forward pass at position {start} but the cache holds {} positions",
                self.len
            )));
        }
        if start + n > self.capacity {
            return Err(ModelError::ContextFull {
                needed: start + n,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// The block table and the paged cache it indexes, for one forward pass.
    pub(crate) fn parts(&mut self) -> (&[u32], &mut PagedKvCache) {
        (&self.block_table, &mut self.paged)
    }

    /// Marks positions up to `len` as valid (after every layer has written them).
    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity);
        self.len = len;
    }
}
