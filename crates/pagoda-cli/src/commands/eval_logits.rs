//! `pagoda eval logits`: every position's logits for prompts given as token ids, written as
//! one NumPy `.npy` file, so that another implementation's logits (transformers', on the same
//! weights) can be compared with Pagoda's number by number (`scripts/gpu/compare_logits.py`;
//! the GPU check `scripts/gpu/check.sh` proves the CUDA forward pass with it).
//!
//! Invariants: the prompts are checked before the model is loaded (a JSON array of non-empty
//! arrays of token ids, all of one length) and against the model's vocabulary and context
//! after; each prompt runs alone through [`Model::forward`](pagoda_model::Model::forward) on a
//! fresh cache with [`Logits::All`]; the output is little-endian f32 of shape
//! `[prompts, positions, vocab]`, written to `FILE.partial` and renamed, so a failed run never
//! leaves a truncated file under the name asked for. The logits come from wherever the model's
//! forward pass runs (the device the model was loaded on).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use pagoda_model::Logits;
use serde_json::json;

use crate::commands::model_loader::{load_for_generation, LoadArgs, LoadedModel};
use pagoda_model::KvDtype;

pub const LOGITS_HELP: &str = "\
Input (--prompts): a JSON file holding an array of prompts, each an array of token ids, all of
the same length, e.g. [[1, 2, 3, 4], [5, 6, 7, 8]]. No tokenizer is involved: the ids go
straight into the model (each must be below the model's vocabulary size; no BOS is added).

Each prompt runs alone on a fresh KV cache (--kv-cache-dtype, f16 by default as the engine
serves; f32 to take the cache's rounding out of a comparison), logits for every position.
The logits come from the device the model's forward pass runs on.

Output (--out): one NumPy .npy file, little-endian float32, shape [prompts, positions, vocab]
(numpy.load reads it); a one-line summary on stdout (one JSON object with --json).

Examples:
  pagoda eval logits ./my-hf-folder --prompts prompts.json --out logits.npy
  pagoda eval logits smollm2:135m --prompts prompts.json --out logits.npy --kv-cache-dtype f32 --json
  python3 scripts/gpu/compare_logits.py reference.npy logits.npy";

/// Arguments of `pagoda eval logits` (the model flags as the other `eval` subcommands spell
/// them).
#[derive(Debug, Args)]
pub struct LogitsArgs {
    /// Model: a store or catalog name (pulled if missing), a GGUF file or a model folder.
    pub model: String,
    /// JSON file of prompts as token ids: [[id, id, ...], ...], all of one length.
    #[arg(long, value_name = "FILE")]
    pub prompts: PathBuf,
    /// Where to write the logits: a .npy file, f32 [prompts, positions, vocab].
    #[arg(long, short, value_name = "FILE")]
    pub out: PathBuf,
    /// KV cache element type: f16 (what the engine serves with; on a GPU, 16-bit K/V are
    /// kept as bf16), f32 (the CPU only) or fp8 (E4M3, scale 1, on either device).
    #[arg(long, default_value = "f16")]
    pub kv_cache_dtype: KvDtype,
    /// Print one JSON object instead of the summary line.
    #[arg(long)]
    pub json: bool,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub load: LoadArgs,
}

/// Reads and checks the prompts file: a non-empty JSON array of non-empty arrays of token ids
/// (u32), all of one length.
pub fn read_prompts(path: &Path) -> anyhow::Result<Vec<Vec<u32>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if text.trim().is_empty() {
        anyhow::bail!(
            "{} is empty: expected a JSON array of prompts, each an array of token ids",
            path.display()
        );
    }
    let prompts: Vec<Vec<u32>> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected a JSON array of prompts, each an array of token ids \
             (integers from 0 to 4294967295), e.g. [[1, 2, 3], [4, 5, 6]]",
            path.display()
        )
    })?;
    let Some(first) = prompts.first() else {
        anyhow::bail!("{} holds no prompts ([] is empty)", path.display());
    };
    let len = first.len();
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            anyhow::bail!("{}: prompt {i} is empty", path.display());
        }
        if p.len() != len {
            anyhow::bail!(
                "{}: prompts of different lengths: prompt 0 has {len} tokens, prompt {i} has {} \
                 (the logits file is one [prompts, positions, vocab] array, so all prompts must \
                 be of one length)",
                path.display(),
                p.len()
            );
        }
    }
    Ok(prompts)
}

/// The header of a version-1.0 `.npy` file holding little-endian f32 of `shape` in C order:
/// magic, version, header length, the header dictionary padded with spaces and ended by a
/// newline so that the data starts at a multiple of 64 bytes (what NumPy itself writes).
pub fn npy_header_f32(shape: &[usize]) -> Vec<u8> {
    let dims = match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {dims}, }}");
    // magic (6) + version (2) + header length (2) + dict + padding + '\n'
    let unpadded = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    dict.push('\n');
    let mut out = Vec::with_capacity(10 + dict.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Runs `pagoda eval logits`.
pub fn run(args: LogitsArgs) -> anyhow::Result<()> {
    let prompts = read_prompts(&args.prompts)?;
    let positions = prompts[0].len();
    crate::commands::threads::set_threads(args.threads)?;
    let loaded = load_for_generation(&args.model, &args.load)?;
    let model = &loaded.model;
    let config = model.config();
    for (i, p) in prompts.iter().enumerate() {
        if let Some((pos, &id)) = p
            .iter()
            .enumerate()
            .find(|&(_, &id)| id as usize >= config.vocab_size)
        {
            anyhow::bail!(
                "{}: prompt {i}, position {pos}: token id {id} is out of the model's \
                 vocabulary (ids 0..{} ; vocabulary size {})",
                args.prompts.display(),
                config.vocab_size - 1,
                config.vocab_size
            );
        }
    }
    if positions > config.context_length {
        anyhow::bail!(
            "{}: prompts of {positions} tokens exceed the model's context of {} tokens",
            args.prompts.display(),
            config.context_length
        );
    }

    let partial = {
        let mut name = args.out.as_os_str().to_owned();
        name.push(".partial");
        PathBuf::from(name)
    };
    let model_device = loaded.model.device();
    let result = write_logits(&args, &loaded, &prompts, &partial);
    let (vocab, seconds) = match result {
        Ok(v) => v,
        Err(e) => {
            std::fs::remove_file(&partial).ok();
            return Err(e);
        }
    };
    std::fs::rename(&partial, &args.out)
        .with_context(|| format!("renaming {} to {}", partial.display(), args.out.display()))?;

    let tokens = prompts.len() * positions;
    let tps = tokens as f64 / seconds.max(1e-9);
    if args.json {
        let out = json!({
            "model": args.model,
            "prompts_file": args.prompts.display().to_string(),
            "out": args.out.display().to_string(),
            "shape": [prompts.len(), positions, vocab],
            "dtype": "float32",
            "kv_cache_dtype": args.kv_cache_dtype.to_string(),
            "device": model_device.to_string(),
            "seconds": seconds,
            "tokens_per_second": tps,
        });
        println!("{out}");
    } else {
        println!(
            "wrote logits [{}, {positions}, {vocab}] f32 to {} ({} prompts x {positions} \
             positions, {:.2} s, {tps:.1} tokens/s)",
            prompts.len(),
            args.out.display(),
            prompts.len(),
            seconds
        );
    }
    Ok(())
}

/// Runs every prompt and streams its logits into `path` after the header; returns the
/// vocabulary width of the logits and the seconds spent in forward passes.
fn write_logits(
    args: &LogitsArgs,
    loaded: &LoadedModel,
    prompts: &[Vec<u32>],
    path: &Path,
) -> anyhow::Result<(usize, f64)> {
    let model = &loaded.model;
    let positions = prompts[0].len();
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut vocab = None;
    let mut seconds = 0.0;
    for (i, prompt) in prompts.iter().enumerate() {
        let mut cache = model
            .try_new_cache(positions, args.kv_cache_dtype)
            .with_context(|| format!("a KV cache for prompt {i}"))?;
        let started = Instant::now();
        let logits = model
            .forward(prompt, 0, &mut cache, Logits::All)
            .with_context(|| format!("forward pass of prompt {i}"))?;
        seconds += started.elapsed().as_secs_f64();
        if logits.len() % positions != 0 || logits.is_empty() {
            anyhow::bail!(
                "prompt {i}: the forward pass returned {} logits for {positions} positions",
                logits.len()
            );
        }
        let width = logits.len() / positions;
        match vocab {
            None => {
                vocab = Some(width);
                out.write_all(&npy_header_f32(&[prompts.len(), positions, width]))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Some(v) if v != width => {
                anyhow::bail!("prompt {i}: {width} logits per position, prompt 0 had {v}")
            }
            Some(_) => {}
        }
        let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        out.write_all(&bytes)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok((vocab.unwrap_or(0), seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_aligned_and_names_the_shape() {
        for shape in [vec![4, 256, 151936], vec![1], vec![2, 3]] {
            let h = npy_header_f32(&shape);
            assert_eq!(h.len() % 64, 0, "{shape:?}");
            assert_eq!(&h[..8], b"\x93NUMPY\x01\x00");
            let len = u16::from_le_bytes([h[8], h[9]]) as usize;
            assert_eq!(len + 10, h.len());
            assert_eq!(*h.last().unwrap(), b'\n');
            let text = std::str::from_utf8(&h[10..]).unwrap();
            assert!(text.contains("'descr': '<f4'"), "{text}");
            assert!(text.contains("'fortran_order': False"), "{text}");
        }
        let h = npy_header_f32(&[4, 256, 151936]);
        assert!(std::str::from_utf8(&h[10..])
            .unwrap()
            .contains("'shape': (4, 256, 151936)"));
        let h = npy_header_f32(&[7]);
        assert!(std::str::from_utf8(&h[10..])
            .unwrap()
            .contains("'shape': (7,)"));
    }
}
