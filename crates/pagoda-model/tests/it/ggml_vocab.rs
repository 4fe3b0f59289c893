//! llama.cpp's tokenizer test vectors: every `models/ggml-vocab-NAME.gguf` (a GGUF with only
//! the `tokenizer.ggml.*` metadata, no tensors) with its `.gguf.inp` (texts, each followed by a
//! `\n__ggml_vocab_test__\n` line) and `.gguf.out` (one line of token ids per text), as
//! llama.cpp's `tests/test-tokenizer-0.cpp` reads and checks them: no BOS/EOS
//! (`add_special = false`), control-token text read as text (`parse_special = false`).
//!
//! The files come from llama.cpp as vendored in the llama-cpp-python 0.3.36 sdist;
//! `scripts/test.sh` extracts them and points `PAGODA_TEST_LLAMA_VOCAB` at the folder. Without
//! it the tests skip, except under `CI=true`, where they fail.
//!
//! Pre-tokenizers without a shipped vocabulary (Tekken, `default`, …) are checked on a shipped
//! vocabulary relabelled in memory, against llama.cpp's ids for the same relabelled file
//! (committed under `tests/golden/ggml_vocab_pre/`).
//!
//! A vocabulary Pagoda does not tokenize (WordPiece `bert`, a `tokenizer.ggml.pre` it has no
//! pre-tokenizer for) must be refused at load with an error that names what is missing, never
//! tokenized with a wrong pre-tokenizer.

use pagoda_model::gguf::GgufFile;
use pagoda_model::tokenizer::Tokenizer;
use std::path::PathBuf;

/// The folder with the `ggml-vocab-*` files, or `None` (with a notice) outside CI.
fn vocab_dir() -> Option<PathBuf> {
    match std::env::var_os("PAGODA_TEST_LLAMA_VOCAB") {
        Some(d) => Some(PathBuf::from(d)),
        None if std::env::var("CI").as_deref() == Ok("true") => panic!(
            "PAGODA_TEST_LLAMA_VOCAB is unset in CI: scripts/test.sh extracts llama.cpp's \
             ggml-vocab files and sets it"
        ),
        None => {
            eprintln!(
                "skipped: set PAGODA_TEST_LLAMA_VOCAB to llama.cpp's models/ folder \
                 (the ggml-vocab-*.gguf files and their .inp/.out vectors)"
            );
            None
        }
    }
}

/// The (text, ids) pairs of an `.inp` and an `.out` file, split exactly as
/// test-tokenizer-0.cpp does (the last text may or may not be followed by the marker).
fn pairs(label: &str, inp: &str, out: &str) -> Vec<(String, Vec<u32>)> {
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut rest = inp;
    while !rest.is_empty() {
        match rest.find(SEP) {
            Some(at) => {
                texts.push(rest[..at].to_string());
                rest = &rest[at + SEP.len()..];
            }
            None => {
                texts.push(rest.to_string());
                rest = "";
            }
        }
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| {
                    t.parse()
                        .unwrap_or_else(|e| panic!("{label}.out: id {t:?}: {e}"))
                })
                .collect()
        })
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{label}: .inp has {} texts, .out {} lines",
        texts.len(),
        ids.len()
    );
    assert!(!texts.is_empty(), "{label}: no vectors");
    texts.into_iter().zip(ids).collect()
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The vectors of `ggml-vocab-NAME.gguf`.
fn vectors(dir: &std::path::Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let base = dir.join(format!("ggml-vocab-{name}.gguf"));
    let inp = read(&PathBuf::from(format!("{}.inp", base.display())));
    let out = read(&PathBuf::from(format!("{}.out", base.display())));
    pairs(&format!("ggml-vocab-{name}"), &inp, &out)
}

fn load(dir: &std::path::Path, name: &str) -> Result<Tokenizer, String> {
    let path = dir.join(format!("ggml-vocab-{name}.gguf"));
    let file = GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Tokenizer::from_gguf(&file).map_err(|e| e.to_string())
}

/// A readable account of where `got` departs from `want`.
fn mismatch(label: &str, text: &str, want: &[u32], got: &[u32], tok: &Tokenizer) -> String {
    let at = want
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    let piece = |ids: &[u32]| -> Vec<String> {
        ids.iter()
            .map(|&id| format!("{id} {:?}", tok.id_to_token(id).unwrap_or_default()))
            .collect()
    };
    let window = |v: &[u32]| v[at.min(v.len())..(at + 4).min(v.len())].to_vec();
    format!(
        "{label}: text {text:?}: ids differ first at position {at} \
         (expected {} ids, got {})\n  expected from {at}: {:?}\n  got from {at}:      {:?}\n  \
         expected: {want:?}\n  got:      {got:?}",
        want.len(),
        got.len(),
        piece(&window(want)),
        piece(&window(got)),
    )
}

/// Every vector of `ggml-vocab-NAME` gives exactly its ids, through `encode(text, false)` (what
/// a prompt without special tokens goes through) and through `encode_plain`.
fn check(name: &str) {
    let Some(dir) = vocab_dir() else { return };
    let tok = load(&dir, name).unwrap_or_else(|e| panic!("ggml-vocab-{name}: {e}"));
    expect_vectors(&format!("ggml-vocab-{name}"), &tok, &vectors(&dir, name));
}

fn expect_vectors(label: &str, tok: &Tokenizer, cases: &[(String, Vec<u32>)]) {
    let mut failures = Vec::new();
    for (text, want) in cases {
        for (how, got) in [
            ("encode", tok.encode(text, false)),
            ("encode_plain", tok.encode_plain(text)),
        ] {
            let got = got.unwrap_or_else(|e| panic!("{label}: {how}({text:?}): {e}"));
            if &got != want {
                failures.push(format!("{how}: {}", mismatch(label, text, want, &got, tok)));
                break;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} vectors fail:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Pre-tokenizers llama.cpp ships no vocabulary for (Tekken of Mistral/Ministral 3 among them):
/// a shipped vocabulary with only `tokenizer.ggml.pre` changed, built here in memory, against
/// llama.cpp's ids for the same relabelled file on the qwen35 texts
/// (`tests/golden/ggml_vocab_pre/BASE-as-PRE.out`, made by
/// `scripts/reference/golden_vocab_pre.py`).
fn check_relabelled(base: &str, pre: &str) {
    let Some(dir) = vocab_dir() else { return };
    let path = dir.join(format!("ggml-vocab-{base}.gguf"));
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut w = pagoda_model::gguf::GgufWriter::new();
    for (k, v) in file.metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    w.add_str("tokenizer.ggml.pre", pre);
    let label = format!("ggml-vocab-{base} as {pre:?}");
    let relabelled = GgufFile::from_bytes(format!("{base}-as-{pre}.gguf"), w.to_bytes())
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let tok = Tokenizer::from_gguf(&relabelled).unwrap_or_else(|e| panic!("{label}: {e}"));
    let inp = read(&dir.join("ggml-vocab-qwen35.gguf.inp"));
    let out = read(&PathBuf::from(format!(
        "{}/tests/golden/ggml_vocab_pre/{base}-as-{pre}.out",
        env!("CARGO_MANIFEST_DIR")
    )));
    expect_vectors(&label, &tok, &pairs(&label, &inp, &out));
}

/// Loading `ggml-vocab-NAME` is refused with an error that contains `says`.
fn refused(name: &str, says: &str) {
    let Some(dir) = vocab_dir() else { return };
    match load(&dir, name) {
        Ok(_) => panic!("ggml-vocab-{name} loaded; expected a refusal saying {says:?}"),
        Err(e) => assert!(e.contains(says), "ggml-vocab-{name}: {e:?} lacks {says:?}"),
    }
}

macro_rules! vocab_tests {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                check($name);
            }
        )*
    };
}

vocab_tests! {
    ggml_vocab_qwen2 => "qwen2",
    ggml_vocab_qwen35 => "qwen35",
    ggml_vocab_llama_bpe => "llama-bpe",
    ggml_vocab_llama_spm => "llama-spm",
    ggml_vocab_phi_3 => "phi-3",
    ggml_vocab_gemma_4 => "gemma-4",
    ggml_vocab_gpt_2 => "gpt-2",
    ggml_vocab_starcoder => "starcoder",
    ggml_vocab_refact => "refact",
    ggml_vocab_mpt => "mpt",
    ggml_vocab_falcon => "falcon",
    ggml_vocab_command_r => "command-r",
    ggml_vocab_deepseek_coder => "deepseek-coder",
    ggml_vocab_deepseek_llm => "deepseek-llm",
}

macro_rules! relabelled_tests {
    ($($test:ident => $base:literal as $pre:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                check_relabelled($base, $pre);
            }
        )*
    };
}

relabelled_tests! {
    llama_bpe_as_tekken => "llama-bpe" as "tekken",
    llama_bpe_as_gpt_4o => "llama-bpe" as "gpt-4o",
    llama_bpe_as_default => "llama-bpe" as "default",
    llama_bpe_as_smaug_bpe => "llama-bpe" as "smaug-bpe",
    llama_bpe_as_exaone => "llama-bpe" as "exaone",
    llama_bpe_as_deepseek_llm => "llama-bpe" as "deepseek-llm",
    qwen2_as_stablelm2 => "qwen2" as "stablelm2",
}

/// BERT's WordPiece (`tokenizer.ggml.model = "bert"`) is not implemented: refused by name.
#[test]
fn ggml_vocab_bert_bge_is_refused() {
    refused("bert-bge", "tokenizer model \"bert\"");
}

/// Pieces random texts are made of: cases the pre-tokenizers treat differently (contractions,
/// digit runs, whitespace runs before letters and newlines, combining marks, CJK, emoji with
/// joiners, other numbers such as `½`).
const PIECES: &[&str] = &[
    "a",
    "Hello",
    "WORLD",
    "'s",
    "'RE",
    "'ll",
    "y'all",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    "3",
    "333",
    "1234567",
    "½",
    "é",
    "e\u{301}",
    "ក",
    "\u{17cb}",
    "ា",
    "我想",
    "😁",
    "\u{200d}",
    "🌫\u{fe0f}",
    "!",
    "...",
    "$+<=>",
    "```",
    "нещо",
    "Ġ",
    "<|im_end|>",
];

/// Property: `decode(encode(s)) == s` for every vocabulary whose encoding loses nothing
/// (byte-level BPE, and Gemma 4's raw UTF-8 BPE for text without its `▁`).
fn round_trips(name: &str) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let Some(dir) = vocab_dir() else { return };
    let tok = load(&dir, name).unwrap_or_else(|e| panic!("ggml-vocab-{name}: {e}"));
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let text = prop::collection::vec(prop::sample::select(PIECES), 0..24).prop_map(|p| p.concat());
    runner
        .run(&text, |s| {
            let ids = tok.encode_plain(&s).expect("encode");
            let back = tok.decode(&ids, false).expect("decode");
            prop_assert_eq!(&back, &s, "ggml-vocab-{}: ids {:?}", name, ids);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

macro_rules! round_trip_tests {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                round_trips($name);
            }
        )*
    };
}

round_trip_tests! {
    round_trip_qwen2 => "qwen2",
    round_trip_qwen35 => "qwen35",
    round_trip_llama_bpe => "llama-bpe",
    round_trip_gemma_4 => "gemma-4",
    round_trip_gpt_2 => "gpt-2",
    round_trip_starcoder => "starcoder",
    round_trip_falcon => "falcon",
    round_trip_command_r => "command-r",
    round_trip_deepseek_coder => "deepseek-coder",
    round_trip_deepseek_llm => "deepseek-llm",
}

/// Without the vocabulary files: a `tokenizer.ggml.pre` Pagoda has no regexes for is refused
/// by name (llama.cpp's `granite-embed-multi-97m` here), never tokenized with another
/// family's.
#[test]
fn unknown_pre_tokenizer_is_refused() {
    let mut w = crate::common::tiny_llama();
    w.add_str("tokenizer.ggml.pre", "granite-embed-multi-97m");
    let file = GgufFile::from_bytes("tiny.gguf", w.to_bytes()).expect("valid GGUF");
    let e = Tokenizer::from_gguf(&file)
        .expect_err("an unknown pre-tokenizer must be refused")
        .to_string();
    assert!(
        e.contains("\"granite-embed-multi-97m\"")
            && e.contains("tokenizer.ggml.pre")
            && e.contains("qwen35"),
        "{e}"
    );
}

/// A byte-level BPE vocabulary without `tokenizer.ggml.pre` (and without tensors, as
/// llama.cpp's vocab-only files) loads with llama.cpp's reading of the missing key: `default`.
#[test]
fn missing_pre_tokenizer_is_llama_cpp_default() {
    let mut w = crate::common::tiny_llama();
    w.add_str("tokenizer.ggml.pre", "default");
    let file = GgufFile::from_bytes("tiny.gguf", w.to_bytes()).expect("valid GGUF");
    let default = Tokenizer::from_gguf(&file).expect("the default pre-tokenizer");
    let mut vocab_only = pagoda_model::gguf::GgufWriter::new();
    for (k, v) in file.metadata() {
        if k != "tokenizer.ggml.pre" {
            vocab_only.add_metadata(k.clone(), v.clone());
        }
    }
    let file = GgufFile::from_bytes("vocab.gguf", vocab_only.to_bytes()).expect("valid GGUF");
    let missing = Tokenizer::from_gguf(&file).expect("a vocabulary without pre-tokenizer");
    for text in ["ab a", "a1234b", "ab, a!", "  a\n\nb"] {
        assert_eq!(
            missing.encode(text, false).unwrap(),
            default.encode(text, false).unwrap(),
            "{text:?}"
        );
    }
    assert_eq!(missing.encode("ab a", false).unwrap(), [4, 6]);
}
