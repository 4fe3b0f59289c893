//! `pagoda compress`: the distill → prune → quantize pipeline (in any order the user gives)
//! as one command. Each `--stage` is a `pagoda prune`, `pagoda distill` or `pagoda quantize`
//! invocation without its input and output; the stages run in order as child processes of
//! this binary, each on the previous stage's output, into one folder; then `pagoda eval
//! report` measures the source and every stage's model (size, peak RSS, prefill and decode
//! tokens/s, perplexity, multiple-choice and GSM8K scores) as a table, JSON and a plot, and a
//! stage table (command, time, peak RSS of the stage) is written beside it.
//!
//! Progress: a `compress: stage i/n` line per stage; within a stage, the stage command's own
//! progress ([`super::progress`]: a bar on a terminal, lines otherwise).
//!
//! Invariants:
//! - Every stage's command line is parsed by this binary's own argument parser (handed in by
//!   main as `check`, so this module does not import the parser that imports it) before any
//!   stage runs, so an unknown stage, flag or value is refused before any work; a stage may
//!   not name its input, its output or `--force` (the pipeline owns them).
//! - Stage outputs are written atomically by the stage commands, so a stage output that
//!   exists is complete: a rerun reuses it (an interrupted pipeline resumes at the first
//!   missing stage) unless `--force`, which removes the folder's stage outputs first.
//! - A failed stage stops the pipeline with its name and exit status; the stages before it
//!   stay for the rerun.

use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

/// The stage commands a pipeline may run.
const STAGES: [&str; 3] = ["distill", "prune", "quantize"];

/// Environment variable naming a file the binary writes its peak RSS (MiB) to on exit;
/// how a stage's memory is measured.
pub const PEAK_RSS_FILE_ENV: &str = "PAGODA_PEAK_RSS_FILE";

/// Arguments of `pagoda compress`.
#[derive(Debug, Args)]
pub struct CompressArgs {
    /// The model to start from: a store name, a GGUF file or a Hugging Face folder.
    pub model: String,
    /// Output folder: one model per stage (`1-distill.gguf`, `2-prune.gguf`, ...),
    /// `stages.json`, `stages.md`, and the report (`report.md`, `report.json`, `report.svg`).
    #[arg(short, long)]
    pub output: PathBuf,
    /// A stage, run in the order given (repeatable): the subcommand and its options without
    /// the input model and -o, e.g. "distill --teacher qwen2.5-coder:1.5b --data train.jsonl
    /// --steps 200", "prune --method layers --drop 6", "quantize --method gptq --bits 4".
    #[arg(long = "stage", required = true, value_name = "COMMAND")]
    pub stages: Vec<String>,
    /// Run every stage again (default: a stage whose output exists is reused, so a rerun
    /// resumes an interrupted pipeline).
    #[arg(long)]
    pub force: bool,
    /// Options of `pagoda eval report` for the report, e.g. "--mc --gsm8k 20 --ppl-text
    /// eval.txt" (see `pagoda eval report --help`).
    #[arg(long, default_value = "--mc", allow_hyphen_values = true)]
    pub report: String,
    /// Run the stages only, no report.
    #[arg(long)]
    pub no_report: bool,
}

/// One stage as planned.
#[derive(Debug, Clone, PartialEq)]
struct Stage {
    /// `prune`, `distill` or `quantize`.
    name: String,
    /// The stage's own options.
    options: Vec<String>,
    /// Where it writes.
    output: PathBuf,
}

impl Stage {
    /// The full command line (after the binary) for `input`.
    fn argv(&self, input: &str) -> Vec<String> {
        let mut argv = vec![self.name.clone()];
        argv.extend(self.options.iter().cloned());
        if self.name == "distill" {
            argv.extend(["--student".to_string(), input.to_string()]);
        } else {
            argv.push(input.to_string());
        }
        argv.extend(["-o".to_string(), self.output.display().to_string()]);
        argv
    }
}

/// What one stage did, for `stages.json`.
#[derive(Debug, Clone, Serialize)]
struct StageRecord {
    stage: String,
    command: String,
    output: String,
    /// Reused from an earlier run (no time or memory measured now).
    reused: bool,
    seconds: Option<f64>,
    peak_rss_mib: Option<f64>,
    size_mib: f64,
}

/// Splits a stage's text into words (shell quoting rules), or says why it cannot.
fn words(text: &str, what: &str) -> anyhow::Result<Vec<String>> {
    shlex::split(text).with_context(|| format!("{what} `{text}`: unbalanced quotes"))
}

/// Parses a command line (after the binary's name) as the binary would: the error text, or
/// `Ok` when it would run.
pub type ArgvCheck = fn(&[String]) -> Result<(), String>;

/// The stages of `args`, each checked by `check` as it will run, or the first reason one
/// cannot run.
fn plan(
    args: &CompressArgs,
    input_is_folder: bool,
    check: ArgvCheck,
) -> anyhow::Result<Vec<Stage>> {
    let mut stages = Vec::new();
    let mut folder = input_is_folder;
    for (i, text) in args.stages.iter().enumerate() {
        let mut w = words(text, "--stage")?;
        if w.is_empty() {
            bail!(
                "--stage {}: empty; give a command such as \"prune --method layers --drop 6\"",
                i + 1
            );
        }
        let name = w.remove(0);
        if !STAGES.contains(&name.as_str()) {
            bail!(
                "--stage {}: `{name}` is not a pipeline stage; use {}",
                i + 1,
                STAGES.join(", ")
            );
        }
        for owned in ["-o", "--output", "--student", "--force"] {
            if w.iter()
                .any(|a| a == owned || a.starts_with(&format!("{owned}=")))
            {
                bail!(
                    "--stage {} ({name}): `{owned}` is set by the pipeline (input: the previous \
                     stage's output, output: the folder); leave it out",
                    i + 1
                );
            }
        }
        // prune and quantize write GGUF files; distill writes the student's format.
        let ext = if name == "distill" && folder {
            ""
        } else {
            ".gguf"
        };
        folder = ext.is_empty();
        let stage = Stage {
            output: args.output.join(format!("{}-{name}{ext}", i + 1)),
            name,
            options: w,
        };
        check(&stage.argv("MODEL"))
            .map_err(|e| anyhow::anyhow!("--stage {} ({}): {e}", i + 1, stage.name))?;
        stages.push(stage);
    }
    Ok(stages)
}

/// Size of a file, or of every file under a folder, in MiB.
fn size_mib(path: &Path) -> f64 {
    fn bytes(p: &Path) -> u64 {
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => std::fs::read_dir(p)
                .map(|d| d.flatten().map(|e| bytes(&e.path())).sum())
                .unwrap_or(0),
            Ok(m) => m.len(),
            Err(_) => 0,
        }
    }
    bytes(path) as f64 / (1024.0 * 1024.0)
}

/// The stage table as Markdown.
fn stage_table(records: &[StageRecord]) -> String {
    let mut out = String::from(
        "| # | stage | command | output MiB | time s | peak RSS MiB |\n|---|---|---|---|---|---|\n",
    );
    for (i, r) in records.iter().enumerate() {
        let num = |v: Option<f64>| v.map_or("reused".to_string(), |v| format!("{v:.1}"));
        out.push_str(&format!(
            "| {} | {} | `{}` | {:.1} | {} | {} |\n",
            i + 1,
            r.stage,
            r.command.replace('|', "\\|"),
            r.size_mib,
            num(r.seconds),
            num(r.peak_rss_mib)
        ));
    }
    out
}

/// Runs `pagoda compress`; `check` parses a stage's command line as the binary would.
pub fn run(args: CompressArgs, check: ArgvCheck) -> anyhow::Result<()> {
    let input_is_folder = Path::new(&args.model).is_dir();
    let stages = plan(&args, input_is_folder, check)?;
    let report_options = words(&args.report, "--report")?;
    if args.output.exists() && !args.output.is_dir() {
        bail!("{} exists and is not a folder", args.output.display());
    }
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    if args.force {
        for s in &stages {
            if s.output.is_dir() {
                std::fs::remove_dir_all(&s.output)?;
            } else if s.output.exists() {
                std::fs::remove_file(&s.output)?;
            }
        }
    }
    let exe = std::env::current_exe().context("locating the pagoda binary")?;
    let mut input = args.model.clone();
    let mut records = Vec::new();
    for (i, stage) in stages.iter().enumerate() {
        let argv = stage.argv(&input);
        let command = format!(
            "pagoda {}",
            shlex::try_join(argv.iter().map(String::as_str))?
        );
        let (reused, seconds, peak) = if stage.output.exists() {
            eprintln!(
                "compress: stage {}/{} ({}): reusing {}",
                i + 1,
                stages.len(),
                stage.name,
                stage.output.display()
            );
            (true, None, None)
        } else {
            eprintln!(
                "compress: stage {}/{} ({}): {command}",
                i + 1,
                stages.len(),
                stage.name
            );
            let rss_file = args.output.join(format!(".{}-{}.rss", i + 1, stage.name));
            let started = Instant::now();
            let status = Process::new(&exe)
                .args(&argv)
                .env(PEAK_RSS_FILE_ENV, &rss_file)
                .status()
                .with_context(|| format!("starting stage {} ({})", i + 1, stage.name))?;
            let seconds = started.elapsed().as_secs_f64();
            if !status.success() {
                bail!(
                    "stage {} ({}) failed ({status}); the stages before it are kept and a rerun \
                     reuses them",
                    i + 1,
                    stage.name
                );
            }
            let peak = std::fs::read_to_string(&rss_file)
                .ok()
                .and_then(|s| s.trim().parse::<f64>().ok());
            let _ = std::fs::remove_file(&rss_file);
            (false, Some(seconds), peak)
        };
        records.push(StageRecord {
            stage: stage.name.clone(),
            command,
            output: stage.output.display().to_string(),
            reused,
            seconds,
            peak_rss_mib: peak,
            size_mib: size_mib(&stage.output),
        });
        input = stage.output.display().to_string();
    }
    let table = stage_table(&records);
    std::fs::write(
        args.output.join("stages.json"),
        serde_json::to_string_pretty(&records)?,
    )?;
    std::fs::write(args.output.join("stages.md"), &table)?;
    eprintln!("\n{table}");
    if args.no_report {
        return Ok(());
    }
    let mut report = vec![
        "eval".to_string(),
        "report".into(),
        "--baseline".into(),
        args.model.clone(),
    ];
    for s in &stages {
        report.extend(["--variant".to_string(), s.output.display().to_string()]);
    }
    let out = |name: &str| args.output.join(name).display().to_string();
    report.extend([
        "-o".to_string(),
        out("report.md"),
        "--plot".into(),
        out("report.svg"),
        "--json-output".into(),
        out("report.json"),
    ]);
    report.extend(report_options);
    eprintln!(
        "compress: report: pagoda {}",
        shlex::try_join(report.iter().map(String::as_str))?
    );
    let status = Process::new(&exe).args(&report).status()?;
    if !status.success() {
        bail!("the report failed ({status}); the stage outputs are complete and kept");
    }
    // One document: the measurements, then how each stage was made.
    let report_md = args.output.join("report.md");
    let mut text = std::fs::read_to_string(&report_md)
        .with_context(|| format!("reading {}", report_md.display()))?;
    text.push_str("\n## Stages\n\n");
    text.push_str(&table);
    std::fs::write(&report_md, text)?;
    eprintln!("wrote {} (stages: {})", out("report.md"), out("stages.md"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(stages: &[&str]) -> CompressArgs {
        CompressArgs {
            model: "m.gguf".into(),
            output: "out".into(),
            stages: stages.iter().map(|s| s.to_string()).collect(),
            force: false,
            report: "--mc".into(),
            no_report: false,
        }
    }

    fn accept(_: &[String]) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn stages_are_planned_in_order_and_bad_ones_refused() {
        let s = plan(
            &args(&[
                "prune --method layers --drop 2",
                "quantize --method rtn --bits 8 --sym",
            ]),
            false,
            accept,
        )
        .unwrap();
        assert_eq!(s[0].output, PathBuf::from("out/1-prune.gguf"));
        assert_eq!(
            s[1].argv("out/1-prune.gguf"),
            [
                "quantize",
                "--method",
                "rtn",
                "--bits",
                "8",
                "--sym",
                "out/1-prune.gguf",
                "-o",
                "out/2-quantize.gguf"
            ]
        );
        for (stages, needle) in [
            (vec!["train --steps 3"], "not a pipeline stage"),
            (vec![""], "empty"),
            (
                vec!["prune --method layers --drop 2 -o x.gguf"],
                "set by the pipeline",
            ),
            (vec!["quantize --force"], "set by the pipeline"),
            (vec!["prune --method 'layers"], "unbalanced quotes"),
        ] {
            let e = plan(&args(&stages), false, accept).unwrap_err().to_string();
            assert!(e.contains(needle), "{stages:?}: {e}");
        }
    }
}
