//! LFM2's gated short convolution, the token mixer of its recurrent layers (transformers'
//! `Lfm2ShortConv`, llama.cpp's `shortconv`): `in_proj` gives B, C and x per row (`[rows,
//! 3 · hidden]`, in that order), `B · x` goes through a causal depthwise convolution of
//! `taps` taps per channel, and `out_proj(C · conv(B · x))` is the layer's branch.
//!
//! Weights: `blk.N.shortconv.in_proj.weight` `[3 · hidden, hidden]`,
//! `blk.N.shortconv.conv.weight` `[hidden, taps]` (tap 0 multiplies the oldest input; HF
//! stores `[hidden, 1, taps]`, read the same), `blk.N.shortconv.out_proj.weight`.
//!
//! The state of one sequence is its last `taps - 1` rows of `B · x`, oldest first
//! ([`crate::recurrent_state`]); [`run_cpu`] runs it on the CPU through pagoda-kernels'
//! `recurrent::conv1d_causal_prefill`.
//!
//! Invariant: a sequence's rows are convolved in position order with the state its earlier
//! rows left (a segment at position 0 starts from zeros), so a prompt in one pass, in
//! chunks, or a token at a time gives the same outputs.

use super::backend::{Activations, Backend};
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use pagoda_kernels::paged_attention::SeqAttention;
use pagoda_kernels::recurrent::{conv1d_causal_prefill, ConvActivation, ConvWeights};

/// One layer's short-convolution weights on a backend.
#[derive(Debug)]
pub struct ShortConv<B: Backend> {
    in_proj: B::Linear,
    out_proj: B::Linear,
    /// `[hidden, taps]`, host memory (the convolution runs on the CPU).
    conv: Vec<f32>,
    taps: usize,
}

impl<B: Backend> ShortConv<B> {
    /// Layer `i`'s weights.
    pub fn load(
        backend: &B,
        weights: &Weights,
        i: usize,
        cfg: &ModelConfig,
        taps: usize,
    ) -> Result<Self, ModelError> {
        let d = cfg.hidden_size;
        let name = |t: &str| format!("blk.{i}.shortconv.{t}.weight");
        let conv = weights.conv_f32(&name("conv"), d, taps)?;
        Ok(ShortConv {
            in_proj: backend.load_linear(weights, &name("in_proj"), None, 3 * d, d)?,
            out_proj: backend.load_linear(weights, &name("out_proj"), None, d, d)?,
            conv,
            taps,
        })
    }

    pub fn linears(&self) -> [&B::Linear; 2] {
        [&self.in_proj, &self.out_proj]
    }

    /// The layer's branch of `a.normed` into `a.branch`, through `state` (this layer's slots
    /// and the pass's slot per sequence).
    pub fn forward(
        &self,
        backend: &B,
        state: (usize, &mut [f32], &[u32]),
        a: &mut Activations<B::Act>,
        pass: &mut B::Pass<'_>,
    ) -> Result<(), ModelError> {
        backend.linears([&self.in_proj], &a.normed, [&mut a.q], pass)?;
        backend.short_conv(&self.conv, self.taps, state, &a.q, pass, &mut a.attn)?;
        backend.linears([&self.out_proj], &a.attn, [&mut a.branch], pass)
    }
}

/// The CPU kernel of [`Backend::short_conv`] (see there) over the sequences `seqs`.
pub(crate) fn run_cpu(
    weight: &[f32],
    taps: usize,
    (floats, slots, batch): (usize, &mut [f32], &[u32]),
    bcx: &[f32],
    seqs: &[SeqAttention<'_>],
    out: &mut Vec<f32>,
) -> Result<(), ModelError> {
    let channels = weight.len() / taps.max(1);
    let keep = taps.saturating_sub(1);
    let bad = |m: String| Err(ModelError::InvalidBatch(format!("short convolution: {m}")));
    if taps < 2 || channels == 0 || floats != keep * channels {
        return bad(format!(
            "{taps} taps over {channels} channels with {floats} state values per slot"
        ));
    }
    let rows = bcx.len() / (3 * channels);
    if bcx.len() != rows * 3 * channels || batch.len() != seqs.len() {
        return bad(format!(
            "{} input values for rows of {}, {} slots for {} sequences",
            bcx.len(),
            3 * channels,
            batch.len(),
            seqs.len()
        ));
    }
    out.clear();
    out.resize(rows * channels, 0.0);
    let conv = ConvWeights {
        weight,
        bias: None,
        channels,
        width: taps,
    };
    let mut bx = Vec::new();
    for (seq, &slot) in seqs.iter().zip(batch) {
        let at = slot as usize * floats;
        let Some(state) = slots.get_mut(at..at + floats) else {
            return bad(format!("slot {slot} is outside the state"));
        };
        if seq.rows.end > rows {
            return bad(format!("rows {:?} of {rows}", seq.rows));
        }
        if seq.start == 0 {
            state.fill(0.0);
        }
        // B · x of the sequence's rows, through the convolution, then times C.
        bx.clear();
        for r in seq.rows.clone() {
            let row = &bcx[r * 3 * channels..(r + 1) * 3 * channels];
            bx.extend(
                row[..channels]
                    .iter()
                    .zip(&row[2 * channels..])
                    .map(|(b, x)| b * x),
            );
        }
        let o = &mut out[seq.rows.start * channels..seq.rows.end * channels];
        conv1d_causal_prefill(
            &conv,
            ConvActivation::Identity,
            seq.rows.len(),
            &bx,
            state,
            o,
        )?;
        for (r, o) in seq.rows.clone().zip(o.chunks_exact_mut(channels)) {
            let c = &bcx[r * 3 * channels + channels..r * 3 * channels + 2 * channels];
            for (o, &c) in o.iter_mut().zip(c) {
                *o *= c;
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

    #[test]
    fn chunks_and_single_steps_give_the_whole_prompt_s_outputs() {
        let (channels, taps, n) = (3usize, 3usize, 7usize);
        let weight: Vec<f32> = (0..channels * taps)
            .map(|i| i as f32 * 0.25 - 1.0)
            .collect();
        let bcx: Vec<f32> = (0..n * 3 * channels)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let floats = (taps - 1) * channels;
        let mut state = vec![7.0f32; floats]; // garbage: position 0 clears it
        let mut whole = Vec::new();
        run_cpu(
            &weight,
            taps,
            (floats, &mut state, &[0]),
            &bcx,
            &[seq(0..n, 0)],
            &mut whole,
        )
        .unwrap();
        // The same by hand for channel 1, row 4: taps over B·x of rows 2, 3, 4.
        let bx = |r: usize, ch: usize| bcx[r * 9 + ch] * bcx[r * 9 + 6 + ch];
        let want = bcx[4 * 9 + 3 + 1]
            * (weight[3] * bx(2, 1) + weight[4] * bx(3, 1) + weight[5] * bx(4, 1));
        assert!((whole[4 * 3 + 1] - want).abs() < 1e-6);
        // Row 0 sees zeros before it.
        assert!((whole[1] - bcx[3 + 1] * weight[5] * bx(0, 1)).abs() < 1e-6);
        let mut stepped = Vec::new();
        let mut state2 = vec![0.0f32; floats];
        for t in 0..n {
            let mut o = Vec::new();
            let row = &bcx[t * 9..(t + 1) * 9];
            run_cpu(
                &weight,
                taps,
                (floats, &mut state2, &[0]),
                row,
                &[seq(0..1, t)],
                &mut o,
            )
            .unwrap();
            stepped.extend(o);
        }
        assert_eq!(whole, stepped);
        assert_eq!(state, state2);
    }

    #[test]
    fn bad_shapes_and_slots_are_errors() {
        let mut state = vec![0.0; 4];
        let mut out = Vec::new();
        let r = run_cpu(
            &[1.0; 6],
            3,
            (4, &mut state, &[5]),
            &[0.0; 6],
            &[seq(0..1, 0)],
            &mut out,
        );
        assert!(r.is_err());
        let r = run_cpu(
            &[1.0; 6],
            3,
            (4, &mut state, &[0]),
            &[0.0; 5],
            &[seq(0..1, 0)],
            &mut out,
        );
        assert!(r.is_err());
    }
}
