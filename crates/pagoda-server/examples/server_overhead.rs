//! What the HTTP layer adds: the same short greedy requests, one at a time, sent to the
//! engine directly and to `pagoda serve`'s OpenAI completions route (streamed, in-process
//! server on loopback), with TTFT and end-to-end latency at p50 / p90 for both and their
//! difference. Both paths get the same token ids (the HTTP request carries them as a
//! token-id prompt), so the engines do identical work.
//!
//! Usage: cargo run --release -p pagoda-server --example server_overhead -- [MODEL] [REQUESTS]
//! (MODEL: a store name or path, default smollm2:135m; REQUESTS default 50).

use futures_util::StreamExt;
use pagoda_engine::{EngineConfig, EngineHandle, EngineRequest, SamplingParams, TokenEvent};
use pagoda_runtime::loader::{self, Pull};
use pagoda_server::{BoundServer, ServerConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MAX_TOKENS: usize = 16;
/// Pause before each request so that the previous one has fully wound down.
const SETTLE: Duration = Duration::from_millis(30);
const PROMPT: &str = "Explain in one sentence why the sky is blue.";

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * p).ceil() as usize).saturating_sub(1);
    v.get(i).copied().unwrap_or(f64::NAN)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "smollm2:135m".into());
    let requests: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(50);
    let store = Arc::new(pagoda_store::Store::open(None)?);
    let resolved = loader::resolve(&store, &model, Pull::IfMissing)?;
    let loaded = loader::load(&resolved, &model)?;
    let engine_config = EngineConfig {
        kv_cache_memory: Some(256 << 20),
        ..EngineConfig::default()
    };
    let prompt = loaded.encode_chat(&[pagoda_model::chat_template::ChatMessage::new(
        "user", PROMPT,
    )])?;

    // Both paths run side by side and take turns, request by request, so the machine's
    // drift affects them alike.
    let engine = EngineHandle::start(
        loaded.model.clone(),
        loaded.tokenizer.clone(),
        engine_config.clone(),
    )?;
    let direct = |prompt: &[u32]| -> Result<(f64, f64), Box<dyn std::error::Error>> {
        let mut req = EngineRequest::new(prompt.to_vec(), SamplingParams::greedy(), MAX_TOKENS);
        req.ignore_eos = true;
        let started = Instant::now();
        let mut first = None;
        for ev in engine.submit(req)? {
            if let TokenEvent::Token { .. } = ev {
                first.get_or_insert_with(Instant::now);
            }
        }
        Ok((
            ms(first.unwrap_or(started).duration_since(started)),
            ms(started.elapsed()),
        ))
    };
    let rt = tokio::runtime::Runtime::new()?;
    let config = ServerConfig {
        port: 0,
        models: vec![model.clone()],
        engine: engine_config,
        ..ServerConfig::default()
    };
    let server = rt.block_on(BoundServer::bind(config, store.clone()))?;
    let url = format!("http://{}/v1/completions", server.local_addr()?);
    let state = server.state().clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = rt.spawn(server.run(async move {
        let _ = rx.await;
    }));
    while !state.is_ready() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = reqwest::Client::new();
    let body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
    });
    let http = || -> Result<(f64, f64), Box<dyn std::error::Error>> {
        rt.block_on(async {
            let started = Instant::now();
            let r = client.post(&url).json(&body).send().await?;
            let mut stream = r.bytes_stream();
            let mut first = None;
            let mut seen = String::new();
            while let Some(chunk) = stream.next().await {
                seen.push_str(&String::from_utf8_lossy(&chunk?));
                if first.is_none() && seen.contains("data: ") {
                    // Completions streams have no role chunk: the first event is a token.
                    first = Some(Instant::now());
                }
            }
            Ok((
                ms(first.unwrap_or(started).duration_since(started)),
                ms(started.elapsed()),
            ))
        })
    };
    let (mut direct_ttft, mut direct_e2e, mut http_ttft, mut http_e2e) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..requests + 3 {
        // Alternate which path goes first, and let the other engine's threads (and rayon's
        // spinning workers) settle before each request, so neither path inherits the other's
        // tail of work.
        std::thread::sleep(SETTLE);
        let ((dt, de), (ht, he)) = if i % 2 == 0 {
            let d = direct(&prompt)?;
            std::thread::sleep(SETTLE);
            (d, http()?)
        } else {
            let h = http()?;
            std::thread::sleep(SETTLE);
            (direct(&prompt)?, h)
        };
        if i >= 3 {
            direct_ttft.push(dt);
            direct_e2e.push(de);
            http_ttft.push(ht);
            http_e2e.push(he);
        }
    }
    let _ = tx.send(());
    let _ = rt.block_on(task);
    engine.shutdown();

    println!(
        "{requests} requests, prompt {} tokens, {MAX_TOKENS} output tokens, one at a time",
        prompt.len()
    );
    println!(
        "{:<28} {:>10} {:>10} {:>10}",
        "", "direct", "HTTP", "overhead"
    );
    for (name, d, h) in [
        ("TTFT p50 (ms)", &direct_ttft, &http_ttft),
        ("e2e p50 (ms)", &direct_e2e, &http_e2e),
    ] {
        let (a, b) = (percentile(d.clone(), 0.5), percentile(h.clone(), 0.5));
        println!("{name:<28} {a:>10.2} {b:>10.2} {:>10.2}", b - a);
    }
    for (name, d, h) in [
        ("TTFT p90 (ms)", &direct_ttft, &http_ttft),
        ("e2e p90 (ms)", &direct_e2e, &http_e2e),
    ] {
        let (a, b) = (percentile(d.clone(), 0.9), percentile(h.clone(), 0.9));
        println!("{name:<28} {a:>10.2} {b:>10.2} {:>10.2}", b - a);
    }
    Ok(())
}
