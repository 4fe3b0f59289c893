//! Tests of the recurrent kernels (`pagoda_kernels::recurrent`): transformers' torch functions'
//! outputs (goldens written by `scripts/reference/golden_recurrent.py`: 150 tokens, chunks of
//! 64, non-zero and zero initial states, grouped heads), prefill == steps on random shapes
//! (proptest), prefills split at any token, and wrong lengths answered with errors.
//!
//! Tolerances are `|got - want| <= atol + rtol · |want|`; the measured maxima are printed
//! (`cargo test --test recurrent -- --nocapture`).

use pagoda_kernels::recurrent::{
    conv1d_causal_prefill, conv1d_causal_step, gated_delta_gates, gated_delta_prefill,
    gated_delta_prefill_form, gated_delta_step, ssd_dt, ssd_prefill, ssd_prefill_form, ssd_step,
    ConvActivation, ConvWeights, GatedDeltaInputs, GatedDeltaShape, PrefillForm, SsdInputs,
    SsdParams, SsdShape,
};
use pagoda_kernels::KernelError;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

const FORMS: [PrefillForm; 2] = [PrefillForm::Scan, PrefillForm::Chunked];

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/recurrent");

struct Golden {
    meta: Value,
    data: Vec<f32>,
}

impl Golden {
    fn load() -> Self {
        let meta: Value =
            serde_json::from_slice(&std::fs::read(format!("{GOLDEN}/recurrent.json")).unwrap())
                .unwrap();
        let data = std::fs::read(format!("{GOLDEN}/recurrent.bin"))
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        Golden { meta, data }
    }

    fn tokens(&self) -> usize {
        self.meta["t"].as_u64().unwrap() as usize
    }

    fn dim(&self, case: &str, name: &str) -> usize {
        self.meta["cases"][case]["dims"][name].as_u64().unwrap() as usize
    }

    fn flag(&self, case: &str, name: &str) -> bool {
        self.meta["cases"][case]["dims"][name].as_bool().unwrap()
    }

    fn has(&self, case: &str, name: &str) -> bool {
        self.meta["cases"][case]["arrays"].get(name).is_some()
    }

    fn get(&self, case: &str, name: &str) -> Vec<f32> {
        let a = &self.meta["cases"][case]["arrays"][name];
        assert!(a.is_object(), "{case}: no array {name}");
        let off = a["offset"].as_u64().unwrap() as usize;
        let len: usize = a["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .product();
        self.data[off..off + len].to_vec()
    }

    fn cases(&self, prefix: &str) -> Vec<String> {
        let cases: Vec<String> = self.meta["cases"]
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        assert!(!cases.is_empty(), "no {prefix} cases");
        cases
    }
}

/// Asserts `|got - want| <= atol + rtol |want|` everywhere; returns the largest `|got - want|`
/// and the largest error relative to `max |want|`, for the report.
#[track_caller]
fn close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) -> (f32, f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let mut worst = 0.0f32;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(
            err <= atol + rtol * w.abs(),
            "{what}[{i}]: got {g}, want {w} (|err| {err})"
        );
        worst = worst.max(err);
    }
    let rel = if scale > 0.0 { worst / scale } else { 0.0 };
    println!("{what}: max |err| {worst:.2e} ({rel:.2e} of max |want| {scale:.2e})");
    (worst, rel)
}

// ---------------------------------------------------------------- short convolution

#[test]
fn conv1d_matches_transformers() {
    let gold = Golden::load();
    let t = gold.tokens();
    for case in gold.cases("conv_") {
        let (c, k) = (gold.dim(&case, "channels"), gold.dim(&case, "width"));
        let act = if gold.flag(&case, "silu") {
            ConvActivation::Silu
        } else {
            ConvActivation::Identity
        };
        let weight = gold.get(&case, "weight");
        let bias = gold.has(&case, "bias").then(|| gold.get(&case, "bias"));
        let w = ConvWeights {
            weight: &weight,
            bias: bias.as_deref(),
            channels: c,
            width: k,
        };
        let x = gold.get(&case, "x");
        // From a zero state (causal_conv1d_fn).
        let mut state = vec![0.0; w.state_len()];
        let mut out = vec![0.0; t * c];
        conv1d_causal_prefill(&w, act, t, &x, &mut state, &mut out).unwrap();
        close(
            &format!("{case} zero-state prefill"),
            &out,
            &gold.get(&case, "out_zero"),
            1e-6,
            1e-5,
        );
        assert_eq!(
            state,
            x[(t - (k - 1)) * c..],
            "{case}: state = last K-1 inputs"
        );
        // From a given state (causal_conv1d_update), by prefill and by steps.
        let state0 = gold.get(&case, "state0");
        let want = gold.get(&case, "out_state");
        let want_state = gold.get(&case, "final_state");
        let mut state = state0.clone();
        conv1d_causal_prefill(&w, act, t, &x, &mut state, &mut out).unwrap();
        close(&format!("{case} prefill"), &out, &want, 1e-6, 1e-5);
        assert_eq!(state, want_state, "{case}: final state");
        let mut state = state0.clone();
        let mut steps = vec![0.0; t * c];
        for (xt, ot) in x.chunks_exact(c).zip(steps.chunks_exact_mut(c)) {
            conv1d_causal_step(&w, act, xt, &mut state, ot).unwrap();
        }
        assert_eq!(steps, out, "{case}: steps == prefill bit for bit");
        assert_eq!(state, want_state, "{case}: final state by steps");
    }
}

#[test]
fn conv1d_prefill_split_anywhere_equals_one_call() {
    let gold = Golden::load();
    let case = "conv_qwen35";
    let t = gold.tokens();
    let (c, k) = (gold.dim(case, "channels"), gold.dim(case, "width"));
    let weight = gold.get(case, "weight");
    let w = ConvWeights {
        weight: &weight,
        bias: None,
        channels: c,
        width: k,
    };
    let x = gold.get(case, "x");
    let state0 = gold.get(case, "state0");
    let mut whole_state = state0.clone();
    let mut whole = vec![0.0; t * c];
    conv1d_causal_prefill(
        &w,
        ConvActivation::Silu,
        t,
        &x,
        &mut whole_state,
        &mut whole,
    )
    .unwrap();
    for split in [0, 1, 2, 3, 64, t - 1, t] {
        let mut state = state0.clone();
        let mut out = vec![0.0; t * c];
        let (xa, xb) = x.split_at(split * c);
        let (oa, ob) = out.split_at_mut(split * c);
        conv1d_causal_prefill(&w, ConvActivation::Silu, split, xa, &mut state, oa).unwrap();
        conv1d_causal_prefill(&w, ConvActivation::Silu, t - split, xb, &mut state, ob).unwrap();
        assert_eq!(out, whole, "split at {split}");
        assert_eq!(state, whole_state, "split at {split}");
    }
}

// ---------------------------------------------------------------- gated DeltaNet

struct DeltaCase {
    shape: GatedDeltaShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    state0: Vec<f32>,
}

impl DeltaCase {
    fn golden(gold: &Golden, case: &str) -> Self {
        DeltaCase {
            shape: GatedDeltaShape {
                n_k_heads: gold.dim(case, "n_k_heads"),
                n_v_heads: gold.dim(case, "n_v_heads"),
                d_k: gold.dim(case, "d_k"),
                d_v: gold.dim(case, "d_v"),
                qk_l2norm: gold.flag(case, "qk_l2norm"),
            },
            q: gold.get(case, "q"),
            k: gold.get(case, "k"),
            v: gold.get(case, "v"),
            g: gold.get(case, "g"),
            beta: gold.get(case, "beta"),
            state0: gold.get(case, "state0"),
        }
    }

    fn tokens(&self) -> usize {
        self.g.len() / self.shape.n_v_heads
    }

    /// Tokens `a..b` of the inputs.
    fn inputs(&self, a: usize, b: usize) -> GatedDeltaInputs<'_> {
        let s = &self.shape;
        let (qk, vv, gg) = (s.n_k_heads * s.d_k, s.n_v_heads * s.d_v, s.n_v_heads);
        GatedDeltaInputs {
            q: &self.q[a * qk..b * qk],
            k: &self.k[a * qk..b * qk],
            v: &self.v[a * vv..b * vv],
            g: &self.g[a * gg..b * gg],
            beta: &self.beta[a * gg..b * gg],
        }
    }

    /// `(outputs, final state)` of `T` steps.
    fn steps(&self) -> (Vec<f32>, Vec<f32>) {
        let row = self.shape.n_v_heads * self.shape.d_v;
        let mut state = self.state0.clone();
        let mut out = vec![0.0; self.tokens() * row];
        for (t, o) in out.chunks_exact_mut(row).enumerate() {
            gated_delta_step(&self.shape, &self.inputs(t, t + 1), &mut state, o).unwrap();
        }
        (out, state)
    }

    /// `(outputs, final state)` of prefills over the pieces `0..s1, s1..s2, ..`.
    fn prefill(&self, form: PrefillForm, splits: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let row = self.shape.n_v_heads * self.shape.d_v;
        let t = self.tokens();
        let mut state = self.state0.clone();
        let mut out = vec![0.0; t * row];
        let mut bounds = vec![0];
        bounds.extend(splits.iter().copied().filter(|&s| s > 0 && s < t));
        bounds.push(t);
        for w in bounds.windows(2) {
            let (a, b) = (w[0], w[1]);
            gated_delta_prefill_form(
                form,
                &self.shape,
                b - a,
                &self.inputs(a, b),
                &mut state,
                &mut out[a * row..b * row],
            )
            .unwrap();
        }
        (out, state)
    }
}

#[test]
fn gated_delta_gates_match_the_forward() {
    let gold = Golden::load();
    for case in gold.cases("delta_") {
        let a = gold.get(&case, "a");
        let mut g = vec![0.0; a.len()];
        let mut beta = vec![0.0; a.len()];
        gated_delta_gates(
            &a,
            &gold.get(&case, "b"),
            &gold.get(&case, "a_log"),
            &gold.get(&case, "dt_bias"),
            &mut g,
            &mut beta,
        )
        .unwrap();
        close(&format!("{case} g"), &g, &gold.get(&case, "g"), 1e-6, 1e-6);
        close(
            &format!("{case} beta"),
            &beta,
            &gold.get(&case, "beta"),
            1e-7,
            1e-6,
        );
    }
}

/// Step vs `torch_recurrent_gated_delta_rule`, prefill vs `torch_chunk_gated_delta_rule`, and
/// the two Rust forms against each other.
#[test]
fn gated_delta_matches_transformers() {
    let gold = Golden::load();
    for case in gold.cases("delta_") {
        let d = DeltaCase::golden(&gold, &case);
        let (out_s, state_s) = d.steps();
        // Measured: <= 1e-6 absolute at outputs of magnitude <= 2 (torch's own chunk form is
        // 6e-7 from its recurrent form).
        let tol = (5e-6, 5e-5);
        close(
            &format!("{case} step out vs torch recurrent"),
            &out_s,
            &gold.get(&case, "out_recurrent"),
            tol.0,
            tol.1,
        );
        close(
            &format!("{case} step state vs torch recurrent"),
            &state_s,
            &gold.get(&case, "state_recurrent"),
            tol.0,
            tol.1,
        );
        for form in FORMS {
            let (out_p, state_p) = d.prefill(form, &[]);
            close(
                &format!("{case} {form:?} prefill out vs torch chunk"),
                &out_p,
                &gold.get(&case, "out_chunk"),
                tol.0,
                tol.1,
            );
            close(
                &format!("{case} {form:?} prefill state vs torch chunk"),
                &state_p,
                &gold.get(&case, "state_chunk"),
                tol.0,
                tol.1,
            );
            if form == PrefillForm::Scan {
                assert_eq!(
                    (&out_p, &state_p),
                    (&out_s, &state_s),
                    "{case}: scan == steps"
                );
            } else {
                close(
                    &format!("{case} {form:?} prefill vs step out"),
                    &out_p,
                    &out_s,
                    tol.0,
                    tol.1,
                );
            }
            // Cached prefixes: the same tokens in several calls, each resuming the state.
            for splits in [&[1usize, 2, 3][..], &[63, 64, 65], &[100], &[5, 70, 149]] {
                let (o, st) = d.prefill(form, splits);
                close(
                    &format!("{case} {form:?} prefill split {splits:?} out"),
                    &o,
                    &out_p,
                    tol.0,
                    tol.1,
                );
                close(
                    &format!("{case} {form:?} prefill split {splits:?} state"),
                    &st,
                    &state_p,
                    tol.0,
                    tol.1,
                );
            }
        }
    }
}

// ---------------------------------------------------------------- Mamba-2 SSD

struct SsdCase {
    shape: SsdShape,
    a: Vec<f32>,
    d: Option<Vec<f32>>,
    x: Vec<f32>,
    dt: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    state0: Vec<f32>,
}

impl SsdCase {
    fn golden(gold: &Golden, case: &str) -> Self {
        SsdCase {
            shape: SsdShape {
                n_heads: gold.dim(case, "n_heads"),
                head_dim: gold.dim(case, "head_dim"),
                state_dim: gold.dim(case, "state_dim"),
                n_groups: gold.dim(case, "n_groups"),
            },
            a: gold.get(case, "a"),
            d: gold.has(case, "d").then(|| gold.get(case, "d")),
            x: gold.get(case, "x"),
            dt: gold.get(case, "dt"),
            b: gold.get(case, "b"),
            c: gold.get(case, "c"),
            state0: gold.get(case, "state0"),
        }
    }

    fn tokens(&self) -> usize {
        self.dt.len() / self.shape.n_heads
    }

    fn params(&self) -> SsdParams<'_> {
        SsdParams {
            a: &self.a,
            d: self.d.as_deref(),
        }
    }

    fn inputs(&self, a: usize, b: usize) -> SsdInputs<'_> {
        let s = &self.shape;
        let (xx, hh, bc) = (s.n_heads * s.head_dim, s.n_heads, s.n_groups * s.state_dim);
        SsdInputs {
            x: &self.x[a * xx..b * xx],
            dt: &self.dt[a * hh..b * hh],
            b: &self.b[a * bc..b * bc],
            c: &self.c[a * bc..b * bc],
        }
    }

    fn steps(&self) -> (Vec<f32>, Vec<f32>) {
        let row = self.shape.n_heads * self.shape.head_dim;
        let mut state = self.state0.clone();
        let mut out = vec![0.0; self.tokens() * row];
        for (t, o) in out.chunks_exact_mut(row).enumerate() {
            ssd_step(
                &self.shape,
                &self.params(),
                &self.inputs(t, t + 1),
                &mut state,
                o,
            )
            .unwrap();
        }
        (out, state)
    }

    fn prefill(&self, form: PrefillForm, splits: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let row = self.shape.n_heads * self.shape.head_dim;
        let t = self.tokens();
        let mut state = self.state0.clone();
        let mut out = vec![0.0; t * row];
        let mut bounds = vec![0];
        bounds.extend(splits.iter().copied().filter(|&s| s > 0 && s < t));
        bounds.push(t);
        for w in bounds.windows(2) {
            let (a, b) = (w[0], w[1]);
            ssd_prefill_form(
                form,
                &self.shape,
                &self.params(),
                b - a,
                &self.inputs(a, b),
                &mut state,
                &mut out[a * row..b * row],
            )
            .unwrap();
        }
        (out, state)
    }
}

#[test]
fn ssd_dt_matches_the_reference() {
    let gold = Golden::load();
    for case in gold.cases("ssd_") {
        let mut dt = gold.get(&case, "dt_raw");
        ssd_dt(&mut dt, &gold.get(&case, "dt_bias"), (0.0, f32::INFINITY)).unwrap();
        close(
            &format!("{case} dt"),
            &dt,
            &gold.get(&case, "dt"),
            1e-7,
            1e-6,
        );
    }
}

/// Step vs `mamba2_selective_state_update`, prefill vs `mamba2_chunk_scan`, and the two Rust
/// forms against each other.
#[test]
fn ssd_matches_transformers() {
    let gold = Golden::load();
    for case in gold.cases("ssd_") {
        let s = SsdCase::golden(&gold, &case);
        let (out_s, state_s) = s.steps();
        // Measured: <= 7e-6 absolute at outputs of magnitude <= 28 (3e-7 of the largest);
        // torch's chunk scan is 7e-6 from its step.
        let tol = (2e-5, 5e-5);
        close(
            &format!("{case} step out vs torch step"),
            &out_s,
            &gold.get(&case, "out_step"),
            tol.0,
            tol.1,
        );
        close(
            &format!("{case} step state vs torch step"),
            &state_s,
            &gold.get(&case, "state_step"),
            tol.0,
            tol.1,
        );
        for form in FORMS {
            let (out_p, state_p) = s.prefill(form, &[]);
            close(
                &format!("{case} {form:?} prefill out vs torch chunk scan"),
                &out_p,
                &gold.get(&case, "out_chunk"),
                tol.0,
                tol.1,
            );
            close(
                &format!("{case} {form:?} prefill state vs torch chunk scan"),
                &state_p,
                &gold.get(&case, "state_chunk"),
                tol.0,
                tol.1,
            );
            if form == PrefillForm::Scan {
                assert_eq!(
                    (&out_p, &state_p),
                    (&out_s, &state_s),
                    "{case}: scan == steps"
                );
            } else {
                close(
                    &format!("{case} {form:?} prefill vs step out"),
                    &out_p,
                    &out_s,
                    tol.0,
                    tol.1,
                );
            }
            // Cached prefixes: the same tokens in several calls, each resuming the state.
            for splits in [&[1usize, 2, 3][..], &[63, 64, 65], &[100], &[5, 70, 149]] {
                let (o, st) = s.prefill(form, splits);
                close(
                    &format!("{case} {form:?} prefill split {splits:?} out"),
                    &o,
                    &out_p,
                    tol.0,
                    tol.1,
                );
                close(
                    &format!("{case} {form:?} prefill split {splits:?} state"),
                    &st,
                    &state_p,
                    tol.0,
                    tol.1,
                );
            }
        }
    }
}

// ---------------------------------------------------------------- wrong lengths

#[test]
fn wrong_lengths_are_errors_and_leave_the_state_alone() {
    let shape = GatedDeltaShape {
        n_k_heads: 2,
        n_v_heads: 4,
        d_k: 4,
        d_v: 3,
        qk_l2norm: true,
    };
    let (q, v, g) = (vec![0.1; 8], vec![0.2; 12], vec![-0.1; 4]);
    let mut state = vec![1.0; shape.state_len()];
    let mut out = vec![0.0; 12];
    let short = vec![0.0; 7];
    for bad in 0..6 {
        let x = GatedDeltaInputs {
            q: if bad == 0 { &short } else { &q },
            k: if bad == 1 { &short } else { &q },
            v: if bad == 2 { &short } else { &v },
            g: if bad == 3 { &short } else { &g },
            beta: if bad == 4 { &short } else { &g },
        };
        let r = if bad == 5 {
            gated_delta_step(&shape, &x, &mut state[1..], &mut out)
        } else {
            gated_delta_step(&shape, &x, &mut state, &mut out)
        };
        assert!(matches!(r, Err(KernelError::Shape(_))), "case {bad}: {r:?}");
        let r = gated_delta_prefill(&shape, 2, &x, &mut state, &mut out);
        assert!(
            matches!(r, Err(KernelError::Shape(_))),
            "prefill {bad}: {r:?}"
        );
    }
    assert!(state.iter().all(|&s| s == 1.0));
    let bad_shape = GatedDeltaShape {
        n_k_heads: 3,
        ..shape
    };
    let x = GatedDeltaInputs {
        q: &q,
        k: &q,
        v: &v,
        g: &g,
        beta: &g,
    };
    assert!(gated_delta_step(&bad_shape, &x, &mut state, &mut out).is_err());

    let ss = SsdShape {
        n_heads: 4,
        head_dim: 2,
        state_dim: 3,
        n_groups: 3,
    };
    let a = [-1.0; 4];
    let p = SsdParams { a: &a, d: None };
    let xi = SsdInputs {
        x: &[0.0; 8],
        dt: &[0.1; 4],
        b: &[0.0; 9],
        c: &[0.0; 9],
    };
    let mut st = vec![0.0; 24];
    let mut o = vec![0.0; 8];
    assert!(
        ssd_step(&ss, &p, &xi, &mut st, &mut o).is_err(),
        "4 heads, 3 groups"
    );
    let ss = SsdShape { n_groups: 1, ..ss };
    let xi = SsdInputs {
        b: &[0.0; 3],
        c: &[0.0; 2],
        ..xi
    };
    assert!(ssd_step(&ss, &p, &xi, &mut st, &mut o).is_err(), "short C");
    assert!(ssd_prefill(&ss, &p, 1, &xi, &mut st, &mut o).is_err());
    assert!(ssd_dt(&mut [0.0; 5], &[0.0; 2], (0.0, 1.0)).is_err());

    let w = ConvWeights {
        weight: &[0.0; 7],
        bias: None,
        channels: 2,
        width: 4,
    };
    let mut cs = vec![0.0; 6];
    let mut co = vec![0.0; 2];
    assert!(conv1d_causal_step(&w, ConvActivation::Silu, &[0.0; 2], &mut cs, &mut co).is_err());
    let w = ConvWeights {
        weight: &[0.0; 8],
        ..w
    };
    assert!(conv1d_causal_step(&w, ConvActivation::Silu, &[0.0; 3], &mut cs, &mut co).is_err());
    assert!(
        conv1d_causal_prefill(&w, ConvActivation::Silu, 2, &[0.0; 2], &mut cs, &mut co).is_err()
    );
    let w0 = ConvWeights {
        weight: &[],
        width: 0,
        ..w
    };
    assert!(conv1d_causal_step(&w0, ConvActivation::Silu, &[0.0; 2], &mut [], &mut co).is_err());
}

// ---------------------------------------------------------------- random shapes

fn randv(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any shape, length and split: the chunked prefill equals the steps, nothing panics.
    #[test]
    fn gated_delta_prefill_equals_steps(
        hk in 1usize..3, group in 1usize..3, dk in 1usize..20, dv in 1usize..70,
        t in 0usize..140, split in 0usize..140, l2 in any::<bool>(), seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let shape = GatedDeltaShape { n_k_heads: hk, n_v_heads: hk * group, d_k: dk, d_v: dv, qk_l2norm: l2 };
        let hv = hk * group;
        // Without the kernel's normalization, keys of norm <= 1 keep the rule stable.
        let kscale = if l2 { 1.0 } else { 1.0 / (dk as f32).sqrt() };
        let d = DeltaCase {
            shape,
            q: randv(&mut rng, t * hk * dk, 1.0),
            k: randv(&mut rng, t * hk * dk, kscale),
            v: randv(&mut rng, t * hv * dv, 1.0),
            g: (0..t * hv).map(|_| -rng.gen_range(0.0f32..3.0)).collect(),
            beta: (0..t * hv).map(|_| rng.gen_range(0.0f32..1.0)).collect(),
            state0: randv(&mut rng, shape.state_len(), 1.0),
        };
        let (out_s, state_s) = d.steps();
        for form in FORMS {
            let (out_p, state_p) = d.prefill(form, &[split]);
            for (g, w) in out_p.iter().zip(&out_s).chain(state_p.iter().zip(&state_s)) {
                prop_assert!((g - w).abs() <= 1e-4 + 1e-4 * w.abs(), "{form:?}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn ssd_prefill_equals_steps(
        groups in 1usize..3, hpg in 1usize..3, p in 1usize..12, n in 1usize..40,
        t in 0usize..140, split in 0usize..140, with_d in any::<bool>(), seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let h = groups * hpg;
        let shape = SsdShape { n_heads: h, head_dim: p, state_dim: n, n_groups: groups };
        let s = SsdCase {
            shape,
            a: (0..h).map(|_| -rng.gen_range(0.05f32..8.0)).collect(),
            d: with_d.then(|| randv(&mut rng, h, 1.0)),
            x: randv(&mut rng, t * h * p, 1.0),
            dt: (0..t * h).map(|_| rng.gen_range(0.0f32..1.0)).collect(),
            b: randv(&mut rng, t * groups * n, 1.0),
            c: randv(&mut rng, t * groups * n, 1.0),
            state0: randv(&mut rng, shape.state_len(), 1.0),
        };
        let (out_s, state_s) = s.steps();
        // Errors scale with the magnitudes (sums of up to N products of O(1) values).
        let scale = out_s.iter().chain(&state_s).fold(1.0f32, |m, v| m.max(v.abs()));
        for form in FORMS {
            let (out_p, state_p) = s.prefill(form, &[split]);
            for (g, w) in out_p.iter().zip(&out_s).chain(state_p.iter().zip(&state_s)) {
                prop_assert!((g - w).abs() <= 2e-5 * scale + 1e-4 * w.abs(), "{form:?}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn conv1d_prefill_equals_steps(
        c in 1usize..40, k in 1usize..6, t in 0usize..50, bias in any::<bool>(),
        silu in any::<bool>(), seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let weight = randv(&mut rng, c * k, 1.0);
        let b = randv(&mut rng, c, 1.0);
        let w = ConvWeights { weight: &weight, bias: bias.then_some(&b[..]), channels: c, width: k };
        let act = if silu { ConvActivation::Silu } else { ConvActivation::Identity };
        let x = randv(&mut rng, t * c, 1.0);
        let state0 = randv(&mut rng, w.state_len(), 1.0);
        let mut sp = state0.clone();
        let mut op = vec![0.0; t * c];
        conv1d_causal_prefill(&w, act, t, &x, &mut sp, &mut op).unwrap();
        let mut ss = state0;
        let mut os = vec![0.0; t * c];
        for (xt, ot) in x.chunks_exact(c).zip(os.chunks_exact_mut(c)) {
            conv1d_causal_step(&w, act, xt, &mut ss, ot).unwrap();
        }
        prop_assert_eq!(op, os);
        prop_assert_eq!(sp, ss);
    }

    /// Arbitrary (mostly wrong) lengths: an error or a result, never a panic.
    #[test]
    fn arbitrary_lengths_never_panic(
        lens in proptest::collection::vec(0usize..40, 8), t in 0usize..4,
        hk in 0usize..3, hv in 0usize..5, d in 0usize..5,
    ) {
        let buf = vec![0.5f32; 64];
        let mut st = vec![0.0f32; lens[5]];
        let mut out = vec![0.0f32; lens[6]];
        let shape = GatedDeltaShape { n_k_heads: hk, n_v_heads: hv, d_k: d, d_v: d + 1, qk_l2norm: true };
        let x = GatedDeltaInputs { q: &buf[..lens[0]], k: &buf[..lens[1]], v: &buf[..lens[2]], g: &buf[..lens[3]], beta: &buf[..lens[4]] };
        let _ = gated_delta_step(&shape, &x, &mut st, &mut out);
        let _ = gated_delta_prefill(&shape, t, &x, &mut st, &mut out);
        let ss = SsdShape { n_heads: hv, head_dim: d, state_dim: hk + 1, n_groups: hk };
        let p = SsdParams { a: &buf[..lens[7].min(8)], d: Some(&buf[..lens[7] % 5]) };
        let xi = SsdInputs { x: &buf[..lens[0]], dt: &buf[..lens[1]], b: &buf[..lens[2]], c: &buf[..lens[3]] };
        let _ = ssd_step(&ss, &p, &xi, &mut st, &mut out);
        let _ = ssd_prefill(&ss, &p, t, &xi, &mut st, &mut out);
        let w = ConvWeights { weight: &buf[..lens[0]], bias: Some(&buf[..lens[7]]), channels: d, width: hk };
        let _ = conv1d_causal_step(&w, ConvActivation::Silu, &buf[..lens[1]], &mut st, &mut out);
        let _ = conv1d_causal_prefill(&w, ConvActivation::Identity, t, &buf[..lens[1]], &mut st, &mut out);
    }
}
