//! `pagoda quantize`: offline quantization of a GGUF model with RTN, GPTQ or AWQ into a new
//! GGUF file (Q4_0 / Q4_1 / Q8_0 blocks), with a calibration pass for GPTQ and AWQ and a
//! progress bar per layer. The work is pagoda-compress's; this module parses, reports and
//! writes.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pagoda_compress::quantize::calibrate::calibrate;
use pagoda_compress::quantize::grid::{GridKind, GroupSpec};
use pagoda_compress::quantize::offline::{gguf_grid, quantize_model, Method, OfflineOptions};
use pagoda_compress::quantize::sequential::quantize_model_sequential;
use pagoda_compress::quantize::write::write_gguf;
use pagoda_model::gguf::GgufFile;
use pagoda_model::{open_model, Model, ModelFormat};
use pagoda_server::loader::{self, Pull};

/// The calibration text shipped with Pagoda (mixed prose, chat, code and arithmetic).
const DEFAULT_CALIBRATION: &str = include_str!("../../../pagoda-compress/data/calibration.txt");

/// Arguments of `pagoda quantize`.
#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// The model to quantize: a store name or a GGUF file (its metadata is copied).
    pub model: String,
    /// Output GGUF file (written only when complete).
    #[arg(short, long)]
    pub output: PathBuf,
    /// rtn (round to nearest), gptq (Hessian-based error compensation) or awq
    /// (activation-aware channel scaling, then RTN).
    #[arg(long, default_value = "gptq")]
    pub method: String,
    /// Bits per weight: 4 (Q4_0 symmetric / Q4_1 asymmetric) or 8 (Q8_0, symmetric).
    #[arg(long, default_value_t = 4)]
    pub bits: u8,
    /// Columns per group (a multiple of 32); 0 = one group per row.
    #[arg(long, default_value_t = 32)]
    pub group_size: usize,
    /// Symmetric grid (zero point in the middle); the default is asymmetric for 4 bits.
    #[arg(long)]
    pub sym: bool,
    /// 4-bit asymmetric: GPTQ/AWQ's integer zero point instead of the default float minimum
    /// per group, which Q4_1 blocks hold exactly.
    #[arg(long)]
    pub int_zero: bool,
    /// GPTQ: quantize columns by decreasing Hessian diagonal (not representable in GGUF:
    /// refused for now).
    #[arg(long)]
    pub act_order: bool,
    /// GPTQ dampening, as a fraction of the mean Hessian diagonal.
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
    /// GPTQ/AWQ: record every layer's statistics in one pass over the unquantized model
    /// (all Hessians in memory at once) instead of layer by layer on the outputs of the
    /// layers already quantized (the default, as GPTQ's and AWQ's references do).
    #[arg(long)]
    pub one_pass: bool,
}

/// Reads a calibration file: JSONL lines with "text" (or "prompt"/"content"), else plain text.
fn calibration_text(path: &std::path::Path) -> anyhow::Result<String> {
    let raw = std::fs::read_to_string(path)
        .with_context(|| format!("reading the calibration file {}", path.display()))?;
    let is_jsonl = path.extension().is_some_and(|e| e == "jsonl");
    if !is_jsonl {
        return Ok(raw);
    }
    let mut texts = Vec::new();
    for (i, line) in raw.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
        let text = ["text", "prompt", "content"]
            .iter()
            .find_map(|k| v.get(k).and_then(|t| t.as_str()));
        match text {
            Some(t) => texts.push(t.to_string()),
            None => bail!(
                "{} line {}: no \"text\" field (also accepted: \"prompt\", \"content\")",
                path.display(),
                i + 1
            ),
        }
    }
    Ok(texts.join("\n\n"))
}

fn bar(len: usize, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Runs `pagoda quantize`.
pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    let method: Method = args.method.parse()?;
    let opts = OfflineOptions {
        method,
        spec: GroupSpec {
            bits: args.bits,
            group_size: (args.group_size > 0).then_some(args.group_size),
            symmetric: args.sym,
            grid: if args.int_zero {
                GridKind::IntegerZero
            } else {
                gguf_grid(args.bits, args.sym)
            },
        },
        act_order: args.act_order,
        damp: args.damp,
        awq_grid: 20,
    };
    let ty = opts.gguf_type()?;
    let store = pagoda_store::Store::open(None).context("opening the model store")?;
    let resolved = loader::resolve(&store, &args.model, Pull::IfMissing)?;
    let source = open_model(&resolved.path)
        .with_context(|| format!("opening {}", resolved.path.display()))?;
    if source.format != ModelFormat::Gguf {
        bail!(
            "{} is a Hugging Face folder; `pagoda quantize` writes GGUF and takes the metadata \
             from a GGUF input for now. Quantize the folder at load time instead \
             (`pagoda run/serve --quantize q4_k`), or convert it to GGUF first",
            resolved.path.display()
        );
    }
    let gguf = GgufFile::open(&resolved.path)?;
    let started = Instant::now();
    let text = match &args.calibration {
        Some(p) => calibration_text(p)?,
        None => DEFAULT_CALIBRATION.to_string(),
    };
    let (weights, report) = if method.needs_calibration() && !args.one_pass {
        let tokens = source.tokenizer.encode(&text, true)?;
        let pb = bar(source.config.n_layers, "layers");
        let (weights, report, used) = quantize_model_sequential(
            &source.weights,
            &source.config,
            &tokens,
            args.window,
            args.max_windows,
            &opts,
            |d, _| pb.set_position(d as u64),
        )?;
        pb.finish_and_clear();
        eprintln!("calibration: {used} tokens, layer by layer");
        (weights, report)
    } else {
        let calib = if method.needs_calibration() {
            let tokens = source.tokenizer.encode(&text, true)?;
            let model = Model::from_source(&source)?;
            let windows = tokens
                .len()
                .div_ceil(args.window.max(1))
                .min(args.max_windows);
            let pb = bar(windows, "calibration");
            let stats = calibrate(&model, &tokens, args.window, args.max_windows, |d, _| {
                pb.set_position(d as u64)
            })?;
            pb.finish_and_clear();
            eprintln!(
                "calibration: {} tokens, {} input sites, one pass",
                stats.tokens,
                stats.sites.len()
            );
            Some(stats)
        } else {
            None
        };
        let pb = bar(source.config.n_layers, "layers");
        let out = quantize_model(
            &source.weights,
            &source.config,
            calib.as_ref(),
            &opts,
            |d, _| pb.set_position(d as u64),
        )?;
        pb.finish_and_clear();
        out
    };
    let note = format!(
        "{} {}-bit group {} {}",
        method.as_str(),
        args.bits,
        args.group_size,
        match (args.sym, opts.spec.grid) {
            (true, _) => "sym",
            (false, GridKind::FloatMin) => "asym float-min",
            (false, GridKind::IntegerZero) => "asym int-zero",
        }
    );
    let written = write_gguf(&gguf, &weights, ty, &note, &args.output)?;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "quantized {} matrices to {ty} with {} in {:.1} s: weights {:.1} MiB -> {:.1} MiB; \
         wrote {} ({:.1} MiB)",
        report.matrices.len(),
        method.as_str(),
        started.elapsed().as_secs_f64(),
        mib(report.bytes_before),
        mib(report.bytes_after),
        args.output.display(),
        mib(written)
    );
    if let Some((mine, rtn)) = report.total_errors() {
        eprintln!(
            "calibration output error: {mine:.4e} ({:.1}% of RTN's {rtn:.4e})",
            100.0 * mine / rtn.max(f64::MIN_POSITIVE)
        );
    }
    Ok(())
}
