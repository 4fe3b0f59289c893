//! Gateway overhead benchmark: the latency the gateway adds in front of a fast backend, and the
//! requests per second one gateway core sustains.
//!
//! This process runs a fast OpenAI-style backend (a fixed chat completion) and the load
//! generator; the gateway under test is a separate `pagoda gateway` process, started here with
//! `--threads 1` (pin it to its own core with `--gateway-cpu`). Phases alternate between the
//! backend directly and the gateway, at the same fixed arrival rate (open loop), so the added
//! latency is the difference of the two distributions; then a closed loop with many
//! connections measures the gateway's ceiling.
//!
//! Run (release build of the CLI first):
//! `cargo run --release -p pagoda-gateway --example gateway_overhead -- --pagoda target/release/pagoda`
//!
//! Options: `--rate R`, `--seconds S`, `--rounds N`, `--connections C`, `--gateway-cpu CPU`,
//! `--load-cpu CPU` (`none` to leave unpinned), `--backend-addr ADDR`, `--peer NAME=URL` (a
//! second proxy in front of `ADDR`, measured in the same run), `--latency-tuned` (hold the PM
//! QoS CPU latency request at 0 for the run, as tuned's latency-performance profile does).

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use axum::Router;

const BODY: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Paris is the capital of France."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":8,"total_tokens":20}}"#;
const KEY: &str = "pk-overhead-benchmark";

struct Args {
    pagoda: String,
    rate: f64,
    seconds: f64,
    rounds: usize,
    connections: usize,
    gateway_cpu: Option<String>,
    load_cpu: Option<String>,
    /// Where the fast backend listens (fixed, so a peer proxy can be configured for it).
    backend_addr: String,
    /// Another proxy in front of the same backend, measured the same way (e.g. nginx).
    peer: Option<(String, String)>,
    /// Hold the PM QoS CPU latency request at 0 µs for the run (`/dev/cpu_dma_latency`, what
    /// tuned's latency-performance profile does): idle CPUs poll instead of halting.
    latency_tuned: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        pagoda: "target/release/pagoda".into(),
        rate: 1000.0,
        seconds: 5.0,
        rounds: 2,
        connections: 64,
        gateway_cpu: Some("1".into()),
        load_cpu: Some("0".into()),
        backend_addr: "127.0.0.1:0".into(),
        peer: None,
        latency_tuned: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        if argv[i] == "--latency-tuned" {
            a.latency_tuned = true;
            i += 1;
            continue;
        }
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--pagoda" => a.pagoda = v,
            "--rate" => a.rate = v.parse().unwrap_or(a.rate),
            "--seconds" => a.seconds = v.parse().unwrap_or(a.seconds),
            "--rounds" => a.rounds = v.parse().unwrap_or(a.rounds),
            "--connections" => a.connections = v.parse().unwrap_or(a.connections),
            "--gateway-cpu" => a.gateway_cpu = (v != "none").then_some(v),
            "--load-cpu" => a.load_cpu = (v != "none").then_some(v),
            "--backend-addr" => a.backend_addr = v,
            "--peer" => {
                a.peer = v
                    .split_once('=')
                    .map(|(n, u)| (n.to_string(), u.to_string()))
            }
            other => {
                eprintln!("unknown argument {other}; see the module doc");
                std::process::exit(2);
            }
        }
        i += 2;
    }
    a
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Open loop: requests start at fixed intervals whatever the answers do; latencies in ms.
async fn open_loop(
    client: &reqwest::Client,
    url: &str,
    rate: f64,
    seconds: f64,
) -> (Vec<f64>, usize) {
    let n = (rate * seconds) as usize;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let due = start + interval * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let client = client.clone();
        let url = url.to_string();
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let ok = send(&client, &url).await;
            (t.elapsed().as_secs_f64() * 1000.0, ok)
        }));
    }
    let mut lat = Vec::with_capacity(n);
    let mut errors = 0;
    for t in tasks {
        match t.await {
            Ok((ms, true)) => lat.push(ms),
            _ => errors += 1,
        }
    }
    lat.sort_by(f64::total_cmp);
    (lat, errors)
}

async fn send(client: &reqwest::Client, url: &str) -> bool {
    let r = client
        .post(url)
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(r#"{"model":"chat","messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":8}"#)
        .send()
        .await;
    match r {
        Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
        _ => false,
    }
}

/// Closed loop: `connections` clients send back to back; requests per second.
async fn closed_loop(
    client: &reqwest::Client,
    url: &str,
    connections: usize,
    seconds: f64,
) -> (f64, usize) {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let client = client.clone();
        let url = url.to_string();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut err) = (0usize, 0usize);
            while Instant::now() < deadline {
                if send(&client, &url).await {
                    ok += 1;
                } else {
                    err += 1;
                }
            }
            (ok, err)
        }));
    }
    let (mut ok, mut err) = (0, 0);
    for t in tasks {
        if let Ok((o, e)) = t.await {
            ok += o;
            err += e;
        }
    }
    (ok as f64 / seconds, err)
}

/// CPU seconds (user + system) a process has used, from /proc (Linux; 100 ticks per second).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// The VM's guest halt polling (Linux `haltpoll` cpuidle driver), which decides how long an
/// idle vCPU takes to wake for the next request: the tail of every cross-core hop depends on
/// it, so each run states it.
fn guest_halt_polling() -> String {
    match std::fs::read_to_string("/sys/module/haltpoll/parameters/guest_halt_poll_ns") {
        Ok(ns) => format!(
            "guest halt polling: up to {} ns before an idle vCPU halts",
            ns.trim()
        ),
        Err(_) => "guest halt polling: not available (no haltpoll driver)".into(),
    }
}

/// A PM QoS request for 0 µs CPU wake-up latency, held while the returned file stays open:
/// the cpuidle governor then keeps idle CPUs in their polling state, so a request that
/// arrives on an idle core does not wait for the hypervisor to resume a halted vCPU. Needs
/// root; `None` (with a message) when the device cannot be opened.
fn hold_zero_cpu_latency() -> Option<std::fs::File> {
    use std::io::Write;
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency");
    match opened {
        Ok(mut f) => match f.write_all(&0i32.to_ne_bytes()) {
            Ok(()) => Some(f),
            Err(e) => {
                eprintln!("cannot set /dev/cpu_dma_latency: {e}");
                None
            }
        },
        Err(e) => {
            eprintln!("cannot open /dev/cpu_dma_latency (root is needed): {e}");
            None
        }
    }
}

/// What the gateway's usage ledger holds after the run: every request through it (warm-up,
/// open and closed loops) should be one row, with none dropped, although the writer runs at
/// idle priority on the saturated gateway core during the closed loop.
async fn usage_ledger(client: &reqwest::Client, gateway: &str) -> String {
    let answer = client
        .get(format!("{gateway}/admin/usage"))
        .bearer_auth("bench-admin")
        .send()
        .await;
    let body: serde_json::Value = match answer {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(e) => return format!("usage ledger: not read ({e})"),
    };
    let rows = body["data"].as_array().cloned().unwrap_or_default();
    let recorded: u64 = rows.iter().filter_map(|r| r["requests"].as_u64()).sum();
    format!(
        "usage ledger: {recorded} requests recorded, {} dropped",
        body["dropped_records"]
    )
}

fn start_gateway(args: &Args, backend: &str, dir: &std::path::Path) -> (Child, String) {
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_key = \"bench-admin\"\n[storage]\nsqlite = \"gateway.db\"\n\
         [health]\ninterval_ms = 0\n[cache]\nenabled = false\n\
         [[target]]\nname = \"fast\"\nreplicas = [\"{backend}\"]\nmax_concurrency = 1024\n\
         [[route]]\nmodel = \"chat\"\ntarget = \"fast\"\n\
         [[key]]\nname = \"bench\"\nkey_sha256 = \"{}\"\n",
        pagoda_gateway::keys::hash_key(KEY)
    );
    let path = dir.join("gateway.toml");
    std::fs::write(&path, config).expect("write the gateway config");
    let log = dir.join("gateway.log");
    let log_file = std::fs::File::create(&log).expect("create the gateway log");
    let mut cmd = match &args.gateway_cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpu, &args.pagoda]);
            c
        }
        None => Command::new(&args.pagoda),
    };
    cmd.args(["gateway", "--threads", "1", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(log_file);
    let mut child = cmd
        .spawn()
        .expect("start pagoda gateway (build it: cargo build --release -p pagoda-cli)");
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(pos) = text.find("listening on http://") {
            let rest = &text[pos + "listening on ".len()..];
            let url = rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
            return (child, url);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the gateway did not start; see {}", log.display());
}

fn main() {
    let args = parse_args();
    let _latency_request = if args.latency_tuned {
        hold_zero_cpu_latency()
    } else {
        None
    };
    let tuned_line = match (&_latency_request, args.latency_tuned) {
        (Some(_), _) => "CPU latency: PM QoS request of 0 µs held (idle CPUs poll)",
        (None, true) => {
            "CPU latency: --latency-tuned asked for, but /dev/cpu_dma_latency could not be set"
        }
        (None, false) => "CPU latency: as booted (no PM QoS request)",
    };
    if let Some(cpu) = &args.load_cpu {
        // Keep the backend and the load generator off the gateway's core.
        let _ = Command::new("taskset")
            .args(["-pc", cpu, &std::process::id().to_string()])
            .stdout(Stdio::null())
            .status();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let app = Router::new()
            .route("/v1/chat/completions", post(|| async { ([("content-type", "application/json")], BODY) }))
            .route("/health", get(|| async { "ok" }));
        let listener = tokio::net::TcpListener::bind(&args.backend_addr).await.expect("bind the backend address");
        let backend = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut child, gateway) = start_gateway(&args, &backend, dir.path());
        let client = Arc::new(
            reqwest::Client::builder()
                .pool_max_idle_per_host(4096)
                .tcp_nodelay(true)
                .build()
                .expect("client"),
        );
        let direct_url = format!("{backend}/v1/chat/completions");
        let gateway_url = format!("{gateway}/v1/chat/completions");
        // Warm up both paths (connections, caches).
        open_loop(&client, &direct_url, args.rate, 1.0).await;
        let (warm, warm_err) = open_loop(&client, &gateway_url, args.rate, 1.0).await;
        let peer_url = args.peer.as_ref().map(|(_, u)| format!("{}/v1/chat/completions", u.trim_end_matches('/')));
        if let Some(u) = &peer_url {
            open_loop(&client, u, args.rate, 1.0).await;
        }
        let (mut direct, mut via, mut peer) = (Vec::new(), Vec::new(), Vec::new());
        let (mut direct_err, mut via_err, mut peer_err) = (0, 0, 0);
        for _ in 0..args.rounds {
            if let Some(u) = &peer_url {
                let (l, e) = open_loop(&client, u, args.rate, args.seconds).await;
                peer.extend(l);
                peer_err += e;
            }
            let (l, e) = open_loop(&client, &direct_url, args.rate, args.seconds).await;
            direct.extend(l);
            direct_err += e;
            let (l, e) = open_loop(&client, &gateway_url, args.rate, args.seconds).await;
            via.extend(l);
            via_err += e;
        }
        direct.sort_by(f64::total_cmp);
        via.sort_by(f64::total_cmp);
        peer.sort_by(f64::total_cmp);
        let cpu_before = cpu_seconds(child.id());
        let (max_rps, max_err) = closed_loop(&client, &gateway_url, args.connections, args.seconds).await;
        let cpu_used = cpu_seconds(child.id()) - cpu_before;
        let per_core = max_rps * args.seconds / cpu_used.max(1e-9);
        let (max_direct, _) = closed_loop(&client, &direct_url, args.connections, args.seconds).await;
        let sent = warm.len() + warm_err + via.len() + via_err + (max_rps * args.seconds).round() as usize + max_err;
        let ledger = usage_ledger(&client, &gateway).await;
        let _ = child.kill();
        let _ = child.wait();

        println!("gateway overhead at {:.0} requests/s (open loop, {} requests per path), gateway on 1 core", args.rate, direct.len());
        println!("{}", guest_halt_polling());
        println!("{tuned_line}");
        println!("| path | p50 ms | p90 ms | p99 ms | errors |");
        println!("|---|---:|---:|---:|---:|");
        for (name, l, e) in [("backend directly", &direct, direct_err), ("through the gateway", &via, via_err)] {
            println!(
                "| {name} | {:.3} | {:.3} | {:.3} | {e} |",
                percentile(l, 0.5),
                percentile(l, 0.9),
                percentile(l, 0.99)
            );
        }
        println!(
            "| added by the gateway | {:.3} | {:.3} | {:.3} | |",
            percentile(&via, 0.5) - percentile(&direct, 0.5),
            percentile(&via, 0.9) - percentile(&direct, 0.9),
            percentile(&via, 0.99) - percentile(&direct, 0.99)
        );
        if let Some((name, _)) = &args.peer {
            println!(
                "| through {name} | {:.3} | {:.3} | {:.3} | {peer_err} |",
                percentile(&peer, 0.5),
                percentile(&peer, 0.9),
                percentile(&peer, 0.99)
            );
            println!(
                "| added by {name} | {:.3} | {:.3} | {:.3} | |",
                percentile(&peer, 0.5) - percentile(&direct, 0.5),
                percentile(&peer, 0.9) - percentile(&direct, 0.9),
                percentile(&peer, 0.99) - percentile(&direct, 0.99)
            );
        }
        println!(
            "closed loop, {} connections: {:.0} requests/s through the gateway ({} errors; the gateway used {:.2} CPU-s in {:.1} s: {:.0} requests per gateway CPU-second); {:.0} requests/s to the backend directly",
            args.connections, max_rps, max_err, cpu_used, args.seconds, per_core, max_direct
        );
        println!("{ledger}; {sent} requests sent through the gateway");
    });
}
