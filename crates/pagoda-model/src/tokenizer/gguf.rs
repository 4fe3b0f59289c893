//! Builds a [`Tokenizer`] from the vocabulary embedded in a GGUF file (`tokenizer.ggml.*`).
//!
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE from `tokens` + `merges`, with the
//!   pre-tokenizer regex chosen by `tokenizer.ggml.pre` (the same regexes llama.cpp's
//!   `llama-vocab.cpp` and the models' own `tokenizer.json` use).
//! - `tokenizer.ggml.model = "llama"`: SentencePiece BPE from `tokens` + `scores`, merges
//!   derived from the scores as Hugging Face's `SentencePieceExtractor` does, byte fallback to
//!   `<0xNN>` tokens, `▁` for spaces, a leading `▁` only when `add_space_prefix`.
//!
//! `token_type` 3 (control) become special added tokens, 4 (user-defined) non-special added
//! tokens matched before the model runs (as llama.cpp does).
//!
//! Invariant: the vocabulary ids are the GGUF array indices (a token repeated in the array
//! keeps its first id); every error names the file and the `tokenizer.ggml.*` key at fault.

use super::Tokenizer;
use crate::gguf::GgufFile;
use crate::ModelError;
use std::collections::HashMap;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

/// llama.cpp token types.
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// GPT-2's pre-tokenizer regex (also `tokenizers`' built-in ByteLevel regex).
pub const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3 (`llama-bpe`): numbers in groups of up to three.
pub const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2: single digits.
pub const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl Tokenizer {
    /// Builds the tokenizer embedded in `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, ModelError> {
        let path = file.path();
        let err = |message: String| ModelError::TokenizerFile {
            path: path.to_path_buf(),
            message,
        };
        let model = file.get_str_opt("tokenizer.ggml.model")?.ok_or_else(|| {
            err("no tokenizer: metadata key \"tokenizer.ggml.model\" is missing".into())
        })?;
        let tokens = file
            .get_str_array_opt("tokenizer.ggml.tokens")?
            .ok_or_else(|| {
                err("no vocabulary: metadata key \"tokenizer.ggml.tokens\" is missing".into())
            })?;
        if tokens.is_empty() {
            return Err(err("\"tokenizer.ggml.tokens\" is empty".into()));
        }
        if tokens.len() > u32::MAX as usize {
            return Err(err("\"tokenizer.ggml.tokens\" has too many entries".into()));
        }
        let types = match file.get_i32_array_opt("tokenizer.ggml.token_type")? {
            Some(t) if t.len() == tokens.len() => t,
            Some(t) => {
                return Err(err(format!(
                    "\"tokenizer.ggml.token_type\" has {} entries for {} tokens",
                    t.len(),
                    tokens.len()
                )))
            }
            None => vec![1; tokens.len()],
        };
        let id_key = |k: &str| -> Result<Option<u32>, ModelError> {
            match file.get_u32_opt(k)? {
                Some(id) if (id as usize) < tokens.len() => Ok(Some(id)),
                Some(id) => Err(err(format!(
                    "{k:?} = {id} is outside the vocabulary of {} tokens",
                    tokens.len()
                ))),
                None => Ok(None),
            }
        };
        let bos_id = id_key("tokenizer.ggml.bos_token_id")?;
        let eos_id = id_key("tokenizer.ggml.eos_token_id")?;
        let eot_id = id_key("tokenizer.ggml.eot_token_id")?;
        let eom_id = id_key("tokenizer.ggml.eom_token_id")?;
        let unk_id = id_key("tokenizer.ggml.unknown_token_id")?;

        let mut vocab: HashMap<String, u32> = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            vocab.entry(t.clone()).or_insert(i as u32);
        }

        let (mut inner, default_add_bos) = match model {
            // llama.cpp's defaults when tokenizer.ggml.add_bos_token is absent: SentencePiece
            // adds BOS; byte-level BPE does not, except the Llama 3 pre-tokenizer.
            "gpt2" => {
                let pre = file.get_str_opt("tokenizer.ggml.pre")?.unwrap_or("default");
                let bos = matches!(pre, "llama-bpe" | "llama3");
                (build_gpt2(file, &vocab, &err)?, bos)
            }
            "llama" => (build_spm(file, tokens, &vocab, unk_id, &err)?, true),
            other => {
                return Err(err(format!(
                "tokenizer model {other:?} (tokenizer.ggml.model) is not supported (gpt2, llama)"
            )))
            }
        };

        let mut added = Vec::new();
        for (i, (t, &ty)) in tokens.iter().zip(&types).enumerate() {
            if vocab.get(t) != Some(&(i as u32)) {
                continue; // a duplicate entry: the first id wins
            }
            match ty {
                TOKEN_TYPE_CONTROL => added.push(AddedToken::from(t.clone(), true)),
                TOKEN_TYPE_USER_DEFINED => {
                    added.push(AddedToken::from(t.clone(), false).normalized(false))
                }
                _ => {}
            }
        }
        inner.add_tokens(&added);

        let add_bos = file
            .get_bool_opt("tokenizer.ggml.add_bos_token")?
            .unwrap_or(default_add_bos);
        let eos_ids: Vec<u32> = [eos_id, eot_id, eom_id].into_iter().flatten().collect();
        let mut tok = Tokenizer::from_parts(inner, bos_id, add_bos, eos_ids);
        tok.set_eos_token(eos_id.map(|id| tokens[id as usize].clone()));
        Ok(tok)
    }
}

fn build_gpt2(
    file: &GgufFile,
    vocab: &HashMap<String, u32>,
    err: &dyn Fn(String) -> ModelError,
) -> Result<tokenizers::Tokenizer, ModelError> {
    let merges_raw = file
        .get_str_array_opt("tokenizer.ggml.merges")?
        .ok_or_else(|| err("byte-level BPE without \"tokenizer.ggml.merges\"".into()))?;
    let mut merges = Vec::with_capacity(merges_raw.len());
    for (i, m) in merges_raw.iter().enumerate() {
        let (a, b) = m.split_once(' ').ok_or_else(|| {
            err(format!("\"tokenizer.ggml.merges\" entry {i} ({m:?}) is not two tokens separated by a space"))
        })?;
        merges.push((a.to_string(), b.to_string()));
    }
    let pre = file.get_str_opt("tokenizer.ggml.pre")?.unwrap_or("default");
    let bpe = BPE::builder()
        .vocab_and_merges(
            vocab
                .iter()
                .map(|(k, &v)| (k.clone(), v))
                .collect::<tokenizers::models::bpe::Vocab>(),
            merges,
        )
        .ignore_merges(pre == "llama-bpe" || pre == "llama3")
        .build()
        .map_err(|e| err(format!("cannot build byte-level BPE: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let byte_level_plain = ByteLevel::default()
        .add_prefix_space(false)
        .use_regex(false);
    let split = |re: &str| -> Result<PreTokenizerWrapper, ModelError> {
        Split::new(
            SplitPattern::Regex(re.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map(PreTokenizerWrapper::Split)
        .map_err(|e| err(format!("bad pre-tokenizer regex: {e}")))
    };
    let pre_tok: PreTokenizerWrapper = match pre {
        // SmolLM's own tokenizer.json: single digits, then GPT-2's regex.
        "smollm" | "starcoder" | "refact" | "codeshell" => PreSequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(
                ByteLevel::default().add_prefix_space(false).use_regex(true),
            ),
        ])
        .into(),
        "qwen2" | "deepseek-r1-qwen" => PreSequence::new(vec![
            split(QWEN2_REGEX)?,
            PreTokenizerWrapper::ByteLevel(byte_level_plain),
        ])
        .into(),
        "llama-bpe" | "llama3" | "smaug-bpe" | "dbrx" => PreSequence::new(vec![
            split(LLAMA3_REGEX)?,
            PreTokenizerWrapper::ByteLevel(byte_level_plain),
        ])
        .into(),
        // "gpt2", "default" and anything unknown: GPT-2's regex.
        _ => PreTokenizerWrapper::ByteLevel(
            ByteLevel::default().add_prefix_space(false).use_regex(true),
        ),
    };
    t.with_pre_tokenizer(Some(pre_tok));
    // No NFC for qwen2 although Qwen's tokenizer.json has it: llama.cpp, the reference for a
    // GGUF, does not normalize, and its ids for "e\u{301}" differ from the NFC ones.
    t.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())));
    Ok(t)
}

fn build_spm(
    file: &GgufFile,
    tokens: &[String],
    vocab: &HashMap<String, u32>,
    unk_id: Option<u32>,
    err: &dyn Fn(String) -> ModelError,
) -> Result<tokenizers::Tokenizer, ModelError> {
    let scores = match file.get_f32_array_opt("tokenizer.ggml.scores")? {
        Some(s) if s.len() == tokens.len() => s,
        Some(s) => {
            return Err(err(format!(
                "\"tokenizer.ggml.scores\" has {} entries for {} tokens",
                s.len(),
                tokens.len()
            )))
        }
        None => {
            return Err(err(
                "SentencePiece vocabulary without \"tokenizer.ggml.scores\"".into(),
            ))
        }
    };
    let merges = spm_merges(tokens, &scores, vocab);
    let mut builder = BPE::builder()
        .vocab_and_merges(
            vocab
                .iter()
                .map(|(k, &v)| (k.clone(), v))
                .collect::<tokenizers::models::bpe::Vocab>(),
            merges,
        )
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(u) = unk_id {
        builder = builder.unk_token(tokens[u as usize].clone());
    }
    let bpe = builder
        .build()
        .map_err(|e| err(format!("cannot build SentencePiece BPE: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let add_space_prefix = file
        .get_bool_opt("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);
    let replace = Replace::new(" ", "▁").map_err(|e| err(e.to_string()))?;
    let normalizer: NormalizerWrapper = if add_space_prefix {
        tokenizers::normalizers::Sequence::new(vec![
            NormalizerWrapper::Prepend(Prepend::new("▁".into())),
            NormalizerWrapper::Replace(replace),
        ])
        .into()
    } else {
        NormalizerWrapper::Replace(replace)
    };
    t.with_normalizer(Some(normalizer));
    let mut decoders = vec![
        DecoderWrapper::Replace(
            tokenizers::normalizers::Replace::new("▁", " ").map_err(|e| err(e.to_string()))?,
        ),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    t.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(
        decoders,
    ))));
    Ok(t)
}

/// Longest piece [`spm_merges`] derives merges for.
pub const MAX_MERGE_PIECE_BYTES: usize = 1024;

/// Merges implied by a SentencePiece vocabulary, ranked by the score of the merged piece
/// (highest first), as `transformers`' `SentencePieceExtractor` derives them: every split of
/// every piece into two pieces that are both in the vocabulary.
pub fn spm_merges(
    tokens: &[String],
    scores: &[f32],
    vocab: &HashMap<String, u32>,
) -> Vec<(String, String)> {
    let mut merges: Vec<(u32, u32, f32, usize)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        // Splitting is quadratic in the piece length; real vocabularies have pieces of a few
        // dozen bytes, so a longer one (a hostile file) is left without merges.
        if piece.len() > MAX_MERGE_PIECE_BYTES || vocab.get(piece) != Some(&(id as u32)) {
            continue;
        }
        let mut local = Vec::new();
        for (split, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(split);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                local.push((li, ri, scores[id], id));
            }
        }
        local.sort_by_key(|&(l, r, _, _)| (l, r));
        merges.extend(local);
    }
    // Stable: equal scores keep vocabulary order.
    merges.sort_by(|a, b| b.2.total_cmp(&a.2));
    merges
        .into_iter()
        .map(|(l, r, _, _)| (tokens[l as usize].clone(), tokens[r as usize].clone()))
        .collect()
}
