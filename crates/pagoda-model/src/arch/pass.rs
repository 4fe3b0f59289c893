//! A backend's part of a KV cache, and setting up its forward pass over one: [`DeviceKv`] is
//! what a [`PagedKvCache`] made on a backend's device holds (the backend's own K/V layers and
//! pass scratch, behind the cache's device-blind [`KvStorage`]); [`with_pass`] takes them back
//! out for a pass of that backend and runs a body over them through [`Backend::with_pass`]. A
//! model on one device runs its whole pass in one body; a split model ([`super::split`]) runs
//! one body per device.
//!
//! Invariants: a [`DeviceKv`] holds the layers of its cache's shape, made by its backend; a
//! cache of another device (or split) given to a backend's pass is an error naming both,
//! never a panic.

use super::adapter::LoraWeights;
use super::backend::{Activations, Backend};
use crate::kv_cache::{KvShape, KvStorage};
use crate::observer::LinearObserver;
use crate::recurrent_state::RecurrentStates;
use crate::{ModelError, PagedKvCache};
use pagoda_kernels::kv_blocks::KvBlockStorage;
use pagoda_kernels::paged_attention::SeqAttention;
use std::any::Any;
use std::sync::Arc;

/// The K/V layers of a cache on `B`'s device, `B`'s reusable pass state, and the recurrent
/// state of a hybrid model's layers (host memory, [`crate::recurrent_state`]).
#[derive(Debug)]
pub(crate) struct DeviceKv<B: Backend> {
    backend: B,
    shape: KvShape,
    pub(crate) layers: Vec<B::KvLayer>,
    pub(crate) scratch: Box<B::Scratch>,
    pub(crate) states: RecurrentStates,
}

impl<B: Backend> DeviceKv<B> {
    /// `layers` of `shape` made by `backend` and `states`, with a fresh scratch.
    pub(crate) fn new(
        backend: B,
        shape: KvShape,
        layers: Vec<B::KvLayer>,
        states: RecurrentStates,
    ) -> Self {
        DeviceKv {
            backend,
            shape,
            layers,
            scratch: Box::default(),
            states,
        }
    }

    /// A cache of `shape`'s blocks on `backend`'s device, one layer per entry of `kv_dims`
    /// (its values per position), with `states` beside them.
    pub(crate) fn cache(
        backend: B,
        kv_dims: &[usize],
        shape: KvShape,
        states: RecurrentStates,
    ) -> Result<PagedKvCache, ModelError> {
        let layers = backend.new_kv_layers(kv_dims, &shape)?;
        Ok(PagedKvCache::with_storage(
            shape,
            Box::new(Self::new(backend, shape, layers, states)),
        ))
    }

    /// `cache`'s storage if it is `B`'s, else the error of a `B` pass over it.
    pub(crate) fn of(cache: &mut PagedKvCache) -> Result<&mut Self, ModelError> {
        // The error's text is made only on the error path (a pass allocates nothing here).
        if !cache.storage_mut().as_any_mut().is::<Self>() {
            return Err(ModelError::InvalidBatch(format!(
                "a {} forward pass over a KV cache {}: make the cache with the model's \
                 try_new_paged_cache",
                B::NAME,
                cache.whereabouts()
            )));
        }
        cache
            .storage_mut()
            .as_any_mut()
            .downcast_mut::<Self>()
            .ok_or_else(|| ModelError::Device("a KV cache changed device".into()))
    }
}

impl<B: Backend> KvStorage for DeviceKv<B> {
    fn n_layers(&self) -> usize {
        self.layers.len()
    }

    fn memory_bytes(&self) -> usize {
        self.backend.kv_bytes(&self.layers, &self.shape) + self.states.memory_bytes()
    }

    fn recurrent_states(&mut self) -> Option<&mut RecurrentStates> {
        Some(&mut self.states)
    }

    fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), ModelError> {
        self.backend
            .copy_kv_block(&mut self.layers, &self.shape, src, dst)
    }

    fn host_layer(&self, layer: usize) -> Option<(&KvBlockStorage, &KvBlockStorage)> {
        B::host_kv(self.layers.get(layer)?)
    }

    fn storage(&self) -> String {
        self.backend.kv_storage(self.shape.dtype)
    }

    fn whereabouts(&self) -> String {
        self.backend.kv_whereabouts()
    }

    fn set_observer(&mut self, observer: Option<Arc<dyn LinearObserver>>) {
        B::set_observer(&mut self.scratch, observer)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Runs `body` over `cache`'s K/V layers (on `backend`'s device), the pass's activations and
/// the pass of the sequences `seqs`, `adapters[i]` applied on `seqs[i]`'s rows.
pub(crate) fn with_pass<'s, B: Backend, R: Send>(
    backend: &B,
    cache: &mut PagedKvCache,
    adapters: impl Iterator<Item = Option<&'s LoraWeights>>,
    seqs: &[SeqAttention<'_>],
    body: impl for<'p> FnOnce(
            &mut [B::KvLayer],
            &mut RecurrentStates,
            &mut Activations<B::Act>,
            &mut B::Pass<'p>,
        ) -> Result<R, ModelError>
        + Send,
) -> Result<R, ModelError> {
    let block_size = cache.block_size();
    let DeviceKv {
        layers,
        scratch,
        states,
        ..
    } = DeviceKv::<B>::of(cache)?;
    backend.with_pass(
        layers,
        scratch,
        block_size,
        seqs,
        adapters,
        |kv, a, pass| body(kv, states, a, pass),
    )
}
