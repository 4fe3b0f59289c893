//! Multiple-choice accuracy the way lm-evaluation-harness scores it: for each choice, the sum
//! of the log-probabilities of its tokens given the context; `acc` picks the choice with the
//! largest sum, `acc_norm` the largest sum divided by the choice's length in bytes.
//!
//! Input is JSONL, one question per line: `{"context": "...", "choices": ["...", ...],
//! "gold": 0}`; `query` is accepted for `context`, `answer` or `label` for `gold`, and `gold`
//! may also be the text of the right choice. A choice is scored as written: a leading space
//! (`" Paris"`) is part of it, as lm-eval's target delimiter makes it.
//!
//! Tokenization follows lm-eval's `_encode_pair`: trailing whitespace of the context moves to
//! the front of the continuation, then `whole = encode(context + choice)`, `ctx =
//! encode(context)`, and the continuation is `whole[len(ctx)..]`; the model reads `ctx +
//! continuation`. One difference: both are encoded with the model's special tokens (BOS when
//! the model wants one, as in perplexity and generation), where lm-eval's Hugging Face backend
//! adds no BOS by default except for Gemma. A context that encodes to nothing is replaced by
//! BOS (else the first EOS id), as lm-eval prefixes its end-of-text token.
//!
//! Invariants: a bad line is an error naming its 1-based line number, never a panic; the
//! context runs once per question and each choice's continuation runs after it from the same
//! cached prefix; log-probabilities are summed in f64; ties go to the first choice (NumPy's
//! `argmax`).

use std::time::Instant;

use pagoda_model::tokenizer::Tokenizer;
use pagoda_model::{KvCache, KvDtype, Logits, Model};
use serde::Serialize;
use serde_json::Value;

use super::logprob::{argmax_first, log_prob};
use crate::CompressError;

/// One question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McItem {
    /// 1-based line of the JSONL file it came from.
    pub line: usize,
    pub context: String,
    pub choices: Vec<String>,
    /// Index of the right choice.
    pub gold: usize,
}

/// Parses JSONL questions; blank lines are skipped. Errors name the 1-based line.
pub fn parse_jsonl(text: &str) -> Result<Vec<McItem>, CompressError> {
    super::parse_jsonl_with(text, parse_line)
}

/// Parses one JSONL line (`line` is its 1-based number, for errors).
pub fn parse_line(text: &str, line: usize) -> Result<McItem, CompressError> {
    let bad = |message: String| CompressError::BadLine { line, message };
    let value: Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not a JSON object: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| bad("expected a JSON object".into()))?;
    let one_of = |keys: &[&str]| -> Result<Option<&Value>, CompressError> {
        let present: Vec<&&str> = keys.iter().filter(|k| obj.contains_key(**k)).collect();
        match present.as_slice() {
            [] => Ok(None),
            [k] => Ok(obj.get(**k)),
            _ => Err(bad(format!(
                "both {} given; use one",
                present
                    .iter()
                    .map(|k| format!("\"{k}\""))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ))),
        }
    };
    let context = match one_of(&["context", "query"])? {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("\"context\" must be a string".into())),
        None => return Err(bad("missing \"context\" (or \"query\")".into())),
    };
    let choices: Vec<String> = match obj.get("choices") {
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(j, c)| match c {
                Value::String(s) if !s.is_empty() => Ok(s.clone()),
                Value::String(_) => Err(bad(format!("choice {j} is empty"))),
                _ => Err(bad(format!("choice {j} is not a string"))),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("\"choices\" must be an array of strings".into())),
        None => return Err(bad("missing \"choices\"".into())),
    };
    if choices.is_empty() {
        return Err(bad("\"choices\" is empty".into()));
    }
    let gold = match one_of(&["gold", "answer", "label"])? {
        Some(Value::Number(n)) => match n.as_u64() {
            Some(g) if (g as usize) < choices.len() => g as usize,
            _ => {
                return Err(bad(format!(
                    "gold {n} is not an index of the {} choices (0-based)",
                    choices.len()
                )))
            }
        },
        Some(Value::String(s)) => choices.iter().position(|c| c == s).ok_or_else(|| {
            bad(format!(
                "gold {s:?} is not one of the choices (give an index or a choice's exact text)"
            ))
        })?,
        Some(_) => return Err(bad("gold must be an index or a choice's text".into())),
        None => return Err(bad("missing \"gold\" (or \"answer\" / \"label\")".into())),
    };
    Ok(McItem {
        line,
        context,
        choices,
        gold,
    })
}

/// lm-eval's `_encode_pair`: `(context tokens, continuation tokens)` for `context` followed by
/// `continuation`, with the context's trailing whitespace moved to the continuation.
pub fn encode_pair(
    tokenizer: &Tokenizer,
    context: &str,
    continuation: &str,
) -> Result<(Vec<u32>, Vec<u32>), CompressError> {
    let (context, continuation) = split_trailing_space(context, continuation);
    let whole = tokenizer.encode(&format!("{context}{continuation}"), true)?;
    let ctx = tokenizer.encode(&context, true)?;
    let cont = whole.get(ctx.len()..).unwrap_or_default().to_vec();
    Ok((ctx, cont))
}

/// Moves the trailing whitespace of `context` to the front of `continuation`.
fn split_trailing_space(context: &str, continuation: &str) -> (String, String) {
    let kept = context.trim_end();
    (
        kept.to_string(),
        format!("{}{continuation}", &context[kept.len()..]),
    )
}

/// The scores of one question.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct McScores {
    pub line: usize,
    pub gold: usize,
    /// Per choice: the sum of its continuation tokens' log-probabilities (nats).
    pub loglikelihoods: Vec<f64>,
    /// Per choice: its length in bytes (the `acc_norm` divisor).
    pub choice_bytes: Vec<usize>,
    /// Per choice: how many continuation tokens were scored.
    pub choice_tokens: Vec<usize>,
}

impl McScores {
    /// The choice with the largest log-likelihood.
    pub fn prediction(&self) -> usize {
        argmax_first(&self.loglikelihoods).unwrap_or(0)
    }

    /// The choice with the largest log-likelihood per byte.
    pub fn prediction_norm(&self) -> usize {
        let per_byte: Vec<f64> = self
            .loglikelihoods
            .iter()
            .zip(&self.choice_bytes)
            .map(|(&ll, &b)| ll / b.max(1) as f64)
            .collect();
        argmax_first(&per_byte).unwrap_or(0)
    }
}

/// Scores questions against one model, reusing its KV cache.
pub struct McScorer<'a> {
    model: &'a Model,
    tokenizer: &'a Tokenizer,
    kv_dtype: KvDtype,
    /// Grown to the longest question seen (in steps of [`CACHE_STEP`]), never past the
    /// model's context length: a model's full context can take gigabytes of K/V.
    cache: KvCache,
}

/// Granularity of the scorer's cache growth, in positions.
const CACHE_STEP: usize = 512;

impl<'a> McScorer<'a> {
    /// A scorer whose cache is stored as `kv_dtype` on the model's device; questions may be
    /// as long as the model's context.
    pub fn new(
        model: &'a Model,
        tokenizer: &'a Tokenizer,
        kv_dtype: KvDtype,
    ) -> Result<Self, CompressError> {
        let cache = model.try_new_cache(CACHE_STEP, kv_dtype)?;
        Ok(McScorer {
            model,
            tokenizer,
            kv_dtype,
            cache,
        })
    }

    /// The log-likelihood of every choice of `item`. Errors name the item's line: a context
    /// and choice longer than the model's context, a choice that adds no token.
    pub fn score(&mut self, item: &McItem) -> Result<McScores, CompressError> {
        let bad = |message: String| CompressError::BadLine {
            line: item.line,
            message,
        };
        let mut pairs = Vec::with_capacity(item.choices.len());
        for (j, choice) in item.choices.iter().enumerate() {
            let (ctx, cont) = encode_pair(self.tokenizer, &item.context, choice)?;
            if cont.is_empty() {
                return Err(bad(format!("choice {j} ({choice:?}) adds no token")));
            }
            pairs.push((ctx, cont));
        }
        // The context is the same for every choice (it depends on the context string only).
        let mut ctx = pairs[0].0.clone();
        if ctx.is_empty() {
            let prefix = self
                .tokenizer
                .bos_id()
                .or_else(|| self.tokenizer.eos_ids().first().copied())
                .ok_or_else(|| {
                    bad("the context is empty and the model has no BOS or EOS token to stand for it".into())
                })?;
            ctx.push(prefix);
        }
        let limit = self.model.config().context_length;
        let mut longest = 0;
        for (j, (_, cont)) in pairs.iter().enumerate() {
            let needed = ctx.len() + cont.len() - 1;
            if needed > limit {
                return Err(bad(format!(
                    "the context and choice {j} take {needed} tokens, more than the model's context of {limit}"
                )));
            }
            longest = longest.max(needed);
        }
        if longest > self.cache.capacity() {
            let capacity = longest.next_multiple_of(CACHE_STEP).min(limit);
            self.cache = self.model.try_new_cache(capacity, self.kv_dtype)?;
        }
        let vocab = self.model.config().vocab_size;
        self.cache.truncate(0);
        // [1, vocab]: predicts every continuation's first token.
        let last = self.model.forward(&ctx, 0, &mut self.cache, Logits::Last)?;
        let mut loglikelihoods = Vec::with_capacity(pairs.len());
        for (_, cont) in &pairs {
            let mut ll = log_prob(&last, cont[0], ctx.len())?;
            if cont.len() > 1 {
                self.cache.truncate(ctx.len());
                // [cont.len() - 1, vocab]: row i predicts cont[i + 1].
                let rows = self.model.forward(
                    &cont[..cont.len() - 1],
                    ctx.len(),
                    &mut self.cache,
                    Logits::All,
                )?;
                for (i, (row, &target)) in rows.chunks_exact(vocab).zip(&cont[1..]).enumerate() {
                    ll += log_prob(row, target, ctx.len() + 1 + i)?;
                }
            }
            loglikelihoods.push(ll);
        }
        Ok(McScores {
            line: item.line,
            gold: item.gold,
            loglikelihoods,
            choice_bytes: item.choices.iter().map(String::len).collect(),
            choice_tokens: pairs.iter().map(|(_, c)| c.len()).collect(),
        })
    }
}

/// Accuracy over scored questions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct McReport {
    pub count: usize,
    pub acc: f64,
    /// `sqrt(acc (1 - acc) / count)`.
    pub acc_stderr: f64,
    pub acc_norm: f64,
    pub acc_norm_stderr: f64,
}

/// `acc` and `acc_norm` with their standard errors; all zero for no questions.
pub fn summarize(scores: &[McScores]) -> McReport {
    let n = scores.len();
    let rate = |hits: usize| if n == 0 { 0.0 } else { hits as f64 / n as f64 };
    let stderr = |p: f64| {
        if n == 0 {
            0.0
        } else {
            (p * (1.0 - p) / n as f64).sqrt()
        }
    };
    let acc = rate(scores.iter().filter(|s| s.prediction() == s.gold).count());
    let acc_norm = rate(
        scores
            .iter()
            .filter(|s| s.prediction_norm() == s.gold)
            .count(),
    );
    McReport {
        count: n,
        acc,
        acc_stderr: stderr(acc),
        acc_norm,
        acc_norm_stderr: stderr(acc_norm),
    }
}

/// Scores `items` in order; `progress(done, total)` after each. Returns the per-question
/// scores, the summary and the seconds it took.
pub fn evaluate(
    model: &Model,
    tokenizer: &Tokenizer,
    items: &[McItem],
    kv_dtype: KvDtype,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Vec<McScores>, McReport, f64), CompressError> {
    let started = Instant::now();
    let mut scorer = McScorer::new(model, tokenizer, kv_dtype)?;
    let mut scores = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        scores.push(scorer.score(item)?);
        progress(i + 1, items.len());
    }
    let report = summarize(&scores);
    Ok((scores, report, started.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scores(gold: usize, ll: &[f64], bytes: &[usize]) -> McScores {
        McScores {
            line: 1,
            gold,
            loglikelihoods: ll.to_vec(),
            choice_bytes: bytes.to_vec(),
            choice_tokens: vec![1; ll.len()],
        }
    }

    #[test]
    fn acc_and_acc_norm_on_hand_made_scores() {
        let s = vec![
            // acc right; per byte: -1.0, -0.5 → acc_norm picks 1, wrong.
            scores(0, &[-2.0, -3.0], &[2, 6]),
            // acc picks 1 (wrong); per byte -0.4 vs -0.5 → acc_norm picks 0, right.
            scores(0, &[-4.0, -3.0], &[10, 6]),
            // both right.
            scores(2, &[-9.0, -8.0, -1.0], &[3, 3, 3]),
            // tie: first wins, and it is gold.
            scores(0, &[-1.0, -1.0], &[1, 1]),
        ];
        assert_eq!(s[0].prediction(), 0);
        assert_eq!(s[0].prediction_norm(), 1);
        assert_eq!(s[1].prediction(), 1);
        assert_eq!(s[1].prediction_norm(), 0);
        let r = summarize(&s);
        assert_eq!(r.count, 4);
        assert!((r.acc - 0.75).abs() < 1e-12);
        assert!((r.acc_norm - 0.75).abs() < 1e-12);
        assert!((r.acc_stderr - (0.75f64 * 0.25 / 4.0).sqrt()).abs() < 1e-12);
    }

    #[test]
    fn summary_of_nothing_is_zero() {
        let r = summarize(&[]);
        assert_eq!(r.count, 0);
        assert_eq!(r.acc, 0.0);
        assert_eq!(r.acc_stderr, 0.0);
    }

    #[test]
    fn lines_parse_with_every_key_spelling() {
        let text = r#"{"context": "2 + 2 =", "choices": [" 3", " 4"], "gold": 1}

{"query": "Sky:", "choices": [" blue", " green"], "answer": 0}
{"context": "Q", "choices": ["a", "b", "c"], "label": "c"}"#;
        let items = parse_jsonl(text).unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].gold, 1);
        assert_eq!(items[1].line, 3);
        assert_eq!(items[1].context, "Sky:");
        assert_eq!(items[2].gold, 2);
    }

    #[test]
    fn bad_lines_name_their_line_number() {
        let cases = [
            ("not json", "not a JSON object"),
            ("[1, 2]", "expected a JSON object"),
            (r#"{"choices": ["a"], "gold": 0}"#, "missing \"context\""),
            (
                r#"{"context": 3, "choices": ["a"], "gold": 0}"#,
                "must be a string",
            ),
            (r#"{"context": "c", "gold": 0}"#, "missing \"choices\""),
            (r#"{"context": "c", "choices": [], "gold": 0}"#, "is empty"),
            (
                r#"{"context": "c", "choices": ["a", ""], "gold": 0}"#,
                "choice 1 is empty",
            ),
            (
                r#"{"context": "c", "choices": ["a", 1], "gold": 0}"#,
                "choice 1 is not a string",
            ),
            (r#"{"context": "c", "choices": ["a"]}"#, "missing \"gold\""),
            (
                r#"{"context": "c", "choices": ["a"], "gold": 1}"#,
                "not an index",
            ),
            (
                r#"{"context": "c", "choices": ["a"], "gold": -1}"#,
                "not an index",
            ),
            (
                r#"{"context": "c", "choices": ["a"], "gold": "b"}"#,
                "not one of the choices",
            ),
            (
                r#"{"context": "c", "query": "d", "choices": ["a"], "gold": 0}"#,
                "both \"context\" and \"query\"",
            ),
        ];
        for (line, want) in cases {
            let text =
                format!("{{\"context\": \"ok\", \"choices\": [\"x\"], \"gold\": 0}}\n{line}\n");
            let e = parse_jsonl(&text).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, CompressError::BadLine { line: 2, .. }), "{msg}");
            assert!(msg.starts_with("line 2: "), "{msg}");
            assert!(msg.contains(want), "{line}: {msg}");
        }
    }

    #[test]
    fn trailing_space_of_the_context_moves_to_the_choice() {
        assert_eq!(
            split_trailing_space("Answer: ", "Paris"),
            ("Answer:".to_string(), " Paris".to_string())
        );
        assert_eq!(
            split_trailing_space("Answer:", " Paris"),
            ("Answer:".to_string(), " Paris".to_string())
        );
    }
}
