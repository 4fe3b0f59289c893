//! Numerical faults: models whose logits come out NaN or infinite fail the request with
//! `EngineError::NumericalFault` (never a `Finished` with empty text), free its blocks, leave
//! the other requests of the batch alone, log one line naming the first stage that went
//! non-finite.
//!
//! The models are tests/golden/tiny-llama with one tensor poisoned in memory: a whole down
//! projection of layer 1 set to NaN (every request faults at its first token), or the
//! embedding row of one token `T` set to NaN (only sequences that feed `T` fault, at the
//! first position holding it, so healthy and faulting requests share one engine and batch).

use pagoda_engine::{
    EngineConfig, EngineCore, EngineHandle, EngineRequest, ProposerConfig, RequestStream,
    SamplingParams, SpeculativeConfig, TokenEvent,
};
use pagoda_kernels::GgmlType;
use pagoda_model::arch::Model;
use pagoda_model::tokenizer::Tokenizer;
use pagoda_model::weights::{TensorView, Weights};
use pagoda_model::{open_model, ModelConfig};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Tiny {
    cfg: ModelConfig,
    weights: Weights,
    tokenizer: Arc<Tokenizer>,
}

fn tiny_llama() -> Tiny {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama");
    let source = open_model(&dir).expect("tiny-llama opens");
    // The output head must be its own tensor, so that poisoning an embedding row touches
    // only the positions that feed that token.
    assert!(source.weights.contains("output.weight") && !source.config.tie_word_embeddings);
    Tiny {
        cfg: source.config,
        weights: source.weights,
        tokenizer: Arc::new(source.tokenizer),
    }
}

impl Tiny {
    fn model(&self) -> Arc<Model> {
        Arc::new(Model::from_weights(&self.cfg, &self.weights).expect("builds"))
    }

    /// The model with tensor `name`'s values passed through `poison` (stored as f32).
    fn poisoned(&self, name: &str, poison: impl Fn(usize, f32) -> f32) -> Arc<Model> {
        let mut out = Weights::new();
        for t in self.weights.iter() {
            let view = if t.name == name {
                let values = t.to_f32().expect("dequantizes");
                let bytes = values
                    .iter()
                    .enumerate()
                    .flat_map(|(i, &v)| poison(i, v).to_le_bytes())
                    .collect();
                TensorView::owned(t.name.clone(), GgmlType::F32, t.shape.clone(), bytes)
                    .expect("same shape")
            } else {
                t.clone()
            };
            out.insert(view).expect("distinct names");
        }
        assert!(out.contains(name), "no tensor {name}");
        Arc::new(Model::from_weights(&self.cfg, &out).expect("builds"))
    }

    /// Every value of layer 1's down projection NaN: every sequence faults.
    fn broken(&self) -> Arc<Model> {
        self.poisoned("blk.1.ffn_down.weight", |_, _| f32::NAN)
    }

    /// The embedding row of `token` NaN: only sequences that feed `token` fault.
    fn poisoned_token(&self, token: u32) -> Arc<Model> {
        let d = self.cfg.hidden_size;
        self.poisoned("token_embd.weight", move |i, v| {
            if i / d == token as usize {
                f32::NAN
            } else {
                v
            }
        })
    }
}

fn greedy(prompt: &[u32], max_tokens: usize) -> EngineRequest {
    let mut req = EngineRequest::new(prompt.to_vec(), SamplingParams::greedy(), max_tokens);
    req.ignore_eos = true;
    req
}

/// Greedy tokens of `prompt` on `model` alone, with `sampling`.
fn alone(model: &Model, prompt: &[u32], sampling: SamplingParams, max_tokens: usize) -> Vec<u32> {
    crate::reference::decode(model, prompt, sampling, max_tokens, None)
}

/// What one stream yielded: its tokens, then `Ok(finished count)` or `Err(error message)`.
/// Fails the test if the stream stalls.
fn drain(mut stream: RequestStream) -> (Vec<u32>, Result<usize, String>) {
    let mut tokens = Vec::new();
    let mut finished = 0;
    let mut error = None;
    while let Some(ev) = stream
        .recv_timeout(Duration::from_secs(60))
        .expect("the engine answers")
    {
        match ev {
            TokenEvent::Token { token, .. } => tokens.push(token),
            TokenEvent::Finished { .. } => finished += 1,
            TokenEvent::Error { message } => error = Some(message),
        }
    }
    match error {
        Some(message) => {
            assert_eq!(finished, 0, "an Error and Finished events: {message}");
            (tokens, Err(message))
        }
        None => (tokens, Ok(finished)),
    }
}

/// The message `EngineError::NumericalFault` gives for these fields' text.
fn assert_fault(message: &str, step: usize, position: usize) {
    assert!(message.starts_with("numerical fault"), "{message}");
    assert!(message.contains("NaN"), "{message}");
    assert!(
        message.contains(&format!("at step {step} (position {position})")),
        "want step {step}, position {position}: {message}"
    );
    assert!(
        !message.contains("tiny-llama") && !message.contains("safetensors"),
        "no path in the message: {message}"
    );
}

fn wait_idle(engine: &EngineHandle) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = engine.stats();
        if s.running + s.waiting == 0 && s.kv_blocks_used == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "engine not idle: {s:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn config(speculative: Option<SpeculativeConfig>) -> EngineConfig {
    EngineConfig {
        kv_cache_memory: Some(4 << 20),
        block_size: 4,
        speculative,
        ..EngineConfig::default()
    }
}

/// A prompt `q` whose clean greedy continuation `t0 t1 T ...` brings in a token `T` that is
/// neither in `q` nor among `t0 t1`: poisoning `T` makes `q` fault at step 3 (the row whose
/// input is `T`, at position `q.len() + 2`), after three good tokens.
fn late_token(tiny: &Tiny, clean: &Arc<Model>) -> (Vec<u32>, Vec<u32>) {
    let vocab = tiny.cfg.vocab_size as u64;
    for seed in 1..200u64 {
        let mut state = seed;
        let q: Vec<u32> = (0..10)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % vocab) as u32
            })
            .collect();
        let t = alone(clean, &q, SamplingParams::greedy(), 3);
        if !q.contains(&t[2]) && !t[..2].contains(&t[2]) {
            return (q, t);
        }
    }
    panic!("no prompt brings in a new token at step 2");
}

#[test]
fn a_fault_fails_only_its_request_and_frees_its_blocks() {
    capture();
    let tiny = tiny_llama();
    let clean = tiny.model();
    let (q, t) = late_token(&tiny, &clean);
    let bad = t[2];
    let model = tiny.poisoned_token(bad);

    // A healthy request that never feeds `bad` (banned), in the same batch as faulting ones:
    // it must give what it gives on the clean model.
    let healthy_prompt: Vec<u32> = q.iter().map(|&x| (x + 1) % 300).collect();
    assert!(!healthy_prompt.contains(&bad));
    let banned = SamplingParams {
        logit_bias: vec![(bad, f32::NEG_INFINITY)],
        ..SamplingParams::greedy()
    };
    let want_healthy = alone(&clean, &healthy_prompt, banned.clone(), 12);
    let healthy = || {
        let mut req = greedy(&healthy_prompt, 12);
        req.sampling = banned.clone();
        req
    };
    // `bad` in the prompt: the fault is at the last prompt position, before any token.
    let mut in_prompt = healthy_prompt.clone();
    in_prompt.insert(4, bad);

    for speculative in [
        None,
        // The clean model as its own draft always proposes `t1 T ...` after `t0`: the row of
        // the proposal `T` is the one that faults, inside one verification chunk.
        Some(SpeculativeConfig {
            proposer: ProposerConfig::Draft {
                model: clean.clone(),
                tokenizer: tiny.tokenizer.clone(),
            },
            num_tokens: 3,
            adaptive: false,
        }),
    ] {
        let what = if speculative.is_some() {
            "speculative"
        } else {
            "plain"
        };
        let engine =
            EngineHandle::start(model.clone(), tiny.tokenizer.clone(), config(speculative))
                .expect("engine starts");
        let streams = [
            engine.submit(healthy()).expect("submits"),
            engine.submit(greedy(&in_prompt, 12)).expect("submits"),
            engine.submit(greedy(&q, 12)).expect("submits"),
            engine
                .submit(EngineRequest {
                    n: 3,
                    sampling: SamplingParams {
                        seed: Some(5),
                        ..SamplingParams::default()
                    },
                    ..greedy(&in_prompt, 12)
                })
                .expect("submits"),
        ];
        let [healthy_out, prompt_fault, late_fault, forked_fault] = streams.map(drain);

        assert_eq!(healthy_out, (want_healthy.clone(), Ok(1)), "{what}");

        let (tokens, result) = prompt_fault;
        assert!(tokens.is_empty(), "{what}: {tokens:?}");
        assert_fault(&result.expect_err(what), 0, in_prompt.len() - 1);

        let (tokens, result) = forked_fault;
        assert!(tokens.is_empty(), "{what}: {tokens:?}");
        assert_fault(&result.expect_err(what), 0, in_prompt.len() - 1);

        // Tokens before the fault were streamed; the stream then ends with the error, not a
        // finish. Without speculation `T` itself was sampled (from a finite row) and sent;
        // with it, `t1 T` were accepted in the chunk whose next row faults, and a faulting
        // chunk keeps nothing.
        let (tokens, result) = late_fault;
        let streamed = if what == "plain" { &t[..3] } else { &t[..1] };
        assert_eq!(tokens, streamed, "{what}");
        assert_fault(&result.expect_err(what), 3, q.len() + 2);

        wait_idle(&engine);
        // The engine goes on serving: the same fault again, and healthy work.
        let again = engine.submit(greedy(&in_prompt, 4)).expect("submits");
        let (_, result) = drain(again);
        assert_fault(&result.expect_err(what), 0, in_prompt.len() - 1);
        assert_eq!(
            drain(engine.submit(healthy()).expect("submits")),
            (want_healthy.clone(), Ok(1)),
            "{what}"
        );
        wait_idle(&engine);
        engine.shutdown();
    }
}

/// Warnings and errors logged anywhere in this test binary, with the thread that logged them.
/// One global subscriber, installed by every test here before its first engine runs: a
/// scoped one (`with_default`) can miss events, since tracing caches a callsite's interest
/// process-wide and another test's thread may register the same callsite at the same moment.
struct Capture(Mutex<Vec<(std::thread::ThreadId, String)>>);

static CAPTURE: std::sync::OnceLock<&'static Capture> = std::sync::OnceLock::new();

fn capture() -> &'static Capture {
    CAPTURE.get_or_init(|| {
        let capture: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        tracing::subscriber::set_global_default(capture)
            .expect("no other test in this binary sets a global subscriber");
        capture
    })
}

impl Capture {
    /// The lines this thread logged so far: level, then ` field=value` pairs.
    fn lines(&self) -> Vec<String> {
        let me = std::thread::current().id();
        self.0
            .lock()
            .map(|l| {
                l.iter()
                    .filter(|(t, _)| *t == me)
                    .map(|(_, s)| s.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl tracing::Subscriber for &'static Capture {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        // Only what the tests read: the other tests' trace lines would only cost time.
        *metadata.level() <= tracing::Level::WARN
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::WARN)
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={:?}", field.name(), value));
            }
        }
        let mut fields = Fields(event.metadata().level().to_string());
        event.record(&mut fields);
        if let Ok(mut lines) = self.0.lock() {
            lines.push((std::thread::current().id(), fields.0));
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn the_log_line_names_the_request_and_the_first_faulting_layer() {
    let tiny = tiny_llama();
    let model = tiny.broken();
    let capture = capture();
    let prompt = [0u32, 17, 42, 5, 99, 3];
    // The core driven on this thread, so its log lines are this thread's.
    let mut core =
        EngineCore::new(model.clone(), tiny.tokenizer.clone(), &config(None)).expect("core");
    let (tx, rx) = flume::unbounded();
    core.add_request(7, greedy(&prompt, 8), tx.clone(), Instant::now());
    core.add_request(8, greedy(&prompt[..4], 8), tx, Instant::now());
    for _ in 0..100 {
        if !core.has_work() {
            break;
        }
        core.step();
    }
    assert!(!core.has_work(), "the faulting requests are gone");
    let (events, stats) = (rx.drain().collect::<Vec<_>>(), core.stats());
    assert_eq!(stats.kv_blocks_used, 0, "{stats:?}");
    assert_eq!(
        events.len(),
        2,
        "one Error per request and nothing else: {events:?}"
    );
    for ev in &events {
        let TokenEvent::Error { message } = ev else {
            panic!("not an error: {ev:?}");
        };
        assert!(message.contains("NaN in 320 of 320 logits"), "{message}");
    }
    let lines = capture.lines();
    let faults: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("numerical fault"))
        .collect();
    assert_eq!(faults.len(), 2, "{lines:#?}");
    // Both requests faulted in one step; the first is located by a re-run, the second only
    // logged.
    let first = faults
        .iter()
        .find(|l| l.contains("request_id=7"))
        .expect("a line for request 7");
    assert!(first.starts_with("ERROR"), "{first}");
    assert!(first.contains("first_non_finite=layer 1"), "{first}");
    assert!(
        first.contains("position=5") && first.contains("step=0"),
        "{first}"
    );
    let second = faults
        .iter()
        .find(|l| l.contains("request_id=8"))
        .expect("a line for request 8");
    assert!(second.contains("first_non_finite=not searched"), "{second}");
}
