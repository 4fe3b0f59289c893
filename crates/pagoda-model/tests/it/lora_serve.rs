//! LoRA adapters served unmerged against transformers+peft: `scripts/golden_lora_logits.py`
//! saves two random adapters on tests/golden/tiny-llama (`alpha`: every linear, r=4;
//! `beta`: q/v, r=8, rsLoRA) and the logits peft gives for one token sequence with each.
//! Checked: the HF base with each adapter, the same base as a Llama GGUF would hold it (Q/K
//! rows permuted for interleaved RoPE, so B's Q/K rows must be permuted too), the merged
//! weights, one batch mixing both adapters and the base, and adapters that do not fit.

use pagoda_kernels::ops::RopeStyle;
use pagoda_kernels::GgmlType;
use pagoda_model::arch::{BatchSegment, Logits, LoraWeights, Model};
use pagoda_model::lora::LoraAdapter;
use pagoda_model::weights::{TensorView, Weights};
use pagoda_model::{hf, open_model, KvDtype, ModelConfig};
use std::path::PathBuf;

/// Same bound as forward_golden.rs: f32 weights and KV, only summation order differs.
const TOLERANCE: f32 = 2e-4;

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name)
}

struct Golden {
    tokens: Vec<u32>,
    logits: serde_json::Value,
}

fn peft_logits() -> Golden {
    let text = std::fs::read_to_string(golden("tiny-llama-lora/logits.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    Golden {
        tokens: serde_json::from_value(v["token_ids"].clone()).unwrap(),
        logits: v,
    }
}

impl Golden {
    fn of(&self, which: &str) -> Vec<f32> {
        let rows: Vec<Vec<f32>> = serde_json::from_value(self.logits[which].clone()).unwrap();
        rows.concat()
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn run(model: &Model, tokens: &[u32], adapter: Option<&LoraWeights>) -> Vec<f32> {
    let mut cache = model.new_cache_with(64, KvDtype::F32);
    model
        .forward_adapted(tokens, 0, &mut cache, Logits::All, adapter)
        .expect("forward")
}

/// The tiny Llama's weights with some tensors replaced by f32 values.
fn rebuilt(weights: &Weights, mut replace: impl FnMut(&TensorView) -> Option<Vec<f32>>) -> Weights {
    let mut out = Weights::new();
    for t in weights.iter() {
        let view = match replace(t) {
            Some(values) => {
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                TensorView::owned(t.name.clone(), GgmlType::F32, t.shape.clone(), bytes).unwrap()
            }
            None => t.clone(),
        };
        out.insert(view).unwrap();
    }
    out
}

/// llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py), written out:
/// `w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)`.
fn llama_cpp_permute(w: &[f32], n_head: usize, rows: usize, cols: usize) -> Vec<f32> {
    let half = rows / n_head / 2;
    let mut out = Vec::with_capacity(w.len());
    for h in 0..n_head {
        for i in 0..half {
            for s in 0..2 {
                let src = (h * 2 + s) * half + i;
                out.extend_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// The tiny Llama as its GGUF conversion holds it: Q/K rows permuted, interleaved RoPE.
fn gguf_style(cfg: &ModelConfig, weights: &Weights) -> Model {
    let w = rebuilt(weights, |t| {
        let heads = if t.name.ends_with("attn_q.weight") {
            cfg.n_heads
        } else if t.name.ends_with("attn_k.weight") {
            cfg.n_kv_heads
        } else {
            return None;
        };
        let v = t.to_f32().unwrap();
        Some(llama_cpp_permute(&v, heads, t.shape[0], t.shape[1]))
    });
    let mut cfg = cfg.clone();
    cfg.rope_style = RopeStyle::Interleaved;
    Model::from_weights(&cfg, &w).expect("gguf-style model")
}

#[test]
fn unmerged_adapters_match_peft_on_hf_and_gguf_layouts() {
    let g = peft_logits();
    let source = open_model(&golden("tiny-llama")).unwrap();
    let hf_model = Model::from_source(&source).unwrap();
    let gguf_model = gguf_style(&source.config, &source.weights);
    // The permuted layout computes the same base model.
    let base = g.of("base");
    for model in [&hf_model, &gguf_model] {
        let d = max_diff(&run(model, &g.tokens, None), &base);
        assert!(d < TOLERANCE, "base: {d}");
    }
    for name in ["alpha", "beta"] {
        let dir = golden("tiny-llama-lora").join(name);
        let want = g.of(name);
        assert!(max_diff(&want, &base) > 0.05, "{name} changes the logits");
        for (layout, model) in [("hf", &hf_model), ("gguf", &gguf_model)] {
            let a = LoraWeights::open(name, &dir, model).unwrap();
            let d = max_diff(&run(model, &g.tokens, Some(&a)), &want);
            assert!(d < TOLERANCE, "{name} on the {layout} layout: {d}");
        }
    }
    let alpha = LoraWeights::open("alpha", golden("tiny-llama-lora/alpha"), &gguf_model).unwrap();
    assert_eq!(alpha.modules().len(), 14, "7 linears x 2 layers");
    assert_eq!(alpha.rank(), 4);
}

#[test]
fn unmerged_equals_merged_weights() {
    let g = peft_logits();
    let source = open_model(&golden("tiny-llama")).unwrap();
    let model = Model::from_source(&source).unwrap();
    let dir = golden("tiny-llama-lora/beta");
    let adapter = LoraAdapter::open(&dir).unwrap();
    let merged_weights = rebuilt(&source.weights, |t| {
        let (module, _) = adapter.modules().find(|(m, _)| {
            hf::canonical_name(&format!("{m}.weight"), source.config.arch).as_deref()
                == Some(t.name.as_str())
        })?;
        let mut w = t.to_f32().unwrap();
        adapter
            .merge_module(module, &mut w, t.shape[0], t.shape[1])
            .unwrap();
        Some(w)
    });
    let merged = Model::from_weights(&source.config, &merged_weights).unwrap();
    let lora = LoraWeights::new("beta", &adapter, &model).unwrap();
    let d = max_diff(
        &run(&merged, &g.tokens, None),
        &run(&model, &g.tokens, Some(&lora)),
    );
    assert!(d < TOLERANCE, "merged vs unmerged: {d}");
}

#[test]
fn one_batch_serves_two_adapters_and_the_base() {
    let g = peft_logits();
    let source = open_model(&golden("tiny-llama")).unwrap();
    let model = Model::from_source(&source).unwrap();
    let alpha = LoraWeights::open("alpha", golden("tiny-llama-lora/alpha"), &model).unwrap();
    let beta = LoraWeights::open("beta", golden("tiny-llama-lora/beta"), &model).unwrap();
    let vocab = model.config().vocab_size;
    let adapters = [Some(&alpha), None, Some(&beta), Some(&alpha)];
    // Different lengths and prompts per segment; each alone for reference.
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| g.tokens[i..].to_vec()).collect();
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .zip(adapters)
        .map(|(p, a)| run(&model, p, a))
        .collect();
    let mut cache = model.new_paged_cache(16, 16, KvDtype::F32);
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
    // And the adapted rows really differ from the base.
    assert!(max_diff(&alone[0], &run(&model, &prompts[0], None)) > 0.05);
}

#[test]
fn adapters_that_do_not_fit_are_clear_errors() {
    let source = open_model(&golden("tiny-llama")).unwrap();
    let model = Model::from_source(&source).unwrap();
    // peft's other golden adapter was made for a hidden-32 Llama.
    let other = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/lora/adapter");
    let e = LoraWeights::open("x", &other, &model)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.layers.0.")
            && e.contains("[out 32, in 64]")
            && e.contains("another base model"),
        "{e}"
    );
    // A folder that is not an adapter.
    let e = LoraWeights::open("x", golden("tiny-llama"), &model)
        .unwrap_err()
        .to_string();
    assert!(e.contains("adapter_config.json"), "{e}");

    let tmp = tempfile::tempdir().unwrap();
    let copy = |to: &std::path::Path| {
        std::fs::create_dir_all(to).unwrap();
        for f in ["adapter_config.json", "adapter_model.safetensors"] {
            std::fs::copy(golden("tiny-llama-lora/beta").join(f), to.join(f)).unwrap();
        }
    };
    // A truncated tensor file.
    let cut = tmp.path().join("cut");
    copy(&cut);
    let st = cut.join("adapter_model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    let e = LoraWeights::open("cut", &cut, &model)
        .unwrap_err()
        .to_string();
    assert!(e.contains("adapter_model.safetensors"), "{e}");
    // DoRA.
    let dora = tmp.path().join("dora");
    copy(&dora);
    let cfg = dora.join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("\"use_dora\": false", "\"use_dora\": true");
    std::fs::write(&cfg, text).unwrap();
    let e = LoraWeights::open("dora", &dora, &model)
        .unwrap_err()
        .to_string();
    assert!(e.contains("DoRA"), "{e}");
    // An adapter prepared for one model is refused by a model of another shape.
    let beta = LoraWeights::open("beta", golden("tiny-llama-lora/beta"), &model).unwrap();
    let q = open_model(&golden("tiny-qwen2")).unwrap();
    let qwen = Model::from_source(&q).unwrap();
    assert!(!beta.fits(&qwen));
    let mut cache = qwen.new_cache_with(8, KvDtype::F32);
    let e = qwen
        .forward_adapted(&[1, 2], 0, &mut cache, Logits::Last, Some(&beta))
        .unwrap_err()
        .to_string();
    assert!(e.contains("another shape"), "{e}");
}

#[test]
fn embedding_targets_are_refused() {
    use pagoda_model::safetensors::write_safetensors;
    let source = open_model(&golden("tiny-llama")).unwrap();
    let model = Model::from_source(&source).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("adapter_config.json"),
        r#"{"r": 2, "lora_alpha": 4, "target_modules": ["lm_head"], "peft_type": "LORA"}"#,
    )
    .unwrap();
    let v = model.config().vocab_size;
    let d = model.config().hidden_size;
    let f32s = |n: usize| {
        (0..n)
            .flat_map(|_| 0.1f32.to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let bytes = write_safetensors(&[
        (
            "base_model.model.lm_head.lora_A.weight",
            "F32",
            vec![2, d],
            f32s(2 * d),
        ),
        (
            "base_model.model.lm_head.lora_B.weight",
            "F32",
            vec![v, 2],
            f32s(2 * v),
        ),
    ]);
    std::fs::write(tmp.path().join("adapter_model.safetensors"), bytes).unwrap();
    let e = LoraWeights::open("head", tmp.path(), &model)
        .unwrap_err()
        .to_string();
    assert!(e.contains("lm_head") && e.contains("not supported"), "{e}");
}
