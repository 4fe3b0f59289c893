//! LoRA adapters served unmerged on a mixture-of-experts base, against transformers+peft:
//! `scripts/golden_lora_logits.py qwen3moe` saves, on tests/golden/tiny-qwen3moe (3 layers of
//! 8 experts, top-2), an adapter on the attention projections (`attn`: q/k/v/o, r=4, alpha 6)
//! and one on the router (`router`: peft's `target_parameters` ["gate.weight"], r=2, alpha 3),
//! with the logits and greedy continuations peft gives with each (routing checked decisive
//! under both), and an adapter on the experts (`experts`), which Pagoda refuses.
//!
//! Checked: the HF folder and llama.cpp's GGUF of it (Qwen3-MoE keeps Hugging Face's Q/K row
//! order, so no permutation) with each adapter, in one prefill, one token at a time, and
//! greedily; one batch mixing both adapters and the base (experts gather rows from several
//! segments); and adapters on experts, as peft writes them for transformers 5 (fused
//! parameters) and for transformers 4 (one module per expert), refused with the module named.

use pagoda_model::arch::{BatchSegment, Logits, LoraWeights, Model};
use pagoda_model::lora::LoraAdapter;
use pagoda_model::safetensors::write_safetensors;
use pagoda_model::{open_model, KvDtype};
use std::path::{Path, PathBuf};

/// As lora_serve.rs: f32 weights and KV, only summation order differs.
const TOLERANCE: f32 = 2e-4;

/// The adapters Pagoda serves on the MoE base.
const SERVED: [&str; 2] = ["attn", "router"];

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name)
}

fn adapter_dir(name: &str) -> PathBuf {
    golden("tiny-qwen3moe-lora").join(name)
}

struct Golden {
    v: serde_json::Value,
    tokens: Vec<u32>,
    prompts: Vec<Vec<u32>>,
}

impl Golden {
    fn read() -> Self {
        let text = std::fs::read_to_string(golden("tiny-qwen3moe-lora/logits.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        Golden {
            tokens: serde_json::from_value(v["token_ids"].clone()).unwrap(),
            prompts: serde_json::from_value(v["greedy_prompts"].clone()).unwrap(),
            v,
        }
    }

    /// `[n, vocab]` logits of `which` (`base` or an adapter), flattened.
    fn logits(&self, which: &str) -> Vec<f32> {
        let rows: Vec<Vec<f32>> = serde_json::from_value(self.v[which].clone()).unwrap();
        rows.concat()
    }

    fn greedy(&self, which: &str) -> Vec<Vec<u32>> {
        serde_json::from_value(self.v["greedy"][which].clone()).unwrap()
    }
}

/// The folder and the GGUF, by name.
fn models() -> [(&'static str, Model); 2] {
    ["tiny-qwen3moe", "tiny-qwen3moe.gguf"].map(|file| {
        let source = open_model(&golden(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(source.config.moe.is_some(), "{file} is a MoE model");
        (file, Model::from_source(&source).expect(file))
    })
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

fn prefill(model: &Model, tokens: &[u32], adapter: Option<&LoraWeights>) -> Vec<f32> {
    let mut cache = model.new_cache_with(64, KvDtype::F32);
    model
        .forward_adapted(tokens, 0, &mut cache, Logits::All, adapter)
        .expect("forward")
}

/// Every position's logits, one token at a time through the cache.
fn stepwise(model: &Model, tokens: &[u32], adapter: Option<&LoraWeights>) -> Vec<f32> {
    let mut cache = model.new_cache_with(64, KvDtype::F32);
    let mut out = Vec::new();
    for (t, &tok) in tokens.iter().enumerate() {
        out.extend(
            model
                .forward_adapted(&[tok], t, &mut cache, Logits::Last, adapter)
                .expect("step"),
        );
    }
    out
}

fn greedy(model: &Model, prompt: &[u32], n: usize, adapter: Option<&LoraWeights>) -> Vec<u32> {
    let mut cache = model.new_cache_with(64, KvDtype::F32);
    let mut logits = model
        .forward_adapted(prompt, 0, &mut cache, Logits::Last, adapter)
        .expect("prompt");
    let mut got = Vec::new();
    while got.len() < n {
        let next = argmax(&logits);
        got.push(next);
        logits = model
            .forward_adapted(
                &[next],
                prompt.len() + got.len() - 1,
                &mut cache,
                Logits::Last,
                adapter,
            )
            .expect("decode");
    }
    got
}

#[test]
fn attention_and_router_adapters_match_peft_on_the_moe_folder_and_gguf() {
    let g = Golden::read();
    let base = g.logits("base");
    for (file, model) in models() {
        let d = max_diff(&prefill(&model, &g.tokens, None), &base);
        assert!(d < TOLERANCE, "{file}: base: {d}");
        for name in SERVED {
            let want = g.logits(name);
            assert!(max_diff(&want, &base) > 0.1, "{name} changes the logits");
            let a = LoraWeights::open(name, adapter_dir(name), &model)
                .unwrap_or_else(|e| panic!("{file}: {name}: {e}"));
            let d_prefill = max_diff(&prefill(&model, &g.tokens, Some(&a)), &want);
            let d_steps = max_diff(&stepwise(&model, &g.tokens, Some(&a)), &want);
            eprintln!(
                "{file} + {name}: prefill {d_prefill:.2e}, one token at a time {d_steps:.2e}"
            );
            assert!(
                d_prefill < TOLERANCE,
                "{file} + {name}: prefill: {d_prefill}"
            );
            assert!(d_steps < TOLERANCE, "{file} + {name}: stepwise: {d_steps}");
            for (prompt, want) in g.prompts.iter().zip(g.greedy(name)) {
                let got = greedy(&model, prompt, want.len(), Some(&a));
                assert_eq!(got, want, "{file} + {name}: greedy after {prompt:?}");
            }
        }
        let attn = LoraWeights::open("attn", adapter_dir("attn"), &model).unwrap();
        assert_eq!(attn.modules().len(), 12, "{file}: 4 projections x 3 layers");
        assert!(attn.modules().iter().all(|m| m.contains(".attn_")));
        let router = LoraWeights::open("router", adapter_dir("router"), &model).unwrap();
        assert_eq!(
            router.modules(),
            (0..3)
                .map(|i| format!("blk.{i}.ffn_gate_inp.weight"))
                .collect::<Vec<_>>()
        );
        // Without the adapter the greedy continuations are the base's.
        for (prompt, want) in g.prompts.iter().zip(g.greedy("base")) {
            assert_eq!(greedy(&model, prompt, want.len(), None), want, "{file}");
        }
    }
}

#[test]
fn one_moe_batch_serves_two_adapters_and_the_base() {
    let g = Golden::read();
    let (_, model) = models().into_iter().next().unwrap();
    let attn = LoraWeights::open("attn", adapter_dir("attn"), &model).unwrap();
    let router = LoraWeights::open("router", adapter_dir("router"), &model).unwrap();
    let vocab = model.config().vocab_size;
    let adapters = [Some(&attn), None, Some(&router), Some(&attn)];
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| g.tokens[i * 2..].to_vec()).collect();
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .zip(adapters)
        .map(|(p, a)| prefill(&model, p, a))
        .collect();
    let mut cache = model.new_paged_cache(8, 32, KvDtype::F32);
    let tables: Vec<Vec<u32>> = (0..4).map(|i| vec![i as u32]).collect();
    let segments: Vec<BatchSegment<'_>> = prompts
        .iter()
        .zip(&tables)
        .zip(adapters)
        .map(|((p, t), a)| BatchSegment {
            tokens: p,
            start: 0,
            block_table: t,
            logits: Some(Logits::All),
            adapter: a,
            state_slot: None,
        })
        .collect();
    let out = model.forward_batch(&segments, &mut cache).unwrap();
    let mut row = 0;
    for (i, want) in alone.iter().enumerate() {
        let got = &out[row * vocab..row * vocab + want.len()];
        row += want.len() / vocab;
        let d = max_diff(got, want);
        assert!(d < 1e-4, "segment {i}: batched differs from alone by {d}");
    }
    assert!(max_diff(&alone[0], &prefill(&model, &prompts[0], None)) > 0.1);
    assert!(max_diff(&alone[2], &prefill(&model, &prompts[2], None)) > 0.1);
}

/// The error of loading adapter folder `dir` on `model`.
fn refusal(dir: &Path, model: &Model) -> String {
    LoraWeights::open("x", dir, model)
        .map(|_| ())
        .expect_err("the adapter must be refused")
        .to_string()
}

#[test]
fn peft_adapters_on_fused_experts_are_refused() {
    // transformers 5 stores experts as 3-D parameters; peft adapts them through
    // target_parameters and saves pairs of rank r x n_experts under `mlp.experts`.
    let dir = adapter_dir("experts");
    let e = LoraAdapter::open(&dir)
        .map(|_| ())
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("module model.layers.0.mlp.experts")
            && e.contains("experts of a mixture-of-experts model is not supported"),
        "{e}"
    );
    for (file, model) in models() {
        let e = refusal(&dir, &model);
        assert!(
            e.contains("model.layers.0.mlp.experts") && e.contains("not supported"),
            "{file}: {e}"
        );
    }
}

/// A transformers 4 style adapter (one `nn.Linear` per expert) on layer 0's `q_proj` and on
/// expert 3's `gate_proj`: r=2, values 0.1.
fn per_expert_adapter(dir: &Path, model: &Model) {
    let cfg = model.config();
    let (d, f) = (cfg.hidden_size, cfg.moe.as_ref().unwrap().expert_ffn_dim);
    let q = cfg.n_heads * cfg.head_dim;
    std::fs::write(
        dir.join("adapter_config.json"),
        r#"{"r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "gate_proj"], "peft_type": "LORA"}"#,
    )
    .unwrap();
    let t = |name: &str, shape: [usize; 2]| {
        let bytes: Vec<u8> = (0..shape[0] * shape[1])
            .flat_map(|_| 0.1f32.to_le_bytes())
            .collect();
        (
            format!("base_model.model.model.layers.0.{name}.weight"),
            "F32",
            shape.to_vec(),
            bytes,
        )
    };
    let tensors = [
        t("self_attn.q_proj.lora_A", [2, d]),
        t("self_attn.q_proj.lora_B", [q, 2]),
        t("mlp.experts.3.gate_proj.lora_A", [2, d]),
        t("mlp.experts.3.gate_proj.lora_B", [f, 2]),
    ];
    let refs: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, dt, s, b)| (n.as_str(), *dt, s.clone(), b.clone()))
        .collect();
    std::fs::write(
        dir.join("adapter_model.safetensors"),
        write_safetensors(&refs),
    )
    .unwrap();
}

#[test]
fn adapters_on_per_expert_linears_are_refused_not_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    for (file, model) in models() {
        per_expert_adapter(tmp.path(), &model);
        // The file itself is a well-formed adapter (merge-lora may fold it into the weights).
        let adapter = LoraAdapter::open(tmp.path()).unwrap();
        assert_eq!(adapter.modules().count(), 2);
        let e = refusal(tmp.path(), &model);
        assert!(
            e.contains("module model.layers.0.mlp.experts.3.gate_proj")
                && e.contains("experts of a mixture-of-experts model is not supported"),
            "{file}: {e}"
        );
    }
}
