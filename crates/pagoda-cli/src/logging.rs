//! Logging setup: tracing to stderr, filtered by `-v` count or `PAGODA_LOG` / `RUST_LOG`.
//!
//! Owns the one global subscriber. Invariant: logs never go to stdout (it carries results).

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Installs the subscriber. `PAGODA_LOG`, then `RUST_LOG`, override the `-v` level.
pub fn init(verbosity: u8) {
    let from_env = std::env::var("PAGODA_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .filter(|v| !v.trim().is_empty());
    let directives = from_env.unwrap_or_else(|| {
        match verbosity {
            // Warnings (a failing source) and the store's short progress notes.
            0 => "warn,pagoda_store=info",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
        .to_string()
    });
    let filter = EnvFilter::try_new(&directives).unwrap_or_else(|_| EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let result = if verbosity == 0 {
        builder.without_time().with_target(false).try_init()
    } else {
        builder.try_init()
    };
    // A second init (tests) is harmless.
    let _ = result;
}

/// Installs the server's subscriber: request logs (info) by default, as text or JSON lines.
pub fn init_server(verbosity: u8, json: bool) {
    let from_env = std::env::var("PAGODA_LOG")
        .ok()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .filter(|v| !v.trim().is_empty());
    let directives = from_env.unwrap_or_else(|| {
        match verbosity {
            0 | 1 => "info",
            2 => "debug",
            _ => "trace",
        }
        .to_string()
    });
    let filter = EnvFilter::try_new(&directives).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}
