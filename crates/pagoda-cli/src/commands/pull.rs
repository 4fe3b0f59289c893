//! `pagoda pull NAME|SOURCE`: fetch a model into the store.
//!
//! Owns the command's output: progress on stderr unless `--quiet` (one bar on a terminal, a
//! line per finished file otherwise: pagoda-store's `progress`), one result line on stdout.

use pagoda_store::PullOptions;

use super::{human_size, open_store};
use crate::cli::PullArgs;

/// Runs `pagoda pull`.
pub fn run(args: PullArgs) -> anyhow::Result<()> {
    let store = open_store()?;
    let opts = PullOptions {
        progress: !args.quiet,
        name: args.name,
        force: args.force,
        // The operator's own pull: any address they can reach, any host (redirects are
        // still checked: http(s) only, no credentials).
        public_addresses_only: false,
        allowed_urls: None,
    };
    let model = store.pull(&args.model, &opts)?;
    let (name, size, id) = match &model.manifest {
        Some(m) => (
            m.full_name(),
            m.total_size,
            m.primary().map(|f| f.digest.short().to_string()),
        ),
        None => (args.model.clone(), 0, None),
    };
    println!(
        "pulled {name} ({}, id {})",
        human_size(size),
        id.unwrap_or_else(|| "-".into())
    );
    Ok(())
}
