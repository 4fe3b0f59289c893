//! KV caches: [`PagedKvCache`], the paged keys and values of every layer shared by many
//! sequences, and [`KvCache`], one sequence's cache built on it (one private block table).
//!
//! Layout: per layer a K and a V of `n_blocks` blocks of `block_size` token rows of that
//! layer's `kv_dim = n_kv_heads * head_dim` values (`[n_blocks, block_size, kv_dim]`; layers
//! may differ, and a KV-shared layer keeps none: `ModelConfig::layer_kv_cache_dim`), stored as f16,
//! f32 or FP8 E4M3 with a static scale ([`KvDtype`]). A block's bytes follow the dtype
//! ([`PagedKvCache::bytes_per_block`]), so FP8 holds twice f16's blocks in the same memory.
//! A sequence's position `p` lives in block `table[p / block_size]`, slot `p % block_size`;
//! which blocks a sequence owns is the caller's policy (the engine's block pool), never this
//! module's.
//!
//! This module owns the paging (the cache's shape, block tables, block copies, the checks);
//! how a layer's K/V are stored is the device's: the cache holds a [`KvStorage`], made by
//! the model on its device (`Model::try_new_paged_cache`: each backend's own K/V layer type,
//! `crate::arch::backend::Backend::KvLayer`, in host or GPU memory), and names no device
//! itself. A model split between devices gets a cache of two caches
//! (`PagedKvCache::split`): its first layers' K/V on the first device, the rest on the
//! second, one set of blocks.
//!
//! Extension point, per-sequence state: a kind of cache other than paged K/V (the recurrent
//! state of a hybrid model's SSM layers: one slot per sequence rather than blocks per
//! position) goes into the same [`KvStorage`]: a second backend-owned associated type beside
//! `Backend::KvLayer`, made by the backend as the K/V layers are, held by the storage
//! (`crate::arch::pass::DeviceKv`) beside its `layers` and handed to the stack with them;
//! the slot a sequence uses is named in its batch segment as its block table is. The paging
//! here does not change, and neither does any code outside the backends and that storage.
//!
//! Invariants: every layer's K and V storages share the cache's blocks, block size and dtype
//! (each its own width, the cache's `kv_dim` the widest); a
//! [`KvCache`]'s positions `0..len` are valid in every layer once a forward pass over them
//! returned; `truncate` only shortens (a conversation that diverges recomputes from the common
//! prefix). The reusable state of the forward pass (activation buffers, on the device) lives in
//! the storage too, because the cache is the one `&mut` a forward pass gets: buffers grow to
//! the largest batch seen and are reused.

use crate::observer::LinearObserver;
use crate::{ModelConfig, ModelError};
use pagoda_kernels::kv_blocks::KvBlockStorage;
pub use pagoda_kernels::kv_blocks::KvDtype;
use std::any::Any;
use std::sync::Arc;

/// Block size of a single-sequence [`KvCache`] (the engine's default too, so both run the same
/// attention path).
const SINGLE_SEQUENCE_BLOCK_SIZE: usize = 16;

/// The shape every layer of a [`PagedKvCache`] shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub n_blocks: usize,
    /// Positions per block.
    pub block_size: usize,
    /// `n_kv_heads * head_dim` of the widest layer: values per position, for K and for V
    /// each (every layer's, for models whose layers are alike; a layer's own width is its
    /// storage's).
    pub kv_dim: usize,
    pub dtype: KvDtype,
}

impl KvShape {
    /// Values per layer of K (or of V).
    pub fn layer_values(&self) -> usize {
        self.n_blocks * self.block_size * self.kv_dim
    }
}

/// The K/V of a cache's layers on one device, with that device's reusable forward-pass state:
/// what a [`PagedKvCache`] holds, made by the model for its device. Blocks are indexed as
/// the cache's (see the module docs); the forward pass reaches the device's own types through
/// [`KvStorage::as_any_mut`].
pub trait KvStorage: Any + Send + Sync + std::fmt::Debug {
    /// Layers held.
    fn n_layers(&self) -> usize;

    /// Bytes of K/V storage held (not counting the reusable activation scratch).
    fn memory_bytes(&self) -> usize;

    /// Copies every slot of block `src` into block `dst`, in every layer, K and V (both
    /// within the cache's blocks: the caller checks).
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), ModelError>;

    /// Keys and values of `layer` when they are in host memory (`None` elsewhere).
    fn host_layer(&self, layer: usize) -> Option<(&KvBlockStorage, &KvBlockStorage)>;

    /// Where the K/V live and as what, for reports (see [`PagedKvCache::storage`]).
    fn storage(&self) -> String;

    /// Where the K/V live, for errors: `in host memory`, `in GPU memory (NAME)`.
    fn whereabouts(&self) -> String;

    /// Makes every later forward pass over this storage report its linear layers' inputs to
    /// `observer` (where the device's pass has the hook; a no-op elsewhere).
    fn set_observer(&mut self, observer: Option<Arc<dyn LinearObserver>>);

    /// The storage as its own type, for the forward pass of its device.
    fn as_any_mut(&mut self) -> &mut dyn Any;

    /// The recurrent state of a hybrid model's layers held beside the K/V, if any
    /// ([`crate::recurrent_state`]).
    fn recurrent_states(&mut self) -> Option<&mut crate::recurrent_state::RecurrentStates> {
        None
    }
}

/// Paged keys and values of every layer.
#[derive(Debug)]
pub struct PagedKvCache {
    shape: KvShape,
    n_layers: usize,
    storage: Box<dyn KvStorage>,
}

/// The two halves of a cache for a model split between devices (`arch::split`): the first
/// layers' K/V in `front`, the rest in `back`; one set of blocks, indexed by the same block
/// tables in both.
#[derive(Debug)]
struct SplitStorage {
    front: PagedKvCache,
    back: PagedKvCache,
}

impl KvStorage for SplitStorage {
    fn n_layers(&self) -> usize {
        self.front.n_layers + self.back.n_layers
    }

    fn memory_bytes(&self) -> usize {
        self.front.memory_bytes() + self.back.memory_bytes()
    }

    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), ModelError> {
        self.front.copy_block(src, dst)?;
        self.back.copy_block(src, dst)
    }

    fn host_layer(&self, layer: usize) -> Option<(&KvBlockStorage, &KvBlockStorage)> {
        self.front.layer(layer)
    }

    fn storage(&self) -> String {
        format!(
            "{} for layers 0..{}, {} for the rest",
            self.front.storage(),
            self.front.n_layers,
            self.back.storage()
        )
    }

    fn whereabouts(&self) -> String {
        "split between the CPU and a GPU".into()
    }

    fn set_observer(&mut self, observer: Option<Arc<dyn LinearObserver>>) {
        self.front.set_observer(observer)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl PagedKvCache {
    /// A cache of `shape` over `storage` (the device's K/V of every layer, made for `shape`).
    /// The host-memory cache is [`PagedKvCache::new`]; a cache on the model's device comes
    /// from `Model::try_new_paged_cache`.
    pub(crate) fn with_storage(shape: KvShape, storage: Box<dyn KvStorage>) -> Self {
        PagedKvCache {
            shape,
            n_layers: storage.n_layers(),
            storage,
        }
    }

    /// One cache of `front`'s layers followed by `back`'s, for a model split between
    /// devices (`arch::split`): both must have the same blocks, block size and K/V width, so
    /// one block table indexes both.
    pub(crate) fn split(front: PagedKvCache, back: PagedKvCache) -> Result<Self, ModelError> {
        let shape = |c: &PagedKvCache| (c.shape.n_blocks, c.shape.block_size, c.shape.kv_dim);
        if shape(&front) != shape(&back) {
            return Err(ModelError::InvalidConfig(format!(
                "the two halves of a split KV cache differ: (blocks, block size, K/V width) \
                 {:?} and {:?}",
                shape(&front),
                shape(&back)
            )));
        }
        Ok(Self::with_storage(
            front.shape,
            Box::new(SplitStorage { front, back }),
        ))
    }

    /// The halves of a split cache: the first layers', and the rest's.
    pub(crate) fn split_mut(
        &mut self,
    ) -> Result<(&mut PagedKvCache, &mut PagedKvCache), ModelError> {
        match self.storage.as_any_mut().downcast_mut::<SplitStorage>() {
            Some(SplitStorage { front, back }) => Ok((front, back)),
            None => Err(ModelError::InvalidBatch(
                "a split model's forward pass over a KV cache on one device: make the cache \
                 with the model's try_new_paged_cache"
                    .into(),
            )),
        }
    }

    /// The device's storage, for a forward pass on that device.
    /// Remakes the recurrent state beside the K/V with `slots` zeroed slots per recurrent
    /// layer (a hybrid model's cache for `slots` sequences); no effect without recurrent
    /// layers.
    pub fn set_state_slots(&mut self, slots: usize) {
        if let Some(states) = self.storage.recurrent_states() {
            states.set_slots(slots);
        }
    }

    /// Copies state slot `src` into `dst` in every recurrent layer (a forked sequence's
    /// state); no effect without recurrent layers or for slots outside the cache.
    pub fn copy_state_slot(&mut self, src: u32, dst: u32) {
        if let Some(states) = self.storage.recurrent_states() {
            states.copy_slot(src, dst);
        }
    }

    /// State slots per recurrent layer (0 for a model without recurrent layers).
    pub fn state_slots(&mut self) -> usize {
        self.storage.recurrent_states().map_or(0, |s| s.slots())
    }

    pub(crate) fn storage_mut(&mut self) -> &mut dyn KvStorage {
        &mut *self.storage
    }

    /// Where the K/V live, for errors (see [`KvStorage::whereabouts`]).
    pub(crate) fn whereabouts(&self) -> String {
        self.storage.whereabouts()
    }

    /// Bytes one block takes over all layers, K and V together (a KV-shared layer keeps
    /// none).
    pub fn bytes_per_block(cfg: &ModelConfig, block_size: usize, dtype: KvDtype) -> usize {
        let values: usize = (0..cfg.n_layers).map(|i| cfg.layer_kv_cache_dim(i)).sum();
        2 * block_size * values * dtype.bytes()
    }

    /// The shape every layer shares.
    pub fn shape(&self) -> KvShape {
        self.shape
    }

    pub fn n_blocks(&self) -> usize {
        self.shape.n_blocks
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.shape.block_size
    }

    pub fn dtype(&self) -> KvDtype {
        self.shape.dtype
    }

    /// `n_kv_heads * head_dim`: values per position per layer, for K and for V each.
    pub fn kv_dim(&self) -> usize {
        self.shape.kv_dim
    }

    /// Layers held.
    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    /// Bytes of K/V storage held (not counting the reusable activation scratch).
    pub fn memory_bytes(&self) -> usize {
        self.storage.memory_bytes()
    }

    /// Copies every slot of block `src` into block `dst`, in every layer, K and V
    /// (copy-on-write before a shared block is appended to). Errors if either is out of
    /// range (or the device fails).
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), ModelError> {
        for b in [src, dst] {
            if b as usize >= self.shape.n_blocks {
                return Err(ModelError::InvalidBatch(format!(
                    "block copy names block {b}, but the KV cache has {} blocks",
                    self.shape.n_blocks
                )));
            }
        }
        self.storage.copy_block(src, dst)
    }

    /// Keys and values of `layer` of a CPU cache (reading back positions in tests and
    /// debugging); `None` for a cache in GPU memory (and a split cache's GPU layers).
    pub fn layer(&self, layer: usize) -> Option<(&KvBlockStorage, &KvBlockStorage)> {
        self.storage.host_layer(layer)
    }

    /// Where the K/V live and as what, for reports: `f16`, `f32`, `fp8`, `bf16 on cuda:0`,
    /// `fp8 on cuda:0`.
    pub fn storage(&self) -> String {
        self.storage.storage()
    }

    /// Makes every later forward pass over this cache report its linear layers' inputs to
    /// `observer` (calibration; CPU caches only — a no-op elsewhere).
    pub(crate) fn set_observer(&mut self, observer: Option<Arc<dyn LinearObserver>>) {
        self.storage.set_observer(observer)
    }

    /// Checks that `block_table` can hold positions `0..end` and names only blocks of this
    /// cache.
    pub(crate) fn check_table(&self, block_table: &[u32], end: usize) -> Result<(), ModelError> {
        let block_size = self.shape.block_size;
        let covered = block_table.len().saturating_mul(block_size);
        if covered < end {
            return Err(ModelError::BlockTableTooShort {
                needed: end,
                covered,
            });
        }
        let used = end.div_ceil(block_size);
        if let Some(&bad) = block_table[..used]
            .iter()
            .find(|&&b| b as usize >= self.shape.n_blocks)
        {
            return Err(ModelError::InvalidBatch(format!(
                "block table names block {bad}, but the KV cache has {} blocks",
                self.shape.n_blocks
            )));
        }
        Ok(())
    }
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
    pub fn set_observer(&mut self, observer: Option<Arc<dyn LinearObserver>>) {
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
