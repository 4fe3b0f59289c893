//! The subcommands, one module each, plus the few helpers the store commands share.
//!
//! Owns: pull, list, rm, show, create, cp, rollback (store commands), ps (asks a running server); run
//! and bench are the lead's modules, wired in here; eval measures accuracy with
//! pagoda-compress. Invariants: commands print results to stdout and nothing else there; every
//! command opens the store through [`open_store`], so none can list a model that does not load.

pub mod batch;
pub mod bench;
pub mod bench_batching;
pub mod bench_serve;
pub mod bench_workload;
pub mod compress;
pub mod cp;
pub mod create;
pub mod dataset;
pub mod devices;
pub mod distill;
pub mod engine_args;
pub mod eval;
pub mod eval_compare;
pub mod eval_logits;
pub mod eval_report;
pub mod gateway;
pub mod list;
pub mod llama_server;
pub mod merge_lora;
pub mod model_loader;
pub mod progress;
pub mod prune;
pub mod ps;
pub mod pull;
pub mod quantize;
pub mod rm;
pub mod rollback;
pub mod run;
pub mod run_params;
pub mod run_repl;
pub mod serve;
pub mod show;
pub mod threads;
pub mod tune;

use std::path::Path;

use anyhow::Context;
use pagoda_store::Store;

/// Opens the store selected by `--store` / `PAGODA_HOME` / the default, with [`loadable`] as
/// its validator: every command that can put a model in the store (pull, create, cp, and the
/// pulls of run, serve and the rest) lets in only models that load.
pub fn open_store() -> anyhow::Result<Store> {
    Ok(Store::open(None)
        .context("opening the model store")?
        .with_validator(loadable))
}

/// The store's validator: the model at `path` opens as loading opens it
/// ([`pagoda_model::validate_model`]: header, tensors, config, tokenizer, chat template).
pub fn loadable(path: &Path) -> Result<(), String> {
    pagoda_model::validate_model(path)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// `134.5M`, `1.5B`: parameter counts the way model cards write them.
pub fn human_count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}K", n / 1e3)
    } else {
        format!("{n}")
    }
}

/// Sizes the way `ollama list` prints them: decimal units, no decimals from 10 up.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if value >= 10.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(999), "999 B");
        assert_eq!(human_size(98_362_432), "98 MB");
        assert_eq!(human_size(1_060_000_000), "1.1 GB");
        assert_eq!(human_size(4_700_000_000), "4.7 GB");
    }
}
