//! `pagoda tune`: find the largest batch setting that meets a latency SLA.
//!
//! For each `--max-num-seqs` value (and each `--token-budgets` value, the chunked-prefill
//! budget `--max-num-batched-tokens`), in increasing order, it starts `pagoda serve` on a free
//! port with that setting, runs the workload with as many requests in flight as the setting
//! allows (closed loop), and compares the p99 TTFT and p99 TPOT with the SLA. Before anything
//! starts it prints the memory each setting needs: the weights plus a KV cache that holds
//! max-num-seqs sequences of max-model-len tokens.
//!
//! Invariants: one server at a time, always stopped (also on error) before the next starts;
//! settings are tried smallest first and, unless `--keep-going`, the sweep stops at the first
//! setting that misses the SLA (a larger batch only adds queueing); the recommendation is the
//! largest setting that met it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use pagoda_bench::{Arrival, Limit, RunConfig, Sla, Summary};
use pagoda_model::{DeviceChoice, KvDtype};
use pagoda_runtime::loader::Pull;
use serde::Serialize;

use super::bench_serve::{progress_bar, workload, WorkloadArgs};
use super::human_size;

const AFTER_HELP: &str = "\
Each setting gets a fresh `pagoda serve --max-num-seqs N --max-num-batched-tokens T
--max-model-len L --kv-cache-memory <its KV need>` and a closed-loop run with N requests in
flight (--requests-per-setting, default max(8, 3N)). A setting meets the SLA when the p99 TTFT
and p99 TPOT of its run are within the bounds. The memory table printed first is what each
setting reserves: the weights (file size) plus N x L tokens of KV cache.

Examples:
  pagoda tune smollm2:135m --sla-ttft-ms 2000 --sla-tpot-ms 100
  pagoda tune qwen2.5-coder:0.5b --max-num-seqs 1,2,4,8,16 --token-budgets 256,512 \\
      --dataset gsm8k --max-tokens 128 --json tune.json
  pagoda tune smollm2:135m --estimate-only --max-num-seqs 8,64,256 --max-model-len 8192";

/// Arguments of `pagoda tune`.
#[derive(Debug, Args)]
#[command(after_help = AFTER_HELP)]
pub struct TuneArgs {
    /// Model name (store) or path.
    #[arg(default_value = "smollm2:135m")]
    pub model: String,
    /// p99 time-to-first-token bound (ms).
    #[arg(long, default_value_t = 2000.0)]
    pub sla_ttft_ms: f64,
    /// p99 time-per-output-token bound (ms).
    #[arg(long, default_value_t = 100.0)]
    pub sla_tpot_ms: f64,
    /// max-num-seqs values to try, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub max_num_seqs: Vec<usize>,
    /// max-num-batched-tokens values (the per-step token budget) to try with each.
    #[arg(long, value_delimiter = ',', default_value = "512")]
    pub token_budgets: Vec<usize>,
    /// Longest sequence the server admits (prompt + output); sizes the KV cache.
    #[arg(long, default_value_t = 2048)]
    pub max_model_len: usize,
    /// KV cache element type: f16, f32 or fp8 (E4M3, half f16's bytes per token).
    #[arg(long, default_value = "f16")]
    pub kv_cache_dtype: KvDtype,
    /// Measured requests per setting (default max(8, 3 x max-num-seqs)).
    #[arg(long)]
    pub requests_per_setting: Option<usize>,
    /// Try every setting, not only up to the first that misses the SLA.
    #[arg(long)]
    pub keep_going: bool,
    /// Print the memory estimate and stop.
    #[arg(long)]
    pub estimate_only: bool,
    /// Where the servers it starts run (auto, cpu, cuda, cuda:N; as on serve).
    #[arg(long, value_name = "DEVICE", default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Write every setting's results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// The memory one setting reserves.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MemoryEstimate {
    pub weights_bytes: u64,
    pub kv_bytes_per_token: u64,
    pub kv_bytes: u64,
    pub total_bytes: u64,
}

/// Weights plus a KV cache of `seqs` sequences of `max_model_len` tokens.
pub fn estimate(
    weights_bytes: u64,
    kv_bytes_per_token: u64,
    seqs: usize,
    max_model_len: usize,
) -> MemoryEstimate {
    let kv_bytes = kv_bytes_per_token * seqs as u64 * max_model_len as u64;
    MemoryEstimate {
        weights_bytes,
        kv_bytes_per_token,
        kv_bytes,
        total_bytes: weights_bytes + kv_bytes,
    }
}

/// One setting's outcome.
#[derive(Debug, Serialize)]
struct SettingResult {
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    memory: MemoryEstimate,
    meets_sla: bool,
    summary: Summary,
}

/// Whether a run met the SLA (every request failing never meets it).
fn meets(summary: &Summary, sla: &Sla) -> bool {
    summary.completed > 0
        && summary.errors == 0
        && sla.ttft_ms.is_none_or(|b| summary.ttft_ms.p99 <= b)
        && sla
            .tpot_ms
            .is_none_or(|b| summary.tpot_ms.count == 0 || summary.tpot_ms.p99 <= b)
}

pub fn run(args: TuneArgs) -> anyhow::Result<()> {
    if args.max_num_seqs.is_empty() || args.max_num_seqs.contains(&0) {
        bail!("--max-num-seqs needs positive values, e.g. 1,2,4,8");
    }
    if args.token_budgets.is_empty() || args.token_budgets.contains(&0) {
        bail!("--token-budgets needs positive values, e.g. 256,512");
    }
    let store = crate::commands::open_store()?;
    let model = pagoda_runtime::loader::resolve(&store, &args.model, Pull::IfMissing)?;
    let src = pagoda_model::source::open_model(&model.path)
        .with_context(|| format!("reading {}", model.path.display()))?;
    let cfg = &src.config;
    let max_model_len = args.max_model_len.min(src.info.context_length.max(2));
    let kv_per_token =
        pagoda_model::PagedKvCache::bytes_per_block(cfg, 1, args.kv_cache_dtype) as u64;
    let weights = file_size(&model.path);
    let mut seqs = args.max_num_seqs.clone();
    seqs.sort_unstable();
    seqs.dedup();
    eprintln!(
        "memory per setting ({}: weights {}, KV {} per token in {}, max-model-len {max_model_len}):",
        args.model,
        human_size(weights),
        human_size(kv_per_token),
        args.kv_cache_dtype
    );
    println!("| max-num-seqs | weights | KV cache | total |");
    println!("|---:|---:|---:|---:|");
    for &n in &seqs {
        let m = estimate(weights, kv_per_token, n, max_model_len);
        println!(
            "| {n} | {} | {} | {} |",
            human_size(m.weights_bytes),
            human_size(m.kv_bytes),
            human_size(m.total_bytes)
        );
    }
    if args.estimate_only {
        return Ok(());
    }
    let sla = Sla {
        ttft_ms: Some(args.sla_ttft_ms),
        tpot_ms: Some(args.sla_tpot_ms),
        e2e_ms: None,
    };
    let exe = std::env::current_exe().context("locating the pagoda binary")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let mut results: Vec<SettingResult> = Vec::new();
    'sweep: for &n in &seqs {
        for &budget in &args.token_budgets {
            let memory = estimate(weights, kv_per_token, n, max_model_len);
            let requests = args.requests_per_setting.unwrap_or((3 * n).max(8));
            eprintln!("setting max-num-seqs {n}, max-num-batched-tokens {budget}: {requests} requests, {n} in flight");
            let server = Server::start(
                &exe,
                &model.path,
                n,
                budget,
                max_model_len,
                memory.kv_bytes,
                args.kv_cache_dtype,
                args.device,
            )?;
            let summary = runtime.block_on(measure(&server.url, &args, n, requests, &sla));
            drop(server);
            let summary = summary?;
            let ok = meets(&summary, &sla);
            eprintln!(
                "  p99 TTFT {:.0} ms, p99 TPOT {:.1} ms, {:.2} req/s, {:.1} output tok/s: {}",
                summary.ttft_ms.p99,
                summary.tpot_ms.p99,
                summary.request_throughput,
                summary.output_tokens_per_s,
                if ok {
                    "meets the SLA"
                } else {
                    "misses the SLA"
                }
            );
            results.push(SettingResult {
                max_num_seqs: n,
                max_num_batched_tokens: budget,
                memory,
                meets_sla: ok,
                summary,
            });
            if !ok && !args.keep_going {
                break 'sweep;
            }
        }
    }
    print_results(&args, &results);
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "model": args.model, "sla": {"p99_ttft_ms": args.sla_ttft_ms, "p99_tpot_ms": args.sla_tpot_ms},
            "max_model_len": max_model_len, "settings": results,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn print_results(args: &TuneArgs, results: &[SettingResult]) {
    println!();
    println!("| max-num-seqs | token budget | req/s | output tok/s | p99 TTFT ms | p99 TPOT ms | memory | SLA |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in results {
        let s = &r.summary;
        println!(
            "| {} | {} | {:.2} | {:.1} | {:.0} | {:.1} | {} | {} |",
            r.max_num_seqs,
            r.max_num_batched_tokens,
            s.request_throughput,
            s.output_tokens_per_s,
            s.ttft_ms.p99,
            s.tpot_ms.p99,
            human_size(r.memory.total_bytes),
            if r.meets_sla { "met" } else { "missed" }
        );
    }
    // The largest setting that met the SLA (the sweep is ordered, so a larger one that met it
    // after a miss only appears with --keep-going).
    let best = results
        .iter()
        .filter(|r| r.meets_sla)
        .max_by_key(|r| (r.max_num_seqs, r.max_num_batched_tokens));
    match best {
        Some(r) => println!(
            "\nlargest setting within the SLA (p99 TTFT <= {} ms, p99 TPOT <= {} ms): max-num-seqs {}, max-num-batched-tokens {} — {:.2} req/s, {:.1} output tok/s, {} of memory\n  pagoda serve --model {} --max-num-seqs {} --max-num-batched-tokens {} --max-model-len {}",
            args.sla_ttft_ms, args.sla_tpot_ms, r.max_num_seqs, r.max_num_batched_tokens,
            r.summary.request_throughput, r.summary.output_tokens_per_s, human_size(r.memory.total_bytes),
            args.model, r.max_num_seqs, r.max_num_batched_tokens, args.max_model_len
        ),
        None => println!(
            "\nno setting met the SLA (p99 TTFT <= {} ms, p99 TPOT <= {} ms): relax it, shorten the workload, or use a smaller or quantized model",
            args.sla_ttft_ms, args.sla_tpot_ms
        ),
    }
}

async fn measure(
    url: &str,
    args: &TuneArgs,
    n: usize,
    requests: usize,
    sla: &Sla,
) -> anyhow::Result<Summary> {
    let config = RunConfig {
        base_url: url.to_string(),
        api_key: None,
        arrival: Arrival::Concurrency(n),
        warmup_requests: 1,
        limit: Limit::Requests(requests),
        seed: args.workload.seed,
        timeout: Duration::from_secs(600),
    };
    config.validate()?;
    let mut workload = workload(&args.workload, Some(args.model.clone()))?;
    let bar = progress_bar();
    let report = pagoda_bench::run(&config, &mut workload, |p| {
        bar.set_message(format!(
            "{} done, {} in flight, {} errors",
            p.done, p.in_flight, p.errors
        ));
    })
    .await;
    bar.finish_and_clear();
    Ok(report?.summary(Some(sla)))
}

fn file_size(path: &Path) -> u64 {
    if path.is_dir() {
        std::fs::read_dir(path)
            .map(|it| it.flatten().map(|e| file_size(&e.path())).sum())
            .unwrap_or(0)
    } else {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    }
}

/// A `pagoda serve` child on a free port, stopped on drop.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    #[allow(clippy::too_many_arguments)]
    fn start(
        exe: &Path,
        model: &Path,
        seqs: usize,
        budget: usize,
        max_model_len: usize,
        kv_bytes: u64,
        dtype: KvDtype,
        device: DeviceChoice,
    ) -> anyhow::Result<Server> {
        let mut child = Command::new(exe)
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--port", "0", "--max-num-seqs", &seqs.to_string()])
            .args(["--max-num-batched-tokens", &budget.to_string()])
            .args(["--max-model-len", &max_model_len.to_string()])
            .args(["--kv-cache-memory", &kv_bytes.max(1 << 20).to_string()])
            .args(["--kv-cache-dtype", &dtype.to_string()])
            .args(["--device", &device.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting pagoda serve")?;
        let stderr = child.stderr.take().context("the server's stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        // Read the log until the address shows, then keep draining it so the pipe never fills.
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(pos) = line.find("on http://") {
                        let url: String = line[pos + 3..]
                            .chars()
                            .take_while(|c| !c.is_whitespace())
                            .collect();
                        let _ = tx.send(url);
                        sent = true;
                    }
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if let Ok(url) = rx.recv_timeout(Duration::from_millis(200)) {
                return Ok(Server { child, url });
            }
            if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                let _ = child.kill();
                let _ = child.wait();
                bail!("pagoda serve did not start with max-num-seqs {seqs} (run it by hand to see why)");
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_weights_plus_kv_for_every_sequence() {
        // SmolLM2-135M: 30 layers, 3 KV heads of 64, f16: 2 * 30 * 3 * 64 * 2 = 23,040 bytes a token.
        let m = estimate(100, 23_040, 8, 2048);
        assert_eq!(m.kv_bytes, 23_040 * 8 * 2048);
        assert_eq!(m.total_bytes, 100 + 23_040 * 8 * 2048);
    }
}
