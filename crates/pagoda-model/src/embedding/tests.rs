//! Unit tests of [`EmbeddingModel`] on a tiny synthetic BERT written to a temporary folder
//! (hidden 8, 2 heads, 2 layers, a WordPiece vocabulary of 8, `max_seq_length` 6): loading
//! with the `bert.` prefix and an I64 `position_ids`, special tokens, truncation, batch equal
//! to alone across the `MAX_BATCH_TOKENS` split, and input errors. Numerical agreement with
//! sentence-transformers is tested on the real model (tests/it/embedding.rs).

use super::*;
use crate::safetensors::write_safetensors;
use serde_json::json;

const H: usize = 8;
const FFN: usize = 16;
const VOCAB: usize = 8;
const POS: usize = 16;

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Deterministic weights: `scale * sin(seed * 0.37 + i * 0.91)`.
fn ramp(n: usize, seed: usize, scale: f32) -> Vec<u8> {
    let v: Vec<f32> = (0..n)
        .map(|i| scale * (seed as f32 * 0.37 + i as f32 * 0.91).sin())
        .collect();
    f32s(&v)
}

fn tokenizer_json() -> serde_json::Value {
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    json!({
        "version": "1.0",
        "truncation": {"max_length": 3, "strategy": "LongestFirst", "stride": 0},
        "padding": {"strategy": {"Fixed": 5}, "direction": "Right", "pad_to_multiple_of": null,
            "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"},
        "added_tokens": [special(0, "[PAD]"), special(1, "[UNK]"), special(2, "[CLS]"),
            special(3, "[SEP]")],
        "normalizer": {"type": "BertNormalizer", "clean_text": true,
            "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
                {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {
                "[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4, "b": 5, "##b": 6,
                "c": 7}}
    })
}

/// Writes the tiny model into `dir`.
pub(crate) fn write_tiny(dir: &Path) {
    let config = json!({"model_type": "bert", "hidden_size": H, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": FFN, "max_position_embeddings": POS,
        "type_vocab_size": 2, "vocab_size": VOCAB, "layer_norm_eps": 1e-12, "hidden_act": "gelu"});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(
        dir.join("sentence_bert_config.json"),
        json!({"max_seq_length": 6}).to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    let mut t: Vec<(String, &str, Vec<usize>, Vec<u8>)> = vec![
        (
            "bert.embeddings.position_ids".into(),
            "I64",
            vec![1, POS],
            vec![0; 8 * POS],
        ),
        (
            "bert.embeddings.word_embeddings.weight".into(),
            "F32",
            vec![VOCAB, H],
            ramp(VOCAB * H, 1, 1.0),
        ),
        (
            "bert.embeddings.position_embeddings.weight".into(),
            "F32",
            vec![POS, H],
            ramp(POS * H, 2, 0.5),
        ),
        (
            "bert.embeddings.token_type_embeddings.weight".into(),
            "F32",
            vec![2, H],
            ramp(2 * H, 3, 0.3),
        ),
        (
            "bert.embeddings.LayerNorm.weight".into(),
            "F32",
            vec![H],
            ramp(H, 4, 1.0),
        ),
        (
            "bert.embeddings.LayerNorm.bias".into(),
            "F32",
            vec![H],
            ramp(H, 5, 0.1),
        ),
    ];
    let mut seed = 10;
    for l in 0..2 {
        let p = format!("bert.encoder.layer.{l}");
        for (name, rows, cols) in [
            ("attention.self.query", H, H),
            ("attention.self.key", H, H),
            ("attention.self.value", H, H),
            ("attention.output.dense", H, H),
            ("intermediate.dense", FFN, H),
            ("output.dense", H, FFN),
        ] {
            seed += 2;
            t.push((
                format!("{p}.{name}.weight"),
                "F32",
                vec![rows, cols],
                ramp(rows * cols, seed, 0.4),
            ));
            t.push((
                format!("{p}.{name}.bias"),
                "F32",
                vec![rows],
                ramp(rows, seed + 1, 0.1),
            ));
        }
        for name in ["attention.output.LayerNorm", "output.LayerNorm"] {
            seed += 2;
            t.push((
                format!("{p}.{name}.weight"),
                "F32",
                vec![H],
                ramp(H, seed, 1.0),
            ));
            t.push((
                format!("{p}.{name}.bias"),
                "F32",
                vec![H],
                ramp(H, seed + 1, 0.1),
            ));
        }
    }
    let refs: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = t
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone()))
        .collect();
    std::fs::write(dir.join("model.safetensors"), write_safetensors(&refs)).unwrap();
}

fn tiny() -> (tempfile::TempDir, EmbeddingModel) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny(dir.path());
    let m = EmbeddingModel::load(dir.path()).unwrap();
    (dir, m)
}

#[test]
fn loads_and_embeds() {
    let (_dir, m) = tiny();
    assert_eq!((m.dimensions(), m.max_seq_len()), (H, 6));
    assert_eq!(
        m.tokenizer().encode("a bb", true).unwrap(),
        vec![2, 4, 5, 6, 3]
    );
    let out = m.embed(&["a bb c", "", "A B", "a a a a a a a a"]).unwrap();
    assert_eq!(out.len(), 4);
    assert_eq!(
        out.iter().map(|e| e.tokens).collect::<Vec<_>>(),
        [6, 2, 4, 6]
    );
    assert_eq!(
        out.iter().map(|e| e.truncated).collect::<Vec<_>>(),
        [false, false, false, true]
    );
    for e in &out {
        assert_eq!(e.vector.len(), H);
        assert!(e.vector.iter().all(|v| v.is_finite()));
        let norm: f32 = e.vector.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }
    assert_ne!(out[0].vector, out[2].vector);
    // Truncation keeps [CLS] + 4 tokens + [SEP], as Hugging Face tokenizers do.
    let ids = encode_truncated(m.tokenizer(), "a a a a a a a a", 6).unwrap();
    assert_eq!(ids.ids, vec![2, 4, 4, 4, 4, 3]);
    assert!(ids.truncated);
    let tok = m.embed_tokens(&[ids.ids]).unwrap();
    assert_eq!((&tok[0].vector, tok[0].tokens), (&out[3].vector, 6));
}

#[test]
fn batch_equals_alone_across_groups() {
    let (_dir, m) = tiny();
    let texts = ["a bb c", "", "c c c c c c c", "b a"];
    let alone: Vec<Embedded> = texts
        .iter()
        .map(|&t| m.embed(&[t]).unwrap().remove(0))
        .collect();
    // Enough texts to need more than one group of MAX_BATCH_TOKENS rows.
    let many: Vec<&str> = texts
        .iter()
        .cycle()
        .take(4 * (MAX_BATCH_TOKENS / 13 + 1))
        .copied()
        .collect();
    let batch = m.embed(&many).unwrap();
    assert_eq!(batch.len(), many.len());
    for (i, e) in batch.iter().enumerate() {
        assert_eq!(*e, alone[i % texts.len()], "text {i}");
    }
}

#[test]
fn rejects_bad_input_without_panicking() {
    let (_dir, m) = tiny();
    assert!(matches!(
        m.embed_tokens(&[vec![2, 99, 3]]),
        Err(ModelError::InvalidToken { token: 99, .. })
    ));
    assert!(matches!(
        m.embed_tokens(&[vec![2, 3], vec![]]),
        Err(ModelError::InvalidBatch(_))
    ));
    let long = m.embed_tokens(&[vec![2, 4, 4, 4, 4, 4, 4, 4, 3]]).unwrap();
    assert_eq!((long[0].tokens, long[0].truncated), (6, true));
    assert!(m.embed(&[]).unwrap().is_empty());
}

#[test]
fn load_errors_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let e = EmbeddingModel::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("config.json"), "{e}");
    write_tiny(dir.path());
    // A weight of the wrong shape.
    let bad = write_safetensors(&[(
        "embeddings.word_embeddings.weight",
        "F32",
        vec![VOCAB, H + 1],
        vec![0; VOCAB * (H + 1) * 4],
    )]);
    std::fs::write(dir.path().join("model.safetensors"), bad).unwrap();
    let e = EmbeddingModel::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("word_embeddings"), "{e}");
    // Weights under model/.
    let sub = tempfile::tempdir().unwrap();
    write_tiny(sub.path());
    std::fs::create_dir(sub.path().join("model")).unwrap();
    std::fs::rename(
        sub.path().join("model.safetensors"),
        sub.path().join("model").join("model.safetensors"),
    )
    .unwrap();
    assert!(EmbeddingModel::load(sub.path()).is_ok());
}
