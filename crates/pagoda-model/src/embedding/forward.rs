//! The BERT encoder forward pass over a batch of sequences: embeddings (word + position +
//! token type 0, LayerNorm), then per layer bidirectional multi-head self-attention, output
//! dense + residual + LayerNorm, and the GELU feed-forward + residual + LayerNorm.
//!
//! All sequences' rows are concatenated into one `[total, hidden]` batch, so each linear layer
//! runs once per layer over every row (pagoda-kernels' `matmul`, weights read in place);
//! attention alone looks at sequence boundaries: a row attends to every row of its own sequence
//! and to nothing else, which is what BERT's attention mask does for padded batches.
//!
//! Invariants: the caller ([`EmbeddingModel`](super::EmbeddingModel)) validated the input:
//! every sequence is non-empty, at most `max_seq_len` long and every id is below the
//! vocabulary size. A row's result depends only on its own sequence (every kernel computes a
//! row the same way whatever the other rows), so a text embedded in a batch gives the same
//! vector as embedded alone.

use super::config::BertConfig;
use super::ops::{gelu_erf_inplace, layer_norm_inplace};
use super::weights::{BertWeights, LayerNormWeights};
use crate::ModelError;
use pagoda_kernels::ops::{add_inplace, axpy, dot_f32, softmax_inplace};
use rayon::prelude::*;

/// The encoder's last hidden states, `[total, hidden]`, for `seqs` (rows in sequence order).
pub fn encode(c: &BertConfig, w: &BertWeights, seqs: &[&[u32]]) -> Result<Vec<f32>, ModelError> {
    let h = c.hidden_size;
    debug_assert!(seqs.iter().all(|s| !s.is_empty()
        && s.len() <= c.max_seq_len
        && s.iter().all(|&t| (t as usize) < c.vocab_size)));
    // (first row, length) of the sequence of every row.
    let mut spans = Vec::new();
    for s in seqs {
        let span = (spans.len(), s.len());
        spans.extend(std::iter::repeat_n(span, s.len()));
    }
    let total = spans.len();
    let mut x = vec![0f32; total * h]; // [total, hidden]
    let rows = seqs
        .iter()
        .flat_map(|s| s.iter().enumerate())
        .zip(x.chunks_exact_mut(h));
    for ((pos, &id), row) in rows {
        w.word_embeddings.row(id as usize, row)?;
        add_inplace(row, &w.position_embeddings[pos * h..(pos + 1) * h]);
        add_inplace(row, &w.token_type_0);
    }
    norm(&mut x, &w.embed_norm, c.layer_norm_eps);

    // [total, hidden] each, heads side by side (head i at columns i*d..(i+1)*d).
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    // ctx, a: [total, hidden]; f: [total, intermediate].
    let (mut ctx, mut a, mut f) = (vec![0f32; total * h], Vec::new(), Vec::new());
    for layer in &w.layers {
        layer.query.forward(&x, total, &mut q)?;
        layer.key.forward(&x, total, &mut k)?;
        layer.value.forward(&x, total, &mut v)?;
        attention(c, &spans, &q, &k, &v, &mut ctx);
        layer.attn_out.forward(&ctx, total, &mut a)?;
        add_inplace(&mut a, &x);
        norm(&mut a, &layer.attn_norm, c.layer_norm_eps);
        layer.intermediate.forward(&a, total, &mut f)?;
        gelu_erf_inplace(&mut f);
        layer.output.forward(&f, total, &mut x)?;
        add_inplace(&mut x, &a);
        norm(&mut x, &layer.out_norm, c.layer_norm_eps);
    }
    Ok(x)
}

fn norm(x: &mut [f32], n: &LayerNormWeights, eps: f32) {
    layer_norm_inplace(x, &n.weight, &n.bias, eps);
}

/// `ctx[r] = softmax(q[r] · Kᵀ / √d) V` per head, over the rows of `r`'s own sequence.
fn attention(
    c: &BertConfig,
    spans: &[(usize, usize)],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    ctx: &mut [f32],
) {
    let (h, d) = (c.hidden_size, c.head_dim());
    let scale = 1.0 / (d as f32).sqrt();
    ctx.par_chunks_mut(h)
        .enumerate()
        .with_min_len(8)
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (r, out)| {
            let (start, len) = spans[r];
            out.fill(0.0);
            for head in 0..c.num_attention_heads {
                let cols = head * d..(head + 1) * d;
                let qr = &q[r * h..][cols.clone()];
                scores.clear();
                scores.extend(
                    (start..start + len).map(|j| dot_f32(qr, &k[j * h..][cols.clone()]) * scale),
                );
                softmax_inplace(scores);
                let o = &mut out[cols.clone()];
                for (j, &p) in (start..start + len).zip(scores.iter()) {
                    axpy(o, p, &v[j * h..][cols.clone()]);
                }
            }
        });
}
