//! Text to encoder input: the model's [`Tokenizer`] with [CLS]/[SEP] added by its
//! post-processor, truncated to the encoder's `max_seq_len` the way Hugging Face tokenizers
//! (and so sentence-transformers) truncate: the text's own tokens are cut to
//! `max_seq_len - added special tokens` first, then the special tokens are added.
//!
//! Invariants: the result is never longer than `max_seq_len`; `truncated` is true exactly when
//! tokens of the text were dropped; an empty text still gives the special tokens alone
//! ([CLS][SEP] for BERT); for a text that fits, the ids equal `tokenizer.encode(text, true)`
//! (for tokenizers whose post-processor adds the special tokens, as BERT's does).

use crate::tokenizer::Tokenizer;
use crate::ModelError;
use tokenizers::{PostProcessor, TruncationDirection};

/// One text as the encoder sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedText {
    pub ids: Vec<u32>,
    /// Tokens of the text were dropped to fit `max_seq_len`.
    pub truncated: bool,
}

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

/// `text` tokenized with special tokens and truncated to `max_seq_len` tokens.
pub fn encode_truncated(
    tokenizer: &Tokenizer,
    text: &str,
    max_seq_len: usize,
) -> Result<EncodedText, ModelError> {
    let inner = tokenizer.inner();
    let mut enc = inner.encode_fast(text, false).map_err(tok_err)?;
    let added = inner
        .get_post_processor()
        .map_or(0, |p| p.added_tokens(false));
    let budget = max_seq_len.saturating_sub(added);
    let truncated = enc.len() > budget;
    if truncated {
        enc.truncate(budget, 0, TruncationDirection::Right);
    }
    let enc = inner.post_process(enc, None, true).map_err(tok_err)?;
    let mut ids = enc.get_ids().to_vec();
    // A post-processor that adds more than it declares must still not overflow the encoder.
    let truncated = truncated || ids.len() > max_seq_len;
    ids.truncate(max_seq_len);
    Ok(EncodedText { ids, truncated })
}
