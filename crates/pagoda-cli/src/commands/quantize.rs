//! `pagoda quantize`: offline quantization of a GGUF model or a Hugging Face folder (F32 / F16
//! / BF16, or any block type, dequantized layer by layer) with RTN, GPTQ or AWQ, into a GGUF
//! file (Q4_0 / Q4_1 / Q8_0 blocks; from a folder, its metadata is made from config.json and
//! the tokenizer files by `gguf_meta`) or a Hugging Face folder in the GPTQ or AWQ layout, with
//! a calibration pass for GPTQ and AWQ and a progress bar per layer. The work is
//! pagoda-compress's; this module parses, picks the output format, reports and writes.
//!
//! Invariant: every option combination the output cannot hold, and an existing OUT without
//! `--force`, is refused before any work; nothing named OUT (or `OUT.partial`) is left behind
//! by a failed run.

use std::path::PathBuf;
use std::time::Instant;

use super::progress::Progress;
use anyhow::{bail, Context};
use clap::Args;
use pagoda_compress::quantize::calibrate::calibrate;
use pagoda_compress::quantize::gguf_meta::{hf_gguf_metadata, HfGgufSource};
use pagoda_compress::quantize::grid::{GridKind, GroupSpec};
use pagoda_compress::quantize::hf_write::{
    partial_path, quantize_for_hf, write_hf_folder, ExportSource, HfExport,
};
use pagoda_compress::quantize::offline::{
    gguf_grid, quantize_model_with, Calibration, Method, OfflineOptions, OutputFormat,
};
use pagoda_compress::quantize::sequential::SequentialCalibration;
use pagoda_compress::quantize::write::{write_gguf, write_gguf_from_hf};
use pagoda_model::gguf::GgufFile;
use pagoda_model::{open_model, Model, ModelFormat};
use pagoda_runtime::loader::{self, Pull};

/// The calibration text shipped with Pagoda (mixed prose, chat, code and arithmetic).
pub(crate) const DEFAULT_CALIBRATION: &str =
    include_str!("../../../pagoda-compress/data/calibration.txt");

/// Arguments of `pagoda quantize`.
#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// The model to quantize: a store name, a GGUF file (its metadata is copied) or a Hugging
    /// Face folder (config.json + safetensors in F32/F16/BF16, tokenizer.json,
    /// tokenizer_config.json). GGUF output from a folder makes llama.cpp's metadata from those
    /// files: Llama and Qwen2 with a byte-level BPE vocabulary (SentencePiece vocabularies and
    /// Gemma 3 are refused before any work).
    pub model: String,
    /// Output: a GGUF file, or a folder for --format gptq/awq (written only when complete).
    #[arg(short, long)]
    pub output: PathBuf,
    /// gguf (one file of Q4_0/Q4_1/Q8_0 blocks), gptq (Hugging Face folder, AutoGPTQ v1
    /// packing: vLLM, transformers, AutoGPTQ load it) or awq (folder, AutoAWQ GEMM packing,
    /// 4-bit). Default: gguf when OUT ends in .gguf, else the layout named by --method
    /// (gptq, or awq for awq and awq-gptq); --method rtn to a folder needs --format.
    #[arg(long)]
    pub format: Option<String>,
    /// Replace OUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// rtn (round to nearest), gptq (Hessian-based error compensation), awq
    /// (activation-aware channel scaling, then RTN) or awq-gptq (AWQ's channel scaling, then
    /// GPTQ on the scaled weights instead of RTN).
    #[arg(long, default_value = "gptq")]
    pub method: String,
    /// Bits per weight: 4 (GGUF Q4_0 symmetric / Q4_1 asymmetric) or 8 (GGUF Q8_0,
    /// symmetric; GPTQ 8-bit). AWQ output is 4-bit only.
    #[arg(long, default_value_t = 4)]
    pub bits: u8,
    /// Columns per group (a multiple of 32); 0 = one group per row.
    #[arg(long, default_value_t = 32)]
    pub group_size: usize,
    /// Symmetric grid (zero point in the middle); the default is asymmetric for 4 bits.
    #[arg(long)]
    pub sym: bool,
    /// GGUF 4-bit asymmetric: GPTQ/AWQ's integer zero point instead of the default float
    /// minimum per group, which Q4_1 blocks hold exactly (GPTQ/AWQ folders always use the
    /// integer zero point).
    #[arg(long)]
    pub int_zero: bool,
    /// GPTQ: quantize columns by decreasing Hessian diagonal (kept exactly in --format gptq
    /// through g_idx; GGUF blocks cannot hold it).
    #[arg(long)]
    pub act_order: bool,
    /// GPTQ dampening, as a fraction of the mean Hessian diagonal.
    #[arg(long, default_value_t = 0.01)]
    pub damp: f64,
    /// Fit each group's grid on the clipping range (100 % down to 80 % of its min/max) with
    /// the least squared rounding error instead of the full range (GPTQ's `mse` option; all
    /// methods).
    #[arg(long)]
    pub clip_search: bool,
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
pub(crate) fn calibration_text(path: &std::path::Path) -> anyhow::Result<String> {
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

/// The output format: `--format`, else from OUT's extension and the method.
fn output_format(args: &QuantizeArgs, method: Method) -> anyhow::Result<OutputFormat> {
    let is_gguf_name = args
        .output
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let format = match &args.format {
        Some(f) => f.parse::<OutputFormat>()?,
        None if is_gguf_name => OutputFormat::Gguf,
        None => match method {
            Method::Gptq => OutputFormat::Gptq,
            Method::Awq | Method::AwqGptq => OutputFormat::Awq,
            Method::Rtn => bail!(
                "{} does not end in .gguf: say which output you want with --format gguf, \
                 --format gptq or --format awq (Hugging Face folders)",
                args.output.display()
            ),
        },
    };
    if format != OutputFormat::Gguf && is_gguf_name {
        bail!(
            "--format {} writes a Hugging Face folder, but {} ends in .gguf; name the \
             output folder without the .gguf extension",
            format.as_str(),
            args.output.display()
        );
    }
    Ok(format)
}

/// The summary of the calibration output errors: the method's against round-to-nearest's.
/// A ratio is only meaningful while RTN leaves a real error; when RTN does better the line
/// says so instead of printing a huge percentage (typical when the source is itself a 4-bit
/// model on this grid, where RTN reproduces it exactly).
fn calibration_error_line(method: Method, mine: f64, rtn: f64) -> String {
    if mine <= rtn {
        format!(
            "calibration output error: {mine:.4e} ({:.1}% of RTN's {rtn:.4e})",
            100.0 * mine / rtn.max(f64::MIN_POSITIVE)
        )
    } else {
        format!(
            "calibration output error: {mine:.4e}, above RTN's {rtn:.4e}: {} did not improve on \
             round-to-nearest for these weights (they may already lie on this grid, e.g. a \
             model that was quantized to it before); compare with `--method rtn`",
            method.as_str()
        )
    }
}

/// The `general.quantized_by` note of an RTN run with `args`.
fn started_note(args: &QuantizeArgs) -> String {
    format!(
        "rtn {}-bit group {} {} tensor by tensor",
        args.bits,
        args.group_size,
        if args.sym { "sym" } else { "asym float-min" }
    )
}

/// RTN into GGUF blocks of type `ty`, tensor by tensor, for a GGUF whose layers the layer-wise
/// quantizer cannot walk (mixtures of experts, layers that differ): every weight matrix of
/// the file as it is stored (stacked experts included) quantized row by row with the block
/// type's own round-to-nearest, by llama.cpp's rules (`quantize::rules`: norms, biases and
/// routers kept, the output head Q6_K or Q8_0), then written with the file's metadata.
fn quantize_file_tensorwise(
    path: &std::path::Path,
    ty: pagoda_kernels::GgmlType,
    out: &std::path::Path,
    note: String,
) -> anyhow::Result<()> {
    use pagoda_compress::quantize::{quantize_weights, QuantOptions, QuantTarget};
    let started = Instant::now();
    let gguf = GgufFile::open(path)?;
    let weights = pagoda_model::weights::Weights::from_gguf(&gguf)?;
    let target = QuantTarget::new(ty)?;
    let (quantized, report) = quantize_weights(&weights, target, &QuantOptions::default())?;
    let written = write_gguf(&gguf, &quantized, ty, &note, out)?;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "{}; wrote {} ({:.1} MiB) in {:.1} s",
        report,
        out.display(),
        mib(written),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Runs `pagoda quantize`.
pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    let method: Method = args.method.parse()?;
    let format = output_format(&args, method)?;
    let grid = if format != OutputFormat::Gguf || args.int_zero {
        GridKind::IntegerZero
    } else {
        gguf_grid(args.bits, args.sym)
    };
    let opts = OfflineOptions {
        method,
        spec: GroupSpec {
            bits: args.bits,
            group_size: (args.group_size > 0).then_some(args.group_size),
            symmetric: args.sym,
            grid,
            clip_search: args.clip_search,
        },
        act_order: args.act_order,
        damp: args.damp,
        awq_grid: 20,
    };
    let ty = opts.output_type(format)?;
    let partial = partial_path(&args.output);
    if args.output.exists() && !args.force {
        bail!(
            "{} already exists; choose another output or pass --force to replace it",
            args.output.display()
        );
    }
    let store = crate::commands::open_store()?;
    let resolved = loader::resolve(&store, &args.model, Pull::IfMissing)?;
    let source = open_model(&resolved.path)
        .with_context(|| format!("opening {}", resolved.path.display()))?;
    let from_gguf = source.format == ModelFormat::Gguf;
    if let Some(why) = source.config.irregular_layers() {
        let tensorwise = method == Method::Rtn
            && from_gguf
            && format == OutputFormat::Gguf
            && args.group_size == 32
            && !args.clip_search
            && !args.int_zero;
        if !tensorwise {
            bail!(
                "{}; RTN into GGUF blocks works for it, tensor by tensor (`--method rtn` on a \
                 GGUF, groups of 32, to a .gguf: every matrix, stacked experts included)",
                pagoda_compress::quantize::offline::check_model(&source.config)
                    .err()
                    .map_or_else(|| why.to_string(), |e| e.to_string())
            );
        }
        return quantize_file_tensorwise(&resolved.path, ty, &args.output, started_note(&args));
    }
    // A Hugging Face folder's config.json: the folder outputs copy it, GGUF output makes its
    // metadata from it.
    let config_json: Option<serde_json::Value> = if from_gguf {
        None
    } else {
        let path = resolved.path.join("config.json");
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        Some(
            serde_json::from_slice(&bytes)
                .with_context(|| format!("{}: not valid JSON", path.display()))?,
        )
    };
    let hf_gguf = match (&config_json, format) {
        (Some(config_json), OutputFormat::Gguf) => {
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
        _ => None,
    };
    let started = Instant::now();
    let tokens = if method.needs_calibration() {
        let text = match &args.calibration {
            Some(p) => calibration_text(p)?,
            None => DEFAULT_CALIBRATION.to_string(),
        };
        source.tokenizer.encode(&text, true)?
    } else {
        Vec::new()
    };
    let one_pass_stats = if method.needs_calibration() && args.one_pass {
        let model = Model::from_source(&source)?;
        let windows = tokens
            .len()
            .div_ceil(args.window.max(1))
            .min(args.max_windows);
        let pb = Progress::new("quantize", "calibration windows", windows);
        let stats = calibrate(&model, &tokens, args.window, args.max_windows, |d, _| {
            pb.set(d)
        })?;
        pb.finish();
        eprintln!(
            "calibration: {} tokens, {} input sites, one pass",
            stats.tokens,
            stats.sites.len()
        );
        Some(stats)
    } else {
        None
    };
    let calib = match (&one_pass_stats, method.needs_calibration()) {
        (Some(stats), _) => Calibration::OnePass(stats),
        (None, true) => Calibration::Sequential(SequentialCalibration {
            tokens: &tokens,
            window: args.window,
            max_windows: args.max_windows,
        }),
        (None, false) => Calibration::None,
    };
    let pb = Progress::new("quantize", "layers", source.config.n_layers);
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let (report, written, what) = if format == OutputFormat::Gguf {
        let (weights, report) =
            quantize_model_with(&source.weights, &source.config, &calib, &opts, |d, _| {
                pb.set(d)
            })?;
        pb.finish();
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
        let written = match &hf_gguf {
            Some(src) => write_gguf_from_hf(src, &weights, ty, &note, &args.output)?,
            None => {
                let gguf = GgufFile::open(&resolved.path)?;
                write_gguf(&gguf, &weights, ty, &note, &args.output)?
            }
        };
        (report, written, format!("{ty}"))
    } else {
        let quantized = quantize_for_hf(
            &source.weights,
            &source.config,
            &calib,
            &opts,
            format,
            from_gguf,
            |d, _| pb.set(d),
        )?;
        pb.finish();
        let export_source = match &config_json {
            None => ExportSource::Gguf {
                tokenizer: &source.tokenizer,
                chat_template: source.chat_template.as_ref().map(|t| t.source()),
            },
            Some(config_json) => ExportSource::HfFolder {
                dir: &resolved.path,
                config_json,
            },
        };
        let export = HfExport {
            format,
            spec: opts.spec,
            act_order: opts.act_order,
            damp: opts.damp,
            weights: &source.weights,
            cfg: &source.config,
            source: export_source,
            quantized: &quantized,
        };
        let written = write_hf_folder(&export, &args.output, args.force)?;
        (
            quantized.report,
            written.bytes,
            format!(
                "{} {}-bit ({}, loads as {ty})",
                written.checkpoint_format,
                args.bits,
                format.as_str()
            ),
        )
    };
    debug_assert!(!partial.exists());
    if let Some(used) = report.calibration_tokens {
        eprintln!("calibration: {used} tokens, layer by layer");
    }
    eprintln!(
        "quantized {} matrices to {what} with {} in {:.1} s: weights {:.1} MiB -> {:.1} MiB; \
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
        eprintln!("{}", calibration_error_line(method, mine, rtn));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_error_is_a_ratio_only_while_the_method_beats_rtn() {
        let better = calibration_error_line(Method::Gptq, 1.0, 4.0);
        assert!(better.contains("25.0% of RTN's"), "{better}");
        let worse = calibration_error_line(Method::Gptq, 34.0, 1.0);
        assert!(!worse.contains('%'), "{worse}");
        assert!(
            worse.contains("above RTN's") && worse.contains("gptq"),
            "{worse}"
        );
    }
}
