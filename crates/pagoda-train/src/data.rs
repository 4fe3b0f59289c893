//! Training data: JSONL files read into examples, tokenized with the student's tokenizer
//! and chat template, truncated to the sequence length, and split into training and
//! held-out sequences.
//!
//! A line is `{"text": "..."}` or `{"messages": [{"role": ..., "content": ...}, ...]}` (a
//! conversation, rendered with the model's chat template without a generation prompt, as
//! the runtime renders chats: one BOS when the tokenizer adds one and the template writes
//! it too). Blank lines are skipped. Each example is one sequence, **truncated** to
//! `--seq-len` tokens (not packed: a sequence never attends across examples, and the
//! teacher's labels are per example); a batch pads its shorter rows at the end.
//!
//! Invariants: a malformed line is an error naming the file and its 1-based line number;
//! an empty file, or one with no usable example, is an error naming the file; the split is
//! a function of the seed only and returns indices, so the data (and the teacher's labels
//! of it) stay in file order whatever the seed.

use std::path::Path;

use pagoda_model::chat_template::{ChatMessage, ChatTemplate};
use pagoda_model::tokenizer::Tokenizer;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Deserialize;

use crate::error::{Result, TrainError};

/// One training example.
#[derive(Debug, Clone, PartialEq)]
pub enum Example {
    Text(String),
    Chat(Vec<ChatMessage>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    text: Option<String>,
    messages: Option<Vec<Message>>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

/// Reads a JSONL file of examples.
pub fn read_jsonl(path: &Path) -> Result<Vec<Example>> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            TrainError::Data(format!("data file {} does not exist", path.display()))
        }
        _ => TrainError::io(path, e),
    })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: String| {
            TrainError::Data(format!(
                "{}:{}: {why}; each line must be {{\"text\": \"...\"}} or {{\"messages\": \
                 [{{\"role\": \"user\", \"content\": \"...\"}}, ...]}}",
                path.display(),
                i + 1
            ))
        };
        let parsed: Line =
            serde_json::from_str(line).map_err(|e| bad(format!("not a valid example ({e})")))?;
        let example = match (parsed.text, parsed.messages) {
            (Some(t), None) if !t.is_empty() => Example::Text(t),
            (Some(_), None) => return Err(bad("the text is empty".into())),
            (None, Some(m)) if !m.is_empty() => Example::Chat(
                m.into_iter()
                    .map(|m| ChatMessage::new(m.role, m.content))
                    .collect(),
            ),
            (None, Some(_)) => return Err(bad("the conversation has no messages".into())),
            (Some(_), Some(_)) => return Err(bad("both \"text\" and \"messages\"".into())),
            (None, None) => return Err(bad("neither \"text\" nor \"messages\"".into())),
        };
        out.push(example);
    }
    if out.is_empty() {
        return Err(TrainError::Data(format!(
            "data file {} holds no example",
            path.display()
        )));
    }
    Ok(out)
}

/// Turns examples into token ids as the model sees them.
pub struct Encoder<'a> {
    pub tokenizer: &'a Tokenizer,
    pub template: &'a ChatTemplate,
}

impl Encoder<'_> {
    /// Text with markup already in it, tokenized with one BOS at most.
    pub fn encode_rendered(&self, text: &str) -> Result<Vec<u32>> {
        let mut tokens = self.tokenizer.encode(text, true)?;
        if let Some(bos) = self.tokenizer.bos_id() {
            if tokens.len() >= 2 && tokens[0] == bos && tokens[1] == bos {
                tokens.remove(0);
            }
        }
        Ok(tokens)
    }

    /// One example's ids, at most `seq_len` (the first ones).
    pub fn encode(&self, example: &Example, seq_len: usize) -> Result<Vec<u32>> {
        let mut ids = match example {
            Example::Text(t) => self.encode_rendered(t)?,
            Example::Chat(m) => self.encode_rendered(&self.template.render(m, false)?)?,
        };
        ids.truncate(seq_len);
        Ok(ids)
    }

    /// Every example's ids (see [`Encoder::encode`]); examples that give no token are
    /// dropped.
    pub fn encode_all(&self, examples: &[Example], seq_len: usize) -> Result<Vec<Vec<u32>>> {
        let mut out = Vec::with_capacity(examples.len());
        for e in examples {
            let ids = self.encode(e, seq_len)?;
            if !ids.is_empty() {
                out.push(ids);
            }
        }
        Ok(out)
    }
}

/// Splits `n` sequences into (training, held-out) indices, each in data order:
/// `fraction` of them held out (at least one when the fraction is positive and two or more
/// sequences exist; never all), chosen by `seed`.
pub fn split(n: usize, fraction: f64, seed: u64) -> Result<(Vec<usize>, Vec<usize>)> {
    if !(0.0..1.0).contains(&fraction) {
        return Err(TrainError::InvalidOption(format!(
            "--held-out-fraction must be in [0, 1), not {fraction}"
        )));
    }
    let mut held = ((n as f64) * fraction).ceil() as usize;
    if fraction > 0.0 && n >= 2 {
        held = held.clamp(1, n - 1);
    } else if n < 2 {
        held = 0;
    }
    let mut idx: Vec<usize> = (0..n).collect();
    idx.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed ^ 0x6865_6c64));
    let mut is_held = vec![false; n];
    for &i in &idx[..held] {
        is_held[i] = true;
    }
    Ok((0..n).partition(|&i| !is_held[i]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_line_is_named() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("d.jsonl");
        std::fs::write(&p, "{\"text\": \"a\"}\n\n{\"text\": 3}\n").expect("write");
        let e = read_jsonl(&p).expect_err("bad").to_string();
        assert!(e.contains("d.jsonl:3:"), "{e}");
        std::fs::write(
            &p,
            "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n{\"txt\": \"a\"}\n",
        )
        .expect("write");
        let e = read_jsonl(&p).expect_err("bad").to_string();
        assert!(e.contains("d.jsonl:2:"), "{e}");
        let e = read_jsonl(&dir.path().join("none.jsonl"))
            .expect_err("missing")
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn split_is_seeded_and_keeps_both_sides() {
        let (a, b) = split(20, 0.05, 1).expect("split");
        assert_eq!((a.len(), b.len()), (19, 1));
        let (c, d) = split(20, 0.05, 1).expect("split");
        assert_eq!((a, b), (c, d));
        let (e, f) = split(20, 0.0, 1).expect("split");
        assert_eq!((e.len(), f.len()), (20, 0));
        assert!(split(20, 1.0, 1).is_err());
    }
}
