//! A contiguous KV cache for one sequence: per layer, keys and values of every cached position.
//!
//! Layout: `k[layer]` is `[capacity, n_kv_heads * head_dim]` f32, row `p` holding position `p`.
//! Invariant: rows `0..len` are valid for every layer once a forward pass over them returned;
//! `truncate` only shortens (a conversation that diverges recomputes from the common prefix).

use crate::{ModelConfig, ModelError};

/// Keys and values of one sequence, for every layer.
#[derive(Debug, Clone)]
pub struct KvCache {
    kv_dim: usize,
    capacity: usize,
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    /// A cache for up to `capacity` positions of a model shaped by `config`.
    pub fn new(config: &ModelConfig, capacity: usize) -> Self {
        let kv_dim = config.n_kv_heads * config.head_dim;
        let layer = || vec![0.0f32; capacity * kv_dim];
        KvCache {
            kv_dim,
            capacity,
            len: 0,
            k: (0..config.n_layers).map(|_| layer()).collect(),
            v: (0..config.n_layers).map(|_| layer()).collect(),
        }
    }

    /// Positions currently cached.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most positions this cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held by the cache.
    pub fn memory_bytes(&self) -> usize {
        2 * self.k.len() * self.capacity * self.kv_dim * std::mem::size_of::<f32>()
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

    /// Stores the keys and values of positions `start..start + n` of `layer`
    /// (`k`, `v`: `[n, kv_dim]`).
    pub(crate) fn write(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) {
        let kv = self.kv_dim;
        debug_assert_eq!(k.len(), v.len());
        debug_assert!(start * kv + k.len() <= self.capacity * kv);
        self.k[layer][start * kv..start * kv + k.len()].copy_from_slice(k);
        self.v[layer][start * kv..start * kv + v.len()].copy_from_slice(v);
    }

    /// Keys and values of `layer` for positions `0..end`.
    pub(crate) fn layer(&self, layer: usize, end: usize) -> (&[f32], &[f32]) {
        let n = end * self.kv_dim;
        (&self.k[layer][..n], &self.v[layer][..n])
    }

    /// Marks positions up to `len` as valid (after every layer has written them).
    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity);
        self.len = len;
    }
}
