//! The calibration hook of the forward pass: [`LinearObserver`] sees the input of every linear
//! layer (what calibration-aware quantization and pruning are computed from).
//!
//! It lives apart from the forward passes so that the KV cache, which carries a pass's
//! reusable state between calls and so the observer set on it, can name it without naming
//! a backend.
//!
//! Invariant: an observer only reads; a pass with one computes exactly what it computes
//! without.

/// Sees the input of every linear layer of a forward pass: what calibration-aware
/// quantization (GPTQ's Hessians, AWQ's channel statistics) is computed from.
pub trait LinearObserver: Send + Sync {
    /// `x` (`[n, cols]`) is about to be multiplied by each weight named in `weights` (the
    /// layers that share one input, such as Q, K and V, come in one call).
    fn observe(&self, weights: &[&str], x: &[f32], n: usize);
}
