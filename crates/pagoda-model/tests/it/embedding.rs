//! all-MiniLM-L6-v2 against sentence-transformers: the Hugging Face folder in
//! `PAGODA_TEST_MINILM` (skipped with a notice when unset, failing when `CI` is set) is
//! embedded by [`EmbeddingModel`] and compared with `tests/golden/minilm_embeddings.json`
//! (made by `scripts/golden_embeddings.py`): token ids and counts equal, truncation flags
//! equal, every vector within 1e-4 (max abs difference) of the reference, and each text
//! embedded in the batch equal to it embedded alone.

use pagoda_model::embedding::encode_truncated;
use pagoda_model::EmbeddingModel;
use serde_json::Value;
use std::path::PathBuf;

/// Largest allowed |ours - sentence-transformers| of one vector element.
const TOLERANCE: f32 = 1e-4;

fn minilm() -> Option<EmbeddingModel> {
    match std::env::var_os("PAGODA_TEST_MINILM") {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            assert!(
                p.is_dir(),
                "PAGODA_TEST_MINILM points at {} which is not a folder",
                p.display()
            );
            Some(EmbeddingModel::load(&p).expect("load all-MiniLM-L6-v2"))
        }
        _ => {
            if std::env::var_os("CI").is_some() {
                panic!("PAGODA_TEST_MINILM is not set; CI must test against the real model");
            }
            eprintln!("skipping: set PAGODA_TEST_MINILM to the all-MiniLM-L6-v2 folder");
            None
        }
    }
}

fn golden() -> Value {
    let path = format!(
        "{}/tests/golden/minilm_embeddings.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("read golden");
    serde_json::from_str(&text).expect("golden json")
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn minilm_matches_sentence_transformers() {
    let Some(m) = minilm() else { return };
    let g = golden();
    assert_eq!(m.dimensions() as u64, g["dimensions"].as_u64().unwrap());
    assert_eq!(
        m.max_seq_len() as u64,
        g["max_seq_length"].as_u64().unwrap()
    );
    let cases = g["cases"].as_array().unwrap();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let batch = m.embed(&texts).expect("embed batch");
    let mut worst = 0.0f32;
    for ((case, text), got) in cases.iter().zip(&texts).zip(&batch) {
        let ids: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let enc = encode_truncated(m.tokenizer(), text, m.max_seq_len()).unwrap();
        assert_eq!(enc.ids, ids, "token ids of {text:?}");
        assert_eq!(
            got.tokens as u64,
            case["tokens"].as_u64().unwrap(),
            "{text:?}"
        );
        assert_eq!(
            got.truncated,
            case["truncated"].as_bool().unwrap(),
            "{text:?}"
        );
        let want: Vec<f32> = case["vector"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let d = max_abs_diff(&got.vector, &want);
        assert!(d <= TOLERANCE, "{text:?}: max abs diff {d}");
        worst = worst.max(d);
        let alone = m.embed(&[*text]).expect("embed alone").remove(0);
        assert_eq!(alone, *got, "{text:?} alone differs from in the batch");
        let by_ids = m.embed_tokens(&[ids]).expect("embed ids").remove(0);
        assert_eq!(by_ids.vector, got.vector, "{text:?} from ids differs");
        assert_eq!(by_ids.tokens, got.tokens);
    }
    eprintln!("all-MiniLM-L6-v2: max abs diff vs sentence-transformers {worst:e}");
}
