//! The llama.cpp peer of `pagoda bench batching`: spawns `llama-server` on a GGUF with
//! `--parallel C` and continuous batching, waits for `/health`, and runs one request through
//! its streaming `/completion` endpoint, timing the first and later tokens.
//!
//! Invariant: the child process is killed when the [`LlamaServer`] is dropped.

use crate::commands::bench_workload::{RequestResult, WorkItem};
use anyhow::Context;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct LlamaServer {
    child: Child,
    url: String,
    agent: ureq::Agent,
}

impl LlamaServer {
    /// Starts `bin` on `model` with `threads` threads and `parallel` slots of `slot_ctx`
    /// positions each; returns once it answers `/health`.
    pub fn start(
        bin: &Path,
        model: &Path,
        threads: usize,
        parallel: usize,
        slot_ctx: usize,
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let child = Command::new(bin)
            .args(["-m", &model.to_string_lossy()])
            .args(["-t", &threads.to_string(), "-tb", &threads.to_string()])
            .args(["-c", &(slot_ctx * parallel).to_string()])
            .args(["--parallel", &parallel.to_string(), "-cb"])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-b", "512", "-ub", "512"])
            // Busy-waiting OpenMP threads collapse llama.cpp on a shared 2-core VM.
            .env("OMP_WAIT_POLICY", "PASSIVE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(2))
            .build();
        let mut server = LlamaServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
            agent,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                anyhow::bail!("llama-server exited at start ({status}); run it by hand to see why");
            }
            if let Ok(r) = server.agent.get(&format!("{}/health", server.url)).call() {
                if r.status() == 200 {
                    return Ok(server);
                }
            }
            if Instant::now() > deadline {
                anyhow::bail!("llama-server did not become healthy within 120 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// One greedy completion of `item`, streamed, with `ignore_eos`.
    pub fn complete(&self, item: &WorkItem) -> anyhow::Result<RequestResult> {
        let body = serde_json::json!({
            "prompt": item.prompt, "n_predict": item.max_tokens, "ignore_eos": true,
            "temperature": 0.0, "stream": true, "cache_prompt": false,
        });
        let started = Instant::now();
        let response = self
            .agent
            .post(&format!("{}/completion", self.url))
            .send_json(body)
            .context("llama-server /completion")?;
        let reader = std::io::BufReader::new(response.into_reader());
        let (mut first, mut last, mut n) = (None, started, 0usize);
        let mut reported = None;
        for line in reader.lines() {
            let line = line?;
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            let event: serde_json::Value = serde_json::from_str(data)?;
            if event["stop"].as_bool() == Some(true) {
                reported = event["timings"]["predicted_n"].as_u64();
                break;
            }
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            n += 1;
        }
        let n = reported.map_or(n, |r| r as usize);
        let first = first.unwrap_or(last);
        Ok(RequestResult {
            output_tokens: n,
            ttft: first.duration_since(started),
            tpot: (n >= 2).then(|| last.duration_since(first) / (n as u32 - 1)),
        })
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
