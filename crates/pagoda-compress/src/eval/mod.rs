//! Accuracy evaluation of a loaded model: perplexity over a text, multiple-choice accuracy,
//! GSM8K exact match; blind side-by-side comparison of two variants and the size/quality
//! report of several.
//!
//! Scoring runs the model's forward pass directly ([`pagoda_model::Model::forward`] over a
//! single-sequence KV cache), never the serving engine: it needs logits for every scored
//! position, which the engine does not return. GSM8K needs generation instead, which the
//! caller runs (this crate does not depend on the engine); only its data and scoring are here.
//!
//! - [`windows`] — the strided sliding windows of a perplexity run (each token scored once).
//! - [`perplexity`] — perplexity, mean NLL and throughput over a tokenized text.
//! - [`multiple_choice`] — lm-eval-harness style `acc` / `acc_norm` over JSONL questions.
//! - [`gsm8k`] — GSM8K exact match: data, prompt, last-number extraction (generation is the
//!   caller's).
//! - [`logprob`] — f64 log-softmax of a logits row, argmax with NumPy's tie rule.
//! - [`compare`] — blind A/B: prompt sets, the seeded left/right shuffle, the sidecar key,
//!   the exported picks mapped back to A/B outcomes.
//! - [`compare_page`] — the self-contained HTML page a person judges on (escaped, no key).
//! - [`winrate`] — win rate with ties as half, Wilson and bootstrap 95% intervals.
//! - [`report`] — per-variant size/speed/quality rows, Markdown table and SVG plot.
//! - [`data`] — the evaluation text and sample questions built into the binary.
//!
//! Invariant: scores are summed in f64; bad input (an empty text, a malformed question) is a
//! [`crate::CompressError`] naming what is wrong, never a panic.

pub mod compare;
pub mod compare_page;
pub mod data;
pub mod gsm8k;
pub mod logprob;
pub mod multiple_choice;
pub mod perplexity;
pub mod report;
pub mod windows;
pub mod winrate;

pub use multiple_choice::{McItem, McReport, McScorer, McScores};

/// Parses JSONL with `parse_line(text, 1-based line number)`; blank lines are skipped, the
/// first bad line's error is returned.
pub fn parse_jsonl_with<T>(
    text: &str,
    parse_line: impl Fn(&str, usize) -> Result<T, crate::CompressError>,
) -> Result<Vec<T>, crate::CompressError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| parse_line(l, i + 1))
        .collect()
}
pub use perplexity::{PerplexityOptions, PerplexityReport};
