//! The host side of Mamba-2 (`super::mamba2`): a layer's small parameters, read from its
//! weights into host memory, and the CPU kernel of the backend seam's `mamba2`
//! over them (causal convolution with bias and SiLU, the selective scan, the gated per-group
//! RMSNorm; pagoda-kernels' `recurrent` kernels). Apart from the layer so that the backend
//! seam can name the parameters without importing the layer that drives it.
//!
//! The state of one sequence ([`crate::recurrent_state`]) is the convolution's last
//! `taps - 1` inputs (`[taps - 1, conv_dim]`) followed by the scan's matrices
//! (`[n_heads, head_dim, state_dim]`).
//!
//! Invariant: a sequence's rows run in position order from the state its earlier rows left
//! (a segment at position 0 starts from zeros), so a prompt in one pass, in chunks, or a
//! token at a time gives the same outputs up to the scan's rounding.

use crate::config::Mamba2Config;
use crate::weights::Weights;
use crate::{ModelConfig, ModelError};
use pagoda_kernels::paged_attention::SeqAttention;
use pagoda_kernels::recurrent::{
    conv1d_causal_prefill, ssd_dt, ssd_prefill, ConvActivation, ConvWeights, SsdInputs, SsdParams,
    SsdShape,
};

/// A layer's small host-side parameters: what the CPU kernel reads besides the projections.
#[derive(Debug, Clone)]
pub struct Mamba2Params {
    shape: Mamba2Config,
    taps: usize,
    /// `[conv_dim, taps]`, oldest tap first.
    conv: Vec<f32>,
    conv_bias: Option<Vec<f32>>,
    /// `A = -exp(A_log)` per head.
    a: Vec<f32>,
    /// The skip `D` per head, if the file has one.
    d: Option<Vec<f32>>,
    dt_bias: Vec<f32>,
    /// The gated norm's weight, `[d_inner]`.
    norm: Vec<f32>,
    eps: f32,
}

impl Mamba2Params {
    /// Layer `i`'s parameters (everything but its two projections).
    pub fn load(
        weights: &Weights,
        i: usize,
        cfg: &ModelConfig,
        shape: Mamba2Config,
        taps: usize,
    ) -> Result<Self, ModelError> {
        let (conv_dim, inner, heads) = (shape.conv_dim(), shape.inner_dim(), shape.n_heads);
        let name = |t: &str| format!("blk.{i}.{t}");
        let bad = |tensor: String, message: String| ModelError::Tensor {
            path: Default::default(),
            tensor,
            message,
        };
        let conv = weights.conv_f32(&name("ssm_conv1d.weight"), conv_dim, taps)?;
        let conv_bias_name = name("ssm_conv1d.bias");
        let conv_bias = if weights.contains(&conv_bias_name) {
            Some(weights.vector_f32(&conv_bias_name, conv_dim)?)
        } else {
            None
        };
        let a_log_name = name("ssm_a_log");
        let a = if weights.contains(&a_log_name) {
            let a_log = weights.vector_f32(&a_log_name, heads)?;
            a_log.iter().map(|x| -x.exp()).collect()
        } else {
            // GGUF: -exp(A_log) already.
            let a_name = name("ssm_a");
            let a = weights.vector_f32(&a_name, heads)?;
            if let Some(x) = a.iter().find(|x| !x.is_finite() || **x > 0.0) {
                return Err(bad(a_name, format!("{x} is not negative (-exp(A_log))")));
            }
            a
        };
        let d_name = name("ssm_d");
        let skip = if weights.contains(&d_name) {
            Some(weights.vector_f32(&d_name, heads)?)
        } else {
            None
        };
        Ok(Mamba2Params {
            shape,
            taps,
            conv,
            conv_bias,
            a,
            d: skip,
            dt_bias: weights.vector_f32(&name("ssm_dt.bias"), heads)?,
            norm: weights.vector_f32(&name("ssm_norm.weight"), inner)?,
            eps: cfg.rms_eps,
        })
    }
}

/// The CPU kernel of `Backend::mamba2` (see there) over the sequences `seqs`: `zxbcdt` is
/// the rows' `in_proj` output.
pub(crate) fn run_cpu(
    p: &Mamba2Params,
    (floats, slots, batch): (usize, &mut [f32], &[u32]),
    zxbcdt: &[f32],
    seqs: &[SeqAttention<'_>],
    out: &mut Vec<f32>,
) -> Result<(), ModelError> {
    let m = &p.shape;
    let (inner, conv_dim, proj, heads) = (m.inner_dim(), m.conv_dim(), m.in_proj_dim(), m.n_heads);
    let bc = m.n_groups * m.state_dim;
    let conv_floats = p.taps.saturating_sub(1) * conv_dim;
    let bad = |msg: String| Err(ModelError::InvalidBatch(format!("Mamba-2: {msg}")));
    if floats != conv_floats + m.ssm_floats() {
        return bad(format!(
            "{floats} state values per slot for a {conv_floats}-value convolution window and \
             {} scan values",
            m.ssm_floats()
        ));
    }
    let rows = zxbcdt.len() / proj.max(1);
    if zxbcdt.len() != rows * proj || batch.len() != seqs.len() {
        return bad(format!(
            "{} input values for rows of {proj}; {} slots for {} sequences",
            zxbcdt.len(),
            batch.len(),
            seqs.len()
        ));
    }
    out.clear();
    out.resize(rows * inner, 0.0);
    let conv = ConvWeights {
        weight: &p.conv,
        bias: p.conv_bias.as_deref(),
        channels: conv_dim,
        width: p.taps,
    };
    let shape = SsdShape {
        n_heads: heads,
        head_dim: m.head_dim,
        state_dim: m.state_dim,
        n_groups: m.n_groups,
    };
    let params = SsdParams {
        a: &p.a,
        d: p.d.as_deref(),
    };
    let group = inner / m.n_groups;
    let (mut xbc, mut mixed, mut dt) = (Vec::new(), Vec::new(), Vec::new());
    let (mut x, mut b, mut c, mut y) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
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
        let (conv_state, ssm_state) = state.split_at_mut(conv_floats);
        let in_rows = &zxbcdt[r.start * proj..r.end * proj];
        xbc.clear();
        dt.clear();
        for row in in_rows.chunks_exact(proj) {
            xbc.extend_from_slice(&row[inner..inner + conv_dim]);
            dt.extend_from_slice(&row[inner + conv_dim..]);
        }
        mixed.clear();
        mixed.resize(n * conv_dim, 0.0);
        conv1d_causal_prefill(&conv, ConvActivation::Silu, n, &xbc, conv_state, &mut mixed)?;
        x.clear();
        b.clear();
        c.clear();
        for row in mixed.chunks_exact(conv_dim) {
            x.extend_from_slice(&row[..inner]);
            b.extend_from_slice(&row[inner..inner + bc]);
            c.extend_from_slice(&row[inner + bc..]);
        }
        ssd_dt(&mut dt, &p.dt_bias, m.dt_limit)?;
        y.clear();
        y.resize(n * inner, 0.0);
        let inputs = SsdInputs {
            x: &x,
            dt: &dt,
            b: &b,
            c: &c,
        };
        ssd_prefill(&shape, &params, n, &inputs, ssm_state, &mut y)?;
        // rmsnorm(y · silu(z)) · w per group.
        let dst = &mut out[r.start * inner..r.end * inner];
        for ((y_row, dst_row), in_row) in y
            .chunks_exact_mut(inner)
            .zip(dst.chunks_exact_mut(inner))
            .zip(in_rows.chunks_exact(proj))
        {
            for (v, &z) in y_row.iter_mut().zip(&in_row[..inner]) {
                *v *= z / (1.0 + (-z).exp());
            }
            for ((g, d), w) in y_row
                .chunks_exact(group)
                .zip(dst_row.chunks_exact_mut(group))
                .zip(p.norm.chunks_exact(group))
            {
                pagoda_kernels::ops::rms_norm(g, w, p.eps, 0.0, d);
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

    fn params() -> Mamba2Params {
        let shape = Mamba2Config {
            n_heads: 4,
            head_dim: 3,
            state_dim: 5,
            n_groups: 2,
            dt_limit: (0.0, f32::INFINITY),
        };
        let taps = 4;
        Mamba2Params {
            shape,
            taps,
            conv: wave(shape.conv_dim() * taps, 1),
            conv_bias: Some(wave(shape.conv_dim(), 2)),
            a: vec![-0.5, -1.0, -0.1, -2.0],
            d: Some(vec![1.0, 0.5, -0.25, 0.0]),
            dt_bias: wave(4, 3),
            norm: wave(shape.inner_dim(), 4).iter().map(|w| 1.0 + w).collect(),
            eps: 1e-5,
        }
    }

    #[test]
    fn chunks_and_single_steps_give_the_whole_prompt_s_outputs() {
        let p = params();
        let m = p.shape;
        let n = 9;
        let floats = (p.taps - 1) * m.conv_dim() + m.ssm_floats();
        let input = wave(n * m.in_proj_dim(), 5);
        let mut state = vec![3.0f32; floats]; // garbage: position 0 clears it
        let mut whole = Vec::new();
        run_cpu(
            &p,
            (floats, &mut state, &[0]),
            &input,
            &[seq(0..n, 0)],
            &mut whole,
        )
        .unwrap();
        assert_eq!(whole.len(), n * m.inner_dim());
        assert!(whole.iter().all(|v| v.is_finite()));
        let mut state2 = vec![0.0f32; floats];
        let mut stepped = Vec::new();
        for (t, row) in input.chunks_exact(m.in_proj_dim()).enumerate() {
            let mut o = Vec::new();
            run_cpu(
                &p,
                (floats, &mut state2, &[0]),
                row,
                &[seq(0..1, t)],
                &mut o,
            )
            .unwrap();
            stepped.extend(o);
        }
        let worst = whole
            .iter()
            .zip(&stepped)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{worst}");
        // Two sequences in one pass, each in its own slot, as each alone.
        let mut both = vec![0.0f32; 2 * floats];
        let two = [input.clone(), input[..4 * m.in_proj_dim()].to_vec()].concat();
        let mut out = Vec::new();
        run_cpu(
            &p,
            (floats, &mut both, &[1, 0]),
            &two,
            &[seq(0..n, 0), seq(n..n + 4, 0)],
            &mut out,
        )
        .unwrap();
        assert_eq!(&out[..n * m.inner_dim()], &whole[..]);
        assert_eq!(&both[floats..], &state[..]);
    }

    #[test]
    fn bad_shapes_and_slots_are_errors() {
        let p = params();
        let m = p.shape;
        let floats = (p.taps - 1) * m.conv_dim() + m.ssm_floats();
        let mut state = vec![0.0; floats];
        let mut out = Vec::new();
        let row = wave(m.in_proj_dim(), 0);
        assert!(run_cpu(
            &p,
            (floats, &mut state, &[1]),
            &row,
            &[seq(0..1, 0)],
            &mut out
        )
        .is_err());
        assert!(run_cpu(
            &p,
            (floats - 1, &mut state, &[0]),
            &row,
            &[seq(0..1, 0)],
            &mut out
        )
        .is_err());
        assert!(run_cpu(
            &p,
            (floats, &mut state, &[0]),
            &row[1..],
            &[seq(0..1, 0)],
            &mut out
        )
        .is_err());
    }
}
