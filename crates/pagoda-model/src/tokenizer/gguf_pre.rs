//! The pre-tokenizers of byte-level BPE vocabularies in GGUF files, by `tokenizer.ggml.pre`:
//! for each name llama.cpp knows and Pagoda implements, the regexes llama.cpp's
//! `llm_tokenizer_bpe` splits the text with (applied in order, each splitting the pieces the
//! previous one left, a match and the text between matches each becoming a piece), whether
//! a piece that is a whole vocabulary entry skips the merges (`ignore_merges`) and whether BOS
//! is added when the file does not say (`tokenizer.ggml.add_bos_token` absent).
//!
//! Invariant: a name that is not in [`PRE_TOKENIZERS`] has no entry, so a vocabulary with a
//! pre-tokenizer Pagoda does not implement is refused at load, never tokenized with another
//! one's regexes. The regexes are llama.cpp's strings (its `(?i:…)`-free rewrites of the
//! models' own), checked against its `ggml-vocab-*.gguf` test vectors where it ships them.

/// How one family of byte-level BPE vocabularies splits text before the merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreTokenizerSpec {
    /// The `tokenizer.ggml.pre` values that select it.
    pub names: &'static [&'static str],
    /// Split regexes, applied in order.
    pub regexes: &'static [&'static str],
    /// A piece that is a vocabulary entry is one token, without running the merges.
    pub ignore_merges: bool,
    /// BOS is added when `tokenizer.ggml.add_bos_token` is absent.
    pub add_bos: bool,
}

/// GPT-2's regex as llama.cpp writes it (no trailing `|\s+`: whitespace it leaves unmatched
/// becomes a piece of its own all the same).
pub const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3: numbers in groups of up to three.
pub const LLAMA3_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2 (and Qwen3): single digits.
pub const QWEN2_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: Qwen2's, with combining marks (`\p{M}`) kept with the letters they follow.
pub const QWEN35_SPLIT: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral's Tekken: a word is a run of capitals then a run of small letters (or the reverse),
/// as llama.cpp rewrites it with lookaheads (a letter outside ASCII counts as both cases).
pub const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// gpt-oss's o200k (llama.cpp's `GPT4O`): Tekken's letter runs with English contractions
/// attached, numbers in runs of up to three.
pub const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek LLM: newlines, then Latin/Greek/Cyrillic/… words, ASCII and full-width
/// punctuation, trailing whitespace, CJK runs and numbers. `$` of llama.cpp's `\s+$` (the end
/// of the piece in its `std::regex`) is `\z` here (Oniguruma's `$` is also before a `\n`).
const DEEPSEEK_LLM: &[&str] = &[
        "[\r\n]",
        "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
        "\\s?[!-/:-~！-／：-～‘-‟\u{3000}-。]+",
        "\\s+\\z",
        "[一-龥ࠀ-一가-\u{D7FF}]+",
        "\\p{N}+",
];

/// Every pre-tokenizer Pagoda implements.
pub const PRE_TOKENIZERS: &[PreTokenizerSpec] = &[
    PreTokenizerSpec {
        names: &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "lfm2",
        ],
        regexes: &[LLAMA3_SPLIT],
        ignore_merges: true,
        add_bos: true,
    },
    PreTokenizerSpec {
        names: &["dbrx", "smaug-bpe"],
        regexes: &[LLAMA3_SPLIT],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"],
        regexes: &[QWEN2_SPLIT],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["qwen35"],
        regexes: &[QWEN35_SPLIT],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["gpt-4o", "llama4", "kanana2", "talkie"],
        regexes: &[GPT4O_SPLIT],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["tekken"],
        regexes: &[TEKKEN_SPLIT],
        ignore_merges: true,
        add_bos: true,
    },
    PreTokenizerSpec {
        names: &["gpt-2", "phi-2", "mpt", "olmo", "exaone4"],
        regexes: &[GPT2_SPLIT],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
        ],
        regexes: &[r"\p{N}", GPT2_SPLIT],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["falcon"],
        regexes: &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_SPLIT, "[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["deepseek-coder"],
        regexes: &[
            r"[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            "[一-龥ࠀ-一가-\u{D7FF}]+",
            r"\p{N}",
        ],
        ignore_merges: false,
        add_bos: false,
    },
    PreTokenizerSpec {
        names: &["deepseek-llm"],
        regexes: DEEPSEEK_LLM,
        ignore_merges: false,
        add_bos: false,
    },
    // What llama.cpp uses for a vocabulary without `tokenizer.ggml.pre` (with a warning that
    // generation quality will suffer).
    PreTokenizerSpec {
        names: &["default"],
        regexes: &[
            r"[\p{P}\$\+<=>\^~\|]+",
            GPT2_SPLIT,
            r"\p{N}+",
            "[0-9][0-9][0-9]",
        ],
        ignore_merges: false,
        add_bos: false,
    },
];

/// The pre-tokenizer named `pre`, if Pagoda implements it.
pub fn pre_tokenizer(pre: &str) -> Option<&'static PreTokenizerSpec> {
    PRE_TOKENIZERS.iter().find(|s| s.names.contains(&pre))
}

/// Every implemented name, for error messages.
pub fn pre_tokenizer_names() -> Vec<&'static str> {
    PRE_TOKENIZERS
        .iter()
        .flat_map(|s| s.names.iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_regex_compiles_and_names_are_unique() {
        let mut names = pre_tokenizer_names();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a name in two entries");
        for spec in PRE_TOKENIZERS {
            for re in spec.regexes {
                tokenizers::pre_tokenizers::split::Split::new(
                    tokenizers::pre_tokenizers::split::SplitPattern::Regex(re.to_string()),
                    tokenizers::SplitDelimiterBehavior::Isolated,
                    false,
                )
                .unwrap_or_else(|e| panic!("{:?}: {re:?}: {e}", spec.names));
            }
        }
    }

    #[test]
    fn unknown_names_have_no_entry() {
        for name in [
            "",
            "granite-embed-multi-97m",
            "kimi-k2",
            "chameleon",
            "Qwen2",
        ] {
            assert!(pre_tokenizer(name).is_none(), "{name}");
        }
        assert!(pre_tokenizer("qwen35").is_some() && pre_tokenizer("gpt-4o").is_some());
    }
}
