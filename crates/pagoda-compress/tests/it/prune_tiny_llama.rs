//! Pruning the tiny random Llama (tests/golden/tiny-llama) end to end: the requested sparsity
//! is achieved (exactly for N:M), the pruned model loads and runs, runs are deterministic,
//! and on the calibration data Wanda and SparseGPT move the layers' outputs less than
//! magnitude pruning at the same pattern.

use pagoda_compress::prune::{prune_model, Pattern, PruneMethod, PruneOptions, MATRICES};
use pagoda_compress::quantize::sequential::SequentialCalibration;
use pagoda_kernels::GgmlType;
use pagoda_model::arch::{Logits, Model};
use pagoda_model::{open_model, KvDtype, ModelSource};
use std::path::PathBuf;

fn tiny_llama() -> ModelSource {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama");
    open_model(&dir).expect("the tiny llama opens")
}

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

#[test]
fn pruned_tiny_llama_has_the_sparsity_runs_and_wanda_sparsegpt_beat_magnitude() {
    let src = tiny_llama();
    let calib = tokens(512, 9);
    let seq = SequentialCalibration {
        tokens: &calib,
        window: 64,
        max_windows: 8,
    };
    let held_out = tokens(32, 77);
    for pattern in [Pattern::Unstructured, Pattern::NM { n: 2, m: 4 }] {
        let mut errors = Vec::new();
        for method in [
            PruneMethod::Magnitude,
            PruneMethod::Wanda,
            PruneMethod::SparseGpt,
        ] {
            let opts = PruneOptions::new(method, pattern, Some(0.5)).unwrap();
            let (w, report) =
                prune_model(&src.weights, &src.config, &seq, &opts, |_, _| {}).unwrap();
            assert_eq!(report.calibration_tokens, 512);
            assert_eq!(report.matrices.len(), 7 * src.config.n_layers);
            // Every pruned matrix: exactly half its weights zero (no tiny-llama weight is 0).
            for layer in 0..src.config.n_layers {
                for t in MATRICES {
                    let name = format!("blk.{layer}.{t}.weight");
                    let view = w.get(&name).unwrap();
                    assert_eq!(view.ty, GgmlType::F16, "{name}");
                    let v = view.to_f32().unwrap();
                    let zeros = v.iter().filter(|x| **x == 0.0).count();
                    assert_eq!(zeros * 2, v.len(), "{method:?} {pattern} {name}");
                    if let Pattern::NM { n, m } = pattern {
                        for g in v.chunks(m) {
                            assert!(g.iter().filter(|x| **x != 0.0).count() <= n);
                        }
                    }
                }
            }
            assert_eq!(report.sparsity(), 0.5);
            // Untouched tensors keep their bytes.
            let emb = "token_embd.weight";
            assert_eq!(
                w.get(emb).unwrap().data(),
                src.weights.get(emb).unwrap().data()
            );
            // It loads and runs, finite.
            let model = Model::from_weights(&src.config, &w).unwrap();
            let mut cache = model.new_cache_with(64, KvDtype::F32);
            let logits = model
                .forward(&held_out, 0, &mut cache, Logits::All)
                .unwrap();
            assert!(logits.iter().all(|x| x.is_finite()));
            // Deterministic.
            let (w2, _) = prune_model(&src.weights, &src.config, &seq, &opts, |_, _| {}).unwrap();
            for t in MATRICES {
                let name = format!("blk.1.{t}.weight");
                assert_eq!(w.get(&name).unwrap().data(), w2.get(&name).unwrap().data());
            }
            let (mine, by_magnitude) = report.total_errors();
            errors.push((method, mine, by_magnitude));
        }
        // Against magnitude pruning of the same matrices on the same calibration inputs.
        for (method, mine, by_magnitude) in &errors[1..] {
            assert!(
                mine < by_magnitude,
                "{pattern}: {method:?} calibration error {mine} not below magnitude's {by_magnitude}"
            );
        }
    }
}
