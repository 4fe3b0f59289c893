//! Offline RTN / GPTQ / AWQ / AWQ+GPTQ on the tiny random Llama (tests/golden/tiny-llama): calibration
//! sees every linear input, the quantized model runs and stays near the F32 one, and on the
//! calibration data GPTQ and AWQ move the layers' outputs less than RTN at the same grid.

use pagoda_compress::quantize::calibrate::calibrate;
use pagoda_compress::quantize::grid::{GridKind, GroupSpec};
use pagoda_compress::quantize::offline::{quantize_model, Method, OfflineOptions};
use pagoda_kernels::GgmlType;
use pagoda_model::arch::{Logits, Model};
use pagoda_model::{open_model, KvDtype, ModelSource};
use std::path::PathBuf;

fn tiny_llama() -> ModelSource {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama");
    open_model(&dir).expect("the tiny llama opens")
}

/// Pseudo-random token ids below the tiny vocabulary (320).
fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 300) as u32 + 3
        })
        .collect()
}

fn logits(model: &Model, toks: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache_with(64, KvDtype::F32);
    model.forward(toks, 0, &mut cache, Logits::All).unwrap()
}

fn rel_rms(a: &[f32], b: &[f32]) -> f32 {
    let d: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let n: f32 = a.iter().map(|x| x * x).sum();
    (d / n).sqrt()
}

#[test]
fn calibration_sees_every_linear_input_once_per_site() {
    let src = tiny_llama();
    let model = Model::from_source(&src).unwrap();
    let stats = calibrate(&model, &tokens(256, 5), 64, 8, |_, _| {}).unwrap();
    assert_eq!(stats.tokens, 256);
    // 2 layers x (qkv, o, gate/up, down).
    assert_eq!(stats.sites.len(), 8);
    let qkv = stats.site_of("blk.1.attn_v.weight").unwrap();
    assert_eq!(
        qkv.weights,
        [
            "blk.1.attn_q.weight",
            "blk.1.attn_k.weight",
            "blk.1.attn_v.weight"
        ]
    );
    assert_eq!((qkv.rows(), qkv.hessian.cols), (256, 64));
    let down = stats.site_of("blk.0.ffn_down.weight").unwrap();
    assert_eq!(down.hessian.cols, 128);
    assert!(down.absmean.iter().all(|v| v.is_finite() && *v >= 0.0));
    // Too little text is refused with a way out.
    let e = calibrate(&model, &tokens(10, 1), 64, 8, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("too short"), "{e}");
}

#[test]
fn gptq_and_awq_beat_rtn_on_calibration_and_the_model_still_runs() {
    let src = tiny_llama();
    let model = Model::from_source(&src).unwrap();
    let stats = calibrate(&model, &tokens(512, 9), 64, 8, |_, _| {}).unwrap();
    let held_out = tokens(48, 77);
    let reference = logits(&model, &held_out);
    let mut totals = Vec::new();
    for method in [Method::Rtn, Method::Gptq, Method::Awq] {
        let opts = OfflineOptions {
            method,
            spec: GroupSpec {
                bits: 4,
                group_size: Some(32),
                symmetric: false,
                grid: GridKind::IntegerZero,
                clip_search: false,
            },
            act_order: false,
            damp: 0.01,
            awq_grid: 20,
        };
        let mut layers_done = 0;
        let (weights, report) =
            quantize_model(&src.weights, &src.config, Some(&stats), &opts, |d, _| {
                layers_done = d
            })
            .unwrap();
        assert_eq!(layers_done, 2);
        assert_eq!(report.matrices.len(), 14);
        assert!(report.matrices.iter().all(|m| m.ty == GgmlType::Q4_1));
        assert!(report.bytes_after < report.bytes_before);
        assert_eq!(
            weights.get("blk.0.ffn_down.weight").unwrap().ty,
            GgmlType::Q4_1
        );
        assert_eq!(
            weights.get("token_embd.weight").unwrap().ty,
            src.weights.get("token_embd.weight").unwrap().ty
        );
        if method == Method::Awq {
            assert!(report
                .folded
                .contains(&"blk.0.attn_norm.weight".to_string()));
            // GQA (4 query heads, 2 KV heads): O's scales cannot fold into V.
            assert!(!report.folded.contains(&"blk.0.attn_v.weight".to_string()));
        }
        let mut q_src = tiny_llama();
        q_src.weights = weights;
        let q_model = Model::from_source(&q_src).unwrap();
        let diff = rel_rms(&reference, &logits(&q_model, &held_out));
        // 4-bit weights of a random model: logits move by a few percent to ~15% RMS; a
        // broken mapping (wrong nibble order, scale or fold) moves them by ~100%.
        assert!(diff < 0.25, "{method:?}: logits moved {diff}");
        let (mine, rtn) = report.total_errors().unwrap();
        totals.push((method, mine, rtn, diff));
    }
    let (_, rtn_total, _, _) = totals[0];
    let (_, gptq_total, gptq_vs, _) = totals[1];
    let (_, awq_total, awq_vs, _) = totals[2];
    assert!((gptq_vs - rtn_total).abs() <= 1e-6 * rtn_total);
    assert!(
        gptq_total < rtn_total,
        "GPTQ {gptq_total} vs RTN {rtn_total}"
    );
    assert!(awq_total <= awq_vs, "AWQ {awq_total} vs RTN {awq_vs}");
}

#[test]
fn gptq_without_calibration_is_refused() {
    let src = tiny_llama();
    let opts = OfflineOptions {
        method: Method::Gptq,
        spec: GroupSpec {
            bits: 4,
            group_size: Some(32),
            symmetric: true,
            grid: GridKind::IntegerZero,
            clip_search: false,
        },
        act_order: false,
        damp: 0.01,
        awq_grid: 20,
    };
    let e = quantize_model(&src.weights, &src.config, None, &opts, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("--calibration"), "{e}");
}

#[test]
fn a_linear_weight_with_the_wrong_rank_is_an_error_not_a_panic() {
    use pagoda_model::weights::{TensorView, Weights};
    let src = tiny_llama();
    let mut weights = Weights::new();
    for v in src.weights.iter() {
        let v = if v.name == "blk.0.attn_q.weight" {
            let n = v.n_elements();
            TensorView::owned(v.name.clone(), GgmlType::F32, vec![n], vec![0u8; n * 4]).unwrap()
        } else {
            v.clone()
        };
        weights.insert(v).unwrap();
    }
    let opts = OfflineOptions {
        method: Method::Rtn,
        spec: GroupSpec {
            bits: 4,
            group_size: Some(32),
            symmetric: true,
            grid: GridKind::IntegerZero,
            clip_search: false,
        },
        act_order: false,
        damp: 0.01,
        awq_grid: 20,
    };
    let e = quantize_model(&weights, &src.config, None, &opts, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("blk.0.attn_q.weight"), "{e}");
}

/// Layer-wise calibration (`quantize_model_sequential`): layer 0 sees the same inputs as in
/// the one-pass calibration, so it is quantized identically; later layers are calibrated on
/// the outputs of the quantized layers before them, so they differ; GPTQ and AWQ still move
/// the calibration outputs less than RTN and the quantized model runs.
#[test]
fn sequential_calibration_feeds_each_layer_the_quantized_layers_outputs() {
    use pagoda_compress::quantize::offline::gguf_grid;
    use pagoda_compress::quantize::offline::quantize_model_sequential;
    let src = tiny_llama();
    let model = Model::from_source(&src).unwrap();
    let toks = tokens(512, 9);
    let held_out = tokens(48, 77);
    let reference = logits(&model, &held_out);
    let mut layer0_errors = Vec::new();
    for method in [Method::Gptq, Method::Awq, Method::AwqGptq] {
        let opts = OfflineOptions {
            method,
            spec: GroupSpec {
                bits: 4,
                group_size: Some(32),
                symmetric: false,
                grid: gguf_grid(4, false),
                clip_search: false,
            },
            act_order: false,
            damp: 0.01,
            awq_grid: 20,
        };
        let mut layers_done = 0;
        let (seq, report, used) =
            quantize_model_sequential(&src.weights, &src.config, &toks, 64, 8, &opts, |d, _| {
                layers_done = d
            })
            .unwrap();
        assert_eq!((layers_done, used), (2, 512));
        assert_eq!(report.matrices.len(), 14);
        let stats = calibrate(&model, &toks, 64, 8, |_, _| {}).unwrap();
        let (one, _) =
            quantize_model(&src.weights, &src.config, Some(&stats), &opts, |_, _| {}).unwrap();
        let bytes = |w: &pagoda_model::weights::Weights, n: &str| w.get(n).unwrap().data().to_vec();
        for n in ["blk.0.attn_q.weight", "blk.0.ffn_down.weight"] {
            assert_eq!(bytes(&seq, n), bytes(&one, n), "{method:?} {n}");
        }
        assert_ne!(
            bytes(&seq, "blk.1.ffn_down.weight"),
            bytes(&one, "blk.1.ffn_down.weight"),
            "{method:?}: layer 1 was not calibrated on quantized inputs"
        );
        let (mine, rtn) = report.total_errors().unwrap();
        assert!(mine < rtn, "{method:?}: {mine} vs RTN {rtn}");
        layer0_errors.push(
            report
                .matrices
                .iter()
                .filter(|m| m.name.starts_with("blk.0."))
                .map(|m| m.error.unwrap())
                .sum::<f64>(),
        );
        let mut q_src = tiny_llama();
        q_src.weights = seq;
        let q_model = Model::from_source(&q_src).unwrap();
        let diff = rel_rms(&reference, &logits(&q_model, &held_out));
        assert!(diff < 0.25, "{method:?}: logits moved {diff}");
    }
    // Layer 0 sees the same inputs under every method, so AWQ's scales are the same with
    // and without GPTQ after them: GPTQ's rounding of the scaled weights (against the
    // scaled inputs' Hessian) moves the outputs less than AWQ's RTN.
    let (awq, awq_gptq) = (layer0_errors[1], layer0_errors[2]);
    assert!(awq_gptq < awq, "awq-gptq {awq_gptq} vs awq {awq}");
}
