//! One training step against PyTorch (`scripts/golden_distill.py` →
//! tests/golden/distill_step): on the tiny golden Llama and Qwen2, the same batch and fake
//! teacher top-k give the same loss (1e-5 relative) and the same gradients of named
//! parameters (max abs difference ≤ 1e-4 · max |grad|) for forward, reverse and skew KL mixed
//! with CE, and for a LoRA pair; two AdamW updates match `torch.optim.AdamW`.

use std::collections::{BTreeMap, HashMap};

use candle_core::{Device, Tensor, Var};
use pagoda_model::hf::canonical_name;
use pagoda_model::open_model;
use pagoda_train::lora::LoraSpec;
use pagoda_train::loss::{loss, Divergence, LossSpec, Targets};
use pagoda_train::optim::{AdamW, AdamWConfig};
use pagoda_train::student::{Student, TrainMode};
use serde_json::Value;

use crate::common::golden;

fn cases() -> Value {
    let text = std::fs::read_to_string(golden("distill_step").join("cases.json")).expect("cases");
    serde_json::from_str(&text).expect("json")
}

fn tensors() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(
        golden("distill_step").join("tensors.safetensors"),
        &Device::Cpu,
    )
    .expect("tensors")
}

fn to_vec(t: &Tensor) -> Vec<f32> {
    t.flatten_all().and_then(|t| t.to_vec1()).expect("values")
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .flat_map(|r| r.as_array().expect("row").iter())
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .flat_map(|r| r.as_array().expect("row").iter())
        .map(|x| x.as_f64().expect("value") as f32)
        .collect()
}

/// (ids [2, 10], targets, kd count, ce count) of the golden batch.
fn batch(meta: &Value, top_ids: &Value, top_lp: &Value) -> (Tensor, Targets, f64, f64) {
    let tokens = u32s(&meta["tokens"]);
    let lengths: Vec<usize> = meta["lengths"]
        .as_array()
        .expect("lengths")
        .iter()
        .map(|x| x.as_u64().expect("n") as usize)
        .collect();
    let k = meta["top_k"].as_u64().expect("k") as usize;
    let (mut kd, mut ce, mut next) = (vec![0f32; 20], vec![0f32; 20], vec![0u32; 20]);
    for (r, &n) in lengths.iter().enumerate() {
        for p in 0..n {
            kd[r * 10 + p] = 1.0;
            if p + 1 < n {
                ce[r * 10 + p] = 1.0;
                next[r * 10 + p] = tokens[r * 10 + p + 1];
            }
        }
    }
    let dev = &Device::Cpu;
    let kd_count = kd.iter().sum::<f32>() as f64;
    let ce_count = ce.iter().sum::<f32>() as f64;
    let targets = Targets {
        top_ids: Tensor::from_vec(u32s(top_ids), (20, k), dev).expect("ids"),
        top_logprobs: Tensor::from_vec(f32s(top_lp), (20, k), dev).expect("lp"),
        kd_mask: Tensor::from_vec(kd, 20, dev).expect("kd"),
        next: Tensor::from_vec(next, 20, dev).expect("next"),
        ce_mask: Tensor::from_vec(ce, 20, dev).expect("ce"),
    };
    let ids = Tensor::from_vec(tokens, (2, 10), dev).expect("tokens");
    (ids, targets, kd_count, ce_count)
}

fn check_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: sizes");
    let max = want.iter().map(|x| x.abs()).fold(0f32, f32::max);
    let diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max > 0.0, "{what}: the reference gradient is zero");
    assert!(
        diff <= 1e-4 * max,
        "{what}: max abs diff {diff}, max |grad| {max}"
    );
}

fn check_loss(what: &str, got: f64, want: f64) {
    let rel = (got - want).abs() / want.abs();
    assert!(
        rel < 1e-5,
        "{what}: loss {got}, PyTorch {want} (relative {rel})"
    );
}

#[test]
fn loss_and_gradients_match_pytorch() {
    let meta = cases();
    let golden_tensors = tensors();
    for case in meta["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let src = open_model(&golden(case["model"].as_str().expect("model"))).expect("model");
        let student = Student::load(&src, &TrainMode::Full, 0).expect("student");
        let (ids, targets, kd_count, ce_count) =
            batch(&meta, &case["top_ids"], &case["top_logprobs"]);
        let div = Divergence::parse(
            case["divergence"].as_str().expect("div"),
            case["skew_alpha"].as_f64().expect("alpha"),
        )
        .expect("divergence");
        let spec = LossSpec::new(
            div,
            case["temperature"].as_f64().expect("t"),
            case["hard_weight"].as_f64().expect("lambda"),
        )
        .expect("spec");
        let logits = student.forward(&ids).expect("forward");
        let logits = logits.reshape((20, src.config.vocab_size)).expect("flat");
        let parts = loss(&logits, &targets, &spec, kd_count, ce_count).expect("loss");
        let value = parts.total.to_scalar::<f32>().expect("scalar") as f64;
        check_loss(name, value, case["loss"].as_f64().expect("loss"));
        let grads = parts.total.backward().expect("backward");
        for hf in case["grads"].as_array().expect("grads") {
            let hf = hf.as_str().expect("name");
            let canonical = canonical_name(hf, src.config.arch).expect("canonical");
            let var = &student.trainable()[&canonical];
            let got = grads.get(var.as_tensor()).expect("gradient");
            let want = &golden_tensors[&format!("{name}/{hf}")];
            check_close(&format!("{name} {hf}"), &to_vec(got), &to_vec(want));
        }
    }
}

#[test]
fn lora_gradients_match_pytorch() {
    let meta = cases();
    let golden_tensors = tensors();
    let lora = &meta["lora"];
    let src = open_model(&golden("tiny-llama")).expect("model");
    let spec = LoraSpec::new(
        lora["rank"].as_u64().expect("r") as usize,
        lora["alpha"].as_f64().expect("alpha") as f32,
        "q,down",
    )
    .expect("spec");
    let student = Student::load(&src, &TrainMode::Lora(spec), 0).expect("student");
    let set = student.lora().expect("lora");
    let modules = [
        ("model.layers.0.self_attn.q_proj", 0, "attn_q"),
        ("model.layers.1.mlp.down_proj", 1, "ffn_down"),
    ];
    for (module, layer, short) in modules {
        let pair = set.get(layer, short).expect("pair");
        pair.a
            .set(&golden_tensors[&format!("lora_init/{module}.lora_A.weight")])
            .expect("A");
        pair.b
            .set(&golden_tensors[&format!("lora_init/{module}.lora_B.weight")])
            .expect("B");
    }
    let (ids, targets, kd_count, ce_count) = batch(&meta, &lora["top_ids"], &lora["top_logprobs"]);
    let spec = LossSpec::new(Divergence::Forward, 1.0, 0.0).expect("spec");
    let logits = student.forward(&ids).expect("forward");
    let logits = logits.reshape((20, src.config.vocab_size)).expect("flat");
    let parts = loss(&logits, &targets, &spec, kd_count, ce_count).expect("loss");
    check_loss(
        "lora",
        parts.total.to_scalar::<f32>().expect("scalar") as f64,
        lora["loss"].as_f64().expect("loss"),
    );
    let grads = parts.total.backward().expect("backward");
    for (module, layer, short) in modules {
        let pair = set.get(layer, short).expect("pair");
        for (var, which) in [(&pair.a, "lora_A"), (&pair.b, "lora_B")] {
            let got = grads.get(var.as_tensor()).expect("gradient");
            let want = &golden_tensors[&format!("lora/{module}.{which}.weight")];
            check_close(&format!("{module} {which}"), &to_vec(got), &to_vec(want));
        }
    }
    // No base weight is trainable in LoRA mode.
    assert!(student.trainable().keys().all(|k| k.contains(".lora_")));
}

#[test]
fn two_adamw_steps_match_torch() {
    let meta = cases();
    let golden_tensors = tensors();
    let adam = &meta["adam"];
    let src = open_model(&golden("tiny-llama")).expect("model");
    let student = Student::load(&src, &TrainMode::Full, 0).expect("student");
    let names: Vec<&str> = adam["params"]
        .as_array()
        .expect("params")
        .iter()
        .map(|p| p.as_str().expect("name"))
        .collect();
    let mut vars = BTreeMap::new();
    let mut grads = BTreeMap::new();
    for hf in &names {
        let canonical = canonical_name(hf, src.config.arch).expect("canonical");
        let var = student.trainable()[&canonical].clone();
        vars.insert(
            canonical.clone(),
            Var::from_tensor(var.as_tensor()).expect("var"),
        );
        grads.insert(
            canonical,
            golden_tensors[&format!("llama_forward/{hf}")].clone(),
        );
    }
    let betas = adam["betas"].as_array().expect("betas");
    let config = AdamWConfig {
        beta1: betas[0].as_f64().expect("b1"),
        beta2: betas[1].as_f64().expect("b2"),
        eps: adam["eps"].as_f64().expect("eps"),
        weight_decay: adam["weight_decay"].as_f64().expect("wd"),
    };
    let mut opt = AdamW::new(config, &vars).expect("adamw");
    let lr = adam["lr"].as_f64().expect("lr");
    for step in 1..=2 {
        let scaled: BTreeMap<String, Tensor> = grads
            .iter()
            .map(|(n, g)| (n.clone(), (g * step as f64).expect("scale")))
            .collect();
        opt.update(&vars, &scaled, lr).expect("update");
        for hf in &names {
            let canonical = canonical_name(hf, src.config.arch).expect("canonical");
            let got = to_vec(vars[&canonical].as_tensor());
            let want = to_vec(&golden_tensors[&format!("adam_step{step}/{hf}")]);
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-6, "step {step} {hf}: max abs diff {diff}");
        }
    }
}
