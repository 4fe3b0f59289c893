//! Bad model files are input like any other: each broken file gives an error that names the
//! file and the key or tensor at fault, never a panic or an out-of-bounds read.

use crate::common::*;
use pagoda_model::gguf::{GgufArray, GgufFile, GgufValue, GgufWriter};
use pagoda_model::{open_model, ModelError};
use std::path::{Path, PathBuf};

struct Tmp {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn write_tmp(bytes: &[u8]) -> Tmp {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken-model.gguf");
    std::fs::write(&path, bytes).unwrap();
    Tmp { _dir: dir, path }
}

/// Opens `bytes` from a file and returns the error message, which must name the file.
fn open_err(bytes: &[u8]) -> String {
    let t = write_tmp(bytes);
    let e = match GgufFile::open(&t.path) {
        Ok(_) => match open_model(&t.path) {
            Ok(_) => panic!("file opened without error"),
            Err(e) => e,
        },
        Err(e) => e,
    }
    .to_string();
    assert!(
        e.contains("broken-model.gguf"),
        "error does not name the file: {e}"
    );
    e
}

fn assert_has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "{msg:?} should mention {p:?}");
    }
}

#[test]
fn the_valid_tiny_model_opens() {
    let t = write_tmp(&tiny_llama().to_bytes());
    let m = open_model(&t.path).unwrap();
    assert_eq!(m.config.hidden_size, HIDDEN);
    assert!(m.config.tie_word_embeddings);
    assert_eq!(m.weights.len(), 3);
    assert_eq!(m.tokenizer.encode("ab a", false).unwrap(), vec![4, 6]);
    assert_eq!(m.tokenizer.eos_ids(), &[0, 7]);
}

#[test]
fn truncated_anywhere_is_an_error() {
    let bytes = tiny_llama().to_bytes();
    for cut in [
        0,
        3,
        4,
        7,
        8,
        20,
        24,
        30,
        100,
        500,
        bytes.len() / 2,
        bytes.len() - 1,
    ] {
        let e = open_err(&bytes[..cut]);
        assert!(
            e.contains("truncated")
                || e.contains("past the end")
                || e.contains("claims")
                || e.contains("not a GGUF"),
            "cut at {cut}: {e}"
        );
    }
    // Cutting into the last tensor's data names that tensor.
    let e = open_err(&bytes[..bytes.len() - 10]);
    assert_has(&e, &["blk.0.attn_q.weight", "past the end"]);
}

#[test]
fn header_counts_beyond_the_file() {
    let mut b = tiny_llama().to_bytes();
    put_u64(&mut b, 8, 1 << 40); // tensor count
    assert_has(&open_err(&b), &["tensor count", "claims"]);
    let mut b = tiny_llama().to_bytes();
    put_u64(&mut b, 16, u64::MAX); // metadata count
    assert_has(&open_err(&b), &["metadata count", "claims"]);
    let mut b = tiny_llama().to_bytes();
    put_u64(&mut b, 16, 40); // a few more KVs than present: runs into the tensor table
    open_err(&b);
}

#[test]
fn string_length_beyond_the_end() {
    let mut b = tiny_llama().to_bytes();
    put_u64(&mut b, 24, 1 << 50); // the first key's length
    assert_has(&open_err(&b), &["metadata key #0", "string"]);
    let mut b = tiny_llama().to_bytes();
    let at = find(&b, b"tiny") - 8; // the value of general.name
    put_u64(&mut b, at, u64::MAX);
    assert_has(&open_err(&b), &["general.name"]);
}

#[test]
fn absurd_array_count() {
    let b0 = tiny_llama().to_bytes();
    let key = b"tokenizer.ggml.token_type";
    let count_at = find(&b0, key) + key.len() + 4 + 4;
    for n in [u64::MAX, 1 << 40, 1_000_000] {
        let mut b = b0.clone();
        put_u64(&mut b, count_at, n);
        assert_has(&open_err(&b), &["tokenizer.ggml.token_type", "claims"]);
    }
}

#[test]
fn deeply_nested_arrays_are_refused() {
    let mut a = GgufArray::I32(vec![1]);
    for _ in 0..20 {
        a = GgufArray::Array(vec![a]);
    }
    let mut w = tiny_llama();
    w.add_metadata("x.nested", GgufValue::Array(a));
    assert_has(&open_err(&w.to_bytes()), &["x.nested", "deeper"]);
}

#[test]
fn tensor_offsets_past_end_misaligned_and_overlapping() {
    let b0 = tiny_llama().to_bytes();
    let (_, _, _, off) = tensor_info_fields(&b0, "blk.0.attn_q.weight");
    let mut b = b0.clone();
    put_u64(&mut b, off, 1 << 40);
    assert_has(&open_err(&b), &["blk.0.attn_q.weight", "past the end"]);
    let mut b = b0.clone();
    put_u64(&mut b, off, u64::MAX - 31);
    assert_has(&open_err(&b), &["blk.0.attn_q.weight"]);
    let mut b = b0.clone();
    put_u64(&mut b, off, 4);
    assert_has(&open_err(&b), &["blk.0.attn_q.weight", "alignment"]);
    let mut b = b0.clone();
    put_u64(&mut b, off, 0); // on top of token_embd.weight
    assert_has(&open_err(&b), &["overlaps"]);
}

#[test]
fn partial_blocks_unknown_types_and_bad_dims() {
    let b0 = tiny_llama().to_bytes();
    let (n_dims, ne0, ty, _) = tensor_info_fields(&b0, "blk.0.attn_q.weight");
    let mut b = b0.clone();
    put_u64(&mut b, ne0, 33);
    assert_has(
        &open_err(&b),
        &["blk.0.attn_q.weight", "whole number of 32-element blocks"],
    );
    let mut b = b0.clone();
    put_u32(&mut b, ty, 99);
    assert_has(
        &open_err(&b),
        &["blk.0.attn_q.weight", "unknown tensor type id 99"],
    );
    let mut b = b0.clone();
    put_u32(&mut b, ty, 4); // the removed Q4_2
    assert_has(&open_err(&b), &["unknown tensor type id 4"]);
    let mut b = b0.clone();
    put_u32(&mut b, n_dims, 7);
    assert_has(&open_err(&b), &["blk.0.attn_q.weight", "dimensions"]);
    let mut b = b0;
    put_u64(&mut b, ne0, u64::MAX);
    assert_has(&open_err(&b), &["blk.0.attn_q.weight"]);
}

#[test]
fn versions_and_magic() {
    let mut b = tiny_llama().to_bytes();
    put_u32(&mut b, 4, 1);
    assert_has(&open_err(&b), &["version 1 is not supported"]);
    let mut b = tiny_llama().to_bytes();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert_has(&open_err(&b), &["big-endian"]);
    let mut b = tiny_llama().to_bytes();
    put_u32(&mut b, 4, 2); // v2 has the same layout
    let t = write_tmp(&b);
    assert_eq!(GgufFile::open(&t.path).unwrap().version(), 2);
    let mut b = tiny_llama().to_bytes();
    b[0] = b'X';
    assert_has(&open_err(&b), &["not a GGUF file"]);
    assert_has(&open_err(&[]), &["truncated"]);
}

#[test]
fn duplicate_tensor_and_key_names() {
    let b0 = tiny_llama().to_bytes();
    // Rename output_norm.weight's info to token_embd.weight? Same length needed: use a key.
    let mut b = b0.clone();
    let at = find(&b, b"general.name");
    b[at..at + b"general.name".len()].copy_from_slice(b"general.arch");
    // Now two keys read "general.arch..." — only if lengths match; general.architecture is 20.
    let _ = GgufFile::from_bytes("dup.gguf", b); // must not panic either way
    let mut w = GgufWriter::new();
    w.add_f32_tensor("aaaa", &[1], &[1.0]).unwrap();
    w.add_f32_tensor("bbbb", &[1], &[1.0]).unwrap();
    let mut b = w.to_bytes();
    let at = find(&b, b"bbbb");
    b[at..at + 4].copy_from_slice(b"aaaa");
    let e = GgufFile::from_bytes("dup.gguf", b).unwrap_err().to_string();
    assert_has(&e, &["dup.gguf", "aaaa", "twice"]);
}

#[test]
fn wrong_metadata_types_name_the_key() {
    let mut w = tiny_llama();
    w.add_str("llama.block_count", "thirty");
    let e = open_err(&w.to_bytes());
    assert_has(&e, &["llama.block_count", "string"]);
    let mut w = tiny_llama();
    w.add_metadata("llama.embedding_length", GgufValue::I32(-5));
    assert_has(&open_err(&w.to_bytes()), &["llama.embedding_length", "-5"]);
    let mut w = tiny_llama();
    w.add_u32("llama.attention.head_count_kv", 3);
    assert_has(&open_err(&w.to_bytes()), &["KV heads"]);
}

#[test]
fn unknown_architecture_names_file_and_arch() {
    let mut w = tiny_llama();
    w.add_str("general.architecture", "gptj");
    let e = open_err(&w.to_bytes());
    assert_has(&e, &["gptj", "unsupported architecture"]);
}

#[test]
fn missing_tokenizer() {
    // Rebuild without tokenizer keys.
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama")
        .add_u32("llama.block_count", 1)
        .add_u32("llama.embedding_length", 32)
        .add_u32("llama.attention.head_count", 2)
        .add_u32("llama.feed_forward_length", 64)
        .add_u32("llama.vocab_size", 8)
        .add_str("tokenizer.ggml.model", "gpt2");
    let e = open_err(&w.to_bytes());
    assert_has(&e, &["tokenizer.ggml.tokens", "missing"]);
    let mut w = tiny_llama();
    w.add_str("tokenizer.ggml.model", "wordpiece9");
    assert_has(&open_err(&w.to_bytes()), &["wordpiece9"]);
    let mut w = tiny_llama();
    w.add_str_array("tokenizer.ggml.merges", vec!["nospace".into()]);
    assert_has(
        &open_err(&w.to_bytes()),
        &["tokenizer.ggml.merges", "nospace"],
    );
    let mut w = tiny_llama();
    w.add_u32("tokenizer.ggml.eos_token_id", 1000);
    assert_has(
        &open_err(&w.to_bytes()),
        &["tokenizer.ggml.eos_token_id", "1000"],
    );
}

fn hf_dir(files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, data) in files {
        std::fs::write(dir.path().join(name), data).unwrap();
    }
    dir
}

fn tiny_hf_config() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "hidden_size": 4,
        "num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 3,
        "tie_word_embeddings": true
    }))
    .unwrap()
}

fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect()
}

fn tiny_tokenizer_json() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"<s>": 0, "hi": 1, "there": 2}, "unk_token": "<s>"}
    }))
    .unwrap()
}

#[test]
fn hf_folder_opens_and_maps_names() {
    use pagoda_model::safetensors::write_safetensors;
    let st = write_safetensors(&[
        (
            "model.embed_tokens.weight",
            "F32",
            vec![3, 4],
            f32_bytes(12),
        ),
        ("model.norm.weight", "F32", vec![4], f32_bytes(4)),
        (
            "model.layers.0.self_attn.q_proj.weight",
            "BF16",
            vec![4, 4],
            vec![0; 32],
        ),
        (
            "model.layers.0.post_attention_layernorm.weight",
            "F16",
            vec![4],
            vec![0; 8],
        ),
    ]);
    let dir = hf_dir(&[
        ("config.json", tiny_hf_config()),
        ("model.safetensors", st),
        ("tokenizer.json", tiny_tokenizer_json()),
        (
            "tokenizer_config.json",
            br#"{"bos_token": "<s>", "add_bos_token": true, "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"}"#.to_vec(),
        ),
        ("generation_config.json", br#"{"temperature": 0.6, "top_p": 0.9, "top_k": 20}"#.to_vec()),
    ]);
    let m = open_model(dir.path()).unwrap();
    assert_eq!(m.format, pagoda_model::ModelFormat::HfFolder);
    assert_eq!(
        m.weights.get("token_embd.weight").unwrap().shape,
        vec![3, 4]
    );
    assert!(m.weights.contains("output_norm.weight"));
    assert!(m.weights.contains("blk.0.attn_q.weight"));
    assert!(m.weights.contains("blk.0.ffn_norm.weight"));
    assert_eq!(m.tokenizer.encode("hi there", true).unwrap(), vec![0, 1, 2]);
    assert_eq!(m.tokenizer.encode("hi there", false).unwrap(), vec![1, 2]);
    let t = m.chat_template.as_ref().unwrap();
    let s = t
        .render(
            &[pagoda_model::chat_template::ChatMessage::new("user", "yo")],
            false,
        )
        .unwrap();
    assert_eq!(s, "<s>yo");
    assert_eq!(m.generation.temperature, Some(0.6));
    assert_eq!(m.generation.top_k, Some(20));
    assert_eq!(m.info.parameter_count, 12 + 4 + 16 + 4);
}

#[test]
fn hf_folder_errors() {
    use pagoda_model::safetensors::write_safetensors;
    let st = write_safetensors(&[(
        "model.embed_tokens.weight",
        "F32",
        vec![3, 4],
        f32_bytes(12),
    )]);
    // No tokenizer.json.
    let dir = hf_dir(&[
        ("config.json", tiny_hf_config()),
        ("model.safetensors", st.clone()),
    ]);
    let e = open_model(dir.path()).unwrap_err();
    assert!(matches!(e, ModelError::TokenizerFile { .. }), "{e}");
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
    // Truncated safetensors names the shard and the tensor.
    let dir = hf_dir(&[
        ("config.json", tiny_hf_config()),
        ("model.safetensors", st[..st.len() - 4].to_vec()),
        ("tokenizer.json", tiny_tokenizer_json()),
    ]);
    let e = open_model(dir.path()).unwrap_err().to_string();
    assert_has(&e, &["model.safetensors", "model.embed_tokens.weight"]);
    // Two names mapping to one canonical tensor.
    let st2 = write_safetensors(&[
        (
            "model.embed_tokens.weight",
            "F32",
            vec![3, 4],
            f32_bytes(12),
        ),
        ("embed_tokens.weight", "F32", vec![3, 4], f32_bytes(12)),
    ]);
    let dir = hf_dir(&[
        ("config.json", tiny_hf_config()),
        ("model.safetensors", st2),
        ("tokenizer.json", tiny_tokenizer_json()),
    ]);
    let e = open_model(dir.path()).unwrap_err().to_string();
    assert_has(&e, &["token_embd.weight"]);
    // Unknown architecture names config.json.
    let dir = hf_dir(&[(
        "config.json",
        br#"{"architectures": ["GPTJForCausalLM"]}"#.to_vec(),
    )]);
    let e = open_model(dir.path()).unwrap_err().to_string();
    assert_has(&e, &["config.json", "GPTJForCausalLM"]);
    // Garbage header JSON.
    let mut bad = 5u64.to_le_bytes().to_vec();
    bad.extend_from_slice(b"{{{{{");
    let dir = hf_dir(&[
        ("config.json", tiny_hf_config()),
        ("model.safetensors", bad),
        ("tokenizer.json", tiny_tokenizer_json()),
    ]);
    let e = open_model(dir.path()).unwrap_err().to_string();
    assert_has(&e, &["model.safetensors", "JSON"]);
    let _ = Path::new("");
}

/// The tiny Hugging Face folders in tests/golden/ were written by transformers 5
/// (`scripts/reference/make_goldens.py tiny`): their config, tokenizer and template must load
/// as transformers reads them.
#[test]
fn transformers_written_tiny_folders() {
    use pagoda_model::chat_template::ChatMessage;
    use pagoda_model::{Architecture, RopeScaling};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden");
    for (name, arch) in [
        ("tiny-llama", Architecture::Llama),
        ("tiny-llama-sharded", Architecture::Llama),
        ("tiny-qwen2", Architecture::Qwen2),
        ("tiny-gemma3", Architecture::Gemma3),
    ] {
        let dir = root.join(name);
        let m = open_model(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let c = &m.config;
        assert_eq!(c.arch, arch, "{name}");
        assert_eq!(c.rope_style, pagoda_kernels::ops::RopeStyle::Neox);
        assert_eq!(c.vocab_size, 320);
        match arch {
            Architecture::Llama => {
                assert!(!c.tie_word_embeddings && m.weights.contains("output.weight"));
                assert!(
                    matches!(c.rope_scaling, RopeScaling::Llama3 { factor, original_max_position: 64, .. } if factor == 8.0)
                );
            }
            Architecture::Qwen2 => {
                assert!(c.tie_word_embeddings);
                assert_eq!(c.rope_theta, 1_000_000.0);
                assert!(m.weights.contains("blk.0.attn_q.bias"));
            }
            Architecture::Gemma3 => {
                assert_eq!(c.layer_is_sliding, vec![true, false, true]);
                assert_eq!(c.sliding_window, Some(4));
                assert_eq!(c.rope_theta_local, Some(10_000.0));
                assert_eq!(c.attention_scale, 1.0 / 24f32.sqrt());
                assert_eq!(c.norm_weight_offset, 1.0);
                for t in [
                    "post_attention_norm",
                    "ffn_norm",
                    "post_ffw_norm",
                    "attn_q_norm",
                ] {
                    assert!(m.weights.contains(&format!("blk.0.{t}.weight")), "{t}");
                }
            }
            other => unreachable!("{other:?} has no folder in this list"),
        }
        let golden = dir.join("logits.json");
        let golden = if golden.is_file() {
            golden
        } else {
            root.join("tiny-llama/logits.json")
        };
        let g: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let text = g["text"].as_str().unwrap();
        assert_eq!(
            m.tokenizer.encode(text, true).unwrap(),
            ids(&g["text_token_ids"]),
            "{name}"
        );
        let messages: Vec<ChatMessage> =
            serde_json::from_value(g["chat_messages"].clone()).unwrap();
        let rendered = m
            .chat_template
            .as_ref()
            .unwrap()
            .render(
                &messages,
                g["chat_add_generation_prompt"].as_bool().unwrap(),
            )
            .unwrap();
        assert_eq!(rendered, g["chat_rendered"].as_str().unwrap(), "{name}");
        assert_eq!(
            m.tokenizer.encode(&rendered, false).unwrap(),
            ids(&g["chat_token_ids"]),
            "{name}"
        );
    }
}

#[test]
fn zero_dimension_beside_huge_ones_does_not_overflow() {
    use pagoda_model::safetensors::{write_safetensors, SafetensorsFile};
    let st = write_safetensors(&[("x", "F32", vec![0, 1 << 40, 1 << 40], vec![])]);
    let e = SafetensorsFile::from_bytes("z.safetensors", st)
        .unwrap_err()
        .to_string();
    assert_has(&e, &["z.safetensors", "too large"]);
    let mut w = GgufWriter::new();
    w.add_f32_tensor("t", &[1, 1, 1], &[0.0]).unwrap();
    let mut b = w.to_bytes();
    let (_, ne0, _, _) = tensor_info_fields(&b, "t");
    put_u64(&mut b, ne0, 0);
    put_u64(&mut b, ne0 + 8, 1 << 40);
    put_u64(&mut b, ne0 + 16, 1 << 40);
    let e = GgufFile::from_bytes("z.gguf", b).unwrap_err().to_string();
    assert_has(&e, &["z.gguf", "\"t\""]);
}
