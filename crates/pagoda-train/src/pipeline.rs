//! `pagoda distill` end to end, as a library call: check the inputs, read and tokenize the
//! data (or generate it from prompts with the teacher), label it with the teacher (cached),
//! train the student (checkpoints, resume, evaluation), write the result and its report.
//!
//! Owns [`DistillConfig`] (every input of a run), [`Observer`] (how a front end sees
//! progress) and [`run`].
//!
//! Invariants: every refusal that does not need the teacher's labels — an existing output
//! without `force`, a missing or malformed data file, a student architecture the trainer
//! lacks, a tokenizer mismatch, options out of range, a checkpoint for something else — is
//! made before any label is computed or any file written; OUT and its report appear only
//! when complete (the writers' `OUT.partial`); what is left behind on purpose is what makes
//! a rerun cheaper: the label cache, the generations cache and the checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pagoda_compress::merge::MergeDtype;
use pagoda_model::arch::Model;
use pagoda_model::{open_model, ModelSource};
use serde_json::json;

use crate::checkpoint::{self, CheckpointState, Fingerprint};
use crate::data::{read_jsonl, split, Encoder, Example};
use crate::error::{Result, TrainError};
use crate::generate::{continuations, GenSpec};
use crate::labels::{data_digest, fingerprint, CacheHeader, LabelCache, Labels};
use crate::output::write_student;
use crate::student::{check_supported, Student, TrainMode};
use crate::train::{EvalStats, StepStats, TrainOptions, Trainer};
use crate::vocab::check_shared;

/// Where the training text comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum DataSource {
    /// JSONL of texts or conversations.
    Jsonl(PathBuf),
    /// JSONL of prompts the teacher continues (sequence-level distillation).
    Prompts {
        path: PathBuf,
        max_tokens: usize,
        /// 0: greedy.
        temperature: f64,
    },
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct DistillConfig {
    /// Resolved paths of the models (a GGUF file or a Hugging Face folder).
    pub teacher: PathBuf,
    pub student: PathBuf,
    pub output: PathBuf,
    pub data: DataSource,
    /// Held-out data; without it, `held_out_fraction` of the data.
    pub held_out: Option<PathBuf>,
    pub held_out_fraction: f64,
    pub mode: TrainMode,
    pub options: TrainOptions,
    /// Label cache (default `OUT.labels`).
    pub labels: Option<PathBuf>,
    /// Checkpoint folder (default `OUT.checkpoint`).
    pub checkpoint: Option<PathBuf>,
    pub resume: Option<PathBuf>,
    /// Save a checkpoint every N steps (0: only at the end).
    pub save_every: u64,
    /// Evaluate every N steps (0: only at the end).
    pub eval_every: u64,
    /// Stop after this many steps in total, saving a checkpoint and writing no output.
    pub stop_after: Option<u64>,
    pub dtype: MergeDtype,
    pub save_adapter: Option<PathBuf>,
    pub force: bool,
}

/// How a front end follows a run; every method has a silent default.
pub trait Observer {
    /// A phase starts: `what` with `total` units (sequences, prompts or steps).
    fn phase(&mut self, _what: &str, _total: u64) {}
    /// Units done in the current phase.
    fn progress(&mut self, _done: u64) {}
    fn step(&mut self, _stats: &StepStats) {}
    fn eval(&mut self, _stats: &EvalStats) {}
    fn note(&mut self, _message: &str) {}
}

/// An observer that shows nothing.
pub struct Quiet;
impl Observer for Quiet {}

/// What a run did.
#[derive(Debug, Clone)]
pub struct DistillReport {
    pub steps: u64,
    pub resumed_from: u64,
    pub last: Option<StepStats>,
    pub evals: Vec<EvalStats>,
    pub labelled: usize,
    pub labels_reused: usize,
    pub train_sequences: usize,
    pub held_out_sequences: usize,
    /// Training tokens per second over this run's steps.
    pub tokens_per_second: f64,
    /// `None` when stopped early.
    pub output_bytes: Option<u64>,
    pub report: Option<PathBuf>,
    pub checkpoint: PathBuf,
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn open(path: &Path, role: &str) -> Result<ModelSource> {
    open_model(path).map_err(|e| match e {
        pagoda_model::ModelError::Io { path, source }
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            TrainError::InvalidOption(format!("the {role} {} does not exist", path.display()))
        }
        e => e.into(),
    })
}

/// Runs a distillation.
pub fn run(cfg: &DistillConfig, obs: &mut dyn Observer) -> Result<DistillReport> {
    let opts = &cfg.options;
    check_destinations(cfg)?;
    let examples = match &cfg.data {
        DataSource::Jsonl(p) | DataSource::Prompts { path: p, .. } => read_jsonl(p)?,
    };
    let held_examples = match &cfg.held_out {
        Some(p) => Some(read_jsonl(p)?),
        None => None,
    };
    if let Some(r) = &cfg.resume {
        if !r.join("state.json").exists() {
            return Err(TrainError::Stale(format!(
                "{} is not a distillation checkpoint (no state.json)",
                r.display()
            )));
        }
    }

    let teacher_src = open(&cfg.teacher, "teacher")?;
    let student_src = open(&cfg.student, "student")?;
    check_supported(&student_src.config)?;
    check_shared(
        &teacher_src.tokenizer,
        &student_src.tokenizer,
        teacher_src.config.vocab_size,
        student_src.config.vocab_size,
    )?;
    opts.validate(student_src.config.vocab_size)?;
    let template = student_src.chat_template_or_default();
    let enc = Encoder {
        tokenizer: &student_src.tokenizer,
        template: &template,
    };
    let teacher_fp = fingerprint(&cfg.teacher)?;
    let labels_path = cfg
        .labels
        .clone()
        .unwrap_or_else(|| with_suffix(&cfg.output, ".labels"));

    let (mut sequences, teacher) = token_sequences(
        cfg,
        &enc,
        &examples,
        &teacher_src,
        &teacher_fp,
        &labels_path,
        obs,
    )?;
    sequences.retain(|s| !s.is_empty());
    // Every sequence in file order (data, then a held-out file): what the teacher labels,
    // whatever the seed's split.
    let n_data = sequences.len();
    let mut all = sequences;
    let (train_idx, held_idx) = match &held_examples {
        Some(h) => {
            all.extend(enc.encode_all(h, opts.seq_len)?);
            ((0..n_data).collect(), (n_data..all.len()).collect())
        }
        None => split(n_data, cfg.held_out_fraction, opts.seed)?,
    };
    if train_idx.is_empty() {
        return Err(TrainError::Data("no training sequence in the data".into()));
    }
    let digest = data_digest(&all);

    // Everything a resume checks is known now: refuse a wrong checkpoint before labelling.
    let student = Student::load(&student_src, &cfg.mode, opts.seed)?;
    let fp = Fingerprint {
        architecture: student_src.config.arch.gguf_name().to_string(),
        tensors: student.shapes(),
        student_source: fingerprint(&cfg.student)?,
        teacher: teacher_fp.clone(),
        data_digest: digest.clone(),
    };
    let mut resume_key = opts.resume_key();
    resume_key.insert("--mode".into(), mode_key(&cfg.mode));
    if let Some(r) = &cfg.resume {
        checkpoint::check(r, &fp, &resume_key)?;
    }

    let header = CacheHeader {
        teacher: teacher_fp.clone(),
        top_k: opts.top_k,
        temperature: opts.loss.temperature,
        data_digest: digest.clone(),
        seq_len: opts.seq_len,
        sequences: all.len(),
    };
    let (labels, reused) = label(&labels_path, header, &all, teacher, teacher_src, obs)?;

    let order: Vec<usize> = train_idx.iter().chain(&held_idx).copied().collect();
    let labels = labels.select(&order);
    let train: Vec<Vec<u32>> = train_idx.iter().map(|&i| all[i].clone()).collect();
    let held: Vec<Vec<u32>> = held_idx.iter().map(|&i| all[i].clone()).collect();
    let mut trainer = Trainer::new(student, opts.clone(), &train, &held, &labels)?;
    let mut resumed_from = 0;
    if let Some(r) = &cfg.resume {
        let state = checkpoint::resume(
            r,
            &fp,
            &resume_key,
            trainer.student.trainable(),
            &mut trainer.opt,
        )?;
        trainer.step = state.step;
        resumed_from = state.step;
        obs.note(&format!(
            "resumed from {} at step {}",
            r.display(),
            state.step
        ));
    }
    let ckpt_dir = cfg
        .checkpoint
        .clone()
        .unwrap_or_else(|| with_suffix(&cfg.output, ".checkpoint"));
    let save = |trainer: &Trainer<'_>| {
        checkpoint::save(
            &ckpt_dir,
            trainer.student.trainable(),
            &trainer.opt,
            &CheckpointState {
                step: trainer.step,
                adam_step: trainer.opt.step,
                seed: opts.seed,
                fingerprint: fp.clone(),
                options: resume_key.clone(),
            },
        )
    };

    let total = trainer.total_steps;
    let end = cfg.stop_after.map_or(total, |s| s.min(total));
    let log = train_steps(&mut trainer, end, cfg, obs, save)?;
    let mut report = DistillReport {
        steps: trainer.step,
        resumed_from,
        last: log.last,
        evals: log.evals,
        labelled: all.len() - reused,
        labels_reused: reused,
        train_sequences: train.len(),
        held_out_sequences: held.len(),
        tokens_per_second: log.tokens as f64 / log.seconds.max(1e-9),
        output_bytes: None,
        report: None,
        checkpoint: ckpt_dir.clone(),
    };
    if trainer.step < total {
        obs.note(&format!(
            "stopped at step {} of {total}; continue with --resume {}",
            trainer.step,
            ckpt_dir.display()
        ));
        return Ok(report);
    }
    write_results(
        cfg,
        &trainer,
        &teacher_fp,
        &resume_key,
        &log.lines,
        &mut report,
        obs,
    )?;
    Ok(report)
}

/// Writes the trained student to OUT (and its adapter when asked) and the run's report
/// beside it (`OUT.report.jsonl`: the run's head, then every logged step and evaluation),
/// noting both in `report`.
fn write_results(
    cfg: &DistillConfig,
    trainer: &Trainer<'_>,
    teacher_fp: &str,
    resume_key: &BTreeMap<String, String>,
    lines: &[serde_json::Value],
    report: &mut DistillReport,
    obs: &mut dyn Observer,
) -> Result<()> {
    obs.note(&format!("writing {}", cfg.output.display()));
    let note = format!(
        "pagoda distill: teacher {}, {} steps, loss {}",
        teacher_fp,
        trainer.step,
        cfg.options.loss.divergence.name()
    );
    let written = write_student(
        &trainer.student,
        &cfg.student,
        &cfg.output,
        cfg.dtype,
        cfg.force,
        cfg.save_adapter.as_deref(),
        &note,
    )?;
    report.output_bytes = Some(written.bytes);
    let report_path = with_suffix(&cfg.output, ".report.jsonl");
    let mut text = String::new();
    let head = json!({"teacher": cfg.teacher, "student": cfg.student, "output": cfg.output,
                      "options": resume_key, "train_sequences": report.train_sequences,
                      "held_out_sequences": report.held_out_sequences, "steps": trainer.step,
                      "tokens_per_second": report.tokens_per_second});
    for v in std::iter::once(&head).chain(lines) {
        text.push_str(&v.to_string());
        text.push('\n');
    }
    std::fs::write(&report_path, text).map_err(|e| TrainError::io(&report_path, e))?;
    report.report = Some(report_path);
    Ok(())
}

/// Refuses, before any work, outputs that exist without `force` and an adapter folder
/// asked for without LoRA training.
fn check_destinations(cfg: &DistillConfig) -> Result<()> {
    if cfg.output.exists() && !cfg.force {
        return Err(TrainError::InvalidOption(format!(
            "{} already exists; choose another output or pass --force to replace it",
            cfg.output.display()
        )));
    }
    if let Some(dir) = &cfg.save_adapter {
        if !matches!(cfg.mode, TrainMode::Lora(_)) {
            return Err(TrainError::InvalidOption(
                "--save-adapter needs LoRA training (--lora-rank)".into(),
            ));
        }
        if dir.exists() && !cfg.force {
            return Err(TrainError::InvalidOption(format!(
                "{} already exists; pass --force to replace it",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// The data's token sequences, each cut to the sequence length: the examples encoded, or,
/// for prompts, the teacher's continuations of them (generated once, cached beside the
/// labels). Returns the teacher too when it had to be built, so labelling reuses it.
fn token_sequences(
    cfg: &DistillConfig,
    enc: &Encoder<'_>,
    examples: &[Example],
    teacher_src: &ModelSource,
    teacher_fp: &str,
    labels_path: &Path,
    obs: &mut dyn Observer,
) -> Result<(Vec<Vec<u32>>, Option<Model>)> {
    let opts = &cfg.options;
    match &cfg.data {
        DataSource::Jsonl(_) => Ok((enc.encode_all(examples, opts.seq_len)?, None)),
        DataSource::Prompts {
            max_tokens,
            temperature,
            ..
        } => {
            let mut prompts = Vec::new();
            for e in examples {
                let ids = match e {
                    Example::Text(t) => enc.encode_rendered(t)?,
                    Example::Chat(m) => enc.encode_rendered(&enc.template.render(m, true)?)?,
                };
                prompts.push(ids);
            }
            let spec = GenSpec {
                teacher: teacher_fp.to_string(),
                prompts_digest: data_digest(&prompts),
                max_tokens: *max_tokens,
                temperature: *temperature,
                seed: opts.seed,
            };
            let model = Model::from_source(teacher_src)?;
            obs.phase("generating", prompts.len() as u64);
            let mut seqs = continuations(
                &model,
                &prompts,
                teacher_src.tokenizer.eos_ids(),
                &spec,
                &with_suffix(labels_path, ".gen.jsonl"),
                |d, _| obs.progress(d as u64),
            )?;
            for s in &mut seqs {
                s.truncate(opts.seq_len);
            }
            Ok((seqs, Some(model)))
        }
    }
}

/// The teacher's labels of every sequence: those already in the cache at `labels_path`, the
/// rest computed (with `teacher`, or a teacher built from `teacher_src`) and added to it.
/// Both are dropped when it returns, before training. Returns the labels and how many came
/// from the cache.
fn label(
    labels_path: &Path,
    header: CacheHeader,
    all: &[Vec<u32>],
    mut teacher: Option<Model>,
    teacher_src: ModelSource,
    obs: &mut dyn Observer,
) -> Result<(Labels, usize)> {
    let cache = LabelCache::new(labels_path, header);
    let mut labels = cache.load()?;
    let reused = labels.len();
    if labels.len() < all.len() {
        let model = match teacher.take() {
            Some(m) => m,
            None => Model::from_source(&teacher_src)?,
        };
        obs.phase("labelling", all.len() as u64);
        cache.complete(&model, all, &mut labels, |d, _| obs.progress(d as u64))?;
    }
    drop(teacher);
    drop(teacher_src);
    Ok((labels, reused))
}

/// What the training steps of a run recorded.
struct TrainLog {
    /// One JSON object per step and per evaluation, in order: the report file's lines.
    lines: Vec<serde_json::Value>,
    evals: Vec<EvalStats>,
    last: Option<StepStats>,
    /// Training tokens over the steps run here.
    tokens: usize,
    seconds: f64,
}

/// Runs optimiser steps until step `end`: an evaluation first when starting from step 0,
/// then every `eval_every` steps and at the end; a checkpoint (`save`) every `save_every`
/// steps and at the end.
fn train_steps<'a>(
    trainer: &mut Trainer<'a>,
    end: u64,
    cfg: &DistillConfig,
    obs: &mut dyn Observer,
    save: impl Fn(&Trainer<'a>) -> Result<()>,
) -> Result<TrainLog> {
    let total = trainer.total_steps;
    let mut log: Vec<serde_json::Value> = Vec::new();
    let mut evals = Vec::new();
    let mut last = None;
    let started = Instant::now();
    let mut tokens = 0usize;
    let mut record_eval =
        |e: EvalStats, log: &mut Vec<serde_json::Value>, obs: &mut dyn Observer| {
            log.push(json!({"step": e.step, "eval_perplexity": e.perplexity,
                        "eval_top1_agreement": e.top1_agreement, "eval_kd": e.kd,
                        "eval_positions": e.positions}));
            obs.eval(&e);
            evals.push(e);
        };
    obs.phase("training", total);
    obs.progress(trainer.step);
    if trainer.step == 0 && end > 0 {
        // The starting point, so every later evaluation has something to be compared with.
        if let Some(e) = trainer.evaluate()? {
            record_eval(e, &mut log, obs);
        }
    }
    while trainer.step < end {
        let s = trainer.step()?;
        tokens += s.tokens;
        log.push(
            json!({"step": s.step, "loss": s.loss, "kd": s.kd, "ce": s.ce, "lr": s.lr,
                        "grad_norm": s.grad_norm, "tokens": s.tokens,
                        "elapsed_s": started.elapsed().as_secs_f64()}),
        );
        obs.step(&s);
        obs.progress(s.step);
        let at_end = trainer.step == end;
        if cfg.eval_every > 0 && trainer.step % cfg.eval_every == 0 || at_end {
            if let Some(e) = trainer.evaluate()? {
                record_eval(e, &mut log, obs);
            }
        }
        if cfg.save_every > 0 && trainer.step % cfg.save_every == 0 || at_end {
            save(trainer)?;
        }
        last = Some(s);
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(TrainLog {
        lines: log,
        evals,
        last,
        tokens,
        seconds,
    })
}

/// The training mode as a resume compares it.
fn mode_key(mode: &TrainMode) -> String {
    match mode {
        TrainMode::Full => "full".into(),
        TrainMode::Lora(s) => format!(
            "lora r {} alpha {} targets {}",
            s.rank,
            s.alpha,
            s.targets.join(",")
        ),
    }
}
