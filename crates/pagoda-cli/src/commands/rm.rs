//! `pagoda rm NAME...`: remove models from the store.
//!
//! Owns the command's output. Invariant: every name is tried; the command fails (exit 1) if any
//! removal failed, after reporting each failure.

use super::open_store;
use crate::cli::RmArgs;

/// Runs `pagoda rm`.
pub fn run(args: RmArgs) -> anyhow::Result<()> {
    let store = open_store()?;
    let mut failed = Vec::new();
    for name in &args.models {
        match store.remove(name) {
            Ok(()) => println!("deleted '{name}'"),
            Err(e) => {
                if args.models.len() > 1 {
                    eprintln!("error: {e}");
                }
                failed.push((name.clone(), e));
            }
        }
    }
    match failed.len() {
        0 => Ok(()),
        1 if args.models.len() == 1 => Err(failed.remove(0).1.into()),
        n => anyhow::bail!(
            "{n} of {} models could not be removed: {}",
            args.models.len(),
            failed
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
