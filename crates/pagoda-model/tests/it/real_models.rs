//! Tests against the real SmolLM2 and Gemma 3 GGUF files (paths in `PAGODA_TEST_SMOLLM2` /
//! `PAGODA_TEST_GEMMA3`; skipped with a notice when unset, failing when `CI` is set), and the
//! optional Qwen2.5-Coder-0.5B GGUF (`PAGODA_TEST_QWEN2`; CI does not fetch it, so it is
//! skipped whenever unset).

use pagoda_kernels::ops::RopeStyle;
use pagoda_model::{open_model, Architecture, ModelSource};
use std::path::PathBuf;
use std::sync::OnceLock;

pub fn model_path(var: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "{var} points at {} which is not a file",
                p.display()
            );
            Some(p)
        }
        _ => {
            if std::env::var_os("CI").is_some() {
                panic!("{var} is not set; CI must test against the real model file");
            }
            eprintln!("skipping: set {var} to the model's .gguf path to run this test");
            None
        }
    }
}

pub fn qwen2() -> Option<&'static ModelSource> {
    static M: OnceLock<Option<ModelSource>> = OnceLock::new();
    M.get_or_init(|| match std::env::var_os("PAGODA_TEST_QWEN2") {
        Some(p) if !p.is_empty() => Some(open_model(&PathBuf::from(p)).expect("open Qwen2.5")),
        _ => {
            eprintln!(
                "skipping: set PAGODA_TEST_QWEN2 to the Qwen2.5-Coder-0.5B .gguf to run this test"
            );
            None
        }
    })
    .as_ref()
}

pub fn smollm2() -> Option<&'static ModelSource> {
    static M: OnceLock<Option<ModelSource>> = OnceLock::new();
    M.get_or_init(|| {
        model_path("PAGODA_TEST_SMOLLM2").map(|p| open_model(&p).expect("open SmolLM2"))
    })
    .as_ref()
}

pub fn gemma3() -> Option<&'static ModelSource> {
    static M: OnceLock<Option<ModelSource>> = OnceLock::new();
    M.get_or_init(|| {
        model_path("PAGODA_TEST_GEMMA3").map(|p| open_model(&p).expect("open Gemma 3"))
    })
    .as_ref()
}

#[test]
fn smollm2_config_weights_and_info() {
    let Some(m) = smollm2() else { return };
    let c = &m.config;
    assert_eq!(c.arch, Architecture::Llama);
    assert_eq!(c.n_layers, 30);
    assert_eq!(c.hidden_size, 576);
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (9, 3, 64));
    assert_eq!(c.ffn_dim, 1536);
    assert_eq!(c.vocab_size, 49152);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.rope_style, RopeStyle::Interleaved);
    assert_eq!(c.rope_theta, 100000.0);
    assert_eq!(c.context_length, 8192);
    assert_eq!(c.norm_weight_offset, 0.0);
    assert!(c.layer_is_sliding.iter().all(|&s| !s));
    let emb = m.weights.get("token_embd.weight").unwrap();
    assert_eq!(emb.shape, vec![49152, 576]);
    assert_eq!(emb.ty, pagoda_kernels::GgmlType::Q8_0);
    let q = m.weights.get("blk.0.attn_k.weight").unwrap();
    assert_eq!(q.shape, vec![192, 576]);
    let norm = m
        .weights
        .get("blk.0.attn_norm.weight")
        .unwrap()
        .to_f32()
        .unwrap();
    assert_eq!(norm.len(), 576);
    assert!(norm.iter().all(|x| x.is_finite()));
    assert_eq!(m.weights.len(), 272);
    assert_eq!(m.info.file_type, "Q4_1");
    assert_eq!(m.info.architecture, "llama");
    assert!(
        (130_000_000..140_000_000).contains(&m.info.parameter_count),
        "{}",
        m.info.parameter_count
    );
    assert!(m.chat_template.is_some());
    assert_eq!(m.tokenizer.vocab_size(), 49152);
}

#[test]
fn gemma3_config_and_norms() {
    let Some(m) = gemma3() else { return };
    let c = &m.config;
    assert_eq!(c.arch, Architecture::Gemma3);
    assert_eq!(c.n_layers, 18);
    assert_eq!(c.hidden_size, 640);
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (4, 1, 256));
    assert_eq!(c.vocab_size, 262144);
    assert_eq!(c.sliding_window, Some(512));
    let globals: Vec<usize> = (0..18).filter(|&i| !c.layer_is_sliding[i]).collect();
    assert_eq!(globals, vec![5, 11, 17]);
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert_eq!(c.rope_theta_local, Some(10_000.0));
    assert_eq!(c.rope_style, RopeStyle::Neox);
    assert_eq!(c.attention_scale, 1.0 / 16.0);
    assert_eq!(c.embedding_scale, Some(640f32.sqrt()));
    assert!(c.tie_word_embeddings);
    // The converter baked the Gemma `1 + w` into the GGUF norm weights (see config/from_gguf.rs).
    assert_eq!(c.norm_weight_offset, 0.0);
    let ffn_norm = m
        .weights
        .get("blk.0.ffn_norm.weight")
        .unwrap()
        .to_f32()
        .unwrap();
    let min = ffn_norm.iter().cloned().fold(f32::INFINITY, f32::min);
    assert_eq!(
        min, 0.0,
        "a raw Gemma weight of -1 shifted by the converter's +1"
    );
    assert!(
        m.chat_template.is_none(),
        "the 270M base GGUF ships no template"
    );
    assert_eq!(m.info.file_type, "Q4_K_M");
}

#[test]
fn qwen2_config_and_biases() {
    let Some(m) = qwen2() else { return };
    let c = &m.config;
    assert_eq!(c.arch, Architecture::Qwen2);
    assert_eq!((c.n_layers, c.hidden_size, c.ffn_dim), (24, 896, 4864));
    assert_eq!((c.n_heads, c.n_kv_heads, c.head_dim), (14, 2, 64));
    assert_eq!(c.vocab_size, 151936);
    assert_eq!(c.rope_style, RopeStyle::Neox);
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert!(m.weights.contains("blk.0.attn_q.bias"));
    assert_eq!(m.weights.get("blk.0.attn_k.bias").unwrap().shape, vec![128]);
    let t = &m.tokenizer;
    assert!(t.eos_ids().contains(&t.token_to_id("<|im_end|>").unwrap()));
    assert!(t
        .eos_ids()
        .contains(&t.token_to_id("<|endoftext|>").unwrap()));
    let tmpl = m.chat_template.as_ref().expect("qwen2.5 ships a template");
    let s = tmpl
        .render(
            &[pagoda_model::chat_template::ChatMessage::new("user", "hi")],
            true,
        )
        .unwrap();
    assert!(
        s.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
        "{s}"
    );
}
