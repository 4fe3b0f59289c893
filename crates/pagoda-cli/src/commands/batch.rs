//! `pagoda batch INPUT.jsonl -o OUTPUT.jsonl`: an offline job in the OpenAI Batch API line
//! format, run on the batching engine.
//!
//! Input lines: `{"custom_id", "method": "POST", "url": "/v1/chat/completions" |
//! "/v1/completions", "body": {...}}` (another method is a 405, another line field a 400
//! naming it; `body.model` may be left out). Output: one line per input line, in input order:
//! `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`.
//!
//! Each body is parsed into the protocol's request types and becomes a pagoda-runtime
//! [`Plan`] (the same builder per API shape `serve` uses), then goes through the runtime's
//! collection and response building, as `serve` does: the same body gives
//! the same `response.body` and, when refused, the same status and OpenAI error body.
//!
//! Invariants: a bad line never stops the job — unparsable lines get `error`, refused
//! requests a `response` with the server's status and error body; every input line has
//! exactly one output line. `--mode static` gathers a batch and waits for all of it (the classic
//! scheme, kept for comparison); `continuous` (default) lets finished requests leave and new
//! ones join at every step.

use super::progress::Progress;
use crate::commands::engine_args::{EngineArgs, RequestLimitArgs};
use crate::commands::model_loader::{load_for_generation, LoadedModel};
use anyhow::Context;
use clap::Args;
use pagoda_engine::{BatchingMode, EngineHandle, RequestStream};
use pagoda_protocol::openai::chat::ChatCompletionRequest;
use pagoda_protocol::openai::completion::CompletionRequest;
use pagoda_runtime::openai::completions::{self, PromptOutput};
use pagoda_runtime::openai::{chat, ResponseHead};
use pagoda_runtime::request::Bounds;
use pagoda_runtime::{collect_blocking, Plan};
use pagoda_server::ApiError;
use serde_json::{json, Value};
use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Arguments of `pagoda batch`.
#[derive(Debug, Args)]
pub struct BatchArgs {
    /// Requests, one OpenAI Batch API JSON object per line.
    pub input: PathBuf,
    /// Where to write the results (one line per request, in input order).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Model name or path. A body's `model` may be left out; one naming another model is
    /// refused (404), as a server without that model would.
    #[arg(long, default_value = "smollm2:135m")]
    pub model: String,
    /// continuous: requests join and leave the running batch at every step; static: gather
    /// up to --max-num-seqs requests, run them until all finish, then the next batch.
    #[arg(long, default_value = "continuous")]
    pub mode: BatchingMode,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub limits: RequestLimitArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// One input line, parsed and submitted (or refused).
enum Pending {
    Running {
        custom_id: Value,
        request: Box<Parsed>,
        stream: RequestStream,
        n: usize,
        /// The tools whose calls the output is parsed for, and how the model writes them.
        offered: (
            Option<pagoda_runtime::tools::Offered>,
            pagoda_runtime::tools::OutputFormats,
        ),
    },
    Failed {
        custom_id: Value,
        error: ApiError,
    },
    Unparsable {
        message: String,
    },
}

/// A line's body as the server would have parsed it (boxed: the bodies differ in size).
enum Parsed {
    Chat(Box<ChatCompletionRequest>),
    Completion(Box<CompletionRequest>),
}

/// What every line is checked and answered with.
struct Job<'a> {
    engine: &'a EngineHandle,
    loaded: &'a LoadedModel,
    bounds: Bounds,
    model: String,
}

/// Runs `pagoda batch`.
pub fn run(args: BatchArgs) -> anyhow::Result<()> {
    let input = std::fs::File::open(&args.input)
        .with_context(|| format!("opening {}", args.input.display()))?;
    let lines: Vec<String> = std::io::BufReader::new(input)
        .lines()
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", args.input.display()))?;
    let lines: Vec<String> = lines.into_iter().filter(|l| !l.trim().is_empty()).collect();
    let output = std::fs::File::create(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    crate::commands::threads::set_threads(args.threads)?;
    let loaded = load_for_generation(&args.model, &args.engine.load)?;
    let config = args.engine.config_with_speculation(args.mode)?;
    let policy = config.policy;
    let engine = EngineHandle::start(loaded.model.clone(), loaded.tokenizer.clone(), config)?;
    let job = Job {
        engine: &engine,
        loaded: &loaded,
        bounds: Bounds::serving(
            &loaded,
            engine.layout().max_model_len,
            args.limits.max_tokens_limit(),
            policy,
        ),
        model: args.model.clone(),
    };
    let started = Instant::now();
    let pending: Vec<Pending> = lines.iter().map(|line| job.submit_line(line)).collect();

    let bar = Progress::new("batch", "requests", pending.len());
    let mut out = BufWriter::new(output);
    let (mut tokens, mut failed) = (0usize, 0usize);
    for (i, p) in pending.into_iter().enumerate() {
        let (line, generated) = job.finish_line(i, p);
        if line["error"].is_null() && line["response"]["status_code"] == 200 {
            tokens += generated;
        } else {
            failed += 1;
        }
        writeln!(out, "{line}")?;
        bar.inc();
        bar.message(format!(
            "{:.1} tok/s",
            tokens as f64 / started.elapsed().as_secs_f64().max(1e-9)
        ));
    }
    out.flush()?;
    bar.finish();
    engine.shutdown();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{} requests ({failed} failed), {tokens} output tokens in {secs:.1} s = {:.1} tokens/s ({:?} batching) -> {}",
        lines.len(),
        tokens as f64 / secs.max(1e-9),
        args.mode,
        args.output.display()
    );
    Ok(())
}

impl Job<'_> {
    /// Parses one line and submits it.
    fn submit_line(&self, line: &str) -> Pending {
        let parsed: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                return Pending::Unparsable {
                    message: format!("line is not JSON: {e}"),
                }
            }
        };
        let custom_id = parsed.get("custom_id").cloned().unwrap_or(Value::Null);
        let fail = |error: ApiError| Pending::Failed {
            custom_id: custom_id.clone(),
            error,
        };
        if let Err(error) = check_envelope(&parsed) {
            return fail(error);
        }
        let url = parsed.get("url").and_then(Value::as_str);
        let body = match parsed.get("body").and_then(Value::as_object) {
            Some(b) => match self.with_model(b.clone()) {
                Ok(b) => b,
                Err(e) => return fail(e),
            },
            None => return fail(ApiError::invalid_param("body", "missing `body` object")),
        };
        let request = match url {
            Some("/v1/chat/completions") => {
                pagoda_server::body::parse(body.as_bytes()).map(|r| Parsed::Chat(Box::new(r)))
            }
            Some("/v1/completions") => {
                pagoda_server::body::parse(body.as_bytes()).map(|r| Parsed::Completion(Box::new(r)))
            }
            Some(other) => Err(ApiError::route_not_found(other)),
            None => Err(ApiError::invalid_param(
                "url",
                "missing `url`; use /v1/chat/completions or /v1/completions",
            )),
        };
        let submitted = request.and_then(|request| {
            let plan = self.plan(&request)?;
            let (n, offered, field) = (
                plan.n(),
                (plan.offered_tools, plan.formats),
                plan.constraint_field,
            );
            // A refused constraint names its field, as `serve` names it.
            let stream = self
                .engine
                .submit(plan.request)
                .map_err(|e| ApiError::from(e).constraint_param(field))?;
            Ok((request, stream, n, offered))
        });
        match submitted {
            Ok((request, stream, n, offered)) => Pending::Running {
                custom_id,
                request: Box::new(request),
                stream,
                n,
                offered,
            },
            Err(error) => fail(error),
        }
    }

    /// The body's text with this job's model as its `model` (which may be left out); a
    /// body naming another model is refused, as a server without it would.
    fn with_model(&self, mut body: serde_json::Map<String, Value>) -> Result<String, ApiError> {
        match body.get("model") {
            None | Some(Value::Null) => {
                body.insert("model".into(), Value::String(self.model.clone()));
            }
            Some(Value::String(m)) if m.is_empty() || *m == self.model => {}
            Some(Value::String(m)) => {
                return Err(ApiError::model_not_found_message(format!(
                    "this batch job runs model `{}`, but the line names `{m}`; run the lines of each model as their own job",
                    self.model
                )))
            }
            Some(_) => return Err(ApiError::invalid_param("model", "`model` must be a string")),
        }
        Ok(Value::Object(body).to_string())
    }

    /// The plan a body asks for, built as `serve` builds it.
    fn plan(&self, request: &Parsed) -> Result<Plan, ApiError> {
        let loaded = self.loaded;
        match request {
            Parsed::Chat(req) => {
                refuse_streaming(req.stream)?;
                Ok(chat::check(req)?.plan(loaded, &self.bounds)?)
            }
            Parsed::Completion(req) => {
                refuse_streaming(req.stream)?;
                let mut checked = completions::check(req)?;
                if checked.inputs.len() != 1 {
                    return Err(ApiError::invalid_param(
                        "prompt",
                        "a batch line takes one prompt; put each prompt on its own line",
                    ));
                }
                let input = checked.inputs.remove(0);
                Ok(checked.plan(loaded, &self.bounds, input)?.0)
            }
        }
    }

    /// Waits for one request and renders its output line; also returns its output tokens.
    fn finish_line(&self, index: usize, pending: Pending) -> (Value, usize) {
        let id = format!("batch_req_{index}");
        let request_id = format!("req_{index}");
        let response = |status: u16, body: Value| json!({"status_code": status, "request_id": request_id, "body": body});
        match pending {
            Pending::Unparsable { message } => (
                json!({"id": id, "custom_id": null, "response": null,
                       "error": {"code": "invalid_json", "message": message}}),
                0,
            ),
            Pending::Failed { custom_id, error } => (
                json!({"id": id, "custom_id": custom_id, "error": null,
                       "response": response(error.status.as_u16(), error_body(&error))}),
                0,
            ),
            Pending::Running {
                custom_id,
                request,
                stream,
                n,
                offered,
            } => match self.answer(index, &request, stream, n, offered) {
                Ok((body, tokens)) => (
                    json!({"id": id, "custom_id": custom_id, "error": null,
                           "response": response(200, body)}),
                    tokens,
                ),
                Err(error) => (
                    json!({"id": id, "custom_id": custom_id, "error": null,
                           "response": response(error.status.as_u16(), error_body(&error))}),
                    0,
                ),
            },
        }
    }

    /// The response body `serve` would have sent, and its output tokens.
    fn answer(
        &self,
        index: usize,
        request: &Parsed,
        stream: RequestStream,
        n: usize,
        offered: (
            Option<pagoda_runtime::tools::Offered>,
            pagoda_runtime::tools::OutputFormats,
        ),
    ) -> Result<(Value, usize), ApiError> {
        let choices = collect_blocking(stream, n)?;
        let tokens = choices.iter().map(|c| c.usage.completion_tokens).sum();
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let tokenizer = &self.loaded.tokenizer;
        let head = |prefix: &str| ResponseHead {
            id: format!("{prefix}-{index}"),
            model: self.model.clone(),
            created,
        };
        // Through the JSON text, as the server sends it: its f32 figures keep their
        // shortest spelling instead of widening to f64 digits.
        let body = match request {
            Parsed::Chat(req) => serde_json::to_string(&chat::response(
                head("chatcmpl"),
                choices,
                req.logprobs,
                offered.0,
                offered.1,
                tokenizer,
            )?),
            Parsed::Completion(req) => serde_json::to_string(&completions::response(
                head("cmpl"),
                vec![PromptOutput {
                    echo: String::new(),
                    choices,
                }],
                req.logprobs.is_some(),
                tokenizer,
            )?),
        }
        .and_then(|text| serde_json::from_str(&text))
        .map_err(|e| ApiError::internal(e.to_string()))?;
        Ok((body, tokens))
    }
}

/// The line around the body, as the Batch API defines it: `custom_id`, `method` (POST, the
/// only method of both routes; may be left out), `url`, `body`. Anything else is refused by
/// name rather than dropped.
fn check_envelope(line: &Value) -> Result<(), ApiError> {
    let Some(fields) = line.as_object() else {
        return Err(ApiError::invalid("a batch line must be a JSON object"));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|k| !["custom_id", "method", "url", "body"].contains(&k.as_str()))
    {
        return Err(ApiError::invalid_param(
            "line",
            format!("unknown field `{unknown}` in the batch line; a line has custom_id, method, url and body"),
        ));
    }
    match fields.get("method") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if m.eq_ignore_ascii_case("POST") => Ok(()),
        Some(_) => Err(ApiError::method_not_allowed()),
    }
}

/// An output line's error body: the server's OpenAI error JSON.
fn error_body(error: &ApiError) -> Value {
    serde_json::to_value(error.openai_body()).unwrap_or(Value::Null)
}

/// The Batch API answers whole responses; a line that asks for a stream is refused, not
/// answered as if it had not asked.
fn refuse_streaming(stream: bool) -> Result<(), ApiError> {
    if stream {
        return Err(ApiError::invalid_param(
            "stream",
            "batch lines are answered whole; send them without `stream`",
        ));
    }
    Ok(())
}
