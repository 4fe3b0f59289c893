//! `pagoda cp SRC DST`: the same model under a second name, like `ollama cp`.
//!
//! Owns the command's output. Invariant: no blob is copied; the new manifest names the same
//! blobs (and carries the same Modelfile layer), so removing SRC leaves DST working.

use super::open_store;
use crate::cli::CpArgs;

/// Runs `pagoda cp`.
pub fn run(args: CpArgs) -> anyhow::Result<()> {
    let store = open_store()?;
    let copied = store.copy(&args.source, &args.destination)?;
    let to = copied
        .name
        .map_or_else(|| args.destination.clone(), |n| n.to_string());
    println!("copied '{}' to '{to}'", args.source);
    Ok(())
}
