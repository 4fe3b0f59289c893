//! `pagoda bench model`: prefill and decode speed, load time and peak memory, side by side with
//! llama.cpp on the same file and thread count. (`pagoda bench batching` and `pagoda bench
//! serve`, the load generator against a running server, live in their own modules.)
//!
//! Both engines get the same prompt token ids (written to a file the peer script reads), so
//! the figures compare the same work. The peer is `scripts/reference/bench_llamacpp.py`, run
//! by the Python in `PAGODA_PEER_PYTHON` (default `python3`).

use crate::commands::bench_workload::PROMPT_TEXT;
use crate::commands::model_loader::{load_for_generation, LoadArgs};
use anyhow::Context;
use clap::{Args, Subcommand};
use pagoda_engine::{EngineConfig, EngineHandle, SamplingParams};
use pagoda_runtime::{plan, single, Bounds, Knobs};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::Command;

/// Arguments of `pagoda bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Measure one model: prefill tokens/s, decode tokens/s, load time, peak RSS, and the same
    /// for llama.cpp (llama-cpp-python) on the same file, with the ratio.
    Model(BenchModelArgs),
    /// Measure batching: output tokens/s, TTFT and TPOT at several concurrencies, continuous
    /// vs static, and llama-server (`--parallel`, continuous batching) on the same GGUF.
    Batching(crate::commands::bench_batching::BenchBatchingArgs),
    /// Load-test a running OpenAI-compatible server (Pagoda, llama-server, vLLM, a gateway):
    /// throughput, TTFT/TPOT/ITL/E2E percentiles, errors and goodput under an SLA.
    Serve(crate::commands::bench_serve::BenchServeArgs),
}

#[derive(Debug, Args)]
pub struct BenchModelArgs {
    /// Model name or path.
    #[arg(default_value = "smollm2:135m")]
    pub model: String,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens generated for the decode measurement.
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Worker threads for both Pagoda and llama.cpp (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Repetitions; the best is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Skip the llama.cpp side (llama-cpp-python not installed).
    #[arg(long)]
    pub no_peer: bool,
    /// The peer benchmark script.
    #[arg(long, default_value = "scripts/reference/bench_llamacpp.py")]
    pub peer_script: PathBuf,
    /// Print one JSON object per engine instead of the table.
    #[arg(long)]
    pub json: bool,
    // llama.cpp, the peer, always runs the file as it is.
    #[command(flatten)]
    pub load: LoadArgs,
}

/// One engine's figures; the peer script prints the same fields as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchFigures {
    pub engine: String,
    pub threads: usize,
    pub load_s: f64,
    pub prefill_tokens: usize,
    pub prefill_tps: f64,
    pub decode_tokens: usize,
    pub decode_tps: f64,
    pub peak_rss_mb: f64,
    /// Model file size, bytes in memory of the weights (after `--quantize`) and parameter
    /// count; Pagoda's side only (`pagoda eval report` reads them), 0 from the peer.
    #[serde(default)]
    pub file_bytes: u64,
    #[serde(default)]
    pub weight_bytes: u64,
    #[serde(default)]
    pub parameters: u64,
}

/// Runs `pagoda bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let args = match args.what {
        BenchCommand::Model(a) => a,
        BenchCommand::Batching(a) => return crate::commands::bench_batching::run(a),
        BenchCommand::Serve(a) => return crate::commands::bench_serve::run(a),
    };
    if args.repeat == 0 || args.prompt_tokens == 0 || args.gen_tokens == 0 {
        anyhow::bail!("--repeat, --prompt-tokens and --gen-tokens must be at least 1");
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    crate::commands::threads::set_threads(Some(threads))?;

    let loaded = load_for_generation(&args.model, &args.load)?;
    let prompt = bench_prompt(&loaded.tokenizer, args.prompt_tokens)?;
    let ctx = args.prompt_tokens + args.gen_tokens + 1;
    if ctx > loaded.model.config().context_length {
        anyhow::bail!(
            "prompt + generated tokens ({ctx}) exceed the model's context of {}",
            loaded.model.config().context_length
        );
    }
    // The serving engine's own loop, one stream; no prefix cache, so every repetition
    // prefills the whole prompt as the peer does.
    let engine = EngineHandle::start(
        loaded.model.clone(),
        loaded.tokenizer.clone(),
        EngineConfig {
            prefix_caching: false,
            ..single::engine_config(ctx)
        },
    )?;
    let (mut best_prefill, mut best_decode) = (0.0f64, 0.0f64);
    for _ in 0..args.repeat {
        // Prefill the whole prompt, then decode `gen_tokens` more after the first token, as
        // the peer script does.
        let knobs = Knobs {
            max_tokens: Some(args.gen_tokens + 1),
            n: 1,
            ignore_eos: true,
            no_speculation: true,
            ..Knobs::default()
        };
        let plan = plan::plain(
            prompt.clone(),
            &SamplingParams::greedy(),
            knobs,
            &Bounds::engine(&engine),
        )?;
        let out = single::generate(&engine, plan.request, |_| true)?;
        let split = out.split();
        best_prefill = best_prefill.max(split.prefill_tps(prompt.len()));
        best_decode =
            best_decode.max(split.decode_tps(out.usage.completion_tokens.saturating_sub(1)));
    }
    engine.shutdown();
    let ours = BenchFigures {
        engine: "pagoda".into(),
        threads,
        load_s: loaded.load_time.as_secs_f64(),
        prefill_tokens: prompt.len(),
        prefill_tps: best_prefill,
        decode_tokens: args.gen_tokens,
        decode_tps: best_decode,
        peak_rss_mb: peak_rss_mb(),
        file_bytes: loaded.file_bytes,
        // The tensors in memory: after --quantize its result, else as read from the file.
        weight_bytes: loaded
            .quantization
            .as_ref()
            .map_or(loaded.info.tensor_bytes, |q| q.bytes_after()),
        parameters: loaded.info.parameter_count,
    };
    let peer = if args.no_peer {
        None
    } else {
        match run_peer(&args, &loaded.path, threads, &prompt) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("warning: llama.cpp side skipped: {e:#}");
                None
            }
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&ours)?);
        if let Some(p) = &peer {
            println!("{}", serde_json::to_string(p)?);
        }
    } else {
        print_table(&loaded.path, &ours, peer.as_ref(), loaded.file_bytes);
    }
    Ok(())
}

/// `n` prompt tokens: [`PROMPT_TEXT`] stripped, repeated 16 times joined by blank lines,
/// tokenized with BOS when the model uses one (the peer script's rule).
fn bench_prompt(tok: &pagoda_model::tokenizer::Tokenizer, n: usize) -> anyhow::Result<Vec<u32>> {
    let text = vec![PROMPT_TEXT.trim(); 16 * (n / 512 + 1)].join("\n\n");
    let mut tokens = tok.encode(&text, true)?;
    if tokens.len() < n {
        anyhow::bail!("the benchmark text gives only {} tokens", tokens.len());
    }
    tokens.truncate(n);
    Ok(tokens)
}

fn run_peer(
    args: &BenchModelArgs,
    model: &std::path::Path,
    threads: usize,
    prompt: &[u32],
) -> anyhow::Result<BenchFigures> {
    let python = std::env::var("PAGODA_PEER_PYTHON").unwrap_or_else(|_| "python3".into());
    let tokens_file = tempfile_path("pagoda-bench-prompt.json");
    std::fs::write(&tokens_file, serde_json::to_string(prompt)?)
        .with_context(|| format!("writing {}", tokens_file.display()))?;
    eprintln!(
        "running llama.cpp ({python} {}) ...",
        args.peer_script.display()
    );
    let output = Command::new(&python)
        .arg(&args.peer_script)
        .arg(model)
        .args(["--threads", &threads.to_string()])
        .args(["--prompt-tokens", &prompt.len().to_string()])
        .args(["--gen-tokens", &args.gen_tokens.to_string()])
        .args(["--repeat", &args.repeat.to_string()])
        .arg("--prompt-tokens-file")
        .arg(&tokens_file)
        .output()
        .with_context(|| {
            format!("starting {python}; set PAGODA_PEER_PYTHON to a Python with llama-cpp-python")
        })?;
    std::fs::remove_file(&tokens_file).ok();
    if !output.status.success() {
        anyhow::bail!(
            "peer benchmark failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("peer benchmark printed no JSON line")?;
    serde_json::from_str(line).with_context(|| format!("parsing the peer's figures: {line}"))
}

fn tempfile_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{}-{name}", std::process::id()))
}

/// Peak resident set size of this process, in MiB (Linux `VmHWM`; 0 elsewhere).
pub(crate) fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn print_table(
    model: &std::path::Path,
    ours: &BenchFigures,
    peer: Option<&BenchFigures>,
    file_bytes: u64,
) {
    println!(
        "model: {} ({:.1} MiB), threads: {}",
        model.display(),
        file_bytes as f64 / 1048576.0,
        ours.threads
    );
    println!(
        "{:<28} {:>12} {:>12} {:>10}",
        "metric", "pagoda", "llama.cpp", "ratio"
    );
    let row = |name: &str, a: f64, b: Option<f64>, higher_better: bool| match b {
        Some(b) => {
            let ratio = if higher_better { a / b } else { b / a };
            println!("{name:<28} {a:>12.2} {b:>12.2} {ratio:>9.2}x");
        }
        None => println!("{name:<28} {a:>12.2} {:>12} {:>10}", "-", "-"),
    };
    row(
        &format!("prefill tokens/s ({})", ours.prefill_tokens),
        ours.prefill_tps,
        peer.map(|p| p.prefill_tps),
        true,
    );
    row(
        &format!("decode tokens/s ({})", ours.decode_tokens),
        ours.decode_tps,
        peer.map(|p| p.decode_tps),
        true,
    );
    row("load time (s)", ours.load_s, peer.map(|p| p.load_s), false);
    row(
        "peak RSS (MiB)",
        ours.peak_rss_mb,
        peer.map(|p| p.peak_rss_mb),
        false,
    );
    println!("ratio > 1 means Pagoda is better (faster, or smaller for time and memory)");
}
