//! Perplexity of a model over a text, by strided sliding windows ([`super::windows`]).
//!
//! The whole text is tokenized once, as the model's tokenizer does it for a plain prompt (BOS
//! when the model asks for one, as llama.cpp and transformers add it; no chat template). Each
//! window is an independent forward pass from position 0 over a cleared KV cache; the tokens it
//! has to score get logits ([`Logits::All`]) and the context before them runs as a prefill
//! that asks for none but its last row, so the output head runs once per scored token.
//!
//! Invariants: every token after the first is scored exactly once; the negative
//! log-likelihood is summed in f64; `perplexity == exp(mean_nll)`; a window never exceeds the
//! model's context length (an explicit `ctx` above it is an error, the default is clamped).

use std::time::Instant;

use pagoda_model::tokenizer::Tokenizer;
use pagoda_model::{KvDtype, Logits, Model};
use serde::Serialize;

use super::logprob::log_prob;
use super::windows::{check_window, plan_windows, Window};
use crate::CompressError;

/// Window length when none is asked for (clamped to the model's context).
pub const DEFAULT_CTX: usize = 512;

/// How to slide the windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerplexityOptions {
    /// Tokens per window; `None`: [`DEFAULT_CTX`], or the model's context if shorter.
    pub ctx: Option<usize>,
    /// Tokens between window starts; `None`: `ctx / 2`.
    pub stride: Option<usize>,
    /// How the KV cache stores keys and values (f16 is what the engine serves with).
    pub kv_dtype: KvDtype,
}

impl Default for PerplexityOptions {
    fn default() -> Self {
        PerplexityOptions {
            ctx: None,
            stride: None,
            kv_dtype: KvDtype::F16,
        }
    }
}

impl PerplexityOptions {
    /// The `(ctx, stride)` these options give for a model of `context_length` positions.
    ///
    /// Errors: an explicit `ctx` above `context_length`, `ctx < 2`, a stride of 0 or not
    /// below `ctx`.
    pub fn resolve(&self, context_length: usize) -> Result<(usize, usize), CompressError> {
        let ctx = match self.ctx {
            Some(ctx) if ctx > context_length => {
                return Err(CompressError::WindowTooLong {
                    ctx,
                    context_length,
                })
            }
            Some(ctx) => ctx,
            None => DEFAULT_CTX.min(context_length),
        };
        let stride = self.stride.unwrap_or((ctx / 2).max(1));
        check_window(ctx, stride)?;
        Ok((ctx, stride))
    }
}

/// What a perplexity run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerplexityReport {
    /// `exp(mean_nll)`.
    pub perplexity: f64,
    /// Mean negative log-likelihood per scored token, in nats.
    pub mean_nll: f64,
    /// Sum of the scored tokens' negative log-likelihoods, in nats.
    pub nll_sum: f64,
    /// Tokens in the text (including a BOS the tokenizer added).
    pub tokens: usize,
    /// Tokens scored: `tokens - 1`.
    pub tokens_scored: usize,
    /// Tokens run through the model, over all windows (overlaps count again).
    pub tokens_processed: usize,
    pub windows: usize,
    pub ctx: usize,
    pub stride: usize,
    /// Wall time of the forward passes and scoring (not tokenization).
    pub seconds: f64,
    /// `tokens_processed / seconds`: the forward-pass throughput.
    pub tokens_per_second: f64,
}

/// The token ids of `text` as perplexity scores them: the tokenizer's own special-token
/// handling (BOS when the model wants it), no chat template.
///
/// Errors: a text of fewer than 2 tokens (an empty file), a tokenizer failure.
pub fn tokenize_text(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, CompressError> {
    let tokens = tokenizer.encode(text, true)?;
    let content = tokens
        .iter()
        .filter(|&&t| Some(t) != tokenizer.bos_id())
        .count();
    if tokens.len() < 2 || content == 0 {
        return Err(CompressError::TextTooShort {
            tokens: tokens.len(),
        });
    }
    Ok(tokens)
}

/// Perplexity of `model` over `tokens`. `progress(done, total)` is called after each window.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    options: &PerplexityOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PerplexityReport, CompressError> {
    let cfg = model.config();
    let (ctx, stride) = options.resolve(cfg.context_length)?;
    let windows = plan_windows(tokens.len(), ctx, stride)?;
    let mut cache = model.try_new_cache(ctx, options.kv_dtype)?;
    let started = Instant::now();
    let (mut nll_sum, mut scored, mut processed) = (0.0f64, 0usize, 0usize);
    for (i, w) in windows.iter().enumerate() {
        cache.truncate(0);
        nll_sum += window_nll(model, tokens, w, &mut cache)?;
        scored += w.scored();
        processed += w.inputs();
        progress(i + 1, windows.len());
    }
    let seconds = started.elapsed().as_secs_f64();
    debug_assert_eq!(scored, tokens.len() - 1);
    let mean_nll = nll_sum / scored as f64;
    tracing::debug!(windows = windows.len(), scored, seconds, "perplexity done");
    Ok(PerplexityReport {
        perplexity: mean_nll.exp(),
        mean_nll,
        nll_sum,
        tokens: tokens.len(),
        tokens_scored: scored,
        tokens_processed: processed,
        windows: windows.len(),
        ctx,
        stride,
        seconds,
        tokens_per_second: processed as f64 / seconds.max(1e-9),
    })
}

/// Tokenizes `text` ([`tokenize_text`]) and measures its [`perplexity`].
pub fn perplexity_of_text(
    model: &Model,
    tokenizer: &Tokenizer,
    text: &str,
    options: &PerplexityOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PerplexityReport, CompressError> {
    let tokens = tokenize_text(tokenizer, text)?;
    perplexity(model, &tokens, options, progress)
}

/// Negative log-likelihood of tokens `w.first_scored..w.end`, running `w.begin..w.end - 1`
/// from position 0 of an empty cache.
fn window_nll(
    model: &Model,
    tokens: &[u32],
    w: &Window,
    cache: &mut pagoda_model::KvCache,
) -> Result<f64, CompressError> {
    let vocab = model.config().vocab_size;
    // Inputs whose logits nothing needs: the context before the first scored token's
    // predecessor.
    let context = &tokens[w.begin..w.first_scored - 1];
    if !context.is_empty() {
        model.forward(context, 0, cache, Logits::Last)?;
    }
    let scoring = &tokens[w.first_scored - 1..w.end - 1];
    let logits = model.forward(scoring, context.len(), cache, Logits::All)?; // [scored, vocab]
    let mut nll = 0.0;
    for (j, (row, &target)) in logits
        .chunks_exact(vocab)
        .zip(&tokens[w.first_scored..w.end])
        .enumerate()
    {
        nll -= log_prob(row, target, w.first_scored + j)?;
    }
    Ok(nll)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_ctx_is_clamped_to_the_model_and_stride_is_half() {
        let o = PerplexityOptions::default();
        assert_eq!(o.resolve(4096).unwrap(), (512, 256));
        assert_eq!(o.resolve(256).unwrap(), (256, 128));
        let o = PerplexityOptions {
            ctx: Some(100),
            stride: Some(10),
            ..Default::default()
        };
        assert_eq!(o.resolve(256).unwrap(), (100, 10));
    }

    #[test]
    fn an_explicit_ctx_over_the_model_context_is_an_error() {
        let o = PerplexityOptions {
            ctx: Some(1024),
            ..Default::default()
        };
        let e = o.resolve(512).unwrap_err();
        assert!(matches!(
            e,
            CompressError::WindowTooLong {
                ctx: 1024,
                context_length: 512
            }
        ));
        assert!(e.to_string().contains("--ctx"), "{e}");
    }

    #[test]
    fn bad_strides_are_errors() {
        for stride in [0, 64, 65] {
            let o = PerplexityOptions {
                ctx: Some(64),
                stride: Some(stride),
                ..Default::default()
            };
            assert!(matches!(
                o.resolve(256),
                Err(CompressError::InvalidInput(_))
            ));
        }
    }
}
