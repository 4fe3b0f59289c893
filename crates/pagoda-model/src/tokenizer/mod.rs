//! Text <-> token ids: a [`Tokenizer`] wrapping the `tokenizers` crate, built either from a
//! Hugging Face `tokenizer.json` (+ `tokenizer_config.json` / `generation_config.json`) or
//! from the vocabulary embedded in a GGUF file ([`gguf`]), plus an [`IncrementalDecoder`] for
//! streaming.
//!
//! Invariants: `encode(text, true)` starts with BOS exactly when the model asks for it
//! (`tokenizer.ggml.add_bos_token`, the HF post-processor or `add_bos_token`) and never twice;
//! `eos_ids()` is sorted and deduplicated and contains every id that ends a turn;
//! `decode` turns an id outside the vocabulary into U+FFFD instead of silently dropping it
//! (a model's embedding can be wider than its tokenizer, as Qwen2's HF checkpoints are);
//! [`IncrementalDecoder`] only ever emits complete UTF-8 text, and the concatenation of what it
//! emits plus `finish()` equals `decode(all_ids)` (with the same skip-special choice);
//! `encode` returns every token of the text: truncation and padding settings in a
//! tokenizer.json (BERT exports carry `max_length` 128 and fixed padding) are dropped at load,
//! and a caller that needs a length limit applies its own.

pub mod client_text;
pub mod gguf;
pub mod gguf_pre;

pub use client_text::{ControlTexts, Shield};

use crate::ModelError;
use serde_json::Value;
use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;

/// Names of tokens that end a turn in common chat formats; any present in the vocabulary join
/// [`Tokenizer::eos_ids`].
pub const END_OF_TURN_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<|endoftext|>",
];

/// A model's tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    /// Prepend BOS ourselves on `encode(.., true)` (when the inner post-processor does not).
    add_bos: bool,
    eos_ids: Vec<u32>,
    special: HashSet<u32>,
    vocab_size: usize,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// The control-token texts, found in client strings by [`Shield`] (built on first use).
    control: OnceLock<ControlTexts>,
    /// `inner` with control-token texts read as plain text (built on first use).
    plain: OnceLock<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos_id", &self.bos_id)
            .field("add_bos", &self.add_bos)
            .field("eos_ids", &self.eos_ids)
            .finish()
    }
}

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// Wraps a built `tokenizers::Tokenizer`. `add_bos`: prepend `bos_id` on
    /// `encode(.., true)` unless the encoding already starts with it.
    pub fn from_parts(
        inner: tokenizers::Tokenizer,
        bos_id: Option<u32>,
        add_bos: bool,
        eos_ids: Vec<u32>,
    ) -> Tokenizer {
        let vocab_size = inner.get_vocab_size(true);
        let special: HashSet<u32> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        let mut eos_ids = eos_ids;
        for name in END_OF_TURN_TOKENS {
            if let Some(id) = inner.token_to_id(name) {
                eos_ids.push(id);
            }
        }
        eos_ids.sort_unstable();
        eos_ids.dedup();
        let bos_token = bos_id.and_then(|id| inner.id_to_token(id));
        let eos_token = eos_ids.first().and_then(|&id| inner.id_to_token(id));
        Tokenizer {
            inner,
            bos_id,
            add_bos: add_bos && bos_id.is_some(),
            eos_ids,
            special,
            vocab_size,
            bos_token,
            eos_token,
            control: OnceLock::new(),
            plain: OnceLock::new(),
        }
    }

    /// Sets the token text that chat templates see as `eos_token` (default: the first EOS id's).
    pub fn set_eos_token(&mut self, token: Option<String>) {
        self.eos_token = token;
    }

    /// The tokenizer as a Hugging Face `tokenizer.json` (for a tokenizer built from GGUF
    /// metadata: the same model, pre-tokenizer, decoder and added tokens; BOS is not in it —
    /// see [`Tokenizer::adds_bos`]).
    pub fn to_tokenizer_json(&self) -> Result<String, ModelError> {
        self.inner.to_string(true).map_err(tok_err)
    }

    /// Builds from a `tokenizer.json` alone (BOS/EOS as its post-processor and vocabulary say).
    pub fn from_tokenizer_json(path: &Path) -> Result<Tokenizer, ModelError> {
        Self::from_hf_files(path, None, None, None)
    }

    /// Builds from a Hugging Face `tokenizer.json`, with the optional `tokenizer_config.json`
    /// (`add_bos_token`, `bos_token`, `eos_token`), `generation_config.json` and `config.json`
    /// (`eos_token_id`, a number or a list).
    pub fn from_hf_files(
        tokenizer_json: &Path,
        tokenizer_config: Option<&Value>,
        generation_config: Option<&Value>,
        model_config: Option<&Value>,
    ) -> Result<Tokenizer, ModelError> {
        let bytes = std::fs::read(tokenizer_json).map_err(|source| ModelError::Io {
            path: tokenizer_json.to_path_buf(),
            source,
        })?;
        let mut inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| ModelError::TokenizerFile {
                path: tokenizer_json.to_path_buf(),
                message: e.to_string(),
            })?;
        inner
            .with_truncation(None)
            .map_err(|e| ModelError::TokenizerFile {
                path: tokenizer_json.to_path_buf(),
                message: e.to_string(),
            })?;
        inner.with_padding(None);
        let token_text = |v: &Value| -> Option<String> {
            match v {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
                _ => None,
            }
        };
        let tc = tokenizer_config.and_then(Value::as_object);
        let bos_text = tc.and_then(|o| o.get("bos_token")).and_then(token_text);
        let eos_text = tc.and_then(|o| o.get("eos_token")).and_then(token_text);
        let cfg_id = |v: Option<&Value>, key: &str| -> Option<u32> {
            v.and_then(|v| v.get(key))
                .and_then(Value::as_u64)
                .and_then(|x| u32::try_from(x).ok())
        };
        let bos_id = bos_text
            .as_deref()
            .and_then(|t| inner.token_to_id(t))
            .or_else(|| cfg_id(generation_config, "bos_token_id"))
            .or_else(|| cfg_id(model_config, "bos_token_id"));
        // add_bos_token in tokenizer_config is honoured on top of the post-processor; without
        // it, the post-processor alone decides (it is what `encode(.., true)` runs).
        let add_bos = tc
            .and_then(|o| o.get("add_bos_token"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut eos_ids = Vec::new();
        if let Some(id) = eos_text.as_deref().and_then(|t| inner.token_to_id(t)) {
            eos_ids.push(id);
        }
        for v in [generation_config, model_config].into_iter().flatten() {
            match v.get("eos_token_id") {
                Some(Value::Number(n)) => {
                    eos_ids.extend(n.as_u64().and_then(|x| u32::try_from(x).ok()))
                }
                Some(Value::Array(a)) => eos_ids.extend(
                    a.iter()
                        .filter_map(Value::as_u64)
                        .filter_map(|x| u32::try_from(x).ok()),
                ),
                _ => {}
            }
        }
        let mut t = Tokenizer::from_parts(inner, bos_id, add_bos, eos_ids);
        if eos_text.is_some() {
            t.eos_token = eos_text;
        }
        if bos_text.is_some() {
            t.bos_token = bos_text;
        }
        Ok(t)
    }

    /// Token ids of `text`. With `add_special_tokens`, BOS is added when the model wants it.
    /// Special-token text in `text` (e.g. `<|im_start|>`) always maps to its id.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(tok_err)?;
        let ids = enc.get_ids();
        match self.bos_id {
            Some(bos) if add_special_tokens && self.add_bos && ids.first() != Some(&bos) => {
                let mut v = Vec::with_capacity(ids.len() + 1);
                v.push(bos);
                v.extend_from_slice(ids);
                Ok(v)
            }
            _ => Ok(ids.to_vec()),
        }
    }

    /// Token ids of `text` with control-token texts read as ordinary text (`<|im_end|>` as
    /// `<`, `|`, `im`, …), as transformers' `split_special_tokens=True` does; no BOS.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let plain = self.plain.get_or_init(|| {
            let mut plain = self.inner.clone();
            plain.set_encode_special_tokens(true);
            plain
        });
        Ok(plain
            .encode_fast(text, false)
            .map_err(tok_err)?
            .get_ids()
            .to_vec())
    }

    /// The texts of this tokenizer's control tokens, for [`Shield`].
    pub fn control_texts(&self) -> &ControlTexts {
        self.control.get_or_init(|| ControlTexts::new(&self.inner))
    }

    /// Text of `ids`; with `skip_special_tokens`, control tokens (BOS, EOS, turn markers) are
    /// left out. An id the tokenizer does not know (padding rows of a wider embedding) comes out
    /// as U+FFFD, so a rare sample never aborts a stream.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ModelError> {
        let known = |id: u32| (id as usize) < self.vocab_size;
        if ids.iter().all(|&id| known(id)) {
            return self.inner.decode(ids, skip_special_tokens).map_err(tok_err);
        }
        let mut out = String::new();
        for run in ids.split_inclusive(|&id| !known(id)) {
            let (valid, bad) = match run.split_last() {
                Some((&last, rest)) if !known(last) => (rest, true),
                _ => (run, false),
            };
            if !valid.is_empty() {
                out.push_str(
                    &self
                        .inner
                        .decode(valid, skip_special_tokens)
                        .map_err(tok_err)?,
                );
            }
            if bad {
                out.push('\u{FFFD}');
            }
        }
        Ok(out)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Does `encode(.., true)` prepend BOS (beyond what the inner post-processor does)?
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Every id that ends generation: EOS and end-of-turn tokens, sorted.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// BOS token text, for chat templates.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// EOS token text, for chat templates.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Number of ids (model vocabulary plus added tokens).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Is `id` a special (control) token?
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Turns a stream of token ids into text pieces, holding back bytes of an incomplete UTF-8
/// character (byte-fallback tokens, byte-level BPE) until the character is complete.
///
/// Works like text-generation-inference's decoder: it re-decodes a short window of recent
/// tokens, so that tokenizers whose decoding depends on context (SentencePiece's leading `▁`)
/// come out the same as decoding everything at once.
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the window re-decoded for context.
    prefix: usize,
    /// Tokens before this index have been emitted.
    read: usize,
    keep_special: bool,
}

impl IncrementalDecoder {
    /// A decoder that leaves special tokens out of the text.
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that keeps (`true`) or skips special tokens.
    pub fn with_special_tokens(keep_special: bool) -> Self {
        IncrementalDecoder {
            keep_special,
            ..Self::default()
        }
    }

    /// Adds `id`; returns the new complete text, if any.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>, ModelError> {
        self.ids.push(id);
        let skip = !self.keep_special;
        let before = tok.decode(&self.ids[self.prefix..self.read], skip)?;
        let now = tok.decode(&self.ids[self.prefix..], skip)?;
        let pending = self.ids.len() - self.read;
        // A model can emit bytes that never complete a character; after a few tokens the
        // replacement character is emitted rather than re-decoding an ever longer window.
        let complete = !now.ends_with('\u{FFFD}') || pending >= MAX_PENDING_TOKENS;
        if now.len() > before.len() && complete {
            let piece = if now.is_char_boundary(before.len()) && now.starts_with(&before) {
                now[before.len()..].to_string()
            } else {
                // The window's text changed shape (rare); emit past the common prefix.
                now[common_prefix_len(&before, &now)..].to_string()
            };
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(Some(piece))
        } else {
            Ok(None)
        }
    }

    /// Text still held back (an incomplete character at the end of the stream comes out as
    /// U+FFFD, as a full decode would give).
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String, ModelError> {
        let skip = !self.keep_special;
        let before = tok.decode(&self.ids[self.prefix..self.read], skip)?;
        let now = tok.decode(&self.ids[self.prefix..], skip)?;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        if now.len() > before.len()
            && now.is_char_boundary(before.len())
            && now.starts_with(&before)
        {
            Ok(now[before.len()..].to_string())
        } else {
            let common = common_prefix_len(&before, &now);
            Ok(now[common..].to_string())
        }
    }

    /// Every id pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

/// Tokens [`IncrementalDecoder`] holds back at most while waiting for a character to complete
/// (a UTF-8 character is at most 4 bytes, so 4 byte tokens; the rest is slack).
pub const MAX_PENDING_TOKENS: usize = 8;

fn common_prefix_len(a: &str, b: &str) -> usize {
    let mut n = 0;
    for ((i, ca), cb) in a.char_indices().zip(b.chars()) {
        if ca != cb {
            return i;
        }
        n = i + ca.len_utf8();
    }
    n
}
