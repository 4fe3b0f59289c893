//! `pagoda eval logits` through the binary on the tiny Llama.
//!
//! Invariants checked: the .npy file is what NumPy reads (header, shape, little-endian f32)
//! and holds transformers' logits for the golden prompt (tests/golden/tiny-llama/logits.json,
//! float32) at every position of every prompt; bad prompts files (empty, `[]`, not token ids,
//! prompts of different lengths, an id out of the vocabulary) exit 1 with a message naming the
//! problem and leave no output file.

use super::*;

/// Reads a little-endian f32 `.npy` file as written by `eval logits`: (shape, data).
fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "magic and version 1.0");
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + len) % 64, 0, "data aligned to 64 bytes");
    let header = std::str::from_utf8(&bytes[10..10 + len]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let dims = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap();
    let shape: Vec<usize> = dims
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let data: Vec<f32> = bytes[10 + len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(data.len(), shape.iter().product::<usize>(), "{shape:?}");
    (shape, data)
}

fn golden() -> serde_json::Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama/logits.json");
    serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn eval_logits_writes_transformers_logits_as_npy() {
    let env = Env::new();
    let dir = tiny_llama_copy(&env, "tiny-logits", |_| {});
    let g = golden();
    let ids: Vec<u64> = g["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let want: Vec<Vec<f32>> = serde_json::from_value(g["logits"].clone()).unwrap();
    let vocab = g["vocab_size"].as_u64().unwrap() as usize;
    // The golden prompt twice: each prompt runs on its own fresh cache, so both rows match.
    let prompts = env.file(
        "prompts.json",
        serde_json::to_string(&vec![ids.clone(), ids.clone()])
            .unwrap()
            .as_bytes(),
    );
    let out = env.dir.path().join("logits.npy");
    let o = env.run(&[
        "eval",
        "logits",
        dir.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--kv-cache-dtype",
        "f32",
    ]);
    ok(&o);
    let line = stdout(&o);
    assert_eq!(line.trim().lines().count(), 1, "one summary line: {line}");
    assert!(
        line.contains(&format!("[2, {}, {vocab}]", ids.len())),
        "{line}"
    );
    let (shape, data) = read_npy(&out);
    assert_eq!(shape, vec![2, ids.len(), vocab]);
    let mut worst = 0.0f32;
    for p in 0..2 {
        for (t, row) in want.iter().enumerate() {
            for (v, w) in row.iter().enumerate() {
                let got = data[(p * ids.len() + t) * vocab + v];
                worst = worst.max((got - w).abs());
            }
        }
    }
    // The model-crate golden test's f32 tolerance (forward_golden.rs).
    assert!(worst < 2e-4, "max |pagoda - transformers| = {worst}");
    assert!(!env.dir.path().join("logits.npy.partial").exists());

    // --json: one object with the shape; the default f16 KV cache stays close.
    let o = env.run(&[
        "eval",
        "logits",
        dir.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    ok(&o);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("one JSON object");
    assert_eq!(v["shape"], serde_json::json!([2, ids.len(), vocab]));
    assert_eq!(v["dtype"], "float32");
    assert_eq!(v["kv_cache_dtype"], "f16");
    let (_, f16_data) = read_npy(&out);
    let worst = data
        .iter()
        .zip(&f16_data)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst < 1e-2, "f16 KV cache moved logits by {worst}");
}

#[test]
fn eval_logits_refuses_bad_prompts_files_by_name() {
    let env = Env::new();
    let dir = tiny_llama_copy(&env, "tiny-logits", |_| {});
    let out = env.dir.path().join("bad.npy");
    let cases: &[(&str, &str)] = &[
        ("", "is empty"),
        ("  \n", "is empty"),
        ("[]", "holds no prompts"),
        ("{\"a\": 1}", "expected a JSON array of prompts"),
        ("[[1, 2], [3, -4]]", "expected a JSON array of prompts"),
        ("[[1, 2, 3], [4, 5]]", "prompts of different lengths"),
        ("[[1, 2], []]", "prompt 1 is empty"),
        (
            "[[1, 2], [3, 320]]",
            "token id 320 is out of the model's vocabulary",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let prompts = env.file(&format!("prompts{i}.json"), text.as_bytes());
        let o = env.run(&[
            "eval",
            "logits",
            dir.to_str().unwrap(),
            "--prompts",
            prompts.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(1), "{text:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(want), "{text:?}: wanted {want:?} in:\n{err}");
        assert!(
            err.contains(&format!("prompts{i}.json")),
            "{text:?}: the file is named:\n{err}"
        );
        assert!(!out.exists(), "{text:?}: no output file");
        assert!(!env.dir.path().join("bad.npy.partial").exists());
    }
    // Out of vocabulary names the prompt and the position too.
    let prompts = env.file("oov.json", b"[[1, 2], [3, 320]]");
    let err = stderr(&env.run(&[
        "eval",
        "logits",
        dir.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]));
    assert!(err.contains("prompt 1, position 1"), "{err}");
    assert!(err.contains("vocabulary size 320"), "{err}");
    // A missing file is named too.
    let err = stderr(&env.run(&[
        "eval",
        "logits",
        dir.to_str().unwrap(),
        "--prompts",
        "/nonexistent/prompts.json",
        "--out",
        out.to_str().unwrap(),
    ]));
    assert!(err.contains("/nonexistent/prompts.json"), "{err}");
}

#[test]
fn eval_logits_help_says_where_logits_come_from() {
    let env = Env::new();
    assert!(out_of(&env, &["eval", "--help"]).contains("logits"));
    let out = out_of(&env, &["eval", "logits", "--help"]);
    for word in [
        "--prompts",
        "--out",
        "--kv-cache-dtype",
        ".npy",
        "[prompts, positions, vocab]",
        "device the model",
        "compare_logits.py",
    ] {
        assert!(
            out.contains(word),
            "eval logits --help lacks {word}:\n{out}"
        );
    }
}
