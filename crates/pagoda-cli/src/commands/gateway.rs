//! `pagoda gateway`: run the model gateway, and the operator's commands that talk to a running
//! one through its admin API (keys, rollouts, usage, reload) or check a config offline.
//!
//! Owns the argument grammar of those commands and the printing of their answers. Invariant:
//! the admin commands never touch the gateway's database directly — the running gateway is the
//! only writer, so hashing, validation and several instances stay consistent.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use pagoda_gateway::config::GatewayConfig;
use serde_json::{json, Value};

const GATEWAY_HELP: &str = "\
Examples:
  pagoda gateway --config gateway.toml           run it (the config is reloaded when it changes)
  pagoda gateway check --config gateway.toml     validate a config without running it
  pagoda gateway keys create --name acme --tier premium --rpm 600 --tpm 100000 --models chat
  pagoda gateway keys list
  pagoda gateway keys revoke acme
  pagoda gateway keys hash pk-...                the key_sha256 for a [[key]] in the config
  pagoda gateway rollout status
  pagoda gateway rollout promote chat            (also pause, resume, abort)
  pagoda gateway usage --key acme                tokens and requests per key, route and version
The admin commands reach the gateway at --url (default http://127.0.0.1:8080) with the admin
key from --admin-key or PAGODA_GATEWAY_ADMIN_KEY.";

#[derive(Debug, Args)]
#[command(after_help = GATEWAY_HELP, args_conflicts_with_subcommands = true)]
pub struct GatewayArgs {
    /// The gateway config (TOML): targets, routes, keys, limits, cache, storage.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Listen address; overrides server.listen.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,

    /// Log format on stderr: text or json.
    #[arg(long, default_value = "text")]
    pub log_format: String,

    /// Worker threads (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    #[command(subcommand)]
    pub command: Option<GatewayCommand>,
}

#[derive(Debug, Subcommand)]
pub enum GatewayCommand {
    /// Validate a config file and print what it declares.
    Check {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
    },
    /// Manage API keys of a running gateway.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Watch and steer canary rollouts of a running gateway.
    Rollout {
        #[command(flatten)]
        admin: AdminArgs,
        /// status (with the shared history of changes when the gateway uses Redis), promote,
        /// pause, resume, abort, or restart (from the first step, after a rollback or abort).
        action: String,
        /// The route (client-facing model name); not needed for status.
        route: Option<String>,
    },
    /// Usage per key, route and version (for billing).
    Usage {
        #[command(flatten)]
        admin: AdminArgs,
        /// Only this key (id or name).
        #[arg(long)]
        key: Option<String>,
        /// Only records at or after this time (milliseconds since the epoch).
        #[arg(long)]
        since_ms: Option<u64>,
    },
    /// Re-read the config file now (it is also watched).
    Reload {
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key; its secret is printed once.
    Create {
        #[command(flatten)]
        admin: AdminArgs,
        #[arg(long)]
        name: String,
        #[arg(long)]
        tier: Option<String>,
        #[arg(long)]
        group: Option<String>,
        /// Client-facing models the key may use (repeat or comma-separate); default all.
        #[arg(long, value_delimiter = ',')]
        models: Vec<String>,
        /// Requests per minute.
        #[arg(long)]
        rpm: Option<u64>,
        /// Tokens per minute.
        #[arg(long)]
        tpm: Option<u64>,
        /// Total tokens the key may spend.
        #[arg(long)]
        budget_tokens: Option<u64>,
    },
    /// List keys (never their secrets).
    List {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Revoke a key by id or name; it is refused from then on.
    Revoke {
        #[command(flatten)]
        admin: AdminArgs,
        id_or_name: String,
    },
    /// Print the `sha256:` hash of a key, for a `[[key]]` entry in the config file.
    Hash { key: String },
}

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// The gateway's base URL.
    #[arg(
        long,
        default_value = "http://127.0.0.1:8080",
        env = "PAGODA_GATEWAY_URL"
    )]
    pub url: String,
    /// The admin key.
    #[arg(long, env = "PAGODA_GATEWAY_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,
}

pub fn run(args: GatewayArgs) -> anyhow::Result<()> {
    match args.command {
        None => serve(args.config, args.listen, args.threads),
        Some(GatewayCommand::Check { config }) => check(&config),
        Some(GatewayCommand::Keys(cmd)) => keys(cmd),
        Some(GatewayCommand::Rollout {
            admin,
            action,
            route,
        }) => rollout(&admin, &action, route.as_deref()),
        Some(GatewayCommand::Usage {
            admin,
            key,
            since_ms,
        }) => {
            let mut path = "/admin/usage?".to_string();
            if let Some(k) = key {
                path.push_str(&format!("key={k}&"));
            }
            if let Some(s) = since_ms {
                path.push_str(&format!("since_ms={s}"));
            }
            print_json(&call(&admin, "GET", &path, None)?)
        }
        Some(GatewayCommand::Reload { admin }) => {
            print_json(&call(&admin, "POST", "/admin/reload", None)?)
        }
    }
}

fn serve(
    config: Option<PathBuf>,
    listen: Option<String>,
    threads: Option<usize>,
) -> anyhow::Result<()> {
    let Some(path) = config else {
        bail!("give the gateway a config: `pagoda gateway --config gateway.toml` (see docs/gateway.md for an example)");
    };
    let mut cfg = GatewayConfig::load(&path)?;
    if let Some(l) = listen {
        cfg.server.listen = l;
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        builder.worker_threads(n.max(1));
    }
    let runtime = builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let addr = cfg.server.listen.clone();
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| {
                format!("cannot listen on {addr} (in use? pick another with --listen)")
            })?;
        let gateway = pagoda_gateway::state::Gateway::new(cfg, Some(path)).await?;
        let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);
        tracing::info!(addr = %bound, "pagoda gateway listening");
        eprintln!("pagoda gateway listening on http://{bound}");
        pagoda_gateway::serve(gateway, listener, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("the gateway stopped with an error")
    })
}

fn check(path: &std::path::Path) -> anyhow::Result<()> {
    let cfg = GatewayConfig::load(path)?;
    println!("{}: valid", path.display());
    println!(
        "  targets: {}",
        cfg.targets
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  routes:  {}",
        cfg.routes
            .iter()
            .map(|r| r.model.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("  keys in the file: {}", cfg.keys.len());
    Ok(())
}

fn keys(cmd: KeysCommand) -> anyhow::Result<()> {
    match cmd {
        KeysCommand::Create {
            admin,
            name,
            tier,
            group,
            models,
            rpm,
            tpm,
            budget_tokens,
        } => {
            let body = json!({"name": name, "tier": tier, "group": group, "models": models,
                "limits": {"rpm": rpm, "tpm": tpm, "budget_tokens": budget_tokens}});
            let v = call(&admin, "POST", "/admin/keys", Some(body))?;
            println!("{}", v["key"].as_str().unwrap_or_default());
            eprintln!(
                "created key '{}' (id {}); the secret above is shown only once",
                v["record"]["name"].as_str().unwrap_or_default(),
                v["record"]["id"].as_str().unwrap_or_default()
            );
            Ok(())
        }
        KeysCommand::List { admin } => {
            let v = call(&admin, "GET", "/admin/keys", None)?;
            println!(
                "{:<18} {:<24} {:<10} {:<8} {:>8} {:>10} {:>12}",
                "ID", "NAME", "TIER", "STATE", "RPM", "TPM", "BUDGET"
            );
            let dash = |v: &Value| {
                v.as_u64()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "-".into())
            };
            for k in v["data"].as_array().into_iter().flatten() {
                println!(
                    "{:<18} {:<24} {:<10} {:<8} {:>8} {:>10} {:>12}",
                    k["id"].as_str().unwrap_or_default(),
                    k["name"].as_str().unwrap_or_default(),
                    k["tier"].as_str().unwrap_or("-"),
                    if k["revoked"].as_bool().unwrap_or(false) {
                        "revoked"
                    } else {
                        "active"
                    },
                    dash(&k["limits"]["rpm"]),
                    dash(&k["limits"]["tpm"]),
                    dash(&k["limits"]["budget_tokens"]),
                );
            }
            Ok(())
        }
        KeysCommand::Revoke { admin, id_or_name } => {
            let v = call(&admin, "DELETE", &format!("/admin/keys/{id_or_name}"), None)?;
            println!("revoked {}", v["name"].as_str().unwrap_or(&id_or_name));
            Ok(())
        }
        KeysCommand::Hash { key } => {
            println!("{}", pagoda_gateway::keys::hash_key(&key));
            Ok(())
        }
    }
}

fn rollout(admin: &AdminArgs, action: &str, route: Option<&str>) -> anyhow::Result<()> {
    if action == "status" {
        return print_json(&call(admin, "GET", "/admin/rollouts", None)?);
    }
    let Some(route) = route else {
        bail!("`pagoda gateway rollout {action}` needs the route, e.g. `pagoda gateway rollout {action} chat`");
    };
    if !matches!(action, "promote" | "pause" | "resume" | "abort" | "restart") {
        bail!("unknown rollout action '{action}': use status, promote, pause, resume, abort or restart");
    }
    print_json(&call(
        admin,
        "POST",
        &format!("/admin/rollouts/{route}/{action}"),
        None,
    )?)
}

fn print_json(v: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// One admin API call; a refusal becomes an error with the gateway's message.
fn call(admin: &AdminArgs, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
    let Some(key) = &admin.admin_key else {
        bail!("the admin commands need the admin key: --admin-key or PAGODA_GATEWAY_ADMIN_KEY");
    };
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build();
    let url = format!("{}{}", admin.url.trim_end_matches('/'), path);
    let request = agent
        .request(method, &url)
        .set("authorization", &format!("Bearer {key}"));
    let result = match body {
        Some(b) => request.send_json(b),
        None => request.call(),
    };
    match result {
        Ok(r) => r.into_json().context("the gateway's answer is not JSON"),
        Err(ureq::Error::Status(code, r)) => {
            let v: Value = r.into_json().unwrap_or(Value::Null);
            let msg = v["error"]["message"].as_str().unwrap_or("no message");
            bail!("the gateway refused ({code}): {msg}")
        }
        Err(e) => bail!(
            "cannot reach the gateway at {}: {e} (is it running? set --url)",
            admin.url
        ),
    }
}
