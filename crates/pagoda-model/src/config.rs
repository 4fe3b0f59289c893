//! The architecture-neutral description of a model: sizes, norms, RoPE, attention layout.
//!
//! Built from GGUF metadata (`from_gguf`) or a Hugging Face `config.json` (`from_hf_config`);
//! the forward passes read only this struct, never the file formats.
//!
//! Invariants (checked by [`ModelConfig::validate`]): `n_heads % n_kv_heads == 0`,
//! `rope_dim <= head_dim` and even, `layer_is_sliding` and `layer_uses_rope` have one
//! entry per layer.

mod from_gguf;
mod from_hf;

use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

/// The family a model belongs to; what each means is its [`crate::family::Family`] spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 1-3.x, Mistral 7B-style and SmolLM 1/2.
    Llama,
    /// Qwen2 / Qwen2.5: Llama plus biases on Q, K and V.
    Qwen2,
    /// Gemma 3: GeGLU, QK-norm, pre/post norms, embedding scale, sliding-window layers.
    Gemma3,
    /// Qwen3 dense: QK-norm, no biases.
    Qwen3,
    /// SmolLM3: Llama with every fourth layer without RoPE.
    SmolLM3,
    /// Ministral 3 / Mistral Small 3.x (llama.cpp `mistral3`): Llama with YaRN and Llama 4's
    /// position-dependent query temperature.
    Mistral3,
    /// Phi-3 / Phi-3.5 / Phi-4-mini (llama.cpp `phi3`): fused QKV and gate/up projections,
    /// partial rotary, LongRoPE.
    Phi3,
}

impl Architecture {
    /// Every architecture, in the order of [`crate::family::FAMILIES`].
    pub const ALL: &'static [Architecture] = &[
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Gemma3,
        Architecture::Qwen3,
        Architecture::SmolLM3,
        Architecture::Mistral3,
        Architecture::Phi3,
    ];
}

/// How RoPE frequencies are stretched for long context.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position: usize,
    },
    /// YaRN (Qwen long-context configs).
    Yarn {
        factor: f32,
        original_max_position: usize,
        beta_fast: f32,
        beta_slow: f32,
        /// Multiplier on cos and sin (the attention temperature): `0.1 ln(factor) + 1` unless
        /// the checkpoint says otherwise (`mscale` / `mscale_all_dim`, GGUF
        /// `yarn_log_multiplier`).
        attention_factor: f32,
    },
    /// LongRoPE (Phi-3.5, Phi-4-mini): every frequency divided by a per-dimension factor, the
    /// long factors when the model runs past `original_max_position` (its `context_length`
    /// does, as llama.cpp decides by its context size), else the short ones; cos and sin
    /// times `attention_factor`.
    LongRope {
        long_factor: Vec<f32>,
        short_factor: Vec<f32>,
        original_max_position: usize,
        attention_factor: f32,
    },
}

/// YaRN's default attention factor for `factor` with multiplier `mscale` (transformers'
/// `get_mscale`, llama.cpp's likewise): `0.1 · mscale · ln(factor) + 1`, 1 for no stretch.
pub fn yarn_mscale(factor: f32, mscale: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

/// Llama 4's query temperature (Ministral 3): queries at position `p` are multiplied by
/// `1 + beta · ln(1 + floor(p / original_context))`, which is 1 within the original context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueryTemperature {
    pub beta: f32,
    pub original_context: usize,
}

impl QueryTemperature {
    /// The multiplier at position `pos`.
    pub fn at(&self, pos: usize) -> f32 {
        1.0 + self.beta * (1.0 + (pos / self.original_context) as f32).ln()
    }
}

/// Everything a forward pass needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub n_layers: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// FFN inner width.
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub rms_eps: f32,
    /// Added to every RMSNorm weight (1.0 for Hugging Face Gemma checkpoints, else 0.0).
    pub norm_weight_offset: f32,
    pub rope_theta: f32,
    /// RoPE base of sliding-window layers when it differs (Gemma 3: 10 000).
    pub rope_theta_local: Option<f32>,
    pub rope_scaling: RopeScaling,
    pub rope_style: RopeStyle,
    /// Dimensions of each head that RoPE rotates (usually `head_dim`).
    pub rope_dim: usize,
    /// Trained context length; prompts beyond it are refused.
    pub context_length: usize,
    /// Window of sliding-window layers, in tokens.
    pub sliding_window: Option<usize>,
    /// One entry per layer: does it attend only within `sliding_window`?
    pub layer_is_sliding: Vec<bool>,
    /// One entry per layer: does it rotate Q and K (false: no position encoding, SmolLM3's
    /// NoPE layers)?
    pub layer_uses_rope: Vec<bool>,
    /// Position-dependent query scaling (Ministral 3), if any.
    pub query_temperature: Option<QueryTemperature>,
    /// Multiplier on q·k (default `1/sqrt(head_dim)`; Gemma: `1/sqrt(query_pre_attn_scalar)`).
    pub attention_scale: f32,
    pub attn_logit_softcap: Option<f32>,
    pub final_logit_softcap: Option<f32>,
    /// Multiplier on token embeddings (Gemma: `sqrt(hidden_size)`).
    pub embedding_scale: Option<f32>,
    /// Output projection shares the token embedding matrix.
    pub tie_word_embeddings: bool,
}

impl ModelConfig {
    /// Checks the invariants in the module doc.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |msg: String| Err(ModelError::InvalidConfig(msg));
        if self.n_layers == 0 || self.hidden_size == 0 || self.n_heads == 0 || self.head_dim == 0 {
            return bad(format!("zero-sized dimension in {self:?}"));
        }
        if self.n_kv_heads == 0 || self.n_heads % self.n_kv_heads != 0 {
            return bad(format!(
                "{} attention heads cannot be shared by {} KV heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.rope_dim > self.head_dim || self.rope_dim % 2 != 0 {
            return bad(format!(
                "RoPE dimension {} must be even and at most head_dim {}",
                self.rope_dim, self.head_dim
            ));
        }
        if self.layer_is_sliding.len() != self.n_layers {
            return bad(format!(
                "{} sliding-window flags for {} layers",
                self.layer_is_sliding.len(),
                self.n_layers
            ));
        }
        if self.layer_uses_rope.len() != self.n_layers {
            return bad(format!(
                "{} RoPE flags for {} layers",
                self.layer_uses_rope.len(),
                self.n_layers
            ));
        }
        if let RopeScaling::LongRope {
            long_factor,
            short_factor,
            ..
        } = &self.rope_scaling
        {
            let half = self.rope_dim / 2;
            if long_factor.len() != half || short_factor.len() != half {
                return bad(format!(
                    "LongRoPE needs {half} long and short factors (half the rotary dimension), \
                     got {} and {}",
                    long_factor.len(),
                    short_factor.len()
                ));
            }
        }
        if let Some(t) = self.query_temperature {
            if t.original_context == 0 || self.rope_dim != self.head_dim {
                return bad(format!(
                    "query temperature needs an original context > 0 and full-width RoPE \
                     (got {} and {} of {} dimensions)",
                    t.original_context, self.rope_dim, self.head_dim
                ));
            }
        }
        if self.layer_is_sliding.iter().any(|&s| s) && self.sliding_window.is_none() {
            return bad("sliding-window layers without a window size".into());
        }
        Ok(())
    }

    /// Query heads per KV head.
    pub fn gqa_group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }
}

/// Gemma's layer pattern: with pattern `p`, layer `i` is global iff `(i + 1) % p == 0`; every
/// other layer slides. `p == 0` or `1` means no sliding layers.
pub(crate) fn sliding_pattern(n_layers: usize, p: usize) -> Vec<bool> {
    (0..n_layers).map(|i| p > 1 && (i + 1) % p != 0).collect()
}

/// Upper bounds on sizes read from untrusted metadata, checked before anything is allocated
/// from them (a hostile file claiming 2^31 layers must not allocate a 2 GiB flag vector).
/// Far above any real model (the largest have ~130 layers, 16k-wide residuals, 256k vocabularies).
pub(crate) fn check_limits(
    n_layers: usize,
    hidden_size: usize,
    n_heads: usize,
    head_dim: usize,
    ffn_dim: usize,
    vocab_size: usize,
    context_length: usize,
) -> Result<(), String> {
    let limits = [
        ("layers", n_layers, 1 << 12),
        ("hidden size", hidden_size, 1 << 17),
        ("attention heads", n_heads, 1 << 12),
        ("head dimension", head_dim, 1 << 13),
        ("FFN width", ffn_dim, 1 << 20),
        ("vocabulary size", vocab_size, 1 << 24),
        ("context length", context_length, 1 << 28),
    ];
    for (what, v, max) in limits {
        if v > max {
            return Err(format!("{what} {v} is beyond the supported maximum {max}"));
        }
    }
    Ok(())
}
