//! Helpers shared by the tests: the tiny golden models (Hugging Face folders in
//! tests/golden) and a GGUF of one, written as `pagoda quantize` writes a folder's GGUF
//! (Llama Q/K rows permuted as llama.cpp's converter does).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use pagoda_compress::quantize::gguf_meta::HfGgufSource;
use pagoda_compress::quantize::write::write_gguf_from_hf;
use pagoda_kernels::GgmlType;
use pagoda_model::hf::HfFolder;
use pagoda_model::open_model;
use pagoda_model::safetensors::{write_safetensors, SafetensorsFile};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `tests/golden/<name>`.
pub fn golden(name: &str) -> PathBuf {
    repo().join("tests/golden").join(name)
}

/// The tiny golden folder `name` written as an F32 GGUF into `dir`.
pub fn gguf_of(name: &str, dir: &Path) -> PathBuf {
    gguf_of_folder(&golden(name), name, dir)
}

/// The folder `src_dir` written as an F32 GGUF `dir/<name>.gguf`.
pub fn gguf_of_folder(src_dir: &Path, name: &str, dir: &Path) -> PathBuf {
    let src_dir = src_dir.to_path_buf();
    let src = open_model(&src_dir).expect("golden folder");
    let folder = HfFolder::open(&src_dir).expect("folder");
    let cfg_json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(src_dir.join("config.json")).expect("config.json"),
    )
    .expect("json");
    let out = dir.join(format!("{name}.gguf"));
    write_gguf_from_hf(
        &HfGgufSource {
            dir: &src_dir,
            config_json: &cfg_json,
            cfg: &src.config,
            tokenizer: &src.tokenizer,
            chat_template: src.chat_template.as_ref().map(|t| t.source()),
        },
        &folder.weights,
        GgmlType::F32,
        "test",
        &out,
    )
    .expect("gguf");
    out
}

/// `max |a - b| / max |b|`.
pub fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let d = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let m = b.iter().map(|x| x.abs()).fold(0f32, f32::max);
    d / m.max(1e-12)
}

/// A copy of the tiny golden folder `name` in `dir/<name>-student` with Gaussian noise of
/// standard deviation `noise` (relative to each tensor's RMS) added to every weight: a
/// student that differs from its teacher but shares its tokenizer.
pub fn perturbed_copy(name: &str, dir: &Path, noise: f32, seed: u64) -> PathBuf {
    let from = golden(name);
    let to = dir.join(format!("{name}-student"));
    std::fs::create_dir_all(&to).expect("mkdir");
    for entry in std::fs::read_dir(&from).expect("read_dir") {
        let p = entry.expect("entry").path();
        let file = p.file_name().expect("name").to_owned();
        if file != "model.safetensors" && file != "logits.json" {
            std::fs::copy(&p, to.join(&file)).expect("copy");
        }
    }
    let st = SafetensorsFile::open(from.join("model.safetensors")).expect("safetensors");
    let mut rng = Rng(seed.wrapping_mul(2654435761).wrapping_add(1));
    let mut owned = Vec::new();
    for t in st.tensors() {
        let mut v = t.to_f32().expect("f32");
        let rms = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
        for x in v.iter_mut() {
            *x += noise * rms * rng.normal();
        }
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        owned.push((t.name.clone(), t.shape.clone(), bytes));
    }
    let refs: Vec<(&str, &str, Vec<usize>, Vec<u8>)> = owned
        .iter()
        .map(|(n, s, b)| (n.as_str(), "F32", s.clone(), b.clone()))
        .collect();
    std::fs::write(to.join("model.safetensors"), write_safetensors(&refs)).expect("write");
    to
}

/// A small deterministic generator (xorshift) for test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Approximately standard normal (sum of 12 uniforms).
    pub fn normal(&mut self) -> f32 {
        (0..12).map(|_| self.next_f32()).sum::<f32>() - 6.0
    }
}
