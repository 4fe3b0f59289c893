//! The workload of `pagoda bench batching`, shared by the engines it drives (Pagoda in
//! process, `llama_server`'s peer): the benchmark text ([`PROMPT_TEXT`], also what
//! `pagoda bench model` builds its prompts from), the seeded requests ([`WorkItem`],
//! [`workload`]), what each one measured ([`RequestResult`]), and the closed-loop clients
//! ([`closed_loop`]). It imports no bench command, so the commands and the peer build on it
//! without importing each other.
//!
//! Invariant: the same seed gives the same requests, so both engines do exactly the same
//! work.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The benchmark paragraph shared with the peer script (`scripts/reference/bench_llamacpp.py`).
pub(crate) const PROMPT_TEXT: &str = include_str!("../../../../tests/golden/bench_prompt.txt");

/// One request of the workload.
#[derive(Debug, Clone)]
pub struct WorkItem {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
}

/// What one finished request measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestResult {
    pub output_tokens: usize,
    pub ttft: Duration,
    /// Mean time per output token after the first (None with fewer than 2 tokens).
    pub tpot: Option<Duration>,
}

/// How output lengths are drawn between their MIN and MAX.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LengthDistribution {
    /// Every length in the range equally likely.
    #[default]
    Uniform,
    /// A bounded Pareto (shape 1) on the range, as chat logs' output lengths are: most
    /// requests short (the median is about twice MIN), a few near MAX (P(length > x) falls
    /// as MIN/x). Static batching waits for a batch's longest request, so this is the mix
    /// on which continuous batching pays most.
    LongTail,
}

/// A length in `lo..=hi` from the bounded Pareto of shape 1 on that range, for `u` uniform in
/// [0, 1) (its inverse CDF).
pub fn long_tail_length(lo: usize, hi: usize, u: f64) -> usize {
    let (l, h) = (lo as f64, hi as f64 + 1.0);
    ((l / (1.0 - u * (1.0 - l / h))) as usize).clamp(lo, hi)
}

/// The seeded mixed-length workload: prompt lengths uniform in their range, output lengths
/// drawn from theirs by `output_dist`.
pub fn workload(
    text_tokens: &[u32],
    n: usize,
    seed: u64,
    prompt_len: (usize, usize),
    output_len: (usize, usize),
    output_dist: LengthDistribution,
) -> Vec<WorkItem> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move |lo: usize, hi: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        lo + (state % (hi - lo + 1) as u64) as usize
    };
    (0..n)
        .map(|_| {
            let len = next(prompt_len.0, prompt_len.1).min(text_tokens.len().saturating_sub(1));
            let offset = next(0, text_tokens.len() - len - 1);
            let max_tokens = match output_dist {
                LengthDistribution::Uniform => next(output_len.0, output_len.1),
                LengthDistribution::LongTail => {
                    let u = next(0, (1 << 30) - 1) as f64 / (1u64 << 30) as f64;
                    long_tail_length(output_len.0, output_len.1, u)
                }
            };
            WorkItem {
                prompt: text_tokens[offset..offset + len].to_vec(),
                max_tokens,
            }
        })
        .collect()
}

/// Runs `work` with `concurrency` closed-loop clients calling `serve` for each item.
pub fn closed_loop(
    work: &[WorkItem],
    concurrency: usize,
    serve: impl Fn(&WorkItem) -> anyhow::Result<RequestResult> + Sync,
) -> anyhow::Result<(Duration, Vec<RequestResult>)> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(work.len()));
    let started = Instant::now();
    let outcome: anyhow::Result<()> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..concurrency.max(1))
            .map(|_| {
                s.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = work.get(i) else {
                            return Ok(());
                        };
                        let r = serve(item)?;
                        results
                            .lock()
                            .map_err(|_| anyhow::anyhow!("poisoned"))?
                            .push(r);
                    }
                })
            })
            .collect();
        for c in clients {
            c.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        }
        Ok(())
    });
    outcome?;
    let wall = started.elapsed();
    let results = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("poisoned"))?;
    Ok((wall, results))
}
