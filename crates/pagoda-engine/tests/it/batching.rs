//! The batching engine against the reference decoding loop (`reference.rs`): prompts run together (mixed
//! lengths, chunked prefill, preemption forced by a small KV pool, prefix-cache hits) give the
//! same greedy tokens as each run alone; n > 1 choices equal separate seeded runs; aborts and
//! dropped streams free their blocks; bad requests fail at submit. The batching checks run
//! on CUDA too where a GPU is usable (elsewhere they print `skipped: no GPU (...)`): the
//! scheduler, block pool and prefix cache do not know the device.

use pagoda_engine::{
    BatchingMode, EngineConfig, EngineError, EngineHandle, EngineRequest, FinishReason, Policy,
    SamplingParams, TokenEvent,
};
use pagoda_model::arch::Model;
use pagoda_model::tokenizer::Tokenizer;
use pagoda_model::{open_model, Device, KvDtype, PagedKvCache};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name)
}

fn load(path: &Path) -> (Arc<Model>, Arc<Tokenizer>) {
    load_on(path, Device::Cpu)
}

fn load_on(path: &Path, device: Device) -> (Arc<Model>, Arc<Tokenizer>) {
    let source = open_model(path).expect("model opens");
    let model = Arc::new(Model::from_source_on(&source, device).expect("model builds"));
    (model, Arc::new(source.tokenizer))
}

/// Prompts of mixed lengths made of in-vocabulary ids (a seeded LCG; no tokenizer needed).
fn prompts(vocab: usize, lengths: &[usize]) -> Vec<Vec<u32>> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    lengths
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((seed >> 33) % vocab as u64) as u32
                })
                .collect()
        })
        .collect()
}

fn alone(model: &Model, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    crate::reference::decode(model, prompt, SamplingParams::greedy(), max_tokens, None)
}

/// Collects every token of choice 0 and the finish event of a one-choice stream.
fn collect(stream: pagoda_engine::RequestStream) -> (Vec<u32>, FinishReason, pagoda_engine::Usage) {
    let mut tokens = Vec::new();
    let mut finish = None;
    for ev in stream {
        match ev {
            TokenEvent::Token { token, .. } => tokens.push(token),
            TokenEvent::Finished { reason, usage, .. } => finish = Some((reason, usage)),
            TokenEvent::Error { message } => panic!("request failed: {message}"),
        }
    }
    let (reason, usage) = finish.expect("a Finished event");
    (tokens, reason, usage)
}

fn kv_bytes(model: &Model, blocks: usize, block_size: usize) -> u64 {
    (PagedKvCache::bytes_per_block(model.config(), block_size, KvDtype::F16) * blocks) as u64
}

/// Runs `prompts` through one engine at once and checks each against its solo run.
fn check_batch_equals_alone(
    model_dir: &Path,
    config: EngineConfig,
    lengths: &[usize],
    max_tokens: usize,
) {
    check_batch_equals_alone_on(Device::Cpu, model_dir, config, lengths, max_tokens)
}

fn check_batch_equals_alone_on(
    device: Device,
    model_dir: &Path,
    config: EngineConfig,
    lengths: &[usize],
    max_tokens: usize,
) {
    let (model, tok) = load_on(model_dir, device);
    check_batch_equals_alone_with(model, tok, config, lengths, max_tokens);
}

/// [`check_batch_equals_alone_on`] for a model already loaded (a split one).
fn check_batch_equals_alone_with(
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    config: EngineConfig,
    lengths: &[usize],
    max_tokens: usize,
) {
    let vocab = model.config().vocab_size;
    let prompts = prompts(vocab, lengths);
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            crate::reference::decode_with_kv(
                &model,
                p,
                SamplingParams::greedy(),
                max_tokens,
                None,
                config.kv_dtype,
            )
        })
        .collect();
    let engine = EngineHandle::start(model.clone(), tok.clone(), config).expect("engine starts");
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut req = EngineRequest::new(p.clone(), SamplingParams::greedy(), max_tokens);
            req.ignore_eos = true;
            engine.submit(req).expect("submits")
        })
        .collect();
    for (i, stream) in streams.into_iter().enumerate() {
        let (got, reason, usage) = collect(stream);
        assert_eq!(got, want[i], "prompt {i} ({} tokens)", lengths[i]);
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(usage.completion_tokens, max_tokens);
        assert_eq!(usage.prompt_tokens, lengths[i]);
    }
    wait_idle(&engine);
    engine.shutdown();
}

/// Waits until the engine has published a step with nothing running or waiting and every
/// block returned (stats are published after the step that sent the last event).
fn wait_idle(engine: &EngineHandle) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = engine.stats();
        if s.running + s.waiting == 0 && s.kv_blocks_used == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "engine not idle: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `blocks` KV blocks of 8 positions (and a hybrid's recurrent-state slots beside them).
fn small_config(model_dir: &Path, blocks: usize) -> EngineConfig {
    let (model, _) = load(model_dir);
    let mut config = EngineConfig {
        max_num_batched_tokens: 24,
        max_num_seqs: 4,
        block_size: 8,
        ..EngineConfig::default()
    };
    let states = pagoda_engine::StatePlan::for_model(&model, &config).map_or(0, |p| p.bytes());
    config.kv_cache_memory = Some(kv_bytes(&model, blocks, 8) + states as u64);
    config
}

const LENGTHS: [usize; 7] = [5, 40, 17, 63, 2, 30, 9];

/// An FP8 block takes half an f16 block's bytes, so the same `--kv-cache-memory` plans twice
/// the blocks (and twice the positions), in the same bytes.
#[test]
fn fp8_kv_plans_twice_the_blocks_of_f16_in_the_same_memory() {
    let dir = golden("tiny-llama");
    let (model, tokenizer) = load(&dir);
    let f16 = small_config(&dir, 40);
    let fp8 = EngineConfig {
        kv_dtype: KvDtype::Fp8E4m3,
        ..f16.clone()
    };
    let f16_layout = pagoda_engine::KvLayout::plan(&model, &f16).expect("f16 plan");
    let fp8_layout = pagoda_engine::KvLayout::plan(&model, &fp8).expect("fp8 plan");
    assert_eq!(f16_layout.n_blocks, 40);
    assert_eq!(fp8_layout.n_blocks, 2 * f16_layout.n_blocks);
    assert_eq!(
        fp8_layout.capacity_tokens(),
        2 * f16_layout.capacity_tokens()
    );
    assert_eq!(fp8_layout.bytes, f16_layout.bytes);
    assert_eq!(fp8_layout.dtype, KvDtype::Fp8E4m3);
    // And the engine runs on it: a greedy request finishes with its tokens.
    let engine = EngineHandle::start(model.clone(), tokenizer, fp8).expect("engine starts");
    let prompt = prompts(model.config().vocab_size, &[20]).remove(0);
    let mut req = EngineRequest::new(prompt, SamplingParams::greedy(), 8);
    req.ignore_eos = true;
    let (tokens, reason, usage) = collect(engine.submit(req).expect("submits"));
    assert_eq!(tokens.len(), 8);
    assert_eq!(reason, FinishReason::Length);
    assert_eq!(usage.completion_tokens, 8);
    wait_idle(&engine);
    engine.shutdown();
}

#[test]
fn llama_batch_with_chunked_prefill_equals_each_alone() {
    let dir = golden("tiny-llama");
    check_batch_equals_alone(&dir, small_config(&dir, 64), &LENGTHS, 12);
}

#[test]
fn llama_batch_under_preemption_equals_each_alone() {
    // 12 blocks of 8 = 96 positions: the longest sequence (63 + 12) fits alone, four do not.
    let dir = golden("tiny-llama");
    let mut config = small_config(&dir, 12);
    config.prefix_caching = false;
    check_batch_equals_alone(&dir, config, &LENGTHS, 12);
}

#[test]
fn every_other_family_batches_equal_each_alone() {
    for name in [
        "tiny-qwen2",
        "tiny-gemma3",
        "tiny-qwen3",
        "tiny-smollm3",
        "tiny-mistral3",
        "tiny-phi3",
        "tiny-gemma4",
        "tiny-gemma4-keqv",
        "tiny-qwen3moe",
        "tiny-qwen2moe",
        "tiny-olmoe",
        "tiny-gpt-oss",
    ] {
        let dir = golden(name);
        check_batch_equals_alone(&dir, small_config(&dir, 14), &LENGTHS, 10);
    }
}

/// Hybrids (LFM2's short-convolution layers, Granite 4.0-H's Mamba-2 layers, Qwen3.5's gated
/// DeltaNet layers: a state slot
/// per running sequence): mixed prompts with chunked prefill, then under preemption forced by
/// a small KV pool (a preempted sequence gives its slot back and recomputes from position
/// 0), give each prompt's tokens alone (`n > 1`:
/// `n_choices_share_the_prompt_and_equal_separate_seeded_runs`).
#[test]
fn a_hybrid_batches_and_survives_preemption_as_each_alone() {
    // tiny-lfm2moe: the same layers with experts routed by a biased sigmoid; tiny-granite4h:
    // Mamba-2 layers; tiny-qwen35moe: DeltaNet layers with routed and shared experts.
    for name in [
        "tiny-lfm2",
        "tiny-lfm2moe",
        "tiny-granite4h",
        "tiny-qwen35",
        "tiny-qwen35moe",
    ] {
        let dir = golden(name);
        check_batch_equals_alone(&dir, small_config(&dir, 64), &LENGTHS, 10);
        check_batch_equals_alone(&dir, small_config(&dir, 12), &LENGTHS, 10);
    }
}

#[test]
fn batches_with_chunked_prefill_and_preemption_equal_each_alone_on_cuda() {
    let gpu = match pagoda_model::DeviceChoice::Cuda(None).resolve() {
        Ok(r) => r.device,
        Err(e) => return pagoda_model::device::no_gpu_for_test(e),
    };
    for (name, blocks, prefix_caching, kv_dtype) in [
        ("tiny-llama", 64, true, KvDtype::F16),
        ("tiny-llama", 12, false, KvDtype::F16),
        ("tiny-qwen2", 14, true, KvDtype::F16),
        ("tiny-gemma3", 14, true, KvDtype::F16),
        ("tiny-qwen3", 14, true, KvDtype::F16),
        ("tiny-smollm3", 14, false, KvDtype::F16),
        ("tiny-mistral3", 14, true, KvDtype::F16),
        ("tiny-phi3", 14, true, KvDtype::F16),
        ("tiny-gemma4", 14, true, KvDtype::F16),
        ("tiny-qwen3moe", 14, true, KvDtype::F16),
        ("tiny-qwen2moe", 14, true, KvDtype::F16),
        // FP8 K/V: twice the blocks in the same memory, batched as alone.
        ("tiny-llama", 12, true, KvDtype::Fp8E4m3),
        ("tiny-gemma3", 14, false, KvDtype::Fp8E4m3),
    ] {
        let dir = golden(name);
        let mut config = small_config(&dir, blocks);
        config.prefix_caching = prefix_caching;
        config.kv_dtype = kv_dtype;
        check_batch_equals_alone_on(gpu, &dir, config, &LENGTHS, 10);
    }
}

#[test]
fn batches_on_a_model_split_between_cpu_and_gpu_equal_each_alone() {
    if let Err(e) = pagoda_model::DeviceChoice::Cuda(None).resolve() {
        return pagoda_model::device::no_gpu_for_test(e);
    }
    for (name, blocks) in [("tiny-llama", 12), ("tiny-gemma3", 14)] {
        let dir = golden(name);
        let source = open_model(&dir).expect("model opens");
        let n = source.config.n_layers;
        // The last half of the layers (at least one) on the GPU, the rest on the CPU.
        let (model, placement) = Model::from_source_placed(
            &source,
            pagoda_model::DeviceChoice::Cuda(None),
            Some(n.div_ceil(2)),
        )
        .expect("split model builds");
        assert!(
            !placement.all_gpu() && !placement.all_cpu(),
            "{placement:?}"
        );
        check_batch_equals_alone_with(
            Arc::new(model),
            Arc::new(source.tokenizer),
            small_config(&dir, blocks),
            &LENGTHS,
            10,
        );
    }
}

#[test]
fn static_mode_and_other_policies_give_the_same_tokens() {
    let dir = golden("tiny-llama");
    for (mode, policy) in [
        (BatchingMode::Static, Policy::Fcfs),
        (BatchingMode::Continuous, Policy::Priority),
        (BatchingMode::Continuous, Policy::Sjf),
    ] {
        let mut config = small_config(&dir, 20);
        config.mode = mode;
        config.policy = policy;
        check_batch_equals_alone(&dir, config, &LENGTHS, 8);
    }
}

#[test]
fn prefix_cache_hit_gives_the_same_output_and_reports_cached_tokens() {
    let dir = golden("tiny-llama");
    let (model, tok) = load(&dir);
    let engine =
        EngineHandle::start(model.clone(), tok.clone(), small_config(&dir, 64)).expect("starts");
    let prompt = prompts(model.config().vocab_size, &[45]).remove(0);
    let run = |p: &[u32]| {
        let mut req = EngineRequest::new(p.to_vec(), SamplingParams::greedy(), 10);
        req.ignore_eos = true;
        collect(engine.submit(req).expect("submits"))
    };
    let (first, _, miss) = run(&prompt);
    let (second, _, hit) = run(&prompt);
    assert_eq!(first, second, "a prefix-cache hit changes nothing");
    assert_eq!(miss.cached_prompt_tokens, 0);
    // 45 tokens = 5 full blocks of 8; all 40 positions of them are reused.
    assert_eq!(hit.cached_prompt_tokens, 40);
    assert_eq!(first, alone(&model, &prompt, 10));
    wait_idle(&engine);
    assert!(engine.stats().prefix_cache_hit_rate > 0.0);
    engine.shutdown();
}

/// A hybrid (LFM2, Granite 4.0-H, Qwen3.5 dense and MoE) under prefix caching: a second prompt sharing the first
/// one's 40 leading tokens resumes from the recurrent-state snapshot at that block boundary,
/// computes only its suffix, and gives the tokens and logprobs (top 5 at every step) of a run
/// without the cache.
#[test]
fn a_hybrid_resumes_a_shared_prefix_from_its_state_snapshot() {
    for name in [
        "tiny-lfm2",
        "tiny-granite4h",
        "tiny-qwen35",
        "tiny-qwen35moe",
    ] {
        check_resume_from_snapshot(&golden(name));
    }
}

fn check_resume_from_snapshot(dir: &Path) {
    let dir = dir.to_path_buf();
    let (model, tok) = load(&dir);
    let vocab = model.config().vocab_size;
    let mut ps = prompts(vocab, &[40, 7, 11]);
    let (shared, first_tail, second_tail) = (ps.remove(0), ps.remove(0), ps.remove(0));
    let first: Vec<u32> = shared.iter().chain(&first_tail).copied().collect();
    let second: Vec<u32> = shared.iter().chain(&second_tail).copied().collect();
    let run = |engine: &EngineHandle, p: &[u32]| {
        let sampling = SamplingParams {
            logprobs: Some(5),
            ..SamplingParams::greedy()
        };
        let mut req = EngineRequest::new(p.to_vec(), sampling, 8);
        req.ignore_eos = true;
        let mut tokens = Vec::new();
        let mut usage = None;
        for ev in engine.submit(req).expect("submits") {
            match ev {
                TokenEvent::Token { token, logprob, .. } => {
                    let l = logprob.expect("logprobs asked for");
                    tokens.push((token, l.top_logprobs));
                }
                TokenEvent::Finished { usage: u, .. } => usage = Some(u),
                TokenEvent::Error { message } => panic!("{message}"),
            }
        }
        (tokens, usage.expect("finished"))
    };
    let cached =
        EngineHandle::start(model.clone(), tok.clone(), small_config(&dir, 64)).expect("starts");
    let (_, miss) = run(&cached, &first);
    assert_eq!(miss.cached_prompt_tokens, 0);
    let (got, hit) = run(&cached, &second);
    // 40 shared tokens are 5 blocks of 8; the state was kept at 40 (the first prompt's last
    // boundary before its final token is 40, and its chunks of 24 end on blocks).
    assert_eq!(hit.cached_prompt_tokens, 40, "only the suffix is computed");
    let stats = cached.stats();
    assert!(stats.state_slots_total > 0);
    wait_idle(&cached);
    cached.shutdown();

    let mut plain_config = small_config(&dir, 64);
    plain_config.prefix_caching = false;
    let plain = EngineHandle::start(model.clone(), tok, plain_config).expect("starts");
    let (want, none) = run(&plain, &second);
    assert_eq!(none.cached_prompt_tokens, 0);
    assert_eq!(got.len(), want.len());
    for (step, ((a, la), (b, lb))) in got.iter().zip(&want).enumerate() {
        assert_eq!(a, b, "token {step}");
        for (x, y) in la.iter().zip(lb) {
            assert_eq!(x.token, y.token, "step {step}");
            assert!(
                (x.logprob - y.logprob).abs() < 1e-5,
                "step {step}: {} vs {}",
                x.logprob,
                y.logprob
            );
        }
    }
    wait_idle(&plain);
    plain.shutdown();
}

#[test]
fn n_choices_share_the_prompt_and_equal_separate_seeded_runs() {
    // The hybrids: a child starts from a copy of its parent's recurrent state.
    for name in ["tiny-llama", "tiny-lfm2", "tiny-granite4h", "tiny-qwen35"] {
        check_n_choices_equal_seeded_runs(&golden(name));
    }
}

fn check_n_choices_equal_seeded_runs(dir: &Path) {
    let (model, tok) = load(dir);
    let prompt = prompts(model.config().vocab_size, &[21]).remove(0);
    let sampling = SamplingParams {
        temperature: 1.0,
        seed: Some(7),
        ..SamplingParams::default()
    };
    let engine =
        EngineHandle::start(model.clone(), tok.clone(), small_config(dir, 64)).expect("starts");
    let mut req = EngineRequest::new(prompt.clone(), sampling.clone(), 9);
    req.n = 3;
    req.ignore_eos = true;
    let mut per_choice = vec![Vec::new(); 3];
    let mut finished = 0;
    for ev in engine.submit(req).expect("submits") {
        match ev {
            TokenEvent::Token { index, token, .. } => per_choice[index].push(token),
            TokenEvent::Finished { .. } => finished += 1,
            TokenEvent::Error { message } => panic!("{message}"),
        }
    }
    assert_eq!(finished, 3);
    for (i, got) in per_choice.iter().enumerate() {
        let want = crate::reference::decode(
            &model,
            &prompt,
            SamplingParams {
                seed: Some(7 + i as u64),
                ..sampling.clone()
            },
            9,
            None,
        );
        assert_eq!(got, &want, "choice {i}");
    }
    wait_idle(&engine);
    engine.shutdown();
}

#[test]
fn abort_and_dropped_streams_free_their_blocks() {
    let dir = golden("tiny-llama");
    let (model, tok) = load(&dir);
    let engine =
        EngineHandle::start(model.clone(), tok.clone(), small_config(&dir, 64)).expect("starts");
    let prompt = prompts(model.config().vocab_size, &[30]).remove(0);
    let mut req = EngineRequest::new(prompt.clone(), SamplingParams::greedy(), 400);
    req.ignore_eos = true;
    let mut stream = engine.submit(req.clone()).expect("submits");
    let first = stream
        .recv_timeout(Duration::from_secs(30))
        .expect("an event");
    assert!(matches!(first, Some(TokenEvent::Token { .. })), "{first:?}");
    engine.abort(stream.id);
    let mut reason = None;
    for ev in stream {
        if let TokenEvent::Finished { reason: r, .. } = ev {
            reason = Some(r);
        }
    }
    assert_eq!(reason, Some(FinishReason::Abort));

    let dropped = engine.submit(req).expect("submits");
    drop(dropped);
    // The engine notices at the next token it tries to send.
    wait_idle(&engine);
    engine.shutdown();
}

#[test]
fn bad_requests_fail_at_submit_with_clear_errors() {
    let dir = golden("tiny-llama");
    let (model, tok) = load(&dir);
    let mut config = small_config(&dir, 64);
    config.max_model_len = Some(48);
    let engine = EngineHandle::start(model.clone(), tok.clone(), config).expect("starts");
    let vocab = model.config().vocab_size as u32;
    let submit = |prompt: Vec<u32>, n: usize, max_tokens: usize| {
        let mut req = EngineRequest::new(prompt, SamplingParams::greedy(), max_tokens);
        req.n = n;
        engine.submit(req).map(|_| ())
    };
    assert!(matches!(
        submit(vec![], 1, 4),
        Err(EngineError::EmptyPrompt)
    ));
    let err = submit(vec![1; 48], 1, 4).expect_err("too long");
    assert!(
        matches!(
            err,
            EngineError::PromptTooLong {
                prompt_tokens: 48,
                context: 48
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("48 tokens"), "{err}");
    assert!(matches!(
        submit(vec![vocab], 1, 4),
        Err(EngineError::Model(_))
    ));
    assert!(matches!(
        submit(vec![1], 0, 4),
        Err(EngineError::InvalidRequest(_))
    ));
    assert!(matches!(
        submit(vec![1], 1, 0),
        Err(EngineError::InvalidRequest(_))
    ));
    let mut bad = EngineRequest::new(vec![1], SamplingParams::greedy(), 4);
    bad.sampling.temperature = -1.0;
    assert!(matches!(engine.submit(bad), Err(EngineError::Sampling(_))));
    // A KV pool smaller than the context: a prompt that fits the context but not the pool.
    let mut tiny = small_config(&dir, 2);
    tiny.max_model_len = Some(48);
    let small = EngineHandle::start(model.clone(), tok.clone(), tiny).expect("starts");
    let err = small
        .submit(EngineRequest::new(vec![1; 20], SamplingParams::greedy(), 4))
        .map(|_| ())
        .expect_err("beyond the KV pool");
    assert!(
        matches!(
            err,
            EngineError::PromptExceedsKvCache {
                prompt_tokens: 20,
                kv_tokens: 16
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--kv-cache-memory"), "{err}");
    small.shutdown();
    // A sequence stops at the context length rather than overrunning it.
    let mut req = EngineRequest::new(vec![1; 40], SamplingParams::greedy(), 100);
    req.ignore_eos = true;
    let (tokens, reason, _) = collect(engine.submit(req).expect("submits"));
    assert_eq!(reason, FinishReason::Length);
    assert_eq!(
        tokens.len(),
        8,
        "40 prompt + 8 generated = the 48-token limit"
    );
    engine.shutdown();
}

/// The same equivalence on a real model (SmolLM2, Q8/Q4 GGUF), with the CI model env var.
#[test]
fn smollm2_batch_equals_each_alone() {
    let Some(path) = std::env::var_os("PAGODA_TEST_SMOLLM2").map(PathBuf::from) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "PAGODA_TEST_SMOLLM2 must be set under CI"
        );
        eprintln!("skipping: set PAGODA_TEST_SMOLLM2");
        return;
    };
    let mut config = small_config(&path, 40);
    config.max_num_batched_tokens = 64;
    check_batch_equals_alone(&path, config, &[12, 150, 60, 33, 97, 7], 16);
}

#[test]
fn a_gpu_memory_share_outside_0_to_1_is_refused_at_start() {
    let dir = golden("tiny-llama");
    let (model, tok) = load(&dir);
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        let config = EngineConfig {
            gpu_memory_utilization: bad,
            ..small_config(&dir, 16)
        };
        let Err(e) = EngineHandle::start(model.clone(), tok.clone(), config) else {
            panic!("--gpu-memory-utilization {bad} accepted");
        };
        assert!(e.to_string().contains("--gpu-memory-utilization"), "{e}");
    }
}
