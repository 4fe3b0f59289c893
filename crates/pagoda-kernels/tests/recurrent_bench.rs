//! Timings of the recurrent kernels at real layer sizes (`#[ignore]`d; run in release):
//!
//! ```text
//! cargo test --release -p pagoda-kernels --test recurrent_bench -- --ignored --nocapture
//! ```
//!
//! - decode: one Qwen3.5-4B linear-attention layer's step (conv over 8192 channels, K = 4;
//!   gated delta rule with 16 key heads, 32 value heads, d_k = d_v = 128) against one of its
//!   full-attention layers' decode at 8k context (16 query heads, 4 kv heads, head_dim 256,
//!   F16 paged K/V, blocks of 16); the delta state is timed hot (one layer's 2 MiB state,
//!   cache-resident) and cold (24 layers' states in turn, as a decode walks the model).
//! - prefill: both prefill forms (scan, chunked) against the step called `T` times, for that
//!   layer and a Nemotron-H-like Mamba-2 layer (128 heads of 64, state 128, 8 groups).
//!
//! Each figure is the median of several runs on one thread, timed by that thread's CPU time
//! (the build machines are shared; wall time there measures the neighbours).

use std::time::Instant;

use pagoda_kernels::attention::AttentionShape;
use pagoda_kernels::kv_blocks::{KvBlockStorage, KvDtype};
use pagoda_kernels::paged_attention::{paged_attention, SeqAttention};
use pagoda_kernels::recurrent::{
    conv1d_causal_step, gated_delta_prefill_form, gated_delta_step, ssd_prefill_form, ssd_step,
    ConvActivation, ConvWeights, GatedDeltaInputs, GatedDeltaShape, PrefillForm, SsdInputs,
    SsdParams, SsdShape,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn randv(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
        .collect()
}

/// Seconds this thread has run on a CPU (`/proc/thread-self/schedstat`), so timings on a
/// shared machine leave out the time other processes had the core; wall time elsewhere.
fn thread_seconds(wall: Instant) -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or_else(|| wall.elapsed().as_secs_f64(), |ns| ns as f64 * 1e-9)
}

/// Median seconds per call of `f` over `runs` samples of `reps` calls each (after one warm-up
/// call), on one rayon thread (the kernels' own parallel loops run inline), timed by that
/// thread's CPU time. The kernel updates that figure at scheduler ticks, so a sample should
/// last well over 10 ms.
fn median(runs: usize, reps: usize, mut f: impl FnMut() + Send) -> f64 {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(|| {
            f();
            let origin = Instant::now();
            let mut times: Vec<f64> = (0..runs)
                .map(|_| {
                    let t = thread_seconds(origin);
                    for _ in 0..reps {
                        f();
                    }
                    (thread_seconds(origin) - t) / reps as f64
                })
                .collect();
            times.sort_by(|a, b| a.total_cmp(b));
            times[runs / 2]
        })
}

const QWEN35_4B: GatedDeltaShape = GatedDeltaShape {
    n_k_heads: 16,
    n_v_heads: 32,
    d_k: 128,
    d_v: 128,
    qk_l2norm: true,
};

struct DeltaData {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

impl DeltaData {
    fn new(shape: &GatedDeltaShape, t: usize, rng: &mut StdRng) -> Self {
        DeltaData {
            q: randv(rng, t * shape.n_k_heads * shape.d_k, 1.0),
            k: randv(rng, t * shape.n_k_heads * shape.d_k, 1.0),
            v: randv(rng, t * shape.n_v_heads * shape.d_v, 1.0),
            g: (0..t * shape.n_v_heads)
                .map(|_| -rng.gen_range(0.0f32..2.0))
                .collect(),
            beta: (0..t * shape.n_v_heads)
                .map(|_| rng.gen_range(0.0f32..1.0))
                .collect(),
        }
    }

    fn token(&self, shape: &GatedDeltaShape, a: usize, b: usize) -> GatedDeltaInputs<'_> {
        let (qk, vv, h) = (
            shape.n_k_heads * shape.d_k,
            shape.n_v_heads * shape.d_v,
            shape.n_v_heads,
        );
        GatedDeltaInputs {
            q: &self.q[a * qk..b * qk],
            k: &self.k[a * qk..b * qk],
            v: &self.v[a * vv..b * vv],
            g: &self.g[a * h..b * h],
            beta: &self.beta[a * h..b * h],
        }
    }
}

#[test]
#[ignore = "timing; run in release with --ignored --nocapture"]
fn decode_step_qwen35_4b_linear_vs_full_attention_8k() {
    let mut rng = StdRng::seed_from_u64(1);
    let shape = QWEN35_4B;
    let data = DeltaData::new(&shape, 1, &mut rng);
    let x = data.token(&shape, 0, 1);
    const LAYERS: usize = 24;
    let mut states: Vec<Vec<f32>> = (0..LAYERS)
        .map(|_| randv(&mut rng, shape.state_len(), 0.1))
        .collect();
    let mut out = vec![0.0; shape.n_v_heads * shape.d_v];
    // The conv in front of it: q, k, v channels.
    let channels = 2 * shape.n_k_heads * shape.d_k + shape.n_v_heads * shape.d_v;
    let weight = randv(&mut rng, channels * 4, 0.5);
    let conv = ConvWeights {
        weight: &weight,
        bias: None,
        channels,
        width: 4,
    };
    let xc = randv(&mut rng, channels, 1.0);
    let mut conv_state = vec![0.0; conv.state_len()];
    let mut conv_out = vec![0.0; channels];
    // Full attention at 8k, F16 K/V in blocks of 16.
    let attn = AttentionShape {
        n_heads: 16,
        n_kv_heads: 4,
        head_dim: 256,
        scale: 1.0 / 16.0,
        softcap: None,
        window: None,
    };
    let ctx = 8192;
    let bs = 16;
    let kv_dim = attn.n_kv_heads * attn.head_dim;
    let n_blocks = ctx / bs;
    let mut keys = KvBlockStorage::new(KvDtype::F16, n_blocks, bs, kv_dim);
    let mut values = KvBlockStorage::new(KvDtype::F16, n_blocks, bs, kv_dim);
    let table: Vec<u32> = (0..n_blocks as u32).collect();
    keys.write(&table, 0, &randv(&mut rng, ctx * kv_dim, 1.0));
    values.write(&table, 0, &randv(&mut rng, ctx * kv_dim, 1.0));
    let q = randv(&mut rng, attn.n_heads * attn.head_dim, 1.0);
    let mut attn_out = vec![0.0; q.len()];
    let seqs = [SeqAttention {
        rows: 0..1,
        start: ctx - 1,
        block_table: &table,
    }];

    let conv_s = median(9, 5000, || {
        conv1d_causal_step(
            &conv,
            ConvActivation::Silu,
            &xc,
            &mut conv_state,
            &mut conv_out,
        )
        .unwrap()
    });
    let hot = median(9, 500, || {
        gated_delta_step(&shape, &x, &mut states[0], &mut out).unwrap()
    });
    let mut layer = 0;
    let cold = median(9, LAYERS * 20, || {
        layer = (layer + 1) % LAYERS;
        gated_delta_step(&shape, &x, &mut states[layer], &mut out).unwrap()
    });
    let full = median(9, 20, || {
        paged_attention(&attn, &q, &keys, &values, &seqs, &mut attn_out)
    });
    println!(
        "Qwen3.5-4B decode step, 1 thread: conv1d {:.1} us; gated delta {:.1} us hot, \
         {:.1} us cold (24 layers' states in turn); full attention at 8k (F16 K/V) {:.1} us; \
         full / linear (conv + cold delta) = {:.1}x",
        conv_s * 1e6,
        hot * 1e6,
        cold * 1e6,
        full * 1e6,
        full / (conv_s + cold),
    );
}

#[test]
#[ignore = "timing; run in release with --ignored --nocapture"]
fn prefill_forms_vs_steps() {
    let mut rng = StdRng::seed_from_u64(2);
    let shape = QWEN35_4B;
    for t in [16usize, 64, 512, 2048] {
        let data = DeltaData::new(&shape, t, &mut rng);
        let state0 = randv(&mut rng, shape.state_len(), 0.1);
        let row = shape.n_v_heads * shape.d_v;
        let mut out = vec![0.0; t * row];
        let mut form = |f: PrefillForm| {
            median(3, 2048 / t, || {
                let mut s = state0.clone();
                let x = data.token(&shape, 0, t);
                gated_delta_prefill_form(f, &shape, t, &x, &mut s, &mut out).unwrap();
            })
        };
        let (scan, chunked) = (form(PrefillForm::Scan), form(PrefillForm::Chunked));
        let steps = median(3, 2048 / t, || {
            let mut s = state0.clone();
            for (i, o) in out.chunks_exact_mut(row).enumerate() {
                gated_delta_step(&shape, &data.token(&shape, i, i + 1), &mut s, o).unwrap();
            }
        });
        println!(
            "Qwen3.5-4B gated delta prefill of {t}, 1 thread, us/token: scan {:.1}, chunked \
             {:.1}, {t} steps {:.1} (steps / scan {:.2}x, steps / chunked {:.2}x)",
            scan * 1e6 / t as f64,
            chunked * 1e6 / t as f64,
            steps * 1e6 / t as f64,
            steps / scan,
            steps / chunked
        );
    }

    let ss = SsdShape {
        n_heads: 128,
        head_dim: 64,
        state_dim: 128,
        n_groups: 8,
    };
    let a: Vec<f32> = (0..ss.n_heads).map(|h| -(1.0 + h as f32 / 16.0)).collect();
    let d = vec![1.0; ss.n_heads];
    let p = SsdParams { a: &a, d: Some(&d) };
    for t in [16usize, 64, 512, 2048] {
        let xs = randv(&mut rng, t * ss.n_heads * ss.head_dim, 1.0);
        let dt: Vec<f32> = (0..t * ss.n_heads)
            .map(|_| rng.gen_range(0.001f32..0.1))
            .collect();
        let b = randv(&mut rng, t * ss.n_groups * ss.state_dim, 1.0);
        let c = randv(&mut rng, t * ss.n_groups * ss.state_dim, 1.0);
        let (xr, br) = (ss.n_heads * ss.head_dim, ss.n_groups * ss.state_dim);
        let inputs = |i: usize, j: usize| SsdInputs {
            x: &xs[i * xr..j * xr],
            dt: &dt[i * ss.n_heads..j * ss.n_heads],
            b: &b[i * br..j * br],
            c: &c[i * br..j * br],
        };
        let state0 = randv(&mut rng, ss.state_len(), 0.1);
        let mut out = vec![0.0; t * xr];
        let mut form = |f: PrefillForm| {
            median(3, 2048 / t, || {
                let mut s = state0.clone();
                ssd_prefill_form(f, &ss, &p, t, &inputs(0, t), &mut s, &mut out).unwrap();
            })
        };
        let (scan, chunked) = (form(PrefillForm::Scan), form(PrefillForm::Chunked));
        let steps = median(3, 2048 / t, || {
            let mut s = state0.clone();
            for (i, o) in out.chunks_exact_mut(xr).enumerate() {
                ssd_step(&ss, &p, &inputs(i, i + 1), &mut s, o).unwrap();
            }
        });
        println!(
            "Nemotron-H-like SSD prefill of {t}, 1 thread, us/token: scan {:.1}, chunked {:.1}, \
             {t} steps {:.1} (steps / scan {:.2}x, steps / chunked {:.2}x)",
            scan * 1e6 / t as f64,
            chunked * 1e6 / t as f64,
            steps * 1e6 / t as f64,
            steps / scan,
            steps / chunked,
        );
    }
}
