//! Token ids and chat-template renders of the real SmolLM2 and Gemma 3 GGUFs against goldens
//! made by `scripts/golden_tokenizer.py` from references we did not write: llama.cpp's own
//! tokenizer (llama-cpp-python) and transformers' jinja2 chat-template rendering.

use crate::real_models::{gemma3, smollm2};
use pagoda_model::chat_template::{ChatMessage, CHATML_TEMPLATE};
use pagoda_model::tokenizer::IncrementalDecoder;
use pagoda_model::ModelSource;
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = format!(
        "{}/tests/golden/{name}_tokenizer.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).expect("golden file"))
        .expect("golden json")
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
    let mut failures = Vec::new();
    for case in g["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let got = tok.encode(text, false).unwrap();
        if got != want {
            failures.push(format!(
                "encode({text:?}, false): got {got:?}, llama.cpp {want:?}"
            ));
        }
        let want_sp = ids(&case["ids_add_special"]);
        let got_sp = tok.encode(text, true).unwrap();
        if got_sp != want_sp {
            failures.push(format!(
                "encode({text:?}, true): got {got_sp:?}, llama.cpp {want_sp:?}"
            ));
        }
        // Round trip (special-token text decodes back to itself when not skipped).
        let back = tok.decode(&got, false).unwrap();
        if back != text {
            failures.push(format!("decode(encode({text:?})) = {back:?}"));
        }
        if let Some(detok) = case["detokenized"].as_str() {
            if back != detok {
                failures.push(format!("decode of {text:?}: {back:?}, llama.cpp {detok:?}"));
            }
        }
        // Streaming gives the same text as decoding at once.
        let mut d = IncrementalDecoder::with_special_tokens(true);
        let mut streamed = String::new();
        for &id in &got {
            if let Some(piece) = d.push(tok, id).unwrap() {
                streamed.push_str(&piece);
            }
        }
        streamed.push_str(&d.finish(tok).unwrap());
        if streamed != back {
            failures.push(format!("streamed {text:?} as {streamed:?}"));
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
    let chat = &g["chat"];
    let template = if chat["template_source"] == "chatml-fallback" {
        assert_eq!(chat["template"].as_str().unwrap(), CHATML_TEMPLATE);
        assert!(m.chat_template.is_none());
        m.chat_template_or_default()
    } else {
        let t = m.chat_template.clone().expect("model template");
        assert_eq!(t.source(), chat["template"].as_str().unwrap());
        t
    };
    for r in chat["renders"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(r["messages"].clone()).unwrap();
        let add_gen = r["add_generation_prompt"].as_bool().unwrap();
        let got = template.render(&messages, add_gen).unwrap();
        assert_eq!(
            got,
            r["rendered"].as_str().unwrap(),
            "messages {messages:?} add_gen {add_gen}"
        );
    }
}

#[test]
fn smollm2_tokens_match_llama_cpp() {
    let Some(m) = smollm2() else { return };
    check_tokens(m, &load("smollm2"));
}

#[test]
fn gemma3_tokens_match_llama_cpp() {
    let Some(m) = gemma3() else { return };
    check_tokens(m, &load("gemma3"));
}

#[test]
fn smollm2_chat_template_matches_jinja2() {
    let Some(m) = smollm2() else { return };
    check_chat(m, &load("smollm2"));
}

#[test]
fn gemma3_chat_template_matches_jinja2() {
    let Some(m) = gemma3() else { return };
    check_chat(m, &load("gemma3"));
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
        assert!(t.decode(&[u32::MAX], false).is_err());
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
