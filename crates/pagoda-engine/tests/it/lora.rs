//! LoRA adapters per request in the batching engine, on tests/golden/tiny-llama with the two
//! peft adapters of tests/golden/tiny-llama-lora (`scripts/golden_lora_logits.py`): requests
//! with different adapters and without one run in the same steps and each gets the tokens of
//! its own adapter alone; the prefix cache never hands KV computed under one adapter to a
//! request under another (or under none).

use pagoda_engine::{EngineConfig, EngineHandle, EngineRequest, SamplingParams, TokenEvent};
use pagoda_model::arch::{Logits, LoraWeights, Model};
use pagoda_model::tokenizer::Tokenizer;
use pagoda_model::{open_model, KvDtype, PagedKvCache};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name)
}

fn load() -> (Arc<Model>, Arc<Tokenizer>, LoraWeights, LoraWeights) {
    let source = open_model(&golden("tiny-llama")).expect("model opens");
    let model = Arc::new(Model::from_source(&source).expect("model builds"));
    let alpha = LoraWeights::open("alpha", golden("tiny-llama-lora/alpha"), &model).unwrap();
    let beta = LoraWeights::open("beta", golden("tiny-llama-lora/beta"), &model).unwrap();
    (model, Arc::new(source.tokenizer), alpha, beta)
}

fn config(model: &Model) -> EngineConfig {
    EngineConfig {
        max_num_batched_tokens: 24,
        max_num_seqs: 8,
        block_size: 8,
        kv_cache_memory: Some(
            (PagedKvCache::bytes_per_block(model.config(), 8, KvDtype::F16) * 64) as u64,
        ),
        ..EngineConfig::default()
    }
}

/// Greedy tokens straight from the forward pass (no engine), with `adapter`.
fn greedy(model: &Model, prompt: &[u32], n: usize, adapter: Option<&LoraWeights>) -> Vec<u32> {
    let mut cache = model.new_cache(256);
    let mut logits = model
        .forward_adapted(prompt, 0, &mut cache, Logits::Last, adapter)
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let next = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .unwrap();
        out.push(next);
        logits = model
            .forward_adapted(&[next], cache.len(), &mut cache, Logits::Last, adapter)
            .unwrap();
    }
    out
}

fn request(prompt: &[u32], adapter: Option<&LoraWeights>) -> EngineRequest {
    let mut req = EngineRequest::new(prompt.to_vec(), SamplingParams::greedy(), 8);
    req.ignore_eos = true;
    req.adapter = adapter.cloned();
    req
}

/// Tokens and cached prompt tokens of a one-choice stream.
fn collect(stream: pagoda_engine::RequestStream) -> (Vec<u32>, usize) {
    let mut tokens = Vec::new();
    let mut cached = None;
    for ev in stream {
        match ev {
            TokenEvent::Token { token, .. } => tokens.push(token),
            TokenEvent::Finished { usage, .. } => cached = Some(usage.cached_prompt_tokens),
            TokenEvent::Error { message } => panic!("request failed: {message}"),
        }
    }
    (tokens, cached.expect("Finished"))
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 7 + salt * 13 + 3) % 300 + 5)
        .collect()
}

#[test]
fn requests_with_different_adapters_batch_together_and_each_gets_its_own() {
    let (model, tok, alpha, beta) = load();
    let shared = prompt(21, 0);
    let cases: Vec<(Vec<u32>, Option<&LoraWeights>)> = vec![
        (shared.clone(), Some(&alpha)),
        (shared.clone(), None),
        (shared.clone(), Some(&beta)),
        (prompt(9, 1), Some(&alpha)),
        (prompt(30, 2), None),
    ];
    let want: Vec<Vec<u32>> = cases
        .iter()
        .map(|(p, a)| greedy(&model, p, 8, *a))
        .collect();
    assert_ne!(want[0], want[1], "alpha changes the greedy tokens");
    assert_ne!(want[2], want[1], "beta changes the greedy tokens");
    let engine = EngineHandle::start(model.clone(), tok, config(&model)).unwrap();
    let streams: Vec<_> = cases
        .iter()
        .map(|(p, a)| engine.submit(request(p, *a)).unwrap())
        .collect();
    for (i, s) in streams.into_iter().enumerate() {
        assert_eq!(collect(s).0, want[i], "request {i}");
    }
    engine.shutdown();
}

#[test]
fn prefix_cache_is_not_shared_between_adapters() {
    let (model, tok, alpha, beta) = load();
    let engine = EngineHandle::start(model.clone(), tok, config(&model)).unwrap();
    let p = prompt(45, 3); // 5 full blocks of 8
    let run = |a: Option<&LoraWeights>| collect(engine.submit(request(&p, a)).unwrap());
    let (base_tokens, cached) = run(None);
    assert_eq!(cached, 0);
    let (alpha_tokens, cached) = run(Some(&alpha));
    assert_eq!(
        cached, 0,
        "the base's blocks are not reused under an adapter"
    );
    let (again, cached) = run(Some(&alpha));
    assert_eq!(cached, 40, "the same adapter reuses its own blocks");
    assert_eq!(again, alpha_tokens);
    let (_, cached) = run(Some(&beta));
    assert_eq!(cached, 0, "another adapter does not reuse alpha's blocks");
    let (base_again, cached) = run(None);
    assert_eq!(cached, 40);
    assert_eq!(base_again, base_tokens);
    assert_eq!(alpha_tokens, greedy(&model, &p, 8, Some(&alpha)));
    // A second load of the same files is another identity (its name could now mean new files).
    let reloaded = LoraWeights::open("alpha", golden("tiny-llama-lora/alpha"), &model).unwrap();
    assert_ne!(reloaded.cache_salt(), alpha.cache_salt());
    engine.shutdown();
}

#[test]
fn an_adapter_for_another_model_is_refused_at_submit() {
    let (model, tok, _, _) = load();
    let qsrc = open_model(&golden("tiny-qwen2")).unwrap();
    let qwen = Arc::new(Model::from_source(&qsrc).unwrap());
    let (_, _, alpha, _) = load();
    let engine =
        EngineHandle::start(qwen.clone(), Arc::new(qsrc.tokenizer), config(&qwen)).unwrap();
    let e = engine
        .submit(request(&[1, 2, 3], Some(&alpha)))
        .unwrap_err();
    assert!(e.to_string().contains("another shape"), "{e}");
    engine.shutdown();
    drop((model, tok));
}
