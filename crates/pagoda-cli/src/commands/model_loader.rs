//! Finding, loading and preparing a model for generation, shared by `run` and `bench`.

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use pagoda_engine::SamplingParams;
use pagoda_model::arch::Model;
use pagoda_model::chat_template::{ChatMessage, ChatTemplate};
use pagoda_model::source::{open_model, ModelSource};
use pagoda_model::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A model, its tokenizer and chat template, ready for a [`pagoda_engine::Generator`].
pub struct LoadedModel {
    pub path: PathBuf,
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: ChatTemplate,
    pub default_sampling: SamplingParams,
    /// System message to use when the user gives none (from the catalog entry).
    pub default_system: Option<String>,
    pub load_time: Duration,
    pub file_bytes: u64,
}

impl LoadedModel {
    /// Renders `messages` with the chat template (with the generation prompt) and tokenizes
    /// them, with exactly one BOS when the model wants one.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> anyhow::Result<Vec<u32>> {
        let text = self.chat_template.render(messages, true)?;
        let mut tokens = self.tokenizer.encode(&text, true)?;
        // Templates that write the BOS text themselves would otherwise get a second one.
        if let Some(bos) = self.tokenizer.bos_id() {
            if tokens.len() >= 2 && tokens[0] == bos && tokens[1] == bos {
                tokens.remove(0);
            }
        }
        Ok(tokens)
    }
}

/// Resolves `name` (a path, or a store/catalog name, pulling it if missing) to a file or folder.
pub fn resolve(name: &str) -> anyhow::Result<PathBuf> {
    let as_path = Path::new(name);
    if as_path.exists() {
        return Ok(as_path.to_path_buf());
    }
    let store = pagoda_store::Store::open(None).context("opening the model store")?;
    let resolved = pagoda_store::resolve_or_pull(&store, name)?;
    Ok(resolved.path)
}

/// Resolves and loads `name`, with a spinner on stderr while the weights are mapped.
pub fn load_for_generation(name: &str) -> anyhow::Result<LoadedModel> {
    let path = resolve(name)?;
    let spinner = ProgressBar::new_spinner();
    spinner.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("static template"));
    spinner.set_message(format!("loading {}", path.display()));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let started = Instant::now();
    let loaded = load_path(&path);
    spinner.finish_and_clear();
    let mut loaded = loaded?;
    loaded.load_time = started.elapsed();
    if !Path::new(name).exists() {
        if let Some(entry) = pagoda_store::catalog::lookup(name) {
            loaded.default_system = entry.system.clone();
            if let Some(t) = entry.temperature {
                loaded.default_sampling.temperature = t;
            }
        }
    }
    tracing::info!(path = %path.display(), secs = loaded.load_time.as_secs_f64(), "model loaded");
    Ok(loaded)
}

fn load_path(path: &Path) -> anyhow::Result<LoadedModel> {
    let source: ModelSource =
        open_model(path).with_context(|| format!("loading model {}", path.display()))?;
    let model = Model::from_source(&source)?;
    let chat_template = source.chat_template_or_default();
    let mut default_sampling = SamplingParams::default();
    let g = &source.generation;
    if let Some(t) = g.temperature {
        default_sampling.temperature = t;
    }
    if let Some(p) = g.top_p {
        default_sampling.top_p = p;
    }
    if let Some(k) = g.top_k {
        default_sampling.top_k = k;
    }
    if let Some(m) = g.min_p {
        default_sampling.min_p = m;
    }
    if let Some(r) = g.repetition_penalty {
        default_sampling.repetition_penalty = r;
    }
    let file_bytes = dir_or_file_size(path);
    Ok(LoadedModel {
        path: path.to_path_buf(),
        model: Arc::new(model),
        tokenizer: Arc::new(source.tokenizer),
        chat_template,
        default_sampling,
        default_system: None,
        load_time: Duration::ZERO,
        file_bytes,
    })
}

fn dir_or_file_size(path: &Path) -> u64 {
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
