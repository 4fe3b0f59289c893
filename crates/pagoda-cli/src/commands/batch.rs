//! `pagoda batch INPUT.jsonl -o OUTPUT.jsonl`: an offline job in the OpenAI Batch API line
//! format, run on the batching engine.
//!
//! Input lines: `{"custom_id", "method": "POST", "url": "/v1/chat/completions" |
//! "/v1/completions", "body": {...}}`. Output: one line per input line, in input order:
//! `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`.
//!
//! Invariants: a bad line never stops the job — unparsable lines get `error`, requests the
//! engine refuses get a 400 `response` with an OpenAI error body; every input line has exactly
//! one output line. `--mode static` gathers a batch and waits for all of it (the classic
//! scheme, kept for comparison); `continuous` (default) lets finished requests leave and new
//! ones join at every step.

use crate::commands::engine_args::EngineArgs;
use crate::commands::model_loader::{load_for_generation, LoadedModel};
use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pagoda_engine::{
    BatchingMode, EngineHandle, EngineRequest, FinishReason, RequestStream, SamplingParams,
    TokenEvent,
};
use pagoda_model::chat_template::ChatMessage;
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
    /// Model name or path (the `model` field of each body is informational).
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
    pub engine: EngineArgs,
}

/// One input line, parsed and submitted (or refused).
enum Pending {
    Running {
        custom_id: Value,
        kind: Endpoint,
        stream: RequestStream,
        n: usize,
    },
    Failed {
        custom_id: Value,
        status: u16,
        message: String,
    },
    Unparsable {
        message: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
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
    let engine = EngineHandle::start(
        loaded.model.clone(),
        loaded.tokenizer.clone(),
        args.engine.config_with_speculation(args.mode)?,
    )?;
    let model_name = args.model.clone();
    let started = Instant::now();
    let pending: Vec<Pending> = lines
        .iter()
        .map(|line| submit_line(&engine, &loaded, line))
        .collect();

    let bar = ProgressBar::new(pending.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} requests {msg} [{elapsed} < {eta}]")
            .expect("static template"),
    );
    let mut out = BufWriter::new(output);
    let (mut tokens, mut failed) = (0usize, 0usize);
    for (i, p) in pending.into_iter().enumerate() {
        let (line, generated) = finish_line(i, p, &model_name);
        if line["error"].is_null() && line["response"]["status_code"] == 200 {
            tokens += generated;
        } else {
            failed += 1;
        }
        writeln!(out, "{line}")?;
        bar.inc(1);
        bar.set_message(format!(
            "{:.1} tok/s",
            tokens as f64 / started.elapsed().as_secs_f64().max(1e-9)
        ));
    }
    out.flush()?;
    bar.finish_and_clear();
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

/// Parses one line and submits it.
fn submit_line(engine: &EngineHandle, loaded: &LoadedModel, line: &str) -> Pending {
    let parsed: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            return Pending::Unparsable {
                message: format!("line is not JSON: {e}"),
            }
        }
    };
    let custom_id = parsed.get("custom_id").cloned().unwrap_or(Value::Null);
    let fail = |status: u16, message: String| Pending::Failed {
        custom_id: custom_id.clone(),
        status,
        message,
    };
    let kind = match parsed.get("url").and_then(Value::as_str) {
        Some("/v1/chat/completions") => Endpoint::Chat,
        Some("/v1/completions") => Endpoint::Completion,
        Some(other) => {
            return fail(
                404,
                format!("unknown url `{other}`; use /v1/chat/completions or /v1/completions"),
            )
        }
        None => return fail(400, "missing `url`".into()),
    };
    let Some(body) = parsed.get("body").filter(|b| b.is_object()) else {
        return fail(400, "missing `body` object".into());
    };
    match build_request(loaded, kind, body) {
        Ok(req) => {
            let n = req.n;
            match engine.submit(req) {
                Ok(stream) => Pending::Running {
                    custom_id,
                    kind,
                    stream,
                    n,
                },
                Err(e) => fail(400, e.to_string()),
            }
        }
        Err(message) => fail(400, message),
    }
}

/// The engine request an OpenAI body asks for (defaults from the model, as `run` applies).
fn build_request(
    loaded: &LoadedModel,
    kind: Endpoint,
    body: &Value,
) -> Result<EngineRequest, String> {
    let prompt = match kind {
        Endpoint::Chat => {
            let messages = parse_messages(body.get("messages"))?;
            let mut all = Vec::new();
            if !messages.iter().any(|m| m.role == "system") {
                if let Some(system) = &loaded.default_system {
                    all.push(ChatMessage::new("system", system));
                }
            }
            all.extend(messages);
            loaded.encode_chat(&all).map_err(|e| format!("{e:#}"))?
        }
        Endpoint::Completion => match body.get("prompt") {
            Some(Value::String(s)) => loaded
                .tokenizer
                .encode(s, true)
                .map_err(|e| e.to_string())?,
            Some(Value::Array(ids)) if ids.iter().all(Value::is_u64) => ids
                .iter()
                .filter_map(Value::as_u64)
                .map(|t| u32::try_from(t).map_err(|_| format!("token id {t} out of range")))
                .collect::<Result<_, _>>()?,
            _ => return Err("`prompt` must be a string or an array of token ids".into()),
        },
    };
    let mut sampling: SamplingParams = loaded.default_sampling.clone();
    let f = |k: &str| body.get(k).and_then(Value::as_f64).map(|v| v as f32);
    let u = |k: &str| body.get(k).and_then(Value::as_u64);
    if let Some(v) = f("temperature") {
        sampling.temperature = v;
    }
    if let Some(v) = f("top_p") {
        sampling.top_p = v;
    }
    if let Some(v) = u("top_k") {
        sampling.top_k = v as usize;
    }
    if let Some(v) = f("min_p") {
        sampling.min_p = v;
    }
    if let Some(v) = f("repetition_penalty") {
        sampling.repetition_penalty = v;
    }
    if let Some(v) = f("presence_penalty") {
        sampling.presence_penalty = v;
    }
    if let Some(v) = f("frequency_penalty") {
        sampling.frequency_penalty = v;
    }
    sampling.seed = u("seed");
    let context = loaded.model.config().context_length;
    let max_tokens = u("max_completion_tokens")
        .or_else(|| u("max_tokens"))
        .map_or(context.saturating_sub(prompt.len()).max(1), |v| v as usize);
    let mut req = EngineRequest::new(prompt, sampling, max_tokens);
    req.stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_string)
                    .ok_or("`stop` entries must be strings")
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("`stop` must be a string or an array of strings".into()),
    };
    req.n = u("n").map_or(1, |n| n as usize);
    req.ignore_eos = body
        .get("ignore_eos")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    req.priority = body.get("priority").and_then(Value::as_i64).unwrap_or(0) as i32;
    Ok(req)
}

/// `messages`: `[{role, content}]`, content a string or an array of `{"type": "text"}` parts.
fn parse_messages(messages: Option<&Value>) -> Result<Vec<ChatMessage>, String> {
    let Some(Value::Array(list)) = messages else {
        return Err("`messages` must be an array".into());
    };
    if list.is_empty() {
        return Err("`messages` is empty".into());
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or(format!("messages[{i}] has no `role`"))?;
            let content = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(""),
                None | Some(Value::Null) => String::new(),
                Some(_) => return Err(format!("messages[{i}].content must be a string or parts")),
            };
            Ok(ChatMessage::new(role, &content))
        })
        .collect()
}

/// Waits for one request and renders its output line; also returns its output tokens.
fn finish_line(index: usize, pending: Pending, model: &str) -> (Value, usize) {
    let id = format!("batch_req_{index}");
    match pending {
        Pending::Unparsable { message } => (
            json!({"id": id, "custom_id": null, "response": null,
                   "error": {"code": "invalid_json", "message": message}}),
            0,
        ),
        Pending::Failed {
            custom_id,
            status,
            message,
        } => (
            json!({"id": id, "custom_id": custom_id, "error": null, "response": {
                "status_code": status, "request_id": format!("req_{index}"),
                "body": {"error": {"message": message, "type": "invalid_request_error",
                                   "param": null, "code": null}}}}),
            0,
        ),
        Pending::Running {
            custom_id,
            kind,
            stream,
            n,
        } => {
            let mut texts = vec![String::new(); n];
            let mut reasons = vec![FinishReason::Abort; n];
            let (mut prompt_tokens, mut cached, mut completion) = (0, 0, 0);
            let mut error = None;
            for ev in stream {
                match ev {
                    TokenEvent::Token { index, text, .. } => texts[index].push_str(&text),
                    TokenEvent::Finished {
                        index,
                        reason,
                        text,
                        usage,
                        ..
                    } => {
                        texts[index].push_str(&text);
                        reasons[index] = reason;
                        prompt_tokens = usage.prompt_tokens;
                        cached = usage.cached_prompt_tokens;
                        completion += usage.completion_tokens;
                    }
                    TokenEvent::Error { message } => error = Some(message),
                }
            }
            if let Some(message) = error {
                return (
                    json!({"id": id, "custom_id": custom_id, "error": null, "response": {
                        "status_code": 500, "request_id": format!("req_{index}"),
                        "body": {"error": {"message": message, "type": "server_error",
                                           "param": null, "code": null}}}}),
                    0,
                );
            }
            let choices: Vec<Value> = texts
                .into_iter()
                .zip(reasons)
                .enumerate()
                .map(|(i, (text, reason))| match kind {
                    Endpoint::Chat => json!({"index": i, "logprobs": null,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": reason.as_str()}),
                    Endpoint::Completion => json!({"index": i, "logprobs": null,
                        "text": text, "finish_reason": reason.as_str()}),
                })
                .collect();
            let created = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let (object, prefix) = match kind {
                Endpoint::Chat => ("chat.completion", "chatcmpl"),
                Endpoint::Completion => ("text_completion", "cmpl"),
            };
            let body = json!({
                "id": format!("{prefix}-{index}"), "object": object, "created": created,
                "model": model, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                          "total_tokens": prompt_tokens + completion,
                          "prompt_tokens_details": {"cached_tokens": cached}}});
            (
                json!({"id": id, "custom_id": custom_id, "error": null, "response": {
                    "status_code": 200, "request_id": format!("req_{index}"), "body": body}}),
                completion,
            )
        }
    }
}
