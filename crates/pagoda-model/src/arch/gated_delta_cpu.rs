//! The host half of Qwen3.5's gated DeltaNet ([`super::gated_delta_net`]): a layer's small
//! parameters ([`DeltaNetParams`]) and the CPU kernel of the backends' `gated_delta_net`
//! (`run_cpu`) over pagoda-kernels' `recurrent::conv1d_causal_prefill`,
//! `recurrent::gated_delta_gates` and `recurrent::gated_delta_prefill`, then the gated output
//! norm (its weight used as stored, not `1 + w`).
//!
//! Head order: the kernels read value heads grouped (value head `h` reads key head
//! `h / (n_v / n_k)`); a file that tiles them ([`DeltaNetConfig::tiled_value_heads`], GGUF)
//! has v, a and b gathered into grouped order and the output scattered back, so every
//! projection is read in its file's order; `A_log` and `dt_bias` are kept grouped.
//!
//! The state of one sequence ([`crate::recurrent_state`]) is the convolution's last
//! `taps - 1` inputs (`[taps - 1, conv_dim]`) followed by the rule's matrices
//! (`[n_v_heads, d_k, d_v]`, grouped order).
//!
//! Invariant: a sequence's rows run in position order from the state its earlier rows left
//! (a segment at position 0 starts from zeros).

use crate::config::DeltaNetConfig;
use crate::ModelError;
use pagoda_kernels::paged_attention::SeqAttention;
use pagoda_kernels::recurrent::{
    conv1d_causal_prefill, gated_delta_gates, gated_delta_prefill, ConvActivation, ConvWeights,
    GatedDeltaInputs, GatedDeltaShape,
};

/// A layer's small host-side parameters: what the CPU kernel reads besides the projections.
#[derive(Debug, Clone)]
pub struct DeltaNetParams {
    shape: DeltaNetConfig,
    taps: usize,
    /// `[conv_dim, taps]`, oldest tap first.
    conv: Vec<f32>,
    /// `A_log` per value head, grouped order.
    a_log: Vec<f32>,
    /// `dt_bias` per value head, grouped order.
    dt_bias: Vec<f32>,
    /// The gated output norm's weight, `[d_v]`.
    norm: Vec<f32>,
    eps: f32,
}

/// A layer's per-value-head parameters in its file's head order.
#[derive(Debug, Clone, Copy)]
pub struct FileOrder<'a> {
    pub a_log: &'a [f32],
    pub dt_bias: &'a [f32],
}

impl DeltaNetParams {
    /// A layer's parameters: `conv` `[conv_dim, taps]`, `heads` in the file's head order
    /// (kept grouped), the output norm's weight `[d_v]` and its epsilon.
    pub fn new(
        shape: DeltaNetConfig,
        taps: usize,
        conv: Vec<f32>,
        heads: FileOrder<'_>,
        norm: Vec<f32>,
        eps: f32,
    ) -> Self {
        let grouped = |file: &[f32]| -> Vec<f32> {
            (0..shape.n_v_heads)
                .map(|h| file.get(file_head(&shape, h)).copied().unwrap_or(0.0))
                .collect()
        };
        DeltaNetParams {
            shape,
            taps,
            a_log: grouped(heads.a_log),
            dt_bias: grouped(heads.dt_bias),
            conv,
            norm,
            eps,
        }
    }
}

/// The file's value head of grouped head `h` (`r` value heads per key head, `n_k` key
/// heads): grouped head `i_k · r + i_r` is tiled head `i_r · n_k + i_k`.
pub(crate) fn file_head(d: &DeltaNetConfig, h: usize) -> usize {
    if !d.tiled_value_heads {
        return h;
    }
    let r = d.n_v_heads / d.n_k_heads;
    (h % r) * d.n_k_heads + h / r
}

/// The CPU kernel of `Backend::gated_delta_net` (see there) over the sequences `seqs`:
/// `inputs` are the rows' `in_proj_qkv`, `in_proj_z`, `in_proj_b` and `in_proj_a` outputs.
pub(crate) fn run_cpu(
    p: &DeltaNetParams,
    (floats, slots, batch): (usize, &mut [f32], &[u32]),
    [qkv, z, b, a]: [&[f32]; 4],
    seqs: &[SeqAttention<'_>],
    out: &mut Vec<f32>,
) -> Result<(), ModelError> {
    let d = &p.shape;
    let (conv_dim, value_dim, heads) = (d.conv_dim(), d.value_dim(), d.n_v_heads);
    let key_dim = d.n_k_heads * d.d_k;
    let conv_floats = p.taps.saturating_sub(1) * conv_dim;
    let bad = |m: String| Err(ModelError::InvalidBatch(format!("gated DeltaNet: {m}")));
    if floats != conv_floats + d.matrix_floats() {
        return bad(format!(
            "{floats} state values per slot for a {conv_floats}-value convolution window and \
             {} matrix values",
            d.matrix_floats()
        ));
    }
    let rows = qkv.len() / conv_dim.max(1);
    if qkv.len() != rows * conv_dim
        || z.len() != rows * value_dim
        || b.len() != rows * heads
        || a.len() != rows * heads
        || batch.len() != seqs.len()
    {
        return bad(format!(
            "inputs of {}, {}, {}, {} values for {rows} rows; {} slots for {} sequences",
            qkv.len(),
            z.len(),
            b.len(),
            a.len(),
            batch.len(),
            seqs.len()
        ));
    }
    out.clear();
    out.resize(rows * value_dim, 0.0);
    let conv = ConvWeights {
        weight: &p.conv,
        bias: None,
        channels: conv_dim,
        width: p.taps,
    };
    let kernel_shape = GatedDeltaShape {
        n_k_heads: d.n_k_heads,
        n_v_heads: heads,
        d_k: d.d_k,
        d_v: d.d_v,
        qk_l2norm: true,
    };
    let file_heads: Vec<usize> = (0..heads).map(|h| file_head(d, h)).collect();
    let (mut mixed, mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut ga, mut gb, mut g, mut beta, mut o) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (seq, &slot) in seqs.iter().zip(batch) {
        let at = slot as usize * floats;
        let Some(state) = slots.get_mut(at..at + floats) else {
            return bad(format!("slot {slot} is outside the state"));
        };
        let r = seq.rows.clone();
        if r.end > rows {
            return bad(format!("rows {r:?} of {rows}"));
        }
        let n = r.len();
        if n == 0 {
            continue;
        }
        if seq.start == 0 {
            state.fill(0.0);
        }
        let (conv_state, matrices) = state.split_at_mut(conv_floats);
        mixed.clear();
        mixed.resize(n * conv_dim, 0.0);
        conv1d_causal_prefill(
            &conv,
            ConvActivation::Silu,
            n,
            &qkv[r.start * conv_dim..r.end * conv_dim],
            conv_state,
            &mut mixed,
        )?;
        // q, k and v apart; v, a and b in grouped head order.
        let (rows_a, rows_b) = (
            &a[r.start * heads..r.end * heads],
            &b[r.start * heads..r.end * heads],
        );
        q.clear();
        k.clear();
        v.clear();
        ga.clear();
        gb.clear();
        for (t, row) in mixed.chunks_exact(conv_dim).enumerate() {
            q.extend_from_slice(&row[..key_dim]);
            k.extend_from_slice(&row[key_dim..2 * key_dim]);
            let values = &row[2 * key_dim..];
            for &f in &file_heads {
                v.extend_from_slice(&values[f * d.d_v..(f + 1) * d.d_v]);
                ga.push(rows_a[t * heads + f]);
                gb.push(rows_b[t * heads + f]);
            }
        }
        g.clear();
        g.resize(n * heads, 0.0);
        beta.clear();
        beta.resize(n * heads, 0.0);
        gated_delta_gates(&ga, &gb, &p.a_log, &p.dt_bias, &mut g, &mut beta)?;
        o.clear();
        o.resize(n * value_dim, 0.0);
        let inputs = GatedDeltaInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        gated_delta_prefill(&kernel_shape, n, &inputs, matrices, &mut o)?;
        // rmsnorm(o) · w · silu(z) per head, back in the file's head order.
        for (t, o_row) in o.chunks_exact(value_dim).enumerate() {
            let row = r.start + t;
            for (h, &f) in file_heads.iter().enumerate() {
                let x = &o_row[h * d.d_v..(h + 1) * d.d_v];
                let zs = &z[row * value_dim + f * d.d_v..row * value_dim + (f + 1) * d.d_v];
                let dst = &mut out[row * value_dim + f * d.d_v..row * value_dim + (f + 1) * d.d_v];
                let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / d.d_v as f32;
                let inv = 1.0 / (mean_sq + p.eps).sqrt();
                for (((dst, &x), &w), &zv) in dst.iter_mut().zip(x).zip(&p.norm).zip(zs) {
                    *dst = x * inv * w * (zv / (1.0 + (-zv).exp()));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(rows: std::ops::Range<usize>, start: usize) -> SeqAttention<'static> {
        SeqAttention {
            rows,
            start,
            block_table: &[],
        }
    }

    /// Deterministic values in about [-1, 1).
    fn wave(n: usize, salt: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 37 + salt * 11) % 23) as f32 - 11.0) / 11.0)
            .collect()
    }

    fn params(shape: DeltaNetConfig) -> DeltaNetParams {
        let taps = 3;
        DeltaNetParams {
            shape,
            taps,
            conv: wave(shape.conv_dim() * taps, 1),
            a_log: wave(shape.n_v_heads, 2),
            dt_bias: wave(shape.n_v_heads, 3),
            norm: wave(shape.d_v, 4).iter().map(|w| 1.0 + w / 2.0).collect(),
            eps: 1e-6,
        }
    }

    /// Runs `n` rows of inputs through one slot in pieces of `piece` rows.
    fn run(p: &DeltaNetParams, inputs: [&[f32]; 4], n: usize, piece: usize) -> Vec<f32> {
        let floats = p.taps.saturating_sub(1) * p.shape.conv_dim() + p.shape.matrix_floats();
        let widths = [
            p.shape.conv_dim(),
            p.shape.value_dim(),
            p.shape.n_v_heads,
            p.shape.n_v_heads,
        ];
        let mut state = vec![5.0f32; floats]; // garbage: position 0 clears it
        let mut all = Vec::new();
        for start in (0..n).step_by(piece) {
            let end = (start + piece).min(n);
            let part = |i: usize| &inputs[i][start * widths[i]..end * widths[i]];
            let mut out = Vec::new();
            run_cpu(
                p,
                (floats, &mut state, &[0]),
                [part(0), part(1), part(2), part(3)],
                &[seq(0..end - start, start)],
                &mut out,
            )
            .unwrap();
            all.extend(out);
        }
        all
    }

    #[test]
    fn pieces_tokens_and_tiled_heads_give_the_whole_prompt_s_outputs() {
        let grouped = DeltaNetConfig {
            n_k_heads: 2,
            n_v_heads: 4,
            d_k: 4,
            d_v: 3,
            tiled_value_heads: false,
        };
        let n = 40;
        let qkv = wave(n * grouped.conv_dim(), 5);
        let z = wave(n * grouped.value_dim(), 6);
        let (b, a) = (wave(n * 4, 7), wave(n * 4, 8));
        let p = params(grouped);
        let whole = run(&p, [&qkv, &z, &b, &a], n, n);
        for piece in [1, 7] {
            let got = run(&p, [&qkv, &z, &b, &a], n, piece);
            let worst = whole
                .iter()
                .zip(&got)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(worst < 1e-5, "pieces of {piece}: {worst}");
        }
        // The same layer with its value heads tiled, as GGUF files store them: every
        // per-head input and parameter moved to its tiled place gives the outputs moved so.
        let tiled = DeltaNetConfig {
            tiled_value_heads: true,
            ..grouped
        };
        let to_tiled = |x: &[f32], width: usize, lead: usize| -> Vec<f32> {
            let mut y = x.to_vec();
            for row in 0..x.len() / (lead + 4 * width) {
                let base = row * (lead + 4 * width) + lead;
                for h in 0..4 {
                    let f = file_head(&tiled, h);
                    y[base + f * width..base + (f + 1) * width]
                        .copy_from_slice(&x[base + h * width..base + (h + 1) * width]);
                }
            }
            y
        };
        let key_dim = 2 * grouped.n_k_heads * grouped.d_k;
        let mut pt = params(tiled);
        pt.conv = to_tiled(&p.conv, 3 * 3, key_dim * 3);
        let got = run(
            &pt,
            [
                &to_tiled(&qkv, 3, key_dim),
                &to_tiled(&z, 3, 0),
                &to_tiled(&b, 1, 0),
                &to_tiled(&a, 1, 0),
            ],
            n,
            n,
        );
        assert_eq!(got, to_tiled(&whole, 3, 0));
    }

    #[test]
    fn tiled_heads_map_to_the_grouped_order_of_the_kernels() {
        let tiled = DeltaNetConfig {
            n_k_heads: 2,
            n_v_heads: 6,
            d_k: 1,
            d_v: 1,
            tiled_value_heads: true,
        };
        // Grouped heads 0, 1, 2 read key head 0; tiled heads 0, 2, 4 do.
        let map: Vec<usize> = (0..6).map(|h| file_head(&tiled, h)).collect();
        assert_eq!(map, vec![0, 2, 4, 1, 3, 5]);
        let grouped = DeltaNetConfig {
            tiled_value_heads: false,
            ..tiled
        };
        assert_eq!(file_head(&grouped, 4), 4);
    }
}
