//! Forward passes against Hugging Face transformers: tiny random-weight F32 models made by
//! `scripts/reference/make_goldens.py` (tests/golden/tiny-*), whose full logits transformers
//! computed. Covers Llama (with Llama 3 RoPE scaling), a sharded Llama, Qwen2 (QKV bias, tied
//! output) and Gemma 3 (sliding and global layers, QK-norm, pre/post norms).

use pagoda_model::arch::{Logits, Model};
use pagoda_model::open_model;
use std::path::PathBuf;

/// Largest |pagoda - transformers| logit difference accepted for F32 weights: both compute in
/// f32, differing only in summation order.
const F32_LOGIT_TOLERANCE: f32 = 2e-4;

fn golden_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name)
}

fn check_against_transformers(name: &str) {
    check_folder_against(name, name);
}

/// Checks the model in folder `name` against the logits recorded for folder `logits_of`.
fn check_folder_against(name: &str, logits_of: &str) {
    let dir = golden_dir(name);
    let logits_file = golden_dir(logits_of).join("logits.json");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(logits_file).expect("golden logits"))
            .expect("golden json");
    let tokens: Vec<u32> = serde_json::from_value(golden["token_ids"].clone()).expect("token ids");
    let expected: Vec<Vec<f32>> = serde_json::from_value(golden["logits"].clone()).expect("logits");
    let source = open_model(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let model = Model::from_source(&source).unwrap_or_else(|e| panic!("{name}: {e}"));
    let vocab = model.config().vocab_size;

    // All positions in one pass.
    let mut cache = model.new_cache(64);
    let all = model
        .forward(&tokens, 0, &mut cache, Logits::All)
        .expect("forward");
    assert_eq!(all.len(), tokens.len() * vocab);
    let mut worst = 0.0f32;
    for (t, want) in expected.iter().enumerate() {
        for (v, &w) in want.iter().enumerate() {
            worst = worst.max((all[t * vocab + v] - w).abs());
        }
    }
    assert!(
        worst < F32_LOGIT_TOLERANCE,
        "{name}: max logit difference {worst}"
    );

    // One token at a time through the cache gives the same logits (decode path).
    let mut cache = model.new_cache(64);
    for (t, &tok) in tokens.iter().enumerate() {
        let step = model
            .forward(&[tok], t, &mut cache, Logits::Last)
            .expect("step");
        let diff = step
            .iter()
            .zip(&expected[t])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            diff < F32_LOGIT_TOLERANCE,
            "{name}: position {t} decode difference {diff}"
        );
    }
}

#[test]
fn tiny_llama_matches_transformers() {
    check_against_transformers("tiny-llama");
}

#[test]
fn tiny_sharded_llama_matches_transformers() {
    // The same weights as tiny-llama, saved in ten shards with an index.
    check_folder_against("tiny-llama-sharded", "tiny-llama");
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_against_transformers("tiny-qwen2");
}

#[test]
fn tiny_gemma3_matches_transformers() {
    check_against_transformers("tiny-gemma3");
}
