//! Finding, loading and preparing a model for the CLI commands (`run`, `batch`, `bench`):
//! the server's loader, pulling missing catalog models, with a spinner while it maps the
//! weights; [`LoadArgs`] holds the load flags every such command (and `serve`) shares
//! (`--quantize` with `auto`, `--device`, `--gpu-layers`).

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pagoda_model::{Device, DeviceChoice};
use pagoda_runtime::loader::{self, LoadOptions, Pull};
use pagoda_runtime::quant_choice::{AutoQuantize, QuantizeFlag};
use std::time::Duration;

pub use pagoda_runtime::loader::LoadedModel;

/// How the model's weights are prepared at load.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Quantize the weights in memory to TYPE at load: auto, q4_0, q4_1, q5_0, q5_1, q8_0,
    /// q4_k, q5_k, q6_k, int8, int4-g32, int4-g64, int4-g128, int4-g32-sym, int4-g64-sym,
    /// int4-g128-sym, nf4, nf4-dq, f16, bf16, f32 (int4 = int4-g32).
    ///
    /// auto picks the highest-quality format — as stored, f16 (from f32), q8_0, q6_k, q5_k,
    /// q4_k — whose weights plus the KV cache for the context (--max-model-len, else the
    /// model's; `run`: --ctx-size, else 4096 tokens) and sequences (--max-num-seqs; `run`: one)
    /// fit the memory budget (`serve --memory-budget`, else 90% of the machine's memory), and
    /// prints what it picked
    /// and why; an already quantized model is served as is. Without --quantize, a Hugging Face
    /// folder stored in f32/f16/bf16 that would not fit gets the same choice (and says so).
    ///
    /// int8 is per-channel (one f32 scale per row), int4-gN groups of N weights with a scale
    /// and a minimum (-sym: a scale only), nf4 QLoRA's NormalFloat-4 in blocks of 64 (nf4-dq
    /// with double-quantized block scales). These live in memory only (never in a GGUF file).
    ///
    /// Like llama.cpp's quantize, but online, for any model: F32/F16/BF16 Hugging Face
    /// folders, and GGUFs of any type (dequantized row by row first). Weight matrices
    /// (attention, FFN, token embeddings) get TYPE; norms and biases stay; the output head gets
    /// Q6_K (Q8_0 when its rows are not 256-multiples or TYPE is q8_0 or int8); matrices whose
    /// rows are not whole blocks fall back as llama.cpp does (q4_k -> q5_0, q5_k -> q5_1, q6_k
    /// -> q8_0, int4-g128 -> g64 -> g32, nf4 -> int4-g32-sym, then f16). Tensors already of
    /// their type are left untouched. The memory before and after is printed on stderr.
    /// Generative models only.
    #[arg(long, value_name = "TYPE")]
    pub quantize: Option<QuantizeFlag>,
    /// Where the model runs: auto (an NVIDIA GPU when one is usable — driver, NVRTC and
    /// cuBLAS found at run time — else the CPU; the choice is printed at start), cpu, cuda
    /// (the first GPU), cuda:N, or cuda-interpret (the CUDA path run on the CPU by Pagoda's
    /// CUDA interpreter: for checking it without a GPU, slow; never chosen by auto). `cuda`
    /// without a usable GPU is an error naming what is missing. `pagoda devices` lists what
    /// this machine has.
    #[arg(long, value_name = "DEVICE", default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Put the last N decoder layers (and the output head) on the GPU and run the rest on
    /// the CPU, whatever the fit says (llama.cpp's -ngl, Ollama's num_gpu). Without it,
    /// `--device auto` places as many layers as fit (all of them when the model fits);
    /// 0 keeps the model on the CPU. More than the model's layers is an error.
    #[arg(long, value_name = "N")]
    pub gpu_layers: Option<usize>,
    /// UNSAFE: read control-token texts in chat messages and tools (`<|im_end|>`,
    /// `<start_of_turn>`, ...) as control tokens, as Pagoda did before it kept them apart.
    /// A message, or a document a tool returned, can then close its turn and write a system
    /// turn. By default text from messages, tool calls, tool results and tool definitions is
    /// tokenized with control tokens as plain text (transformers' `split_special_tokens`),
    /// while the chat template's own markup keeps them. Raw prompts (`/v1/completions`,
    /// Ollama `raw`, `pagoda run --raw`) are the client's markup either way.
    #[arg(long)]
    pub unsafe_control_tokens_in_messages: bool,
}

impl LoadArgs {
    /// The loader options these flags ask for.
    pub fn options(&self) -> LoadOptions {
        let (quantize, auto_quantize) = match self.quantize {
            Some(QuantizeFlag::Type(t)) => (Some(t), AutoQuantize::Off),
            Some(QuantizeFlag::Auto) => (None, AutoQuantize::Always),
            None => (None, AutoQuantize::IfTooBig),
        };
        LoadOptions {
            quantize,
            auto_quantize,
            fit: None,
            device: self.device,
            gpu_layers: self.gpu_layers,
            control_tokens_in_messages: self.unsafe_control_tokens_in_messages,
        }
    }
}

/// Resolves and loads `name` as `args` ask, with a spinner on stderr while the weights are
/// mapped (and quantized); prints what quantization did on stderr.
pub fn load_for_generation(name: &str, args: &LoadArgs) -> anyhow::Result<LoadedModel> {
    load_with_options(name, args, args.options())
}

/// As [`load_for_generation`] for one conversation of `context` tokens (`pagoda run
/// --ctx-size`): `--quantize auto` sizes the KV cache for that context, not the default's.
pub fn load_for_conversation(
    name: &str,
    args: &LoadArgs,
    context: Option<usize>,
) -> anyhow::Result<LoadedModel> {
    let mut options = args.options();
    if let Some(ctx) = context {
        options.fit = pagoda_runtime::quant_choice::FitBudget::single_sequence(ctx);
    }
    load_with_options(name, args, options)
}

fn load_with_options(
    name: &str,
    args: &LoadArgs,
    options: LoadOptions,
) -> anyhow::Result<LoadedModel> {
    let store = crate::commands::open_store()?;
    let resolved = loader::resolve(&store, name, Pull::IfMissing)?;
    let spinner = ProgressBar::new_spinner();
    spinner.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("static template"));
    match args.quantize {
        Some(QuantizeFlag::Type(t)) => spinner.set_message(format!(
            "loading {} and quantizing it to {t}",
            resolved.path.display()
        )),
        _ => spinner.set_message(format!("loading {}", resolved.path.display())),
    }
    spinner.enable_steady_tick(Duration::from_millis(100));
    let loaded = loader::load_with(&resolved, name, &options);
    spinner.finish_and_clear();
    let loaded = loaded?;
    // Where it runs and why (`placing 20 of 28 layers on cuda:0 (...)`), when it matters.
    let gpu_asked = args.gpu_layers.is_some_and(|n| n > 0);
    if placement_matters(args.device, gpu_asked, loaded.model.device() == Device::Cpu) {
        eprintln!("{}", loaded.placement);
    }
    if let Some(report) = &loaded.checkpoint_quant {
        eprintln!("{report}");
    }
    if let Some(choice) = &loaded.quant_choice {
        eprintln!("{choice}");
    }
    if let Some(report) = &loaded.quantization {
        eprintln!("{report}");
        eprintln!("  tensor types now: {}", report.types_after_summary());
        if let Some(fallbacks) = report.fallback_summary() {
            eprintln!("  {fallbacks}");
        }
    }
    Ok(loaded)
}

/// Whether the start-up line saying where the model runs is worth a line on stderr: not for
/// `--device cpu` (asked for), nor for `auto` on the CPU of a machine without an NVIDIA
/// driver, where the CPU is all there is (`-v` logs the line, and `pagoda devices` says what
/// a GPU would need); always when a GPU was asked for (`--device cuda`, `--gpu-layers N`) or
/// is used, and when a GPU's driver is there but something else is missing.
fn placement_matters(device: DeviceChoice, gpu_asked: bool, on_cpu: bool) -> bool {
    match device {
        DeviceChoice::Cpu => false,
        DeviceChoice::Auto if on_cpu && !gpu_asked => !no_nvidia_driver(),
        _ => true,
    }
}

/// Whether this machine lacks the NVIDIA driver (libcuda), i.e. has no NVIDIA GPU to use.
pub fn no_nvidia_driver() -> bool {
    pagoda_model::device::nvidia_driver_missing()
}
