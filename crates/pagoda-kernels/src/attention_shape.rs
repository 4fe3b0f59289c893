//! What every attention kernel computes over: [`AttentionShape`] (heads, kv heads, head
//! size, scale, soft-cap, sliding window) and the sliding-window rule (`first_visible`).
//! Shared by the dense path (`attention`, which re-exports the shape) and the paged one
//! (`paged_attention` and its decode driver): the decode driver, which `simd/attn.rs`
//! implements, needs nothing of `attention`, whose softmax runs on `simd/attn.rs`.
//!
//! Invariant: a query row at position `pos` sees positions `first_visible(window, pos)
//! ..= pos`, in every kernel.

/// The head layout and scaling of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier on q·k.
    pub scale: f32,
    /// `cap * tanh(s / cap)` on the scaled scores when set.
    pub softcap: Option<f32>,
    /// Attend only to the last `window` positions (including the query's own).
    pub window: Option<usize>,
}

/// First key position a query at `pos` may see.
pub(crate) fn first_visible(window: Option<usize>, pos: usize) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}
