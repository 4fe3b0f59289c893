//! Logging setup: tracing to stderr, filtered by `-v` count or `PAGODA_LOG` / `RUST_LOG`.
//!
//! Owns the one global subscriber. Invariant: logs never go to stdout (it carries results).

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// The filter: `PAGODA_LOG`, then `RUST_LOG`, else what `-v` asks for over `quiet` (the level
/// with no `-v`).
fn filter(verbosity: u8, quiet: &str) -> EnvFilter {
    let from_env = std::env::var("PAGODA_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .filter(|v| !v.trim().is_empty());
    let directives = from_env.unwrap_or_else(|| {
        match verbosity {
            0 => quiet,
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
        .to_string()
    });
    EnvFilter::try_new(&directives).unwrap_or_else(|_| EnvFilter::new(quiet))
}

fn builder(
    filter: EnvFilter,
) -> tracing_subscriber::fmt::SubscriberBuilder<
    tracing_subscriber::fmt::format::DefaultFields,
    tracing_subscriber::fmt::format::Format,
    EnvFilter,
    fn() -> std::io::Stderr,
> {
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr as fn() -> std::io::Stderr)
        .with_ansi(std::io::stderr().is_terminal())
}

/// Installs the subscriber for the CLI commands: warnings (a failing source) and, with
/// `store_notes`, the store's short progress notes unless `-v`. Commands that say what they
/// did themselves (`rm`, `cp`) go without the notes, which would say it a second time.
pub fn init(verbosity: u8, store_notes: bool) {
    let quiet = if store_notes {
        "warn,pagoda_store=info"
    } else {
        "warn"
    };
    let builder = builder(filter(verbosity, quiet));
    let result = if verbosity == 0 {
        builder.without_time().with_target(false).try_init()
    } else {
        builder.try_init()
    };
    // A second init (tests) is harmless.
    let _ = result;
}

/// Installs the server's subscriber: request logs (info) by default, as text or JSON lines.
/// The loader's placement note on a machine where the CPU is all there is
/// ([`pagoda_runtime::loader::PLACEMENT_NOTE`]) shows with `-v` only.
pub fn init_server(verbosity: u8, json: bool) {
    let quiet = format!("info,{}=warn", pagoda_runtime::loader::PLACEMENT_NOTE);
    let builder = builder(filter(verbosity, &quiet));
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}
