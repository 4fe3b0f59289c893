//! The shape of a family spec: [`Family`] and the [`Block`] it describes, read by the rest of
//! the crate through [`super`]'s registry. Each family's file fills one in.

use super::keys::{GgufKeys, HfKeys};
use crate::config::{Architecture, ModelConfig};
use crate::weights::Weights;
use crate::ModelError;
use pagoda_kernels::ops::RopeStyle;

/// The gate's activation of a gated MLP (and of Qwen3.5's attention output gate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen, SmolLM).
    Silu,
    /// GeGLU with the tanh approximation (Gemma).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU (`pagoda_kernels::ops::swiglu_oai_mul`).
    SwigluOai,
    /// `sigmoid(gate) · x` (`pagoda_kernels::ops::sigmoid_mul`): Qwen3.5's gate on the
    /// attention output.
    Sigmoid,
}

/// Whether and over what queries and keys are RMS-normalized before RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Each head on its own (Qwen3, Gemma 3/4): weights of `head_dim`.
    PerHead,
    /// The whole projection of a row, all heads at once (OLMoE): weights of
    /// `n_heads * head_dim` (queries) and `n_kv_heads * head_dim` (keys).
    Whole,
}

/// Where a decoder layer normalizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// RMSNorm before attention and before the MLP (Llama): tensors `attn_norm`, `ffn_norm`.
    Pre,
    /// Also after each, before the residual add (Gemma 2/3): `post_attention_norm`,
    /// `post_ffw_norm` besides the two pre-norms.
    Sandwich,
}

/// What a decoder layer of a family is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub norms: NormPlacement,
    pub activation: Activation,
    /// RMSNorm of queries and keys before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: QkNorm,
    /// Q, K and V projections carry biases.
    pub qkv_bias: bool,
    /// Values are RMS-normalized per head, without a weight, before they are stored (Gemma 4).
    pub v_norm: bool,
    /// A layer without a V projection uses its K projection's output as V (Gemma 4's
    /// `attention_k_eq_v` global layers), normalized as V.
    pub v_defaults_to_k: bool,
}

/// Defaults for keys a `config.json` may omit: the transformers config class's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HfDefaults {
    pub rope_theta: f32,
    pub context_length: usize,
    pub rms_eps: f32,
    pub tie_word_embeddings: bool,
    /// `head_dim` when absent (`None`: `hidden_size / num_attention_heads`).
    pub head_dim: Option<usize>,
}

/// A family's hook that splits fused projections ([`Family::split_fused`]).
pub type SplitFused = fn(&ModelConfig, &mut Weights) -> Result<(), ModelError>;

/// One model family: see the module doc.
#[derive(Debug)]
pub struct Family {
    pub arch: Architecture,
    /// For people: "Qwen3", "Gemma 3".
    pub display: &'static str,
    /// GGUF `general.architecture` names read; the first is written.
    pub gguf_names: &'static [&'static str],
    /// HF `architectures` class names read (a prefix match: multimodal wrappers such as
    /// `Gemma3ForConditionalGeneration` count); the first is written.
    pub hf_classes: &'static [&'static str],
    /// HF `model_type` values read (top level or `text_config`); the first is written.
    pub hf_model_types: &'static [&'static str],
    pub block: Block,
    /// Pair order RoPE rotates in this family's GGUF files. llama.cpp's converter permutes
    /// the Q/K rows of "normal"-RoPE families into interleaved pairs; HF folders are always
    /// NeoX halves.
    pub gguf_rope_style: RopeStyle,
    /// Added to every RMSNorm weight of an HF folder (Gemma stores `w` and uses `1 + w`;
    /// its GGUF files already hold `1 + w`).
    pub hf_norm_offset: f32,
    /// llama.cpp reads Llama 3 RoPE scaling from this family's GGUF files as the
    /// `rope_freqs.weight` tensor (and so does Pagoda; other families ignore the tensor).
    pub gguf_rope_freqs: bool,
    /// RMSNorm epsilon of a GGUF file that does not say.
    pub gguf_rms_eps: f32,
    pub hf_defaults: HfDefaults,
    /// The GGUF per-layer keys `attention.head_count_kv` and `feed_forward_length` may vary
    /// by layer: the shared reader takes layer 0's value and the family's hook reads the
    /// arrays (Gemma 4). Otherwise a varying array is refused.
    pub gguf_varying_layers: bool,
    /// Reads what only this family has from GGUF metadata, after the shared keys.
    pub gguf_extra: fn(&GgufKeys<'_>, &mut ModelConfig) -> Result<(), ModelError>,
    /// Reads what only this family has from `config.json`, after the shared keys.
    pub hf_extra: fn(&HfKeys<'_>, &mut ModelConfig) -> Result<(), ModelError>,
    /// For families whose files fuse projections (Phi-3's `attn_qkv`, and `ffn_up` holding
    /// gate and up): splits them into the canonical `attn_q`/`attn_k`/`attn_v` and
    /// `ffn_gate`/`ffn_up` views of the same bytes, when a model is opened. Writers refuse
    /// such families (they would have to fuse again for llama.cpp).
    pub split_fused: Option<SplitFused>,
}

impl Family {
    /// The GGUF `general.architecture` a writer writes.
    pub fn gguf_name(&self) -> &'static str {
        self.gguf_names[0]
    }

    /// The HF class name (`architectures[0]`) a writer writes.
    pub fn hf_class(&self) -> &'static str {
        self.hf_classes[0]
    }

    /// The HF `model_type` a writer writes.
    pub fn hf_model_type(&self) -> &'static str {
        self.hf_model_types[0]
    }
}

/// No hook: the family has nothing beyond the shared keys.
pub(super) fn nothing_gguf(_: &GgufKeys<'_>, _: &mut ModelConfig) -> Result<(), ModelError> {
    Ok(())
}
