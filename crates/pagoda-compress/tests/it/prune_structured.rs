//! Structured pruning of the tiny random Llama, Qwen2 and Gemma 3 (tests/golden): the cut
//! model is checked against the uncut model with the removed parts' contribution zeroed,
//! which must compute the same function —
//! - a dropped layer is the layer with its attention output and MLP down projection zeroed
//!   (its residual branches add nothing; Gemma's post-norms of zero are zero);
//! - removed MLP neurons are their `ffn_down` columns zeroed; removed query heads are their
//!   `attn_output` columns zeroed;
//!
//! and keeping everything gives bit-identical logits. Residual-channel pruning changes the
//! function (RMSNorm over fewer channels), so it is checked for shape, loading and finite
//! output only. Bad targets are refused naming the numbers.

use pagoda_compress::prune::layers::{block_influence, choose_dropped, keep_without};
use pagoda_compress::prune::reshape::{reshape, Keep};
use pagoda_compress::prune::width::{plan_width, width_importance, WidthTarget};
use pagoda_kernels::GgmlType;
use pagoda_model::arch::{Logits, Model};
use pagoda_model::weights::{TensorView, Weights};
use pagoda_model::{open_model, KvDtype, ModelConfig, ModelSource};
use std::path::PathBuf;

fn tiny(name: &str) -> ModelSource {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name);
    open_model(&dir).expect("the tiny model opens")
}

const MODELS: [&str; 3] = ["tiny-llama", "tiny-qwen2", "tiny-gemma3"];

fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 250) as u32 + 3
        })
        .collect()
}

fn logits(cfg: &ModelConfig, w: &Weights, toks: &[u32]) -> Vec<f32> {
    let model = Model::from_weights(cfg, w).expect("the model builds");
    let mut cache = model.new_cache_with(toks.len(), KvDtype::F32);
    model
        .forward(toks, 0, &mut cache, Logits::All)
        .expect("the forward pass runs")
}

/// `w` with `edit(name, values)` applied to every tensor it returns true for (as F32).
fn edited(w: &Weights, mut edit: impl FnMut(&str, &[usize], &mut [f32]) -> bool) -> Weights {
    let mut out = Weights::new();
    for v in w.iter() {
        let mut values = v.to_f32().unwrap();
        let view = if edit(&v.name, &v.shape, &mut values) {
            let bytes = values.iter().flat_map(|x| x.to_le_bytes()).collect();
            TensorView::owned(v.name.clone(), GgmlType::F32, v.shape.clone(), bytes).unwrap()
        } else {
            v.clone()
        };
        out.insert(view).unwrap();
    }
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn keeping_everything_is_the_identity() {
    let toks = tokens(24, 5);
    for name in MODELS {
        let src = tiny(name);
        let (w, cfg) = reshape(&src.weights, &src.config, &Keep::all(&src.config)).unwrap();
        assert_eq!(cfg, src.config, "{name}");
        assert_eq!(
            logits(&cfg, &w, &toks),
            logits(&src.config, &src.weights, &toks),
            "{name}"
        );
    }
}

#[test]
fn a_dropped_layer_is_the_layer_with_its_branches_zeroed() {
    let toks = tokens(24, 6);
    for name in MODELS {
        let src = tiny(name);
        let cfg = &src.config;
        for dropped in 0..cfg.n_layers {
            let (w, new_cfg) = reshape(&src.weights, cfg, &keep_without(cfg, &[dropped])).unwrap();
            assert_eq!(new_cfg.n_layers, cfg.n_layers - 1);
            let kept_flags: Vec<bool> = (0..cfg.n_layers)
                .filter(|&l| l != dropped)
                .map(|l| cfg.layer_is_sliding[l])
                .collect();
            assert_eq!(new_cfg.layer_is_sliding, kept_flags, "{name}");
            // Untouched layers keep their bytes.
            let last = format!("blk.{}.ffn_up.weight", new_cfg.n_layers - 1);
            let src_last = format!(
                "blk.{}.ffn_up.weight",
                if dropped == cfg.n_layers - 1 {
                    cfg.n_layers - 2
                } else {
                    cfg.n_layers - 1
                }
            );
            assert_eq!(
                w.get(&last).unwrap().data(),
                src.weights.get(&src_last).unwrap().data()
            );
            let zeroed = edited(&src.weights, |n, _, v| {
                let hit = n == format!("blk.{dropped}.attn_output.weight")
                    || n == format!("blk.{dropped}.ffn_down.weight");
                if hit {
                    v.fill(0.0);
                }
                hit
            });
            let d = max_diff(&logits(&new_cfg, &w, &toks), &logits(cfg, &zeroed, &toks));
            assert!(d < 1e-4, "{name} without layer {dropped}: {d}");
        }
    }
}

#[test]
// `usize::is_multiple_of` is newer than the workspace's rust-version (1.85).
#[allow(clippy::manual_is_multiple_of)]
fn removed_neurons_and_heads_are_their_output_columns_zeroed() {
    let toks = tokens(24, 7);
    for name in MODELS {
        let src = tiny(name);
        let cfg = &src.config;
        let group = cfg.n_heads / cfg.n_kv_heads;
        let mut keep = Keep::all(cfg);
        for (l, lk) in keep.layers.iter_mut().enumerate() {
            lk.ffn = (0..cfg.ffn_dim)
                .filter(|i| (i + 5 * l) % cfg.ffn_dim % 3 != 0)
                .collect();
            // One query head of every KV group, a different one per layer.
            lk.q_heads = (0..cfg.n_kv_heads).map(|g| g * group + l % group).collect();
        }
        let (w, new_cfg) = reshape(&src.weights, cfg, &keep).unwrap();
        assert_eq!(
            (new_cfg.n_heads, new_cfg.n_kv_heads, new_cfg.ffn_dim),
            (cfg.n_kv_heads, cfg.n_kv_heads, keep.layers[0].ffn.len())
        );
        let zeroed = edited(&src.weights, |n, shape, v| {
            let Some((l, tail)) = n
                .strip_prefix("blk.")
                .and_then(|r| r.split_once('.'))
                .map(|(l, t)| (l.parse::<usize>().unwrap(), t))
            else {
                return false;
            };
            let cols = shape[shape.len() - 1];
            let lk = &keep.layers[l];
            let dead: Box<dyn Fn(usize) -> bool> = match tail {
                "ffn_down.weight" => Box::new(|c| !lk.ffn.contains(&c)),
                "attn_output.weight" => Box::new(|c| !lk.q_heads.contains(&(c / cfg.head_dim))),
                _ => return false,
            };
            for (i, x) in v.iter_mut().enumerate() {
                if dead(i % cols) {
                    *x = 0.0;
                }
            }
            true
        });
        let d = max_diff(&logits(&new_cfg, &w, &toks), &logits(cfg, &zeroed, &toks));
        assert!(d < 1e-4, "{name}: {d}");
    }
}

#[test]
fn width_pruning_by_activation_keeps_groups_and_runs() {
    let calib = tokens(256, 8);
    let toks = tokens(24, 9);
    for name in MODELS {
        let src = tiny(name);
        let cfg = &src.config;
        let model = Model::from_weights(cfg, &src.weights).unwrap();
        let windows: Vec<&[u32]> = calib.chunks(64).collect();
        let imp = width_importance(&model, &windows, |_, _| {}).unwrap();
        assert_eq!(imp.ffn.len(), cfg.n_layers);
        assert_eq!(imp.heads[0].len(), cfg.n_heads);
        assert!(imp.ffn[0].iter().all(|x| *x > 0.0) && imp.hidden.iter().all(|x| *x > 0.0));
        let target = WidthTarget {
            ffn_dim: Some(cfg.ffn_dim / 2),
            n_heads: Some(cfg.n_kv_heads),
            n_kv_heads: None,
            hidden: Some(cfg.hidden_size * 3 / 4),
        };
        let keep = plan_width(cfg, &imp, &target).unwrap();
        let (w, new_cfg) = reshape(&src.weights, cfg, &keep).unwrap();
        assert_eq!(
            (new_cfg.ffn_dim, new_cfg.n_heads, new_cfg.hidden_size),
            (cfg.ffn_dim / 2, cfg.n_kv_heads, cfg.hidden_size * 3 / 4)
        );
        assert_eq!(
            w.get("token_embd.weight").unwrap().shape,
            vec![cfg.vocab_size, cfg.hidden_size * 3 / 4]
        );
        // Each kept query head is the most active of its group.
        for (l, lk) in keep.layers.iter().enumerate() {
            for (g, &h) in lk.q_heads.iter().enumerate() {
                let group = cfg.n_heads / cfg.n_kv_heads;
                let members = &imp.heads[l][g * group..(g + 1) * group];
                let best = members.iter().cloned().fold(f64::MIN, f64::max);
                assert_eq!(imp.heads[l][h], best, "{name} layer {l} group {g}");
            }
        }
        let out = logits(&new_cfg, &w, &toks);
        assert!(out.iter().all(|x| x.is_finite()), "{name}");
        // Same calibration, same cut (deterministic).
        let again = width_importance(&model, &windows, |_, _| {}).unwrap();
        assert_eq!(plan_width(cfg, &again, &target).unwrap(), keep);

        // Targets that break the model are refused with the numbers.
        for (t, needle) in [
            (WidthTarget::default(), "needs a target"),
            (
                WidthTarget {
                    n_heads: Some(cfg.n_kv_heads + 1),
                    ..WidthTarget::default()
                },
                "split evenly",
            ),
            (
                WidthTarget {
                    n_heads: Some(cfg.n_heads),
                    n_kv_heads: Some(1),
                    ..WidthTarget::default()
                },
                "only",
            ),
            (
                WidthTarget {
                    ffn_dim: Some(cfg.ffn_dim + 1),
                    ..WidthTarget::default()
                },
                "pruning only removes",
            ),
            (
                WidthTarget {
                    hidden: Some(0),
                    ..WidthTarget::default()
                },
                "keep no",
            ),
        ] {
            let e = plan_width(cfg, &imp, &t).unwrap_err().to_string();
            assert!(e.contains(needle), "{name} {t:?}: {e}");
        }
    }
}

#[test]
fn block_influence_ranks_every_layer_and_a_moved_head_is_refused() {
    let calib = tokens(128, 10);
    let src = tiny("tiny-llama");
    let cfg = &src.config;
    let model = Model::from_weights(cfg, &src.weights).unwrap();
    let windows: Vec<&[u32]> = calib.chunks(64).collect();
    let scores = block_influence(&model, &windows, |_, _| {}).unwrap();
    assert_eq!(scores.len(), cfg.n_layers);
    assert!(scores.iter().all(|s| s.score.is_finite() && s.score >= 0.0));
    assert_eq!(choose_dropped(&scores, 1).len(), 1);
    // A query head listed under another KV group's slot would change which K/V it reads.
    let mut keep = Keep::all(cfg);
    keep.layers[0].q_heads = vec![0, 2];
    keep.layers[0].kv_heads = vec![1];
    for l in &mut keep.layers[1..] {
        l.q_heads = vec![2, 3];
        l.kv_heads = vec![1];
    }
    let e = reshape(&src.weights, cfg, &keep).unwrap_err().to_string();
    assert!(e.contains("would move from KV group"), "{e}");
    let none = Keep {
        layers: vec![],
        ..Keep::all(cfg)
    };
    let e = reshape(&src.weights, cfg, &none).unwrap_err().to_string();
    assert!(e.contains("no decoder layer"), "{e}");
}
