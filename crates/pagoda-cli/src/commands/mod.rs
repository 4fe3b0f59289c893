//! The subcommands, one module each, plus the few helpers the store commands share.
//!
//! Owns: pull, list, rm, show, create, cp (store commands), ps (asks a running server); run
//! and bench are the lead's modules, wired in here; eval measures accuracy with
//! pagoda-compress. Invariant: commands print results to stdout and nothing else there.

pub mod batch;
pub mod bench;
pub mod bench_batching;
pub mod bench_serve;
pub mod cp;
pub mod create;
pub mod dataset;
pub mod engine_args;
pub mod eval;
pub mod eval_compare;
pub mod eval_report;
pub mod gateway;
pub mod list;
pub mod llama_server;
pub mod merge_lora;
pub mod model_loader;
pub mod ps;
pub mod pull;
pub mod quantize;
pub mod rm;
pub mod run;
pub mod serve;
pub mod show;
pub mod threads;
pub mod tune;

use anyhow::Context;
use pagoda_store::Store;

/// Opens the store selected by `--store` / `PAGODA_HOME` / the default.
pub fn open_store() -> anyhow::Result<Store> {
    Store::open(None).context("opening the model store")
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
