//! Per-layer embeddings (Gemma 4 E2B/E4B, "PLE"): besides the token embedding, each token
//! has a small vector per layer, which each layer gates into its residual stream.
//!
//! Before the first layer ([`PerLayerInputs::compute`], for all layers at once,
//! `[rows, n_layers * width]`):
//! `p = (rms_norm_w(proj(x0) / sqrt(hidden)) + table[token] * sqrt(width)) / sqrt(2)`, where
//! `x0` is the scaled token embedding and the norm runs over each layer's `width` slice.
//! After layer `i`'s MLP ([`PerLayerGate::forward`]):
//! `x += post_norm(proj_i(gelu(gate_i(x)) * p[:, i]))`.
//! As transformers' `Gemma4TextModel` (`get_per_layer_inputs`, `project_per_layer_inputs`)
//! and llama.cpp's `gemma4` graph compute it.
//!
//! Tensors: `per_layer_token_embd` `[vocab, n_layers * width]`, `per_layer_model_proj`
//! `[n_layers * width, hidden]`, `per_layer_proj_norm` `[width]`; per layer `inp_gate`
//! `[width, hidden]`, `proj` `[hidden, width]`, `post_norm` `[hidden]`.

use super::backend::{Activation, Activations, Backend};
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};

/// The model-level half: the table, the projection of the embedding and its norm.
#[derive(Debug)]
pub struct PerLayerInputs<B: Backend> {
    table: B::Linear,
    model_proj: B::Linear,
    proj_norm: B::Norm,
    /// Values per layer.
    width: usize,
}

impl<B: Backend> PerLayerInputs<B> {
    /// Loads the model-level tensors when the config has per-layer inputs.
    pub fn load(
        backend: &B,
        weights: &Weights,
        cfg: &ModelConfig,
    ) -> Result<Option<Self>, ModelError> {
        let Some(width) = cfg.variants.per_layer_input else {
            return Ok(None);
        };
        let all = width * cfg.n_layers;
        Ok(Some(PerLayerInputs {
            table: backend.load_rows(
                weights,
                "per_layer_token_embd.weight",
                cfg.vocab_size,
                all,
            )?,
            model_proj: backend.load_linear(
                weights,
                "per_layer_model_proj.weight",
                None,
                all,
                cfg.hidden_size,
            )?,
            proj_norm: backend.load_norm(weights, "per_layer_proj_norm.weight", width, cfg)?,
            width,
        }))
    }

    /// Every layer's input for `tokens`, from their scaled embeddings `a.x`, into
    /// `a.per_layer` (`[rows, n_layers * width]`).
    pub fn compute(
        &self,
        backend: &B,
        cfg: &ModelConfig,
        tokens: &[u32],
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        let projected = &mut a.per_layer_one;
        backend.linears([&self.model_proj], &a.x, [&mut *projected], pass)?;
        backend.scale(projected, 1.0 / (cfg.hidden_size as f32).sqrt())?;
        backend.rms_norm_heads(&self.proj_norm, projected)?;
        backend.embed(
            &self.table,
            tokens,
            Some((self.width as f32).sqrt()),
            &mut a.per_layer,
        )?;
        backend.add(&mut a.per_layer, projected)?;
        backend.scale(&mut a.per_layer, std::f32::consts::FRAC_1_SQRT_2)
    }

    /// The projection (the table is only looked up by row).
    pub fn linears(&self) -> [&B::Linear; 1] {
        [&self.model_proj]
    }
}

/// One layer's half: its gate, projection and norm.
#[derive(Debug)]
pub struct PerLayerGate<B: Backend> {
    gate: B::Linear,
    proj: B::Linear,
    post_norm: B::Norm,
}

impl<B: Backend> PerLayerGate<B> {
    /// Layer `layer`'s tensors when the config has per-layer inputs.
    pub fn load(
        backend: &B,
        weights: &Weights,
        cfg: &ModelConfig,
        layer: usize,
    ) -> Result<Option<Self>, ModelError> {
        let Some(width) = cfg.variants.per_layer_input else {
            return Ok(None);
        };
        let d = cfg.hidden_size;
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        Ok(Some(PerLayerGate {
            gate: backend.load_linear(weights, &name("inp_gate"), None, width, d)?,
            proj: backend.load_linear(weights, &name("proj"), None, d, width)?,
            post_norm: backend.load_norm(weights, &name("post_norm"), d, cfg)?,
        }))
    }

    /// `a.x += post_norm(proj(gelu(gate(a.x)) * a.per_layer[:, layer]))`.
    pub fn forward(
        &self,
        backend: &B,
        cfg: &ModelConfig,
        layer: usize,
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        let width = B::linear_shape(&self.gate).0;
        backend.linears([&self.gate], &a.x, [&mut a.per_layer_gate], pass)?;
        backend.columns(
            &a.per_layer,
            width * cfg.n_layers,
            layer * width..(layer + 1) * width,
            &mut a.per_layer_one,
        )?;
        backend.gated(
            Activation::GeluTanh,
            &mut a.per_layer_gate,
            &a.per_layer_one,
        )?;
        backend.linears([&self.proj], &a.per_layer_gate, [&mut a.branch], pass)?;
        backend.rms_norm(&self.post_norm, &a.branch, &mut a.post)?;
        backend.add(&mut a.x, &a.post)
    }

    /// The two linears.
    pub fn linears(&self) -> [&B::Linear; 2] {
        [&self.gate, &self.proj]
    }
}
