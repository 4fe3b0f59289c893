//! `pagoda prune`: unstructured or N:M pruning of a GGUF model or a Hugging Face folder by
//! magnitude, Wanda or SparseGPT, calibrated layer by layer on the same text and windows as
//! `pagoda quantize`, into a GGUF file (pruned matrices F16, everything else as it was). The
//! work is pagoda-compress's (`prune`); this module parses, reports and writes.
//!
//! Invariant: every bad option (method, pattern, sparsity), an unreadable or malformed
//! calibration file, and an existing OUT without `--force` are refused before any work;
//! nothing named OUT (or `OUT.partial`) is left behind by a failed run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use pagoda_compress::prune::{prune_model, Pattern, PruneMethod, PruneOptions, PruneReport};
use pagoda_compress::quantize::gguf_meta::{hf_gguf_metadata, HfGgufSource};
use pagoda_compress::quantize::sequential::SequentialCalibration;
use pagoda_compress::quantize::write::{write_gguf, write_gguf_from_hf};
use pagoda_kernels::GgmlType;
use pagoda_model::gguf::GgufFile;
use pagoda_model::{open_model, ModelFormat};
use pagoda_runtime::loader::{self, Pull};

use super::quantize::{bar, calibration_text, DEFAULT_CALIBRATION};

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
    /// or sparsegpt (Hessian-based error compensation, as GPTQ).
    #[arg(long, default_value = "wanda")]
    pub method: String,
    /// Fraction of each matrix's weights to remove, in [0, 1) (default 0.5; fixed by an N:M
    /// pattern).
    #[arg(long, allow_negative_numbers = true)]
    pub sparsity: Option<f64>,
    /// unstructured, or N:M — at most N non-zero weights in every M consecutive inputs of a
    /// row (2:4, 4:8).
    #[arg(long, default_value = "unstructured")]
    pub pattern: String,
    /// SparseGPT dampening, as a fraction of the mean Hessian diagonal.
    #[arg(long, default_value_t = 0.01)]
    pub damp: f64,
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

/// The parsed, checked options.
fn options(args: &PruneArgs) -> anyhow::Result<PruneOptions> {
    let method: PruneMethod = args.method.parse()?;
    let pattern: Pattern = args.pattern.parse()?;
    let mut opts = PruneOptions::new(method, pattern, args.sparsity)?;
    opts.damp = args.damp;
    opts.validate()?;
    Ok(opts)
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
    let opts = options(&args)?;
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
    let hf_gguf = match &config_json {
        Some(config_json) => {
            let src = HfGgufSource {
                dir: &resolved.path,
                config_json,
                cfg: &source.config,
                tokenizer: &source.tokenizer,
                chat_template: source.chat_template.as_ref().map(|t| t.source()),
            };
            // Refuse what GGUF cannot hold (architecture, tokenizer) before any work.
            hf_gguf_metadata(&src)?;
            Some(src)
        }
        None => None,
    };
    let started = Instant::now();
    let tokens = source.tokenizer.encode(&text, true)?;
    let seq = SequentialCalibration {
        tokens: &tokens,
        window: args.window,
        max_windows: args.max_windows,
    };
    let pb = bar(source.config.n_layers, "layers");
    let (weights, report) = prune_model(&source.weights, &source.config, &seq, &opts, |d, _| {
        pb.set_position(d as u64)
    })?;
    pb.finish_and_clear();
    let note = format!(
        "prune {} {} sparsity {}",
        opts.method.as_str(),
        opts.pattern,
        opts.sparsity
    );
    let written = match &hf_gguf {
        Some(src) => write_gguf_from_hf(src, &weights, GgmlType::F16, &note, &args.output)?,
        None => {
            let gguf = GgufFile::open(&resolved.path)?;
            write_gguf(&gguf, &weights, GgmlType::F16, &note, &args.output)?
        }
    };
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
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

    fn args(method: &str, pattern: &str, sparsity: Option<f64>) -> PruneArgs {
        PruneArgs {
            model: "m".into(),
            output: "out.gguf".into(),
            force: false,
            method: method.into(),
            sparsity,
            pattern: pattern.into(),
            damp: 0.01,
            calibration: None,
            window: 512,
            max_windows: 16,
        }
    }

    #[test]
    fn prune_options_refuse_bad_input_with_the_reason() {
        for (a, needle) in [
            (args("obs", "unstructured", None), "unknown pruning method"),
            (args("wanda", "unstructured", Some(1.0)), "outside [0, 1)"),
            (args("wanda", "unstructured", Some(-0.2)), "outside [0, 1)"),
            (args("wanda", "4:4", None), "less than M"),
            (args("wanda", "8:4", None), "less than M"),
            (args("sparsegpt", "2:4", Some(0.3)), "contradicts"),
            (args("layers", "unstructured", None), "not available yet"),
        ] {
            let e = options(&a).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        let o = options(&args("sparsegpt", "2:4", None)).unwrap();
        assert_eq!((o.sparsity, o.method), (0.5, PruneMethod::SparseGpt));
    }
}
