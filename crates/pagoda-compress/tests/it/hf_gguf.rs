//! Hugging Face folder → GGUF (`write_gguf_from_hf`) on the tiny golden folders: the metadata
//! llama.cpp reads, tensor names, the Llama Q/K row permutation, tied embeddings, Llama 3 RoPE
//! scaling as `rope_freqs.weight`; the written file gives Pagoda the folder's own logits
//! (unquantized: to float rounding) and tokens, and, quantized as `pagoda quantize --method
//! rtn --bits 8 --sym` does, llama.cpp's logits on the same file (golden
//! tests/golden/hf_gguf.json, made by scripts/golden_hf_gguf.py). Bad input is refused with
//! no file left behind.

use pagoda_compress::quantize::gguf_meta::{hf_gguf_metadata, HfGgufSource};
use pagoda_compress::quantize::grid::GroupSpec;
use pagoda_compress::quantize::offline::{gguf_grid, quantize_model, Method, OfflineOptions};
use pagoda_compress::quantize::write::write_gguf_from_hf;
use pagoda_kernels::GgmlType;
use pagoda_model::arch::{Logits, Model};
use pagoda_model::gguf::GgufFile;
use pagoda_model::{open_model, KvDtype, ModelSource};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The tiny folders of the families Pagoda writes as GGUF (scripts/golden_hf_gguf.py).
const WRITABLE: [&str; 5] = [
    "tiny-llama",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-smollm3",
    "tiny-mistral3",
];

fn golden_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name)
}

fn config_json(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap()
}

fn source<'a>(dir: &'a Path, cfg_json: &'a Value, src: &'a ModelSource) -> HfGgufSource<'a> {
    HfGgufSource {
        dir,
        config_json: cfg_json,
        cfg: &src.config,
        tokenizer: &src.tokenizer,
        chat_template: src.chat_template.as_ref().map(|t| t.source()),
    }
}

fn logits_with(src: &ModelSource, toks: &[u32], kv: KvDtype) -> Vec<f32> {
    let model = Model::from_source(src).unwrap();
    let mut cache = model.new_cache_with(256, kv);
    model.forward(toks, 0, &mut cache, Logits::All).unwrap()
}

fn logits(src: &ModelSource, toks: &[u32]) -> Vec<f32> {
    let model = Model::from_source(src).unwrap();
    let mut cache = model.new_cache_with(256, KvDtype::F32);
    model.forward(toks, 0, &mut cache, Logits::All).unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

const SAMPLE: &str = "Hello world! It's 2026: naïve café, 12345 + 0.5 = ?\n\
<|im_start|>user\n  tabs\tand  spaces<|im_end|>\ndef f(x):\n    return x**2  # 😀 ünïcödé\n";

#[test]
fn unquantized_folders_give_the_folders_logits_and_tokens() {
    for name in WRITABLE {
        let dir = golden_dir(name);
        let cfg_json = config_json(&dir);
        let folder = open_model(&dir).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("t.gguf");
        write_gguf_from_hf(
            &source(&dir, &cfg_json, &folder),
            &folder.weights,
            GgmlType::F32,
            "none",
            &out,
        )
        .unwrap();
        if let Ok(keep) = std::env::var("PAGODA_HF_GGUF_KEEP") {
            std::fs::copy(&out, Path::new(&keep).join(format!("{name}-f32.gguf"))).unwrap();
        }
        let gguf = open_model(&out).unwrap();
        let toks = folder.tokenizer.encode(SAMPLE, true).unwrap();
        assert_eq!(gguf.tokenizer.encode(SAMPLE, true).unwrap(), toks, "{name}");
        assert_eq!(gguf.config.n_layers, folder.config.n_layers);
        assert_eq!(
            gguf.config.tie_word_embeddings,
            folder.config.tie_word_embeddings
        );
        let d = max_abs_diff(&logits(&folder, &toks), &logits(&gguf, &toks));
        assert!(d < 1e-3, "{name}: logits differ by {d}");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }
}

#[test]
fn metadata_names_and_llama_permutation() {
    let dir = golden_dir("tiny-llama");
    let cfg_json = config_json(&dir);
    let folder = open_model(&dir).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("t.gguf");
    write_gguf_from_hf(
        &source(&dir, &cfg_json, &folder),
        &folder.weights,
        GgmlType::F32,
        "none",
        &out,
    )
    .unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(f.get_u32("llama.embedding_length").unwrap(), 64);
    assert_eq!(f.get_u32("llama.attention.head_count").unwrap(), 4);
    assert_eq!(f.get_u32("llama.attention.head_count_kv").unwrap(), 2);
    assert_eq!(f.get_u32("llama.attention.key_length").unwrap(), 16);
    assert_eq!(f.get_u32("llama.context_length").unwrap(), 256);
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 10_000.0);
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "gpt-2");
    assert_eq!(f.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 0);
    assert_eq!(f.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 1);
    assert_eq!(f.get_u32("tokenizer.ggml.padding_token_id").unwrap(), 2);
    assert!(f.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert!(f
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("im_start"));
    let tokens = f
        .get_str_array_opt("tokenizer.ggml.tokens")
        .unwrap()
        .unwrap()
        .to_vec();
    let types = f
        .get_i32_array_opt("tokenizer.ggml.token_type")
        .unwrap()
        .unwrap();
    assert_eq!(tokens.len(), 320);
    assert_eq!((tokens[3].as_str(), types[3]), ("<|im_start|>", 3));
    assert_eq!(types[100], 1);
    // Llama 3 scaling as llama.cpp carries it; untied: an output head.
    assert_eq!(f.tensor("rope_freqs.weight").unwrap().shape(), vec![8]);
    assert!(f.tensor("output.weight").is_some());
    assert_eq!(
        f.tensor("blk.1.ffn_down.weight").unwrap().shape(),
        vec![64, 128]
    );
    // Q rows: GGUF row (h, i, j) is HF row (h, j, i) (head_dim 16: halves of 8).
    let q_hf = folder
        .weights
        .get("blk.0.attn_q.weight")
        .unwrap()
        .to_f32()
        .unwrap();
    let info = f.tensor("blk.0.attn_q.weight").unwrap();
    let q_gguf: Vec<f32> = f
        .tensor_data(info)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let cols = 64;
    for (h, i, j) in [(0, 0, 1), (1, 3, 0), (3, 7, 1)] {
        let g = h * 16 + i * 2 + j;
        let r = h * 16 + j * 8 + i;
        assert_eq!(
            q_gguf[g * cols..(g + 1) * cols],
            q_hf[r * cols..(r + 1) * cols]
        );
    }
    // K (2 kv heads): the same within each kv head.
    let k_hf = folder
        .weights
        .get("blk.0.attn_k.weight")
        .unwrap()
        .to_f32()
        .unwrap();
    let info = f.tensor("blk.0.attn_k.weight").unwrap();
    let k_row1: Vec<f32> = f.tensor_data(info)[cols * 4..2 * cols * 4]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(k_row1[..], k_hf[8 * cols..9 * cols]);
}

#[test]
fn qwen2_keeps_row_order_biases_and_ties_the_head() {
    let dir = golden_dir("tiny-qwen2");
    let cfg_json = config_json(&dir);
    let folder = open_model(&dir).unwrap();
    let kv = hf_gguf_metadata(&source(&dir, &cfg_json, &folder)).unwrap();
    let get = |k: &str| kv.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    assert_eq!(get("general.architecture").unwrap().as_str(), Some("qwen2"));
    assert_eq!(
        get("qwen2.rope.freq_base").unwrap().as_f64(),
        Some(1_000_000.0)
    );
    assert!(get("qwen2.attention.key_length").is_none());
    assert_eq!(
        get("tokenizer.ggml.eos_token_id").unwrap().as_i128(),
        Some(2)
    );
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("t.gguf");
    write_gguf_from_hf(
        &source(&dir, &cfg_json, &folder),
        &folder.weights,
        GgmlType::F32,
        "none",
        &out,
    )
    .unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert!(f.tensor("output.weight").is_none());
    assert!(f.tensor("rope_freqs.weight").is_none());
    let q_hf = folder
        .weights
        .get("blk.1.attn_q.bias")
        .unwrap()
        .to_f32()
        .unwrap();
    let info = f.tensor("blk.1.attn_q.bias").unwrap();
    let q: Vec<f32> = f
        .tensor_data(info)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(q, q_hf);
}

#[test]
fn rtn_q8_0_output_matches_llama_cpp_golden() {
    let golden: Value = serde_json::from_slice(
        &std::fs::read(golden_dir("hf_gguf.json")).expect("tests/golden/hf_gguf.json"),
    )
    .unwrap();
    for name in WRITABLE {
        let g = &golden["models"][name];
        let dir = golden_dir(name);
        let cfg_json = config_json(&dir);
        let folder = open_model(&dir).unwrap();
        // `pagoda quantize DIR -o X.gguf --method rtn --bits 8 --sym`.
        let opts = OfflineOptions {
            method: Method::Rtn,
            spec: GroupSpec {
                bits: 8,
                group_size: Some(32),
                symmetric: true,
                grid: gguf_grid(8, true),
                clip_search: false,
            },
            act_order: false,
            damp: 0.01,
            awq_grid: 20,
        };
        let (q, _) =
            quantize_model(&folder.weights, &folder.config, None, &opts, |_, _| {}).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("t.gguf");
        let note = "rtn 8-bit group 32 sym";
        write_gguf_from_hf(
            &source(&dir, &cfg_json, &folder),
            &q,
            GgmlType::Q8_0,
            note,
            &out,
        )
        .unwrap();
        let gguf = open_model(&out).unwrap();
        let want: Vec<u32> = g["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let text = g["text"].as_str().unwrap();
        assert_eq!(
            gguf.tokenizer.encode(text, true).unwrap(),
            want,
            "{name} tokens"
        );
        let n_vocab = g["n_vocab"].as_u64().unwrap() as usize;
        // An f16 KV cache, as llama.cpp's.
        let ours = logits_with(&gguf, &want, KvDtype::F16);
        let last = &ours[(want.len() - 1) * n_vocab..];
        let gl: Vec<f32> = g["last_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let d_last = max_abs_diff(last, &gl);
        let mut d_rows = 0f32;
        for (t, row) in g["first8_logits"].as_array().unwrap().iter().enumerate() {
            for (c, v) in row.as_array().unwrap().iter().enumerate() {
                d_rows = d_rows.max((ours[t * n_vocab + c] - v.as_f64().unwrap() as f32).abs());
            }
        }
        // llama.cpp's Q8_0 matmuls quantize activations to Q8_0 and sum in another order:
        // differences of a few hundredths of the logits' spread, growing with depth. Measured
        // (largest of the two figures / sd): llama 2.8 %, qwen2 2.5 %, qwen3 3.2 % (its
        // QK-norm rescales the rounded Q and K), smollm3 4.6 % (4 layers), mistral3 2.8 %; the
        // same files unquantized agree to 1e-3 (`unquantized_folders_give_...`).
        let mean = gl.iter().sum::<f32>() / gl.len() as f32;
        let sd = (gl.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / gl.len() as f32).sqrt();
        eprintln!("{name}: max |diff| last row {d_last}, first 8 of every row {d_rows}, sd {sd}");
        assert!(
            d_last < 0.05 * sd && d_rows < 0.05 * sd,
            "{name}: {d_last} {d_rows} sd {sd}"
        );
    }
}

#[test]
fn bad_folders_are_refused_before_any_file() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = |name: &str| -> PathBuf {
        let to = tmp.path().join(name);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(golden_dir("tiny-llama")).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
        to
    };
    let folder_dir = copy("ok");
    let folder = open_model(&folder_dir).unwrap();
    let out = tmp.path().join("out.gguf");
    let try_write = |dir: &Path, cfg_json: &Value| {
        write_gguf_from_hf(
            &source(dir, cfg_json, &folder),
            &folder.weights,
            GgmlType::F32,
            "none",
            &out,
        )
        .unwrap_err()
        .to_string()
    };
    // No tokenizer.json.
    let no_tok = copy("no-tok");
    std::fs::remove_file(no_tok.join("tokenizer.json")).unwrap();
    let e = try_write(&no_tok, &config_json(&no_tok));
    assert!(e.contains("no tokenizer.json"), "{e}");
    // A SentencePiece vocabulary.
    let spm = copy("spm");
    std::fs::write(spm.join("tokenizer.model"), b"x").unwrap();
    let e = try_write(&spm, &config_json(&spm));
    assert!(e.contains("SentencePiece"), "{e}");
    // SentencePiece by its pre-tokenizer (no tokenizer.model).
    let meta = copy("metaspace");
    let mut tj: Value =
        serde_json::from_slice(&std::fs::read(meta.join("tokenizer.json")).unwrap()).unwrap();
    tj["pre_tokenizer"] = serde_json::json!({"type": "Metaspace", "replacement": "\u{2581}"});
    std::fs::write(meta.join("tokenizer.json"), tj.to_string()).unwrap();
    let e = try_write(&meta, &config_json(&meta));
    assert!(e.contains("SentencePiece"), "{e}");
    // An unknown pre-tokenizer.
    let odd = copy("odd-pre");
    let mut tj: Value =
        serde_json::from_slice(&std::fs::read(odd.join("tokenizer.json")).unwrap()).unwrap();
    tj["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\d+"}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]});
    std::fs::write(odd.join("tokenizer.json"), tj.to_string()).unwrap();
    let e = try_write(&odd, &config_json(&odd));
    assert!(
        e.contains("pre-tokenizer") && e.contains("llama.cpp"),
        "{e}"
    );
    // Gemma 3 (no GGUF writer for it yet).
    let gemma_dir = golden_dir("tiny-gemma3");
    let gemma = open_model(&gemma_dir).unwrap();
    let gcfg = config_json(&gemma_dir);
    let e = write_gguf_from_hf(
        &source(&gemma_dir, &gcfg, &gemma),
        &gemma.weights,
        GgmlType::F32,
        "none",
        &out,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("Gemma 3"), "{e}");
    assert!(!out.exists());
    assert!(!tmp.path().join("out.gguf.partial").exists());
}
