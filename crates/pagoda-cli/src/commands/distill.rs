//! `pagoda distill --teacher T --student S -o OUT --data FILE`: knowledge distillation on the
//! CPU. The work is pagoda-train's (`pipeline::run`); this module parses and checks the
//! options, resolves the two models as the other model commands do (a store name, a GGUF
//! file or a Hugging Face folder), and shows progress: a bar while the teacher labels (or
//! generates), then one with the loss, tokens/s and ETA while the student trains.
//!
//! Invariant: every nonsense option is refused here or by pagoda-train before any work;
//! a failed run leaves neither OUT nor `OUT.partial` (the label cache and the checkpoint
//! stay, on purpose: a rerun reuses them).

use std::path::PathBuf;
use std::time::Instant;

use super::progress::Progress;
use anyhow::Context;
use clap::Args;
use pagoda_compress::merge::MergeDtype;
use pagoda_runtime::loader::{self, Pull};
use pagoda_train::lora::LoraSpec;
use pagoda_train::loss::{Divergence, LossSpec};
use pagoda_train::optim::AdamWConfig;
use pagoda_train::pipeline::{self, DataSource, DistillConfig, Observer};
use pagoda_train::student::TrainMode;
use pagoda_train::train::{EvalStats, StepStats, TrainOptions};

/// Arguments of `pagoda distill`.
#[derive(Debug, Args)]
pub struct DistillArgs {
    /// The teacher: a store name, a GGUF file or a Hugging Face folder. It runs on Pagoda's
    /// own engine (any architecture Pagoda serves) and must share the student's tokenizer.
    #[arg(long)]
    pub teacher: String,
    /// The student to train: a store name, a GGUF file or a Hugging Face folder of a Llama
    /// (SmolLM2) or Qwen2 (Qwen2.5) model; any stored type is dequantized to f32.
    #[arg(long)]
    pub student: String,
    /// Output: the trained student in the student's format (a GGUF for a GGUF student, a
    /// Hugging Face folder for a folder student), written only when complete. A report of
    /// the run (JSON lines: options, every step's loss, every evaluation) goes to
    /// OUT.report.jsonl.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Training data: JSONL, one {"text": "..."} or {"messages": [{"role": ..., "content":
    /// ...}, ...]} per line (conversations rendered with the student's chat template). Each
    /// line is one sequence, truncated to --seq-len tokens (not packed).
    #[arg(long, required_unless_present = "prompts", conflicts_with = "prompts")]
    pub data: Option<PathBuf>,
    /// Sequence-level distillation: JSONL of prompts (same format; conversations get the
    /// generation prompt) that the teacher continues for --gen-tokens tokens; prompt and
    /// continuation become the training data (cached in LABELS.gen.jsonl).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Tokens the teacher generates per prompt (with --prompts).
    #[arg(long, default_value_t = 256)]
    pub gen_tokens: usize,
    /// Sampling temperature of the teacher's continuations; 0 is greedy (with --prompts).
    #[arg(long, default_value_t = 0.0)]
    pub gen_temperature: f64,
    /// Held-out data for evaluation (same format). Without it, --held-out-fraction of the
    /// data is held out.
    #[arg(long)]
    pub held_out: Option<PathBuf>,
    /// Fraction of the data held out for evaluation when --held-out is not given, in [0, 1)
    /// (at least one sequence; 0: no evaluation).
    #[arg(long, default_value_t = 0.05)]
    pub held_out_fraction: f64,
    /// Divergence between teacher and student on the teacher's top-k: forward (KL(p‖q),
    /// Hinton), reverse (KL(q‖p), mode seeking, MiniLLM) or skew (KL(p ‖ αp + (1−α)q),
    /// DistiLLM). See docs/compression.md for the exact definitions.
    #[arg(long, default_value = "forward")]
    pub loss: String,
    /// α of the skew KL, in [0, 1).
    #[arg(long, default_value_t = 0.1)]
    pub skew_alpha: f64,
    /// Softmax temperature T of teacher and student in the KD term (the term is scaled by
    /// T², as Hinton et al.); > 0.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Weight λ of the hard-label next-token cross-entropy: loss = λ·CE + (1−λ)·KD, in
    /// [0, 1]. 1 trains on the data alone (no teacher signal).
    #[arg(long, default_value_t = 0.1)]
    pub hard_weight: f64,
    /// Teacher log-probabilities kept per position (the KD support); 32 holds nearly all of
    /// an instruct model's mass at T = 1 and costs 256 bytes per position in the cache.
    #[arg(long, default_value_t = 32)]
    pub top_k: usize,
    /// Tokens per training sequence (longer examples are truncated).
    #[arg(long, default_value_t = 256)]
    pub seq_len: usize,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 4)]
    pub batch_size: usize,
    /// Micro-batches per optimiser step (gradient accumulation): the step's batch is
    /// --batch-size × --grad-accum sequences.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Optimiser steps; without it, --epochs passes over the training sequences.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Passes over the training sequences (when --steps is not given).
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Peak learning rate (after warm-up); > 0. LoRA usually wants ~10x more than full
    /// fine-tuning.
    #[arg(long, default_value_t = 5e-5, allow_negative_numbers = true)]
    pub lr: f64,
    /// Learning rate at the end of the cosine decay.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_lr: f64,
    /// Linear warm-up steps from 0 to --lr.
    #[arg(long, default_value_t = 10)]
    pub warmup: u64,
    /// AdamW β₁.
    #[arg(long, default_value_t = 0.9)]
    pub beta1: f64,
    /// AdamW β₂.
    #[arg(long, default_value_t = 0.999)]
    pub beta2: f64,
    /// AdamW decoupled weight decay, applied to matrices (not to norms or biases).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub weight_decay: f64,
    /// Clip the gradient's global L2 norm to this (0: no clipping).
    #[arg(long, default_value_t = 1.0)]
    pub clip: f64,
    /// Seed of the data order, the held-out split, LoRA's initial A and sampled
    /// continuations: two runs with one seed give the same losses, bit for bit.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Train LoRA adapters of this rank instead of every weight (the base stays frozen); the
    /// adapter is merged into OUT.
    #[arg(long)]
    pub lora_rank: Option<usize>,
    /// LoRA α (scaling α / rank).
    #[arg(long, default_value_t = 16.0)]
    pub lora_alpha: f32,
    /// Linears LoRA adapts: any of q, k, v, o, gate, up, down.
    #[arg(long, default_value = "q,k,v,o,gate,up,down")]
    pub lora_targets: String,
    /// Also write the LoRA adapter (PEFT folder) to DIR.
    #[arg(long, value_name = "DIR")]
    pub save_adapter: Option<PathBuf>,
    /// Type of the written weights: f32, f16 or bf16 (norms and biases stay f32).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// The teacher's label cache (default OUT.labels): reused when it was made for the same
    /// teacher, data, --top-k, --temperature and --seq-len; completed when cut short.
    #[arg(long)]
    pub labels: Option<PathBuf>,
    /// Checkpoint folder (default OUT.checkpoint), written every --save-every steps and at
    /// the end.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Save a checkpoint every N steps (0: at the end only).
    #[arg(long, default_value_t = 100)]
    pub save_every: u64,
    /// Continue from a checkpoint folder: the same models, data and options are required.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Stop after N steps in total (a checkpoint is saved; OUT is not written): train in
    /// sessions with --resume.
    #[arg(long)]
    pub stop_after: Option<u64>,
    /// Evaluate on the held-out sequences every N steps (0: at the end only): perplexity and
    /// agreement of the student's top-1 token with the teacher's.
    #[arg(long, default_value_t = 50)]
    pub eval_every: u64,
    /// Replace OUT (and --save-adapter) if they exist.
    #[arg(long)]
    pub force: bool,
}

/// Progress on stderr ([`super::progress`]): a bar per phase on a terminal (lines
/// otherwise), the loss and tokens/s as its message while training.
struct Bars {
    bar: Option<Progress>,
    started: Instant,
    tokens: usize,
}

impl Bars {
    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish();
        }
    }
}

impl Observer for Bars {
    fn phase(&mut self, what: &str, total: u64) {
        self.finish();
        let what = if what == "training" {
            "training steps"
        } else {
            what
        };
        self.started = Instant::now();
        self.tokens = 0;
        self.bar = Some(Progress::new("distill", what, total as usize));
    }

    fn progress(&mut self, done: u64) {
        if let Some(b) = &self.bar {
            b.set(done as usize);
        }
    }

    fn step(&mut self, s: &StepStats) {
        self.tokens += s.tokens;
        let rate = self.tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-9);
        if let Some(b) = &self.bar {
            b.message(format!(
                "loss {:.4} (kd {:.4}, ce {:.3}) lr {:.2e} {rate:.0} tok/s",
                s.loss, s.kd, s.ce, s.lr
            ));
        }
    }

    fn eval(&mut self, e: &EvalStats) {
        let line = format!(
            "step {}: held-out perplexity {:.3}, top-1 agreement with the teacher {:.1} % ({} positions)",
            e.step,
            e.perplexity,
            100.0 * e.top1_agreement,
            e.positions
        );
        self.note(&line);
    }

    fn note(&mut self, message: &str) {
        match &self.bar {
            Some(b) => b.note(message),
            None => eprintln!("{message}"),
        }
    }
}

impl DistillArgs {
    /// The library's options (ranges checked; the vocabulary-dependent ones later).
    fn options(&self) -> anyhow::Result<TrainOptions> {
        let divergence = Divergence::parse(&self.loss, self.skew_alpha)?;
        let loss = LossSpec::new(divergence, self.temperature, self.hard_weight)?;
        Ok(TrainOptions {
            loss,
            top_k: self.top_k,
            seq_len: self.seq_len,
            batch_size: self.batch_size,
            grad_accum: self.grad_accum,
            steps: self.steps,
            epochs: self.epochs,
            lr: self.lr,
            min_lr: self.min_lr,
            warmup: self.warmup,
            adamw: AdamWConfig {
                beta1: self.beta1,
                beta2: self.beta2,
                eps: 1e-8,
                weight_decay: self.weight_decay,
            },
            clip: self.clip,
            seed: self.seed,
        })
    }

    fn mode(&self) -> anyhow::Result<TrainMode> {
        Ok(match self.lora_rank {
            Some(r) => TrainMode::Lora(LoraSpec::new(r, self.lora_alpha, &self.lora_targets)?),
            None => TrainMode::Full,
        })
    }
}

/// Runs `pagoda distill`.
pub fn run(args: DistillArgs) -> anyhow::Result<()> {
    let options = args.options()?;
    options.validate(usize::MAX)?;
    let mode = args.mode()?;
    let dtype: MergeDtype = args.dtype.parse()?;
    if !(0.0..1.0).contains(&args.held_out_fraction) {
        anyhow::bail!(
            "--held-out-fraction must be in [0, 1), not {}",
            args.held_out_fraction
        );
    }
    if !(args.gen_temperature >= 0.0 && args.gen_temperature.is_finite()) {
        anyhow::bail!(
            "--gen-temperature must be 0 (greedy) or positive, not {}",
            args.gen_temperature
        );
    }
    if args.output.exists() && !args.force {
        anyhow::bail!(
            "{} already exists; choose another output or pass --force to replace it",
            args.output.display()
        );
    }
    let data = match (&args.data, &args.prompts) {
        (Some(d), None) => DataSource::Jsonl(d.clone()),
        (None, Some(p)) => DataSource::Prompts {
            path: p.clone(),
            max_tokens: args.gen_tokens,
            temperature: args.gen_temperature,
        },
        _ => anyhow::bail!("give one of --data and --prompts"),
    };
    for p in [
        args.data.as_ref(),
        args.prompts.as_ref(),
        args.held_out.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        if !p.is_file() {
            anyhow::bail!("data file {} does not exist", p.display());
        }
    }
    let store = crate::commands::open_store()?;
    let teacher = loader::resolve(&store, &args.teacher, Pull::IfMissing)
        .with_context(|| format!("finding the teacher {}", args.teacher))?;
    let student = loader::resolve(&store, &args.student, Pull::IfMissing)
        .with_context(|| format!("finding the student {}", args.student))?;
    let cfg = DistillConfig {
        teacher: teacher.path.clone(),
        student: student.path.clone(),
        output: args.output.clone(),
        data,
        held_out: args.held_out.clone(),
        held_out_fraction: args.held_out_fraction,
        mode,
        options,
        labels: args.labels.clone(),
        checkpoint: args.checkpoint.clone(),
        resume: args.resume.clone(),
        save_every: args.save_every,
        eval_every: args.eval_every,
        stop_after: args.stop_after,
        dtype,
        save_adapter: args.save_adapter.clone(),
        force: args.force,
    };
    let mut bars = Bars {
        bar: None,
        started: Instant::now(),
        tokens: 0,
    };
    let result = pipeline::run(&cfg, &mut bars);
    bars.finish();
    let report = result?;
    // Stopped early (--stop-after): the pipeline said where to resume from.
    let Some(bytes) = report.output_bytes else {
        return Ok(());
    };
    let last = report
        .last
        .as_ref()
        .map(|s| format!(", last loss {:.4} (kd {:.4}, ce {:.4})", s.loss, s.kd, s.ce))
        .unwrap_or_default();
    eprintln!(
        "distilled {} into {} → {} ({:.1} MB): {} steps on {} sequences ({} held out){last}, \
         {:.0} training tokens/s; labels: {} computed, {} reused",
        args.teacher,
        args.student,
        args.output.display(),
        bytes as f64 / 1e6,
        report.steps,
        report.train_sequences,
        report.held_out_sequences,
        report.tokens_per_second,
        report.labelled,
        report.labels_reused,
    );
    if let Some(e) = report.evals.last() {
        eprintln!(
            "held-out: perplexity {:.3}, top-1 agreement with the teacher {:.1} %",
            e.perplexity,
            100.0 * e.top1_agreement
        );
    }
    if let Some(r) = &report.report {
        eprintln!("report: {}", r.display());
    }
    Ok(())
}
