//! `pagoda rollback NAME [--to DIGEST]`: point a model's name back to a version the store kept
//! ([`pagoda_store::Store::rollback`]).
//!
//! Owns the command's output: one line naming the model and both versions by short ID.
//! Invariant: on any refusal (unknown name, nothing kept, an unknown or ambiguous digest)
//! nothing changes and the command exits 1 with the store's message, which says what to do.

use super::open_store;
use crate::cli::RollbackArgs;
use pagoda_store::versions::short_id;

/// Runs `pagoda rollback`.
pub fn run(args: RollbackArgs) -> anyhow::Result<()> {
    let store = open_store()?;
    let done = store.rollback(&args.model, args.to.as_deref())?;
    println!(
        "rolled '{}' back from {} to {} (`pagoda rollback {}` again returns to {})",
        done.name,
        short_id(&done.from),
        short_id(&done.to),
        done.name,
        short_id(&done.from)
    );
    Ok(())
}
