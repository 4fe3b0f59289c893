//! `pagoda tune`: find the largest batch setting that meets a latency SLA.
//!
//! For each `--max-num-seqs` value (and each `--token-budgets` value, the chunked-prefill
//! budget `--max-num-batched-tokens`), in increasing order, it starts `pagoda serve` on a free
//! port with that setting, runs the workload with as many requests in flight as the setting
//! allows (closed loop), and compares the p99 TTFT and p99 TPOT with the SLA. Before anything
//! starts it prints the memory each setting needs: the weights plus a KV cache that holds
//! max-num-seqs sequences of max-model-len tokens. On a GPU (`--device cuda[:N]`, or `auto`
//! finding one) that is GPU memory: the weights as uploaded (quantized as stored, others bf16:
//! `pagoda_model::arch::cuda::weights_bytes`), the KV cache and a step's activation workspace
//! (`pagoda_model::arch::cuda::workspace_bytes`, as the engine's planner counts it), against
//! the card's memory x `--gpu-memory-utilization` (the share the server gives itself); a
//! setting that does not fit is reported and not started. `--device cuda` on a machine
//! without a usable GPU is an error naming what is missing.
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
use pagoda_engine::EngineConfig;
use pagoda_model::device::Resolved;
use pagoda_model::{Device, DeviceChoice, KvDtype, ModelConfig};
use pagoda_runtime::loader::Pull;
use serde::Serialize;

use super::bench_serve::{progress_bar, workload, WorkloadArgs};
use super::human_size;

const AFTER_HELP: &str = "\
Each setting gets a fresh `pagoda serve --max-num-seqs N --max-num-batched-tokens T
--max-model-len L --kv-cache-memory <its KV need>` and a closed-loop run with N requests in
flight (--requests-per-setting, default max(8, 3N)). A setting meets the SLA when the p99 TTFT
and p99 TPOT of its run are within the bounds. The memory table printed first is what each
setting reserves: the weights (file size) plus N x L tokens of KV cache. On a GPU it is GPU
memory: the weights as uploaded (quantized as stored, others bf16), the KV cache and the activation workspace of a step of T tokens,
against the card's memory x --gpu-memory-utilization; settings that do not fit are skipped.

Examples:
  pagoda tune smollm2:135m --sla-ttft-ms 2000 --sla-tpot-ms 100
  pagoda tune qwen2.5-coder:0.5b --max-num-seqs 1,2,4,8,16 --token-budgets 256,512 \\
      --dataset gsm8k --max-tokens 128 --json tune.json
  pagoda tune smollm2:135m --estimate-only --max-num-seqs 8,64,256 --max-model-len 8192
  pagoda tune qwen2.5-coder:1.5b --device cuda --estimate-only --max-num-seqs 64,256";

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
    /// On a GPU: the share of the card's memory the weights, the KV cache and the
    /// activation workspace may use together (as on serve).
    #[arg(long, default_value_t = EngineConfig::default().gpu_memory_utilization, value_name = "FRACTION")]
    pub gpu_memory_utilization: f64,
    /// Write every setting's results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

/// The memory one setting reserves (host memory on the CPU, GPU memory on a GPU).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MemoryEstimate {
    pub weights_bytes: u64,
    pub kv_bytes_per_token: u64,
    pub kv_bytes: u64,
    /// A step's activation workspace on the GPU; 0 on the CPU (counted with the process).
    pub workspace_bytes: u64,
    /// A hybrid model's recurrent-state slots (live and prefix snapshots,
    /// `pagoda_engine::StatePlan`); 0 for a transformer.
    pub state_bytes: u64,
    pub total_bytes: u64,
}

/// Weights plus a KV cache of `seqs` sequences of `max_model_len` tokens plus a step's
/// workspace.
pub fn estimate(
    weights_bytes: u64,
    kv_bytes_per_token: u64,
    seqs: usize,
    max_model_len: usize,
    workspace_bytes: u64,
) -> MemoryEstimate {
    let kv_bytes = kv_bytes_per_token * seqs as u64 * max_model_len as u64;
    MemoryEstimate {
        weights_bytes,
        kv_bytes_per_token,
        kv_bytes,
        workspace_bytes,
        state_bytes: 0,
        total_bytes: weights_bytes + kv_bytes + workspace_bytes,
    }
}

/// The GPU memory Pagoda may use: the card's memory x `--gpu-memory-utilization`, as the
/// engine's planner takes it (`pagoda_engine::planning`).
#[derive(Debug, Clone, Serialize)]
pub struct GpuShare {
    /// `cuda:N`.
    pub device: String,
    pub name: String,
    pub card_bytes: u64,
    pub utilization: f64,
    pub share_bytes: u64,
}

impl GpuShare {
    pub fn new(device: String, name: String, card_bytes: u64, utilization: f64) -> Self {
        GpuShare {
            device,
            name,
            card_bytes,
            utilization,
            share_bytes: (card_bytes as f64 * utilization) as u64,
        }
    }

    /// Whether `m` fits in the share.
    pub fn fits(&self, m: &MemoryEstimate) -> bool {
        m.total_bytes <= self.share_bytes
    }
}

/// What one setting needs on `device`: on a GPU the weights as uploaded (`gpu_weights_bytes`,
/// from `pagoda_model::arch::cuda::weights_bytes`) and the
/// workspace of a step of `budget` tokens with `seqs` logits rows; on the CPU the weights'
/// `file_bytes` and no workspace.
#[allow(clippy::too_many_arguments)]
fn setting_estimate(
    gpu: Option<&GpuShare>,
    cfg: &ModelConfig,
    file_bytes: u64,
    gpu_weights_bytes: u64,
    kv_per_token: u64,
    seqs: usize,
    budget: usize,
    max_model_len: usize,
) -> MemoryEstimate {
    let mut m = match gpu {
        None => estimate(file_bytes, kv_per_token, seqs, max_model_len, 0),
        Some(_) => estimate(
            gpu_weights_bytes,
            kv_per_token,
            seqs,
            max_model_len,
            pagoda_model::arch::cuda::workspace_bytes(cfg, budget.max(1), seqs.max(1)),
        ),
    };
    // The engine's own plan of a hybrid's state slots (prefix caching on, its default).
    m.state_bytes =
        pagoda_engine::StatePlan::for_config(cfg, seqs, true).map_or(0, |p| p.bytes() as u64);
    m.total_bytes += m.state_bytes;
    m
}

/// The GPU the estimate is for: `--device cuda[:N]` resolved (an error naming what is
/// missing when there is no usable GPU), `auto` when it finds one, none for the CPU.
fn gpu_share(device: DeviceChoice, utilization: f64) -> anyhow::Result<Option<GpuShare>> {
    if !(utilization > 0.0 && utilization <= 1.0) {
        bail!(
            "--gpu-memory-utilization {utilization}: a share of the GPU's memory, above 0 and at most 1"
        );
    }
    let resolved: Resolved = device.resolve().with_context(|| {
        format!("pagoda tune --device {device} estimates against a GPU's memory and needs one")
    })?;
    Ok(match (resolved.device, resolved.gpu) {
        (Device::Cuda(n), Some(g)) => Some(GpuShare::new(
            format!("cuda:{n}"),
            g.name,
            g.memory_bytes,
            utilization,
        )),
        _ => None,
    })
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
    // The device first: `--device cuda` without a GPU fails before any model is pulled.
    let gpu = gpu_share(args.device, args.gpu_memory_utilization)?;
    if gpu.is_some() && args.kv_cache_dtype == KvDtype::F32 {
        bail!("--kv-cache-dtype f32: a GPU keeps K/V in 16 bits (bf16); use f16");
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
    let gpu_weights_bytes = pagoda_model::arch::cuda::weights_bytes(&src.weights);
    let mut seqs = args.max_num_seqs.clone();
    seqs.sort_unstable();
    seqs.dedup();
    let mut budgets = args.token_budgets.clone();
    budgets.sort_unstable();
    budgets.dedup();
    let memory_of = |n: usize, budget: usize| {
        setting_estimate(
            gpu.as_ref(),
            cfg,
            weights,
            gpu_weights_bytes,
            kv_per_token,
            n,
            budget,
            max_model_len,
        )
    };
    match &gpu {
        None => {
            eprintln!(
                "memory per setting ({}: weights {}, KV {} per token in {}, max-model-len {max_model_len}):",
                args.model,
                human_size(weights),
                human_size(kv_per_token),
                args.kv_cache_dtype
            );
            // A hybrid's recurrent-state slots get their own column.
            let hybrid = cfg.has_recurrent_state();
            if hybrid {
                println!("| max-num-seqs | weights | KV cache | recurrent states | total |");
                println!("|---:|---:|---:|---:|---:|");
            } else {
                println!("| max-num-seqs | weights | KV cache | total |");
                println!("|---:|---:|---:|---:|");
            }
            for &n in &seqs {
                let m = memory_of(n, budgets[0]);
                let states = if hybrid {
                    format!(" {} |", human_size(m.state_bytes))
                } else {
                    String::new()
                };
                println!(
                    "| {n} | {} | {} |{states} {} |",
                    human_size(m.weights_bytes),
                    human_size(m.kv_bytes),
                    human_size(m.total_bytes)
                );
            }
        }
        Some(g) => {
            eprintln!(
                "GPU memory per setting ({}: weights {} as uploaded, KV {} per token, max-model-len {max_model_len}) on {} ({}, {}) x {} = {} for Pagoda:",
                args.model,
                human_size(gpu_weights_bytes),
                human_size(kv_per_token),
                g.device,
                g.name,
                human_size(g.card_bytes),
                g.utilization,
                human_size(g.share_bytes)
            );
            println!("| max-num-seqs | token budget | weights | KV cache | workspace | total | of the share | fits |");
            println!("|---:|---:|---:|---:|---:|---:|---:|---|");
            for &n in &seqs {
                for &b in &budgets {
                    let m = memory_of(n, b);
                    println!(
                        "| {n} | {b} | {} | {} | {} | {} | {:.0}% | {} |",
                        human_size(m.weights_bytes),
                        human_size(m.kv_bytes),
                        human_size(m.workspace_bytes),
                        human_size(m.total_bytes),
                        100.0 * m.total_bytes as f64 / g.share_bytes.max(1) as f64,
                        if g.fits(&m) { "yes" } else { "no" }
                    );
                }
            }
        }
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
        for &budget in &budgets {
            let memory = memory_of(n, budget);
            if let Some(g) = gpu.as_ref().filter(|g| !g.fits(&memory)) {
                eprintln!(
                    "setting max-num-seqs {n}, max-num-batched-tokens {budget}: skipped, it needs {} of GPU memory and {} x {} leaves {}",
                    human_size(memory.total_bytes),
                    g.device,
                    g.utilization,
                    human_size(g.share_bytes)
                );
                continue;
            }
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
                args.gpu_memory_utilization,
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
            "max_model_len": max_model_len, "gpu": gpu, "settings": results,
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
        gpu_memory_utilization: f64,
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
            .args([
                "--gpu-memory-utilization",
                &gpu_memory_utilization.to_string(),
            ])
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
        let m = estimate(100, 23_040, 8, 2048, 0);
        assert_eq!(m.kv_bytes, 23_040 * 8 * 2048);
        assert_eq!(m.total_bytes, 100 + 23_040 * 8 * 2048);
    }

    /// SmolLM2-135M's shape (its config.json): what the KV and workspace figures depend on.
    fn smollm2() -> ModelConfig {
        ModelConfig::from_hf_config(&serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": 30,
            "hidden_size": 576,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "intermediate_size": 1536,
            "vocab_size": 49152,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0,
            "tie_word_embeddings": true
        }))
        .expect("a valid config")
    }

    #[test]
    fn on_a_gpu_the_estimate_is_uploaded_weights_plus_kv_plus_workspace_against_the_share() {
        let cfg = smollm2();
        let card = GpuShare::new("cuda:0".into(), "Fake 1 GiB".into(), 1 << 30, 0.9);
        assert_eq!(card.share_bytes, (0.9 * (1u64 << 30) as f64) as u64);
        // SmolLM2-135M uploaded as bf16 (PAGODA_CUDA_WEIGHTS=bf16): 2 bytes a parameter.
        let (params, kv_token, len) = (134_515_008u64, 23_040u64, 2048usize);
        let m = setting_estimate(
            Some(&card),
            &cfg,
            88_000_000,
            params * 2,
            kv_token,
            4,
            512,
            len,
        );
        // Weights as uploaded, not the file's size.
        assert_eq!(m.weights_bytes, params * 2);
        assert_eq!(m.kv_bytes, kv_token * 4 * len as u64);
        // The planner's workspace for a step of 512 tokens with 4 logits rows.
        assert_eq!(
            m.workspace_bytes,
            pagoda_model::arch::cuda::workspace_bytes(&cfg, 512, 4)
        );
        assert!(m.workspace_bytes > 256 << 20, "the fixed margin is counted");
        assert_eq!(
            m.total_bytes,
            m.weights_bytes + m.kv_bytes + m.workspace_bytes
        );
        // 269 MB + 189 MB + ~300 MB fits in 0.9 GiB; 16 sequences' 755 MB of KV do not.
        assert!(card.fits(&m), "{m:?} in {card:?}");
        let big = setting_estimate(Some(&card), &cfg, 0, params * 2, kv_token, 16, 512, len);
        assert!(!card.fits(&big), "{big:?} in {card:?}");
        // The boundary is the share, not the card: a card exactly the size of the need
        // fits at utilization 1 and not at 0.9.
        let exact = GpuShare::new("cuda:0".into(), "exact".into(), m.total_bytes, 1.0);
        assert!(exact.fits(&m));
        let tight = GpuShare::new("cuda:0".into(), "tight".into(), m.total_bytes, 0.9);
        assert!(!tight.fits(&m));
        // On the CPU: the file's bytes, no workspace.
        let cpu = setting_estimate(None, &cfg, 88_000_000, params * 2, kv_token, 4, 512, len);
        assert_eq!(cpu.weights_bytes, 88_000_000);
        assert_eq!(cpu.workspace_bytes, 0);
    }

    #[test]
    fn a_hybrid_estimate_counts_its_recurrent_state_slots() {
        // LFM2-1.2B's shape: 10 short-convolution layers of 2048 channels, kernel 3: a slot
        // keeps 2 rows per conv layer, 10 * 2 * 2048 floats = 160 KiB.
        let types: Vec<&str> = (0..16)
            .map(|i| {
                if [2, 5, 8, 10, 12, 14].contains(&i) {
                    "full_attention"
                } else {
                    "conv"
                }
            })
            .collect();
        let cfg = ModelConfig::from_hf_config(&serde_json::json!({
            "architectures": ["Lfm2ForCausalLM"],
            "model_type": "lfm2",
            "num_hidden_layers": 16,
            "hidden_size": 2048,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 8192,
            "vocab_size": 65536,
            "max_position_embeddings": 128000,
            "conv_L_cache": 3,
            "layer_types": types,
        }))
        .expect("a valid config");
        let m = setting_estimate(None, &cfg, 1000, 0, 100, 8, 512, 4096);
        let slot = 10 * 2 * 2048 * 4u64;
        // 8 live slots and 4 for prefix snapshots.
        assert_eq!(m.state_bytes, 12 * slot);
        assert_eq!(m.total_bytes, 1000 + 100 * 8 * 4096 + 12 * slot);
        let dense = setting_estimate(None, &smollm2(), 1000, 0, 100, 8, 512, 4096);
        assert_eq!(dense.state_bytes, 0);
    }

    #[test]
    fn cuda_without_a_gpu_names_what_is_missing_and_a_bad_share_is_refused() {
        let e = gpu_share(DeviceChoice::Cuda(None), 1.5).expect_err("1.5 is no share");
        assert!(e.to_string().contains("--gpu-memory-utilization"), "{e}");
        match gpu_share(DeviceChoice::Cuda(Some(0)), 0.9) {
            // A machine with a GPU: its share.
            Ok(Some(g)) => assert!(g.share_bytes > 0 && g.device == "cuda:0"),
            Ok(None) => panic!("--device cuda never means the CPU"),
            Err(e) => {
                let text = format!("{e:#}");
                assert!(text.contains("--device cuda:0"), "{text}");
                assert!(text.contains("needs one"), "{text}");
            }
        }
        // The CPU never asks for a GPU.
        assert!(gpu_share(DeviceChoice::Cpu, 0.9).expect("cpu").is_none());
    }
}
