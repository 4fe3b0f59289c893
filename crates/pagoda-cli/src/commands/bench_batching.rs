//! `pagoda bench batching`: aggregate throughput and per-token latency of the batching
//! engine under closed-loop concurrent clients, continuous vs static batching, side by side
//! with llama.cpp's `llama-server` (`--parallel C -cb`) on the same GGUF, threads and requests.
//!
//! The workload is seeded: request `i` has a prompt of 32–512 tokens cut from the benchmark
//! text at an offset of its own (so prompts do not share prefixes) and generates 16–256
//! tokens with `ignore_eos`, so both engines do exactly the same work. `--prefix-test`
//! measures the TTFT of a request whose ~1000-token prefix is cached against a cold one.

use crate::commands::bench_workload::{
    closed_loop, workload, LengthDistribution, RequestResult, WorkItem, PROMPT_TEXT,
};
use crate::commands::engine_args::EngineArgs;
use crate::commands::llama_server::LlamaServer;
use crate::commands::model_loader::load_for_generation;
use clap::Args;
use pagoda_engine::{BatchingMode, EngineHandle, SamplingParams};
use pagoda_runtime::collect_blocking;
use pagoda_runtime::{plan, Bounds, Knobs};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `pagoda bench batching`.
#[derive(Debug, Args)]
pub struct BenchBatchingArgs {
    /// Model name or path (a GGUF file, so llama-server can load the same one).
    #[arg(default_value = "smollm2:135m")]
    pub model: String,
    /// Concurrent clients to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub concurrency: Vec<usize>,
    /// Requests per measurement (at least the concurrency is used).
    #[arg(long, default_value_t = 32)]
    pub requests: usize,
    /// Batching modes of Pagoda to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "continuous,static")]
    pub modes: Vec<BatchingMode>,
    /// Path of a llama-server binary to compare against (built by
    /// scripts/reference/build_llama_server.sh); omitted = Pagoda only.
    #[arg(long)]
    pub peer_server: Option<PathBuf>,
    /// Worker threads for both engines (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Prompt lengths of the workload in tokens, MIN-MAX (uniform).
    #[arg(long, value_parser = parse_range, default_value = "32-512")]
    pub prompt_len: (usize, usize),
    /// Output lengths (max_tokens, EOS ignored) of the workload, MIN-MAX (uniform).
    #[arg(long, value_parser = parse_range, default_value = "16-256")]
    pub output_len: (usize, usize),
    /// How output lengths are drawn in their range: `uniform`, or `long-tail` (most short, a
    /// few near MAX, as chat logs; use a wide range such as --output-len 16-2048).
    #[arg(long, value_enum, default_value_t = LengthDistribution::Uniform)]
    pub output_dist: LengthDistribution,
    /// Measure TTFT with a cached ~1000-token prefix against an uncached one instead.
    #[arg(long)]
    pub prefix_test: bool,
    /// Print one JSON object per measurement instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Figures of one (engine, concurrency) run.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub engine: String,
    pub concurrency: usize,
    pub requests: usize,
    pub output_tokens: usize,
    pub wall_s: f64,
    pub output_tps: f64,
    pub mean_ttft_ms: f64,
    pub mean_tpot_ms: f64,
    pub p99_tpot_ms: f64,
}

impl Figures {
    fn from_results(
        engine: &str,
        concurrency: usize,
        wall: Duration,
        results: &[RequestResult],
    ) -> Self {
        let output_tokens: usize = results.iter().map(|r| r.output_tokens).sum();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        // The same statistics as `pagoda bench serve` (numpy's linear percentiles).
        let ttfts: Vec<f64> = results.iter().map(|r| ms(r.ttft)).collect();
        let tpots: Vec<f64> = results.iter().filter_map(|r| r.tpot.map(ms)).collect();
        let tpot = pagoda_bench::Dist::of(&tpots);
        Figures {
            engine: engine.to_string(),
            concurrency,
            requests: results.len(),
            output_tokens,
            wall_s: wall.as_secs_f64(),
            output_tps: output_tokens as f64 / wall.as_secs_f64().max(1e-9),
            mean_ttft_ms: pagoda_bench::Dist::of(&ttfts).mean,
            mean_tpot_ms: tpot.mean,
            p99_tpot_ms: tpot.p99,
        }
    }
}

/// Parses `MIN-MAX` (or one number) into an inclusive range.
fn parse_range(text: &str) -> Result<(usize, usize), String> {
    let bad = || format!("`{text}` is not a range such as 32-512");
    let (lo, hi) = match text.split_once('-') {
        Some((a, b)) => (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        ),
        None => {
            let v = text.trim().parse().map_err(|_| bad())?;
            (v, v)
        }
    };
    if lo == 0 || lo > hi {
        return Err(format!("`{text}`: need 1 <= MIN <= MAX"));
    }
    Ok((lo, hi))
}

/// One request through the in-process engine.
fn serve_pagoda(engine: &EngineHandle, item: &WorkItem) -> anyhow::Result<RequestResult> {
    let knobs = Knobs {
        max_tokens: Some(item.max_tokens),
        n: 1,
        ignore_eos: true,
        ..Knobs::default()
    };
    let plan = plan::plain(
        item.prompt.clone(),
        &SamplingParams::greedy(),
        knobs,
        &Bounds::engine(engine),
    )?;
    let stream = engine.submit(plan.request)?;
    let choice = collect_blocking(stream, 1)
        .map_err(|e| anyhow::anyhow!("request failed: {e}"))?
        .swap_remove(0);
    let n = choice.usage.completion_tokens;
    let timings = choice
        .timings
        .ok_or_else(|| anyhow::anyhow!("the engine stopped before the request finished"))?;
    Ok(RequestResult {
        output_tokens: n,
        ttft: timings.ttft().unwrap_or_default(),
        tpot: timings.tpot(n),
    })
}

/// Runs `pagoda bench batching`.
pub fn run(args: BenchBatchingArgs) -> anyhow::Result<()> {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    crate::commands::threads::set_threads(Some(threads))?;
    let loaded = load_for_generation(&args.model, &args.engine.load)?;
    let text = vec![PROMPT_TEXT.trim(); 64].join("\n\n");
    let text_tokens = loaded.tokenizer.encode(&text, false)?;
    if args.prefix_test {
        return prefix_test(&args, &loaded, &text_tokens);
    }
    let mut all = Vec::new();
    for &c in &args.concurrency {
        let work = workload(
            &text_tokens,
            args.requests.max(c),
            args.seed,
            args.prompt_len,
            args.output_len,
            args.output_dist,
        );
        let mut row = Vec::new();
        for &mode in &args.modes {
            let mut config = args.engine.config(mode);
            config.max_num_seqs = config.max_num_seqs.max(c);
            let engine =
                EngineHandle::start(loaded.model.clone(), loaded.tokenizer.clone(), config)?;
            let (wall, results) = closed_loop(&work, c, |item| serve_pagoda(&engine, item))?;
            engine.shutdown();
            let name = format!("pagoda-{}", mode.as_str());
            row.push(Figures::from_results(&name, c, wall, &results));
            eprintln!("done: {name} at {c}");
        }
        if let Some(bin) = &args.peer_server {
            let slot_ctx = (args.prompt_len.1 + args.output_len.1 + 16).max(1024);
            let server = LlamaServer::start(bin, &loaded.path, threads, c, slot_ctx)?;
            let (wall, results) = closed_loop(&work, c, |item| server.complete(item))?;
            drop(server);
            row.push(Figures::from_results("llama-server", c, wall, &results));
            eprintln!("done: llama-server at {c}");
        }
        print_row(&row, args.json)?;
        all.extend(row);
    }
    Ok(())
}

fn print_row(row: &[Figures], json: bool) -> anyhow::Result<()> {
    if json {
        for f in row {
            println!("{}", serde_json::to_string(f)?);
        }
        return Ok(());
    }
    let c = row.first().map_or(0, |f| f.concurrency);
    println!("concurrency {c}:");
    println!(
        "  {:<20} {:>9} {:>11} {:>12} {:>12} {:>12}",
        "engine", "requests", "out tok/s", "TTFT ms", "TPOT ms", "p99 TPOT ms"
    );
    for f in row {
        println!(
            "  {:<20} {:>9} {:>11.1} {:>12.1} {:>12.1} {:>12.1}",
            f.engine, f.requests, f.output_tps, f.mean_ttft_ms, f.mean_tpot_ms, f.p99_tpot_ms
        );
    }
    let find = |name: &str| row.iter().find(|f| f.engine == name);
    if let (Some(a), Some(b)) = (find("pagoda-continuous"), find("pagoda-static")) {
        println!(
            "  continuous / static throughput: {:.2}x",
            a.output_tps / b.output_tps.max(1e-9)
        );
    }
    if let (Some(a), Some(b)) = (find("pagoda-continuous"), find("llama-server")) {
        println!(
            "  pagoda / llama-server throughput: {:.2}x, p99 TPOT ratio {:.2}",
            a.output_tps / b.output_tps.max(1e-9),
            a.p99_tpot_ms / b.p99_tpot_ms.max(1e-9)
        );
    }
    Ok(())
}

/// TTFT of a ~1000-token prompt cold, then of the same prefix plus a new suffix (cached).
fn prefix_test(
    args: &BenchBatchingArgs,
    loaded: &crate::commands::model_loader::LoadedModel,
    text_tokens: &[u32],
) -> anyhow::Result<()> {
    let prefix = &text_tokens[..1000.min(text_tokens.len() - 40)];
    let engine = EngineHandle::start(
        loaded.model.clone(),
        loaded.tokenizer.clone(),
        args.engine.config(BatchingMode::Continuous),
    )?;
    let ttft = |suffix: &[u32]| -> anyhow::Result<Duration> {
        let mut prompt = prefix.to_vec();
        prompt.extend_from_slice(suffix);
        Ok(serve_pagoda(
            &engine,
            &WorkItem {
                prompt,
                max_tokens: 1,
            },
        )?
        .ttft)
    };
    let cold = ttft(&text_tokens[1000..1010])?;
    let warm = ttft(&text_tokens[1010..1020])?;
    let warm2 = ttft(&text_tokens[1020..1030])?;
    engine.shutdown();
    let warm = warm.min(warm2);
    println!(
        "prefix cache: TTFT of a {}-token prompt uncached {:.1} ms, with its first {} tokens cached {:.1} ms ({:.1}x faster)",
        prefix.len() + 10,
        cold.as_secs_f64() * 1e3,
        prefix.len() / args.engine.block_size * args.engine.block_size,
        warm.as_secs_f64() * 1e3,
        cold.as_secs_f64() / warm.as_secs_f64().max(1e-9)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::bench_workload::long_tail_length;

    #[test]
    fn workload_is_seeded_and_in_range() {
        let text: Vec<u32> = (0..4000).collect();
        let a = workload(
            &text,
            50,
            3,
            (32, 512),
            (16, 256),
            LengthDistribution::Uniform,
        );
        assert_eq!(a.len(), 50);
        for w in &a {
            assert!((32..=512).contains(&w.prompt.len()));
            assert!((16..=256).contains(&w.max_tokens));
        }
        let b = workload(
            &text,
            50,
            3,
            (32, 512),
            (16, 256),
            LengthDistribution::Uniform,
        );
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| x.prompt == y.prompt && x.max_tokens == y.max_tokens));
        let c = workload(
            &text,
            50,
            4,
            (32, 512),
            (16, 256),
            LengthDistribution::Uniform,
        );
        assert!(workload(
            &text,
            20,
            1,
            (8, 8),
            (300, 400),
            LengthDistribution::Uniform
        )
        .iter()
        .all(|w| w.prompt.len() == 8 && (300..=400).contains(&w.max_tokens)));
        assert_eq!(parse_range("16-128"), Ok((16, 128)));
        assert_eq!(parse_range("64"), Ok((64, 64)));
        assert!(
            parse_range("9-3").is_err() && parse_range("x").is_err() && parse_range("0-4").is_err()
        );
        assert!(a.iter().zip(&c).any(|(x, y)| x.prompt != y.prompt));
    }

    #[test]
    fn long_tail_lengths_are_mostly_short_with_a_few_near_the_maximum() {
        assert_eq!(long_tail_length(16, 2048, 0.0), 16);
        assert_eq!(long_tail_length(16, 2048, 0.999_999_9), 2048);
        let text: Vec<u32> = (0..4000).collect();
        let work = workload(
            &text,
            2000,
            7,
            (32, 64),
            (16, 2048),
            LengthDistribution::LongTail,
        );
        let mut lengths: Vec<usize> = work.iter().map(|w| w.max_tokens).collect();
        lengths.sort_unstable();
        assert!(lengths.iter().all(|l| (16..=2048).contains(l)));
        // P(length > x) = (16/x - 16/2049) / (1 - 16/2049): median ~32, ~2.4 % above 512.
        let median = lengths[lengths.len() / 2];
        assert!((28..=37).contains(&median), "median {median}");
        let above_512 = lengths.iter().filter(|&&l| l > 512).count();
        assert!(
            (20..=80).contains(&above_512),
            "{above_512} of 2000 above 512"
        );
        let longest = lengths[lengths.len() - 1];
        assert!(longest > 1000, "longest {longest}");
    }

    #[test]
    fn figures_take_means_and_p99() {
        let r = |tokens, ttft_ms, tpot_ms| RequestResult {
            output_tokens: tokens,
            ttft: Duration::from_millis(ttft_ms),
            tpot: Some(Duration::from_millis(tpot_ms)),
        };
        let f = Figures::from_results(
            "x",
            2,
            Duration::from_secs(2),
            &[r(10, 100, 10), r(30, 300, 30)],
        );
        assert_eq!(f.output_tokens, 40);
        assert!((f.output_tps - 20.0).abs() < 1e-9);
        assert!((f.mean_ttft_ms - 200.0).abs() < 1e-9);
        assert!((f.mean_tpot_ms - 20.0).abs() < 1e-9);
        // Linear interpolation between the two: 10 + 20 * 0.99.
        assert!((f.p99_tpot_ms - 29.8).abs() < 1e-9);
    }
}
