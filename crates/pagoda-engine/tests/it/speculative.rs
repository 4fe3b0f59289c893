//! Speculative decoding in the batching engine: greedy output with n-gram or draft-model
//! proposals equals greedy output without them (alone and in a batch with requests that do
//! not speculate), sampled output follows the target's distribution (chi-square), proposals
//! really are made and both accepted and rejected, and a draft with another vocabulary is
//! refused.

use pagoda_engine::speculative::ngram::NgramProposer;
use pagoda_engine::{
    EngineConfig, EngineError, EngineHandle, EngineRequest, ProposerConfig, SamplingParams,
    SpeculativeConfig, TokenEvent,
};
use pagoda_model::arch::{Logits, Model};
use pagoda_model::tokenizer::Tokenizer;
use pagoda_model::{open_model, KvCache};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(name)
}

fn load(name: &str) -> (Arc<Model>, Arc<Tokenizer>) {
    let source = open_model(&golden(name)).expect("model opens");
    let model = Arc::new(Model::from_source(&source).expect("model builds"));
    (model, Arc::new(source.tokenizer))
}

fn ngram(k: usize, adaptive: bool) -> SpeculativeConfig {
    SpeculativeConfig {
        proposer: ProposerConfig::Ngram(NgramProposer { min_n: 1, max_n: 3 }),
        num_tokens: k,
        adaptive,
    }
}

fn config(spec: Option<SpeculativeConfig>) -> EngineConfig {
    EngineConfig {
        max_num_seqs: 64,
        kv_cache_memory: Some(8 << 20),
        speculative: spec,
        ..EngineConfig::default()
    }
}

/// Prompts that repeat themselves, so prompt lookup finds continuations.
fn repetitive_prompts(vocab: u32) -> Vec<Vec<u32>> {
    (0..6u32)
        .map(|i| {
            let motif: Vec<u32> = (0..5 + i).map(|t| (t * 37 + i * 11 + 3) % vocab).collect();
            motif
                .iter()
                .cycle()
                .take(3 * motif.len() + i as usize)
                .copied()
                .collect()
        })
        .collect()
}

fn tokens_of(stream: pagoda_engine::RequestStream) -> Vec<u32> {
    let mut out = Vec::new();
    for ev in stream {
        match ev {
            TokenEvent::Token { token, .. } => out.push(token),
            TokenEvent::Finished { .. } => {}
            TokenEvent::Error { message } => panic!("request failed: {message}"),
        }
    }
    out
}

fn greedy_request(prompt: &[u32], max_tokens: usize, speculative: bool) -> EngineRequest {
    let mut req = EngineRequest::new(prompt.to_vec(), SamplingParams::greedy(), max_tokens);
    req.ignore_eos = true;
    req.speculative = speculative;
    req
}

/// Greedy tokens of every prompt, all submitted at once to an engine with `spec`.
fn run_all(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    spec: Option<SpeculativeConfig>,
    prompts: &[Vec<u32>],
    speculative: impl Fn(usize) -> bool,
) -> (Vec<Vec<u32>>, pagoda_engine::EngineStats) {
    let engine =
        EngineHandle::start(model.clone(), tok.clone(), config(spec)).expect("engine starts");
    let streams: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            engine
                .submit(greedy_request(p, 24, speculative(i)))
                .expect("submits")
        })
        .collect();
    let out = streams.into_iter().map(tokens_of).collect();
    // Stats are published after each step; the last step is done once every stream ended.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let stats = engine.stats();
    engine.shutdown();
    (out, stats)
}

#[test]
fn greedy_with_ngram_proposals_equals_plain_greedy() {
    let (model, tok) = load("tiny-llama");
    let prompts = repetitive_prompts(model.config().vocab_size as u32);
    let (plain, _) = run_all(&model, &tok, None, &prompts, |_| true);
    let (spec, stats) = run_all(&model, &tok, Some(ngram(4, false)), &prompts, |_| true);
    assert_eq!(spec, plain);
    let s = stats.spec;
    assert!(s.proposed_tokens > 0, "no proposals were made: {s:?}");
    assert!(s.accepted_tokens > 0, "no proposal was accepted: {s:?}");
    assert!(
        s.accepted_tokens < s.proposed_tokens,
        "every proposal accepted: the rejection path was not exercised: {s:?}"
    );
}

#[test]
fn speculating_and_plain_requests_batch_together() {
    let (model, tok) = load("tiny-llama");
    let prompts = repetitive_prompts(model.config().vocab_size as u32);
    let (plain, _) = run_all(&model, &tok, None, &prompts, |_| true);
    // Every other request turns speculation off; adaptive k on.
    let (mixed, stats) = run_all(&model, &tok, Some(ngram(6, true)), &prompts, |i| i % 2 == 0);
    assert_eq!(mixed, plain);
    assert!(stats.spec.proposed_tokens > 0);
}

#[test]
fn greedy_with_a_draft_model_equals_plain_greedy() {
    let (model, tok) = load("tiny-llama");
    let prompts = repetitive_prompts(model.config().vocab_size as u32);
    let (plain, _) = run_all(&model, &tok, None, &prompts, |_| true);
    // The target as its own draft: every greedy proposal is the target's argmax.
    let spec = SpeculativeConfig {
        proposer: ProposerConfig::Draft {
            model: model.clone(),
            tokenizer: tok.clone(),
        },
        num_tokens: 3,
        adaptive: false,
    };
    let (got, stats) = run_all(&model, &tok, Some(spec), &prompts, |_| true);
    assert_eq!(got, plain);
    let s = stats.spec;
    assert!(s.proposed_tokens > 0, "{s:?}");
    // Same model, same argmax: (nearly) everything is accepted (rows of a many-row pass may
    // differ from a one-row pass in the last bits).
    assert!(s.acceptance_rate() > 0.9, "{s:?}");
    assert!(s.mean_acceptance_length() > 3.0, "{s:?}");
}

/// What a draft must feed before proposing: the whole prompt for a new sequence (its
/// catch-up prefill, which the speculator does not time as draft passes), then only the
/// tokens the target accepted or sampled since, and again everything after a release.
#[test]
fn a_draft_feeds_the_prompt_once_then_only_new_tokens() {
    use pagoda_engine::speculative::draft::{DraftProposer, DraftQuery};
    let (model, tok) = load("tiny-llama");
    let mut draft = DraftProposer::new(model, &tok, &tok, 256).expect("same vocabulary");
    let seq = 7;
    let mut tokens: Vec<u32> = (1..40).collect();
    assert_eq!(draft.uncached(seq, &tokens), tokens.len());
    let proposals = draft
        .propose(&[DraftQuery {
            seq,
            tokens: &tokens,
            k: 3,
        }])
        .expect("draft runs");
    let proposed = &proposals[&seq];
    assert_eq!(proposed.len(), 3);
    // The target accepted the first proposal and sampled another token after it.
    tokens.push(proposed[0]);
    tokens.push(proposed[0].wrapping_add(1) % 64);
    assert!(
        draft.uncached(seq, &tokens) <= 2,
        "{}",
        draft.uncached(seq, &tokens)
    );
    draft.release(seq);
    assert_eq!(draft.uncached(seq, &tokens), tokens.len());
}

/// The draft's KV blocks come from a block pool (the target's allocator type): every block a
/// sequence holds is its alone, a full cache means no proposal rather than an error, and a
/// release gives every block back.
#[test]
fn a_draft_takes_its_blocks_from_a_pool_and_gives_them_all_back() {
    use pagoda_engine::speculative::draft::{DraftProposer, DraftQuery};
    let (model, tok) = load("tiny-llama");
    // 64 positions: four blocks of 16.
    let mut draft = DraftProposer::new(model, &tok, &tok, 64).expect("same vocabulary");
    let total = draft.free_blocks();
    let a: Vec<u32> = (1..30).collect();
    let b: Vec<u32> = (2..20).collect();
    let query = |seq, tokens| DraftQuery { seq, tokens, k: 2 };
    let got = draft
        .propose(&[query(1, &a[..]), query(2, &b[..])])
        .expect("draft runs");
    assert_eq!(got[&1].len(), 2);
    assert_eq!(got[&2].len(), 2);
    draft.check().expect("draft books");
    // 30 + 1 positions: two blocks; 19 + 1: two blocks. The pool is empty now.
    assert_eq!(draft.free_blocks(), total - 4);
    let c: Vec<u32> = (3..10).collect();
    let none = draft.propose(&[query(3, &c[..])]).expect("draft runs");
    assert!(!none.contains_key(&3), "{none:?}");
    draft.check().expect("draft books");
    for seq in [1, 2, 3] {
        draft.release(seq);
    }
    draft.check().expect("draft books");
    assert_eq!(draft.free_blocks(), total);
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let (model, tok) = load("tiny-llama");
    let (draft, draft_tok) = load("tiny-qwen2");
    let spec = SpeculativeConfig {
        proposer: ProposerConfig::Draft {
            model: draft,
            tokenizer: draft_tok,
        },
        num_tokens: 3,
        adaptive: true,
    };
    match EngineHandle::start(model, tok, config(Some(spec))) {
        Err(EngineError::InvalidConfig(m)) => assert!(m.contains("tokenizer"), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a draft with another vocabulary was accepted"),
    }
}

#[test]
fn bad_speculative_settings_are_refused() {
    let (model, tok) = load("tiny-llama");
    for bad in [ngram(0, true), ngram(17, true)] {
        assert!(matches!(
            EngineHandle::start(model.clone(), tok.clone(), config(Some(bad))),
            Err(EngineError::InvalidConfig(_))
        ));
    }
}

/// Tokens the distribution test allows (the rest are banned with `logit_bias`): a small
/// vocabulary, so that proposals are often right and often wrong.
const ALLOWED: [u32; 8] = [3, 17, 40, 77, 101, 150, 222, 301];

/// The target's law after `context` at temperature `t` over [`ALLOWED`] (vocabulary-sized).
fn target_probs(model: &Model, context: &[u32], t: f64) -> Vec<f64> {
    let mut cache = KvCache::new(model.config(), 128);
    let logits = model
        .forward(context, 0, &mut cache, Logits::Last)
        .expect("forward");
    let mut p = vec![0.0f64; logits.len()];
    let max = ALLOWED
        .iter()
        .map(|&i| f64::from(logits[i as usize]))
        .fold(f64::NEG_INFINITY, f64::max);
    for &i in &ALLOWED {
        p[i as usize] = ((f64::from(logits[i as usize]) - max) / t).exp();
    }
    let z: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= z);
    p
}

/// Law of the second generated token at temperature `t`:
/// P(t2 = y) = sum over t1 of p(t1 | prompt) p(y | prompt, t1).
fn second_token_law(model: &Model, prompt: &[u32], t: f64) -> Vec<f64> {
    let p1 = target_probs(model, prompt, t);
    let mut p2 = vec![0.0f64; p1.len()];
    for &t1 in &ALLOWED {
        let mut ctx = prompt.to_vec();
        ctx.push(t1);
        for (y, &r) in target_probs(model, &ctx, t).iter().enumerate() {
            p2[y] += p1[t1 as usize] * r;
        }
    }
    p2
}

/// Upper 0.1 % point of chi-square with `df` degrees of freedom (Wilson-Hilferty).
fn chi2_critical_001(df: f64) -> f64 {
    let z = 3.090;
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Pearson's statistic of `counts` against probabilities `p` over the bins with p > 0.
fn chi2(counts: &[u64], p: &[f64]) -> (f64, f64) {
    let n: u64 = counts.iter().sum();
    let (mut stat, mut df) = (0.0, -1.0);
    for (&o, &q) in counts.iter().zip(p) {
        if q > 0.0 {
            let e = q * n as f64;
            stat += (o as f64 - e).powi(2) / e;
            df += 1.0;
        } else {
            assert_eq!(o, 0, "a banned token was sampled");
        }
    }
    (stat, df)
}

/// The second generated token is the first one verified against proposals (the first comes
/// from the prompt's prefill); its law must be the target's.
#[test]
fn sampled_tokens_follow_the_target_distribution() {
    let (model, tok) = load("tiny-llama");
    let vocab = model.config().vocab_size;
    // Every allowed id appears in the prompt, so prompt lookup always proposes after t1.
    let prompt: Vec<u32> = (0..40).map(|i| ALLOWED[(i * 5 + i / 8) % 8]).collect();
    let law = second_token_law(&model, &prompt, 1.0);

    let engine = EngineHandle::start(model.clone(), tok.clone(), config(Some(ngram(3, false))))
        .expect("engine starts");
    let mut logit_bias: Vec<(u32, f32)> = (0..vocab as u32)
        .filter(|t| !ALLOWED.contains(t))
        .map(|t| (t, f32::NEG_INFINITY))
        .collect();
    logit_bias.sort_unstable_by_key(|&(t, _)| t);
    let params = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        logit_bias,
        ..SamplingParams::default()
    };
    const SAMPLES: u64 = 4000;
    let mut counts = vec![0u64; vocab];
    for batch in 0..SAMPLES / 100 {
        let streams: Vec<_> = (0..100)
            .map(|i| {
                let mut p = params.clone();
                p.seed = Some(batch * 100 + i);
                let mut req = EngineRequest::new(prompt.clone(), p, 3);
                req.ignore_eos = true;
                engine.submit(req).expect("submits")
            })
            .collect();
        for s in streams {
            let t = tokens_of(s);
            counts[t[1] as usize] += 1;
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    let stats = engine.stats().spec;
    engine.shutdown();
    assert!(stats.proposed_tokens >= SAMPLES, "{stats:?}");
    assert!(
        stats.accepted_tokens > SAMPLES / 20 && stats.accepted_tokens < stats.proposed_tokens,
        "{stats:?}"
    );

    let (stat, df) = chi2(&counts, &law);
    let crit = chi2_critical_001(df);
    assert!(
        stat < crit,
        "chi2 = {stat:.1} over {df} df, critical {crit:.1}: {counts:?}"
    );
    // The test has power: the same counts reject a nearby law (temperature 0.7).
    let near = second_token_law(&model, &prompt, 0.7);
    let (wrong, wdf) = chi2(&counts, &near);
    assert!(
        wrong > chi2_critical_001(wdf),
        "chi2 against a wrong law only {wrong:.1} over {wdf} df"
    );
}

/// Speculative decoding with the target on the GPU (in the CUDA interpreter under CI): n-gram
/// proposals, a draft on the GPU and a draft on the CPU all give plain greedy's tokens.
#[test]
fn speculative_decoding_on_cuda_equals_plain_greedy() {
    let gpu = match pagoda_model::DeviceChoice::Cuda(None).resolve() {
        Ok(r) => r.device,
        Err(e) => return pagoda_model::device::no_gpu_for_test(e),
    };
    let source = open_model(&golden("tiny-llama")).expect("model opens");
    let model = Arc::new(Model::from_source_on(&source, gpu).expect("model builds on the GPU"));
    let cpu_draft = Arc::new(Model::from_source(&source).expect("model builds"));
    let tok = Arc::new(source.tokenizer);
    let prompts = repetitive_prompts(model.config().vocab_size as u32);
    let (plain, _) = run_all(&model, &tok, None, &prompts, |_| true);
    let (ngrams, stats) = run_all(&model, &tok, Some(ngram(4, false)), &prompts, |_| true);
    assert_eq!(ngrams, plain);
    assert!(stats.spec.accepted_tokens > 0, "{:?}", stats.spec);
    for draft in [model.clone(), cpu_draft] {
        let spec = SpeculativeConfig {
            proposer: ProposerConfig::Draft {
                model: draft,
                tokenizer: tok.clone(),
            },
            num_tokens: 3,
            adaptive: false,
        };
        let (got, stats) = run_all(&model, &tok, Some(spec), &prompts, |_| true);
        assert_eq!(got, plain);
        assert!(stats.spec.acceptance_rate() > 0.5, "{:?}", stats.spec);
    }
}

/// A mixture-of-experts target (tiny Qwen3-MoE): n-gram proposals, a dense draft of the same
/// vocabulary (tiny Qwen3) and the MoE model as its own draft all give plain greedy's tokens.
#[test]
fn speculative_decoding_with_a_mixture_of_experts_equals_plain_greedy() {
    let (model, tok) = load("tiny-qwen3moe");
    let prompts = repetitive_prompts(model.config().vocab_size as u32);
    let (plain, _) = run_all(&model, &tok, None, &prompts, |_| true);
    let (spec, stats) = run_all(&model, &tok, Some(ngram(4, false)), &prompts, |_| true);
    assert_eq!(spec, plain, "n-gram proposals");
    assert!(stats.spec.proposed_tokens > 0, "{:?}", stats.spec);
    let (dense, dense_tok) = load("tiny-qwen3");
    for (what, draft, draft_tok) in [
        ("a dense draft", dense, dense_tok),
        ("the MoE model as its own draft", model.clone(), tok.clone()),
    ] {
        let spec = SpeculativeConfig {
            proposer: ProposerConfig::Draft {
                model: draft,
                tokenizer: draft_tok,
            },
            num_tokens: 3,
            adaptive: false,
        };
        let (got, stats) = run_all(&model, &tok, Some(spec), &prompts, |_| true);
        assert_eq!(got, plain, "{what}");
        assert!(stats.spec.proposed_tokens > 0, "{what}: {:?}", stats.spec);
    }
}
