//! The `pagoda` binary: parses arguments, sets up logging, dispatches to a command.
//!
//! Owns process-level behaviour only. Invariants: results go to stdout, logs and progress to
//! stderr; an error prints as `error: ...` with its cause chain on stderr and exits with code 1.
//! `--store DIR` is exported as `PAGODA_HOME` before dispatch, so every command that opens the
//! store with `Store::open(None)` uses it.

mod cli;
mod commands;
mod logging;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Serve(args) => logging::init_server(cli.verbosity(), args.log_format == "json"),
        Command::Gateway(args) if args.command.is_none() => {
            logging::init_server(cli.verbosity(), args.log_format == "json")
        }
        // They print their own line: the store's note would say it again.
        Command::Rm(_) | Command::Cp(_) | Command::Rollback(_) => {
            logging::init(cli.verbosity(), false)
        }
        _ => logging::init(cli.verbosity(), true),
    }
    if let Some(dir) = &cli.store {
        // Single-threaded here: nothing else reads the environment yet.
        std::env::set_var("PAGODA_HOME", dir);
    }
    if !matches!(cli.command, Command::TemplateWorker) {
        install_template_sandbox();
    }
    let result = match cli.command {
        Command::Pull(args) => commands::pull::run(args),
        Command::List(args) => commands::list::run(args),
        Command::Rm(args) => commands::rm::run(args),
        Command::Show(args) => commands::show::run(args),
        Command::Create(args) => commands::create::run(args),
        Command::Cp(args) => commands::cp::run(args),
        Command::Rollback(args) => commands::rollback::run(args),
        Command::Ps(args) => commands::ps::run(args),
        Command::Devices(args) => commands::devices::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Batch(args) => commands::batch::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Quantize(args) => commands::quantize::run(args),
        Command::Prune(args) => commands::prune::run(args),
        Command::Distill(args) => commands::distill::run(*args),
        Command::Compress(args) => commands::compress::run(args, cli::check_argv),
        Command::MergeLora(args) => commands::merge_lora::run(args),
        Command::Gateway(args) => commands::gateway::run(args),
        Command::Tune(args) => commands::tune::run(args),
        Command::TemplateWorker => {
            // Ctrl-C in `pagoda run`'s chat reaches the whole process group; it stops the
            // answer, and must not end the workers the next turn renders in. A worker still
            // ends with its parent (its stdin closes).
            let ignored = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, ignored);
            pagoda_model::chat_template::serve_worker(
                std::io::stdin().lock(),
                std::io::stdout().lock(),
            )
            .map_err(anyhow::Error::from)
        }
    };
    if let Some(path) = std::env::var_os(commands::compress::PEAK_RSS_FILE_ENV) {
        // Asked by `pagoda compress`, which runs this process as a stage.
        let _ = std::fs::write(path, format!("{:.1}", commands::bench::peak_rss_mb()));
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e);
            ExitCode::FAILURE
        }
    }
}

/// Every chat template this process renders (the server's, `pagoda create`'s check, `pagoda
/// run`'s) runs in a worker that is this binary under a memory limit.
fn install_template_sandbox() {
    // This binary, even if the file was replaced since it started.
    let program = if cfg!(target_os = "linux") {
        std::path::PathBuf::from("/proc/self/exe")
    } else {
        match std::env::current_exe() {
            Ok(path) => path,
            Err(_) => return,
        }
    };
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let command = pagoda_model::template_sandbox::WorkerCommand {
        program,
        args: vec!["template-worker".into()],
    };
    // Installed once, here, before any command runs.
    let _ = pagoda_model::template_sandbox::install(command, workers);
}

/// Prints an error and its causes, skipping causes whose text the message above already holds.
fn report(e: &anyhow::Error) {
    let mut shown = e.to_string();
    eprintln!("error: {shown}");
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !shown.contains(&text) {
            eprintln!("  caused by: {text}");
        }
        shown = text;
    }
}
