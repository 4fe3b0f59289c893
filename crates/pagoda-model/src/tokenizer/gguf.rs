//! Builds a [`Tokenizer`] from the vocabulary embedded in a GGUF file (`tokenizer.ggml.*`).
//!
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE from `tokens` + `merges`, split first by
//!   the pre-tokenizer `tokenizer.ggml.pre` names ([`super::gguf_pre`]: llama.cpp's regexes;
//!   a missing key is llama.cpp's `default`; a name Pagoda does not implement is refused).
//! - `tokenizer.ggml.model = "llama"`: SentencePiece BPE from `tokens` + `scores`, merges
//!   derived from the scores as Hugging Face's `SentencePieceExtractor` does, byte fallback to
//!   `<0xNN>` tokens, `▁` for spaces, a leading `▁` only when `add_space_prefix`.
//! - `tokenizer.ggml.model = "gemma4"`: BPE on raw UTF-8 from `tokens` + `merges` (Gemma 4),
//!   spaces as `▁`, the text split only into runs of newlines and runs of anything else,
//!   byte fallback to `<0xNN>` tokens. (llama.cpp takes a run of newlines that is a token
//!   whole; Gemma 4's merges build each of those runs, 1 to 31 newlines, so BPE does too.)
//! - Anything else (WordPiece `bert`, Unigram `t5`, …) is refused.
//!
//! `token_type` 3 (control) become special added tokens, 4 (user-defined) non-special added
//! tokens matched before the model runs (as llama.cpp does).
//!
//! Invariant: the vocabulary ids are the GGUF array indices (a token repeated in the array
//! keeps its first id); every error names the file and the `tokenizer.ggml.*` key at fault.
//! llama.cpp (its `llama-vocab.cpp`) is the reference for every choice here; its
//! `ggml-vocab-*.gguf` test vectors are checked in `tests/it/ggml_vocab.rs`.

use super::gguf_pre::{pre_tokenizer, pre_tokenizer_names, PreTokenizerSpec};
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
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

/// llama.cpp token types.
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// GPT-2's pre-tokenizer regex as the models' `tokenizer.json` writes it (also `tokenizers`'
/// built-in ByteLevel regex). The GGUF pre-tokenizers use llama.cpp's strings
/// ([`super::gguf_pre`]); these three name a `tokenizer.json`'s pre-tokenizer.
pub const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's `tokenizer.json` regex: numbers in groups of up to three.
pub const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's `tokenizer.json` regex: single digits.
pub const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Gemma 4's split: runs of newlines and runs of anything else (llama.cpp's custom splitter
/// for this regex).
const GEMMA4_SPLIT_REGEX: &str = r"[^\n]+|[\n]+";

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
            // adds BOS; byte-level BPE as its pre-tokenizer says (Llama 3 and Tekken do).
            "gpt2" => {
                // llama.cpp reads a missing pre-tokenizer as "default".
                let pre = file.get_str_opt("tokenizer.ggml.pre")?.unwrap_or("default");
                let spec = pre_tokenizer(pre).ok_or_else(|| {
                    err(format!(
                        "pre-tokenizer {pre:?} (tokenizer.ggml.pre) is not supported; Pagoda \
                         implements {}",
                        pre_tokenizer_names().join(", ")
                    ))
                })?;
                (build_gpt2(file, &vocab, spec, &err)?, spec.add_bos)
            }
            "llama" => (build_spm(file, tokens, &vocab, unk_id, &err)?, true),
            // llama.cpp adds BOS for Gemma 4 even where the file says not to.
            "gemma4" => (build_gemma4(file, &vocab, &err)?, true),
            other => {
                return Err(err(format!(
                    "tokenizer model {other:?} (tokenizer.ggml.model) is not supported \
                     (gpt2, llama, gemma4)"
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

        let add_bos = match model {
            "gemma4" => true,
            _ => file
                .get_bool_opt("tokenizer.ggml.add_bos_token")?
                .unwrap_or(default_add_bos),
        };
        let eos_ids: Vec<u32> = [eos_id, eot_id, eom_id].into_iter().flatten().collect();
        let mut tok = Tokenizer::from_parts(inner, bos_id, add_bos, eos_ids);
        tok.set_eos_token(eos_id.map(|id| tokens[id as usize].clone()));
        Ok(tok)
    }
}

/// The `tokenizer.ggml.merges` pairs: each entry split at its first space after the first
/// byte (as llama.cpp does, so a token that is a space can be the left side).
fn read_merges(
    file: &GgufFile,
    err: &dyn Fn(String) -> ModelError,
) -> Result<Vec<(String, String)>, ModelError> {
    let merges_raw = file
        .get_str_array_opt("tokenizer.ggml.merges")?
        .ok_or_else(|| err("BPE vocabulary without \"tokenizer.ggml.merges\"".into()))?;
    let mut merges = Vec::with_capacity(merges_raw.len());
    for (i, m) in merges_raw.iter().enumerate() {
        let split = m
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(at, _)| (&m[..at], &m[at + 1..]));
        let (a, b) = split.ok_or_else(|| {
            err(format!(
                "\"tokenizer.ggml.merges\" entry {i} ({m:?}) is not two tokens separated by a space"
            ))
        })?;
        merges.push((a.to_string(), b.to_string()));
    }
    Ok(merges)
}

fn split_regex(
    re: &str,
    err: &dyn Fn(String) -> ModelError,
) -> Result<PreTokenizerWrapper, ModelError> {
    Split::new(
        SplitPattern::Regex(re.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map(PreTokenizerWrapper::Split)
    .map_err(|e| err(format!("bad pre-tokenizer regex {re:?}: {e}")))
}

fn build_gpt2(
    file: &GgufFile,
    vocab: &HashMap<String, u32>,
    spec: &PreTokenizerSpec,
    err: &dyn Fn(String) -> ModelError,
) -> Result<tokenizers::Tokenizer, ModelError> {
    let merges = read_merges(file, err)?;
    let bpe = BPE::builder()
        .vocab_and_merges(
            vocab
                .iter()
                .map(|(k, &v)| (k.clone(), v))
                .collect::<tokenizers::models::bpe::Vocab>(),
            merges,
        )
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| err(format!("cannot build byte-level BPE: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let mut steps = spec
        .regexes
        .iter()
        .map(|re| split_regex(re, err))
        .collect::<Result<Vec<_>, _>>()?;
    steps.push(PreTokenizerWrapper::ByteLevel(
        ByteLevel::default()
            .add_prefix_space(false)
            .use_regex(false),
    ));
    t.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(PreSequence::new(steps))));
    // No NFC for qwen2 although Qwen's tokenizer.json has it: llama.cpp, the reference for a
    // GGUF, does not normalize, and its ids for "e\u{301}" differ from the NFC ones.
    t.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())));
    Ok(t)
}

/// Gemma 4: BPE over raw UTF-8 with `▁` for spaces, as llama.cpp's `gemma4` tokenizer model.
fn build_gemma4(
    file: &GgufFile,
    vocab: &HashMap<String, u32>,
    err: &dyn Fn(String) -> ModelError,
) -> Result<tokenizers::Tokenizer, ModelError> {
    let merges = read_merges(file, err)?;
    let bpe = BPE::builder()
        .vocab_and_merges(
            vocab
                .iter()
                .map(|(k, &v)| (k.clone(), v))
                .collect::<tokenizers::models::bpe::Vocab>(),
            merges,
        )
        .byte_fallback(true)
        .build()
        .map_err(|e| err(format!("cannot build Gemma 4 BPE: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let replace = Replace::new(" ", "▁").map_err(|e| err(e.to_string()))?;
    t.with_normalizer(Some(NormalizerWrapper::Replace(replace)));
    t.with_pre_tokenizer(Some(split_regex(GEMMA4_SPLIT_REGEX, err)?));
    t.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(vec![
        DecoderWrapper::Replace(Replace::new("▁", " ").map_err(|e| err(e.to_string()))?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ]))));
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
