//! Finding and loading a model for generation: store name or path → weights, tokenizer,
//! chat template and the defaults the model (generation_config / GGUF) and the catalog
//! (an Ollama-style SYSTEM and PARAMETER layer) ask for. Shared by the server and the CLI.
//!
//! Invariant: loading never pulls unless asked (`Pull::IfMissing`); the server refuses
//! unknown models with 404 instead of downloading behind a client's back.

use pagoda_engine::SamplingParams;
use pagoda_model::arch::Model;
use pagoda_model::chat_template::{ChatMessage, ChatTemplate};
use pagoda_model::source::{open_model, GenerationDefaults, ModelInfo, ModelSource};
use pagoda_model::tokenizer::Tokenizer;
use pagoda_model::ModelError;
use pagoda_store::{ResolvedModel, Store, StoreError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "model `{0}` is not in the store; pull it first (`pagoda pull {0}` or POST /api/pull)"
    )]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("loading model {path}: {source}")]
    Model {
        path: PathBuf,
        #[source]
        source: ModelError,
    },
}

/// Whether [`resolve`] may download a missing catalog model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pull {
    IfMissing,
    Never,
}

/// A model, its tokenizer and chat template, ready for the engine.
pub struct LoadedModel {
    pub path: PathBuf,
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: ChatTemplate,
    /// Sampling when a request names nothing (llama.cpp/Ollama defaults under the model's).
    pub default_sampling: SamplingParams,
    /// What the model's generation_config / GGUF asks for (the OpenAI API's defaults start
    /// from these, as vLLM's do).
    pub generation: GenerationDefaults,
    /// Temperature the catalog entry sets, if any.
    pub catalog_temperature: Option<f32>,
    /// System message to use when the user gives none (from the catalog entry).
    pub default_system: Option<String>,
    pub load_time: Duration,
    pub file_bytes: u64,
    /// sha256 of the main weights file, when the model came from the store.
    pub digest: Option<String>,
    /// Architecture, parameter count, file type, context length.
    pub info: ModelInfo,
    /// The chat template's source text.
    pub template_source: String,
}

impl LoadedModel {
    /// Renders `messages` with the chat template (with the generation prompt) and tokenizes
    /// them, with exactly one BOS when the model wants one.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, ModelError> {
        let text = self.chat_template.render(messages, true)?;
        self.encode_rendered(&text)
    }

    /// Tokenizes text that already holds the template's markup (special tokens parsed).
    pub fn encode_rendered(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let mut tokens = self.tokenizer.encode(text, true)?;
        // Templates that write the BOS text themselves would otherwise get a second one.
        if let Some(bos) = self.tokenizer.bos_id() {
            if tokens.len() >= 2 && tokens[0] == bos && tokens[1] == bos {
                tokens.remove(0);
            }
        }
        Ok(tokens)
    }

    /// The OpenAI API's default sampling: OpenAI's neutral values (temperature 1, no
    /// truncation) under the model's own generation defaults.
    pub fn openai_sampling(&self) -> SamplingParams {
        let mut s = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplingParams::default()
        };
        apply_generation_defaults(&mut s, &self.generation);
        if let Some(t) = self.catalog_temperature {
            s.temperature = t;
        }
        s
    }

    /// `messages` with the default system message in front when they carry none.
    pub fn with_default_system(&self, messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
        match &self.default_system {
            Some(system) if !messages.iter().any(|m| m.role == "system") => {
                let mut all = Vec::with_capacity(messages.len() + 1);
                all.push(ChatMessage::new("system", system));
                all.extend(messages);
                all
            }
            _ => messages,
        }
    }
}

/// Resolves `name` (an existing path, or a store name) to what to open.
pub fn resolve(store: &Store, name: &str, pull: Pull) -> Result<ResolvedModel, LoadError> {
    match pull {
        Pull::IfMissing => Ok(pagoda_store::resolve_or_pull(store, name)?),
        Pull::Never => {
            if Path::new(name).exists() {
                return Ok(pagoda_store::resolve_or_pull(store, name)?);
            }
            store
                .resolve(name)?
                .ok_or_else(|| LoadError::NotFound(name.to_string()))
        }
    }
}

/// Loads a resolved model; `name` picks the catalog defaults (none for plain paths).
pub fn load(resolved: &ResolvedModel, name: &str) -> Result<LoadedModel, LoadError> {
    let started = Instant::now();
    let path = &resolved.path;
    let mut loaded = load_path(path).map_err(|source| LoadError::Model {
        path: path.clone(),
        source,
    })?;
    loaded.load_time = started.elapsed();
    loaded.digest = resolved
        .manifest
        .as_ref()
        .and_then(|m| m.primary())
        .map(|f| f.digest.to_string());
    if !Path::new(name).exists() {
        if let Some(entry) = pagoda_store::catalog::lookup(name) {
            loaded.default_system = entry.system.clone();
            if let Some(t) = entry.temperature {
                loaded.default_sampling.temperature = t;
                loaded.catalog_temperature = Some(t);
            }
        }
    }
    tracing::info!(path = %path.display(), secs = loaded.load_time.as_secs_f64(), "model loaded");
    Ok(loaded)
}

fn load_path(path: &Path) -> Result<LoadedModel, ModelError> {
    let source: ModelSource = open_model(path)?;
    let model = Model::from_source(&source)?;
    let chat_template = source.chat_template_or_default();
    let mut default_sampling = SamplingParams::default();
    apply_generation_defaults(&mut default_sampling, &source.generation);
    Ok(LoadedModel {
        path: path.to_path_buf(),
        model: Arc::new(model),
        tokenizer: Arc::new(source.tokenizer),
        chat_template,
        default_sampling,
        generation: source.generation.clone(),
        catalog_temperature: None,
        default_system: None,
        load_time: Duration::ZERO,
        file_bytes: dir_or_file_size(path),
        digest: None,
        info: source.info.clone(),
        template_source: source
            .chat_template
            .as_ref()
            .map(|t| t.source().to_string())
            .unwrap_or_default(),
    })
}

/// Overlays the values a model's generation config sets.
fn apply_generation_defaults(s: &mut SamplingParams, g: &GenerationDefaults) {
    if let Some(t) = g.temperature {
        s.temperature = t;
    }
    if let Some(p) = g.top_p {
        s.top_p = p;
    }
    if let Some(k) = g.top_k {
        s.top_k = k;
    }
    if let Some(m) = g.min_p {
        s.min_p = m;
    }
    if let Some(r) = g.repetition_penalty {
        s.repetition_penalty = r;
    }
}

/// Bytes of a file, or of the files directly in a folder.
pub fn dir_or_file_size(path: &Path) -> u64 {
    if path.is_dir() {
        std::fs::read_dir(path)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    } else {
        std::fs::metadata(path).map_or(0, |m| m.len())
    }
}
