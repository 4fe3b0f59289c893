//! Token ids and chat-template renders of the real SmolLM2 and Gemma 3 GGUFs against the
//! goldens in the repository's `tests/golden/` (`tokenizer_*.json`, `chat_*.json`), made by
//! `scripts/reference/make_goldens.py` from references we did not write: llama.cpp's own
//! tokenizer (llama-cpp-python 0.3.36, `vocab_only`) and Python jinja2 as transformers'
//! `apply_chat_template` runs it.

use crate::real_models::{gemma3, qwen2, smollm2};
use pagoda_model::chat_template::{ChatMessage, ChatTemplate};
use pagoda_model::tokenizer::IncrementalDecoder;
use pagoda_model::ModelSource;
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = format!(
        "{}/../../tests/golden/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("golden json")
}

/// Extra cases made by `scripts/golden_tokenizer.py` (same format), kept with this crate.
fn load_extra(name: &str) -> Value {
    let path = format!(
        "{}/tests/golden/tokenizer_extra_{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("golden json")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_tokens(m: &ModelSource, g: &Value) {
    let tok = &m.tokenizer;
    assert_eq!(tok.vocab_size() as u64, g["n_vocab"].as_u64().unwrap());
    assert_eq!(tok.bos_id().map(u64::from), g["bos_id"].as_u64());
    assert!(tok
        .eos_ids()
        .contains(&(g["eos_id"].as_u64().unwrap() as u32)));
    let mut failures = Vec::new();
    for case in g["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let add_bos = case["add_bos"].as_bool().unwrap();
        let want = ids(&case["ids"]);
        let got = tok.encode(text, add_bos).unwrap();
        if got != want {
            failures.push(format!(
                "encode({text:?}, {add_bos}): got {got:?}, llama.cpp {want:?}"
            ));
            continue;
        }
        // Per-token pieces as llama.cpp detokenizes them one by one.
        for (k, (&id, piece)) in got
            .iter()
            .zip(case["pieces"].as_array().unwrap())
            .enumerate()
        {
            let ours = tok.decode(&[id], false).unwrap();
            let theirs = piece.as_str().unwrap();
            // A token holding part of a UTF-8 character is not text on its own: the golden
            // writes its bytes as `\xNN` escapes, we decode it as U+FFFD.
            let partial = theirs.contains("\\x") && ours.contains('\u{FFFD}');
            if ours != theirs && !partial {
                failures.push(format!(
                    "{text:?} token {k} ({id}): piece {ours:?}, llama.cpp {theirs:?}"
                ));
            }
        }
        // Whole-sequence decode equals llama.cpp's detokenization (which keeps specials).
        let back = tok.decode(&got, false).unwrap();
        if back != case["detokenized"].as_str().unwrap() {
            failures.push(format!(
                "decode({text:?}): {back:?}, llama.cpp {:?}",
                case["detokenized"]
            ));
        }
        // Round trip without BOS gives the text back.
        if !add_bos && back != text {
            failures.push(format!("decode(encode({text:?})) = {back:?}"));
        }
        // Streaming gives the same text as decoding at once.
        let mut d = IncrementalDecoder::with_special_tokens(true);
        let mut streamed = String::new();
        for &id in &got {
            if let Some(piece) = d.push(tok, id).unwrap() {
                assert!(!piece.contains('\u{FFFD}') || back.contains('\u{FFFD}'));
                streamed.push_str(&piece);
            }
        }
        streamed.push_str(&d.finish(tok).unwrap());
        if streamed != back {
            failures.push(format!(
                "streamed {text:?} as {streamed:?}, decode {back:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn check_chat(m: &ModelSource, g: &Value) {
    let template = if g["gguf_has_chat_template"].as_bool().unwrap() {
        let t = m.chat_template.clone().expect("the GGUF's template");
        assert_eq!(t.source(), g["chat_template"].as_str().unwrap());
        t
    } else {
        assert!(m.chat_template.is_none());
        ChatTemplate::new(
            g["chat_template"].as_str().unwrap().to_string(),
            m.tokenizer.bos_token().unwrap().to_string(),
            m.tokenizer.eos_token().unwrap().to_string(),
        )
        .unwrap()
    };
    assert_eq!(m.tokenizer.bos_token(), g["bos_token"].as_str());
    assert_eq!(m.tokenizer.eos_token(), g["eos_token"].as_str());
    for case in g["cases"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let add_gen = case["add_generation_prompt"].as_bool().unwrap();
        let got = template.render(&messages, add_gen).unwrap();
        assert_eq!(
            got,
            case["rendered"].as_str().unwrap(),
            "case {} add_generation_prompt {add_gen}",
            case["name"]
        );
    }
    for case in g["errors"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let add_gen = case["add_generation_prompt"].as_bool().unwrap();
        let e = template.render(&messages, add_gen).unwrap_err().to_string();
        assert!(e.contains(case["error"].as_str().unwrap()), "{e}");
    }
}

#[test]
fn smollm2_tokens_match_llama_cpp() {
    let Some(m) = smollm2() else { return };
    check_tokens(m, &load("tokenizer_smollm2"));
}

#[test]
fn gemma3_tokens_match_llama_cpp() {
    let Some(m) = gemma3() else { return };
    check_tokens(m, &load("tokenizer_gemma3"));
}

#[test]
fn smollm2_extra_tokens_match_llama_cpp() {
    let Some(m) = smollm2() else { return };
    check_tokens(m, &load_extra("smollm2"));
}

#[test]
fn gemma3_extra_tokens_match_llama_cpp() {
    let Some(m) = gemma3() else { return };
    check_tokens(m, &load_extra("gemma3"));
}

#[test]
fn qwen2_tokens_match_llama_cpp() {
    let Some(m) = qwen2() else { return };
    check_tokens(m, &load_extra("qwen2"));
}

#[test]
fn smollm2_chat_template_matches_jinja2() {
    let Some(m) = smollm2() else { return };
    check_chat(m, &load("chat_smollm2"));
}

#[test]
fn gemma3_chat_template_matches_jinja2() {
    let Some(m) = gemma3() else { return };
    check_chat(m, &load("chat_gemma3"));
}

#[test]
fn special_tokens_and_eos_ids() {
    if let Some(m) = smollm2() {
        let t = &m.tokenizer;
        let im_end = t.token_to_id("<|im_end|>").unwrap();
        assert!(t.eos_ids().contains(&im_end));
        assert!(t.is_special(im_end));
        assert!(!t.is_special(t.token_to_id("a").unwrap()));
        assert_eq!(t.bos_id(), Some(1));
        assert!(!t.adds_bos());
        assert_eq!(t.decode(&[im_end], true).unwrap(), "");
        // Unknown ids (padding rows beyond the tokenizer) decode visibly, without failing.
        let hi = t.token_to_id("Hi").unwrap();
        assert_eq!(
            t.decode(&[hi, u32::MAX, hi], false).unwrap(),
            "Hi\u{FFFD}Hi"
        );
    }
    if let Some(m) = gemma3() {
        let t = &m.tokenizer;
        let eot = t.token_to_id("<end_of_turn>").unwrap();
        assert!(t.eos_ids().contains(&eot) && t.eos_ids().contains(&1));
        assert_eq!(t.bos_id(), Some(2));
        assert!(t.adds_bos());
        assert_eq!(t.id_to_token(2).as_deref(), Some("<bos>"));
        // Byte fallback: an incomplete UTF-8 character is held back while streaming.
        let crab = t.encode("🦀", false).unwrap();
        let mut d = IncrementalDecoder::new();
        let mut out = String::new();
        for &id in &crab {
            if let Some(p) = d.push(t, id).unwrap() {
                assert!(
                    !p.contains('\u{FFFD}'),
                    "emitted a partial character: {p:?}"
                );
                out.push_str(&p);
            }
        }
        out.push_str(&d.finish(t).unwrap());
        assert_eq!(out, "🦀");
    }
}

#[test]
fn streaming_never_completing_bytes_is_bounded() {
    let Some(m) = gemma3() else { return };
    let t = &m.tokenizer;
    // <0xF0> opens a 4-byte character that never completes.
    let lead = t.token_to_id("<0xF0>").unwrap();
    let mut d = IncrementalDecoder::new();
    let mut out = String::new();
    for _ in 0..40 {
        if let Some(p) = d.push(t, lead).unwrap() {
            out.push_str(&p);
        }
    }
    out.push_str(&d.finish(t).unwrap());
    assert_eq!(out, t.decode(&[lead; 40], true).unwrap());
}
