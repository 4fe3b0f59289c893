//! [`validate_model`]: does a model file or folder load? The checks loading makes, without
//! what loading costs: a model store asks this before it lists a model.
//!
//! A folder whose config.json is a BERT encoder is opened as [`EmbeddingModel::load`] opens it
//! (config, shape-checked weights, tokenizer); anything else as [`open_model`] opens it (GGUF
//! header and tensor table, or config.json and safetensors headers; config; tokenizer; chat
//! template), then [`Model::check`] checks every tensor the architecture needs for presence,
//! shape and byte length.
//!
//! Invariants: files are only mapped and parsed, never copied or changed; no forward pass
//! runs and nothing is quantized or repacked (a GPTQ/AWQ folder's packed linears are
//! converted as loading converts them, which is the check that they can be); the outcome is
//! the same as loading's: a model that passes loads, and one that fails gives loading's error.

use std::path::Path;

use crate::embedding::{is_bert_folder, EmbeddingModel};
use crate::source::{open_model, ModelSource};
use crate::{Model, ModelError};

/// A model that passed [`validate_model`], opened (weights still borrowed from the files).
#[derive(Debug)]
pub enum Validated {
    /// A causal language model: what the engine runs.
    Generative(Box<ModelSource>),
    /// A BERT sentence encoder: what the embedding routes run.
    Embedding(Box<EmbeddingModel>),
}

/// Opens the model at `path` (a GGUF file, or a Hugging Face folder) as loading does and
/// checks that it would load; `Err` is the error loading would give, naming the file and the
/// key or tensor at fault.
pub fn validate_model(path: &Path) -> Result<Validated, ModelError> {
    if path.is_dir() && is_bert_folder(path) {
        return Ok(Validated::Embedding(Box::new(EmbeddingModel::load(path)?)));
    }
    let source = open_model(path)?;
    Model::check(&source)?;
    Ok(Validated::Generative(Box::new(source)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn golden(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/golden")
            .join(name)
    }

    /// A copy of golden folder `name` in a temp dir, for surgery.
    fn copy_of(name: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(golden(name)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
        }
        dir
    }

    #[test]
    fn the_tiny_models_pass() {
        for name in ["tiny-llama", "tiny-qwen2", "tiny-gemma3", "tiny-llama-gptq"] {
            match validate_model(&golden(name)) {
                Ok(Validated::Generative(s)) => assert!(s.info.parameter_count > 0, "{name}"),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_missing_or_misshapen_tensor_fails_as_loading_does() {
        // config.json asks for a wider MLP than the weights have: open_model passes, the
        // tensor check does not.
        let dir = copy_of("tiny-llama");
        let cfg = dir.path().join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
        v["intermediate_size"] = 96.into();
        std::fs::write(&cfg, v.to_string()).unwrap();
        assert!(open_model(dir.path()).is_ok());
        let e = validate_model(dir.path()).unwrap_err().to_string();
        assert!(e.contains("ffn_gate.weight"), "{e}");
        assert!(e.contains("96"), "{e}");
    }

    #[test]
    fn a_cut_safetensors_file_or_a_missing_tokenizer_fails() {
        let dir = copy_of("tiny-llama");
        let st = dir.path().join("model.safetensors");
        let bytes = std::fs::read(&st).unwrap();
        std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
        let e = validate_model(dir.path()).unwrap_err().to_string();
        assert!(e.contains("model.safetensors"), "{e}");

        let dir = copy_of("tiny-llama");
        std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
        let e = validate_model(dir.path()).unwrap_err().to_string();
        assert!(e.contains("tokenizer.json"), "{e}");
    }

    #[test]
    fn garbage_and_missing_paths_fail() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x.gguf");
        let mut bytes = b"GGUF\x03\x00\x00\x00".to_vec();
        bytes.extend([7u8; 64]);
        std::fs::write(&f, bytes).unwrap();
        assert!(validate_model(&f).is_err());
        assert!(validate_model(&dir.path().join("absent")).is_err());
        // A folder with no config.json.
        assert!(validate_model(dir.path()).is_err());
    }

    #[test]
    fn bert_folders_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let write = |v: serde_json::Value| {
            std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap()
        };
        write(serde_json::json!({"model_type": "bert"}));
        assert!(is_bert_folder(dir.path()));
        write(serde_json::json!({"architectures": ["BertModel"]}));
        assert!(is_bert_folder(dir.path()));
        write(serde_json::json!({"model_type": "llama"}));
        assert!(!is_bert_folder(dir.path()));
        // A BERT config with nothing else is an embedding model that does not load.
        write(serde_json::json!({"model_type": "bert"}));
        let e = validate_model(dir.path()).unwrap_err().to_string();
        assert!(!e.is_empty());
        assert!(!is_bert_folder(&golden("tiny-llama")));
    }

    #[test]
    fn a_bert_folder_opens_as_an_embedding_model() {
        let dir = tempfile::tempdir().unwrap();
        crate::embedding::tests::write_tiny(dir.path());
        match validate_model(dir.path()) {
            Ok(Validated::Embedding(m)) => assert!(m.dimensions() > 0),
            other => panic!("{other:?}"),
        }
        std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
        let e = validate_model(dir.path()).unwrap_err().to_string();
        assert!(e.contains("model.safetensors"), "{e}");
    }
}
