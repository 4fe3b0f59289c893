//! `pagoda serve`: the OpenAI- and Ollama-compatible HTTP server (pagoda-server) on the
//! batching engine. Models named with `--model` are pulled if missing (with progress bars)
//! before the server starts, then loaded; others load on first request.

use crate::commands::engine_args::{parse_size, EngineArgs, RequestLimitArgs};
use anyhow::Context;
use clap::Args;
use pagoda_engine::BatchingMode;
use pagoda_model::DeviceChoice;
use pagoda_server::state::{BrowserRules, ConnectionLimits, PullPolicy};
use pagoda_server::{BoundServer, ServerConfig, DEFAULT_PORT};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `pagoda serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Models to load at start (repeat the flag for several); the first answers requests
    /// that name no model. Missing catalog models are pulled first.
    #[arg(long = "model", short = 'm', default_value = pagoda_store::DEFAULT_MODEL)]
    pub models: Vec<String>,
    /// A PEFT LoRA adapter folder to serve as NAME on the first model (repeat for several):
    /// requests select it with `"model": "NAME"` or `"model": "BASE:NAME"`, and others run the
    /// base model in the same batches. More can be loaded at run time with
    /// POST /v1/load_lora_adapter.
    #[arg(long = "lora", value_name = "NAME=PATH", value_parser = parse_lora)]
    pub loras: Vec<(String, std::path::PathBuf)>,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (11435: one above Ollama's, so both can run).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Requests per model that may wait beyond the running batch; more get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Largest request body in bytes (e.g. 4MiB); more gets 413.
    #[arg(long, value_parser = parse_size, default_value = "4MiB")]
    pub max_body_bytes: u64,
    /// How long a model loaded on demand stays after its last request (e.g. 5m, 1h, 0 to
    /// unload at once, -1 to keep it); models named with --model stay loaded.
    #[arg(long, default_value = "5m", allow_hyphen_values = true)]
    pub keep_alive: String,
    /// Most memory all loaded models may use (weights + KV pools), e.g. 8GiB; over it, idle
    /// models are evicted, or the load is refused with 503. Default: 90% of the machine's
    /// memory.
    #[arg(long, value_parser = parse_size)]
    pub memory_budget: Option<u64>,
    /// Let clients name model files (and LoRA folders) by path under DIR (repeat for several).
    /// Without it, requests name models in the store, or the models given with --model.
    #[arg(long = "allow-model-dir", value_name = "DIR")]
    pub allow_model_dirs: Vec<std::path::PathBuf>,
    /// Let clients pull models with POST /api/pull: catalog names, plus the sources given with
    /// --pull-allow-source. Off by default (403).
    #[arg(long)]
    pub allow_pull: bool,
    /// A source clients may pull from when --allow-pull is on (repeat for several): `hf`,
    /// `pip`, `https://HOST` (`https://*.DOMAIN` for its subdomains; the scheme's default
    /// port unless `:PORT` is given), or a bucket (`s3://BUCKET`, `gs://BUCKET`,
    /// `az://CONTAINER`). Never local files. Redirects of a URL pull must stay on the list.
    #[arg(
        long = "pull-allow-source",
        value_name = "SOURCE",
        requires = "allow_pull"
    )]
    pub pull_allow_sources: Vec<String>,
    /// Let pulls made for clients reach loopback, private and link-local addresses (a mirror
    /// on the local network). Off: only public addresses, redirects and DNS included.
    #[arg(long, requires = "allow_pull")]
    pub pull_allow_private: bool,
    /// Seconds a client has to send a request's headers (and that an idle keep-alive
    /// connection stays open); a client that stalls mid-headers gets 408.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's body once the server reads it; 408 after.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub body_timeout: f64,
    /// Connections open at once; more wait until one closes.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// On SIGTERM/Ctrl-C, how long requests in flight may take to finish (seconds).
    #[arg(long, default_value_t = 30.0)]
    pub drain_grace: f64,
    /// Require this API key (`Authorization: Bearer KEY`) on every route but /health, /ready,
    /// /metrics and the chat page; 401 otherwise. Repeat for several. Held hashed in memory;
    /// prefer the environment variable or --api-key-file over the command line, which other
    /// users of the machine can read.
    #[arg(
        long = "api-key",
        value_name = "KEY",
        env = "PAGODA_API_KEY",
        hide_env_values = true
    )]
    pub api_keys: Vec<String>,
    /// Require one of the keys in FILE, held hashed at rest: one `sha256:<hex>` per line
    /// (from `pagoda gateway keys hash KEY`), optionally followed by a label; `#` comments.
    /// Repeat for several files.
    #[arg(long = "api-key-file", value_name = "FILE")]
    pub api_key_files: Vec<std::path::PathBuf>,
    /// Also answer web pages from ORIGIN (repeat, or separate with commas): an origin such as
    /// https://app.example (`*` wildcards: http://localhost:*), `null`, or `*` for every page.
    /// Always allowed: loopback pages (http/https on localhost, 127.0.0.1, [::1]), desktop apps
    /// (app:, file:, tauri:, vscode-webview:), and the server's own chat page; other pages get
    /// 403, so a site the user visits cannot drive the server.
    #[arg(
        long = "allowed-origins",
        value_name = "ORIGIN",
        env = "PAGODA_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,
    /// Also answer requests whose Host is HOST (repeat, or separate with commas; `*.DOMAIN`
    /// for subdomains, `*` for any). On a loopback --host only localhost, loopback addresses
    /// and the --host itself are answered (403 otherwise: DNS rebinding); on other addresses
    /// the Host check is off unless this is given.
    #[arg(long = "allowed-hosts", value_name = "HOST", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Log format on stderr: text, or json (one object per line, for log collectors).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    #[command(flatten)]
    pub limits: RequestLimitArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Runs `pagoda serve` until SIGTERM or Ctrl-C.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    crate::commands::threads::set_threads(args.threads)?;
    // A GPU asked for by name must be there before anything is pulled, loaded or said to be
    // serving: one error line naming what is missing.
    let device = args.engine.load.device;
    if !matches!(device, DeviceChoice::Auto | DeviceChoice::Cpu) {
        device.resolve()?;
    }
    let keep_alive = parse_keep_alive(&args.keep_alive)?;
    let api_keys = pagoda_server::auth::ApiKeys::new(&args.api_keys, &args.api_key_files)?;
    let browsers = BrowserRules {
        allowed_origins: args.allowed_origins.clone(),
        allowed_hosts: args.allowed_hosts.clone(),
    };
    browsers.validate()?;
    let store = Arc::new(crate::commands::open_store()?);
    for name in &args.models {
        pagoda_runtime::loader::resolve(&store, name, pagoda_runtime::loader::Pull::IfMissing)
            .with_context(|| format!("getting model `{name}`"))?;
    }
    let config = ServerConfig {
        host: args.host.clone(),
        port: args.port,
        models: args.models.clone(),
        engine: args
            .engine
            .config_with_speculation(BatchingMode::Continuous)?,
        max_queue: args.max_queue,
        max_body_bytes: usize::try_from(args.max_body_bytes).unwrap_or(usize::MAX),
        keep_alive,
        memory_budget: args.memory_budget,
        drain_grace: Duration::try_from_secs_f64(args.drain_grace.max(0.0)).map_err(|_| {
            anyhow::anyhow!(
                "--drain-grace must be a number of seconds, got {}",
                args.drain_grace
            )
        })?,
        load: args.engine.load.options(),
        loras: args.loras.clone(),
        model_dirs: args.allow_model_dirs.clone(),
        pull: PullPolicy {
            enabled: args.allow_pull,
            allowed_sources: args.pull_allow_sources.clone(),
            allow_private: args.pull_allow_private,
        },
        connections: ConnectionLimits {
            header_timeout: positive_seconds("--header-timeout", args.header_timeout)?,
            body_timeout: positive_seconds("--body-timeout", args.body_timeout)?,
            max_connections: args.max_connections.max(1),
        },
        max_tokens_limit: args.limits.max_tokens_limit(),
        api_keys,
        browsers,
        ..ServerConfig::default()
    };
    for source in &config.pull.allowed_sources {
        check_pull_source(source)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("pagoda-http")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let server = BoundServer::bind(config, store).await?;
        let addr = server.local_addr()?;
        eprintln!(
            "pagoda serving {} on http://{addr} (OpenAI: http://{addr}/v1, Ollama: http://{addr}, chat: http://{addr}/)",
            args.models.join(", ")
        );
        server.run(pagoda_server::shutdown_signal()).await?;
        anyhow::Ok(())
    })?;
    eprintln!("pagoda: stopped");
    Ok(())
}

/// A timeout flag's value as a duration (positive and finite).
fn positive_seconds(flag: &str, secs: f64) -> anyhow::Result<Duration> {
    // try_from: 1e30 or inf would overflow (and panic) in Duration::from_secs_f64.
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if secs > 0.0 => Ok(d),
        _ => anyhow::bail!("{flag} must be a positive number of seconds, got {secs}"),
    }
}

/// One `--pull-allow-source`: `hf`, `pip`, or `scheme://HOST[:PORT]` (read by the same URL
/// parser the pulls are judged with, so a typo is an error at start, not an open door).
fn check_pull_source(source: &str) -> anyhow::Result<()> {
    if matches!(source.to_ascii_lowercase().as_str(), "hf" | "pip") {
        return Ok(());
    }
    pagoda_store::fetch::url_policy::AllowList::new([source]).map_err(|e| {
        anyhow::anyhow!("--pull-allow-source {e}; expected hf, pip, https://HOST[:PORT] (https://*.DOMAIN for subdomains) or a bucket (s3://BUCKET, gs://BUCKET, az://CONTAINER)")
    })?;
    Ok(())
}

/// `NAME=PATH` of `--lora`.
fn parse_lora(text: &str) -> Result<(String, std::path::PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !name.trim().is_empty() && !path.trim().is_empty() => Ok((
            name.trim().to_string(),
            std::path::PathBuf::from(path.trim()),
        )),
        _ => Err(format!(
            "expected NAME=PATH (an adapter name and a PEFT LoRA folder), got {text:?}"
        )),
    }
}

/// `5m`, `1h30m`, `0`, `-1` (forever).
fn parse_keep_alive(text: &str) -> anyhow::Result<Option<Duration>> {
    let value = match text.trim().parse::<f64>() {
        Ok(secs) => pagoda_protocol::ollama::KeepAlive::Seconds(secs),
        Err(_) => pagoda_protocol::ollama::KeepAlive::Text(text.to_string()),
    };
    Ok(value.duration()?)
}
