//! `pagoda run`: one-shot or interactive generation with a model from the store.

use clap::Args;

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
    /// Subtracted once from the logit of every token already generated.
    #[arg(long)]
    pub presence_penalty: Option<f32>,
    /// Subtracted from a token's logit per time it was generated.
    #[arg(long)]
    pub frequency_penalty: Option<f32>,
    /// Random seed: the same seed and settings give the same text.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Stop when this text is generated (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Context window to allocate, in tokens (default: the model's, capped at 4096).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print timing figures (prompt and generation tokens/s) on stderr at the end.
    #[arg(long)]
    pub verbose: bool,
}

/// Runs `pagoda run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("`pagoda run {}` is being wired up in this build", args.model)
}
