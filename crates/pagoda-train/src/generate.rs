//! Sequence-level distillation data: the teacher's own continuations of prompts (Kim &
//! Rush's sequence-level KD), generated with Pagoda's forward pass, greedy or sampled at a
//! temperature from the run's seed, and cached so a rerun reuses them.
//!
//! Cache format: JSON lines; the first is the header (teacher fingerprint, prompts digest,
//! token budget, temperature, seed), then one `{"tokens": [...]}` per prompt in order (the
//! prompt's tokens followed by the generated ones). A line is used only when it parses;
//! a header for other inputs is refused with what to do.
//!
//! Invariants: generation stops at an end-of-sequence token (kept) or after `max_tokens`;
//! sampling draws from one generator per prompt seeded from (seed, prompt index), so a seed
//! fixes the continuations, resumed or not.

use std::io::Write;
use std::path::Path;

use pagoda_model::arch::{Logits, Model};
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
    // Rewrite what was good (drops a torn last line), then append.
    let mut f = std::fs::File::create(cache).map_err(|e| TrainError::io(cache, e))?;
    writeln!(f, "{}", json_line(spec)?).map_err(|e| TrainError::io(cache, e))?;
    for t in &out {
        writeln!(f, "{}", json_line(&Record { tokens: t.clone() })?)
            .map_err(|e| TrainError::io(cache, e))?;
    }
    progress(out.len(), prompts.len());
    let ctx = teacher.config().context_length;
    for (i, prompt) in prompts.iter().enumerate().skip(out.len()) {
        // One generator per prompt, from (seed, index): a resumed run samples what an
        // uninterrupted one would.
        let mut rng =
            rand::rngs::StdRng::seed_from_u64(spec.seed ^ (i as u64).wrapping_mul(0x9e37_79b9));
        let budget = spec.max_tokens.min(ctx.saturating_sub(prompt.len()));
        let mut cache_kv = teacher.new_cache_with(prompt.len() + budget + 1, KvDtype::F32);
        let mut seq = prompt.clone();
        if budget > 0 && !prompt.is_empty() {
            let mut logits = teacher.forward(prompt, 0, &mut cache_kv, Logits::Last)?;
            for _ in 0..budget {
                let tok = pick(&logits, spec.temperature, &mut rng);
                seq.push(tok);
                if eos.contains(&tok) || seq.len() >= prompt.len() + budget {
                    break;
                }
                logits = teacher.forward(&[tok], seq.len() - 1, &mut cache_kv, Logits::Last)?;
            }
        }
        writeln!(
            f,
            "{}",
            json_line(&Record {
                tokens: seq.clone()
            })?
        )
        .map_err(|e| TrainError::io(cache, e))?;
        out.push(seq);
        progress(out.len(), prompts.len());
    }
    Ok(out)
}

fn json_line<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| TrainError::Data(format!("generations cache: {e}")))
}
