//! Quick look at the engine's aggregate decode throughput: `C` concurrent greedy requests of
//! `P` prompt tokens and `G` generated tokens each, continuous vs static batching.
//!
//! `cargo run --release -p pagoda-engine --example engine_throughput -- MODEL [C] [P] [G]`
//! (the full comparison with llama-server is `pagoda bench batching`).

use pagoda_engine::{BatchingMode, EngineConfig, EngineHandle, EngineRequest, SamplingParams};
use pagoda_model::arch::Model;
use pagoda_model::open_model;
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: engine_throughput MODEL [C] [P] [G]")?;
    let arg = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (concurrency, prompt_len, gen) = (arg(2, 16), arg(3, 128), arg(4, 64));
    let source = open_model(std::path::Path::new(path))?;
    let model = Arc::new(Model::from_source(&source)?);
    let tokenizer = Arc::new(source.tokenizer);
    let vocab = model.config().vocab_size as u32;
    for mode in [BatchingMode::Continuous, BatchingMode::Static] {
        let config = EngineConfig {
            mode,
            ..EngineConfig::default()
        };
        let engine = EngineHandle::start(model.clone(), tokenizer.clone(), config)?;
        let started = Instant::now();
        let streams: Vec<_> = (0..concurrency)
            .map(|i| {
                // Mixed lengths: from half to 1.5x the nominal prompt and output.
                let p = prompt_len / 2 + (i * prompt_len) / concurrency.max(1);
                let g = gen / 2 + (i * 7919 % concurrency.max(1)) * gen / concurrency.max(1);
                let prompt = (0..p as u32)
                    .map(|t| (t * 31 + i as u32 * 7) % vocab)
                    .collect();
                let mut req = EngineRequest::new(prompt, SamplingParams::greedy(), g.max(1));
                req.ignore_eos = true;
                engine.submit(req)
            })
            .collect::<Result<_, _>>()?;
        let mut tokens = 0usize;
        for s in streams {
            for ev in s {
                if let pagoda_engine::TokenEvent::Token { .. } = ev {
                    tokens += 1;
                }
            }
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{mode:?}: {concurrency} requests, {tokens} output tokens in {secs:.2} s = {:.1} tok/s",
            tokens as f64 / secs
        );
        engine.shutdown();
    }
    Ok(())
}
