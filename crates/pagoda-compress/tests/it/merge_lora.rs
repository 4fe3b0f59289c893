//! `merge_lora` against transformers + peft: `scripts/golden_lora.py` wraps the tiny Llama
//! folder (tests/golden/tiny-llama) with a random LoRA adapter on all seven linears and saves
//! the logits of the base, the unmerged PeftModel and `merge_and_unload()`
//! (tests/golden/lora-tiny-llama). The adapter is merged here into that folder and into a GGUF
//! of the same base built by the test (Q/K rows permuted as llama.cpp's converter does,
//! written independently of Pagoda's own row-order helper), the merged model is run with
//! Pagoda's forward pass, and its logits are compared. Also: Qwen2 (no permutation), quantized
//! bases, and bad input (no output left behind).

use std::path::{Path, PathBuf};

use pagoda_compress::merge::{merge_lora, MergeBase, MergeDtype, OutputKind};
use pagoda_kernels::GgmlType;
use pagoda_model::arch::{Logits, Model};
use pagoda_model::gguf::{GgufFile, GgufWriter};
use pagoda_model::hf::HfFolder;
use pagoda_model::lora::LoraAdapter;
use pagoda_model::safetensors::{write_safetensors, SafetensorsFile};
use pagoda_model::weights::Weights;
use pagoda_model::{open_model, KvDtype, ModelConfig};

use crate::common::Rng;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiny(name: &str) -> PathBuf {
    repo().join("tests/golden").join(name)
}

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/lora-tiny-llama")
}

fn adapter() -> LoraAdapter {
    LoraAdapter::open(golden().join("adapter")).expect("golden adapter")
}

/// (token ids, tensor of reference.safetensors) from the golden files.
fn reference(tensor: &str) -> (Vec<u32>, Vec<f32>) {
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(golden().join("reference.json")).expect("reference.json"),
    )
    .expect("json");
    let tokens = serde_json::from_value(meta["token_ids"].clone()).expect("token ids");
    let file = SafetensorsFile::open(golden().join("reference.safetensors")).expect("reference");
    let t = file
        .tensors()
        .iter()
        .find(|t| t.name == tensor)
        .unwrap_or_else(|| panic!("{tensor} in reference.safetensors"));
    (tokens, t.to_f32().expect("f32"))
}

/// Logits of every position of `tokens` (K/V in f32, as transformers keeps them).
fn logits(cfg: &ModelConfig, weights: &Weights, tokens: &[u32]) -> Vec<f32> {
    let model = Model::from_weights(cfg, weights).expect("model");
    let mut cache = model.new_cache_with(64, KvDtype::F32);
    model
        .forward(tokens, 0, &mut cache, Logits::All)
        .expect("forward")
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn largest(a: &[f32]) -> f32 {
    a.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

/// Largest |pagoda - transformers| logit difference for an F32 merge of an F32 base: both in
/// f32, differing in summation order (forward_golden's bound for the same base is 2e-4).
const F32_TOLERANCE: f32 = 5e-4;

/// For merged tensors written as F16, as a fraction of the largest |logit|: each merged weight
/// is rounded by up to 2^-11 relative, through two layers. Far below what a wrong merge does
/// (the adapter moves the logits by tens of percent: `base_differs`).
const F16_RELATIVE_TOLERANCE: f32 = 5e-3;

/// Checks `got` against the merged reference and that the adapter really changed the logits.
fn check(what: &str, got: &[f32], tolerance: f32) {
    let (_, want) = reference("logits_merged");
    let (_, peft) = reference("logits_peft");
    let (_, base) = reference("logits_base");
    let d = max_diff(got, &want);
    let d_peft = max_diff(got, &peft);
    let moved = max_diff(&base, &want);
    eprintln!(
        "{what}: max |pagoda - merge_and_unload| {d}, |pagoda - PeftModel| {d_peft}, base moved {moved} (largest logit {})",
        largest(&want)
    );
    assert!(
        d < tolerance && d_peft < tolerance,
        "{what}: {d} / {d_peft} >= {tolerance}"
    );
    assert!(
        moved > 100.0 * tolerance,
        "the adapter barely moves the logits: {moved}"
    );
}

#[test]
fn hf_folder_merge_matches_peft_merge_and_unload() {
    let (tokens, _) = reference("logits_merged");
    let base = MergeBase::open(&tiny("tiny-llama")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (dtype, tol) in [
        (MergeDtype::F32, F32_TOLERANCE),
        (
            MergeDtype::F16,
            F16_RELATIVE_TOLERANCE * largest(&reference("logits_merged").1),
        ),
    ] {
        let out = dir.path().join(format!("merged-{dtype:?}"));
        let report = merge_lora(&base, &adapter(), dtype, &out, false, |_, _| {}).unwrap();
        assert_eq!(report.output, OutputKind::HfFolder);
        assert_eq!(report.modules.len(), 14, "7 linears x 2 layers");
        assert!(report
            .modules
            .iter()
            .all(|m| !m.permuted && m.r == 4 && m.scaling == 2.0));
        assert_eq!(report.converted, 0);
        // A folder Pagoda (and transformers) loads: config.json, tokenizer, one safetensors.
        for f in ["config.json", "tokenizer.json", "model.safetensors"] {
            assert!(out.join(f).is_file(), "{f}");
        }
        assert!(!dir
            .path()
            .join(format!("merged-{dtype:?}.partial"))
            .exists());
        let source = open_model(&out).unwrap();
        let q = source.weights.get("blk.0.attn_q.weight").unwrap();
        assert_eq!(q.ty, dtype.ggml());
        let norm = source.weights.get("blk.0.attn_norm.weight").unwrap();
        assert_eq!(norm.ty, GgmlType::F32, "untouched tensors keep their type");
        let got = logits(&source.config, &source.weights, &tokens);
        check(&format!("HF folder, {dtype:?}"), &got, tol);
    }
}

/// llama.cpp's `permute` (convert_hf_to_gguf.py): `w.reshape(n_head, 2, hd / 2, cols)
/// .swapaxes(1, 2)`: GGUF row (h, i, j) is HF row (h, j, i).
fn llama_cpp_permute(w: &[f32], rows: usize, n_head: usize) -> Vec<f32> {
    let cols = w.len() / rows;
    let hd = rows / n_head;
    let half = hd / 2;
    let mut out = vec![0f32; w.len()];
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let dst = h * hd + i * 2 + j;
                let src = h * hd + j * half + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// A GGUF of the HF folder `name` (no tokenizer: merging and the forward pass need none):
/// Llama Q/K rows permuted as llama.cpp does and Llama 3 RoPE scaling as its `rope_freqs`
/// tensor; linears (`*.attn_*` / `ffn_*` matrices) stored as `linear_type`.
fn gguf_of(name: &str, linear_type: GgmlType, dir: &Path) -> PathBuf {
    let hf = HfFolder::open(&tiny(name)).unwrap();
    let c = &hf.config;
    let arch = match c.arch {
        pagoda_model::Architecture::Llama => "llama",
        pagoda_model::Architecture::Qwen2 => "qwen2",
        other => panic!("{other:?}"),
    };
    let key = |k: &str| format!("{arch}.{k}");
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", arch)
        .add_u32(key("block_count"), c.n_layers as u32)
        .add_u32(key("embedding_length"), c.hidden_size as u32)
        .add_u32(key("attention.head_count"), c.n_heads as u32)
        .add_u32(key("attention.head_count_kv"), c.n_kv_heads as u32)
        .add_u32(key("feed_forward_length"), c.ffn_dim as u32)
        .add_u32(key("context_length"), c.context_length as u32)
        .add_f32(key("attention.layer_norm_rms_epsilon"), c.rms_eps)
        .add_f32(key("rope.freq_base"), c.rope_theta);
    let llama = arch == "llama";
    if llama {
        let (_, freqs) = reference("rope_freqs");
        w.add_f32_tensor("rope_freqs.weight", &[freqs.len()], &freqs)
            .unwrap();
    }
    for view in hf.weights.iter() {
        let mut values = view.to_f32().unwrap();
        let rows = view.shape[0];
        if llama && view.name.ends_with("attn_q.weight") {
            values = llama_cpp_permute(&values, rows, c.n_heads);
        }
        if llama && view.name.ends_with("attn_k.weight") {
            values = llama_cpp_permute(&values, rows, c.n_kv_heads);
        }
        let linear = view.shape.len() == 2 && view.name.starts_with("blk.");
        let ty = if linear { linear_type } else { GgmlType::F32 };
        let data = pagoda_compress::merge::encode(&values, view.cols(), ty).unwrap();
        w.add_tensor(view.name.clone(), ty, &view.shape, data)
            .unwrap();
    }
    let path = dir.join(format!("{name}-{}.gguf", linear_type.name()));
    w.write(&path).unwrap();
    path
}

fn open_gguf(path: &Path) -> (GgufFile, ModelConfig) {
    let f = GgufFile::open(path).unwrap();
    let c = ModelConfig::from_gguf(&f).unwrap();
    (f, c)
}

#[test]
fn llama_gguf_merge_permutes_q_and_k_and_matches_peft() {
    let (tokens, want) = reference("logits_merged");
    let dir = tempfile::tempdir().unwrap();
    let gguf = gguf_of("tiny-llama", GgmlType::F32, dir.path());
    // The GGUF base itself matches transformers' base: the conversion is right.
    let (f, c) = open_gguf(&gguf);
    let base = logits(&c, &Weights::from_gguf(&f).unwrap(), &tokens);
    let d = max_diff(&base, &reference("logits_base").1);
    assert!(d < F32_TOLERANCE, "GGUF base vs transformers: {d}");

    let out = dir.path().join("merged.gguf");
    let report = merge_lora(
        &MergeBase::open(&gguf).unwrap(),
        &adapter(),
        MergeDtype::F32,
        &out,
        false,
        |_, _| {},
    )
    .unwrap();
    assert_eq!(report.output, OutputKind::Gguf);
    let permuted: Vec<&str> = report
        .modules
        .iter()
        .filter(|m| m.permuted)
        .map(|m| m.tensor.as_str())
        .collect();
    assert_eq!(
        permuted,
        [
            "blk.0.attn_k.weight",
            "blk.0.attn_q.weight",
            "blk.1.attn_k.weight",
            "blk.1.attn_q.weight"
        ]
    );
    assert!(!dir.path().join("merged.gguf.partial").exists());
    let (f, c) = open_gguf(&out);
    assert!(f.get_str("pagoda.lora_merged").unwrap().contains("r 4"));
    let got = logits(&c, &Weights::from_gguf(&f).unwrap(), &tokens);
    check("Llama GGUF, F32", &got, F32_TOLERANCE);

    // Without the permutation the merge is wrong: the same delta added in HF row order.
    let wrong = LoraAdapter::open(golden().join("adapter")).unwrap();
    let (f0, _) = open_gguf(&gguf);
    let mut weights = Weights::from_gguf(&f0).unwrap();
    for (module, pair) in wrong.modules() {
        let name = pagoda_model::hf::canonical_name(&format!("{module}.weight"), c.arch).unwrap();
        let v = weights.get(&name).unwrap().clone();
        let mut x = v.to_f32().unwrap();
        for (w, d) in x.iter_mut().zip(pair.delta()) {
            *w += d;
        }
        let data = x.iter().flat_map(|f| f.to_le_bytes()).collect();
        let t = pagoda_model::weights::TensorView::owned(&name, GgmlType::F32, v.shape, data);
        let mut rebuilt = Weights::new();
        for other in weights.iter().filter(|o| o.name != name) {
            rebuilt.insert(other.clone()).unwrap();
        }
        rebuilt.insert(t.unwrap()).unwrap();
        weights = rebuilt;
    }
    let unpermuted = logits(&c, &weights, &tokens);
    let d = max_diff(&unpermuted, &want);
    assert!(
        d > 100.0 * F32_TOLERANCE,
        "the permutation should matter: {d}"
    );
}

#[test]
fn quantized_gguf_base_is_dequantized_merged_and_untouched_tensors_kept() {
    let (tokens, want) = reference("logits_merged");
    let dir = tempfile::tempdir().unwrap();
    let gguf = gguf_of("tiny-llama", GgmlType::Q8_0, dir.path());
    let base = MergeBase::open(&gguf).unwrap();
    let out = dir.path().join("merged-q8.gguf");
    let report = merge_lora(&base, &adapter(), MergeDtype::F16, &out, false, |_, _| {}).unwrap();
    assert!(report.modules.iter().all(|m| m.base_type == GgmlType::Q8_0));
    let (f, c) = open_gguf(&out);
    let merged = Weights::from_gguf(&f).unwrap();
    // Every merged linear is F16 = dequantized Q8_0 + delta (in GGUF row order).
    for m in &report.modules {
        let got = merged.get(&m.tensor).unwrap();
        assert_eq!(got.ty, GgmlType::F16, "{}", m.tensor);
        let base_values = base.weights().get(&m.tensor).unwrap().to_f32().unwrap();
        let delta = max_diff(&got.to_f32().unwrap(), &base_values);
        assert!(delta > 1e-3, "{}: unchanged", m.tensor);
    }
    // Untouched tensors are the base's bytes.
    for name in [
        "token_embd.weight",
        "blk.1.attn_norm.weight",
        "rope_freqs.weight",
    ] {
        assert_eq!(
            merged.get(name).unwrap().data(),
            base.weights().get(name).unwrap().data(),
            "{name}"
        );
    }
    // Q8_0's rounding of the base shows in the logits, well inside what the adapter moves.
    let got = logits(&c, &merged, &tokens);
    let d = max_diff(&got, &want);
    eprintln!(
        "Q8_0 GGUF base, F16 merge: max logit difference {d} (largest {})",
        largest(&want)
    );
    assert!(d < 4e-2 * largest(&want), "{d}");
}

/// A random adapter for `modules` (HF module paths, with their `[out, in]`).
fn synthetic_adapter(dir: &Path, modules: &[(&str, usize, usize)], r: usize) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("adapter_config.json"),
        format!(r#"{{"r": {r}, "lora_alpha": {}, "peft_type": "LORA", "target_modules": ["q_proj", "k_proj", "v_proj", "lm_head"]}}"#, 2 * r),
    )
    .unwrap();
    let mut rng = Rng::new(7);
    let mut tensors = Vec::new();
    for &(m, out, inn) in modules {
        let mut rand = |n: usize| -> Vec<u8> {
            (0..n)
                .flat_map(|_| (0.1 * rng.normal()).to_le_bytes())
                .collect()
        };
        tensors.push((
            format!("base_model.model.{m}.lora_A.weight"),
            vec![r, inn],
            rand(r * inn),
        ));
        tensors.push((
            format!("base_model.model.{m}.lora_B.weight"),
            vec![out, r],
            rand(out * r),
        ));
    }
    let refs: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, d)| (n.as_str(), "F32", s.clone(), d.clone()))
        .collect();
    std::fs::write(
        dir.join("adapter_model.safetensors"),
        write_safetensors(&refs),
    )
    .unwrap();
}

/// The same adapter merged into an HF folder and into its GGUF gives the same Q and K, up to
/// the GGUF's row order: none for Qwen2, llama.cpp's for Llama.
#[test]
fn qwen2_gguf_rows_are_not_permuted_and_llama_ones_are() {
    for (name, permute) in [("tiny-qwen2", false), ("tiny-llama", true)] {
        let dir = tempfile::tempdir().unwrap();
        let ad = dir.path().join("adapter");
        synthetic_adapter(
            &ad,
            &[
                ("model.layers.0.self_attn.q_proj", 64, 64),
                ("model.layers.1.self_attn.k_proj", 32, 64),
            ],
            2,
        );
        let adapter = LoraAdapter::open(&ad).unwrap();
        let hf_out = dir.path().join("merged-hf");
        merge_lora(
            &MergeBase::open(&tiny(name)).unwrap(),
            &adapter,
            MergeDtype::F32,
            &hf_out,
            false,
            |_, _| {},
        )
        .unwrap();
        let gguf = gguf_of(name, GgmlType::F32, dir.path());
        let gguf_out = dir.path().join("merged.gguf");
        let report = merge_lora(
            &MergeBase::open(&gguf).unwrap(),
            &adapter,
            MergeDtype::F32,
            &gguf_out,
            false,
            |_, _| {},
        )
        .unwrap();
        assert!(
            report.modules.iter().all(|m| m.permuted == permute),
            "{name}"
        );
        let hf = open_model(&hf_out).unwrap();
        let (f, c) = open_gguf(&gguf_out);
        let g = Weights::from_gguf(&f).unwrap();
        for (tensor, heads) in [
            ("blk.0.attn_q.weight", c.n_heads),
            ("blk.1.attn_k.weight", c.n_kv_heads),
        ] {
            let from_hf = hf.weights.get(tensor).unwrap().to_f32().unwrap();
            let want = if permute {
                llama_cpp_permute(&from_hf, from_hf.len() / 64, heads)
            } else {
                from_hf
            };
            let got = g.get(tensor).unwrap().to_f32().unwrap();
            assert!(max_diff(&got, &want) < 1e-6, "{name} {tensor}");
        }
    }
}

/// The error of merging `adapter_dir` into `base` to a fresh output, and that nothing named
/// like the output was left.
fn merge_err(base: &Path, adapter_dir: &Path, out_name: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(out_name);
    let e = LoraAdapter::open(adapter_dir)
        .map_err(pagoda_compress::CompressError::from)
        .and_then(|a| {
            merge_lora(
                &MergeBase::open(base)?,
                &a,
                MergeDtype::F16,
                &out,
                false,
                |_, _| {},
            )
        })
        .unwrap_err()
        .to_string();
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "{e}: left output behind"
    );
    e
}

#[test]
fn adapters_that_do_not_fit_the_base_are_refused_naming_module_and_shapes() {
    let dir = tempfile::tempdir().unwrap();
    // q_proj with in_features 48 (the base has 64).
    let wrong = dir.path().join("wrong-shape");
    synthetic_adapter(&wrong, &[("model.layers.0.self_attn.q_proj", 64, 48)], 2);
    let e = merge_err(&tiny("tiny-llama"), &wrong, "out");
    for needle in [
        "model.layers.0.self_attn.q_proj",
        "[64, 48]",
        "[64, 64]",
        "blk.0.attn_q.weight",
    ] {
        assert!(e.contains(needle), "{needle:?} in {e}");
    }
    // A layer the base does not have (it has 2).
    let deep = dir.path().join("deep");
    synthetic_adapter(&deep, &[("model.layers.7.self_attn.v_proj", 32, 64)], 2);
    let e = merge_err(&tiny("tiny-llama"), &deep, "out");
    assert!(
        e.contains("lacks") && e.contains("model.layers.7.self_attn.v_proj"),
        "{e}"
    );
    // lm_head on a base that ties it to the embeddings.
    let head = dir.path().join("head");
    synthetic_adapter(&head, &[("lm_head", 320, 64)], 2);
    let e = merge_err(&tiny("tiny-qwen2"), &head, "out");
    assert!(e.contains("ties lm_head"), "{e}");
    // DoRA, modules_to_save: the adapter itself is refused, naming the option.
    for (extra, needle) in [
        (r#""use_dora": true"#, "DoRA"),
        (r#""modules_to_save": ["lm_head"]"#, "modules_to_save"),
    ] {
        let d = dir.path().join(needle);
        synthetic_adapter(&d, &[("model.layers.0.self_attn.q_proj", 64, 64)], 2);
        let cfg = std::fs::read_to_string(d.join("adapter_config.json")).unwrap();
        std::fs::write(
            d.join("adapter_config.json"),
            cfg.replacen('{', &format!("{{{extra}, "), 1),
        )
        .unwrap();
        let e = merge_err(&tiny("tiny-llama"), &d, "out");
        assert!(e.contains(needle), "{e}");
    }
    // A folder base with a .gguf output.
    let e = merge_err(&tiny("tiny-llama"), &golden().join("adapter"), "out.gguf");
    assert!(e.contains("ends in .gguf"), "{e}");
}

#[test]
fn an_existing_output_is_kept_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep"), "x").unwrap();
    let base = MergeBase::open(&tiny("tiny-llama")).unwrap();
    let e = merge_lora(&base, &adapter(), MergeDtype::F16, &out, false, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("--force"), "{e}");
    assert!(out.join("keep").exists());
    let mut calls = 0;
    merge_lora(&base, &adapter(), MergeDtype::F16, &out, true, |_, _| {
        calls += 1
    })
    .unwrap();
    assert!(!out.join("keep").exists() && out.join("model.safetensors").exists());
    assert_eq!(calls, base.weights().len(), "progress once per tensor");
}

#[test]
fn gptq_folder_base_is_dequantized_and_written_unquantized() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged");
    let base = MergeBase::open(&tiny("tiny-llama-gptq")).unwrap();
    let report = merge_lora(&base, &adapter(), MergeDtype::F16, &out, false, |_, _| {}).unwrap();
    assert!(report.modules.iter().all(|m| m.base_type == GgmlType::Q4_1));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert!(config.get("quantization_config").is_none());
    assert_eq!(config["torch_dtype"], "float16");
    let source = open_model(&out).unwrap();
    assert!(source.checkpoint_quant.is_none());
    // Each merged linear is the dequantized 4-bit weight plus the adapter's delta, rounded
    // to F16 (the logits are not compared with the unquantized merge: 4-bit rounding of this
    // random model moves them by about 18%).
    let ad = adapter();
    for m in &report.modules {
        let got = source.weights.get(&m.tensor).unwrap();
        assert_eq!(got.ty, GgmlType::F16);
        let mut want = base.weights().get(&m.tensor).unwrap().to_f32().unwrap();
        for (w, d) in want.iter_mut().zip(ad.delta(&m.module).unwrap()) {
            *w += d;
        }
        let got = got.to_f32().unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= w.abs() * 1e-3 + 1e-6,
                "{}: {g} vs {w}",
                m.tensor
            );
        }
    }
}
