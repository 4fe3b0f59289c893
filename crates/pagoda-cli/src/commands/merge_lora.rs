//! `pagoda merge-lora BASE ADAPTER -o OUT`: folds a PEFT LoRA adapter into its base model
//! (`W += scaling · B·A`, as peft's `merge_and_unload`) and writes a plain model, GGUF for a
//! GGUF base, a Hugging Face folder for a folder base. The work is pagoda-compress's
//! (`merge`); this module resolves the base, shows a bar per tensor, and says what was merged
//! and how to serve the result quantized.
//!
//! Invariant: an adapter that does not fit the base, an output the base cannot be written as,
//! or an existing OUT without `--force` is refused before anything is written; a failed run
//! leaves neither OUT nor `OUT.partial`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::progress::Progress;
use anyhow::Context;
use clap::Args;
use pagoda_compress::merge::{merge_lora, MergeBase, MergeDtype, MergeReport, OutputKind};
use pagoda_kernels::GgmlType;
use pagoda_model::lora::LoraAdapter;
use pagoda_runtime::loader::{self, Pull};

/// Arguments of `pagoda merge-lora`.
#[derive(Debug, Args)]
pub struct MergeLoraArgs {
    /// The base model the adapter was trained on: a store name, a GGUF file (any block type:
    /// quantized weights are dequantized to f32 before the merge), or a Hugging Face folder
    /// (F32/F16/BF16, or a GPTQ/AWQ checkpoint). Not a bitsandbytes (QLoRA 4-bit) folder:
    /// give the original unquantized model.
    pub base: String,
    /// The PEFT adapter folder (adapter_config.json + adapter_model.safetensors, as
    /// `save_pretrained` writes it).
    pub adapter: PathBuf,
    /// Output: a GGUF file for a GGUF base, a Hugging Face folder for a folder base (written
    /// only when complete).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Type of the merged tensors: f16, bf16 or f32. Untouched tensors keep their type (in a
    /// folder, quantized ones are written in this type).
    #[arg(long, default_value = "f16")]
    pub dtype: String,
    /// Replace OUT if it exists.
    #[arg(long)]
    pub force: bool,
}

/// `q_proj ×30, v_proj ×30`: the merged modules by their last name.
fn module_kinds(report: &MergeReport) -> String {
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for m in &report.modules {
        let last = m.module.rsplit('.').next().unwrap_or(&m.module);
        *kinds.entry(last).or_default() += 1;
    }
    kinds
        .iter()
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `4` or `4-8`: the distinct values of `f` over the merged modules.
fn values<T: PartialOrd + Copy + std::fmt::Display>(
    report: &MergeReport,
    f: impl Fn(&pagoda_compress::merge::PlannedModule) -> T,
) -> String {
    let mut lo: Option<T> = None;
    let mut hi: Option<T> = None;
    for m in &report.modules {
        let v = f(m);
        if lo.is_none_or(|l| v < l) {
            lo = Some(v);
        }
        if hi.is_none_or(|h| v > h) {
            hi = Some(v);
        }
    }
    match (lo, hi) {
        (Some(l), Some(h)) if l < h => format!("{l} to {h}"),
        (Some(l), _) => format!("{l}"),
        _ => String::new(),
    }
}

/// `merged.gguf` → `merged-q4.gguf`; `merged` → `merged-q4.gguf`.
fn q4_name(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "merged".into());
    out.with_file_name(format!("{stem}-q4.gguf"))
}

/// The lines telling how to serve the merged model quantized.
pub fn next_steps(out: &Path, kind: OutputKind) -> String {
    let o = out.display();
    match kind {
        OutputKind::Gguf => format!(
            "next: serve it quantized — `pagoda quantize {o} -o {}` (GPTQ 4-bit; --method rtn \
             is faster), or quantize at load: `pagoda run {o} --quantize q4_k`",
            q4_name(out).display()
        ),
        OutputKind::HfFolder => format!(
            "next: serve it quantized — at load: `pagoda run {o} --quantize nf4` (or q4_k), or \
             as a GPTQ folder: `pagoda quantize {o} -o {o}-gptq --method gptq`"
        ),
    }
}

/// Runs `pagoda merge-lora`.
pub fn run(args: MergeLoraArgs) -> anyhow::Result<()> {
    let dtype: MergeDtype = args.dtype.parse()?;
    let adapter = LoraAdapter::open(&args.adapter)
        .with_context(|| format!("reading the adapter {}", args.adapter.display()))?;
    let store = crate::commands::open_store()?;
    let resolved = loader::resolve(&store, &args.base, Pull::IfMissing)?;
    let started = Instant::now();
    let base = MergeBase::open(&resolved.path)
        .with_context(|| format!("opening the base model {}", resolved.path.display()))?;
    let pb = Progress::new("merge-lora", "tensors", base.weights().len());
    let result = merge_lora(&base, &adapter, dtype, &args.output, args.force, |d, _| {
        pb.set(d)
    });
    pb.finish();
    let report = result?;

    let c = adapter.config();
    let base_name = if Path::new(&args.base).exists() {
        args.base.clone()
    } else {
        format!("{} ({})", args.base, resolved.path.display())
    };
    eprintln!(
        "merged {} into {}: {} modules ({}), rank {}, alpha {}, scaling {}{}",
        args.adapter.display(),
        base_name,
        report.modules.len(),
        module_kinds(&report),
        values(&report, |m| m.r),
        c.lora_alpha,
        values(&report, |m| m.scaling),
        if c.use_rslora {
            " (rsLoRA: alpha / sqrt(r))"
        } else {
            " (alpha / r)"
        },
    );
    let permuted = report.modules.iter().filter(|m| m.permuted).count();
    if permuted > 0 {
        eprintln!(
            "  {permuted} Q/K deltas put in the GGUF's RoPE row order (llama.cpp's permutation)"
        );
    }
    let mut quantized: BTreeMap<String, usize> = BTreeMap::new();
    for m in &report.modules {
        if !matches!(m.base_type, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            *quantized.entry(m.base_type.to_string()).or_default() += 1;
        }
    }
    for (ty, n) in &quantized {
        eprintln!("  {n} base weights dequantized from {ty} to f32 before the merge");
    }
    if report.converted > 0 {
        eprintln!(
            "  {} untouched quantized tensors written as {}",
            report.converted,
            dtype.safetensors()
        );
    }
    let what = match report.output {
        OutputKind::Gguf => "GGUF",
        OutputKind::HfFolder => "Hugging Face folder",
    };
    eprintln!(
        "wrote {} ({what}, merged tensors {}, {} tensors, {}) in {:.1} s",
        args.output.display(),
        dtype.safetensors(),
        report.tensors,
        super::human_size(report.bytes),
        started.elapsed().as_secs_f64()
    );
    eprintln!("{}", next_steps(&args.output, report.output));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_steps_name_a_quantized_output() {
        let s = next_steps(Path::new("out/merged.gguf"), OutputKind::Gguf);
        assert!(
            s.contains("pagoda quantize out/merged.gguf -o out/merged-q4.gguf"),
            "{s}"
        );
        let s = next_steps(Path::new("merged"), OutputKind::HfFolder);
        assert!(s.contains("--quantize nf4"), "{s}");
    }
}
