//! The model families added on the family specs (crates/pagoda-model/src/family/), each
//! against two references Pagoda did not write, made by `scripts/reference/golden_families.py`:
//! - the tiny random-weight Hugging Face folder `tests/golden/tiny-FAMILY/` against the
//!   logits and greedy continuations transformers computed on it (`logits.json`);
//! - the GGUF llama.cpp's own converter made of that folder (`tiny-FAMILY.gguf`) against the
//!   logits and greedy continuations of the vendored llama.cpp (`tiny-FAMILY.llamacpp.json`).
//!
//! Every position's logits in one prefill and again one token at a time through the cache,
//! and the greedy continuation of each prompt token for token.

use pagoda_kernels::ops::RopeStyle;
use pagoda_model::arch::{Logits, Model};
use pagoda_model::{open_model, Architecture, KvDtype, ModelConfig, RopeScaling};
use std::path::{Path, PathBuf};

/// Largest |pagoda - reference| logit difference accepted for F32 weights and an F32 K/V
/// cache: both compute in f32, differing in summation order (as in forward_golden.rs; the
/// references differ from each other by 2e-5 on these files).
const F32_LOGIT_TOLERANCE: f32 = 2e-4;

/// The same against llama.cpp for a family whose graph uses GELU: ggml's CPU GELU reads an
/// f16 table (`GGML_GELU_FP16`), about 5e-4 relative error per activation, which moves these
/// tiny models' logits by up to 1.2e-2 (the golden script shows llama.cpp agreeing with
/// transformers to 1e-3 once transformers uses the same table). Pagoda's GELU is exact, so
/// these files are also checked against transformers at [`F32_LOGIT_TOLERANCE`].
const GELU_TABLE_TOLERANCE: f32 = 3e-2;

struct Golden {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    prompts: Vec<Vec<u32>>,
    greedy: Vec<Vec<u32>>,
}

fn golden_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

fn read_golden(path: &Path) -> Golden {
    read_golden_variant(path, "")
}

/// As [`read_golden`], with the logits and greedy continuations of the sub-object at JSON
/// pointer `variant` (the same tokens and prompts computed another way); `""` for the file's.
fn read_golden_variant(path: &Path, variant: &str) -> Golden {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let v: serde_json::Value = serde_json::from_str(&text).expect("golden json");
    let field = |k: &str| v[k].clone();
    let result = v.pointer(variant).expect("golden variant");
    Golden {
        tokens: serde_json::from_value(field("token_ids")).expect("token_ids"),
        logits: serde_json::from_value(result["logits"].clone()).expect("logits"),
        prompts: serde_json::from_value(field("greedy_prompts")).expect("greedy_prompts"),
        greedy: serde_json::from_value(result["greedy"].clone()).expect("greedy"),
    }
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

/// Loads `model_path`, checks its config with `check_config`, and compares it with `golden`.
fn check(model_path: &Path, golden_path: &Path, check_config: impl Fn(&ModelConfig)) {
    check_within(model_path, golden_path, F32_LOGIT_TOLERANCE, check_config)
}

/// [`check`] with logits within `tolerance`.
fn check_within(
    model_path: &Path,
    golden_path: &Path,
    tolerance: f32,
    check_config: impl Fn(&ModelConfig),
) {
    check_golden(
        model_path,
        &read_golden(golden_path),
        tolerance,
        check_config,
    )
}

/// Loads `model_path`, checks its config with `check_config`, and compares it with `golden`:
/// logits within `tolerance`, greedy continuations exactly.
fn check_golden(
    model_path: &Path,
    golden: &Golden,
    tolerance: f32,
    check_config: impl Fn(&ModelConfig),
) {
    let name = model_path.display();
    let source = open_model(model_path).unwrap_or_else(|e| panic!("{name}: {e}"));
    check_config(&source.config);
    let model = Model::from_source(&source).unwrap_or_else(|e| panic!("{name}: {e}"));
    let vocab = model.config().vocab_size;

    let mut cache = model.new_cache_with(64, KvDtype::F32);
    let all = model
        .forward(&golden.tokens, 0, &mut cache, Logits::All)
        .expect("forward");
    let mut cache = model.new_cache_with(64, KvDtype::F32);
    for (t, want) in golden.logits.iter().enumerate() {
        let prefill_worst = want
            .iter()
            .zip(&all[t * vocab..(t + 1) * vocab])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            prefill_worst < tolerance,
            "{name}: position {t}: prefill logits differ by {prefill_worst}"
        );
        let step = model
            .forward(&[golden.tokens[t]], t, &mut cache, Logits::Last)
            .expect("step");
        let decode_worst = want
            .iter()
            .zip(&step)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            decode_worst < tolerance,
            "{name}: position {t}: decode logits differ by {decode_worst}"
        );
    }

    check_greedy(
        &model,
        &name.to_string(),
        &golden.prompts,
        &golden.greedy,
        64,
    );
}

/// Each prompt's greedy continuation (as long as the reference's) equals the reference's;
/// `capacity` positions of f32 K/V.
fn check_greedy(
    model: &Model,
    name: &str,
    prompts: &[Vec<u32>],
    greedy: &[Vec<u32>],
    capacity: usize,
) {
    for (prompt, want) in prompts.iter().zip(greedy) {
        let mut cache = model.new_cache_with(capacity, KvDtype::F32);
        let mut logits = model
            .forward(prompt, 0, &mut cache, Logits::Last)
            .expect("prompt");
        let mut got = Vec::new();
        while got.len() < want.len() {
            let next = argmax(&logits);
            got.push(next);
            logits = model
                .forward(
                    &[next],
                    prompt.len() + got.len() - 1,
                    &mut cache,
                    Logits::Last,
                )
                .expect("decode");
        }
        assert_eq!(&got, want, "{name}: greedy continuation of {prompt:?}");
    }
}

fn hf(family: &str, check_config: impl Fn(&ModelConfig)) {
    let dir = golden_root().join(format!("tiny-{family}"));
    check(&dir, &dir.join("logits.json"), check_config);
}

fn gguf(family: &str, check_config: impl Fn(&ModelConfig)) {
    let root = golden_root();
    check(
        &root.join(format!("tiny-{family}.gguf")),
        &root.join(format!("tiny-{family}.llamacpp.json")),
        check_config,
    );
}

fn qwen3_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::Qwen3);
    // head_dim is its own key: 32, not hidden / heads = 16.
    assert_eq!((c.head_dim, c.n_heads, c.n_kv_heads), (32, 4, 2));
    assert_eq!(c.rope_style, RopeStyle::Neox);
    assert!(c.tie_word_embeddings);
}

#[test]
fn qwen3_folder_matches_transformers() {
    hf("qwen3", qwen3_shape);
}

#[test]
fn qwen3_gguf_matches_llama_cpp() {
    gguf("qwen3", qwen3_shape);
}

fn smollm3_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::SmolLM3);
    assert_eq!(c.layer_uses_rope, vec![true, true, true, false]);
}

#[test]
fn smollm3_folder_matches_transformers() {
    hf("smollm3", |c| {
        smollm3_shape(c);
        assert_eq!(c.rope_style, RopeStyle::Neox);
    });
}

#[test]
fn smollm3_gguf_matches_llama_cpp() {
    gguf("smollm3", |c| {
        smollm3_shape(c);
        // llama.cpp's converter permutes SmolLM3's Q/K rows as Llama's.
        assert_eq!(c.rope_style, RopeStyle::Interleaved);
    });
}

#[test]
fn llama31_gguf_from_llama_cpps_converter_matches_llama_cpp() {
    // The converter carries Llama 3 RoPE scaling as the rope_freqs.weight tensor.
    gguf("llama31", |c| {
        assert_eq!(c.arch, Architecture::Llama);
        assert_eq!(c.rope_style, RopeStyle::Interleaved);
    });
}

fn mistral3_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::Mistral3);
    let t = c.query_temperature.expect("query temperature");
    assert_eq!((t.beta, t.original_context), (0.1, 16));
    // mscale == mscale_all_dim: YaRN's attention factor is 1, not 0.1 ln(4) + 1.
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Yarn { factor, attention_factor, original_max_position: 16, .. }
            if factor == 4.0 && attention_factor == 1.0
    ));
}

#[test]
fn mistral3_folder_matches_transformers() {
    // Positions 16.. of the prompts run with the query temperature above 1.
    hf("mistral3", mistral3_shape);
}

#[test]
fn mistral3_gguf_matches_llama_cpp() {
    gguf("mistral3", |c| {
        mistral3_shape(c);
        assert_eq!(c.rope_style, RopeStyle::Interleaved);
    });
}

fn phi3_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::Phi3);
    // Partial rotary: 3/4 of a 16-wide head.
    assert_eq!((c.head_dim, c.rope_dim), (16, 12));
    match &c.rope_scaling {
        RopeScaling::LongRope {
            long_factor,
            original_max_position,
            attention_factor,
            ..
        } => {
            assert_eq!(long_factor, &[1.0, 1.5, 2.0, 3.0, 4.0, 6.0]);
            assert_eq!(*original_max_position, 16);
            // sqrt(1 + ln(256 / 16) / ln(16)) = sqrt(2).
            assert!(
                (attention_factor - 2f32.sqrt()).abs() < 1e-6,
                "{attention_factor}"
            );
        }
        other => panic!("LongRoPE expected, got {other:?}"),
    }
}

#[test]
fn phi3_folder_matches_transformers() {
    // Fused qkv_proj and gate_up_proj, split into views when the folder is opened.
    hf("phi3", phi3_shape);
}

#[test]
fn phi3_gguf_matches_llama_cpp() {
    gguf("phi3", phi3_shape);
}

#[test]
fn phi3_fused_projections_are_split_into_the_canonical_tensors() {
    let source = open_model(&golden_root().join("tiny-phi3.gguf")).expect("open");
    let w = &source.weights;
    for t in ["attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"] {
        assert!(w.contains(&format!("blk.0.{t}.weight")), "{t}");
    }
    assert!(!w.contains("blk.0.attn_qkv.weight"));
    assert_eq!(
        w.get("blk.0.ffn_up.weight").expect("up").shape,
        vec![128, 64]
    );
    assert_eq!(w.get("blk.1.attn_k.weight").expect("k").shape, vec![32, 64]);
}

fn gemma4_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::Gemma4);
    // Sliding layers: 32-wide heads fully rotated, base 10 000; global layers 64-wide.
    assert_eq!((c.head_dim, c.rope_dim, c.n_kv_heads), (32, 32, 2));
    assert_eq!(c.rope_theta_local, Some(10_000.0));
    assert_eq!(c.attention_scale, 1.0);
    assert_eq!(c.final_logit_softcap, Some(30.0));
    assert_eq!(
        c.layer_is_sliding,
        vec![true, false, true, false, true, false]
    );
    let g = c.variants.global.expect("global layers");
    assert_eq!((g.head_dim, g.n_kv_heads, g.rope_dim), (64, 2, 64));
    // Shared-KV layers 4 and 5 attend over layers 2 and 3 and have double-wide MLPs.
    assert_eq!(c.variants.kv_shared, 2);
    assert_eq!((c.kv_source(4), c.kv_source(5)), (Some(2), Some(3)));
    assert_eq!(c.layer_ffn_dim(3), 128);
    assert_eq!(c.layer_ffn_dim(4), 256);
    assert_eq!(c.variants.per_layer_input, Some(16));
}

#[test]
fn gemma4_folder_matches_transformers() {
    // Per-layer embeddings, shared K/V, proportional RoPE (a quarter of the global heads'
    // pairs rotate), layer output scales.
    hf("gemma4", |c| {
        gemma4_shape(c);
        assert_eq!(c.variants.global.expect("global").rotated_dim, 16);
    });
}

#[test]
fn gemma4_gguf_matches_transformers_and_llama_cpp() {
    let root = golden_root();
    let file = root.join("tiny-gemma4.gguf");
    // The converter's rope_freqs.weight (1e30 past the rotated pairs) stops the rest.
    let shape = |c: &ModelConfig| {
        gemma4_shape(c);
        assert_eq!(c.variants.global.expect("global").rotated_dim, 64);
    };
    check(&file, &root.join("tiny-gemma4/logits.json"), shape);
    check_within(
        &file,
        &root.join("tiny-gemma4.llamacpp.json"),
        GELU_TABLE_TOLERANCE,
        shape,
    );
}

fn gemma4_keqv_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::Gemma4);
    assert_eq!(c.layer_is_sliding, vec![true, true, false, true, false]);
    let g = c.variants.global.expect("global layers");
    // attention_k_eq_v: one KV head on global layers, V from K's projection.
    assert_eq!((g.head_dim, g.n_kv_heads), (64, 1));
    assert_eq!(c.variants.kv_shared, 0);
    assert_eq!(c.variants.per_layer_input, None);
}

#[test]
fn gemma4_k_eq_v_folder_matches_transformers() {
    hf("gemma4-keqv", gemma4_keqv_shape);
}

#[test]
fn gemma4_k_eq_v_gguf_matches_transformers_and_llama_cpp() {
    let root = golden_root();
    let file = root.join("tiny-gemma4-keqv.gguf");
    check(
        &file,
        &root.join("tiny-gemma4-keqv/logits.json"),
        gemma4_keqv_shape,
    );
    check_within(
        &file,
        &root.join("tiny-gemma4-keqv.llamacpp.json"),
        GELU_TABLE_TOLERANCE,
        gemma4_keqv_shape,
    );
}

fn qwen3moe_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::Qwen3Moe);
    let moe = c.moe.as_ref().expect("experts");
    assert_eq!((moe.n_experts, moe.n_used, moe.expert_ffn_dim), (8, 2, 32));
    assert!(moe.normalize_top_k);
    assert!((0..c.n_layers).all(|i| c.layer_is_moe(i)));
}

#[test]
fn qwen3moe_folder_matches_transformers() {
    // Per-expert tensors in the folder; routing decisive on every golden token (the golden
    // script checks the gap between the 2nd and 3rd router logits).
    hf("qwen3moe", qwen3moe_shape);
}

#[test]
fn qwen3moe_gguf_matches_llama_cpp() {
    // Stacked expert tensors, opened as one view per expert.
    gguf("qwen3moe", qwen3moe_shape);
}

fn qwen2moe_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::Qwen2Moe);
    let moe = c.moe.as_ref().expect("experts");
    assert_eq!((moe.n_experts, moe.n_used, moe.expert_ffn_dim), (8, 2, 32));
    // The shared expert has its own width (48, not the experts' 32 or the unused dense 128).
    assert_eq!(moe.shared_ffn_dim, Some(48));
    assert!(!moe.normalize_top_k);
}

#[test]
fn qwen2moe_folder_matches_transformers() {
    // The shared expert and its sigmoid gate move these logits by 2.6 and 2.2 (logits.json):
    // dropping either fails this.
    hf("qwen2moe", qwen2moe_shape);
}

#[test]
fn qwen2moe_gguf_matches_llama_cpp() {
    // `ffn_gate_inp_shexp` stored as `[hidden, 1]`; `ffn_*_shexp` beside the stacked experts.
    gguf("qwen2moe", qwen2moe_shape);
}

fn olmoe_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::Olmoe);
    let moe = c.moe.as_ref().expect("experts");
    assert_eq!((moe.n_experts, moe.n_used, moe.expert_ffn_dim), (8, 2, 32));
    // OLMoE's weights are the softmax's as they are (transformers' norm_topk_prob false;
    // llama.cpp never renormalizes for olmoe).
    assert!(!moe.normalize_top_k);
}

#[test]
fn olmoe_folder_matches_transformers() {
    // QK-norm over the whole projection, not per head.
    hf("olmoe", olmoe_shape);
}

#[test]
fn olmoe_gguf_matches_llama_cpp() {
    gguf("olmoe", olmoe_shape);
}

fn gpt_oss_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::GptOss);
    assert_eq!(c.layer_is_sliding, vec![true, false, true, false]);
    assert_eq!(c.sliding_window, Some(8));
    let moe = c.moe.as_ref().expect("experts");
    assert_eq!((moe.n_experts, moe.n_used), (8, 2));
    assert_eq!(moe.gating, pagoda_model::config::Gating::SoftmaxOfTopK);
    assert!(!moe.normalize_top_k);
}

#[test]
fn gpt_oss_folder_matches_transformers() {
    // Sinks, biases, fused interleaved gate/up experts, the clamped SwiGLU (some gates past
    // the limit), YaRN with `truncate: false`.
    hf("gpt-oss", |c| {
        gpt_oss_shape(c);
        assert!(matches!(
            c.rope_scaling,
            RopeScaling::Yarn {
                truncate: false,
                ..
            }
        ));
    });
}

#[test]
fn gpt_oss_gguf_matches_llama_cpp() {
    // llama.cpp rounds YaRN's ramp (no truncate key in GGUF): so does Pagoda for GGUF.
    gguf("gpt-oss", |c| {
        gpt_oss_shape(c);
        assert!(matches!(
            c.rope_scaling,
            RopeScaling::Yarn { truncate: true, .. }
        ));
    });
}

/// gpt-oss with MXFP4 experts: Pagoda and llama.cpp both multiply MXFP4 weights by
/// activations quantized to Q8_0 per 32 values (llama.cpp's CPU `vec_dot_type`, Pagoda's
/// integer kernels), which moves these tiny models' logits by up to 0.11 from transformers'
/// f32 products. So the folder is checked against transformers with the expert inputs rounded
/// the same way (the golden script's `q8_0_expert_activations`) and the GGUF against
/// llama.cpp, both at the f32 bound (measured: within 1e-5).
fn gpt_oss_mxfp4_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::GptOss);
    assert_eq!(c.layer_is_sliding, vec![true, false]);
    let moe = c.moe.as_ref().expect("experts");
    assert_eq!((moe.n_experts, moe.n_used, moe.expert_ffn_dim), (8, 2, 96));
}

/// Every expert matrix of `source`, by name, with its type and bytes.
fn expert_tensors(
    source: &pagoda_model::ModelSource,
) -> std::collections::BTreeMap<String, (pagoda_kernels::GgmlType, Vec<u8>)> {
    source
        .weights
        .iter()
        .filter(|t| t.name.contains("_exp") && t.name.ends_with(".weight"))
        .map(|t| (t.name.clone(), (t.ty, t.data().to_vec())))
        .collect()
}

#[test]
fn gpt_oss_mxfp4_experts_load_as_mxfp4_from_both_files_with_the_same_bytes() {
    // The HF folder's _blocks/_scales (converted by Pagoda) and llama.cpp's converted GGUF
    // (stacked MXFP4, opened as views) hold the same blocks: nothing was dequantized.
    let root = golden_root();
    let hf = open_model(&root.join("tiny-gpt-oss-mxfp4")).expect("folder");
    let gguf = open_model(&root.join("tiny-gpt-oss-mxfp4.gguf")).expect("gguf");
    let (a, b) = (expert_tensors(&hf), expert_tensors(&gguf));
    assert_eq!(a.len(), 2 * 8 * 3, "{:?}", a.keys().collect::<Vec<_>>());
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, (ty, bytes)) in &a {
        assert_eq!(*ty, pagoda_kernels::GgmlType::Mxfp4, "{name}");
        assert!(b[name] == (*ty, bytes.clone()), "{name}: bytes differ");
    }
}

#[test]
fn gpt_oss_mxfp4_folder_matches_transformers() {
    let dir = golden_root().join("tiny-gpt-oss-mxfp4");
    let golden = read_golden_variant(&dir.join("logits.json"), "/mxfp4/q8_0_expert_activations");
    check_golden(&dir, &golden, F32_LOGIT_TOLERANCE, |c| {
        gpt_oss_mxfp4_shape(c);
        assert!(matches!(
            c.rope_scaling,
            RopeScaling::Yarn {
                truncate: false,
                ..
            }
        ));
    });
}

#[test]
fn gpt_oss_mxfp4_gguf_matches_llama_cpp() {
    let root = golden_root();
    check_within(
        &root.join("tiny-gpt-oss-mxfp4.gguf"),
        &root.join("tiny-gpt-oss-mxfp4.llamacpp.json"),
        F32_LOGIT_TOLERANCE,
        gpt_oss_mxfp4_shape,
    );
}

#[test]
fn a_mixture_of_experts_reports_the_parameters_a_token_reads() {
    // 3 layers × 8 experts × (gate, up, down: 3 × 64 × 32); a token reads 2 of the 8.
    let experts = 3 * 8 * 3 * 64 * 32u64;
    for file in ["tiny-qwen3moe", "tiny-qwen3moe.gguf"] {
        let source = open_model(&golden_root().join(file)).expect("open");
        let info = &source.info;
        assert_eq!(
            info.active_parameter_count,
            info.parameter_count - experts * 6 / 8,
            "{file}"
        );
    }
    let dense = open_model(&golden_root().join("tiny-qwen3")).expect("open");
    assert_eq!(
        dense.info.active_parameter_count,
        dense.info.parameter_count
    );
}

/// A hybrid golden (`golden_families.py` `qwen35`, `qwen35moe`, `lfm2`): 180 tokens (past
/// the chunk boundaries 64 and 128), full logits rows at `logit_positions`, every
/// position's argmax, and greedy continuations (the last prompt 120 tokens long).
struct HybridGolden {
    tokens: Vec<u32>,
    positions: Vec<usize>,
    rows: Vec<Vec<f32>>,
    argmax: Vec<u32>,
    prompts: Vec<Vec<u32>>,
    greedy: Vec<Vec<u32>>,
}

fn read_hybrid_golden(path: &Path) -> HybridGolden {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let v: serde_json::Value = serde_json::from_str(&text).expect("golden json");
    let f = |k: &str| v[k].clone();
    HybridGolden {
        tokens: serde_json::from_value(f("token_ids")).expect("token_ids"),
        positions: serde_json::from_value(f("logit_positions")).expect("logit_positions"),
        rows: serde_json::from_value(f("logits_at_positions")).expect("logits_at_positions"),
        argmax: serde_json::from_value(f("argmax")).expect("argmax"),
        prompts: serde_json::from_value(f("greedy_prompts")).expect("greedy_prompts"),
        greedy: serde_json::from_value(f("greedy")).expect("greedy"),
    }
}

/// A hybrid model against `golden`: the stored rows in one prefill, in chunks of 50 (the
/// recurrent state carried across passes), and a token at a time; every position's argmax;
/// the greedy continuations.
fn check_hybrid(model_path: &Path, golden_path: &Path, check_config: impl Fn(&ModelConfig)) {
    let name = model_path.display();
    let g = read_hybrid_golden(golden_path);
    let source = open_model(model_path).unwrap_or_else(|e| panic!("{name}: {e}"));
    check_config(&source.config);
    let model = Model::from_source(&source).unwrap_or_else(|e| panic!("{name}: {e}"));
    let vocab = model.config().vocab_size;
    let n = g.tokens.len();
    let compare = |how: &str, logits_of: &dyn Fn(usize) -> Vec<f32>| {
        let mut max = 0.0f32;
        for (p, want) in g.positions.iter().zip(&g.rows) {
            let got = logits_of(*p);
            let worst = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst < F32_LOGIT_TOLERANCE,
                "{name}: {how}: position {p}: logits differ by {worst}"
            );
            max = max.max(worst);
        }
        eprintln!("{name}: {how}: max abs logit difference {max}");
    };
    let mut cache = model.new_cache_with(256, KvDtype::F32);
    let all = model
        .forward(&g.tokens, 0, &mut cache, Logits::All)
        .expect("forward");
    compare("one prefill", &|p| all[p * vocab..(p + 1) * vocab].to_vec());
    for (p, want) in g.argmax.iter().enumerate() {
        assert_eq!(
            argmax(&all[p * vocab..(p + 1) * vocab]),
            *want,
            "{name}: argmax at {p}"
        );
    }
    let mut cache = model.new_cache_with(256, KvDtype::F32);
    let mut chunked = Vec::with_capacity(n * vocab);
    for start in (0..n).step_by(50) {
        let end = (start + 50).min(n);
        chunked.extend(
            model
                .forward(&g.tokens[start..end], start, &mut cache, Logits::All)
                .expect("chunk"),
        );
    }
    compare("chunks of 50", &|p| {
        chunked[p * vocab..(p + 1) * vocab].to_vec()
    });
    let mut cache = model.new_cache_with(256, KvDtype::F32);
    let mut stepped = Vec::with_capacity(n * vocab);
    for (t, &tok) in g.tokens.iter().enumerate() {
        stepped.extend(
            model
                .forward(&[tok], t, &mut cache, Logits::Last)
                .expect("step"),
        );
    }
    compare("a token at a time", &|p| {
        stepped[p * vocab..(p + 1) * vocab].to_vec()
    });
    check_greedy(&model, &name.to_string(), &g.prompts, &g.greedy, 256);
}

fn lfm2_shape(c: &ModelConfig) {
    use pagoda_model::config::Mixer::{Attention, ShortConv};
    assert_eq!(c.arch, Architecture::Lfm2);
    let h = c.hybrid.as_ref().expect("hybrid");
    assert_eq!(
        h.mixers,
        vec![ShortConv, ShortConv, Attention, ShortConv, ShortConv, Attention]
    );
    assert_eq!((h.conv_kernel, c.ffn_dim, c.n_kv_heads), (3, 96, 2));
}

#[test]
fn lfm2_folder_matches_transformers() {
    let dir = golden_root().join("tiny-lfm2");
    check_hybrid(&dir, &dir.join("logits.json"), lfm2_shape);
}

#[test]
fn lfm2_gguf_matches_llama_cpp() {
    let root = golden_root();
    check_hybrid(
        &root.join("tiny-lfm2.gguf"),
        &root.join("tiny-lfm2.llamacpp.json"),
        lfm2_shape,
    );
}

fn lfm2moe_shape(c: &ModelConfig) {
    assert_eq!(c.arch, Architecture::Lfm2Moe);
    assert!(c.hybrid.is_some());
    let moe = c.moe.as_ref().expect("experts");
    assert_eq!((moe.n_experts, moe.n_used, moe.expert_ffn_dim), (8, 2, 32));
    assert_eq!(moe.gating, pagoda_model::config::Gating::Sigmoid);
    assert!(moe.normalize_top_k);
    // Two leading dense layers (SwiGLU of 96), then experts.
    assert_eq!(moe.layers, vec![false, false, true, true, true, true]);
    assert_eq!(c.ffn_dim, 96);
}

#[test]
fn lfm2moe_folder_matches_transformers() {
    // The selection bias changes 61 % of the golden's routings and moves the logits by 5.5
    // if ignored, 2.4 if the weights came from the biased scores (logits.json).
    let dir = golden_root().join("tiny-lfm2moe");
    check_hybrid(&dir, &dir.join("logits.json"), lfm2moe_shape);
}

#[test]
fn lfm2moe_gguf_matches_llama_cpp() {
    let root = golden_root();
    check_hybrid(
        &root.join("tiny-lfm2moe.gguf"),
        &root.join("tiny-lfm2moe.llamacpp.json"),
        lfm2moe_shape,
    );
}

fn granite4h_shape(c: &ModelConfig) {
    use pagoda_model::config::Mixer::{Attention, Mamba2};
    assert_eq!(c.arch, Architecture::GraniteHybrid);
    let h = c.hybrid.as_ref().expect("hybrid");
    assert_eq!(h.mixers, vec![Mamba2, Mamba2, Attention, Mamba2]);
    let m = h.mamba2.expect("Mamba-2 shape");
    assert_eq!(
        (
            m.n_heads,
            m.head_dim,
            m.state_dim,
            m.n_groups,
            h.conv_kernel
        ),
        (8, 16, 16, 2, 4)
    );
    assert_eq!(
        (c.ffn_dim, c.n_heads, c.n_kv_heads, c.head_dim),
        (128, 4, 2, 16)
    );
    assert_eq!(c.layer_uses_rope, vec![false; 4]);
    assert_eq!(
        (
            c.embedding_scale,
            c.attention_scale,
            c.residual_scale,
            c.logit_scale
        ),
        (Some(3.0), 0.5, Some(0.5), Some(2.0))
    );
    assert!(c.tie_word_embeddings);
}

#[test]
fn granite4h_folder_matches_transformers() {
    let dir = golden_root().join("tiny-granite4h");
    check_hybrid(&dir, &dir.join("logits.json"), granite4h_shape);
}

#[test]
fn granite4h_gguf_matches_llama_cpp() {
    let root = golden_root();
    check_hybrid(
        &root.join("tiny-granite4h.gguf"),
        &root.join("tiny-granite4h.llamacpp.json"),
        granite4h_shape,
    );
}

#[test]
fn granite4h_configs_it_cannot_run_are_refused_by_name() {
    check_refusals(
        "tiny-granite4h",
        &[
            ("num_local_experts", serde_json::json!(4), "experts"),
            (
                "mamba_proj_bias",
                serde_json::json!(true),
                "mamba_proj_bias",
            ),
            (
                "layer_types",
                serde_json::json!(["mamba", "conv", "attention", "mamba"]),
                "conv",
            ),
            (
                "time_step_limit",
                serde_json::json!([1.0, 0.5]),
                "time_step_limit",
            ),
        ],
    );
}

fn qwen35_shape(c: &ModelConfig) {
    use pagoda_model::config::Mixer::{Attention, GatedDeltaNet};
    assert_eq!(c.arch, Architecture::Qwen35);
    let h = c.hybrid.as_ref().expect("hybrid");
    assert_eq!(
        h.mixers,
        vec![GatedDeltaNet, GatedDeltaNet, GatedDeltaNet, Attention]
    );
    let d = h.delta_net.expect("DeltaNet shape");
    assert_eq!(
        (h.conv_kernel, d.n_k_heads, d.n_v_heads, d.d_k, d.d_v),
        (4, 2, 4, 16, 16)
    );
    assert_eq!((c.head_dim, c.rope_dim, c.n_kv_heads), (32, 8, 2));
}

#[test]
fn qwen35_folder_matches_transformers() {
    let dir = golden_root().join("tiny-qwen35");
    check_hybrid(&dir, &dir.join("logits.json"), qwen35_shape);
}

#[test]
fn qwen35_gguf_matches_llama_cpp() {
    let root = golden_root();
    check_hybrid(
        &root.join("tiny-qwen35.gguf"),
        &root.join("tiny-qwen35.llamacpp.json"),
        qwen35_shape,
    );
}

fn qwen35moe_shape(c: &ModelConfig) {
    use pagoda_model::config::Mixer::{Attention, GatedDeltaNet};
    assert_eq!(c.arch, Architecture::Qwen35Moe);
    let h = c.hybrid.as_ref().expect("hybrid");
    assert_eq!(
        h.mixers,
        vec![GatedDeltaNet, GatedDeltaNet, GatedDeltaNet, Attention]
    );
    let moe = c.moe.as_ref().expect("experts");
    assert_eq!(
        (
            moe.n_experts,
            moe.n_used,
            moe.expert_ffn_dim,
            moe.shared_ffn_dim
        ),
        (8, 2, 16, Some(16))
    );
    assert!(moe.normalize_top_k, "Qwen3.5-MoE always renormalizes");
    assert!(moe.layers.iter().all(|&sparse| sparse));
}

/// The folder stores its experts fused (`mlp.experts.gate_up_proj`, as Qwen3.5-35B-A3B
/// does); the golden's logits move by 1.9 without renormalizing the top k and by 4.3 without
/// the shared expert, so a router or shared-expert slip cannot pass.
#[test]
fn qwen35moe_folder_matches_transformers() {
    let dir = golden_root().join("tiny-qwen35moe");
    check_hybrid(&dir, &dir.join("logits.json"), qwen35moe_shape);
}

#[test]
fn qwen35moe_gguf_matches_llama_cpp() {
    let root = golden_root();
    check_hybrid(
        &root.join("tiny-qwen35moe.gguf"),
        &root.join("tiny-qwen35moe.llamacpp.json"),
        qwen35moe_shape,
    );
}

#[test]
fn lfm2_configs_it_cannot_run_are_refused_by_name() {
    check_refusals(
        "tiny-lfm2",
        &[
            ("sliding_window", serde_json::json!(128), "sliding_window"),
            ("conv_bias", serde_json::json!(true), "conv_bias"),
            (
                "layer_types",
                serde_json::json!(["conv", "mamba", "conv", "conv", "conv", "full_attention"]),
                "mamba",
            ),
        ],
    );
}

#[test]
fn qwen35_configs_it_cannot_run_are_refused_by_name() {
    check_refusals(
        "tiny-qwen35",
        &[
            ("attention_bias", serde_json::json!(true), "attention_bias"),
            (
                "layer_types",
                serde_json::json!([
                    "linear_attention",
                    "mamba",
                    "linear_attention",
                    "full_attention"
                ]),
                "mamba",
            ),
            ("linear_num_value_heads", serde_json::json!(3), "multiple"),
        ],
    );
}

/// A copy of the golden folder `golden` with each `(key, value)` set in its config.json in
/// turn is refused with an error containing `needle`.
fn check_refusals(golden: &str, cases: &[(&str, serde_json::Value, &str)]) {
    let src = golden_root().join(golden);
    let dir = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(&src).expect("golden folder") {
        let p = entry.expect("entry").path();
        std::fs::copy(&p, dir.path().join(p.file_name().expect("name"))).expect("copy");
    }
    let config = dir.path().join("config.json");
    let original: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).expect("config")).expect("json");
    for (key, value, needle) in cases {
        let mut c = original.clone();
        c[*key] = value.clone();
        std::fs::write(&config, c.to_string()).expect("write");
        let err = open_model(dir.path()).expect_err(key).to_string();
        assert!(err.contains(needle), "{golden}: {key}: {err}");
    }
}
