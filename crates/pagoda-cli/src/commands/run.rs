//! `pagoda run`: one-shot or interactive generation with a model from the store.
//!
//! Only the model's answer goes to stdout; progress, prompts of the interactive mode and
//! timings go to stderr, so `pagoda run m "q" > answer.txt` captures just the answer.
//! Each turn goes through the runtime (flags checked as request knobs) to the serving
//! engine; an interactive chat's earlier turns come back from the engine's prefix cache.

use crate::commands::model_loader::{load_for_generation, LoadArgs, LoadedModel};
use anyhow::Context;
use clap::Args;
use pagoda_engine::EngineHandle;
use pagoda_model::chat_template::ChatMessage;
use pagoda_runtime::request::Bounds;
use pagoda_runtime::{plan, single, Knobs};
use std::io::{BufRead, Write};

/// Arguments of `pagoda run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Model name from the catalog (e.g. smollm2:135m), a store entry, or a path to a GGUF
    /// file or Hugging Face model folder. Missing catalog models are pulled first.
    #[arg(default_value = "smollm2:135m")]
    pub model: String,
    /// The prompt. Without one, an interactive chat starts.
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
    /// The flags as request knobs (checked by the runtime like any request's, over the
    /// model's own defaults).
    fn knobs(&self, loaded: &LoadedModel) -> Knobs {
        Knobs {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k.map(|k| i64::try_from(k).unwrap_or(i64::MAX)),
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repeat_penalty,
            repeat_last_n: self
                .repeat_last_n
                .map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
            seed: self.seed,
            stop: loaded.stops_with(self.stop.clone()),
            max_tokens: Some(
                self.max_tokens
                    .or(loaded.default_max_tokens)
                    .unwrap_or(DEFAULT_MAX_TOKENS),
            ),
            n: 1,
            ..Knobs::default()
        }
    }
}

/// Runs `pagoda run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    crate::commands::threads::set_threads(args.threads)?;
    let loaded = load_for_generation(&args.model, &args.load)?;
    // One conversation on the serving engine: earlier turns are found again by its prefix
    // cache, so a follow-up only prefills what is new.
    let (engine, bounds) = single::start(&loaded, args.ctx_size)?;
    let session = Session {
        args: &args,
        loaded: &loaded,
        engine: &engine,
        bounds,
    };
    let system = args
        .system
        .clone()
        .or_else(|| loaded.default_system.clone());
    let mut chat = Conversation::new(system.clone(), &loaded.preset_messages);
    let result = match &args.prompt {
        Some(prompt) => session.answer(&mut chat, prompt),
        None => session.interactive(&mut chat, system),
    };
    engine.shutdown();
    result
}

/// What every turn of one `pagoda run` shares.
struct Session<'a> {
    args: &'a RunArgs,
    loaded: &'a LoadedModel,
    engine: &'a EngineHandle,
    bounds: Bounds,
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

impl Session<'_> {
    /// Answers one prompt, streaming the answer to stdout, and records it in the
    /// conversation.
    fn answer(&self, chat: &mut Conversation, prompt: &str) -> anyhow::Result<()> {
        let (args, loaded) = (self.args, self.loaded);
        let prompt_tokens = if args.raw {
            loaded.tokenizer.encode(prompt, true)?
        } else {
            chat.messages.push(ChatMessage::new("user", prompt));
            loaded.encode_chat(&chat.messages)?
        };
        let plan = plan::plain(
            prompt_tokens,
            &loaded.default_sampling,
            args.knobs(loaded),
            &self.bounds,
        )
        .map_err(|e| match e.param_name() {
            Some(param) => anyhow::anyhow!("{e} (--{})", param.replace('_', "-")),
            None => anyhow::anyhow!("{e}"),
        })?;
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        let result = single::generate(self.engine, plan.request, |text| {
            // A closed pipe (e.g. `| head`) ends generation rather than erroring.
            out.write_all(text.as_bytes())
                .and_then(|_| out.flush())
                .is_ok()
        })?;
        writeln!(out).ok();
        if !args.raw {
            chat.messages
                .push(ChatMessage::new("assistant", result.text.clone()));
        }
        if args.verbose {
            let u = result.usage;
            let prefilled = u.prompt_tokens - u.cached_prompt_tokens;
            let split = result.split();
            eprintln!(
                "prompt: {} tokens ({} cached), {:.1} tokens/s | answer: {} tokens, {:.1} tokens/s | finish: {:?}",
                u.prompt_tokens,
                u.cached_prompt_tokens,
                split.prefill_tps(prefilled),
                u.completion_tokens,
                split.decode_tps(u.completion_tokens.saturating_sub(1)),
                result.finish,
            );
        }
        Ok(())
    }

    /// A read-answer loop on stdin. `/bye` or end of input leaves; `/clear` forgets the chat.
    fn interactive(&self, chat: &mut Conversation, system: Option<String>) -> anyhow::Result<()> {
        eprintln!(
            "Chatting with {}. Type /bye to leave, /clear to start over.",
            self.args.model
        );
        let stdin = std::io::stdin();
        let mut lines = stdin.lock().lines();
        loop {
            eprint!(">>> ");
            std::io::stderr().flush().ok();
            let Some(line) = lines.next() else { break };
            let line = line.context("reading the prompt from stdin")?;
            let line = line.trim();
            match line {
                "" => continue,
                "/bye" | "/exit" | "/quit" => break,
                "/clear" => {
                    *chat = Conversation::new(system.clone(), &self.loaded.preset_messages);
                    eprintln!("(conversation cleared)");
                    continue;
                }
                _ => {}
            }
            if let Err(e) = self.answer(chat, line) {
                // One bad turn (say, a prompt longer than the context) doesn't end the chat.
                eprintln!("error: {e:#}");
                chat.messages.pop();
            }
        }
        Ok(())
    }
}
