//! Sequence-level distillation data: the teacher's own continuations of prompts (Kim &
//! Rush's sequence-level KD), generated with Pagoda's forward pass, greedy or sampled at a
//! temperature from the run's seed, and cached so a rerun reuses them.
//!
//! Cache format: JSON lines; the first is the header (teacher fingerprint, prompts digest,
//! token budget, temperature, seed), then one `{"tokens": [...]}` per prompt in order (the
//! prompt's tokens followed by the generated ones). A line is used only when it parses;
//! a header for other inputs is refused with what to do.
//!
//! Prompts are continued [`GEN_BATCH`] at a time, one batched forward pass per decode step
//! (the weights are read once for the batch, as in serving).
//!
//! Invariants: generation stops at an end-of-sequence token (kept) or after `max_tokens`;
//! sampling draws from one generator per prompt seeded from (seed, prompt index), and batches
//! start at multiples of [`GEN_BATCH`] whether resumed or not, so a seed fixes the
//! continuations, resumed or not.

use std::io::Write;
use std::path::Path;

use pagoda_model::arch::{BatchSegment, Logits, Model};
use pagoda_model::KvDtype;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// How continuations are made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenSpec {
    pub teacher: String,
    pub prompts_digest: String,
    pub max_tokens: usize,
    /// 0: greedy.
    pub temperature: f64,
    pub seed: u64,
}

#[derive(Serialize, Deserialize)]
struct Record {
    tokens: Vec<u32>,
}

/// The next token from `logits`: the most likely one, or sampled at `temperature`.
fn pick(logits: &[f32], temperature: f64, rng: &mut impl Rng) -> u32 {
    let argmax = logits
        .iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
        .0 as u32;
    if temperature <= 0.0 {
        return argmax;
    }
    let max = logits[argmax as usize] as f64;
    let weights: Vec<f64> = logits
        .iter()
        .map(|&z| ((z as f64 - max) / temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut u = rng.gen::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        u -= w;
        if u <= 0.0 {
            return i as u32;
        }
    }
    argmax
}

/// Continues every prompt (token ids) with `teacher`, reusing `cache`'s lines; returns the
/// full sequences. `eos` ends a continuation; `progress(done, total)` after each prompt.
pub fn continuations(
    teacher: &Model,
    prompts: &[Vec<u32>],
    eos: &[u32],
    spec: &GenSpec,
    cache: &Path,
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<Vec<u32>>> {
    let mut out: Vec<Vec<u32>> = Vec::new();
    if cache.exists() {
        let text = std::fs::read_to_string(cache).map_err(|e| TrainError::io(cache, e))?;
        let mut lines = text.lines();
        let header: Option<GenSpec> = lines.next().and_then(|l| serde_json::from_str(l).ok());
        if header.as_ref() != Some(spec) {
            return Err(TrainError::Stale(format!(
                "the generations cache {} was made for another teacher, prompts or generation \
                 options; delete it to generate again, or pass another --labels path",
                cache.display()
            )));
        }
        for l in lines {
            match serde_json::from_str::<Record>(l) {
                Ok(r) if out.len() < prompts.len() => out.push(r.tokens),
                _ => break,
            }
        }
    }
    // Batches start at multiples of GEN_BATCH (so a resumed run batches each prompt with the
    // same neighbours as an uninterrupted one); a batch's lines are written together, so a
    // cut-short run leaves whole batches, and any torn remainder is generated again.
    out.truncate(out.len() / GEN_BATCH * GEN_BATCH);
    // Rewrite what was good (drops a torn last line), then append.
    let mut f = std::fs::File::create(cache).map_err(|e| TrainError::io(cache, e))?;
    writeln!(f, "{}", json_line(spec)?).map_err(|e| TrainError::io(cache, e))?;
    for t in &out {
        writeln!(f, "{}", json_line(&Record { tokens: t.clone() })?)
            .map_err(|e| TrainError::io(cache, e))?;
    }
    progress(out.len(), prompts.len());
    let first = out.len();
    for batch_start in (first..prompts.len()).step_by(GEN_BATCH) {
        let end = (batch_start + GEN_BATCH).min(prompts.len());
        let batch = generate_batch(teacher, &prompts[batch_start..end], batch_start, eos, spec)?;
        for seq in batch {
            writeln!(
                f,
                "{}",
                json_line(&Record {
                    tokens: seq.clone()
                })?
            )
            .map_err(|e| TrainError::io(cache, e))?;
            out.push(seq);
        }
        f.flush().map_err(|e| TrainError::io(cache, e))?;
        progress(out.len(), prompts.len());
    }
    Ok(out)
}

/// Prompts continued together in one forward pass per step (the teacher's weights are read
/// once per step for all of them).
pub const GEN_BATCH: usize = 8;
const GEN_BLOCK: usize = 16;

/// One prompt being continued.
struct Live {
    seq: Vec<u32>,
    /// Length the sequence may reach (prompt + budget).
    limit: usize,
    table: Vec<u32>,
    rng: rand::rngs::StdRng,
    done: bool,
}

/// Continues `prompts` (indices `first..` in the whole prompt list, which seed the samplers)
/// as one batch: a prefill of every prompt, then one decode step for all unfinished ones at a
/// time.
fn generate_batch(
    teacher: &Model,
    prompts: &[Vec<u32>],
    first: usize,
    eos: &[u32],
    spec: &GenSpec,
) -> Result<Vec<Vec<u32>>> {
    let ctx = teacher.config().context_length;
    let mut next_block = 0u32;
    let mut live: Vec<Live> = prompts
        .iter()
        .enumerate()
        .map(|(k, prompt)| {
            let i = first + k;
            // One generator per prompt, from (seed, index): a resumed run samples what an
            // uninterrupted one would.
            let rng =
                rand::rngs::StdRng::seed_from_u64(spec.seed ^ (i as u64).wrapping_mul(0x9e37_79b9));
            let budget = spec.max_tokens.min(ctx.saturating_sub(prompt.len()));
            let blocks = (prompt.len() + budget + 1).div_ceil(GEN_BLOCK) as u32;
            let table = (next_block..next_block + blocks).collect();
            next_block += blocks;
            Live {
                seq: prompt.clone(),
                limit: prompt.len() + budget,
                table,
                rng,
                done: budget == 0 || prompt.is_empty(),
            }
        })
        .collect();
    let mut kv = teacher.new_paged_cache(next_block as usize, GEN_BLOCK, KvDtype::F32);
    // Prefill: every unfinished prompt's tokens at 0.. .
    let mut step: Vec<(usize, Vec<u32>, usize)> = live
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.done)
        .map(|(k, l)| (k, l.seq.clone(), 0))
        .collect();
    while !step.is_empty() {
        let segments: Vec<BatchSegment<'_>> = step
            .iter()
            .map(|(k, tokens, start)| BatchSegment {
                tokens,
                start: *start,
                block_table: &live[*k].table,
                logits: Some(Logits::Last),
                adapter: None,
                state_slot: None,
            })
            .collect();
        let logits = teacher.forward_batch(&segments, &mut kv)?;
        let vocab = logits.len() / step.len();
        let mut next = Vec::with_capacity(step.len());
        for (row, (k, _, _)) in step.iter().enumerate() {
            let l = &mut live[*k];
            let tok = pick(
                &logits[row * vocab..(row + 1) * vocab],
                spec.temperature,
                &mut l.rng,
            );
            l.seq.push(tok);
            if eos.contains(&tok) || l.seq.len() >= l.limit {
                l.done = true;
            } else {
                next.push((*k, vec![tok], l.seq.len() - 1));
            }
        }
        step = next;
    }
    Ok(live.into_iter().map(|l| l.seq).collect())
}

fn json_line<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| TrainError::Data(format!("generations cache: {e}")))
}
