//! The architecture-neutral description of a model: sizes, norms, RoPE, attention layout.
//!
//! Built from GGUF metadata (`from_gguf`) or a Hugging Face `config.json` (`from_hf_config`);
//! the forward passes read only this struct, never the file formats.
//!
//! Invariants (checked by [`ModelConfig::validate`]): `n_heads % n_kv_heads == 0`,
//! `rope_dim <= head_dim` and even, `layer_is_sliding` and `layer_uses_rope` have one
//! entry per layer; [`LayerVariants`] (layers that differ: Gemma 4) are consistent: per-layer
//! lists have one entry per layer, every KV-shared layer has a source layer of its kind and
//! width. Code that sizes a layer asks the per-layer accessors (`layer_head_dim(i)`,
//! `layer_kv_dim(i)`, `layer_ffn_dim(i)`, …), never `head_dim` directly.

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
    /// Gemma 4 dense (llama.cpp `gemma4`): Gemma 3's block with global layers of their own
    /// head size, proportional RoPE, shared-KV layers and per-layer embeddings.
    Gemma4,
    /// Qwen3-MoE (llama.cpp `qwen3moe`): Qwen3's attention, mixture-of-experts MLPs.
    Qwen3Moe,
    /// OLMoE (llama.cpp `olmoe`): QK-norm over the whole projection, 64 experts top-8.
    Olmoe,
    /// gpt-oss (llama.cpp `gpt-oss`): attention sinks, biases, alternating sliding layers,
    /// experts with the clamped SwiGLU.
    GptOss,
    /// LFM2 (llama.cpp `lfm2`): a hybrid of gated short-convolution and attention layers.
    Lfm2,
    /// Qwen2-MoE (llama.cpp `qwen2moe`): Qwen2's attention, routed experts and a gated
    /// shared expert.
    Qwen2Moe,
    /// LFM2-MoE (llama.cpp `lfm2moe`): LFM2's hybrid layers with experts routed by a sigmoid
    /// with a selection bias.
    Lfm2Moe,
    /// Granite 4.0-H dense (llama.cpp `granitehybrid`): a hybrid of Mamba-2 and attention
    /// layers, with Granite's embedding, attention, residual and logit multipliers.
    GraniteHybrid,
    /// Qwen3.5 dense (llama.cpp `qwen35`): a hybrid of gated DeltaNet layers and gated
    /// attention layers.
    Qwen35,
    /// Qwen3.5-MoE (llama.cpp `qwen35moe`): Qwen3.5's hybrid layers with a mixture of experts
    /// and a gated shared expert in every MLP.
    Qwen35Moe,
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
        Architecture::Gemma4,
        Architecture::Qwen3Moe,
        Architecture::Olmoe,
        Architecture::GptOss,
        Architecture::Lfm2,
        Architecture::Qwen2Moe,
        Architecture::Lfm2Moe,
        Architecture::GraniteHybrid,
        Architecture::Qwen35,
        Architecture::Qwen35Moe,
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
        /// Round the ramp's ends to whole dimensions (llama.cpp always does; transformers
        /// unless the checkpoint says `truncate: false`, as gpt-oss does).
        truncate: bool,
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
    /// Multiplier on each block's output (the token mixer's and the MLP's) before it is added
    /// to the residual stream (Granite's `residual_multiplier`); `None`: 1.
    pub residual_scale: Option<f32>,
    /// Divisor of the output logits (Granite's `logits_scaling`); `None`: 1.
    pub logit_scale: Option<f32>,
    /// Output projection shares the token embedding matrix.
    pub tie_word_embeddings: bool,
    /// Layers that differ from the others (Gemma 4); the default for uniform families.
    pub variants: LayerVariants,
    /// Mixture-of-experts feed-forward layers, if the model has them.
    pub moe: Option<MoeConfig>,
    /// Recurrent token mixers in some layers (hybrid models), if the model has them.
    pub hybrid: Option<HybridConfig>,
}

/// What mixes tokens in one layer of a hybrid model (issue 40).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixer {
    /// Attention over the paged K/V, as every layer of a transformer.
    Attention,
    /// LFM2's gated short convolution: `in_proj` gives B, C and x per row; the output is
    /// `out_proj(C · conv(B · x))` with a causal depthwise convolution of
    /// [`HybridConfig::conv_kernel`] taps. Its state per sequence: the last `conv_kernel - 1`
    /// rows of `B · x`.
    ShortConv,
    /// Mamba-2 (Granite 4.0-H): `in_proj` gives the gate z, x·B·C and the time steps per row;
    /// x·B·C goes through a causal depthwise convolution of [`HybridConfig::conv_kernel`] taps
    /// (bias, SiLU), the selective scan (SSD) mixes it, and `out_proj` reads the scan's
    /// output gated by z and RMS-normalized per group ([`Mamba2Config`]). Its state per
    /// sequence: the convolution's last `conv_kernel - 1` inputs and one
    /// `[head_dim, state_dim]` matrix per head.
    Mamba2,
    /// Qwen3.5's gated DeltaNet (linear attention): projections give q, k, v (through a
    /// causal depthwise convolution of [`HybridConfig::conv_kernel`] taps and SiLU), an
    /// output gate z and the decay and write gates; the gated delta rule mixes them; a
    /// gated RMSNorm and an out projection follow ([`DeltaNetConfig`]). Its state per
    /// sequence: the convolution's last `conv_kernel - 1` inputs and one `[d_k, d_v]`
    /// matrix per value head.
    GatedDeltaNet,
}

/// The shape of a model's Mamba-2 layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mamba2Config {
    /// Heads `H` (`mamba_n_heads`, GGUF `ssm.time_step_rank`).
    pub n_heads: usize,
    /// Values per head `P` (`mamba_d_head`, GGUF `ssm.inner_size / H`).
    pub head_dim: usize,
    /// State size `N` (`mamba_d_state`, GGUF `ssm.state_size`).
    pub state_dim: usize,
    /// B/C groups `G`, dividing `H` (`mamba_n_groups`, GGUF `ssm.group_count`); the gated
    /// norm normalizes each group's `H · P / G` values on their own.
    pub n_groups: usize,
    /// The time steps are clamped to this range after the softplus (transformers'
    /// `time_step_limit`; `(0, inf)`, no clamp, unless the config says).
    pub dt_limit: (f32, f32),
}

impl Mamba2Config {
    /// `d_inner = H · P`: the width of x, z and the scan's output.
    pub fn inner_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Channels of the convolution: x, B and C of one row.
    pub fn conv_dim(&self) -> usize {
        self.inner_dim() + 2 * self.n_groups * self.state_dim
    }

    /// Width of `in_proj`'s output: z, x·B·C and one time step per head.
    pub fn in_proj_dim(&self) -> usize {
        self.inner_dim() + self.conv_dim() + self.n_heads
    }

    /// f32 values of one sequence's scan state.
    pub fn ssm_floats(&self) -> usize {
        self.n_heads * self.head_dim * self.state_dim
    }
}

/// The head shape of a model's gated DeltaNet layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaNetConfig {
    /// Query/key heads (`linear_num_key_heads`, GGUF `ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`linear_num_value_heads`, GGUF `ssm.time_step_rank`), a multiple of
    /// `n_k_heads`.
    pub n_v_heads: usize,
    /// Values per key head (`linear_key_head_dim`, GGUF `ssm.state_size`).
    pub d_k: usize,
    /// Values per value head (`linear_value_head_dim`, GGUF `ssm.inner_size / n_v_heads`).
    pub d_v: usize,
    /// How the file orders value heads against their key heads: HF folders group them
    /// (value head `h` reads key head `h / (n_v / n_k)`), llama.cpp's converter tiles them
    /// (value head `g` reads key head `g % n_k`) in every tensor with a value-head axis.
    pub tiled_value_heads: bool,
}

impl DeltaNetConfig {
    /// Channels of the convolution: q, k and v of one row.
    pub fn conv_dim(&self) -> usize {
        2 * self.n_k_heads * self.d_k + self.n_v_heads * self.d_v
    }

    /// Width of the value (and output gate) projection.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.d_v
    }

    /// f32 values of one sequence's recurrent matrices.
    pub fn matrix_floats(&self) -> usize {
        self.n_v_heads * self.d_k * self.d_v
    }
}

/// The layers of a hybrid model whose token mixer is recurrent: their per-sequence state
/// lives in a state slot (`pagoda-engine`'s state pool) instead of K/V blocks, and such a
/// layer keeps no K/V.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridConfig {
    /// One entry per layer.
    pub mixers: Vec<Mixer>,
    /// Taps of the causal convolution (LFM2's `conv_L_cache`, Mamba-2's `mamba_d_conv`,
    /// Qwen3.5's `linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// The Mamba-2 layers' shape, when some layer is [`Mixer::Mamba2`].
    pub mamba2: Option<Mamba2Config>,
    /// The gated DeltaNet layers' shape, when some layer is [`Mixer::GatedDeltaNet`].
    pub delta_net: Option<DeltaNetConfig>,
}

/// A mixture-of-experts feed-forward layer: a router picks `n_used` of `n_experts` gated
/// MLPs per token and sums their outputs, weighted.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub n_experts: usize,
    /// Experts each token uses (top-k).
    pub n_used: usize,
    /// Inner width of each expert's MLP.
    pub expert_ffn_dim: usize,
    /// How router logits become weights.
    pub gating: Gating,
    /// Divide the chosen experts' weights by their sum (Qwen3-MoE's `norm_topk_prob`).
    pub normalize_top_k: bool,
    /// Multiplier on the weights (1 unless the model says).
    pub weights_scale: f32,
    /// One entry per layer: is its feed-forward a mixture (else a dense MLP of `ffn_dim`)?
    pub layers: Vec<bool>,
    /// Inner width of the shared expert: a dense gated MLP every token runs beside its routed
    /// experts (Qwen2-MoE, Qwen3.5-MoE, DeepSeek, GLM); `None`: no shared expert. Whether a
    /// sigmoid gate scales it, and whether the router has a selection bias, the file says
    /// (`arch::moe`).
    pub shared_ffn_dim: Option<usize>,
}

/// How a router turns logits into expert weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts, then the top k (Qwen3-MoE, OLMoE, Mixtral).
    Softmax,
    /// Top k of the logits, then a softmax over those k (gpt-oss).
    SoftmaxOfTopK,
    /// Sigmoid of each logit (DeepSeek-V3-style routers).
    Sigmoid,
}

/// What makes some layers of a model differ from the others (Gemma 4); every field's default
/// means "no layer differs".
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LayerVariants {
    /// The full-attention (non-sliding) layers' own head shape (Gemma 4's global layers);
    /// `None`: every layer has `head_dim`, `n_kv_heads` and `rope_dim`.
    pub global: Option<GlobalAttention>,
    /// FFN width per layer where it varies (Gemma 4's double-wide MLP of the KV-shared
    /// layers); empty: `ffn_dim` everywhere.
    pub ffn_dims: Vec<usize>,
    /// The last this many layers compute no K/V: each attends over the K/V of the last
    /// earlier layer of its kind (sliding or full), written earlier in the same pass
    /// (Gemma 4's shared-KV layers; [`ModelConfig::kv_source`]).
    pub kv_shared: usize,
    /// Width of each layer's slice of the per-layer embeddings (Gemma 4 E2B/E4B), if any.
    pub per_layer_input: Option<usize>,
}

/// The head shape of the full-attention layers where it differs from the sliding ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalAttention {
    pub head_dim: usize,
    pub n_kv_heads: usize,
    /// Dimensions of each head RoPE covers.
    pub rope_dim: usize,
    /// Of those, how many rotate with a non-zero frequency (Gemma 4's "proportional" RoPE:
    /// the rest keep frequency 0); `rope_dim` for ordinary RoPE.
    pub rotated_dim: usize,
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
        if let Some(i) =
            (0..self.n_layers).find(|&i| !self.layer_is_moe(i) && self.layer_ffn_dim(i) == 0)
        {
            return bad(format!(
                "layer {i} is a dense MLP but the file gives no feed-forward width (GGUF \
                 feed_forward_length, config.json intermediate_size)"
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
        if let Some(h) = &self.hybrid {
            if h.mixers.len() != self.n_layers {
                return bad(format!(
                    "{} layer mixers for {} layers",
                    h.mixers.len(),
                    self.n_layers
                ));
            }
            if !(2..=64).contains(&h.conv_kernel) {
                return bad(format!(
                    "a causal convolution of {} taps (2 to 64 are supported)",
                    h.conv_kernel
                ));
            }
            if h.mixers.contains(&Mixer::Mamba2) {
                let Some(m) = h.mamba2 else {
                    return bad("Mamba-2 layers without their shape".into());
                };
                if m.n_heads == 0
                    || m.head_dim == 0
                    || m.state_dim == 0
                    || m.n_groups == 0
                    || m.n_heads % m.n_groups != 0
                    || m.dt_limit.0.is_nan()
                    || m.dt_limit.1.is_nan()
                    || m.dt_limit.0 > m.dt_limit.1
                {
                    return bad(format!(
                        "Mamba-2 shape {m:?}: heads must be a non-zero multiple of groups, \
                         sizes non-zero, the time-step limit a range"
                    ));
                }
            }
            if h.mixers.contains(&Mixer::GatedDeltaNet) {
                let Some(d) = h.delta_net else {
                    return bad("gated DeltaNet layers without their head shape".into());
                };
                if d.n_k_heads == 0 || d.d_k == 0 || d.d_v == 0 || d.n_v_heads % d.n_k_heads != 0 {
                    return bad(format!(
                        "gated DeltaNet heads {d:?}: value heads must be a non-zero multiple of \
                         key heads, of non-zero size"
                    ));
                }
            }
        }
        self.validate_variants()
    }

    /// Query heads per KV head.
    pub fn gqa_group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// The global-layer shape that applies to layer `i`, if it differs from the others.
    fn global_of(&self, i: usize) -> Option<&GlobalAttention> {
        self.variants
            .global
            .as_ref()
            .filter(|_| !self.layer_is_sliding.get(i).copied().unwrap_or(false))
    }

    /// Values per head in layer `i`.
    pub fn layer_head_dim(&self, i: usize) -> usize {
        self.global_of(i).map_or(self.head_dim, |g| g.head_dim)
    }

    /// KV heads of layer `i`.
    pub fn layer_n_kv_heads(&self, i: usize) -> usize {
        self.global_of(i).map_or(self.n_kv_heads, |g| g.n_kv_heads)
    }

    /// Dimensions of each head RoPE covers in layer `i`.
    pub fn layer_rope_dim(&self, i: usize) -> usize {
        self.global_of(i).map_or(self.rope_dim, |g| g.rope_dim)
    }

    /// `n_kv_heads * head_dim` of layer `i`: the width of the K (and V) it computes.
    pub fn layer_kv_dim(&self, i: usize) -> usize {
        self.layer_n_kv_heads(i) * self.layer_head_dim(i)
    }

    /// `n_heads * head_dim` of layer `i`.
    pub fn layer_q_dim(&self, i: usize) -> usize {
        self.n_heads * self.layer_head_dim(i)
    }

    /// FFN inner width of layer `i`.
    pub fn layer_ffn_dim(&self, i: usize) -> usize {
        self.variants
            .ffn_dims
            .get(i)
            .copied()
            .unwrap_or(self.ffn_dim)
    }

    /// The first layer that computes no K/V of its own (`n_layers` when every layer does).
    pub fn first_kv_shared(&self) -> usize {
        self.n_layers - self.variants.kv_shared.min(self.n_layers)
    }

    /// The layer whose K/V layer `i` attends over: `i` itself, or for a KV-shared layer the
    /// last earlier layer of its kind that computes K/V (`None` if there is none: refused by
    /// [`ModelConfig::validate`]).
    pub fn kv_source(&self, i: usize) -> Option<usize> {
        let first_shared = self.first_kv_shared();
        if i < first_shared {
            return Some(i);
        }
        let sliding = self.layer_is_sliding.get(i).copied()?;
        (0..first_shared)
            .rev()
            .find(|&j| self.layer_is_sliding[j] == sliding)
    }

    /// Width of the K/V cache layer `i` keeps: its K/V width, 0 for a KV-shared layer or a
    /// recurrent one.
    pub fn layer_kv_cache_dim(&self, i: usize) -> usize {
        if self.layer_mixer(i) != Mixer::Attention {
            0
        } else if self.variants.kv_shared == 0 || i < self.first_kv_shared() {
            self.layer_kv_dim(i)
        } else {
            0
        }
    }

    /// The widest K/V of any layer (at least the common layers', for a part of no layers).
    pub fn max_kv_dim(&self) -> usize {
        (0..self.n_layers)
            .map(|i| self.layer_kv_dim(i))
            .fold(self.n_kv_heads * self.head_dim, usize::max)
    }

    /// The widest query of any layer.
    pub fn max_q_dim(&self) -> usize {
        (0..self.n_layers)
            .map(|i| self.layer_q_dim(i))
            .fold(self.n_heads * self.head_dim, usize::max)
    }

    /// The widest FFN of any layer.
    pub fn max_ffn_dim(&self) -> usize {
        (0..self.n_layers)
            .map(|i| self.layer_ffn_dim(i))
            .fold(self.ffn_dim, usize::max)
    }

    /// Whether every layer has the same shape and its own K/V and a dense MLP (what the
    /// writers, pruning and the distillation student assume).
    pub fn has_uniform_layers(&self) -> bool {
        self.irregular_layers().is_none()
    }

    /// Why this model's layers are not all the same dense block, for refusals: `None` when
    /// they are.
    pub fn irregular_layers(&self) -> Option<&'static str> {
        if self.moe.is_some() {
            Some("its feed-forward layers are mixtures of experts")
        } else if self.hybrid.is_some() {
            Some("some of its layers are recurrent (a hybrid model)")
        } else if self.variants != LayerVariants::default() {
            Some("its layers differ in shape or share K/V and per-layer inputs")
        } else if self.residual_scale.is_some() || self.logit_scale.is_some() {
            Some("it scales its blocks' outputs or its logits (Granite's multipliers)")
        } else {
            None
        }
    }

    /// Layer `i`'s token mixer (attention unless the model is a hybrid that says otherwise).
    pub fn layer_mixer(&self, i: usize) -> Mixer {
        self.hybrid
            .as_ref()
            .and_then(|h| h.mixers.get(i).copied())
            .unwrap_or(Mixer::Attention)
    }

    /// f32 values of one sequence's recurrent state in layer `i` (0 for attention layers).
    pub fn layer_state_floats(&self, i: usize) -> usize {
        match (self.layer_mixer(i), &self.hybrid) {
            (Mixer::ShortConv, Some(h)) => h.conv_kernel.saturating_sub(1) * self.hidden_size,
            (Mixer::Mamba2, Some(h)) => h.mamba2.map_or(0, |m| {
                h.conv_kernel.saturating_sub(1) * m.conv_dim() + m.ssm_floats()
            }),
            (Mixer::GatedDeltaNet, Some(h)) => h.delta_net.map_or(0, |d| {
                h.conv_kernel.saturating_sub(1) * d.conv_dim() + d.matrix_floats()
            }),
            _ => 0,
        }
    }

    /// Whether any layer keeps a recurrent state (the model needs a state slot per sequence).
    pub fn has_recurrent_state(&self) -> bool {
        (0..self.n_layers).any(|i| self.layer_state_floats(i) > 0)
    }

    /// Whether layer `i`'s feed-forward is a mixture of experts.
    pub fn layer_is_moe(&self, i: usize) -> bool {
        self.moe
            .as_ref()
            .is_some_and(|m| m.layers.get(i).copied().unwrap_or(false))
    }

    fn validate_variants(&self) -> Result<(), ModelError> {
        let bad = |msg: String| Err(ModelError::InvalidConfig(msg));
        let v = &self.variants;
        if let Some(g) = &v.global {
            if g.head_dim == 0 || g.n_kv_heads == 0 || self.n_heads % g.n_kv_heads != 0 {
                return bad(format!(
                    "global layers' head shape {g:?} cannot serve {} query heads",
                    self.n_heads
                ));
            }
            if g.rope_dim > g.head_dim
                || g.rope_dim % 2 != 0
                || g.rotated_dim > g.rope_dim
                || g.rotated_dim % 2 != 0
            {
                return bad(format!(
                    "global layers' RoPE dimensions {} (rotated {}) must be even and at most                      head_dim {}",
                    g.rope_dim, g.rotated_dim, g.head_dim
                ));
            }
        }
        if !v.ffn_dims.is_empty() && v.ffn_dims.len() != self.n_layers {
            return bad(format!(
                "{} FFN widths for {} layers",
                v.ffn_dims.len(),
                self.n_layers
            ));
        }
        if v.ffn_dims.contains(&0) {
            return bad("an FFN width of 0".into());
        }
        if v.kv_shared >= self.n_layers && v.kv_shared > 0 {
            return bad(format!(
                "{} KV-shared layers of {}: at least one layer must compute K/V",
                v.kv_shared, self.n_layers
            ));
        }
        for i in self.first_kv_shared()..self.n_layers {
            if self.kv_source(i).is_none() {
                return bad(format!(
                    "KV-shared layer {i} has no earlier {} layer to share K/V with",
                    if self.layer_is_sliding[i] {
                        "sliding-window"
                    } else {
                        "full-attention"
                    }
                ));
            }
            let src = self.kv_source(i).unwrap_or(i);
            if self.layer_kv_dim(src) != self.layer_kv_dim(i) {
                return bad(format!(
                    "KV-shared layer {i} and its source layer {src} differ in K/V width"
                ));
            }
        }
        if v.per_layer_input == Some(0) {
            return bad("per-layer inputs of width 0".into());
        }
        if let Some(m) = &self.moe {
            if m.n_experts == 0 || m.n_used == 0 || m.n_used > m.n_experts {
                return bad(format!("{} of {} experts per token", m.n_used, m.n_experts));
            }
            if m.expert_ffn_dim == 0 || m.layers.len() != self.n_layers {
                return bad(format!(
                    "experts of width {} and {} expert-layer flags for {} layers",
                    m.expert_ffn_dim,
                    m.layers.len(),
                    self.n_layers
                ));
            }
            if !(m.weights_scale.is_finite() && m.weights_scale > 0.0) {
                return bad(format!("expert weights scale {}", m.weights_scale));
            }
        }
        Ok(())
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
