//! `POST /api/create` (a derived model: a stored base plus SYSTEM, TEMPLATE, PARAMETER,
//! MESSAGE and LICENSE) and `POST /api/copy` (a second name), the Ollama way, over
//! [`Store::create_from_stored`](pagoda_store::Store::create_from_stored) and
//! [`Store::copy`](pagoda_store::Store::copy).
//!
//! Owns turning a create request — the current fields, or legacy Modelfile text — into a
//! [`Modelfile`], and both routes' answers: create streams `{"status": ...}` lines ending
//! with `{"status":"success"}` (or answers that one object with `stream: false`); copy
//! answers 200 with an empty body, 404 for an unknown source.
//!
//! Invariants (any client that reaches the server can call these): the base is a model
//! already in the store, named by its store name; a path, URL or other source in `from` /
//! FROM is a 400 naming `from`, and the store checks again under the lookup that picks the
//! base, so nothing is ever read from a client-named path or fetched from a client-named
//! address. ADAPTER (a folder on the server), `quantize` and `files` / `adapters` (blob
//! uploads) are 400s naming them; unknown fields are 400s from the wire types; a TEMPLATE
//! must be Jinja that compiles. Nothing is written unless the whole model is valid and its
//! base loads (the store's validator; why a base does not load names files, so it goes to
//! the log only); a name that was loaded is unloaded after it is replaced, so its next
//! request loads the new definition.

use super::{line, ndjson, respond};
use crate::error::ApiError;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pagoda_model::chat_template::ChatTemplate;
use pagoda_model::ModelError;
use pagoda_protocol::ollama::{CopyRequest, CreateRequest, ProgressResponse};
use pagoda_store::modelfile::{looks_like_go_template, Message, Parameters, Role};
use pagoda_store::{ModelName, Modelfile, Source, StoreError};
use serde_json::Value;

pub(super) async fn create(State(app): State<AppState>, body: Body) -> Response {
    let result = run_create(&app, body).await;
    respond(&app, result)
}

pub(super) async fn copy(State(app): State<AppState>, body: Body) -> Response {
    let result = run_copy(&app, body).await;
    respond(&app, result)
}

async fn run_create(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: CreateRequest = crate::body::json(body, app.body_limits()).await?;
    let name = req.model_name().trim().to_string();
    if name.is_empty() {
        return Err(ApiError::invalid_param(
            "model",
            "name the model to create in `model`",
        ));
    }
    let stream = req.stream;
    let modelfile = modelfile_of(req)?;
    let from = modelfile.from.clone();
    let store = app.registry.store().clone();
    let created = tokio::task::spawn_blocking(move || store.create_from_stored(&name, &modelfile))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| create_error(&from, e))?;
    if let Some(n) = &created.name {
        app.registry.unload(&n.to_string());
    }
    let status = |s: String| ProgressResponse {
        status: s,
        ..ProgressResponse::default()
    };
    if !stream {
        return Ok(Json(status("success".into())).into_response());
    }
    let mut lines: Vec<String> = created
        .manifest
        .iter()
        .flat_map(|m| &m.files)
        .map(|f| line(&status(format!("using existing layer {}", f.digest))))
        .collect();
    lines.push(line(&status("writing manifest".into())));
    lines.push(line(&status("success".into())));
    Ok(ndjson(futures_util::stream::iter(lines)))
}

/// The Modelfile a create request describes; every refusal is a 400 naming the field.
fn modelfile_of(req: CreateRequest) -> Result<Modelfile, ApiError> {
    for (field, given) in [
        ("quantize", req.quantize.is_some()),
        ("files", req.files.is_some()),
        ("adapters", req.adapters.is_some()),
    ] {
        if given {
            return Err(ApiError::invalid_param(
                field,
                format!(
                    "`{field}` is not supported by this server's /api/create: it creates models FROM a model already in the store (quantize offline with `pagoda quantize`, then `pagoda pull` the result on the server)"
                ),
            ));
        }
    }
    let modelfile = match req.modelfile {
        Some(text) => {
            let fields = [
                ("from", req.from.is_some()),
                ("system", req.system.is_some()),
                ("template", req.template.is_some()),
                ("parameters", req.parameters.is_some()),
                ("messages", req.messages.is_some()),
                ("license", req.license.is_some()),
            ];
            if let Some((field, _)) = fields.iter().find(|(_, given)| *given) {
                return Err(ApiError::invalid_param(
                    "modelfile",
                    format!("give either `modelfile` (the legacy form) or `from`, `system`, `template`, `parameters`, `messages` and `license`, not both (`{field}` is given too)"),
                ));
            }
            let mf = Modelfile::parse(&text).map_err(|e| {
                ApiError::invalid_param("modelfile", format!("invalid `modelfile`: {e}"))
            })?;
            if !mf.adapters.is_empty() {
                return Err(ApiError::invalid_param(
                    "modelfile",
                    "ADAPTER names a folder on the server and is not accepted over HTTP; run `pagoda create` on the server",
                ));
            }
            mf
        }
        None => {
            let from = req.from.unwrap_or_default();
            if from.trim().is_empty() {
                return Err(ApiError::invalid_param(
                    "from",
                    "name the base model in `from` (a model in the store: GET /api/tags lists them)",
                ));
            }
            Modelfile {
                from,
                parameters: parameters(req.parameters.unwrap_or_default())?,
                template: req.template,
                system: req.system,
                adapters: Vec::new(),
                messages: messages(req.messages.unwrap_or_default())?,
                license: req.license.map(|l| l.into_texts()).unwrap_or_default(),
            }
        }
    };
    check_from(&modelfile.from)?;
    check_template(modelfile.template.as_deref())?;
    modelfile.validate().map_err(|e| {
        let field = if e.to_string().contains("TEMPLATE") {
            "template"
        } else {
            "parameters"
        };
        ApiError::invalid_param(field, e.to_string())
    })?;
    Ok(modelfile)
}

/// `from` must be a store name: never a path, URL or other source (a file-open or request
/// forgery vector for any client).
fn check_from(from: &str) -> Result<(), ApiError> {
    let is_source = !matches!(Source::parse(from), Ok(None));
    if is_source || ModelName::parse(from).is_err() {
        return Err(ApiError::invalid_param(
            "from",
            format!(
                "`from` '{}' is not a model name: over HTTP the base must be a model already in the store (GET /api/tags lists them), never a path or URL; pull it on the server first",
                from.trim()
            ),
        ));
    }
    Ok(())
}

/// A TEMPLATE must be Jinja that compiles (Ollama's Go templates are refused).
fn check_template(template: Option<&str>) -> Result<(), ApiError> {
    let Some(source) = template else {
        return Ok(());
    };
    if looks_like_go_template(source) {
        return Err(ApiError::invalid_param(
            "template",
            StoreError::GoTemplate.to_string(),
        ));
    }
    let invalid = |e: ModelError| {
        let api = ApiError::invalid_param("template", format!("`template` {e}"));
        match e {
            ModelError::TemplateLimit(_) => api.with_code("invalid_template"),
            _ => api,
        }
    };
    let compiled = ChatTemplate::new(source.to_string(), String::new(), String::new()).map_err(
        |e| match e {
            ModelError::ChatTemplate(m) => invalid(ModelError::ChatTemplate(format!(
                "does not compile as Jinja: {m}"
            ))),
            other => invalid(other),
        },
    )?;
    compiled.check_limits().map_err(invalid)
}

/// `parameters` as PARAMETER values: numbers and strings, or lists of them (`stop`).
fn parameters(map: serde_json::Map<String, Value>) -> Result<Parameters, ApiError> {
    let mut p = Parameters::default();
    for (key, value) in map {
        let values = match value {
            Value::Array(items) => items,
            one => vec![one],
        };
        for v in values {
            let text = match v {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                other => {
                    return Err(ApiError::invalid_param(
                        "parameters",
                        format!("parameters.{key}: expected a number or a string, got {other}"),
                    ))
                }
            };
            p.set_text(&key, &text)
                .map_err(|e| ApiError::invalid_param("parameters", format!("parameters: {e}")))?;
        }
    }
    Ok(p)
}

/// `messages` as MESSAGE turns (system, user or assistant).
fn messages(list: Vec<pagoda_protocol::ollama::CreateMessage>) -> Result<Vec<Message>, ApiError> {
    list.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = Role::parse(&m.role).ok_or_else(|| {
                ApiError::invalid_param(
                    "messages",
                    format!(
                        "messages[{i}].role `{}`: use system, user or assistant",
                        m.role
                    ),
                )
            })?;
            Ok(Message {
                role,
                content: m.content,
            })
        })
        .collect()
}

fn create_error(from: &str, e: StoreError) -> ApiError {
    let message = e.to_string();
    match e {
        StoreError::FromNotStored { .. } => ApiError::model_not_found_message(format!(
            "`from` model '{}' is not in the store; pull it first (POST /api/pull) or pick one from GET /api/tags",
            from.trim()
        ))
        .with_param("from"),
        StoreError::InvalidName { .. } => ApiError::invalid_param("model", message),
        StoreError::GoTemplate => ApiError::invalid_param("template", message),
        StoreError::Modelfile(_) | StoreError::Adapter { .. } => ApiError::invalid(message),
        StoreError::Unloadable { .. } => unloadable_base("from", from, message),
        _ => ApiError::internal(format!("create failed: {message}")),
    }
}

/// 400 for a base (`from`, or copy's `source`) that is in the store but cannot be loaded: the
/// reason names files, so it goes to the log only (`detail`), as for a model that fails to load.
fn unloadable_base(field: &str, base: &str, reason: String) -> ApiError {
    ApiError::invalid_param(
        field,
        format!(
            "the model `{}` in `{field}` cannot be loaded, so nothing was written; the server's log has the reason under this response's x-request-id (the operator can `pagoda rm` it and pull it again)",
            base.trim()
        ),
    )
    .with_code("model_load_failed")
    .with_detail(reason)
}

async fn run_copy(app: &AppState, body: Body) -> Result<Response, ApiError> {
    let req: CopyRequest = crate::body::json(body, app.body_limits()).await?;
    let source = req.source.trim().to_string();
    let destination = req.destination.trim().to_string();
    for (field, value) in [("source", &source), ("destination", &destination)] {
        if value.is_empty() {
            return Err(ApiError::invalid_param(
                field,
                format!("name a model in `{field}`"),
            ));
        }
        if let Err(e) = ModelName::parse(value) {
            return Err(ApiError::invalid_param(
                field,
                format!("`{field}` must name a model in the store: {e}"),
            ));
        }
    }
    let store = app.registry.store().clone();
    let (from, to) = (source.clone(), destination.clone());
    let copied = tokio::task::spawn_blocking(move || store.copy(&from, &to))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| match e {
            StoreError::NotFound { .. } => ApiError::model_not_found(&source).with_param("source"),
            StoreError::InvalidName { .. } => ApiError::invalid_param("source", e.to_string()),
            StoreError::Unloadable { .. } => unloadable_base("source", &source, e.to_string()),
            other => ApiError::internal(format!("copy failed: {other}")),
        })?;
    if let Some(n) = &copied.name {
        app.registry.unload(&n.to_string());
    }
    Ok(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Value) -> CreateRequest {
        serde_json::from_value(v).expect("a create request")
    }

    #[test]
    fn current_fields_become_a_modelfile() {
        let mf = modelfile_of(req(serde_json::json!({
            "model": "m", "from": "base:1", "system": "Be brief.",
            "parameters": {"temperature": 0.5, "stop": ["<a>", "<b>"], "num_ctx": 64, "top_k": "3"},
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
            "license": ["MIT", "Apache"],
        })))
        .expect("valid");
        assert_eq!(mf.from, "base:1");
        assert_eq!(mf.system.as_deref(), Some("Be brief."));
        assert_eq!(mf.parameters.temperature, Some(0.5));
        assert_eq!(mf.parameters.stop, vec!["<a>", "<b>"]);
        assert_eq!(mf.parameters.num_ctx, Some(64));
        assert_eq!(mf.parameters.top_k, Some(3));
        assert_eq!(mf.messages.len(), 2);
        assert_eq!(mf.license, vec!["MIT", "Apache"]);
    }

    #[test]
    fn legacy_modelfile_text_is_parsed() {
        let mf = modelfile_of(req(serde_json::json!({
            "name": "m", "modelfile": "FROM base:1\nPARAMETER temperature 0\nSYSTEM hi\n",
        })))
        .expect("valid");
        assert_eq!(mf.parameters.temperature, Some(0.0));
        assert_eq!(mf.system.as_deref(), Some("hi"));
    }

    #[test]
    fn refusals_name_the_field() {
        for (body, param, needle) in [
            (
                serde_json::json!({"model": "m", "from": "/etc/passwd"}),
                "from",
                "never a path or URL",
            ),
            (
                serde_json::json!({"model": "m", "from": "./m.gguf"}),
                "from",
                "never a path",
            ),
            (
                serde_json::json!({"model": "m", "from": "https://h/m.gguf"}),
                "from",
                "URL",
            ),
            (
                serde_json::json!({"model": "m", "from": "hf://o/r/m.gguf"}),
                "from",
                "URL",
            ),
            (
                serde_json::json!({"model": "m", "from": "file:///etc/passwd"}),
                "from",
                "path",
            ),
            (
                serde_json::json!({"model": "m", "from": "Bad Name!"}),
                "from",
                "not a model name",
            ),
            (
                serde_json::json!({"model": "m"}),
                "from",
                "name the base model",
            ),
            (
                serde_json::json!({"model": "m", "modelfile": "FROM /etc/x.gguf\n"}),
                "from",
                "never a path",
            ),
            (
                serde_json::json!({"model": "m", "modelfile": "FROM b:1\nADAPTER ./lora\n"}),
                "modelfile",
                "ADAPTER",
            ),
            (
                serde_json::json!({"model": "m", "modelfile": "FROM b:1\nBOGUS x\n"}),
                "modelfile",
                "line 2",
            ),
            (
                serde_json::json!({"model": "m", "modelfile": "FROM b:1\n", "system": "x"}),
                "modelfile",
                "not both",
            ),
            (
                serde_json::json!({"model": "m", "from": "b:1", "quantize": "q4_K_M"}),
                "quantize",
                "quantize",
            ),
            (
                serde_json::json!({"model": "m", "from": "b:1", "files": {"a.gguf": "sha256:00"}}),
                "files",
                "files",
            ),
            (
                serde_json::json!({"model": "m", "from": "b:1", "adapters": {}}),
                "adapters",
                "adapters",
            ),
            (
                serde_json::json!({"model": "m", "from": "b:1", "parameters": {"temprature": 1}}),
                "parameters",
                "unknown parameter `temprature`",
            ),
            (
                serde_json::json!({"model": "m", "from": "b:1", "parameters": {"top_p": 3}}),
                "parameters",
                "from 0 to 1",
            ),
            (
                serde_json::json!({"model": "m", "from": "b:1", "parameters": {"stop": [true]}}),
                "parameters",
                "parameters.stop",
            ),
            (
                serde_json::json!({"model": "m", "from": "b:1", "messages": [{"role": "tool", "content": "x"}]}),
                "messages",
                "messages[0].role",
            ),
            (
                serde_json::json!({"model": "m", "from": "b:1", "template": "{{ .Prompt }}"}),
                "template",
                "Go template",
            ),
            (
                serde_json::json!({"model": "m", "from": "b:1", "template": "{% for m in messages %}"}),
                "template",
                "does not compile",
            ),
            (
                serde_json::json!({"model": "m", "from": "b:1", "template": ""}),
                "template",
                "TEMPLATE is empty",
            ),
        ] {
            let e = modelfile_of(req(body.clone())).expect_err("refused");
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert!(e.message.contains(needle), "{body}: {}", e.message);
        }
    }
}
