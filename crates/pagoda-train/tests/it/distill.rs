//! `pipeline::run` end to end on the tiny golden Llama as the teacher and a noisy copy of it
//! as the student (same tokenizer): the loss decreases, a seed fixes every loss bit for bit,
//! a stopped and resumed run ends where the straight one does, the label cache is reused,
//! the written model (GGUF with Llama Q/K rows permuted back, LoRA merged) loads in Pagoda
//! and computes the trained student's logits, and every bad input is refused with a clear
//! error and nothing written.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use pagoda_compress::merge::MergeDtype;
use pagoda_model::arch::{Logits, Model};
use pagoda_model::{open_model, KvDtype};
use pagoda_train::lora::LoraSpec;
use pagoda_train::loss::{Divergence, LossSpec};
use pagoda_train::optim::AdamWConfig;
use pagoda_train::pipeline::{run, DataSource, DistillConfig, DistillReport, Observer};
use pagoda_train::student::{Student, TrainMode};
use pagoda_train::train::{StepStats, TrainOptions};

use crate::common::{gguf_of_folder, golden, perturbed_copy, rel_diff};

const LINES: [&str; 12] = [
    "The quick brown fox jumps over the lazy dog.",
    "A stitch in time saves nine, and a penny saved is a penny earned.",
    "fn main() { println!(\"hello, world\"); }",
    "Rust is a language empowering everyone to build reliable software.",
    "To be, or not to be, that is the question.",
    "All that glitters is not gold; all who wander are not lost.",
    "Distillation trains a small student on a large teacher's soft labels.",
    "for i in range(10): print(i * i)",
    "The rain in Spain stays mainly in the plain.",
    "Pack my box with five dozen liquor jugs.",
    "She sells sea shells by the sea shore, and the shells she sells are sea shells.",
    "Two roads diverged in a wood, and I took the one less travelled by.",
];

/// Writes the training JSONL (texts and two conversations) into `dir`.
fn data_file(dir: &Path) -> PathBuf {
    let mut text = String::new();
    for (i, l) in LINES.iter().enumerate() {
        text.push_str(&serde_json::json!({ "text": l }).to_string());
        text.push('\n');
        if i % 5 == 0 {
            let chat = serde_json::json!({"messages": [
                {"role": "user", "content": l},
                {"role": "assistant", "content": LINES[(i + 3) % LINES.len()]}]});
            text.push_str(&chat.to_string());
            text.push('\n');
        }
    }
    let p = dir.join("data.jsonl");
    std::fs::write(&p, text).expect("data");
    p
}

fn options(steps: u64) -> TrainOptions {
    TrainOptions {
        loss: LossSpec::new(Divergence::Forward, 1.0, 0.1).expect("loss"),
        top_k: 16,
        seq_len: 48,
        batch_size: 4,
        grad_accum: 2,
        steps: Some(steps),
        epochs: 1,
        lr: 3e-3,
        min_lr: 3e-4,
        warmup: 2,
        adamw: AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        },
        clip: 1.0,
        seed: 11,
    }
}

struct Setup {
    dir: tempfile::TempDir,
    teacher: PathBuf,
    student: PathBuf,
    data: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tmp");
    let student = perturbed_copy("tiny-llama", dir.path(), 0.3, 5);
    let data = data_file(dir.path());
    Setup {
        teacher: golden("tiny-llama"),
        student,
        data,
        dir,
    }
}

fn config(s: &Setup, out: &str, steps: u64) -> DistillConfig {
    DistillConfig {
        teacher: s.teacher.clone(),
        student: s.student.clone(),
        output: s.dir.path().join(out),
        data: DataSource::Jsonl(s.data.clone()),
        held_out: None,
        held_out_fraction: 0.2,
        mode: TrainMode::Full,
        options: options(steps),
        labels: Some(s.dir.path().join("labels.bin")),
        checkpoint: None,
        resume: None,
        save_every: 0,
        eval_every: 0,
        stop_after: None,
        dtype: MergeDtype::F32,
        save_adapter: None,
        force: false,
    }
}

/// Records every step.
#[derive(Default)]
struct Record(Vec<StepStats>);

impl Observer for Record {
    fn step(&mut self, s: &StepStats) {
        self.0.push(s.clone());
    }
}

fn run_recorded(cfg: &DistillConfig) -> (DistillReport, Vec<f64>) {
    let mut rec = Record::default();
    let report = run(cfg, &mut rec).expect("distill");
    (report, rec.0.iter().map(|s| s.loss).collect())
}

/// Logits of `tokens` from Pagoda's forward pass on the model at `path`.
fn pagoda_logits(path: &Path, tokens: &[u32]) -> Vec<f32> {
    let src = open_model(path).expect("open output");
    let model = Model::from_source(&src).expect("model");
    let mut cache = model.new_cache_with(64, KvDtype::F32);
    model
        .forward(tokens, 0, &mut cache, Logits::All)
        .expect("forward")
}

const PROBE: [u32; 10] = [0, 40, 41, 60, 71, 80, 100, 150, 200, 31];

#[test]
fn loss_decreases_and_the_output_loads_with_the_students_logits() {
    let s = setup();
    // A GGUF student: its Q/K rows are permuted on load and permuted back on write.
    let student_gguf = gguf_of_folder(&s.student, "student", s.dir.path());
    let mut cfg = config(&s, "out.gguf", 20);
    cfg.student = student_gguf;
    cfg.eval_every = 10;
    let (report, losses) = run_recorded(&cfg);
    assert_eq!(losses.len(), 20);
    let first: f64 = losses[..3].iter().sum::<f64>() / 3.0;
    let last: f64 = losses[17..].iter().sum::<f64>() / 3.0;
    assert!(last < 0.7 * first, "loss {first} → {last}: {losses:?}");
    // Before the first step, at step 10 and at the end.
    assert_eq!(report.evals.len(), 3);
    assert_eq!(report.evals[0].step, 0);
    assert!(
        report.evals[2].kd < report.evals[0].kd,
        "{:?}",
        report.evals
    );
    let report_path = report.report.expect("report");
    let lines = std::fs::read_to_string(&report_path).expect("report");
    assert!(lines.lines().count() >= 23, "{lines}");
    assert!(lines.contains("eval_perplexity"));

    // The written GGUF computes what the trained student computes.
    let out = s.dir.path().join("out.gguf");
    let trained = open_model(&out).expect("output");
    let student = Student::load(&trained, &TrainMode::Full, 0).expect("student");
    let ids = Tensor::from_vec(PROBE.to_vec(), (1, PROBE.len()), &Device::Cpu).expect("ids");
    let got: Vec<f32> = student
        .forward(&ids)
        .and_then(|t| Ok(t.flatten_all()?.to_vec1()?))
        .expect("logits");
    let want = pagoda_logits(&out, &PROBE);
    assert!(rel_diff(&got, &want) < 1e-3);
    // And it is not the untrained student.
    let before = pagoda_logits(&cfg.student, &PROBE);
    assert!(rel_diff(&before, &want) > 1e-3);
}

#[test]
fn a_seed_fixes_every_loss_and_labels_are_reused() {
    let s = setup();
    let (first, a) = run_recorded(&config(&s, "a", 6));
    let (second, b) = run_recorded(&config(&s, "b", 6));
    assert_eq!(a, b, "same seed, same losses bit for bit");
    assert!(first.labelled > 0 && first.labels_reused == 0);
    assert_eq!(second.labelled, 0);
    assert_eq!(second.labels_reused, first.labelled);
    let mut other = config(&s, "c", 6);
    other.options.seed = 12;
    let (_, c) = run_recorded(&other);
    assert_ne!(a, c, "another seed, another data order");
}

#[test]
fn a_stopped_run_resumed_ends_where_the_straight_run_does() {
    let s = setup();
    let (_, straight) = run_recorded(&config(&s, "straight", 8));
    let mut half = config(&s, "resumed", 8);
    half.stop_after = Some(4);
    let (stopped, first) = run_recorded(&half);
    assert_eq!(stopped.output_bytes, None);
    assert!(!s.dir.path().join("resumed").exists());
    let mut rest = config(&s, "resumed", 8);
    rest.resume = Some(stopped.checkpoint.clone());
    let (done, second) = run_recorded(&rest);
    assert_eq!(done.resumed_from, 4);
    assert_eq!(first.len() + second.len(), 8);
    let last = *second.last().expect("steps");
    let want = *straight.last().expect("steps");
    assert!((last - want).abs() <= 1e-6 * want.abs(), "{last} vs {want}");
    assert_eq!(&straight[..4], &first[..]);
}

#[test]
fn lora_is_merged_into_the_output_and_the_adapter_saved() {
    let s = setup();
    let mut cfg = config(&s, "lora-out", 6);
    let spec = LoraSpec::new(4, 8.0, "q,v,down").expect("spec");
    cfg.mode = TrainMode::Lora(spec.clone());
    cfg.options.lr = 1e-2;
    cfg.save_adapter = Some(s.dir.path().join("adapter"));
    let (_, losses) = run_recorded(&cfg);
    assert!(losses.iter().all(|l| l.is_finite()));
    let adapter =
        pagoda_model::lora::LoraAdapter::open(s.dir.path().join("adapter")).expect("adapter");
    assert_eq!(adapter.modules().count(), 2 * 3);
    // The merged folder computes base + adapter.
    let out = s.dir.path().join("lora-out");
    let merged = pagoda_logits(&out, &PROBE);
    let base = pagoda_logits(&s.student, &PROBE);
    assert!(
        rel_diff(&base, &merged) > 1e-4,
        "the adapter changed nothing"
    );
}

fn assert_refused(cfg: &DistillConfig, needle: &str) {
    let e = run(cfg, &mut pagoda_train::pipeline::Quiet)
        .expect_err("refused")
        .to_string();
    assert!(e.contains(needle), "{e:?} should mention {needle:?}");
    assert!(!cfg.output.exists(), "{} left behind", cfg.output.display());
    let mut partial = cfg.output.as_os_str().to_owned();
    partial.push(".partial");
    assert!(!Path::new(&partial).exists());
}

#[test]
fn bad_input_is_refused_with_nothing_written() {
    let s = setup();
    let base = config(&s, "bad", 4);

    let mut c = base.clone();
    c.data = DataSource::Jsonl(s.dir.path().join("missing.jsonl"));
    assert_refused(&c, "does not exist");

    let bad = s.dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"fine\"}\n{\"text\": \"cut\n").expect("write");
    let mut c = base.clone();
    c.data = DataSource::Jsonl(bad);
    assert_refused(&c, "bad.jsonl:2:");

    let mut c = base.clone();
    c.teacher = golden("tiny-qwen2");
    assert_refused(&c, "do not share a tokenizer");

    let mut c = base.clone();
    c.student = golden("tiny-gemma3");
    c.teacher = golden("tiny-gemma3");
    assert_refused(&c, "gemma3");

    for (field, value, needle) in [
        ("lr", 0.0, "--lr"),
        ("lr", -1.0, "--lr"),
        ("seq_len", 0.0, "--seq-len"),
        ("top_k", 0.0, "--top-k"),
        ("top_k", 10_000.0, "--top-k"),
        ("batch_size", 0.0, "--batch-size"),
        ("min_lr", 1.0, "--min-lr"),
    ] {
        let mut c = base.clone();
        match field {
            "lr" => c.options.lr = value,
            "seq_len" => c.options.seq_len = value as usize,
            "top_k" => c.options.top_k = value as usize,
            "batch_size" => c.options.batch_size = value as usize,
            _ => c.options.min_lr = value,
        }
        assert_refused(&c, needle);
    }
    for t in [0.0, -1.0, f64::NAN] {
        let e = LossSpec::new(Divergence::Forward, t, 0.1).expect_err("temperature");
        assert!(e.to_string().contains("--temperature"), "{e}");
    }
    for w in [-0.1, 1.5] {
        let e = LossSpec::new(Divergence::Forward, 1.0, w).expect_err("hard weight");
        assert!(e.to_string().contains("--hard-weight"), "{e}");
    }
    let e = Divergence::parse("js", 0.1).expect_err("loss");
    assert!(e.to_string().contains("forward, reverse or skew"), "{e}");
    let e = LoraSpec::new(4, 8.0, "q,attn").expect_err("targets");
    assert!(e.to_string().contains("--lora-targets"), "{e}");

    // An existing OUT without --force.
    let c = config(&s, "exists.gguf", 4);
    std::fs::write(&c.output, b"keep me").expect("write");
    let e = run(&c, &mut pagoda_train::pipeline::Quiet)
        .expect_err("exists")
        .to_string();
    assert!(e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(&c.output).expect("read"), b"keep me");

    // A label cache made with another top-k.
    let mut c = config(&s, "first", 1);
    run(&c, &mut pagoda_train::pipeline::Quiet).expect("first run");
    c.output = s.dir.path().join("second");
    c.options.top_k = 8;
    assert_refused(&c, "delete it");

    // A checkpoint of another model on resume.
    let other = tempfile::tempdir().expect("tmp");
    let mut q = config(&s, "q", 2);
    q.teacher = golden("tiny-qwen2");
    q.student = golden("tiny-qwen2");
    q.labels = Some(other.path().join("labels"));
    q.checkpoint = Some(other.path().join("ckpt"));
    q.stop_after = Some(1);
    run(&q, &mut pagoda_train::pipeline::Quiet).expect("qwen run");
    let mut c = config(&s, "wrong-resume", 4);
    c.resume = Some(other.path().join("ckpt"));
    assert_refused(&c, "another student model");

    // Options that differ on resume are named.
    let mut c = config(&s, "opts", 4);
    c.stop_after = Some(1);
    let stopped = run(&c, &mut pagoda_train::pipeline::Quiet).expect("stopped");
    let mut c = config(&s, "opts", 4);
    c.options.lr = 1e-3;
    c.resume = Some(stopped.checkpoint);
    assert_refused(&c, "--lr");
}

#[test]
fn prompts_are_continued_by_the_teacher_and_the_continuations_cached() {
    let s = setup();
    let prompts = s.dir.path().join("prompts.jsonl");
    let mut text = String::new();
    for l in &LINES[..6] {
        text.push_str(&serde_json::json!({ "text": l }).to_string());
        text.push('\n');
    }
    text.push_str(
        &serde_json::json!({"messages": [{"role": "user", "content": LINES[7]}]}).to_string(),
    );
    text.push('\n');
    std::fs::write(&prompts, text).expect("prompts");
    let mut cfg = config(&s, "seq", 3);
    cfg.data = DataSource::Prompts {
        path: prompts,
        max_tokens: 8,
        temperature: 0.7,
    };
    let (first, a) = run_recorded(&cfg);
    let cache = s.dir.path().join("labels.bin.gen.jsonl");
    let lines = std::fs::read_to_string(&cache).expect("generations");
    assert_eq!(lines.lines().count(), 1 + 7, "{lines}");
    assert_eq!(first.train_sequences + first.held_out_sequences, 7);
    cfg.output = s.dir.path().join("seq2");
    let (second, b) = run_recorded(&cfg);
    assert_eq!(a, b);
    assert_eq!(second.labelled, 0);
    assert_eq!(
        std::fs::read_to_string(&cache).expect("generations"),
        lines,
        "a rerun reuses the continuations"
    );
}

#[test]
fn batched_greedy_continuations_equal_one_prompt_at_a_time() {
    use pagoda_train::generate::{continuations, GenSpec, GEN_BATCH};
    let dir = tempfile::tempdir().expect("tmp");
    let src = open_model(&golden("tiny-llama")).expect("open teacher");
    let teacher = Model::from_source(&src).expect("teacher");
    // More prompts than one batch, of different lengths, one of them empty.
    let prompts: Vec<Vec<u32>> = (0..GEN_BATCH + 3)
        .map(|i| {
            (0..(i % 5))
                .map(|j| (40 + 7 * i + 3 * j) as u32 % 250)
                .collect()
        })
        .collect();
    let spec = GenSpec {
        teacher: "tiny".into(),
        prompts_digest: "d".into(),
        max_tokens: 12,
        temperature: 0.0,
        seed: 1,
    };
    let eos = [2u32];
    let cache = dir.path().join("gen.jsonl");
    let got = continuations(&teacher, &prompts, &eos, &spec, &cache, |_, _| {}).expect("gen");
    for (prompt, seq) in prompts.iter().zip(&got) {
        assert_eq!(&seq[..prompt.len()], &prompt[..]);
        // The same prompt alone, greedy, token by token through the single-sequence path.
        let mut want = prompt.clone();
        if !prompt.is_empty() {
            let mut kv = teacher.new_cache_with(64, KvDtype::F32);
            let mut logits = teacher
                .forward(prompt, 0, &mut kv, Logits::Last)
                .expect("prefill");
            while want.len() < prompt.len() + spec.max_tokens {
                let tok = argmax(&logits);
                want.push(tok);
                if eos.contains(&tok) {
                    break;
                }
                logits = teacher
                    .forward(&[tok], want.len() - 1, &mut kv, Logits::Last)
                    .expect("decode");
            }
        }
        assert_eq!(seq, &want, "prompt {prompt:?}");
    }
    // A cache cut inside the second batch is completed to the same continuations.
    let text = std::fs::read_to_string(&cache).expect("cache");
    let kept: Vec<&str> = text.lines().take(1 + GEN_BATCH + 1).collect();
    std::fs::write(&cache, kept.join("\n") + "\n").expect("cut");
    let again = continuations(&teacher, &prompts, &eos, &spec, &cache, |_, _| {}).expect("resume");
    assert_eq!(again, got);
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
        .0 as u32
}
