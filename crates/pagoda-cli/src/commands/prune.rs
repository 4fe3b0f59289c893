//! `pagoda prune`: pruning a GGUF model or a Hugging Face folder into a GGUF file, calibrated
//! on the same text and windows as `pagoda quantize`:
//! - unstructured or N:M sparsity by magnitude, Wanda or SparseGPT, layer by layer (pruned
//!   matrices F16, everything else as it was);
//! - structured: `--method layers --drop N` (whole decoder layers by block influence or
//!   perplexity impact) and `--method width` (MLP neurons, attention heads by KV group,
//!   residual channels by activation), written as a smaller model with its shape metadata
//!   set anew.
//!
//! The work is pagoda-compress's (`prune`); this module parses, reports and writes.
//!
//! Invariant: every bad option (method, pattern, sparsity, drop count, widths, options of
//! another method), an unreadable or malformed calibration file, and an existing OUT without
//! `--force` are refused before any work; nothing named OUT (or `OUT.partial`) is left behind
//! by a failed run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use pagoda_compress::prune::layers::{
    block_influence, check_drop, choose_dropped, keep_without, perplexity_impact, LayerRanking,
    LayerScore,
};
use pagoda_compress::prune::reshape::{reshape, Keep};
use pagoda_compress::prune::width::{plan_width, width_importance, WidthTarget};
use pagoda_compress::prune::{prune_model, Pattern, PruneMethod, PruneOptions, PruneReport};
use pagoda_compress::quantize::calibrate::calibration_windows;
use pagoda_compress::quantize::gguf_meta::{hf_gguf_metadata, HfGgufSource};
use pagoda_compress::quantize::sequential::SequentialCalibration;
use pagoda_compress::quantize::write::{write_gguf, write_gguf_from_hf, write_gguf_reshaped};
use pagoda_kernels::GgmlType;
use pagoda_model::gguf::GgufFile;
use pagoda_model::weights::Weights;
use pagoda_model::{open_model, ModelFormat};
use pagoda_model::{Model, ModelConfig};
use pagoda_runtime::loader::{self, Pull};

use super::progress::Progress;
use super::quantize::{calibration_text, DEFAULT_CALIBRATION};

/// Arguments of `pagoda prune`.
#[derive(Debug, Args)]
pub struct PruneArgs {
    /// The model to prune: a store name, a GGUF file (its metadata is copied) or a Hugging
    /// Face folder (Llama or Qwen2 with a byte-level BPE vocabulary, as `pagoda quantize`).
    pub model: String,
    /// Output GGUF file (written only when complete).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Replace OUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// magnitude (smallest |W| per output row), wanda (smallest |W|·‖X‖₂ per output row)
    /// or sparsegpt (Hessian-based error compensation, as GPTQ): weights set to zero;
    /// layers (remove --drop N whole decoder layers) or width (remove MLP neurons, heads,
    /// residual channels): a smaller model.
    #[arg(long, default_value = "wanda")]
    pub method: String,
    /// --method layers: how many decoder layers to remove.
    #[arg(long)]
    pub drop: Option<usize>,
    /// --method layers: how layers are ranked — influence (ShortGPT's block influence,
    /// 1 − cos(input, output); one pass) or perplexity (calibration perplexity with the layer
    /// removed; one evaluation per layer). Default: influence.
    #[arg(long)]
    pub rank: Option<String>,
    /// --method width: MLP neurons each layer keeps.
    #[arg(long)]
    pub ffn_dim: Option<usize>,
    /// --method width: query heads each layer keeps (a multiple of the KV heads kept).
    #[arg(long)]
    pub heads: Option<usize>,
    /// --method width: KV heads (whole GQA groups) each layer keeps.
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// --method width: residual-stream channels kept (the embedding width).
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Fraction of each matrix's weights to remove, in [0, 1) (default 0.5; fixed by an N:M
    /// pattern).
    #[arg(long, allow_negative_numbers = true)]
    pub sparsity: Option<f64>,
    /// unstructured, or N:M — at most N non-zero weights in every M consecutive inputs of a
    /// row (2:4, 4:8).
    #[arg(long)]
    pub pattern: Option<String>,
    /// SparseGPT dampening, as a fraction of the mean Hessian diagonal (default 0.01).
    #[arg(long)]
    pub damp: Option<f64>,
    /// Calibration data: a text file, or JSONL with a "text" field per line (default: the
    /// built-in mixed text, about 1,700 tokens).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Tokens per calibration window.
    #[arg(long, default_value_t = 512)]
    pub window: usize,
    /// Most calibration windows to run.
    #[arg(long, default_value_t = 16)]
    pub max_windows: usize,
}

/// What a run does.
#[derive(Debug, Clone, PartialEq)]
enum Plan {
    /// Zeros by a mask method.
    Sparse(PruneOptions),
    /// Remove `drop` whole layers ranked by `rank`.
    Layers { drop: usize, rank: LayerRanking },
    /// Narrow every layer to `target`.
    Width(WidthTarget),
}

/// The parsed, checked plan; options of another method than the one chosen are refused
/// (naming them), never ignored.
fn plan(args: &PruneArgs) -> anyhow::Result<Plan> {
    let method = args.method.trim().to_ascii_lowercase();
    let given = |flags: &[(&str, bool)]| -> Vec<String> {
        flags
            .iter()
            .filter(|(_, on)| *on)
            .map(|(f, _)| f.to_string())
            .collect()
    };
    let sparse_flags = given(&[
        ("--sparsity", args.sparsity.is_some()),
        ("--pattern", args.pattern.is_some()),
        ("--damp", args.damp.is_some()),
    ]);
    let layer_flags = given(&[
        ("--drop", args.drop.is_some()),
        ("--rank", args.rank.is_some()),
    ]);
    let width_flags = given(&[
        ("--ffn-dim", args.ffn_dim.is_some()),
        ("--heads", args.heads.is_some()),
        ("--kv-heads", args.kv_heads.is_some()),
        ("--hidden", args.hidden.is_some()),
    ]);
    let refuse = |flags: Vec<String>, which: &str| -> anyhow::Result<()> {
        if flags.is_empty() {
            Ok(())
        } else {
            bail!(
                "{} only applies to --method {which}, not --method {method}",
                flags.join(", ")
            )
        }
    };
    match method.as_str() {
        "layers" => {
            refuse(sparse_flags, "magnitude|wanda|sparsegpt")?;
            refuse(width_flags, "width")?;
            let Some(drop) = args.drop else {
                bail!("--method layers needs --drop N: how many decoder layers to remove");
            };
            Ok(Plan::Layers {
                drop,
                rank: args.rank.as_deref().unwrap_or("influence").parse()?,
            })
        }
        "width" => {
            refuse(sparse_flags, "magnitude|wanda|sparsegpt")?;
            refuse(layer_flags, "layers")?;
            let target = WidthTarget {
                ffn_dim: args.ffn_dim,
                n_heads: args.heads,
                n_kv_heads: args.kv_heads,
                hidden: args.hidden,
            };
            if target == WidthTarget::default() {
                bail!(
                    "--method width needs a target: --ffn-dim, --heads, --kv-heads and/or --hidden"
                );
            }
            Ok(Plan::Width(target))
        }
        _ => {
            refuse(layer_flags, "layers")?;
            refuse(width_flags, "width")?;
            let method: PruneMethod = args.method.parse()?;
            let pattern: Pattern = args.pattern.as_deref().unwrap_or("unstructured").parse()?;
            let mut opts = PruneOptions::new(method, pattern, args.sparsity)?;
            if let Some(damp) = args.damp {
                opts.damp = damp;
            }
            opts.validate()?;
            Ok(Plan::Sparse(opts))
        }
    }
}

/// The layer scores, lowest first, with the dropped ones marked.
fn layer_summary(scores: &[LayerScore], dropped: &[usize], rank: LayerRanking) -> String {
    let what = match rank {
        LayerRanking::Influence => "block influence",
        LayerRanking::Perplexity => "perplexity without it",
    };
    let mut order: Vec<&LayerScore> = scores.iter().collect();
    order.sort_by(|a, b| a.score.total_cmp(&b.score));
    let mut out = format!("{:<6} {:>22}\n", "layer", what);
    for s in order {
        let mark = if dropped.contains(&s.layer) {
            "  dropped"
        } else {
            ""
        };
        out.push_str(&format!("{:<6} {:>22.6}{mark}\n", s.layer, s.score));
    }
    out
}

/// What structured pruning of `cfg` keeps under `plan` (calibrated on `tokens`), with the
/// report lines to print.
fn structured_keep(
    plan: &Plan,
    weights: &Weights,
    cfg: &ModelConfig,
    seq: &SequentialCalibration<'_>,
) -> anyhow::Result<(Keep, String)> {
    let model = Model::from_weights(cfg, weights)?;
    let windows = calibration_windows(&model, seq.tokens, seq.window, seq.max_windows)?;
    match plan {
        Plan::Layers { drop, rank } => {
            check_drop(*drop, cfg.n_layers)?;
            let pb = Progress::new("prune", "layers", cfg.n_layers);
            let scores = match rank {
                LayerRanking::Influence => block_influence(&model, &windows, |d, _| pb.set(d))?,
                LayerRanking::Perplexity => {
                    let used = &seq.tokens[..windows.iter().map(|w| w.len()).sum::<usize>()];
                    perplexity_impact(weights, cfg, used, seq.window, |d, _| pb.set(d))?
                }
            };
            pb.finish();
            let dropped = choose_dropped(&scores, *drop);
            let summary = layer_summary(&scores, &dropped, *rank);
            Ok((keep_without(cfg, &dropped), summary))
        }
        Plan::Width(target) => {
            target.resolve(cfg)?;
            let pb = Progress::new("prune", "windows", windows.len());
            let imp = width_importance(&model, &windows, |d, _| pb.set(d))?;
            pb.finish();
            let keep = plan_width(cfg, &imp, target)?;
            Ok((keep, String::new()))
        }
        Plan::Sparse(_) => bail!("not a structured plan"),
    }
}

/// The summary: sparsity and calibration error per matrix kind, then in total.
fn summary(report: &PruneReport, method: PruneMethod) -> String {
    let mut out = format!(
        "{:<12} {:>10} {:>12} {:>14} {:>9}\n",
        "tensor", "sparsity", "cal. error", "magnitude's", "ratio"
    );
    for (kind, (zeros, total, e, me)) in report.by_kind() {
        out.push_str(&format!(
            "{kind:<12} {:>9.2}% {e:>12.4e} {me:>14.4e} {:>8.1}%\n",
            100.0 * zeros as f64 / total.max(1) as f64,
            100.0 * e / me.max(f64::MIN_POSITIVE)
        ));
    }
    let (e, me) = report.total_errors();
    out.push_str(&format!(
        "calibration output error: {e:.4e} ({:.1}% of magnitude pruning's {me:.4e}, {})",
        100.0 * e / me.max(f64::MIN_POSITIVE),
        method.as_str()
    ));
    out
}

/// Runs `pagoda prune`.
pub fn run(args: PruneArgs) -> anyhow::Result<()> {
    let plan = plan(&args)?;
    if args.output.exists() && !args.force {
        bail!(
            "{} already exists; choose another output or pass --force to replace it",
            args.output.display()
        );
    }
    if args.output.is_dir() {
        bail!(
            "{} is a folder; prune writes one GGUF file",
            args.output.display()
        );
    }
    let text = match &args.calibration {
        Some(p) => calibration_text(p)?,
        None => DEFAULT_CALIBRATION.to_string(),
    };
    let store = crate::commands::open_store()?;
    let resolved = loader::resolve(&store, &args.model, Pull::IfMissing)?;
    let source = open_model(&resolved.path)
        .with_context(|| format!("opening {}", resolved.path.display()))?;
    let config_json: Option<serde_json::Value> = if source.format == ModelFormat::Gguf {
        None
    } else {
        let path = resolved.path.join("config.json");
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        Some(
            serde_json::from_slice(&bytes)
                .with_context(|| format!("{}: not valid JSON", path.display()))?,
        )
    };
    let hf_source = |cfg| {
        config_json.as_ref().map(|config_json| HfGgufSource {
            dir: &resolved.path,
            config_json,
            cfg,
            tokenizer: &source.tokenizer,
            chat_template: source.chat_template.as_ref().map(|t| t.source()),
        })
    };
    if let Some(src) = hf_source(&source.config) {
        // Refuse what GGUF cannot hold (architecture, tokenizer) before any work.
        hf_gguf_metadata(&src)?;
    }
    let started = Instant::now();
    let tokens = source.tokenizer.encode(&text, true)?;
    let seq = SequentialCalibration {
        tokens: &tokens,
        window: args.window,
        max_windows: args.max_windows,
    };
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let opts = match plan {
        Plan::Sparse(opts) => opts,
        structured => {
            let (keep, summary) =
                structured_keep(&structured, &source.weights, &source.config, &seq)?;
            let (weights, cfg) = reshape(&source.weights, &source.config, &keep)?;
            let (name, main_type) = match &structured {
                Plan::Layers { drop, rank } => {
                    (format!("layers drop {drop} by {}", rank.as_str()), None)
                }
                _ => ("width".to_string(), Some(GgmlType::F16)),
            };
            let note = format!("prune {name}");
            let written = match hf_source(&cfg) {
                Some(src) => write_gguf_from_hf(
                    &src,
                    &weights,
                    main_type.unwrap_or(GgmlType::F16),
                    &note,
                    &args.output,
                )?,
                None => {
                    let gguf = GgufFile::open(&resolved.path)?;
                    write_gguf_reshaped(&gguf, &cfg, &weights, main_type, &note, &args.output)?
                }
            };
            if !summary.is_empty() {
                eprint!("{summary}");
            }
            let params = |w: &Weights| w.n_parameters() as f64 / 1e6;
            eprintln!(
                "{}: {} -> {} layers, hidden {} -> {}, heads {}/{} -> {}/{}, MLP {} -> {}; \
                 {:.1}M -> {:.1}M parameters in {:.1} s; wrote {} ({:.1} MiB)",
                name,
                source.config.n_layers,
                cfg.n_layers,
                source.config.hidden_size,
                cfg.hidden_size,
                source.config.n_heads,
                source.config.n_kv_heads,
                cfg.n_heads,
                cfg.n_kv_heads,
                source.config.ffn_dim,
                cfg.ffn_dim,
                params(&source.weights),
                params(&weights),
                started.elapsed().as_secs_f64(),
                args.output.display(),
                mib(written)
            );
            return Ok(());
        }
    };
    let pb = Progress::new("prune", "layers", source.config.n_layers);
    let (weights, report) = prune_model(&source.weights, &source.config, &seq, &opts, |d, _| {
        pb.set(d)
    })?;
    pb.finish();
    let note = format!(
        "prune {} {} sparsity {}",
        opts.method.as_str(),
        opts.pattern,
        opts.sparsity
    );
    let written = match hf_source(&source.config) {
        Some(src) => write_gguf_from_hf(&src, &weights, GgmlType::F16, &note, &args.output)?,
        None => {
            let gguf = GgufFile::open(&resolved.path)?;
            write_gguf(&gguf, &weights, GgmlType::F16, &note, &args.output)?
        }
    };
    eprintln!(
        "calibration: {} tokens, layer by layer",
        report.calibration_tokens
    );
    eprintln!("{}", summary(&report, opts.method));
    eprintln!(
        "pruned {} matrices ({} {}, {:.2}% zeros) with {} in {:.1} s; wrote {} ({:.1} MiB, \
         pruned matrices F16)",
        report.matrices.len(),
        opts.pattern,
        opts.sparsity,
        100.0 * report.sparsity(),
        opts.method.as_str(),
        started.elapsed().as_secs_f64(),
        args.output.display(),
        mib(written)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(method: &str, pattern: Option<&str>, sparsity: Option<f64>) -> PruneArgs {
        PruneArgs {
            model: "m".into(),
            output: "out.gguf".into(),
            force: false,
            method: method.into(),
            drop: None,
            rank: None,
            ffn_dim: None,
            heads: None,
            kv_heads: None,
            hidden: None,
            sparsity,
            pattern: pattern.map(str::to_string),
            damp: None,
            calibration: None,
            window: 512,
            max_windows: 16,
        }
    }

    #[test]
    fn prune_options_refuse_bad_input_with_the_reason() {
        let layers = |drop: Option<usize>, rank: &str| PruneArgs {
            drop,
            rank: Some(rank.into()),
            ..args("layers", None, None)
        };
        let width = |ffn: Option<usize>| PruneArgs {
            ffn_dim: ffn,
            ..args("width", None, None)
        };
        for (a, needle) in [
            (args("obs", None, None), "unknown pruning method"),
            (args("wanda", None, Some(1.0)), "outside [0, 1)"),
            (args("wanda", None, Some(-0.2)), "outside [0, 1)"),
            (args("wanda", Some("4:4"), None), "less than M"),
            (args("wanda", Some("8:4"), None), "less than M"),
            (args("sparsegpt", Some("2:4"), Some(0.3)), "contradicts"),
            (args("layers", None, None), "needs --drop N"),
            (args("layers", Some("2:4"), None), "--pattern only applies"),
            (layers(Some(2), "shortgpt"), "unknown layer ranking"),
            (
                PruneArgs {
                    rank: Some("perplexity".into()),
                    ..width(Some(64))
                },
                "--rank only applies to --method layers",
            ),
            (width(None), "needs a target"),
            (
                PruneArgs {
                    drop: Some(2),
                    ..width(Some(64))
                },
                "--drop only applies to --method layers",
            ),
            (
                PruneArgs {
                    heads: Some(4),
                    ..args("wanda", None, None)
                },
                "--heads only applies to --method width",
            ),
        ] {
            let e = plan(&a).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        let Plan::Sparse(o) = plan(&args("sparsegpt", Some("2:4"), None)).unwrap() else {
            panic!("a mask method gives a sparse plan");
        };
        assert_eq!((o.sparsity, o.method), (0.5, PruneMethod::SparseGpt));
        assert_eq!(
            plan(&layers(Some(3), "perplexity")).unwrap(),
            Plan::Layers {
                drop: 3,
                rank: LayerRanking::Perplexity
            }
        );
    }
}
