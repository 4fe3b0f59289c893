//! Forward passes against Hugging Face transformers: tiny random-weight F32 models made by
//! `scripts/reference/make_goldens.py` (tests/golden/tiny-*), whose full logits transformers
//! computed, with the K/V cache in f32 (and once in f16, to a looser bound). Covers Llama (with
//! Llama 3 RoPE scaling), a sharded Llama, Qwen2 (QKV bias, tied output) and Gemma 3 (sliding
//! and global layers, QK-norm, pre/post norms).

use pagoda_model::arch::{Logits, Model};
use pagoda_model::{open_model, KvDtype};
use std::path::PathBuf;

/// Largest |pagoda - transformers| logit difference accepted for F32 weights: both compute in
/// f32, differing only in summation order.
const F32_LOGIT_TOLERANCE: f32 = 2e-4;

/// Largest |pagoda - transformers| logit difference accepted with the K/V cache stored as f16
/// (llama.cpp's default; transformers keeps f32), as a fraction of the largest |logit|: f16
/// rounds each cached key and value by up to 2^-11 ≈ 4.9e-4 relative, and the logits inherit
/// errors of that order. Measured: 2.8e-4 (llama), 1.5e-4 (qwen2), 2.1e-4 (gemma3).
const F16_RELATIVE_LOGIT_TOLERANCE: f32 = 1e-3;

/// The same with K/V cached as FP8 E4M3 (scale 1): 3 mantissa bits round each cached value by
/// up to 2^-4 = 6.25 % relative, 128 times f16's; the logits of these tiny random models move
/// by a few percent of the largest. Measured: 3.2e-2 (llama), 1.8e-2 (qwen2), 2.9e-2 (gemma3).
const FP8_RELATIVE_LOGIT_TOLERANCE: f32 = 0.05;

fn golden_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name)
}

fn check_against_transformers(name: &str) {
    check_folder_against(name, name, KvDtype::F32, None);
}

/// Checks the model in folder `name`, its K/V cached as `dtype`, against the logits recorded
/// for folder `logits_of`: every |difference| below [`F32_LOGIT_TOLERANCE`], or below
/// `relative` times the largest |logit| when given.
fn check_folder_against(name: &str, logits_of: &str, dtype: KvDtype, relative: Option<f32>) {
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
    let largest = expected
        .iter()
        .flatten()
        .fold(0.0f32, |m, x| m.max(x.abs()));
    let tolerance = relative.map_or(F32_LOGIT_TOLERANCE, |r| r * largest);

    // All positions in one pass.
    let mut cache = model.new_cache_with(64, dtype);
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
        worst < tolerance,
        "{name} ({dtype:?} KV): max logit difference {worst} (largest logit {largest})"
    );

    // One token at a time through the cache gives the same logits (decode path).
    let mut cache = model.new_cache_with(64, dtype);
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
            diff < tolerance,
            "{name} ({dtype:?} KV): position {t} decode difference {diff}"
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
    check_folder_against("tiny-llama-sharded", "tiny-llama", KvDtype::F32, None);
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_against_transformers("tiny-qwen2");
}

#[test]
fn tiny_gemma3_matches_transformers() {
    check_against_transformers("tiny-gemma3");
}

#[test]
fn tiny_models_with_fp8_kv_match_transformers_within_fp8_rounding() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        check_folder_against(
            name,
            name,
            KvDtype::Fp8E4m3,
            Some(FP8_RELATIVE_LOGIT_TOLERANCE),
        );
    }
}

#[test]
fn tiny_models_with_f16_kv_match_transformers_within_f16_rounding() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        check_folder_against(name, name, KvDtype::F16, Some(F16_RELATIVE_LOGIT_TOLERANCE));
    }
}
