//! RoPE tables, computed on the host for one layer kind from the config: the inverse
//! frequencies under the model's scaling (linear, Llama 3, YaRN, LongRoPE, GGUF frequency
//! factors), the cos/sin multiplier, the pair order and the query temperature. The CPU backend
//! rotates with a [`Rope`] directly; the CUDA backend uploads its frequencies
//! (`Backend::place_rope`).
//!
//! Invariant: `inv_freq.len() == rope_dim / 2`; only the first `rope_dim` values of a head
//! rotate.

use crate::config::{QueryTemperature, RopeScaling};
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use pagoda_kernels::ops::{self, RopeStyle};

/// Inverse RoPE frequencies of one layer kind, with the model's scaling applied.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    /// Multiplier on cos/sin (YaRN's attention temperature; 1 otherwise).
    mscale: f32,
    style: RopeStyle,
    head_dim: usize,
    /// Llama 4's query temperature, applied by [`Rope::apply_query`].
    query_temperature: Option<QueryTemperature>,
}

impl Rope {
    /// The rotation of layers with the model's `head_dim` and `rope_dim`.
    pub fn new(cfg: &ModelConfig, theta: f32, scaling: &RopeScaling) -> Self {
        Self::with_dims(cfg, cfg.head_dim, cfg.rope_dim, theta, scaling)
    }

    /// The rotation of layers whose heads have `head_dim` values, the first `rope_dim` of
    /// them covered by RoPE (Gemma 4's global layers differ from the rest).
    pub fn with_dims(
        cfg: &ModelConfig,
        head_dim: usize,
        rope_dim: usize,
        theta: f32,
        scaling: &RopeScaling,
    ) -> Self {
        let dim = rope_dim;
        let base: Vec<f32> = (0..dim / 2)
            .map(|i| 1.0 / (theta as f64).powf(2.0 * i as f64 / dim as f64) as f32)
            .collect();
        let (inv_freq, mscale) = match *scaling {
            RopeScaling::None => (base, 1.0),
            RopeScaling::Linear { factor } => (base.iter().map(|f| f / factor).collect(), 1.0),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position,
            } => {
                let old = original_max_position as f32;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                let scaled = base
                    .iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect();
                (scaled, 1.0)
            }
            RopeScaling::Yarn {
                factor,
                original_max_position,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => {
                // Dimension index at which a frequency completes `rot` turns over the original context.
                let correction_dim = |rot: f32| {
                    dim as f32
                        * (original_max_position as f32 / (rot * 2.0 * std::f32::consts::PI)).ln()
                        / (2.0 * theta.ln())
                };
                let (low, high) = (correction_dim(beta_fast), correction_dim(beta_slow));
                let (low, high) = if truncate {
                    (low.floor(), high.ceil())
                } else {
                    (low, high)
                };
                let (low, high) = (low.max(0.0), high.min(dim as f32 - 1.0));
                let scaled = base
                    .iter()
                    .enumerate()
                    .map(|(i, &f)| {
                        let span = if high == low { 0.001 } else { high - low };
                        let ramp = ((i as f32 - low) / span).clamp(0.0, 1.0);
                        let extrapolation = 1.0 - ramp;
                        f / factor * (1.0 - extrapolation) + f * extrapolation
                    })
                    .collect();
                (scaled, attention_factor)
            }
            RopeScaling::LongRope {
                ref long_factor,
                ref short_factor,
                original_max_position,
                attention_factor,
            } => {
                let factors = if cfg.context_length > original_max_position {
                    long_factor
                } else {
                    short_factor
                };
                let scaled = base.iter().zip(factors).map(|(f, d)| f / d).collect();
                (scaled, attention_factor)
            }
        };
        Rope {
            inv_freq,
            mscale,
            style: cfg.rope_style,
            head_dim,
            query_temperature: cfg.query_temperature,
        }
    }

    /// Keeps only the first `rotated_dim / 2` frequencies and sets the others to 0 (angle 0
    /// at every position): Gemma 4's proportional RoPE, whose exponents run over the whole
    /// covered width but of which only a share rotates.
    pub fn rotating_only(mut self, rotated_dim: usize) -> Self {
        for f in self.inv_freq.iter_mut().skip(rotated_dim / 2) {
            *f = 0.0;
        }
        self
    }

    /// The rotation by angle zero at every position: RoPE's frequencies all 0, so cos is
    /// exactly 1 and sin exactly 0 and Q and K pass unchanged (the NoPE layers of SmolLM3,
    /// through the same attention path as every other layer).
    pub fn identity(cfg: &ModelConfig) -> Self {
        Rope {
            inv_freq: vec![0.0; cfg.rope_dim / 2],
            mscale: 1.0,
            style: cfg.rope_style,
            head_dim: cfg.head_dim,
            query_temperature: None,
        }
    }

    /// Divides each frequency by a per-dimension factor: how GGUF files of Llama 3.1+ carry
    /// their RoPE scaling (tensor `rope_freqs.weight`, `[rope_dim / 2]`), as llama.cpp applies it.
    pub fn with_freq_factors(mut self, weights: &Weights) -> Result<Self, ModelError> {
        const NAME: &str = "rope_freqs.weight";
        if weights.contains(NAME) {
            let factors = weights.vector_f32(NAME, self.inv_freq.len())?;
            for (f, d) in self.inv_freq.iter_mut().zip(factors) {
                *f /= d;
            }
        }
        Ok(self)
    }

    /// Inverse frequencies, `[rope_dim / 2]`.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Multiplier on cos and sin.
    pub fn mscale(&self) -> f32 {
        self.mscale
    }

    /// Which pairs of a head rotate together.
    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// Values per head (the rotated ones first).
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Rotates `x` (`[n, heads * head_dim]`, row `t` at position `start + t`) in place.
    pub fn apply(&self, x: &mut [f32], n: usize, start: usize) {
        self.rotate(x, n, start, None);
    }

    /// [`Rope::apply`] for queries: also multiplies each row by the query temperature at its
    /// position, when the model has one (full-width RoPE, checked by the config, so scaling
    /// cos and sin scales the whole row).
    pub fn apply_query(&self, x: &mut [f32], n: usize, start: usize) {
        self.rotate(x, n, start, self.query_temperature);
    }

    /// The query temperature, if any.
    pub fn query_temperature(&self) -> Option<QueryTemperature> {
        self.query_temperature
    }

    fn rotate(&self, x: &mut [f32], n: usize, start: usize, temp: Option<QueryTemperature>) {
        let half = self.inv_freq.len();
        let mut cos = vec![0.0f32; half];
        let mut sin = vec![0.0f32; half];
        let row_len = x.len() / n.max(1);
        for (t, row) in x.chunks_exact_mut(row_len).enumerate() {
            let pos = (start + t) as f32;
            let scale = self.mscale * temp.map_or(1.0, |q| q.at(start + t));
            for i in 0..half {
                let (s, c) = (pos * self.inv_freq[i]).sin_cos();
                cos[i] = c * scale;
                sin[i] = s * scale;
            }
            ops::rope(row, self.head_dim, &cos, &sin, self.style);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufFile, GgufWriter};
    use crate::Architecture;

    fn config(rope_dim: usize) -> ModelConfig {
        ModelConfig {
            arch: Architecture::Llama,
            n_layers: 1,
            hidden_size: 8,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: rope_dim,
            ffn_dim: 8,
            vocab_size: 4,
            rms_eps: 1e-5,
            norm_weight_offset: 0.0,
            rope_theta: 10000.0,
            rope_theta_local: None,
            rope_scaling: RopeScaling::None,
            rope_style: RopeStyle::Neox,
            rope_dim,
            context_length: 64,
            sliding_window: None,
            layer_is_sliding: vec![false],
            layer_uses_rope: vec![true],
            query_temperature: None,
            attention_scale: 1.0,
            attn_logit_softcap: None,
            final_logit_softcap: None,
            embedding_scale: None,
            residual_scale: None,
            logit_scale: None,
            tie_word_embeddings: true,
            variants: Default::default(),
            moe: None,
            hybrid: None,
        }
    }

    #[test]
    fn rope_freq_factors_tensor_divides_frequencies() {
        let cfg = config(8);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("freqs.gguf");
        let mut w = GgufWriter::new();
        w.add_f32_tensor("rope_freqs.weight", &[4], &[2.0, 2.0, 2.0, 2.0])
            .expect("tensor");
        w.write(&path).expect("write");
        let weights = Weights::from_gguf(&GgufFile::open(&path).expect("open")).expect("weights");
        let with_factors = Rope::new(&cfg, cfg.rope_theta, &RopeScaling::None)
            .with_freq_factors(&weights)
            .expect("factors");
        let linear = Rope::new(&cfg, cfg.rope_theta, &RopeScaling::Linear { factor: 2.0 });
        assert_eq!(with_factors.inv_freq, linear.inv_freq);
        let unscaled = Rope::new(&cfg, cfg.rope_theta, &RopeScaling::None);
        assert_ne!(unscaled.inv_freq, linear.inv_freq);
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let cfg = config(64);
        let scaled = Rope::new(
            &cfg,
            500000.0,
            &RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 8192,
            },
        );
        let plain = Rope::new(&cfg, 500000.0, &RopeScaling::None);
        assert_eq!(
            scaled.inv_freq[0], plain.inv_freq[0],
            "highest frequency untouched"
        );
        let last = plain.inv_freq.len() - 1;
        assert!((scaled.inv_freq[last] - plain.inv_freq[last] / 8.0).abs() < 1e-12);
    }
}
