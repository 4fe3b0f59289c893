//! Blind side-by-side comparison of two model variants: the prompt set, the per-prompt
//! left/right shuffle, the key that undoes it, and the picks a person makes on the page
//! ([`super::compare_page`] renders it).
//!
//! The flow: [`parse_prompts`] reads the prompts; the caller generates variant A's and
//! variant B's answer to each; [`Comparison::new`] flips a seeded coin per prompt to put A on
//! the left or the right; the page shows only "Left" and "Right", and the [`CompareKey`]
//! (written next to it, never into it) records which variant each side was. The page exports
//! [`Picks`]; [`CompareKey::outcomes`] maps them back to A/B outcomes for
//! [`super::winrate`].
//!
//! Invariants: prompt ids are unique and non-empty; the key and the page carry the same
//! `compare_id` (a hash of the seed, prompts and answers), so picks of another comparison are
//! refused; a pick naming an unknown id, the same id twice, or another choice than
//! `left`/`right`/`tie` is an error naming it, never silently dropped.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::winrate::{Outcome, SplitMix64};
use crate::CompressError;

/// Version of the key and picks files.
pub const FORMAT_VERSION: u32 = 1;

/// One prompt of the set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComparePrompt {
    /// Unique id: the JSONL `id` field, else the 1-based line number.
    pub id: String,
    pub prompt: String,
}

/// Format of a prompts file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptsFormat {
    /// One JSON object per line: `{"prompt": "..."}` (or `"question"`/`"text"`), optional
    /// `"id"` (string or number).
    Jsonl,
    /// One prompt per non-blank line.
    Text,
}

impl PromptsFormat {
    /// JSONL for `.jsonl`/`.json` files, text otherwise.
    pub fn from_path(path: &std::path::Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("jsonl") || e.eq_ignore_ascii_case("json") => {
                PromptsFormat::Jsonl
            }
            _ => PromptsFormat::Text,
        }
    }
}

/// Parses a prompt set; an empty set, a blank prompt, a bad line or a repeated id is an error.
pub fn parse_prompts(
    text: &str,
    format: PromptsFormat,
) -> Result<Vec<ComparePrompt>, CompressError> {
    let prompts = match format {
        PromptsFormat::Text => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| ComparePrompt {
                id: (i + 1).to_string(),
                prompt: l.trim_end_matches('\r').to_string(),
            })
            .collect(),
        PromptsFormat::Jsonl => super::parse_jsonl_with(text, parse_prompt_line)?,
    };
    if prompts.is_empty() {
        return Err(CompressError::InvalidInput(
            "the prompt set is empty (one prompt per line, or one JSON object per line in a \
             .jsonl file)"
                .into(),
        ));
    }
    let mut seen = HashSet::new();
    for p in &prompts {
        if !seen.insert(p.id.as_str()) {
            return Err(CompressError::InvalidInput(format!(
                "prompt id {:?} appears more than once; ids must be unique",
                p.id
            )));
        }
    }
    Ok(prompts)
}

fn parse_prompt_line(line: &str, number: usize) -> Result<ComparePrompt, CompressError> {
    let bad = |message: String| CompressError::BadLine {
        line: number,
        message,
    };
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| bad("expected a JSON object like {\"prompt\": \"...\"}".into()))?;
    let prompt = ["prompt", "question", "text"]
        .iter()
        .find_map(|k| obj.get(*k))
        .ok_or_else(|| bad("no \"prompt\" field".into()))?
        .as_str()
        .ok_or_else(|| bad("\"prompt\" must be a string".into()))?;
    if prompt.trim().is_empty() {
        return Err(bad("the prompt is empty".into()));
    }
    let id = match obj.get("id") {
        None => number.to_string(),
        Some(serde_json::Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        Some(_) => return Err(bad("\"id\" must be a non-empty string or a number".into())),
    };
    Ok(ComparePrompt {
        id,
        prompt: prompt.to_string(),
    })
}

/// A variant: a model and how it was loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variant {
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize: Option<String>,
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.quantize {
            Some(q) => write!(f, "{} --quantize {q}", self.model),
            None => write!(f, "{}", self.model),
        }
    }
}

/// Which variant a side shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    A,
    B,
}

/// One prompt as shown: its answers already put left and right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompareItem {
    pub id: String,
    pub prompt: String,
    pub left: String,
    pub right: String,
}

/// One prompt's entry in the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyItem {
    pub id: String,
    /// The variant shown on the left (the other is on the right).
    pub left: Side,
}

/// How the answers were generated (the same for both variants).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationSettings {
    pub max_tokens: usize,
    pub temperature: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_seed: Option<u64>,
}

/// The sidecar key: which variant was on which side, per prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareKey {
    pub version: u32,
    pub compare_id: String,
    /// Seed of the left/right shuffle.
    pub seed: u64,
    pub variant_a: Variant,
    pub variant_b: Variant,
    pub generation: GenerationSettings,
    pub items: Vec<KeyItem>,
}

/// A comparison ready to render: the shown items and the key.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub items: Vec<CompareItem>,
    pub key: CompareKey,
}

impl Comparison {
    /// Shuffles sides with `seed`: per prompt, a fair coin from a SplitMix64 stream puts A on
    /// the left or the right. `answers_a[i]`/`answers_b[i]` answer `prompts[i]`.
    pub fn new(
        prompts: &[ComparePrompt],
        answers_a: &[String],
        answers_b: &[String],
        variant_a: Variant,
        variant_b: Variant,
        generation: GenerationSettings,
        seed: u64,
    ) -> Result<Self, CompressError> {
        if answers_a.len() != prompts.len() || answers_b.len() != prompts.len() {
            return Err(CompressError::InvalidInput(format!(
                "{} prompts but {} and {} answers",
                prompts.len(),
                answers_a.len(),
                answers_b.len()
            )));
        }
        let mut rng = SplitMix64::new(seed);
        let mut hash = Fnv64::new();
        hash.write(&seed.to_le_bytes());
        let mut items = Vec::with_capacity(prompts.len());
        let mut key_items = Vec::with_capacity(prompts.len());
        for ((p, a), b) in prompts.iter().zip(answers_a).zip(answers_b) {
            let left = if rng.next_u64() >> 63 == 0 {
                Side::A
            } else {
                Side::B
            };
            let (l, r) = match left {
                Side::A => (a, b),
                Side::B => (b, a),
            };
            for s in [&p.id, &p.prompt, l, r] {
                hash.write(s.as_bytes());
                hash.write(&[0xff]);
            }
            items.push(CompareItem {
                id: p.id.clone(),
                prompt: p.prompt.clone(),
                left: l.clone(),
                right: r.clone(),
            });
            key_items.push(KeyItem {
                id: p.id.clone(),
                left,
            });
        }
        let key = CompareKey {
            version: FORMAT_VERSION,
            compare_id: format!("{:016x}", hash.finish()),
            seed,
            variant_a,
            variant_b,
            generation,
            items: key_items,
        };
        Ok(Comparison { items, key })
    }
}

/// FNV-1a, 64-bit: a stable fingerprint (not a secret) tying picks to their comparison.
struct Fnv64(u64);

impl Fnv64 {
    fn new() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A person's choice for one prompt, as the page exports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Choice {
    Left,
    Right,
    Tie,
}

/// One pick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pick {
    pub id: String,
    pub pick: Choice,
}

/// The file the page's "Export picks" button downloads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Picks {
    pub version: u32,
    pub compare_id: String,
    pub picks: Vec<Pick>,
}

impl Picks {
    /// Parses an exported picks file; malformed JSON or a wrong field is an error naming it.
    pub fn parse(text: &str) -> Result<Self, CompressError> {
        let picks: Picks = serde_json::from_str(text).map_err(|e| {
            CompressError::InvalidInput(format!(
                "not a picks file ({e}); expected {{\"version\": 1, \"compare_id\": ..., \
                 \"picks\": [{{\"id\": ..., \"pick\": \"left\"|\"right\"|\"tie\"}}]}}"
            ))
        })?;
        if picks.version != FORMAT_VERSION {
            return Err(CompressError::InvalidInput(format!(
                "picks file version {} is not supported (expected {FORMAT_VERSION})",
                picks.version
            )));
        }
        Ok(picks)
    }
}

impl CompareKey {
    /// Parses a key file.
    pub fn parse(text: &str) -> Result<Self, CompressError> {
        let key: CompareKey = serde_json::from_str(text)
            .map_err(|e| CompressError::InvalidInput(format!("not a compare key file ({e})")))?;
        if key.version != FORMAT_VERSION {
            return Err(CompressError::InvalidInput(format!(
                "key file version {} is not supported (expected {FORMAT_VERSION})",
                key.version
            )));
        }
        Ok(key)
    }

    /// Maps picks to A/B outcomes in pick order; also returns how many prompts were left
    /// unjudged. Errors: another comparison's picks, an unknown id, an id picked twice.
    pub fn outcomes(&self, picks: &Picks) -> Result<(Vec<Outcome>, usize), CompressError> {
        if picks.compare_id != self.compare_id {
            return Err(CompressError::InvalidInput(format!(
                "the picks are for comparison {:?} but the key is for {:?}: wrong key or picks file",
                picks.compare_id, self.compare_id
            )));
        }
        let sides: HashMap<&str, Side> =
            self.items.iter().map(|i| (i.id.as_str(), i.left)).collect();
        let mut seen = HashSet::new();
        let mut outcomes = Vec::with_capacity(picks.picks.len());
        for p in &picks.picks {
            let left = *sides.get(p.id.as_str()).ok_or_else(|| {
                CompressError::InvalidInput(format!(
                    "pick for prompt id {:?}, which the key does not have",
                    p.id
                ))
            })?;
            if !seen.insert(p.id.as_str()) {
                return Err(CompressError::InvalidInput(format!(
                    "prompt id {:?} is picked more than once",
                    p.id
                )));
            }
            outcomes.push(match (p.pick, left) {
                (Choice::Tie, _) => Outcome::Tie,
                (Choice::Left, Side::A) | (Choice::Right, Side::B) => Outcome::AWins,
                (Choice::Left, Side::B) | (Choice::Right, Side::A) => Outcome::BWins,
            });
        }
        Ok((outcomes, self.items.len() - seen.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompts(n: usize) -> Vec<ComparePrompt> {
        (1..=n)
            .map(|i| ComparePrompt {
                id: i.to_string(),
                prompt: format!("q{i}"),
            })
            .collect()
    }

    fn settings() -> GenerationSettings {
        GenerationSettings {
            max_tokens: 8,
            temperature: 0.0,
            sampling_seed: None,
        }
    }

    fn comparison(n: usize, seed: u64) -> Comparison {
        let a: Vec<String> = (1..=n).map(|i| format!("A{i}")).collect();
        let b: Vec<String> = (1..=n).map(|i| format!("B{i}")).collect();
        let va = Variant {
            model: "m".into(),
            quantize: None,
        };
        let vb = Variant {
            model: "m".into(),
            quantize: Some("q4_0".into()),
        };
        Comparison::new(&prompts(n), &a, &b, va, vb, settings(), seed).unwrap()
    }

    #[test]
    fn prompts_parse_from_text_and_jsonl() {
        let p = parse_prompts("first\n\n  \nsecond\n", PromptsFormat::Text).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!((p[1].id.as_str(), p[1].prompt.as_str()), ("4", "second"));
        let p = parse_prompts(
            "{\"prompt\": \"a\", \"id\": \"x\"}\n{\"question\": \"b\", \"id\": 7}\n{\"text\": \"c\"}\n",
            PromptsFormat::Jsonl,
        )
        .unwrap();
        let ids: Vec<_> = p.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["x", "7", "3"]);
    }

    #[test]
    fn bad_prompt_sets_are_errors() {
        for (text, format, needle) in [
            ("", PromptsFormat::Text, "empty"),
            ("\n \n", PromptsFormat::Jsonl, "empty"),
            (
                "{\"prompt\": \"a\"}\nnot json\n",
                PromptsFormat::Jsonl,
                "line 2",
            ),
            (
                "{\"answer\": \"a\"}\n",
                PromptsFormat::Jsonl,
                "no \"prompt\"",
            ),
            ("{\"prompt\": \" \"}\n", PromptsFormat::Jsonl, "empty"),
            (
                "{\"prompt\": \"a\", \"id\": 1}\n{\"prompt\": \"b\", \"id\": \"1\"}",
                PromptsFormat::Jsonl,
                "more than once",
            ),
        ] {
            let e = parse_prompts(text, format).unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn sides_are_shuffled_by_seed_and_the_key_undoes_it() {
        let c = comparison(64, 3);
        let lefts_a = c.key.items.iter().filter(|i| i.left == Side::A).count();
        assert!((16..=48).contains(&lefts_a), "a fair coin: {lefts_a} of 64");
        for (item, k) in c.items.iter().zip(&c.key.items) {
            let expect_a = format!("A{}", item.id);
            let shown_a = if k.left == Side::A {
                &item.left
            } else {
                &item.right
            };
            assert_eq!(shown_a, &expect_a);
        }
        // Same seed, same shuffle and id; another seed, another.
        let again = comparison(64, 3);
        assert_eq!(again.key, c.key);
        let other = comparison(64, 4);
        assert_ne!(other.key.items, c.key.items);
        assert_ne!(other.key.compare_id, c.key.compare_id);
    }

    #[test]
    fn picks_map_back_to_variants() {
        let c = comparison(4, 9);
        // Pick A's side on 1 and 2, B's on 3, tie on 4.
        let side_of = |id: &str, want: Side| {
            let k = c.key.items.iter().find(|k| k.id == id).unwrap();
            if k.left == want {
                Choice::Left
            } else {
                Choice::Right
            }
        };
        let picks = Picks {
            version: 1,
            compare_id: c.key.compare_id.clone(),
            picks: vec![
                Pick {
                    id: "1".into(),
                    pick: side_of("1", Side::A),
                },
                Pick {
                    id: "2".into(),
                    pick: side_of("2", Side::A),
                },
                Pick {
                    id: "3".into(),
                    pick: side_of("3", Side::B),
                },
            ],
        };
        let (o, unjudged) = c.key.outcomes(&picks).unwrap();
        assert_eq!(o, [Outcome::AWins, Outcome::AWins, Outcome::BWins]);
        assert_eq!(unjudged, 1);
        // The key survives a JSON round trip.
        let text = serde_json::to_string(&c.key).unwrap();
        assert_eq!(CompareKey::parse(&text).unwrap(), c.key);
        let mut tie = picks.clone();
        tie.picks.push(Pick {
            id: "4".into(),
            pick: Choice::Tie,
        });
        assert_eq!(c.key.outcomes(&tie).unwrap().0[3], Outcome::Tie);
    }

    #[test]
    fn picks_that_do_not_match_the_key_are_errors() {
        let c = comparison(3, 1);
        let with = |picks: Vec<(&str, Choice)>, id: &str| Picks {
            version: 1,
            compare_id: id.to_string(),
            picks: picks
                .into_iter()
                .map(|(i, p)| Pick {
                    id: i.into(),
                    pick: p,
                })
                .collect(),
        };
        let id = c.key.compare_id.clone();
        let e = c
            .key
            .outcomes(&with(vec![("9", Choice::Left)], &id))
            .unwrap_err();
        assert!(e.to_string().contains("\"9\""), "{e}");
        let e = c
            .key
            .outcomes(&with(vec![("1", Choice::Left), ("1", Choice::Tie)], &id))
            .unwrap_err();
        assert!(e.to_string().contains("more than once"), "{e}");
        let e = c.key.outcomes(&with(vec![], "0000")).unwrap_err();
        assert!(e.to_string().contains("wrong key"), "{e}");
        for bad in [
            "{",
            "[]",
            "{\"version\": 1, \"compare_id\": \"x\", \"picks\": [{\"id\": \"1\", \"pick\": \"up\"}]}",
            "{\"version\": 2, \"compare_id\": \"x\", \"picks\": []}",
        ] {
            assert!(Picks::parse(bad).is_err(), "{bad}");
        }
    }
}
