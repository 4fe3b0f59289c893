//! Hugging Face GPTQ/AWQ folders written by `quantize_for_hf` + `write_hf_folder` from the
//! tiny random Llama (tests/golden/tiny-llama), loaded back by pagoda-model's own GPTQ/AWQ
//! loader (`hf_quant`): every linear is exactly the GGUF route's block data for the same
//! options, the other tensors are the source's in F16, and nothing but the folder is left.
//! The folders committed under tests/golden/tiny-llama-pagoda-* (made by `pagoda quantize`)
//! match AutoGPTQ's / AutoAWQ's own dequantization (scripts/golden_hf_export.py).

use pagoda_compress::quantize::calibrate::calibrate;
use pagoda_compress::quantize::grid::{GridKind, GroupSpec};
use pagoda_compress::quantize::hf_write::{
    partial_path, quantize_for_hf, write_hf_folder, ExportSource, HfExport,
};
use pagoda_compress::quantize::offline::{
    quantize_model, Calibration, Method, OfflineOptions, OutputFormat,
};
use pagoda_kernels::GgmlType;
use pagoda_model::arch::Model;
use pagoda_model::{open_model, ModelSource};
use std::path::{Path, PathBuf};

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name)
}

fn tiny_llama() -> ModelSource {
    open_model(&golden("tiny-llama")).expect("the tiny llama opens")
}

fn tokens(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % 300) as u32 + 3).collect()
}

const LINEARS: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

fn export(src: &ModelSource, opts: &OfflineOptions, format: OutputFormat, out: &Path) {
    let model = Model::from_source(src).unwrap();
    let stats = opts
        .method
        .needs_calibration()
        .then(|| calibrate(&model, &tokens(512), 64, 8, |_, _| {}).unwrap());
    let q = quantize_for_hf(
        &src.weights,
        &src.config,
        &Calibration::from(stats.as_ref()),
        opts,
        format,
        false,
        |_, _| {},
    )
    .unwrap();
    let config_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.path.join("config.json")).unwrap()).unwrap();
    let e = HfExport {
        format,
        spec: opts.spec,
        act_order: opts.act_order,
        damp: opts.damp,
        weights: &src.weights,
        cfg: &src.config,
        source: ExportSource::HfFolder {
            dir: &src.path,
            config_json: &config_json,
        },
        quantized: &q,
    };
    write_hf_folder(&e, out, false).unwrap();
}

fn opts(method: Method, bits: u8, group: Option<usize>, sym: bool) -> OfflineOptions {
    OfflineOptions {
        method,
        spec: GroupSpec {
            bits,
            group_size: group,
            symmetric: sym,
            grid: GridKind::IntegerZero,
            clip_search: false,
        },
        act_order: false,
        damp: 0.01,
        awq_grid: 20,
    }
}

#[test]
fn folders_load_back_to_the_gguf_route_weights_exactly() {
    let src = tiny_llama();
    let model = Model::from_source(&src).unwrap();
    let stats = calibrate(&model, &tokens(512), 64, 8, |_, _| {}).unwrap();
    for (format, o, loaded_as) in [
        (
            OutputFormat::Gptq,
            opts(Method::Rtn, 4, Some(32), false),
            GgmlType::Q4_1,
        ),
        (
            OutputFormat::Gptq,
            opts(Method::Gptq, 4, Some(64), true),
            GgmlType::Q4_1,
        ),
        (
            OutputFormat::Gptq,
            opts(Method::Gptq, 8, None, true),
            GgmlType::Q8_0,
        ),
        (
            OutputFormat::Awq,
            opts(Method::Awq, 4, Some(32), false),
            GgmlType::Q4_1,
        ),
        (
            OutputFormat::Awq,
            opts(Method::Rtn, 4, Some(64), true),
            GgmlType::Q4_1,
        ),
    ] {
        let what = format!("{format:?} {o:?}");
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        export(&src, &o, format, &out);
        let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1, "{what}: only the folder is left");
        assert!(!partial_path(&out).exists());
        let back = open_model(&out).unwrap();
        let report = back
            .checkpoint_quant
            .as_ref()
            .expect("a quantized checkpoint");
        assert_eq!(report.linears, 14, "{what}");
        assert_eq!(report.requantized_blocks, 0, "{what}");
        let calib = o.method.needs_calibration().then_some(&stats);
        let (gguf, _) = quantize_model(&src.weights, &src.config, calib, &o, |_, _| {}).unwrap();
        for layer in 0..2 {
            for t in LINEARS {
                let n = format!("blk.{layer}.{t}.weight");
                let (a, b) = (back.weights.get(&n).unwrap(), gguf.get(&n).unwrap());
                assert_eq!(a.ty, loaded_as, "{what} {n}");
                assert_eq!(a.shape, b.shape, "{what} {n}");
                assert!(
                    a.to_f32().unwrap() == b.to_f32().unwrap(),
                    "{what} {n}: the loaded folder differs from the GGUF route"
                );
            }
        }
        // Everything else: the (folded) source tensor rounded to F16.
        for v in gguf.iter() {
            if LINEARS.iter().any(|t| v.name.contains(&format!(".{t}."))) {
                continue;
            }
            let got = back.weights.get(&v.name).unwrap();
            assert_eq!(got.ty, GgmlType::F16, "{what} {}", v.name);
            for (x, y) in got.to_f32().unwrap().iter().zip(v.to_f32().unwrap()) {
                assert!((x - y).abs() <= y.abs() * 1e-3 + 1e-7, "{what} {}", v.name);
            }
        }
        // The folder runs.
        let m = Model::from_source(&back).unwrap();
        let mut cache = m.new_cache(32);
        let logits = m
            .forward(&tokens(8), 0, &mut cache, pagoda_model::arch::Logits::Last)
            .unwrap();
        assert!(logits.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn act_order_is_written_as_g_idx() {
    let src = tiny_llama();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("act");
    let mut o = opts(Method::Gptq, 4, Some(32), false);
    o.act_order = true;
    export(&src, &o, OutputFormat::Gptq, &out);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization_config"]["desc_act"], true);
    let st = pagoda_model::safetensors::SafetensorsFile::open_skipping_unsupported(
        out.join("model.safetensors"),
    )
    .unwrap();
    let (_, raws) = st.into_parts();
    let g_idx = raws
        .iter()
        .find(|r| r.name == "model.layers.0.mlp.down_proj.g_idx")
        .unwrap()
        .to_i32()
        .unwrap();
    assert_eq!(g_idx.len(), 128);
    assert!(
        g_idx.windows(2).any(|w| w[1] < w[0]),
        "act-order g_idx is not monotone"
    );
    let back = open_model(&out).unwrap();
    assert!(back.checkpoint_quant.unwrap().linears == 14);
}

#[test]
fn an_existing_output_is_kept_without_force() {
    let src = tiny_llama();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let o = opts(Method::Rtn, 4, Some(32), false);
    let q = quantize_for_hf(
        &src.weights,
        &src.config,
        &Calibration::None,
        &o,
        OutputFormat::Gptq,
        false,
        |_, _| {},
    )
    .unwrap();
    let cfg = serde_json::json!({});
    let e = HfExport {
        format: OutputFormat::Gptq,
        spec: o.spec,
        act_order: false,
        damp: 0.01,
        weights: &src.weights,
        cfg: &src.config,
        source: ExportSource::HfFolder {
            dir: &src.path,
            config_json: &cfg,
        },
        quantized: &q,
    };
    let err = write_hf_folder(&e, &out, false).unwrap_err().to_string();
    assert!(
        err.contains("already exists") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("keep.txt")).unwrap(),
        "mine"
    );
    assert!(!partial_path(&out).exists());
}
