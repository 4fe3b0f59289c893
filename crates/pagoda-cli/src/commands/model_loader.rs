//! Finding, loading and preparing a model for the CLI commands (`run`, `batch`, `bench`):
//! the server's loader, pulling missing catalog models, with a spinner while it maps the
//! weights.

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use pagoda_server::loader::{self, Pull};
use std::time::Duration;

pub use pagoda_server::loader::LoadedModel;

/// Resolves and loads `name`, with a spinner on stderr while the weights are mapped.
pub fn load_for_generation(name: &str) -> anyhow::Result<LoadedModel> {
    let store = pagoda_store::Store::open(None).context("opening the model store")?;
    let resolved = loader::resolve(&store, name, Pull::IfMissing)?;
    let spinner = ProgressBar::new_spinner();
    spinner.set_style(ProgressStyle::with_template("{spinner} {msg}").expect("static template"));
    spinner.set_message(format!("loading {}", resolved.path.display()));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let loaded = loader::load(&resolved, name);
    spinner.finish_and_clear();
    Ok(loaded?)
}
