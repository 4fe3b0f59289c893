//! Client text kept apart from control tokens: a message that contains `<|im_end|>` must not
//! close its turn.
//!
//! A chat prompt is the template's markup (whose `<|im_start|>`, `<end_of_turn>`, … are meant
//! as control tokens) around text a client wrote (message content, names, tool calls and
//! results, tool definitions). Tokenizing the rendered prompt in one piece would read control
//! tokens out of the client's text too, so a user — or a document a tool returned — could
//! write a system turn. This is what transformers' `split_special_tokens=True` and tiktoken's
//! disallowed-special check guard against.
//!
//! How: before rendering, [`Shield`] replaces every control-token text inside the client's
//! strings by a placeholder (private-use characters around a per-prompt random number and an
//! index). Templates move, trim, slice or JSON-encode client strings as they like; the
//! placeholders survive all of that (they are neither whitespace nor escaped by `tojson`).
//! After rendering, [`Shield::encode`] tokenizes the markup between placeholders with
//! control tokens parsed, and each hidden text with control tokens read as plain text.
//!
//! Invariants: with nothing to hide, `encode` equals [`Tokenizer::encode`] of the same text;
//! a placeholder can only be produced by this shield (the random number is not in the
//! client's hands); hidden text never becomes a control token.

use super::Tokenizer;
use crate::ModelError;
use aho_corasick::{AhoCorasick, MatchKind};
use std::hash::{BuildHasher, Hasher};

const OPEN: char = '\u{E000}';
const MIDDLE: char = '\u{E001}';
const CLOSE: char = '\u{E002}';

/// Finds the control-token texts of one tokenizer (its added tokens marked special).
#[derive(Clone, Debug)]
pub struct ControlTexts {
    finder: Option<AhoCorasick>,
}

impl ControlTexts {
    pub(super) fn new(inner: &tokenizers::Tokenizer) -> ControlTexts {
        let texts: Vec<String> = inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        let finder = if texts.is_empty() {
            None
        } else {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&texts)
                .ok()
        };
        ControlTexts { finder }
    }
}

/// The placeholders of one prompt: what each stands for.
#[derive(Debug)]
pub struct Shield<'t> {
    tokenizer: &'t Tokenizer,
    /// `None`: the operator turned shielding off (control tokens in client text are parsed).
    nonce: Option<String>,
    hidden: Vec<String>,
}

impl<'t> Shield<'t> {
    /// A shield for one prompt (a fresh random number).
    pub fn new(tokenizer: &'t Tokenizer) -> Shield<'t> {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        Shield {
            tokenizer,
            nonce: Some(format!("{:020}", h.finish())),
            hidden: Vec::new(),
        }
    }

    /// A shield that hides nothing: client text is tokenized as the template's markup is
    /// (the operator's unsafe opt-out).
    pub fn off(tokenizer: &'t Tokenizer) -> Shield<'t> {
        Shield {
            tokenizer,
            nonce: None,
            hidden: Vec::new(),
        }
    }

    /// `text` with every control-token text replaced by a placeholder.
    pub fn text(&mut self, text: &str) -> String {
        let (Some(nonce), Some(finder)) = (&self.nonce, &self.tokenizer.control_texts().finder)
        else {
            return text.to_string();
        };
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for m in finder.find_iter(text) {
            out.push_str(&text[last..m.start()]);
            out.push(OPEN);
            out.push_str(nonce);
            out.push(MIDDLE);
            out.push_str(&self.hidden.len().to_string());
            out.push(CLOSE);
            self.hidden.push(text[m.start()..m.end()].to_string());
            last = m.end();
        }
        out.push_str(&text[last..]);
        out
    }

    /// Every string (and object key) in `value`, shielded in place.
    pub fn json(&mut self, value: &mut serde_json::Value) {
        // Iterative: client JSON, whatever its depth.
        let mut pending = vec![value];
        while let Some(v) = pending.pop() {
            match v {
                serde_json::Value::String(s) => *s = self.text(s),
                serde_json::Value::Array(items) => pending.extend(items.iter_mut()),
                serde_json::Value::Object(map) => {
                    let needs_keys = map.keys().any(|k| self.text(k) != *k);
                    if needs_keys {
                        let old = std::mem::take(map);
                        for (k, v) in old {
                            map.insert(self.text(&k), v);
                        }
                    }
                    pending.extend(map.values_mut());
                }
                _ => {}
            }
        }
    }

    /// Whether any control-token text was hidden.
    pub fn hid_anything(&self) -> bool {
        !self.hidden.is_empty()
    }

    /// Tokenizes `rendered` (the template's output): markup with control tokens parsed, each
    /// placeholder as its hidden text read plainly. `add_special_tokens` as in
    /// [`Tokenizer::encode`] (BOS at the start when the model wants it).
    pub fn encode(&self, rendered: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        let Some(nonce) = self.nonce.as_ref().filter(|_| self.hid_anything()) else {
            return self.tokenizer.encode(rendered, add_special_tokens);
        };
        let marker = format!("{OPEN}{nonce}{MIDDLE}");
        let mut ids = Vec::new();
        let mut first = true;
        let mut markup = |ids: &mut Vec<u32>, text: &str| -> Result<(), ModelError> {
            if first {
                first = false;
                ids.extend(self.tokenizer.encode(text, add_special_tokens)?);
            } else if !text.is_empty() {
                ids.extend(self.tokenizer.encode(text, false)?);
            }
            Ok(())
        };
        let (mut markup_from, mut search_from) = (0, 0);
        while let Some(found) = rendered[search_from..].find(&marker) {
            let at = search_from + found;
            let index_from = at + marker.len();
            let ours = rendered[index_from..]
                .split_once(CLOSE)
                .and_then(|(index, _)| {
                    let text = self.hidden.get(index.parse::<usize>().ok()?)?;
                    Some((text, index_from + index.len() + CLOSE.len_utf8()))
                });
            match ours {
                Some((text, end)) => {
                    markup(&mut ids, &rendered[markup_from..at])?;
                    ids.extend(self.tokenizer.encode_plain(text)?);
                    markup_from = end;
                    search_from = end;
                }
                // Not one of ours after all: it stays markup.
                None => search_from = index_from,
            }
        }
        markup(&mut ids, &rendered[markup_from..])?;
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    use tokenizers::AddedToken;

    /// Words a, b, <, |, end, >, and the control token `<|end|>`.
    fn tokenizer() -> Tokenizer {
        let vocab = [
            ("[UNK]", 0),
            ("a", 1),
            ("b", 2),
            ("<|", 3),
            ("end", 4),
            ("|>", 5),
        ]
        .into_iter()
        .map(|(w, i)| (w.to_string(), i))
        .collect();
        let model = WordLevel::builder()
            .vocab(vocab)
            .unk_token("[UNK]".into())
            .build()
            .expect("model");
        let mut inner = tokenizers::Tokenizer::new(model);
        inner.with_pre_tokenizer(Some(Whitespace {}));
        inner.add_special_tokens(&[AddedToken::from("<|end|>", true)]);
        Tokenizer::from_parts(inner, None, false, vec![])
    }

    #[test]
    fn control_text_in_client_strings_is_plain_text() {
        let t = tokenizer();
        let end = t.token_to_id("<|end|>").expect("special");
        let mut shield = Shield::new(&t);
        let client = shield.text("a <|end|> b");
        assert!(!client.contains("<|end|>"));
        let rendered = format!("<|end|> {client} <|end|>");
        let ids = shield.encode(&rendered, true).expect("encodes");
        assert_eq!(ids.iter().filter(|&&i| i == end).count(), 2, "{ids:?}");
        assert_eq!(ids.first(), Some(&end));
        assert_eq!(ids.last(), Some(&end));
        assert!(ids.windows(3).any(|w| w == [3, 4, 5]), "{ids:?}");
    }

    #[test]
    fn nothing_hidden_encodes_as_before_and_off_hides_nothing() {
        let t = tokenizer();
        let mut shield = Shield::new(&t);
        let text = shield.text("a b");
        assert_eq!(text, "a b");
        let rendered = format!("<|end|> {text}");
        assert_eq!(
            shield.encode(&rendered, true).expect("encodes"),
            t.encode(&rendered, true).expect("encodes")
        );
        let mut off = Shield::off(&t);
        let forged = off.text("<|end|>");
        assert_eq!(forged, "<|end|>");
        let end = t.token_to_id("<|end|>").expect("special");
        assert_eq!(off.encode(&forged, false).expect("encodes"), vec![end]);
    }

    #[test]
    fn placeholders_survive_json_and_foreign_markers_stay_text() {
        let t = tokenizer();
        let mut shield = Shield::new(&t);
        let mut v = serde_json::json!({"k<|end|>": ["<|end|>", {"x": "a<|end|>"}]});
        shield.json(&mut v);
        let rendered = serde_json::to_string(&v).expect("json");
        assert!(!rendered.contains("<|end|>"), "{rendered}");
        let end = t.token_to_id("<|end|>").expect("special");
        let ids = shield.encode(&rendered, false).expect("encodes");
        assert!(!ids.contains(&end), "{ids:?}");
        // A client guessing the form of a placeholder gets text, not a hidden token.
        let guess = format!("{OPEN}123{MIDDLE}0{CLOSE}");
        let mut shield = Shield::new(&t);
        let _ = shield.text("<|end|>");
        assert!(!shield
            .encode(&guess, false)
            .expect("encodes")
            .contains(&end));
    }
}
