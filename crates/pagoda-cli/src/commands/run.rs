//! `pagoda run`: one-shot or interactive generation with a model from the store.
//!
//! Only the model's answer goes to stdout; progress, prompts of the interactive mode and
//! timings go to stderr, so `pagoda run m "q" > answer.txt` captures just the answer.
//! Each turn goes through the runtime (flags checked as request knobs) to the serving
//! engine; an interactive chat's earlier turns come back from the engine's prefix cache.
//! The interactive chat itself (line editor, `/` commands, Ctrl-C) is [`run_repl`]'s; the
//! session's sampling settings are [`Params`].

use crate::commands::model_loader::{load_for_conversation, LoadArgs, LoadedModel};
use crate::commands::run_params::Params;
use crate::commands::run_repl;
use clap::Args;
use pagoda_engine::EngineHandle;
use pagoda_model::chat_template::ChatMessage;
use pagoda_runtime::request::Bounds;
use pagoda_runtime::{plan, single};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Arguments of `pagoda run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Model name from the catalog (e.g. smollm2:135m), a store entry, or a path to a GGUF
    /// file or Hugging Face model folder. Missing catalog models are pulled first.
    #[arg(default_value = "smollm2:135m")]
    pub model: String,
    /// The prompt. Without one, an interactive chat starts, as `ollama run` has it: `/?`
    /// lists its commands (`/set parameter`, `/set system`, `/show`, `/clear`, `/bye`),
    /// `"""` starts a multi-line message, Ctrl-C stops an answer, Ctrl-D leaves.
    pub prompt: Option<String>,
    /// Send the prompt as-is, without the model's chat template.
    #[arg(long)]
    pub raw: bool,
    /// System message placed before the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Sampling temperature; 0 picks the most likely token (greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p (1.0 = off).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than min_p times the most likely one (0 = off).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Penalty on tokens already in the context (1.0 = off).
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
    /// How many of the last context tokens the repeat penalty looks at.
    #[arg(long)]
    pub repeat_last_n: Option<usize>,
    /// Subtracted once from the logit of every token already generated.
    #[arg(long)]
    pub presence_penalty: Option<f32>,
    /// Subtracted from a token's logit per time it was generated.
    #[arg(long)]
    pub frequency_penalty: Option<f32>,
    /// Random seed: the same seed and settings give the same text.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Most tokens to generate per answer (default: the Modelfile's num_predict, else 512).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Stop when this text is generated (repeatable; added to the Modelfile's); it is not
    /// printed.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Context window to allocate, in tokens (default: the Modelfile's num_ctx, else the
    /// model's, capped at 4096).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print timing figures (prompt and generation tokens/s) on stderr at the end.
    #[arg(long)]
    pub verbose: bool,
    #[command(flatten)]
    pub load: LoadArgs,
}

/// Default answer length when neither `--max-tokens` nor the Modelfile sets one.
const DEFAULT_MAX_TOKENS: usize = 512;

impl RunArgs {
    /// The sampling flags as the session's settings, over the model's own defaults (the
    /// runtime checks them like any request's knobs).
    fn params(&self, loaded: &LoadedModel) -> Params {
        Params {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            max_tokens: Some(
                self.max_tokens
                    .or(loaded.default_max_tokens)
                    .unwrap_or(DEFAULT_MAX_TOKENS),
            ),
            stop: self.stop.clone(),
        }
    }
}

/// Runs `pagoda run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    crate::commands::threads::set_threads(args.threads)?;
    let loaded = load_for_conversation(&args.model, &args.load, args.ctx_size)?;
    // One conversation on the serving engine: earlier turns are found again by its prefix
    // cache, so a follow-up only prefills what is new.
    let (engine, bounds) = single::start(&loaded, args.ctx_size)?;
    let system = args
        .system
        .clone()
        .or_else(|| loaded.default_system.clone());
    let mut session = Session {
        args: &args,
        loaded: &loaded,
        engine: &engine,
        bounds,
        chat: Conversation::new(system.clone(), &loaded.preset_messages),
        system,
    };
    let mut params = args.params(&loaded);
    let result = match &args.prompt {
        Some(prompt) => session
            .turn(prompt, &params, &AtomicBool::new(false))
            .map(drop),
        None => run_repl::run(&mut session, &mut params, &args.model),
    };
    engine.shutdown();
    result
}

/// One `pagoda run`: the model, its engine and the conversation so far.
struct Session<'a> {
    args: &'a RunArgs,
    loaded: &'a LoadedModel,
    engine: &'a EngineHandle,
    bounds: Bounds,
    chat: Conversation,
    /// The system message a cleared conversation starts with.
    system: Option<String>,
}

/// The messages of an interactive chat so far.
struct Conversation {
    messages: Vec<ChatMessage>,
}

impl Conversation {
    /// The system message, then the Modelfile's MESSAGE turns.
    fn new(system: Option<String>, preset: &[ChatMessage]) -> Self {
        let messages = system
            .map(|content| ChatMessage::new("system", content))
            .into_iter()
            .chain(preset.iter().cloned())
            .collect();
        Conversation { messages }
    }
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Finished,
    /// Ctrl-C (or a closed stdout) stopped the answer.
    Stopped,
}

impl Session<'_> {
    /// Answers one prompt, streaming the answer to stdout, and records the turn in the
    /// conversation: the prompt always (Ollama keeps it too), the answer unless stopped.
    fn turn(&mut self, prompt: &str, params: &Params, stop: &AtomicBool) -> anyhow::Result<Ended> {
        let (args, loaded) = (self.args, self.loaded);
        let prompt_tokens = if args.raw {
            loaded.tokenizer.encode(prompt, true)?
        } else {
            self.chat.messages.push(ChatMessage::new("user", prompt));
            match loaded.encode_chat(&self.chat.messages) {
                Ok(tokens) => tokens,
                Err(e) => {
                    self.chat.messages.pop();
                    return Err(e.into());
                }
            }
        };
        let planned = plan::plain(
            prompt_tokens,
            &loaded.default_sampling,
            params.knobs(|stops| loaded.stops_with(stops)),
            &self.bounds,
        )
        .map_err(|e| match e.param_name() {
            Some(param) => anyhow::anyhow!("{e} (--{})", param.replace('_', "-")),
            None => anyhow::anyhow!("{e}"),
        });
        let planned = match planned {
            Ok(p) => p,
            Err(e) => {
                // A turn that cannot run leaves the conversation as it was.
                if !args.raw {
                    self.chat.messages.pop();
                }
                return Err(e);
            }
        };
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        let mut ended = Ended::Finished;
        let result = single::generate(self.engine, planned.request, |text| {
            // Ctrl-C, or a closed pipe (e.g. `| head`), ends generation rather than erroring.
            let go_on = !stop.load(Ordering::SeqCst)
                && out
                    .write_all(text.as_bytes())
                    .and_then(|_| out.flush())
                    .is_ok();
            if !go_on {
                ended = Ended::Stopped;
            }
            go_on
        });
        writeln!(out).ok();
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                if !args.raw {
                    self.chat.messages.pop();
                }
                return Err(e.into());
            }
        };
        if !args.raw && ended == Ended::Finished {
            self.chat
                .messages
                .push(ChatMessage::new("assistant", result.text.clone()));
        }
        if args.verbose {
            let u = result.usage;
            let prefilled = u.prompt_tokens - u.cached_prompt_tokens;
            let split = result.split();
            eprintln!(
                "prompt: {} tokens ({} cached), {:.1} tokens/s | answer: {} tokens, {:.1} tokens/s | finish: {}",
                u.prompt_tokens,
                u.cached_prompt_tokens,
                split.prefill_tps(prefilled),
                u.completion_tokens,
                split.decode_tps(u.completion_tokens.saturating_sub(1)),
                match ended {
                    Ended::Finished => format!("{:?}", result.finish),
                    Ended::Stopped => "stopped".to_string(),
                },
            );
        }
        Ok(ended)
    }
}

impl run_repl::Chat for Session<'_> {
    fn answer(&mut self, prompt: &str, params: &Params, stop: &AtomicBool) -> anyhow::Result<()> {
        self.turn(prompt, params, stop).map(drop)
    }

    fn clear(&mut self) {
        self.chat = Conversation::new(self.system.clone(), &self.loaded.preset_messages);
    }

    fn set_system(&mut self, text: String) {
        let message = ChatMessage::new("system", text.clone());
        match self.chat.messages.first_mut() {
            Some(first) if first.role.as_str() == "system" => *first = message,
            _ => self.chat.messages.insert(0, message),
        }
        self.system = Some(text);
    }

    fn show(&self, topic: &str) -> Option<String> {
        let loaded = self.loaded;
        match topic {
            "info" => {
                let info = &loaded.info;
                let mut out = String::from(
                    "  Model
",
                );
                let mut row = |k: &str, v: String| out.push_str(&format!("    {k:<18}{v}\n"));
                row("architecture", info.architecture.clone());
                row(
                    "parameters",
                    crate::commands::human_count(info.parameter_count),
                );
                row("context length", info.context_length.to_string());
                row("session context", self.bounds.context.to_string());
                row("quantization", info.file_type.clone());
                row("runs on", loaded.placement.clone());
                Some(out)
            }
            "system" => Some(
                self.system
                    .clone()
                    .unwrap_or_else(|| "No system message was specified for this model.".into()),
            ),
            "template" => Some(if loaded.template_source.is_empty() {
                "No prompt template was specified for this model (ChatML is used).".into()
            } else {
                loaded.template_source.clone()
            }),
            _ => None,
        }
    }
}
