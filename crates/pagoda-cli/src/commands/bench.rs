//! `pagoda bench model`: prefill and decode speed, load time and peak memory, side by side with
//! llama.cpp on the same file and thread count.

use clap::{Args, Subcommand};

/// Arguments of `pagoda bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Measure one model: prefill tokens/s, decode tokens/s, load time, peak RSS.
    Model(BenchModelArgs),
}

#[derive(Debug, Args)]
pub struct BenchModelArgs {
    /// Model name or path.
    #[arg(default_value = "smollm2:135m")]
    pub model: String,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens generated for the decode measurement.
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Worker threads for both Pagoda and llama.cpp (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Repetitions; the best is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Skip the llama.cpp side (llama-cpp-python not installed).
    #[arg(long)]
    pub no_peer: bool,
}

/// Runs `pagoda bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let BenchCommand::Model(m) = args.what;
    anyhow::bail!("`pagoda bench model {}` is being wired up in this build", m.model)
}
