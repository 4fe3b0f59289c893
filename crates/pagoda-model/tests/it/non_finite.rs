//! `Model::first_non_finite` on the tiny Llama of tests/golden/ with one tensor poisoned
//! (NaN or infinity written into it): it names the stage that first produces a non-finite
//! value, agrees with the real forward pass (non-finite logits exactly when a stage is named),
//! and finds nothing in healthy models.

use pagoda_kernels::GgmlType;
use pagoda_model::arch::{Logits, Model, NonFiniteStage};
use pagoda_model::weights::{TensorView, Weights};
use pagoda_model::{open_model, KvDtype, ModelConfig};
use std::path::PathBuf;

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name)
}

/// `weights` with tensor `name`'s values passed through `poison` (stored as f32).
fn poisoned(weights: &Weights, name: &str, poison: impl Fn(usize, f32) -> f32) -> Weights {
    let mut out = Weights::new();
    let mut found = false;
    for t in weights.iter() {
        let view = if t.name == name {
            found = true;
            let values = t.to_f32().expect("dequantizes");
            let bytes = values
                .iter()
                .enumerate()
                .flat_map(|(i, &v)| poison(i, v).to_le_bytes())
                .collect();
            TensorView::owned(t.name.clone(), GgmlType::F32, t.shape.clone(), bytes)
                .expect("same shape")
        } else {
            t.clone()
        };
        out.insert(view).expect("distinct names");
    }
    assert!(found, "no tensor {name}");
    out
}

fn tiny_llama() -> (ModelConfig, Weights) {
    let source = open_model(&golden("tiny-llama")).expect("tiny-llama opens");
    (source.config, source.weights)
}

/// The last position's logits of a plain forward pass.
fn last_logits(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache_with(tokens.len(), KvDtype::F16);
    model
        .forward(tokens, 0, &mut cache, Logits::Last)
        .expect("forward")
}

const PROMPT: [u32; 6] = [0, 17, 42, 5, 99, 3];

#[test]
fn healthy_models_have_no_non_finite_stage() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        let source = open_model(&golden(name)).expect("opens");
        let model = Model::from_source(&source).expect("builds");
        let stage = model.first_non_finite(&PROMPT, KvDtype::F16).expect("runs");
        assert_eq!(stage, None, "{name}");
        assert!(last_logits(&model, &PROMPT).iter().all(|x| x.is_finite()));
    }
}

#[test]
fn the_first_poisoned_stage_is_named() {
    let (cfg, weights) = tiny_llama();
    let nan = |_: usize, _: f32| f32::NAN;
    let cases: Vec<(&str, Weights, NonFiniteStage)> = vec![
        (
            "embedding row of token 42",
            poisoned(&weights, "token_embd.weight", |i, v| {
                if i / cfg.hidden_size == 42 {
                    f32::NAN
                } else {
                    v
                }
            }),
            NonFiniteStage::Embedding,
        ),
        (
            "layer 0 value projection",
            poisoned(&weights, "blk.0.attn_v.weight", nan),
            NonFiniteStage::Layer(0),
        ),
        (
            "layer 1 down projection",
            poisoned(&weights, "blk.1.ffn_down.weight", nan),
            NonFiniteStage::Layer(1),
        ),
        (
            "one overflowing weight of layer 1",
            poisoned(&weights, "blk.1.ffn_up.weight", |i, v| {
                if i == 7 {
                    f32::INFINITY
                } else {
                    v
                }
            }),
            NonFiniteStage::Layer(1),
        ),
        (
            "final norm",
            poisoned(&weights, "output_norm.weight", nan),
            NonFiniteStage::OutputNorm,
        ),
        (
            "one row of the output head",
            poisoned(&weights, "output.weight", |i, v| {
                if i / cfg.hidden_size == 11 {
                    f32::INFINITY
                } else {
                    v
                }
            }),
            NonFiniteStage::OutputHead,
        ),
    ];
    for (what, w, want) in cases {
        let model = Model::from_weights(&cfg, &w).expect("builds");
        let got = model.first_non_finite(&PROMPT, KvDtype::F16).expect("runs");
        assert_eq!(got, Some(want), "{what}");
        assert!(
            last_logits(&model, &PROMPT).iter().any(|x| !x.is_finite()),
            "{what}: the forward pass should give non-finite logits too"
        );
    }
}

#[test]
fn a_poisoned_token_faults_only_the_sequences_that_contain_it() {
    let (cfg, weights) = tiny_llama();
    let w = poisoned(&weights, "token_embd.weight", |i, v| {
        if i / cfg.hidden_size == 42 {
            f32::NAN
        } else {
            v
        }
    });
    let model = Model::from_weights(&cfg, &w).expect("builds");
    let clean = [0u32, 17, 5, 99, 3];
    assert_eq!(
        model.first_non_finite(&clean, KvDtype::F32).expect("runs"),
        None
    );
    assert!(last_logits(&model, &clean).iter().all(|x| x.is_finite()));
    assert_eq!(
        model.first_non_finite(&PROMPT, KvDtype::F32).expect("runs"),
        Some(NonFiniteStage::Embedding)
    );
}

#[test]
fn an_empty_sequence_is_an_error() {
    let (cfg, weights) = tiny_llama();
    let model = Model::from_weights(&cfg, &weights).expect("builds");
    assert!(model.first_non_finite(&[], KvDtype::F16).is_err());
}
