//! The training loop: micro-batches drawn in a seeded order, the loss of [`crate::loss`],
//! gradient accumulation, clipping, AdamW under the schedule, and evaluation on held-out
//! sequences (perplexity and agreement of the student's top-1 with the teacher's).
//!
//! Owns [`TrainOptions`] (checked by [`TrainOptions::validate`]), the data order and
//! [`Trainer`] (one optimiser step at a time, so the caller shows progress, evaluates and
//! saves checkpoints between steps).
//!
//! Invariants: the order of sequences is a function of the seed and the epoch only
//! (epoch `e` is a shuffle seeded by `(seed, e)`), and step `s` uses the micro-batches
//! `s·accum .. (s+1)·accum` of that stream, so a resumed run draws exactly what the
//! uninterrupted one would; the loss of a step is the mean over the step's positions (see
//! `loss`), whatever the accumulation; nothing here reads a clock or a thread count, so two
//! runs with one seed compute the same bits.

use std::collections::BTreeMap;

use candle_core::{Device, Tensor, D};
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::error::{Result, TrainError};
use crate::labels::Labels;
use crate::loss::{loss, LossSpec, Targets};
use crate::optim::{accumulate, clip_grad_norm, collect_grads, AdamW, AdamWConfig, Schedule};
use crate::student::Student;

/// The options that shape training.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOptions {
    pub loss: LossSpec,
    /// Labels kept per position.
    pub top_k: usize,
    pub seq_len: usize,
    /// Sequences per micro-batch.
    pub batch_size: usize,
    /// Micro-batches per optimiser step.
    pub grad_accum: usize,
    /// Optimiser steps (`None`: `epochs` passes over the training sequences).
    pub steps: Option<u64>,
    pub epochs: u64,
    pub lr: f64,
    pub min_lr: f64,
    /// Warm-up steps.
    pub warmup: u64,
    pub adamw: AdamWConfig,
    /// Global gradient-norm clip (≤ 0: off).
    pub clip: f64,
    pub seed: u64,
}

impl TrainOptions {
    /// Checks every range; `vocab` is the student's vocabulary size.
    pub fn validate(&self, vocab: usize) -> Result<()> {
        let bad = |m: String| Err(TrainError::InvalidOption(m));
        if self.top_k == 0 || self.top_k > vocab {
            return bad(format!(
                "--top-k must be between 1 and the vocabulary size {vocab}, not {}",
                self.top_k
            ));
        }
        if self.seq_len < 2 {
            return bad(format!(
                "--seq-len must be at least 2 tokens, not {}",
                self.seq_len
            ));
        }
        if self.batch_size == 0 {
            return bad("--batch-size must be at least 1".into());
        }
        if self.grad_accum == 0 {
            return bad("--grad-accum must be at least 1".into());
        }
        if self.steps == Some(0) || self.epochs == 0 {
            return bad("--steps and --epochs must be at least 1".into());
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("--lr must be a positive number, not {}", self.lr));
        }
        if !(self.min_lr >= 0.0 && self.min_lr <= self.lr) {
            return bad(format!(
                "--min-lr must be in [0, --lr {}], not {}",
                self.lr, self.min_lr
            ));
        }
        if !self.clip.is_finite() {
            return bad(format!("--clip must be a number, not {}", self.clip));
        }
        self.adamw.validate()
    }

    /// Optimiser steps for `n_train` training sequences.
    pub fn total_steps(&self, n_train: usize) -> u64 {
        self.steps.unwrap_or_else(|| {
            let per_step = (self.batch_size * self.grad_accum) as u64;
            (self.epochs * n_train as u64).div_ceil(per_step).max(1)
        })
    }

    /// The options that change the result, by flag name (what a resume must match).
    pub fn resume_key(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            m.insert(k.to_string(), v);
        };
        put("--loss", self.loss.divergence.name().into());
        if let crate::loss::Divergence::Skew { alpha } = self.loss.divergence {
            put("--skew-alpha", alpha.to_string());
        }
        put("--temperature", self.loss.temperature.to_string());
        put("--hard-weight", self.loss.hard_weight.to_string());
        put("--top-k", self.top_k.to_string());
        put("--seq-len", self.seq_len.to_string());
        put("--batch-size", self.batch_size.to_string());
        put("--grad-accum", self.grad_accum.to_string());
        put(
            "--steps",
            self.steps.map_or("auto".into(), |s| s.to_string()),
        );
        put("--epochs", self.epochs.to_string());
        put("--lr", self.lr.to_string());
        put("--min-lr", self.min_lr.to_string());
        put("--warmup", self.warmup.to_string());
        put("--beta1", self.adamw.beta1.to_string());
        put("--beta2", self.adamw.beta2.to_string());
        put("--weight-decay", self.adamw.weight_decay.to_string());
        put("--clip", self.clip.to_string());
        put("--seed", self.seed.to_string());
        m
    }
}

/// What one optimiser step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepStats {
    /// 1-based.
    pub step: u64,
    pub loss: f64,
    /// Mean KD and CE over the step's positions.
    pub kd: f64,
    pub ce: f64,
    pub lr: f64,
    /// Before clipping.
    pub grad_norm: f64,
    /// Real (unpadded) tokens of the step.
    pub tokens: usize,
}

/// Held-out evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalStats {
    pub step: u64,
    /// `exp(mean CE)` of the student on the held-out sequences.
    pub perplexity: f64,
    /// Fraction of positions where the student's most likely token is the teacher's.
    pub top1_agreement: f64,
    /// Mean KD term on the held-out positions.
    pub kd: f64,
    pub positions: usize,
}

/// A micro-batch made ready for the student.
struct Batch {
    ids: Tensor,
    targets: Targets,
    rows: usize,
    width: usize,
    kd_count: usize,
    ce_count: usize,
}

/// A sequence's token ids with its labels (ids, log-probabilities).
type Labelled<'a> = (&'a [u32], (&'a [u32], &'a [f32]));

/// Builds the batch of `seqs` (token ids and their labels).
fn make_batch(seqs: &[Labelled<'_>], k: usize) -> Result<Batch> {
    let rows = seqs.len();
    let width = seqs.iter().map(|(s, _)| s.len()).max().unwrap_or(1).max(1);
    let n = rows * width;
    let mut ids = vec![0u32; n];
    let mut top_ids = vec![0u32; n * k];
    let mut top_lp = vec![0f32; n * k];
    let mut kd_mask = vec![0f32; n];
    let mut next = vec![0u32; n];
    let mut ce_mask = vec![0f32; n];
    let (mut kd_count, mut ce_count) = (0, 0);
    for (r, (s, (li, ll))) in seqs.iter().enumerate() {
        if li.len() != s.len() * k || ll.len() != s.len() * k {
            return Err(TrainError::Stale(
                "the labels do not match the sequences they were made for".into(),
            ));
        }
        for p in 0..s.len() {
            let at = r * width + p;
            ids[at] = s[p];
            top_ids[at * k..(at + 1) * k].copy_from_slice(&li[p * k..(p + 1) * k]);
            top_lp[at * k..(at + 1) * k].copy_from_slice(&ll[p * k..(p + 1) * k]);
            kd_mask[at] = 1.0;
            kd_count += 1;
            if p + 1 < s.len() {
                next[at] = s[p + 1];
                ce_mask[at] = 1.0;
                ce_count += 1;
            }
        }
    }
    let dev = &Device::Cpu;
    Ok(Batch {
        ids: Tensor::from_vec(ids, (rows, width), dev)?,
        targets: Targets {
            top_ids: Tensor::from_vec(top_ids, (n, k), dev)?,
            top_logprobs: Tensor::from_vec(top_lp, (n, k), dev)?,
            kd_mask: Tensor::from_vec(kd_mask, n, dev)?,
            next: Tensor::from_vec(next, n, dev)?,
            ce_mask: Tensor::from_vec(ce_mask, n, dev)?,
        },
        rows,
        width,
        kd_count,
        ce_count,
    })
}

/// The seeded order of training sequences: index `j` of the endless stream.
#[derive(Debug)]
pub struct DataOrder {
    seed: u64,
    n: usize,
    epoch: u64,
    order: Vec<usize>,
}

impl DataOrder {
    pub fn new(seed: u64, n: usize) -> DataOrder {
        let mut o = DataOrder {
            seed,
            n,
            epoch: u64::MAX,
            order: Vec::new(),
        };
        o.load_epoch(0);
        o
    }

    fn load_epoch(&mut self, e: u64) {
        if self.epoch == e {
            return;
        }
        let mut rng =
            rand::rngs::StdRng::seed_from_u64(self.seed.wrapping_mul(0x9e37_79b9).wrapping_add(e));
        self.order = (0..self.n).collect();
        self.order.shuffle(&mut rng);
        self.epoch = e;
    }

    /// The training sequence at position `j` of the stream.
    pub fn get(&mut self, j: u64) -> usize {
        let n = self.n.max(1) as u64;
        self.load_epoch(j / n);
        self.order[(j % n) as usize]
    }
}

/// Trains a student one optimiser step at a time.
pub struct Trainer<'a> {
    pub student: Student,
    pub opt: AdamW,
    pub options: TrainOptions,
    schedule: Schedule,
    train: &'a [Vec<u32>],
    held: &'a [Vec<u32>],
    /// Labels of the training sequences, then of the held-out ones.
    labels: &'a Labels,
    order: DataOrder,
    /// Optimiser steps done.
    pub step: u64,
    pub total_steps: u64,
}

impl<'a> Trainer<'a> {
    /// A trainer at step 0; `labels` holds `train.len() + held.len()` sequences, in that
    /// order.
    pub fn new(
        student: Student,
        options: TrainOptions,
        train: &'a [Vec<u32>],
        held: &'a [Vec<u32>],
        labels: &'a Labels,
    ) -> Result<Trainer<'a>> {
        if train.is_empty() {
            return Err(TrainError::Data(
                "no training sequence is left after the held-out split".into(),
            ));
        }
        if labels.len() != train.len() + held.len() || labels.top_k != options.top_k {
            return Err(TrainError::Stale(format!(
                "{} labelled sequences of top-{} for {} sequences of top-{}",
                labels.len(),
                labels.top_k,
                train.len() + held.len(),
                options.top_k
            )));
        }
        let opt = AdamW::new(options.adamw, student.trainable())?;
        let total_steps = options.total_steps(train.len());
        let schedule = Schedule {
            lr: options.lr,
            min_lr: options.min_lr,
            warmup: options.warmup,
            total: total_steps,
        };
        Ok(Trainer {
            student,
            opt,
            schedule,
            order: DataOrder::new(options.seed, train.len()),
            options,
            train,
            held,
            labels,
            step: 0,
            total_steps,
        })
    }

    /// The micro-batches of step `step` (0-based), as training sequence indices.
    fn step_batches(&mut self, step: u64) -> Vec<Vec<usize>> {
        let (b, a) = (
            self.options.batch_size as u64,
            self.options.grad_accum as u64,
        );
        (0..a)
            .map(|m| {
                let first = (step * a + m) * b;
                (first..first + b).map(|j| self.order.get(j)).collect()
            })
            .collect()
    }

    /// Runs the next optimiser step.
    pub fn step(&mut self) -> Result<StepStats> {
        let k = self.options.top_k;
        let micro = self.step_batches(self.step);
        let batches: Vec<Batch> = micro
            .iter()
            .map(|idx| {
                let seqs: Vec<_> = idx
                    .iter()
                    .map(|&i| (self.train[i].as_slice(), self.labels.sequence(i)))
                    .collect();
                make_batch(&seqs, k)
            })
            .collect::<Result<_>>()?;
        let kd_count: usize = batches.iter().map(|b| b.kd_count).sum();
        let ce_count: usize = batches.iter().map(|b| b.ce_count).sum();
        let vocab = self.student.config().vocab_size;
        let spec = self.options.loss;
        let mut grads: BTreeMap<String, Tensor> = BTreeMap::new();
        let (mut kd_sum, mut ce_sum, mut total) = (0.0, 0.0, 0.0);
        for batch in &batches {
            let logits = self.student.forward(&batch.ids)?;
            let logits = logits.reshape((batch.rows * batch.width, vocab))?;
            let parts = loss(
                &logits,
                &batch.targets,
                &spec,
                kd_count as f64,
                ce_count as f64,
            )?;
            total += parts.total.to_scalar::<f32>()? as f64;
            kd_sum += parts.kd_sum;
            ce_sum += parts.ce_sum;
            let store = parts.total.backward()?;
            accumulate(&mut grads, collect_grads(self.student.trainable(), &store)?)?;
        }
        if !total.is_finite() {
            return Err(TrainError::Diverged(format!(
                "the loss of step {} is {total}: training diverged (try a lower --lr)",
                self.step + 1
            )));
        }
        let grad_norm = clip_grad_norm(&mut grads, self.options.clip)?;
        let lr = self.schedule.lr(self.step);
        self.opt.update(self.student.trainable(), &grads, lr)?;
        self.step += 1;
        Ok(StepStats {
            step: self.step,
            loss: total,
            kd: kd_sum / kd_count.max(1) as f64,
            ce: ce_sum / ce_count.max(1) as f64,
            lr,
            grad_norm,
            tokens: kd_count,
        })
    }

    /// Evaluates the student on the held-out sequences (`None` when there are none).
    pub fn evaluate(&self) -> Result<Option<EvalStats>> {
        if self.held.is_empty() {
            return Ok(None);
        }
        let k = self.options.top_k;
        let vocab = self.student.config().vocab_size;
        let spec = self.options.loss;
        let (mut ce, mut kd, mut agree) = (0.0, 0.0, 0usize);
        let (mut ce_n, mut kd_n) = (0usize, 0usize);
        let base = self.train.len();
        for chunk in (0..self.held.len())
            .collect::<Vec<_>>()
            .chunks(self.options.batch_size)
        {
            let seqs: Vec<_> = chunk
                .iter()
                .map(|&i| (self.held[i].as_slice(), self.labels.sequence(base + i)))
                .collect();
            let batch = make_batch(&seqs, k)?;
            let logits = self.student.forward(&batch.ids)?.detach();
            let logits = logits.reshape((batch.rows * batch.width, vocab))?;
            let t = &batch.targets;
            ce += (crate::loss::ce_per_position(&logits, t)? * &t.ce_mask)?
                .sum_all()?
                .to_scalar::<f32>()? as f64;
            kd += (crate::loss::kd_per_position(&logits, t, &spec)? * &t.kd_mask)?
                .sum_all()?
                .to_scalar::<f32>()? as f64;
            let student_top: Vec<u32> = logits.argmax(D::Minus1)?.to_vec1()?;
            let teacher_top: Vec<u32> = t.top_ids.narrow(1, 0, 1)?.flatten_all()?.to_vec1()?;
            let mask: Vec<f32> = t.kd_mask.to_vec1()?;
            for ((s, tt), m) in student_top.iter().zip(&teacher_top).zip(&mask) {
                if *m > 0.0 && s == tt {
                    agree += 1;
                }
            }
            ce_n += batch.ce_count;
            kd_n += batch.kd_count;
        }
        Ok(Some(EvalStats {
            step: self.step,
            perplexity: (ce / ce_n.max(1) as f64).exp(),
            top1_agreement: agree as f64 / kd_n.max(1) as f64,
            kd: kd / kd_n.max(1) as f64,
            positions: kd_n,
        }))
    }
}
