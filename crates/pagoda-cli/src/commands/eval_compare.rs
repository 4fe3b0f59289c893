//! `pagoda eval compare` and `pagoda eval winrate`: blind side-by-side comparison of two
//! model variants, judged by a person on an HTML page.
//!
//! `compare` loads variant A, answers every prompt, drops it, then does the same for B (one
//! model in memory at a time), through the chat template and the serving engine (pagoda-runtime) exactly as
//! `pagoda run` answers a one-shot prompt (the model's default system message and Modelfile
//! turns included), with the same sampling for both sides: greedy unless `--temperature`.
//! pagoda-compress shuffles the sides and renders the page; the key goes to a sidecar file.
//! `winrate` maps the exported picks back through the key and prints the win rate of A.
//!
//! Invariants: every input is checked before a model is loaded; the page and the key are
//! written only when every answer exists (each to `FILE.partial`, then renamed), so a failed
//! run leaves no output file; the page never holds the key.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pagoda_compress::eval::compare::{
    parse_prompts, CompareKey, ComparePrompt, Comparison, GenerationSettings, Picks, PromptsFormat,
    Variant,
};
use pagoda_compress::eval::{compare_page, winrate};
use pagoda_compress::quantize::QuantTarget;
use pagoda_engine::SamplingParams;
use pagoda_model::chat_template::ChatMessage;
use pagoda_runtime::{plan, single, Knobs};
use serde_json::json;

use crate::commands::model_loader::{load_for_generation, LoadArgs};
use pagoda_model::DeviceChoice;

pub const COMPARE_HELP: &str = "\
Prompts: a .jsonl file of {\"prompt\": \"...\", \"id\": \"optional\"} lines (\"question\" or
\"text\" also name the prompt), or any other file with one prompt per non-blank line (ids are
line numbers). Each prompt is sent as one user message through the model's chat template, as
`pagoda run MODEL \"prompt\"` sends it, and answered greedily (or with --temperature) up to
--max-tokens; both variants get the same settings.

Per prompt a coin seeded by --seed puts A's answer on the left or the right. The page shows
only \"Left\" and \"Right\"; which variant was which is in the key file (default: the page's
name with .key.json), which the judge should not see. The page is one HTML file with no
network access: open it in a browser, pick with the buttons or the keys 1 (left better),
2 (tie), 3 (right better), arrows to move, E or \"Export picks\" to download picks.json.
Then: pagoda eval winrate --key compare.key.json --picks picks.json

Examples:
  pagoda eval compare --model-a smollm2:135m --model-b smollm2:135m --quantize-b q4_0 \\
      --prompts prompts.txt -o compare.html
  pagoda eval compare --model-a ./a.gguf --model-b ./b.gguf --prompts p.jsonl -o ab.html --seed 7";

pub const WINRATE_HELP: &str = "\
Each pick is mapped through the key to \"A wins\", \"B wins\" or a tie. The win rate of A is
(A wins + ties / 2) / judged: ties count half. Two 95% intervals are printed: the Wilson score
interval of that proportion (ties as half a success), and a percentile bootstrap (the picks
resampled with replacement --resamples times, seeded, so reruns agree). Prompts without a pick
are left out and counted as unjudged.

Errors: picks from another comparison (compare_id differs), a pick for an id the key does not
have, the same id picked twice, a choice other than left/right/tie, or malformed JSON.

Examples:
  pagoda eval winrate --key compare.key.json --picks picks.json
  pagoda eval winrate --key compare.key.json --picks picks.json --json";

/// Arguments of `pagoda eval compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Variant A's model: a store or catalog name, a GGUF file or a model folder.
    #[arg(long)]
    pub model_a: String,
    /// Quantize variant A's weights at load (as --quantize on run/serve).
    #[arg(long, value_name = "TYPE")]
    pub quantize_a: Option<QuantTarget>,
    /// Variant B's model (default: the same as A, to compare load options).
    #[arg(long)]
    pub model_b: Option<String>,
    /// Quantize variant B's weights at load.
    #[arg(long, value_name = "TYPE")]
    pub quantize_b: Option<QuantTarget>,
    /// The prompt set: .jsonl, or one prompt per line.
    #[arg(long)]
    pub prompts: PathBuf,
    /// The HTML page to write.
    #[arg(long, short)]
    pub output: PathBuf,
    /// The key file (default: OUTPUT with the extension .key.json).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature for both variants (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed of the left/right shuffle (and of sampling when --temperature > 0).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where both variants run (auto, cpu, cuda, cuda:N; as on run/serve).
    #[arg(long, value_name = "DEVICE", default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
}

/// Arguments of `pagoda eval winrate`.
#[derive(Debug, Args)]
pub struct WinrateArgs {
    /// The key file `pagoda eval compare` wrote.
    #[arg(long)]
    pub key: PathBuf,
    /// The picks file the page exported.
    #[arg(long)]
    pub picks: PathBuf,
    /// Bootstrap resamples.
    #[arg(long, default_value_t = winrate::BOOTSTRAP_RESAMPLES)]
    pub resamples: usize,
    /// Seed of the bootstrap.
    #[arg(long, default_value_t = 0)]
    pub bootstrap_seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `compare.html` → `compare.key.json`.
fn default_key_path(output: &Path) -> PathBuf {
    output.with_extension("key.json")
}

/// Writes each `(path, text)` to `path.partial`, then renames them all into place: a
/// failure before the renames leaves no output file (and removes the partial ones).
pub(crate) fn write_all_atomic(files: &[(&Path, &str)]) -> anyhow::Result<()> {
    let partial_of = |path: &Path| {
        let mut p = path.as_os_str().to_owned();
        p.push(".partial");
        PathBuf::from(p)
    };
    for (i, (path, text)) in files.iter().enumerate() {
        let partial = partial_of(path);
        if let Err(e) = std::fs::write(&partial, text) {
            for (p, _) in &files[..=i] {
                std::fs::remove_file(partial_of(p)).ok();
            }
            return Err(e).with_context(|| format!("writing {}", partial.display()));
        }
    }
    for (path, _) in files {
        std::fs::rename(partial_of(path), path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Runs `pagoda eval compare`.
pub fn run_compare(args: CompareArgs) -> anyhow::Result<()> {
    if args.max_tokens == 0 {
        anyhow::bail!("--max-tokens must be at least 1");
    }
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        anyhow::bail!("--temperature must be 0 or more");
    }
    let key_path = args
        .key
        .clone()
        .unwrap_or_else(|| default_key_path(&args.output));
    if key_path == args.output {
        anyhow::bail!("--key and --output name the same file");
    }
    for p in [&args.output, &key_path] {
        if let Some(parent) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !parent.is_dir() {
                anyhow::bail!(
                    "cannot write {}: {} is not a folder",
                    p.display(),
                    parent.display()
                );
            }
        }
    }
    let text = std::fs::read_to_string(&args.prompts)
        .with_context(|| format!("reading the prompts {}", args.prompts.display()))?;
    let prompts = parse_prompts(&text, PromptsFormat::from_path(&args.prompts))
        .with_context(|| format!("in {}", args.prompts.display()))?;
    crate::commands::threads::set_threads(args.threads)?;

    let variant_a = Variant {
        model: args.model_a.clone(),
        quantize: args.quantize_a.map(|q| q.to_string().to_ascii_lowercase()),
    };
    let variant_b = Variant {
        model: args.model_b.clone().unwrap_or_else(|| args.model_a.clone()),
        quantize: args.quantize_b.map(|q| q.to_string().to_ascii_lowercase()),
    };
    if variant_a == variant_b {
        eprintln!("warning: variants A and B are the same ({variant_a}); both sides will agree");
    }
    let settings = GenerationSettings {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        sampling_seed: (args.temperature > 0.0).then_some(args.seed),
    };
    let answers_a = answer_all(
        "A",
        &variant_a,
        args.quantize_a,
        args.device,
        &prompts,
        &settings,
    )?;
    let answers_b = answer_all(
        "B",
        &variant_b,
        args.quantize_b,
        args.device,
        &prompts,
        &settings,
    )?;
    let comparison = Comparison::new(
        &prompts, &answers_a, &answers_b, variant_a, variant_b, settings, args.seed,
    )?;
    let key = serde_json::to_string_pretty(&comparison.key)? + "\n";
    let page = compare_page::render(&comparison);
    write_all_atomic(&[(&key_path, &key), (&args.output, &page)])?;
    println!(
        "wrote {} ({} prompts) and its key {}",
        args.output.display(),
        prompts.len(),
        key_path.display()
    );
    println!(
        "then: pagoda eval winrate --key {} --picks PICKS.json",
        key_path.display()
    );
    Ok(())
}

/// Every prompt's answer from one variant, as `pagoda run MODEL "prompt"` would give it with
/// these settings.
fn answer_all(
    label: &str,
    variant: &Variant,
    quantize: Option<QuantTarget>,
    device: DeviceChoice,
    prompts: &[ComparePrompt],
    settings: &GenerationSettings,
) -> anyhow::Result<Vec<String>> {
    let loaded = load_for_generation(
        &variant.model,
        &LoadArgs {
            quantize: quantize.map(pagoda_runtime::quant_choice::QuantizeFlag::Type),
            device,
            gpu_layers: None,
            unsafe_control_tokens_in_messages: false,
        },
    )
    .with_context(|| format!("loading variant {label} ({variant})"))?;
    let (engine, bounds) = single::start(&loaded, None)?;
    let bar = ProgressBar::new(prompts.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} answers [{elapsed} < {eta}]")
            .expect("static template"),
    );
    bar.set_message(format!("variant {label}"));
    let mut answers = Vec::with_capacity(prompts.len());
    for p in prompts {
        // Each answer to a fresh conversation, as a one-shot `pagoda run`.
        let messages = loaded.with_preset(vec![ChatMessage::new("user", &p.prompt)]);
        let tokens = loaded
            .encode_chat(&messages)
            .with_context(|| format!("prompt {:?}: rendering the chat prompt", p.id))?;
        let knobs = Knobs {
            temperature: Some(settings.temperature),
            seed: settings.sampling_seed,
            stop: loaded.stops_with(Vec::new()),
            max_tokens: Some(settings.max_tokens),
            n: 1,
            ..Knobs::default()
        };
        let plan = plan::plain(tokens, &SamplingParams::greedy(), knobs, &bounds)
            .with_context(|| format!("prompt {:?}", p.id))?;
        let out = single::generate(&engine, plan.request, |_| true)
            .with_context(|| format!("prompt {:?}: variant {label} failed to answer", p.id))?;
        answers.push(out.text);
        bar.inc(1);
    }
    engine.shutdown();
    bar.finish_and_clear();
    Ok(answers)
}

/// Runs `pagoda eval winrate`.
pub fn run_winrate(args: WinrateArgs) -> anyhow::Result<()> {
    let key_text = std::fs::read_to_string(&args.key)
        .with_context(|| format!("reading the key {}", args.key.display()))?;
    let key = CompareKey::parse(&key_text).with_context(|| format!("in {}", args.key.display()))?;
    let picks_text = std::fs::read_to_string(&args.picks)
        .with_context(|| format!("reading the picks {}", args.picks.display()))?;
    let picks =
        Picks::parse(&picks_text).with_context(|| format!("in {}", args.picks.display()))?;
    let (outcomes, unjudged) = key.outcomes(&picks).with_context(|| {
        format!(
            "matching {} to {}",
            args.picks.display(),
            args.key.display()
        )
    })?;
    if outcomes.is_empty() {
        anyhow::bail!(
            "{} holds no picks; judge some prompts on the page first",
            args.picks.display()
        );
    }
    let r = winrate::win_rate(&outcomes, args.resamples, args.bootstrap_seed)?;
    if args.json {
        let mut out = serde_json::to_value(&r)?;
        out["variant_a"] = json!(key.variant_a);
        out["variant_b"] = json!(key.variant_b);
        out["unjudged"] = json!(unjudged);
        out["compare_id"] = json!(key.compare_id);
        out["method"] = json!(
            "win_rate_a = (a_wins + ties/2) / n; wilson_95: Wilson score interval, z = 1.96, \
             ties as half a success; bootstrap_95: percentile bootstrap of the mean score"
        );
        println!("{out}");
    } else {
        let pct = |x: f64| format!("{:.1}%", 100.0 * x);
        let rows = [
            ("A", key.variant_a.to_string()),
            ("B", key.variant_b.to_string()),
            (
                "judged",
                format!(
                    "{} of {} prompts ({unjudged} unjudged)",
                    r.n,
                    key.items.len()
                ),
            ),
            ("A wins", r.a_wins.to_string()),
            ("B wins", r.b_wins.to_string()),
            ("ties", r.ties.to_string()),
            (
                "win rate of A",
                format!("{} (ties count half)", pct(r.win_rate_a)),
            ),
            (
                "95% CI (Wilson)",
                format!("[{}, {}]", pct(r.wilson_95.low), pct(r.wilson_95.high)),
            ),
            (
                "95% CI (bootstrap)",
                format!(
                    "[{}, {}] (percentile, {} resamples)",
                    pct(r.bootstrap_95.low),
                    pct(r.bootstrap_95.high),
                    r.bootstrap_resamples
                ),
            ),
        ];
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in rows {
            println!("{k:<width$}  {v}");
        }
    }
    Ok(())
}
