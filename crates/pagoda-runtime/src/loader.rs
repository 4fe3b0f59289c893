//! Finding and loading a model for generation: store name or path → weights, tokenizer,
//! chat template and the defaults the model (generation_config / GGUF), the catalog (an
//! Ollama-style SYSTEM and PARAMETER layer) and a derived model's Modelfile layer
//! (`pagoda create`: PARAMETER, TEMPLATE, SYSTEM, MESSAGE, ADAPTER) ask for, applied in that
//! order.
//! [`LoadOptions::quantize`] quantizes the weights in memory (pagoda-compress) between
//! reading them and building the forward pass, so every command and the server get it;
//! without a type, [`LoadOptions::auto_quantize`] lets [`crate::quant_choice`] pick one that
//! fits [`LoadOptions::fit`] (`--quantize auto`, and float folders that would not fit).
//! Every front end (the server and the CLI commands) loads through here.
//!
//! Invariant: loading never pulls unless asked (`Pull::IfMissing`); the server refuses
//! unknown models with 404 instead of downloading behind a client's back. A Modelfile
//! TEMPLATE is Jinja (Ollama's Go templates are refused with [`LoadError::Template`]).

use crate::quant_choice::{AutoQuantize, FitBudget, QuantDecision};
use pagoda_compress::quantize::{quantize_weights, QuantOptions, QuantReport, QuantTarget};
use pagoda_compress::CompressError;
use pagoda_engine::SamplingParams;
use pagoda_model::arch::{LoraWeights, Model};
use pagoda_model::chat_template::{ChatMessage, ChatTemplate, TemplateKwargs};
use pagoda_model::source::{open_model, GenerationDefaults, ModelInfo, ModelSource};
use pagoda_model::tokenizer::{Shield, Tokenizer};
use pagoda_model::ModelFormat;
use pagoda_model::{DeviceChoice, ModelError};
use pagoda_store::modelfile::{looks_like_go_template, Modelfile, Parameters};
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
    #[error("model `{name}`: its Modelfile TEMPLATE cannot be used: {message}")]
    Template { name: String, message: String },
    #[error("model `{name}`: its Modelfile ADAPTER cannot be used: {source}")]
    Adapter {
        name: String,
        #[source]
        source: ModelError,
    },
    #[error("model {path}: {source}")]
    AutoQuantize {
        path: PathBuf,
        #[source]
        source: crate::quant_choice::AutoQuantError,
    },
    #[error("quantizing model {path}: {source}")]
    Quantize {
        path: PathBuf,
        #[source]
        source: CompressError,
    },
}

/// How a model's weights are prepared at load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Quantize the weights in memory to this type before building the model (online
    /// quantization; see `pagoda_compress::quantize`). `None`: serve the file's own types.
    pub quantize: Option<QuantTarget>,
    /// With no `quantize` type: whether to pick one that fits `fit` ([`crate::quant_choice`]).
    pub auto_quantize: AutoQuantize,
    /// What the automatic choice sizes against; `None`: one sequence of
    /// [`crate::quant_choice::DEFAULT_CONTEXT`] tokens in the machine's default budget.
    pub fit: Option<FitBudget>,
    /// Where the weights go and the forward pass runs (`auto`: a usable NVIDIA GPU, as many
    /// layers on it as fit and the rest on the CPU; else the CPU).
    pub device: DeviceChoice,
    /// `--gpu-layers N`: the last `N` decoder layers on the GPU whatever the plan says
    /// (`pagoda_model::placement`).
    pub gpu_layers: Option<usize>,
    /// Read control-token texts in chat messages and tools as control tokens (the behaviour
    /// before client text was shielded). Unsafe: a message can then forge turns.
    pub control_tokens_in_messages: bool,
}

/// The log target of the placement line when it says nothing a person needs (the CPU, asked
/// for or the only device): front ends hide it unless asked for more (`-v`).
pub const PLACEMENT_NOTE: &str = "pagoda::placement_note";

/// Whether where a model runs is worth a line by default: always when a GPU was asked for
/// (`--device cuda…`, `--gpu-layers N`) or is used, and when a GPU's driver is there but
/// something else is missing; not for `--device cpu`, nor for `auto` on a machine without an
/// NVIDIA driver, where the CPU is all there is (issue 41: no GPU line on a CPU machine).
fn placement_is_news(options: &LoadOptions, device: pagoda_model::Device) -> bool {
    let gpu_asked = options.gpu_layers.is_some_and(|n| n > 0);
    match options.device {
        DeviceChoice::Cpu => false,
        DeviceChoice::Auto if device == pagoda_model::Device::Cpu && !gpu_asked => {
            !pagoda_model::device::nvidia_driver_missing()
        }
        _ => true,
    }
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
    /// System message to use when the user gives none (the catalog entry's, or the
    /// Modelfile's SYSTEM).
    pub default_system: Option<String>,
    /// The Modelfile's PARAMETER values (empty for plain models); `openai_sampling` applies
    /// them too.
    pub parameters: Parameters,
    /// The Modelfile's MESSAGE lines, put after the system message of every chat.
    pub preset_messages: Vec<ChatMessage>,
    /// The Modelfile's `stop` parameters; a request's own stop strings are added to these.
    pub default_stop: Vec<String>,
    /// The Modelfile's `num_predict` (positive), for requests that set no limit.
    pub default_max_tokens: Option<usize>,
    /// The Modelfile's `num_ctx`: the context a request may use (at most the engine's).
    pub context_limit: Option<usize>,
    pub load_time: Duration,
    pub file_bytes: u64,
    /// sha256 of the main weights file, when the model came from the store.
    pub digest: Option<String>,
    /// Architecture, parameter count, file type, context length.
    pub info: ModelInfo,
    /// The chat template's source text.
    pub template_source: String,
    /// What online quantization did, when [`LoadOptions::quantize`] (or the automatic
    /// choice) asked for it.
    pub quantization: Option<QuantReport>,
    /// What the automatic choice picked and why, when it made one.
    pub quant_choice: Option<QuantDecision>,
    /// What loading a GPTQ/AWQ checkpoint folder did (its linears converted at load).
    pub checkpoint_quant: Option<pagoda_model::hf_quant::CheckpointQuantReport>,
    /// The Modelfile's ADAPTER (a PEFT LoRA folder), applied unmerged to every request that
    /// names no other adapter.
    pub adapter: Option<LoraWeights>,
    /// Where the model was placed and why (`placing 20 of 28 layers on cuda:0 ...`,
    /// `cpu: no NVIDIA GPU found`): the start-up report's line.
    pub placement: String,
    /// [`LoadOptions::control_tokens_in_messages`].
    pub control_tokens_in_messages: bool,
}

/// `message` with every client string in it shielded (roles, content, names, tool calls).
fn shield_message(shield: &mut Shield<'_>, message: &ChatMessage) -> ChatMessage {
    ChatMessage {
        role: shield.text(&message.role),
        content: shield.text(&message.content),
        tool_calls: message.tool_calls.as_ref().map(|calls| {
            calls
                .iter()
                .map(|c| {
                    let mut call = c.clone();
                    call.id = c.id.as_deref().map(|id| shield.text(id));
                    call.function.name = shield.text(&c.function.name);
                    shield.json(&mut call.function.arguments);
                    call
                })
                .collect()
        }),
        tool_call_id: message.tool_call_id.as_deref().map(|id| shield.text(id)),
        name: message.name.as_deref().map(|n| shield.text(n)),
        reasoning_content: message.reasoning_content.as_deref().map(|r| shield.text(r)),
    }
}

impl LoadedModel {
    /// Bytes the weights take in memory: after online quantization, its result; for a GPTQ/AWQ
    /// checkpoint, the weights as converted at load; otherwise
    /// the file's size (the weights are mapped from it).
    pub fn weights_bytes(&self) -> u64 {
        match (&self.quantization, &self.checkpoint_quant) {
            (Some(q), _) => q.bytes_after(),
            (None, Some(c)) => c.weight_bytes,
            (None, None) => self.file_bytes,
        }
    }

    /// Renders `messages` with the chat template (with the generation prompt) and tokenizes
    /// them, with exactly one BOS when the model wants one.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, ModelError> {
        self.encode_chat_with_tools::<()>(messages, None)
    }

    /// [`Self::encode_chat`] with `tools` for the template. Text from the messages and tools
    /// is the client's: control-token texts in it (`<|im_end|>` in a message) are tokenized
    /// as plain text, so they cannot open or close a turn ([`Shield`]), unless
    /// [`LoadOptions::control_tokens_in_messages`] turned that off.
    pub fn encode_chat_with_tools<T: serde::Serialize>(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[T]>,
    ) -> Result<Vec<u32>, ModelError> {
        self.encode_chat_with(messages, tools, &TemplateKwargs::new())
    }

    /// [`Self::encode_chat_with_tools`] with extra template variables (`chat_template_kwargs`,
    /// the thinking switch), shielded as the messages are.
    pub fn encode_chat_with<T: serde::Serialize>(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[T]>,
        kwargs: &TemplateKwargs,
    ) -> Result<Vec<u32>, ModelError> {
        let mut shield = if self.control_tokens_in_messages {
            Shield::off(&self.tokenizer)
        } else {
            Shield::new(&self.tokenizer)
        };
        let messages: Vec<ChatMessage> = messages
            .iter()
            .map(|m| shield_message(&mut shield, m))
            .collect();
        let tools = match tools {
            Some(tools) => {
                let mut value = serde_json::to_value(tools).map_err(|e| {
                    ModelError::ChatTemplate(format!("cannot pass the tools to the template: {e}"))
                })?;
                shield.json(&mut value);
                match value {
                    serde_json::Value::Array(items) => Some(items),
                    other => Some(vec![other]),
                }
            }
            None => None,
        };
        let mut kwargs = serde_json::Value::Object(kwargs.clone());
        shield.json(&mut kwargs);
        let kwargs = match kwargs {
            serde_json::Value::Object(map) => map,
            _ => TemplateKwargs::new(),
        };
        let text = self
            .chat_template
            .render_with(&messages, tools.as_deref(), true, &kwargs)?;
        self.one_bos(shield.encode(&text, true)?)
    }

    /// Tokenizes text that already holds the template's markup (special tokens parsed): a
    /// raw prompt, which the client wrote markup and all.
    pub fn encode_rendered(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        self.one_bos(self.tokenizer.encode(text, true)?)
    }

    /// `tokens` with a doubled leading BOS made one: templates that write the BOS text
    /// themselves would otherwise get a second.
    fn one_bos(&self, mut tokens: Vec<u32>) -> Result<Vec<u32>, ModelError> {
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
        apply_parameters(&mut s, &self.parameters);
        s
    }

    /// `messages` with the default system message in front when they carry none, then the
    /// Modelfile's MESSAGE turns after the leading system messages.
    pub fn with_preset(&self, messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
        let mut all = self.with_default_system(messages);
        let at = all.iter().take_while(|m| m.role == "system").count();
        all.splice(at..at, self.preset_messages.iter().cloned());
        all
    }

    /// The model's default stop strings followed by the request's (duplicates dropped).
    pub fn stops_with(&self, request: Vec<String>) -> Vec<String> {
        let mut all = self.default_stop.clone();
        for s in request {
            if !all.contains(&s) {
                all.push(s);
            }
        }
        all
    }

    /// The context a request may use: the engine's, or less when the Modelfile says so.
    pub fn context_window(&self, engine_max: usize) -> usize {
        self.context_limit.map_or(engine_max, |n| n.min(engine_max))
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

/// What a model file is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A causal language model the engine runs.
    Generative,
    /// A sentence encoder (BERT) for embeddings.
    Embedding,
}

/// Tells embedding models (an HF folder whose config.json is a BERT) from generative ones.
pub fn kind_of(path: &Path) -> ModelKind {
    if pagoda_model::embedding::is_bert_folder(path) {
        ModelKind::Embedding
    } else {
        ModelKind::Generative
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

/// Loads a resolved model with the default [`LoadOptions`]; `name` picks the catalog
/// defaults (none for plain paths).
pub fn load(resolved: &ResolvedModel, name: &str) -> Result<LoadedModel, LoadError> {
    load_with(resolved, name, &LoadOptions::default())
}

/// Loads a resolved model as `options` ask; `name` picks the catalog defaults (none for
/// plain paths).
pub fn load_with(
    resolved: &ResolvedModel,
    name: &str,
    options: &LoadOptions,
) -> Result<LoadedModel, LoadError> {
    let started = Instant::now();
    let path = &resolved.path;
    let mut loaded = load_path(path, options)?;
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
    if let Some(layer) = resolved
        .manifest
        .as_ref()
        .and_then(|m| m.modelfile.as_ref())
    {
        apply_modelfile(&mut loaded, layer).map_err(|message| LoadError::Template {
            name: name.to_string(),
            message,
        })?;
        if let Some(dir) = layer.adapters.first() {
            let adapter = LoraWeights::open(name, dir, &loaded.model).map_err(|source| {
                LoadError::Adapter {
                    name: name.to_string(),
                    source,
                }
            })?;
            tracing::info!(adapter = %dir, rank = adapter.rank(), "Modelfile ADAPTER applied to every request");
            loaded.adapter = Some(adapter);
        }
    }
    tracing::info!(path = %path.display(), secs = loaded.load_time.as_secs_f64(), "model loaded");
    Ok(loaded)
}

fn load_path(path: &Path, options: &LoadOptions) -> Result<LoadedModel, LoadError> {
    let model_error = |source| LoadError::Model {
        path: path.to_path_buf(),
        source,
    };
    let mut source: ModelSource = open_model(path).map_err(model_error)?;
    let (target, quant_choice) = match options.quantize {
        Some(target) => (Some(target), None),
        None => auto_choice(path, &source, options)?,
    };
    let quantization = match target {
        Some(target) => Some(quantize_source(&mut source, target)?),
        None => None,
    };
    let (model, placement) = Model::from_source_placed(&source, options.device, options.gpu_layers)
        .map_err(model_error)?;
    if placement_is_news(options, model.device()) {
        tracing::info!(device = %model.device(), "{}", placement.reason);
    } else {
        tracing::info!(target: PLACEMENT_NOTE, device = %model.device(), "{}", placement.reason);
    }
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
        parameters: Parameters::default(),
        preset_messages: Vec::new(),
        default_stop: Vec::new(),
        default_max_tokens: None,
        context_limit: None,
        load_time: Duration::ZERO,
        file_bytes: dir_or_file_size(path),
        digest: None,
        info: source.info.clone(),
        template_source: source
            .chat_template
            .as_ref()
            .map(|t| t.source().to_string())
            .unwrap_or_default(),
        quantization,
        quant_choice,
        checkpoint_quant: source.checkpoint_quant.clone(),
        adapter: None,
        placement: placement.reason,
        control_tokens_in_messages: options.control_tokens_in_messages,
    })
}

/// The automatic quantization choice for `source` (see [`LoadOptions::auto_quantize`]): by
/// default only a Hugging Face folder is considered, and a GPTQ/AWQ checkpoint or a quantized
/// GGUF is always served as is. Logs the decision.
fn auto_choice(
    path: &Path,
    source: &ModelSource,
    options: &LoadOptions,
) -> Result<(Option<QuantTarget>, Option<QuantDecision>), LoadError> {
    let mode = match options.auto_quantize {
        AutoQuantize::IfTooBig if source.format != ModelFormat::HfFolder => AutoQuantize::Off,
        _ if source.checkpoint_quant.is_some() => AutoQuantize::Off,
        mode => mode,
    };
    if mode == AutoQuantize::Off {
        return Ok((None, None));
    }
    let Some(fit) = options
        .fit
        .or_else(|| FitBudget::single_sequence(crate::quant_choice::DEFAULT_CONTEXT))
    else {
        tracing::debug!("no memory budget known: the weights are served as stored");
        return Ok((None, None));
    };
    let decision = crate::quant_choice::decide(
        mode,
        &source.config,
        &source.weights,
        dir_or_file_size(path),
        &fit,
    )
    .map_err(|e| LoadError::AutoQuantize {
        path: path.to_path_buf(),
        source: e,
    })?;
    match &decision {
        Some(d) => tracing::info!(path = %path.display(), "{d}"),
        None if mode == AutoQuantize::Always => tracing::info!(
            path = %path.display(),
            "--quantize auto: the model is already quantized, or fits as stored; served as is"
        ),
        None => {}
    }
    Ok((decision.as_ref().and_then(|d| d.picked.target), decision))
}

/// Replaces `source`'s weights by their quantization to `target` and its summary by the new
/// types; logs what it did.
fn quantize_source(
    source: &mut ModelSource,
    target: QuantTarget,
) -> Result<QuantReport, LoadError> {
    let (weights, report) = quantize_weights(&source.weights, target, &QuantOptions::default())
        .map_err(|e| LoadError::Quantize {
            path: source.path.clone(),
            source: e,
        })?;
    source.weights = weights;
    source.info.file_type = target.to_string();
    source.info.tensor_types = report
        .types_after()
        .into_iter()
        .map(|(t, n)| (t.to_string(), n))
        .collect();
    tracing::info!(
        path = %source.path.display(),
        target = %target,
        converted = report.n_converted(),
        kept = report.n_kept(),
        fell_back = report.fallbacks().count(),
        before_mib = report.bytes_before() as f64 / 1048576.0,
        after_mib = report.bytes_after() as f64 / 1048576.0,
        secs = report.elapsed.as_secs_f64(),
        types = %report.types_after_summary(),
        "weights quantized at load"
    );
    Ok(report)
}

/// Applies a derived model's Modelfile layer; `Err` says why its TEMPLATE is unusable.
fn apply_modelfile(loaded: &mut LoadedModel, layer: &Modelfile) -> Result<(), String> {
    if let Some(source) = &layer.template {
        if looks_like_go_template(source) {
            return Err(concat!(
                "it looks like an Ollama Go template ({{ .Prompt }}); pagoda's chat templates ",
                "are Jinja ({% for message in messages %}...)"
            )
            .into());
        }
        let bos = loaded.tokenizer.bos_token().unwrap_or("").to_string();
        let eos = loaded.tokenizer.eos_token().unwrap_or("").to_string();
        loaded.chat_template =
            ChatTemplate::new(source.clone(), bos, eos).map_err(|e| e.to_string())?;
        loaded.template_source.clone_from(source);
    }
    let p = &layer.parameters;
    apply_parameters(&mut loaded.default_sampling, p);
    loaded.parameters = p.clone();
    if let Some(system) = &layer.system {
        // An empty SYSTEM removes the base's system message.
        loaded.default_system = Some(system.clone()).filter(|s| !s.is_empty());
    }
    loaded.preset_messages = layer
        .messages
        .iter()
        .map(|m| ChatMessage::new(m.role.as_str(), &m.content))
        .collect();
    loaded.default_stop.clone_from(&p.stop);
    loaded.default_max_tokens = p.num_predict.and_then(|n| usize::try_from(n).ok());
    loaded.context_limit = p.num_ctx.and_then(|n| usize::try_from(n).ok());
    Ok(())
}

/// Overlays the sampling values a Modelfile's PARAMETER lines set.
fn apply_parameters(s: &mut SamplingParams, p: &Parameters) {
    if let Some(t) = p.temperature {
        s.temperature = t;
    }
    if let Some(k) = p.top_k {
        s.top_k = usize::try_from(k).unwrap_or(usize::MAX);
    }
    if let Some(v) = p.top_p {
        s.top_p = v;
    }
    if let Some(v) = p.min_p {
        s.min_p = v;
    }
    if let Some(seed) = p.seed {
        // Negative: a random seed per request, as Ollama's -1.
        s.seed = u64::try_from(seed).ok();
    }
    if let Some(v) = p.repeat_penalty {
        s.repetition_penalty = v;
    }
    if let Some(n) = p.repeat_last_n {
        s.repeat_last_n =
            usize::try_from(n).unwrap_or(pagoda_engine::sampling::REPEAT_WHOLE_CONTEXT);
    }
    if let Some(v) = p.presence_penalty {
        s.presence_penalty = v;
    }
    if let Some(v) = p.frequency_penalty {
        s.frequency_penalty = v;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_store::{Format, Manifest, ModelName};

    /// The tiny Llama folder as a store model whose manifest carries `modelfile` as its layer.
    fn derived(modelfile: &str) -> ResolvedModel {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama");
        let name = ModelName::parse("derived:1").unwrap();
        let mut manifest = Manifest::new(&name, "./tiny".into(), Format::HfFolder, Vec::new());
        manifest.modelfile = Some(Modelfile::parse(modelfile).unwrap());
        ResolvedModel {
            name: Some(name),
            path,
            format: Format::HfFolder,
            manifest: Some(manifest),
        }
    }

    #[test]
    fn the_modelfile_layer_sets_the_defaults() {
        let m = load(
            &derived(
                "FROM tiny\nPARAMETER temperature 0\nPARAMETER top_k 3\nPARAMETER seed 7\n\
                 PARAMETER repeat_last_n -1\nPARAMETER stop <end>\nPARAMETER num_predict 9\n\
                 PARAMETER num_ctx 64\nSYSTEM Be brief.\nMESSAGE user Hi\nMESSAGE assistant Hello\n",
            ),
            "derived:1",
        )
        .unwrap();
        let s = &m.default_sampling;
        assert_eq!((s.temperature, s.top_k, s.seed), (0.0, 3, Some(7)));
        assert_eq!(
            s.repeat_last_n,
            pagoda_engine::sampling::REPEAT_WHOLE_CONTEXT
        );
        let o = m.openai_sampling();
        assert_eq!((o.temperature, o.top_k, o.seed), (0.0, 3, Some(7)));
        assert_eq!(m.default_system.as_deref(), Some("Be brief."));
        assert_eq!(m.default_max_tokens, Some(9));
        assert_eq!(m.context_window(4096), 64);
        assert_eq!(m.context_window(32), 32);
        assert_eq!(
            m.stops_with(vec!["x".into(), "<end>".into()]),
            vec!["<end>".to_string(), "x".to_string()]
        );
        let roles = |msgs: Vec<ChatMessage>| -> Vec<String> {
            msgs.into_iter()
                .map(|m| format!("{}:{}", m.role, m.content))
                .collect()
        };
        assert_eq!(
            roles(m.with_preset(vec![ChatMessage::new("user", "Q")])),
            ["system:Be brief.", "user:Hi", "assistant:Hello", "user:Q"]
        );
        // The request's own system message replaces the default and stays first.
        assert_eq!(
            roles(m.with_preset(vec![
                ChatMessage::new("system", "Mine"),
                ChatMessage::new("user", "Q")
            ])),
            ["system:Mine", "user:Hi", "assistant:Hello", "user:Q"]
        );
    }

    #[test]
    fn quantize_at_load_replaces_the_weights_and_reports_it() {
        let r = derived("FROM tiny\n");
        let plain = load(&r, "derived:1").unwrap();
        assert!(plain.quantization.is_none());
        assert_eq!(plain.weights_bytes(), plain.file_bytes);
        let options = LoadOptions {
            quantize: Some("q8_0".parse().unwrap()),
            device: DeviceChoice::Cpu,
            ..LoadOptions::default()
        };
        let m = load_with(&r, "derived:1", &options).unwrap();
        let report = m.quantization.as_ref().expect("a report");
        assert!(report.n_converted() > 0);
        assert_eq!(m.weights_bytes(), report.bytes_after());
        assert!(m.weights_bytes() * 3 < plain.weights_bytes());
        assert_eq!(m.info.file_type, "Q8_0");
        assert_eq!(m.info.tensor_types["Q8_0"], report.n_converted());
        // The quantized model runs.
        let mut cache = m.model.new_cache(8);
        let logits = m
            .model
            .forward(&[1, 2, 3], 0, &mut cache, pagoda_model::Logits::Last)
            .unwrap();
        assert!(logits.iter().all(|x| x.is_finite()));
    }

    /// A fit of one 64-token sequence in `budget` bytes.
    fn fit(budget: u64) -> FitBudget {
        FitBudget {
            budget,
            max_model_len: Some(64),
            max_num_seqs: 1,
            block_size: 16,
            kv_dtype: pagoda_model::KvDtype::F16,
            prefix_caching: false,
            kv_cache_memory: None,
        }
    }

    #[test]
    fn auto_quantize_picks_the_best_format_that_fits_and_says_why() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama");
        let source = open_model(&path).unwrap();
        let kv = crate::quant_choice::kv_bytes(
            &source.config,
            Some(64),
            1,
            16,
            pagoda_model::KvDtype::F16,
            false,
        )
        .0;
        let need =
            |t: &str| crate::quant_choice::bytes_as(&source.weights, t.parse().unwrap()) + kv;
        let (f16, q8) = (need("f16"), need("q8_0"));
        assert!(q8 < f16);
        let auto = |mode, budget| LoadOptions {
            auto_quantize: mode,
            fit: Some(fit(budget)),
            device: DeviceChoice::Cpu,
            ..LoadOptions::default()
        };
        // f16 does not fit, Q8_0 does: Q8_0, and the weights are what the choice said.
        let m = load_path(&path, &auto(AutoQuantize::Always, (f16 + q8) / 2)).unwrap();
        let d = m.quant_choice.as_ref().expect("a decision");
        assert_eq!(m.info.file_type, "Q8_0");
        assert_eq!(d.picked.weights, m.weights_bytes());
        let text = d.to_string();
        for part in [
            "--quantize auto",
            "picked q8_0",
            "f16 needs",
            "f32 (as stored) needs",
            "64 tokens x 1 sequence",
        ] {
            assert!(text.contains(part), "{part} missing from: {text}");
        }
        // Room for f16: f16 (f32 is the stored type, larger still).
        let m = load_path(&path, &auto(AutoQuantize::Always, f16)).unwrap();
        assert_eq!(m.info.file_type, "F16");
        // By default (IfTooBig) a model that fits as stored is left alone, and one that does
        // not is quantized with a note saying so.
        let m = load_path(&path, &auto(AutoQuantize::IfTooBig, u64::MAX / 2)).unwrap();
        assert!(m.quant_choice.is_none() && m.quantization.is_none());
        let m = load_path(&path, &auto(AutoQuantize::IfTooBig, q8)).unwrap();
        let d = m.quant_choice.as_ref().expect("a decision");
        assert!(
            d.to_string().contains("does not fit the memory budget"),
            "{d}"
        );
        assert_eq!(m.info.file_type, "Q8_0");
        // Nothing fits: an error naming the sizes and the flags.
        let e = load_path(&path, &auto(AutoQuantize::Always, kv))
            .err()
            .expect("refused");
        let text = e.to_string();
        assert!(matches!(e, LoadError::AutoQuantize { .. }), "{text}");
        assert!(
            text.contains("q4_k needs") && text.contains("--memory-budget"),
            "{text}"
        );
        // An already quantized checkpoint is served as is.
        let gptq = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama-gptq");
        let m = load_path(&gptq, &auto(AutoQuantize::Always, kv + 1)).unwrap();
        assert!(m.quant_choice.is_none() && m.quantization.is_none());
    }

    #[test]
    fn a_gptq_folder_loads_with_its_conversion_reported() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama-gptq");
        let m = load_path(&path, &LoadOptions::default()).unwrap();
        let report = m.checkpoint_quant.as_ref().expect("a checkpoint report");
        assert_eq!(report.linears, 14);
        assert_eq!(m.weights_bytes(), report.weight_bytes);
        assert!(
            m.info.file_type.starts_with("GPTQ 4-bit"),
            "{}",
            m.info.file_type
        );
        let mut cache = m.model.new_cache(8);
        let logits = m
            .model
            .forward(&[1, 2, 3], 0, &mut cache, pagoda_model::Logits::Last)
            .unwrap();
        assert!(logits.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn a_bad_weight_is_a_quantize_error_naming_the_model() {
        // The tiny model with a NaN written into its first matrix's data.
        let dir = tempfile::tempdir().unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/tiny-llama");
        for e in std::fs::read_dir(&src).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
        }
        let st = dir.path().join("model.safetensors");
        let mut bytes = std::fs::read(&st).unwrap();
        let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let at = 8 + header + 4 * 1000;
        bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        std::fs::write(&st, bytes).unwrap();
        let resolved = ResolvedModel {
            name: None,
            path: dir.path().to_path_buf(),
            format: Format::HfFolder,
            manifest: None,
        };
        let options = LoadOptions {
            quantize: Some("q4_0".parse().unwrap()),
            device: DeviceChoice::Cpu,
            ..LoadOptions::default()
        };
        let e = load_with(&resolved, "x", &options).err().expect("an error");
        assert!(matches!(e, LoadError::Quantize { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.contains("quantizing model"), "{text}");
        assert!(text.contains("non-finite"), "{text}");
    }

    #[test]
    fn a_jinja_template_replaces_the_chat_template() {
        let m = load(
            &derived("FROM tiny\nTEMPLATE \"\"\"{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}\"\"\"\nSYSTEM \"\"\n"),
            "derived:1",
        )
        .unwrap();
        assert!(m.template_source.starts_with("{% for m in messages %}"));
        assert_eq!(m.default_system, None, "an empty SYSTEM clears it");
        let text = m
            .chat_template
            .render(&m.with_preset(vec![ChatMessage::new("user", "hey")]), true)
            .unwrap();
        assert_eq!(text, "[user]hey");
    }

    #[test]
    fn go_and_broken_templates_are_load_errors() {
        for (template, needle) in [
            ("{{ .Prompt }}", "Go template"),
            ("{% for m in messages %}", "template"),
        ] {
            let r = derived(&format!("FROM tiny\nTEMPLATE \"\"\"{template}\"\"\"\n"));
            let e = load(&r, "derived:1")
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("model `derived:1`"), "{e}");
            assert!(e.contains(needle), "{e}");
        }
    }
}
