//! Element-wise and row-wise operations of a transformer layer: RMSNorm, RoPE, softmax,
//! activations. Written as plain loops the compiler vectorizes; they are a small share of a
//! step next to the matrix products. The gated activations split a prefill's rows between
//! the threads of a pass (`hot_pool::zip_chunks_mut`; one thread below [`ELEMENTWISE_CHUNK`]
//! elements), element by element, so results never depend on the split.
//!
//! Invariant: every function takes its shapes from slice lengths and the explicit dimension
//! arguments, and panics (a programming error, not an input error) when they disagree.

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: GGUF `llama` tensors (permuted by the converter).
    Interleaved,
    /// Halves `(i, i + rot_dim/2)`: Hugging Face checkpoints, GGUF qwen2 and gemma3.
    Neox,
}

/// `out = x / rms(x) * (weight + weight_offset)`, row by row over `[n, dim]`.
///
/// `weight_offset` is 0 for Llama and 1 for Gemma checkpoints stored as `w` rather than `1 + w`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, weight_offset: f32, out: &mut [f32]) {
    let dim = weight.len();
    assert_eq!(x.len(), out.len());
    assert_eq!(x.len() % dim, 0);
    for (row, out_row) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let sum_sq: f32 = row.iter().map(|v| v * v).sum();
        let scale = 1.0 / (sum_sq / dim as f32 + eps).sqrt();
        for ((o, &v), &w) in out_row.iter_mut().zip(row).zip(weight) {
            *o = v * scale * (w + weight_offset);
        }
    }
}

/// In-place RMSNorm of every `weight.len()`-sized row of `x` (used for per-head QK-norm).
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32, weight_offset: f32) {
    let dim = weight.len();
    assert_eq!(x.len() % dim, 0);
    for row in x.chunks_exact_mut(dim) {
        let sum_sq: f32 = row.iter().map(|v| v * v).sum();
        let scale = 1.0 / (sum_sq / dim as f32 + eps).sqrt();
        for (v, &w) in row.iter_mut().zip(weight) {
            *v *= scale * (w + weight_offset);
        }
    }
}

/// Rotates each head of one token's `x` (`[n_heads, head_dim]`) by the angles whose cosines
/// and sines are `cos`/`sin` (`[rot_dim / 2]`, for this token's position).
pub fn rope(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = cos.len();
    assert_eq!(sin.len(), half);
    assert!(2 * half <= head_dim);
    assert_eq!(x.len() % head_dim, 0);
    for head in x.chunks_exact_mut(head_dim) {
        match style {
            RopeStyle::Interleaved => {
                for i in 0..half {
                    let (a, b) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = a * cos[i] - b * sin[i];
                    head[2 * i + 1] = a * sin[i] + b * cos[i];
                }
            }
            RopeStyle::Neox => {
                for i in 0..half {
                    let (a, b) = (head[i], head[i + half]);
                    head[i] = a * cos[i] - b * sin[i];
                    head[i + half] = a * sin[i] + b * cos[i];
                }
            }
        }
    }
}

/// Numerically stable in-place softmax of one row.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return;
    }
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Elements per parallel task of the gated activations (below it they run on one thread:
/// a decode step's few thousand elements cost less than waking a helper).
const ELEMENTWISE_CHUNK: usize = 1 << 15;

/// `gate = silu(gate) * up` (SwiGLU).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    crate::hot_pool::zip_chunks_mut(gate, up, ELEMENTWISE_CHUNK, &silu_mul_serial);
}

fn silu_mul_serial(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `gate = gelu_tanh(gate) * up` (GeGLU, as Gemma uses).
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    crate::hot_pool::zip_chunks_mut(gate, up, ELEMENTWISE_CHUNK, &gelu_tanh_mul_serial);
}

fn gelu_tanh_mul_serial(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let t = (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh();
        *g = 0.5 * x * (1.0 + t) * u;
    }
}

/// `gate = sigmoid(gate) * up` (Qwen3.5's gate on the attention output).
pub fn sigmoid_mul(gate: &mut [f32], up: &[f32]) {
    crate::hot_pool::zip_chunks_mut(gate, up, ELEMENTWISE_CHUNK, &sigmoid_mul_serial);
}

fn sigmoid_mul_serial(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = u / (1.0 + (-*g).exp());
    }
}

/// gpt-oss's clamped SwiGLU: the gate's slope of its sigmoid.
pub const SWIGLU_OAI_ALPHA: f32 = 1.702;
/// gpt-oss's clamped SwiGLU: the gate is at most this, `up` within ± this.
pub const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// `gate = g · sigmoid(α g) · (u + 1)` with `g = min(gate, limit)`, `u = clamp(up, ±limit)`
/// (gpt-oss; llama.cpp's `swiglu_oai`, transformers' `GptOssExperts`).
pub fn swiglu_oai_mul(gate: &mut [f32], up: &[f32]) {
    crate::hot_pool::zip_chunks_mut(gate, up, ELEMENTWISE_CHUNK, &swiglu_oai_mul_serial);
}

fn swiglu_oai_mul_serial(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(SWIGLU_OAI_LIMIT);
        let y = u.clamp(-SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT);
        *g = x / (1.0 + (-SWIGLU_OAI_ALPHA * x).exp()) * (y + 1.0);
    }
}

/// `acc += x`.
pub fn add_inplace(acc: &mut [f32], x: &[f32]) {
    assert_eq!(acc.len(), x.len());
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// `x *= s`.
pub fn scale_inplace(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// `x = cap * tanh(x / cap)` (logit soft-capping).
pub fn softcap_inplace(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

/// Dot product of two f32 slices.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    // Eight accumulators let the compiler keep a full vector register busy.
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// `y += a * x`.
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len());
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_gives_unit_rms() {
        let x = [1.0, -2.0, 3.0, -4.0];
        let w = [1.0; 4];
        let mut out = [0.0; 4];
        rms_norm(&x, &w, 0.0, 0.0, &mut out);
        let rms: f32 = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
        let mut out1 = [0.0; 4];
        rms_norm(&x, &[0.0; 4], 0.0, 1.0, &mut out1);
        assert_eq!(out, out1, "offset 1 with zero weight equals weight 1");
    }

    #[test]
    fn rope_styles_rotate_the_right_pairs() {
        let (c, s) = ((0.3f32).cos(), (0.3f32).sin());
        let mut a = [1.0, 0.0, 0.0, 0.0];
        rope(&mut a, 4, &[c, 1.0], &[s, 0.0], RopeStyle::Interleaved);
        assert!((a[0] - c).abs() < 1e-7 && (a[1] - s).abs() < 1e-7);
        let mut b = [1.0, 0.0, 0.0, 0.0];
        rope(&mut b, 4, &[c, 1.0], &[s, 0.0], RopeStyle::Neox);
        assert!((b[0] - c).abs() < 1e-7 && (b[2] - s).abs() < 1e-7 && b[1] == 0.0);
    }

    #[test]
    fn softmax_sums_to_one_and_survives_large_inputs() {
        let mut x = [1000.0, 1001.0, f32::NEG_INFINITY];
        softmax_inplace(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[2], 0.0);
    }

    #[test]
    fn sigmoid_mul_gates_by_the_logistic_function() {
        let mut gate = [0.0, 20.0, -20.0];
        sigmoid_mul(&mut gate, &[3.0, 2.0, 2.0]);
        assert_eq!(gate[0], 1.5);
        assert!((gate[1] - 2.0).abs() < 1e-6 && gate[2].abs() < 1e-6);
    }

    #[test]
    fn dot_matches_naive_on_odd_lengths() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.1).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot_f32(&a, &b) - naive).abs() < 1e-3);
    }
}
