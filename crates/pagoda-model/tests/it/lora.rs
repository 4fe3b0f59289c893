//! LoRA adapters against `peft`: `scripts/golden_lora.py` saves a random adapter (r=4,
//! alpha=8, q/v/down_proj, random B) on a tiny Llama, the targeted base weights, and the
//! weights after `merge_and_unload()` (plain and rsLoRA), under tests/golden/lora/.

use pagoda_model::lora::{merge_into, LoraAdapter, LoraPair};
use pagoda_model::safetensors::{write_safetensors, SafetensorsFile};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/lora")
}

fn check_against_peft(adapter: &str, merged: &str) {
    let dir = golden();
    let adapter = LoraAdapter::open(dir.join(adapter)).expect("golden adapter");
    let base = SafetensorsFile::open(dir.join("base.safetensors")).expect("base");
    let merged = SafetensorsFile::open(dir.join(merged)).expect("merged");
    assert_eq!(adapter.modules().count(), 6, "3 targets x 2 layers");
    for (module, pair) in adapter.modules() {
        let name = format!("{module}.weight");
        let view = |f: &SafetensorsFile| {
            f.tensors()
                .iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("{name} in golden"))
                .clone()
        };
        let b = view(&base);
        let (out, in_) = (b.shape[0], b.shape[1]);
        assert_eq!(pair.weight_shape(), [out, in_]);
        let mut w = b.to_f32().unwrap();
        adapter.merge_module(module, &mut w, out, in_).unwrap();
        let want = view(&merged).to_f32().unwrap();
        let max = w
            .iter()
            .zip(&want)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(max < 1e-5, "{module}: max abs diff {max}");
        // The delta is non-zero (B is random) and is what the merge adds.
        let delta = adapter.delta(module).unwrap();
        assert!(delta.iter().any(|d| d.abs() > 1e-4), "{module}: zero delta");
        let base_w = b.to_f32().unwrap();
        for ((d, x), y) in delta.iter().zip(&base_w).zip(&w) {
            assert!((x + d - y).abs() < 1e-6);
        }
    }
}

#[test]
fn merge_matches_peft() {
    check_against_peft("adapter", "merged.safetensors");
    let a = LoraAdapter::open(golden().join("adapter")).unwrap();
    assert_eq!(a.config().r, 4);
    let (m, p) = a.modules().next().unwrap();
    assert!(m.starts_with("model.layers.0."), "{m}");
    assert_eq!(p.scaling, 2.0);
}

#[test]
fn rslora_merge_matches_peft() {
    check_against_peft("adapter_rslora", "merged_rslora.safetensors");
    let a = LoraAdapter::open(golden().join("adapter_rslora")).unwrap();
    assert!(a.config().use_rslora);
    assert!(a.modules().all(|(_, p)| p.scaling == 4.0));
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const CONFIG: &str = r#"{"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "bias": "none", "peft_type": "LORA"}"#;

/// An adapter folder with `config` and the given `(name, shape)` F32 tensors.
fn folder(config: Option<&str>, tensors: &[(&str, Vec<usize>)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    if let Some(c) = config {
        std::fs::write(dir.path().join("adapter_config.json"), c).unwrap();
    }
    let t: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s)| {
            let len: usize = s.iter().product();
            (*n, "F32", s.clone(), f32_bytes(&vec![0.5; len]))
        })
        .collect();
    std::fs::write(
        dir.path().join("adapter_model.safetensors"),
        write_safetensors(&t),
    )
    .unwrap();
    dir
}

const A: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
const B: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";

fn open_err(dir: &Path) -> String {
    LoraAdapter::open(dir).unwrap_err().to_string()
}

#[test]
fn good_synthetic_adapter_with_adapter_name() {
    let dir = folder(
        Some(CONFIG),
        &[
            (
                "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
                vec![2, 3],
            ),
            (
                "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight",
                vec![5, 2],
            ),
        ],
    );
    let a = LoraAdapter::open(dir.path()).unwrap();
    let (m, p) = a.modules().next().unwrap();
    assert_eq!(m, "model.layers.0.self_attn.q_proj");
    assert_eq!((p.r, p.in_features, p.out_features), (2, 3, 5));
    // 0.5·0.5·2 (rank) · 2 (scaling) everywhere.
    assert!(a.delta(m).unwrap().iter().all(|&d| d == 1.0));
    let mut w = vec![0f32; 15];
    let e = a.merge_module(m, &mut w, 3, 5).unwrap_err().to_string();
    assert!(e.contains("does not fit"), "{e}");
}

#[test]
fn half_precision_tensors_are_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("adapter_config.json"), CONFIG).unwrap();
    // 0.5 is 0x3800 in f16 and 0x3f00 in bf16.
    let f16 = [0x00u8, 0x38].repeat(6);
    let bf16 = [0x00u8, 0x3f].repeat(10);
    std::fs::write(
        dir.path().join("adapter_model.safetensors"),
        write_safetensors(&[(A, "F16", vec![2, 3], f16), (B, "BF16", vec![5, 2], bf16)]),
    )
    .unwrap();
    let a = LoraAdapter::open(dir.path()).unwrap();
    assert!(a
        .delta("model.layers.0.self_attn.q_proj")
        .unwrap()
        .iter()
        .all(|&d| d == 1.0));
}

#[test]
fn inconsistent_pair_is_an_error_not_a_panic() {
    let p = pair(2, 3, 5, vec![1.0; 5], vec![1.0; 10], false);
    let mut w = vec![0f32; 15];
    let e = merge_into(&mut w, 5, 3, &p, 1.0).unwrap_err().to_string();
    assert!(e.contains("A has 5 values"), "{e}");
    assert!(p.delta().iter().all(|&d| d == 0.0));
    let empty = pair(2, 0, 5, vec![], vec![1.0; 10], false);
    let mut w: Vec<f32> = vec![];
    merge_into(&mut w, 5, 0, &empty, 1.0).unwrap();
}

#[test]
fn missing_lora_b_is_an_error() {
    let dir = folder(Some(CONFIG), &[(A, vec![2, 3])]);
    let e = open_err(dir.path());
    assert!(e.contains("no lora_B") && e.contains("q_proj"), "{e}");
}

#[test]
fn rank_mismatch_is_an_error() {
    let dir = folder(Some(CONFIG), &[(A, vec![2, 3]), (B, vec![5, 3])]);
    let e = open_err(dir.path());
    assert!(e.contains("rank mismatch") && e.contains("q_proj"), "{e}");
    let dir = folder(Some(CONFIG), &[(A, vec![3, 3]), (B, vec![5, 3])]);
    let e = open_err(dir.path());
    assert!(e.contains("adapter_config.json says 2"), "{e}");
}

#[test]
fn bias_all_is_refused() {
    let dir = folder(
        Some(r#"{"r": 2, "lora_alpha": 4, "bias": "all"}"#),
        &[(A, vec![2, 3]), (B, vec![5, 2])],
    );
    let e = open_err(dir.path());
    assert!(
        e.contains("bias \"all\"") && e.contains("adapter_config.json"),
        "{e}"
    );
}

#[test]
fn missing_config_is_an_error() {
    let dir = folder(None, &[(A, vec![2, 3]), (B, vec![5, 2])]);
    let e = open_err(dir.path());
    assert!(e.contains("adapter_config.json is missing"), "{e}");
}

#[test]
fn other_bad_inputs_are_errors() {
    // A module outside target_modules.
    let dir = folder(
        Some(r#"{"r": 2, "lora_alpha": 4, "target_modules": ["v_proj"]}"#),
        &[(A, vec![2, 3]), (B, vec![5, 2])],
    );
    assert!(open_err(dir.path()).contains("not in target_modules"));
    // A saved full module.
    let dir = folder(
        Some(CONFIG),
        &[
            (A, vec![2, 3]),
            (B, vec![5, 2]),
            ("base_model.model.lm_head.weight", vec![5, 3]),
        ],
    );
    assert!(open_err(dir.path()).contains("not a LoRA A/B weight"));
    // No safetensors file.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("adapter_config.json"), CONFIG).unwrap();
    assert!(open_err(dir.path()).contains("adapter_model.safetensors is missing"));
    // Broken JSON.
    let dir = folder(Some("{"), &[(A, vec![2, 3]), (B, vec![5, 2])]);
    assert!(open_err(dir.path()).contains("invalid adapter config"));
    // An unsupported dtype is refused by the safetensors reader, naming the tensor.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("adapter_config.json"), CONFIG).unwrap();
    std::fs::write(
        dir.path().join("adapter_model.safetensors"),
        write_safetensors(&[(A, "I32", vec![2, 3], vec![0; 24])]),
    )
    .unwrap();
    let e = open_err(dir.path());
    assert!(e.contains("lora_A"), "{e}");
}

fn pair(r: usize, n_in: usize, n_out: usize, a: Vec<f32>, b: Vec<f32>, fifo: bool) -> LoraPair {
    LoraPair {
        r,
        in_features: n_in,
        out_features: n_out,
        a,
        b,
        scaling: 1.0,
        fan_in_fan_out: fifo,
    }
}

proptest! {
    #[test]
    fn zero_b_leaves_w_and_merge_is_linear_in_scaling(
        r in 1usize..4, n_in in 1usize..6, n_out in 1usize..6, fifo in any::<bool>(),
        seed in proptest::collection::vec(-1f32..1.0, 64..65),
        s in -4f32..4.0,
    ) {
        let take = |n: usize, off: usize| (0..n).map(|i| seed[(i + off) % 64]).collect::<Vec<_>>();
        let a = take(r * n_in, 0);
        let b = take(n_out * r, 7);
        let w0 = take(n_out * n_in, 13);
        // B = 0: W unchanged, bit for bit.
        let zero = pair(r, n_in, n_out, a.clone(), vec![0.0; n_out * r], fifo);
        let mut w = w0.clone();
        merge_into(&mut w, n_out, n_in, &zero, s).unwrap();
        prop_assert_eq!(&w, &w0);
        // Linear in scaling: merging with s equals W + s·(merge with 1 − W).
        let p = pair(r, n_in, n_out, a, b, fifo);
        let mut w1 = w0.clone();
        merge_into(&mut w1, n_out, n_in, &p, 1.0).unwrap();
        let mut ws = w0.clone();
        merge_into(&mut ws, n_out, n_in, &p, s).unwrap();
        for ((x0, x1), xs) in w0.iter().zip(&w1).zip(&ws) {
            prop_assert!((x0 + s * (x1 - x0) - xs).abs() < 1e-4);
        }
        // The delta is the same arithmetic from zero.
        let mut ps = p.clone();
        ps.scaling = s;
        for ((x0, d), xs) in w0.iter().zip(ps.delta()).zip(&ws) {
            prop_assert!((x0 + d - xs).abs() < 1e-5);
        }
    }
}

/// A copy of the tiny Llama folder with `edit` applied to its config.json.
fn tiny_llama_with(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama");
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let path = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
    dir
}

/// The deploy path every refusal of a fine-tuning artefact names.
fn says_merge_then_quantize(e: &str) {
    for needle in [
        "pagoda merge-lora BASE ADAPTER -o merged",
        "pagoda quantize merged -o merged-q4.gguf",
        "--quantize nf4",
    ] {
        assert!(e.contains(needle), "{needle:?} missing from: {e}");
    }
}

#[test]
fn a_qlora_bitsandbytes_checkpoint_is_refused_with_the_deploy_path() {
    for q in [
        serde_json::json!({"quant_method": "bitsandbytes", "load_in_4bit": true,
            "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16"}),
        serde_json::json!({"load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}),
        serde_json::json!({"quant_method": "bitsandbytes", "load_in_8bit": true}),
    ] {
        let dir = tiny_llama_with(|v| v["quantization_config"] = q.clone());
        let e = pagoda_model::open_model(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("bitsandbytes") && e.contains("config.json"),
            "{e}"
        );
        says_merge_then_quantize(&e);
    }
    // The unquantized folder itself still loads.
    let plain = tiny_llama_with(|_| {});
    pagoda_model::open_model(plain.path()).unwrap();
}

#[test]
fn an_adapter_folder_is_refused_as_a_model_with_the_deploy_path() {
    let e = pagoda_model::open_model(&golden().join("adapter"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("PEFT LoRA adapter") && e.contains("adapter_config.json"),
        "{e}"
    );
    says_merge_then_quantize(&e);
}
