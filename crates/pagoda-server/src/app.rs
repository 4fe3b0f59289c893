//! The HTTP application: the router (OpenAI, Ollama, health, readiness, metrics, the chat
//! page), the background upkeep (keep-alive reaping, hot reload), and the server's life:
//! bind, load the models named at start, serve, drain on SIGTERM/SIGINT.
//!
//! Connections are served by pagoda-http (deadlines, a cap); every response gets its
//! `x-request-id` from [`crate::request_id`], the outermost layer; inside it, web pages and
//! Host names the server does not answer are refused before keys and routing
//! (`keep_browsers_out`, pagoda-http's `browser_guard`).
//!
//! Invariants: `/health` answers as soon as the socket is bound; `/ready` only once the
//! models named at start are loaded and while not draining. On a shutdown signal the
//! listener closes at once, requests in flight get up to the grace period, then the process
//! moves on (engines stop when the registry drops them).

use crate::error::ApiError;
use crate::metrics::{Metrics, MetricsError};
use crate::names::ModelNames;
use crate::registry::{Registry, RegistryConfig};
use crate::state::{AppState, ServerConfig};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use pagoda_http::browser_guard::{BrowserGuard, Pass, Refusal};
use pagoda_store::Store;
use serde_json::json;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(
        "cannot listen on {addr}: {source}; is another server using the port? pick one with --port"
    )]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("cannot load model `{model}` named at start: {message}")]
    Preload { model: String, message: String },
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// The router over `app`.
pub fn router(app: AppState) -> Router {
    Router::new()
        .merge(crate::openai::routes())
        .merge(crate::ollama::routes())
        .merge(crate::chat_page::routes())
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            app.clone(),
            count_rejections,
        ))
        .layer(middleware::from_fn_with_state(app.clone(), require_key))
        .layer(middleware::from_fn_with_state(
            app.clone(),
            keep_browsers_out,
        ))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(app.clone(), catch_panics))
        .layer(middleware::from_fn(crate::request_id::layer))
        .with_state(app)
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn ready(State(app): State<AppState>) -> Response {
    if app.is_ready() {
        Json(json!({"status": "ready"})).into_response()
    } else {
        let why = if app.draining() {
            "draining"
        } else {
            "loading"
        };
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": why})),
        )
            .into_response()
    }
}

async fn metrics(State(app): State<AppState>) -> Response {
    let adapters: Vec<String> = app
        .registry
        .adapters
        .list()
        .into_iter()
        .map(|a| a.name)
        .collect();
    let text = app.metrics.render(&app.registry.loaded(), &adapters);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

async fn not_found(State(app): State<AppState>, request: Request) -> Response {
    let path = request.uri().path();
    let e = ApiError::route_not_found(path);
    app.metrics.count_error(e.status.as_u16());
    in_the_shape_of(path, e)
}

async fn method_not_allowed(State(app): State<AppState>, request: Request) -> Response {
    let e = ApiError::method_not_allowed();
    app.metrics.count_error(e.status.as_u16());
    in_the_shape_of(request.uri().path(), e)
}

/// A panic while handling a request (a bug: client input must get a 4xx) is that request's
/// 500 and an error log line, never a connection dropped without an answer. The process and
/// every other request go on.
async fn catch_panics(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let method = request.method().clone();
    match pagoda_http::panics::catch(next.run(request)).await {
        Ok(response) => response,
        Err(reason) => {
            tracing::error!(%method, path = %path, panic = %reason, "request handler panicked");
            let e = ApiError::internal(format!("the request handler panicked: {reason}"));
            app.metrics.count_error(e.status.as_u16());
            in_the_shape_of(&path, e)
        }
    }
}

/// Ollama's error shape under `/api`, OpenAI's elsewhere.
fn in_the_shape_of(path: &str, e: ApiError) -> Response {
    if path == "/api" || path.starts_with("/api/") {
        crate::error::OllamaError(e).into_response()
    } else {
        e.into_response()
    }
}

/// API keys (`--api-key`): a request [`crate::auth::check`] refuses gets its 401 in the
/// route's error shape with `WWW-Authenticate: Bearer`, counted as an error.
async fn require_key(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    match crate::auth::check(&app.config.api_keys, path, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => {
            app.metrics.count_error(e.status.as_u16());
            let mut response = in_the_shape_of(path, e);
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}

/// Web pages and Host names the server does not answer ([`pagoda_http::browser_guard`]): 403
/// in the route's error shape, before keys or routing, so a refused request changes nothing.
/// A preflight from an allowed origin is answered here (204, no key needed: browsers send
/// none on a preflight); other responses to an allowed origin get the CORS headers.
async fn keep_browsers_out(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let verdict = app
        .browsers
        .check(request.method(), request.uri(), request.headers());
    let pass = match verdict {
        Ok(pass) => pass,
        Err(refusal) => {
            let code = match refusal {
                Refusal::Host(_) => "host_not_allowed",
                Refusal::Origin(_) => "origin_not_allowed",
            };
            let e = ApiError::forbidden(refusal.to_string()).with_code(code);
            app.metrics.count_error(e.status.as_u16());
            return in_the_shape_of(request.uri().path(), e);
        }
    };
    if let Pass::Preflight(_) = pass {
        let mut response = StatusCode::NO_CONTENT.into_response();
        pass.decorate(request.headers(), response.headers_mut());
        return response;
    }
    let mut response = next.run(request).await;
    pass.decorate(&HeaderMap::new(), response.headers_mut());
    response
}

/// Counts 4xx/5xx that axum itself produced (e.g. path rejections) and that handlers did
/// not count (handlers mark theirs with the `ApiError` extension).
async fn count_rejections(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if (status.is_client_error() || status.is_server_error())
        && response.extensions().get::<ApiError>().is_none()
    {
        app.metrics.count_error(status.as_u16());
    }
    response
}

/// A bound, not yet running server.
pub struct BoundServer {
    listener: TcpListener,
    app: AppState,
}

impl BoundServer {
    /// Binds the configured address and builds the shared state.
    pub async fn bind(mut config: ServerConfig, store: Arc<Store>) -> Result<Self, ServerError> {
        let metrics = Metrics::with_gpu(crate::gpu_metrics::nvml_probe())?;
        if config.memory_budget.is_none() {
            config.memory_budget = crate::state::default_memory_budget();
        }
        let names = Arc::new(
            ModelNames::new(store, &config.models, &config.model_dirs)
                .map_err(ServerError::Config)?,
        );
        let registry = Arc::new(Registry::new(
            names,
            RegistryConfig {
                engine: config.engine.clone(),
                keep_alive: config.keep_alive,
                memory_budget: config.memory_budget,
                load: config.load,
            },
        ));
        let addr = format!("{}:{}", config.host, config.port);
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        let browsers = BrowserGuard::new(&config.browsers, &config.host, listener.local_addr()?)
            .map_err(|e| ServerError::Config(e.to_string()))?;
        Ok(BoundServer {
            listener,
            app: AppState::new(config, registry, metrics, browsers),
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, ServerError> {
        Ok(self.listener.local_addr()?)
    }

    pub fn state(&self) -> &AppState {
        &self.app
    }

    /// Serves until `shutdown` resolves, then drains (see the module docs).
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let app = self.app;
        let (preload_tx, preload_rx) = tokio::sync::oneshot::channel::<ServerError>();
        tokio::spawn(preload(app.clone(), preload_tx));
        tokio::spawn(upkeep(app.clone()));
        let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
        let draining = app.clone();
        let signal = async move {
            shutdown.await;
            tracing::info!("shutting down: no new connections, draining requests in flight");
            draining.start_draining();
            let _ = drain_tx.send(());
        };
        let grace = app.config.drain_grace;
        let server = pagoda_http::serve(
            self.listener,
            router(app.clone()),
            app.config.connections.accept(),
            signal,
        );
        tokio::select! {
            () = server => {},
            Ok(e) = preload_rx => return Err(e),
            _ = async move {
                let _ = drain_rx.await;
                tokio::time::sleep(grace).await;
            } => tracing::warn!(grace_secs = grace.as_secs_f64(), "grace period over; closing the remaining requests"),
        }
        Ok(())
    }
}

/// Loads the models and LoRA adapters named at start, then marks the server ready.
async fn preload(app: AppState, failed: tokio::sync::oneshot::Sender<ServerError>) {
    // The operator started the server: they get the detail (paths included).
    let fail = |name: String, e: crate::error::ApiError| {
        let message = e.detail.map_or(e.message, String::from);
        tracing::error!(model = %name, error = %message, "cannot load a model named at start");
        ServerError::Preload {
            model: name,
            message,
        }
    };
    // Generative models are loaded together, with one memory plan; embedders on their own.
    let mut generative = Vec::new();
    for name in app.config.models.clone() {
        let loaded = match app.registry.kind(&name).await {
            Ok(pagoda_runtime::loader::ModelKind::Embedding) => {
                app.embedders.acquire(&name).await.map(drop)
            }
            Ok(pagoda_runtime::loader::ModelKind::Generative) => {
                generative.push(name.clone());
                Ok(())
            }
            Err(e) => Err(e),
        };
        if let Err(e) = loaded {
            let _ = failed.send(fail(name, e));
            return;
        }
    }
    if let Err((name, e)) = app.registry.preload_all(&generative).await {
        let _ = failed.send(fail(name, e));
        return;
    }
    for (name, path) in app.config.loras.clone() {
        let Some(base) = app.config.models.first().cloned() else {
            let _ = failed.send(ServerError::Preload {
                model: name,
                message: "--lora needs a model to apply to (--model)".into(),
            });
            return;
        };
        if let Err(e) = crate::openai::lora::load_adapter(&app, &name, path, &base).await {
            let message = e.detail.map_or(e.message, String::from);
            tracing::error!(adapter = %name, error = %message, "cannot load a LoRA adapter named at start");
            let _ = failed.send(ServerError::Preload {
                model: format!("{base}:{name}"),
                message,
            });
            return;
        }
    }
    app.set_ready();
    tracing::info!("ready");
}

/// Unloads idle models and picks up new versions, every `reload_interval`.
async fn upkeep(app: AppState) {
    let mut tick = tokio::time::interval(app.config.reload_interval);
    loop {
        tick.tick().await;
        for name in app.registry.reap_idle() {
            tracing::info!(model = %name, "unloading an idle model (keep_alive elapsed)");
        }
        app.registry.reload_changed().await;
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
