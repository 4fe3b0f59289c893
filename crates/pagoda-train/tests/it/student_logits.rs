//! The trainable student computes what Pagoda's own forward pass computes: logits of every
//! position within 1e-3 relative on the tiny golden Llama (Llama 3 RoPE scaling), Qwen2 (Q/K/V
//! biases, tied head) and a GGUF of the Llama (Q/K rows in llama.cpp's order, put back into
//! Hugging Face order on load), in both training modes (LoRA starts at the base model).

use candle_core::{Device, Tensor};
use pagoda_model::arch::{Logits, Model};
use pagoda_model::{open_model, KvDtype, ModelSource};
use pagoda_train::lora::LoraSpec;
use pagoda_train::student::{Student, TrainMode};

use crate::common::{gguf_of, golden, rel_diff};

const TOKENS: [[u32; 12]; 2] = [
    [1, 17, 42, 99, 3, 250, 7, 64, 128, 300, 5, 11],
    [2, 8, 19, 77, 140, 200, 31, 9, 63, 111, 222, 319],
];

fn pagoda_logits(src: &ModelSource, tokens: &[u32]) -> Vec<f32> {
    let model = Model::from_source(src).expect("model");
    let mut cache = model.new_cache_with(64, KvDtype::F32);
    model
        .forward(tokens, 0, &mut cache, Logits::All)
        .expect("forward")
}

fn check(src: &ModelSource, mode: &TrainMode) {
    let student = Student::load(src, mode, 7).expect("student");
    let flat: Vec<u32> = TOKENS.iter().flatten().copied().collect();
    let ids = Tensor::from_vec(flat, (2, 12), &Device::Cpu).expect("ids");
    let logits = student.forward(&ids).expect("forward");
    for (row, tokens) in TOKENS.iter().enumerate() {
        let got: Vec<f32> = logits
            .get(row)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1())
            .expect("row");
        let want = pagoda_logits(src, tokens);
        let rel = rel_diff(&got, &want);
        assert!(
            rel < 1e-3,
            "{}: relative difference {rel}",
            src.path.display()
        );
    }
}

#[test]
fn llama_folder_matches_pagoda_forward() {
    check(
        &open_model(&golden("tiny-llama")).expect("open"),
        &TrainMode::Full,
    );
}

#[test]
fn qwen2_folder_matches_pagoda_forward() {
    check(
        &open_model(&golden("tiny-qwen2")).expect("open"),
        &TrainMode::Full,
    );
}

#[test]
fn llama_gguf_matches_pagoda_forward() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = gguf_of("tiny-llama", dir.path());
    check(&open_model(&path).expect("open"), &TrainMode::Full);
}

#[test]
fn lora_student_starts_at_the_base_model() {
    let spec = LoraSpec::new(4, 8.0, "q,k,v,o,gate,up,down").expect("spec");
    check(
        &open_model(&golden("tiny-qwen2")).expect("open"),
        &TrainMode::Lora(spec),
    );
}

/// The real SmolLM2 GGUF from `PAGODA_TEST_SMOLLM2` (scripts/test.sh sets it); skipped with a
/// notice when unset, failing when `CI` is set.
fn smollm2_path() -> Option<std::path::PathBuf> {
    match std::env::var_os("PAGODA_TEST_SMOLLM2") {
        Some(p) if !p.is_empty() => Some(p.into()),
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "PAGODA_TEST_SMOLLM2 is not set; CI must test against the real model file"
            );
            eprintln!("skipping: set PAGODA_TEST_SMOLLM2 to the model's .gguf path");
            None
        }
    }
}

#[test]
fn smollm2_matches_pagoda_forward() {
    let Some(path) = smollm2_path() else { return };
    let src = open_model(&path).expect("smollm2");
    let student = Student::load(&src, &TrainMode::Full, 0).expect("student");
    let tokens: Vec<u32> = "The lighthouse keeper wrote in the logbook every night"
        .bytes()
        .map(|b| b as u32 + 200)
        .collect();
    let ids = Tensor::from_vec(tokens.clone(), (1, tokens.len()), &Device::Cpu).expect("ids");
    let logits = student.forward(&ids).expect("forward");
    let got: Vec<f32> = logits
        .flatten_all()
        .and_then(|t| t.to_vec1())
        .expect("logits");
    // Pagoda's forward on the same weights widened to F32 (the student trains on the
    // dequantized weights): the same function, so within 1e-3.
    let target = "f32".parse().expect("target");
    let options = pagoda_compress::quantize::QuantOptions { pure: true };
    let (f32_weights, _) =
        pagoda_compress::quantize::quantize_weights(&src.weights, target, &options)
            .expect("f32 weights");
    let model = Model::from_weights(&src.config, &f32_weights).expect("model");
    let mut cache = model.new_cache_with(64, KvDtype::F32);
    let want = model
        .forward(&tokens, 0, &mut cache, Logits::All)
        .expect("forward");
    let rel = rel_diff(&got, &want);
    assert!(
        rel < 1e-3,
        "relative difference {rel} against the F32 weights"
    );
    // On the Q4_1 / Q8_0 file itself Pagoda's kernels quantize activations to 8 bits for the
    // integer dot products, which moves the logits by a few percent (measured 4.4 %).
    let quantized = pagoda_logits(&src, &tokens);
    let rel_q = rel_diff(&got, &quantized);
    eprintln!("smollm2: {rel} against F32 weights, {rel_q} against the quantized kernels");
    assert!(
        rel_q < 0.1,
        "relative difference {rel_q} against the quantized kernels"
    );
}
