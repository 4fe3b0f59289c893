//! The Ollama API (`/api/...`) as Pagoda serves it: requests, NDJSON stream objects, model
//! listings, and the `options` map with Ollama's names.
//!
//! Invariants: `stream` defaults to true (Ollama's default); durations are nanoseconds;
//! timestamps are RFC 3339 strings; the error body is `{"error": "..."}`. The requests that
//! write to the store ([`CreateRequest`], [`CopyRequest`]) refuse unknown fields (serde's
//! error names the field), so nothing a client asks of them is dropped unseen. The
//! generation requests ([`GenerateRequest`], [`ChatRequest`], their [`Options`]) keep the
//! fields they do not name in an `extra` map, which the server checks with pagoda-runtime's
//! field rules (documented accepted-and-ignored fields pass, anything else is a 400 naming
//! it). The others accept and ignore unknown fields, as Ollama does.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// `options`: the model parameters of a request, as Ollama names them. The keys named here
/// are implemented; every other key lands in `extra`, where the server accepts the ones
/// that only size Ollama's runner (`num_ctx`, `num_gpu`, ...; Pagoda's comes from its flags)
/// and refuses the rest, naming them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Options {
    pub num_predict: Option<i64>,
    pub temperature: Option<f32>,
    pub top_k: Option<i64>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    /// One string or a list (Ollama takes both).
    pub stop: Option<crate::openai::Stop>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Every other key, checked by the server.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `keep_alive`: a duration string (`"5m"`, `"1h30m"`, `"0"`), or a number of seconds;
/// negative keeps the model loaded forever.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum KeepAlive {
    Seconds(f64),
    Text(String),
}

/// Why a [`KeepAlive`] could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid keep_alive `{0}`; use a duration such as \"5m\", \"30s\", \"1h\", 0 or -1")]
pub struct KeepAliveError(pub String);

impl KeepAlive {
    /// The duration, or `None` for "forever" (negative values).
    pub fn duration(&self) -> Result<Option<std::time::Duration>, KeepAliveError> {
        let secs = match self {
            KeepAlive::Seconds(s) => *s,
            KeepAlive::Text(t) => parse_go_duration(t).ok_or_else(|| KeepAliveError(t.clone()))?,
        };
        if !secs.is_finite() {
            return Err(KeepAliveError(format!("{secs}")));
        }
        if secs < 0.0 {
            return Ok(None);
        }
        Ok(Some(std::time::Duration::from_secs_f64(secs.min(1e12))))
    }
}

/// Seconds of a Go-style duration (`"1h2m3.5s"`, `"300ms"`, `"-1"`, `"10"` = seconds).
fn parse_go_duration(text: &str) -> Option<f64> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return Some(secs);
    }
    let (sign, mut rest) = match t.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, t),
    };
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    Some(sign * total)
}

fn default_true() -> bool {
    true
}

/// `POST /api/generate`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    pub model: String,
    #[serde(default)]
    pub prompt: String,
    pub suffix: Option<String>,
    pub system: Option<String>,
    /// A Go template overriding the model's; Pagoda accepts only `{{ .Prompt }}`-style
    /// templates through `raw` (see the server).
    pub template: Option<String>,
    /// The `context` of an earlier response, to continue from (token ids).
    pub context: Option<Vec<u32>>,
    #[serde(default = "default_true")]
    pub stream: bool,
    /// Send the prompt as is, without the chat template.
    #[serde(default)]
    pub raw: bool,
    /// `"json"` or a JSON schema.
    pub format: Option<Value>,
    pub images: Option<Vec<String>>,
    pub options: Option<Options>,
    pub keep_alive: Option<KeepAlive>,
    /// Pagoda extension (vLLM's meaning): scheduling priority under `--policy priority`,
    /// lower runs earlier (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Every field not named above, checked by the server.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// One object of the `/api/generate` stream (the last one has `done: true` and the counts).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerateResponse {
    pub model: String,
    pub created_at: String,
    pub response: String,
    /// The model's reasoning, split from `response`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    pub done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Vec<u32>>,
    #[serde(flatten)]
    pub stats: Option<FinalStats>,
}

/// The counts and durations (nanoseconds) on the last object of a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalStats {
    pub total_duration: u64,
    pub load_duration: u64,
    pub prompt_eval_count: usize,
    pub prompt_eval_duration: u64,
    pub eval_count: usize,
    pub eval_duration: u64,
}

/// One message of `/api/chat`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<String>>,
    /// The calls an assistant message made (in responses, and in the history sent back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// On a `tool` message: the function whose result this is (newer Ollama clients).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// An assistant message's reasoning, split from its content (in responses, and in the
    /// history sent back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// Every other field (older clients' `name`, ...), for the server to check.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// One call in `message.tool_calls`: `{"function": {"name", "arguments": {object}}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub function: ToolCallFunction,
}

/// `function` of a [`ToolCall`]; `arguments` is a JSON object, not a string as in OpenAI's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallFunction {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

/// `POST /api/chat`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    #[serde(default)]
    pub messages: Vec<Message>,
    #[serde(default = "default_true")]
    pub stream: bool,
    pub format: Option<Value>,
    pub options: Option<Options>,
    pub keep_alive: Option<KeepAlive>,
    /// OpenAI's tool shape (`{"type": "function", "function": {...}}`).
    pub tools: Option<Vec<crate::openai::chat::Tool>>,
    /// Pagoda extension (vLLM's meaning): scheduling priority under `--policy priority`,
    /// lower runs earlier (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Every field not named above, checked by the server.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// One object of the `/api/chat` stream.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    pub model: String,
    pub created_at: String,
    pub message: Message,
    pub done: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_reason: Option<String>,
    #[serde(flatten)]
    pub stats: Option<FinalStats>,
}

/// `details` of a model in listings and `/api/show`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDetails {
    pub parent_model: String,
    pub format: String,
    pub family: String,
    pub families: Option<Vec<String>>,
    pub parameter_size: String,
    pub quantization_level: String,
}

/// One model of `GET /api/tags`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedModel {
    pub name: String,
    pub model: String,
    pub modified_at: String,
    pub size: u64,
    pub digest: String,
    pub details: ModelDetails,
}

/// `GET /api/tags`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagsResponse {
    pub models: Vec<ListedModel>,
}

/// One loaded model of `GET /api/ps`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningModel {
    pub name: String,
    pub model: String,
    pub size: u64,
    pub digest: String,
    pub details: ModelDetails,
    /// When it will be unloaded if idle (RFC 3339).
    pub expires_at: String,
    pub size_vram: u64,
}

/// `GET /api/ps`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PsResponse {
    pub models: Vec<RunningModel>,
}

/// `POST /api/show` (`model`, or the older `name`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShowRequest {
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub verbose: bool,
}

impl ShowRequest {
    /// The model named, by either field.
    pub fn model_name(&self) -> &str {
        if self.model.is_empty() {
            &self.name
        } else {
            &self.model
        }
    }
}

/// `POST /api/show` response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShowResponse {
    pub modelfile: String,
    pub parameters: String,
    pub template: String,
    pub details: ModelDetails,
    pub model_info: serde_json::Map<String, Value>,
    pub capabilities: Vec<String>,
    pub modified_at: String,
}

/// `POST /api/pull` (and `/api/delete`, which takes the same name fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequest {
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub insecure: bool,
    #[serde(default = "default_true")]
    pub stream: bool,
}

impl PullRequest {
    /// The model named, by either field.
    pub fn model_name(&self) -> &str {
        if self.model.is_empty() {
            &self.name
        } else {
            &self.model
        }
    }
}

/// `POST /api/create`, in the current shape (`model`, `from`, `system`, `template`,
/// `parameters`, `messages`, `license`, as the official clients send it) or the legacy one
/// (`name` or `model`, and `modelfile` text). `quantize`, `files` and `adapters` are read so
/// the server can refuse them by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    #[serde(default)]
    pub model: String,
    /// The legacy name field.
    #[serde(default)]
    pub name: String,
    /// The base model.
    pub from: Option<String>,
    /// Legacy: the whole Modelfile as text.
    pub modelfile: Option<String>,
    pub system: Option<String>,
    pub template: Option<String>,
    /// PARAMETER values by name (`stop` may be a list).
    pub parameters: Option<serde_json::Map<String, Value>>,
    pub messages: Option<Vec<CreateMessage>>,
    pub license: Option<License>,
    pub quantize: Option<Value>,
    /// File name → blob digest (uploaded with `/api/blobs`).
    pub files: Option<Value>,
    /// Adapter file name → blob digest.
    pub adapters: Option<Value>,
    #[serde(default = "default_true")]
    pub stream: bool,
}

impl CreateRequest {
    /// The model to create, by either field.
    pub fn model_name(&self) -> &str {
        if self.model.is_empty() {
            &self.name
        } else {
            &self.model
        }
    }
}

/// One of the `messages` of a [`CreateRequest`]: a turn put in front of every chat.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateMessage {
    pub role: String,
    #[serde(default)]
    pub content: String,
}

/// `license`: one text or several.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum License {
    One(String),
    Many(Vec<String>),
}

impl License {
    /// The texts, in order.
    pub fn into_texts(self) -> Vec<String> {
        match self {
            License::One(t) => vec![t],
            License::Many(v) => v,
        }
    }
}

/// `POST /api/copy`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyRequest {
    pub source: String,
    pub destination: String,
}

/// `POST /api/rollback` (Pagoda's own route): point `model` back to a kept version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    pub model: String,
    /// The version to restore: a digest or its first hex digits (`sha256:` optional), as
    /// `pagoda list --all` shows them; absent: the version before the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// The answer to a rollback.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollbackResponse {
    /// `success`.
    pub status: String,
    /// The model's store name (`name:tag`).
    pub model: String,
    /// The version that was current before (now kept), `sha256:<hex>`.
    pub from: String,
    /// The version that is current now.
    pub to: String,
}

/// One object of the `/api/pull` stream (and of `/api/create`'s).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressResponse {
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<u64>,
}

/// `POST /api/embed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedRequest {
    pub model: String,
    pub input: EmbedInput,
    pub truncate: Option<bool>,
    pub options: Option<Options>,
    pub keep_alive: Option<KeepAlive>,
}

/// `input` of an [`EmbedRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbedInput {
    One(String),
    Many(Vec<String>),
}

/// `POST /api/embed` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedResponse {
    pub model: String,
    pub embeddings: Vec<Vec<f32>>,
    pub total_duration: u64,
    pub load_duration: u64,
    pub prompt_eval_count: usize,
}

/// `GET /api/version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionResponse {
    pub version: String,
}

/// Every Ollama error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn keep_alive_reads_go_durations_numbers_and_forever() {
        let d = |v: Value| {
            serde_json::from_value::<KeepAlive>(v)
                .expect("parses")
                .duration()
        };
        assert_eq!(
            d(Value::from("5m")).expect("ok"),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            d(Value::from("1h30m")).expect("ok"),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(
            d(Value::from("250ms")).expect("ok"),
            Some(Duration::from_millis(250))
        );
        assert_eq!(d(Value::from(0)).expect("ok"), Some(Duration::ZERO));
        assert_eq!(d(Value::from("0")).expect("ok"), Some(Duration::ZERO));
        assert_eq!(d(Value::from(-1)).expect("ok"), None);
        assert_eq!(d(Value::from("-1m")).expect("ok"), None);
        assert!(d(Value::from("soon")).is_err());
        assert!(d(Value::from("5x")).is_err());
        assert!(d(Value::from("-")).is_err());
    }

    #[test]
    fn create_and_copy_read_what_the_clients_send_and_refuse_the_rest() {
        let req: CreateRequest = serde_json::from_str(
            r#"{"model":"m","from":"b:1","system":"s","parameters":{"temperature":0.2,"stop":["x"]},
               "messages":[{"role":"user","content":"hi"}],"license":"MIT","stream":false}"#,
        )
        .expect("parses");
        assert_eq!(req.model_name(), "m");
        assert_eq!(req.from.as_deref(), Some("b:1"));
        assert_eq!(
            req.license.clone().map(License::into_texts),
            Some(vec!["MIT".into()])
        );
        assert!(!req.stream);
        let legacy: CreateRequest =
            serde_json::from_str(r#"{"name":"m","modelfile":"FROM b:1\n"}"#).expect("parses");
        assert_eq!(legacy.model_name(), "m");
        assert!(legacy.stream);
        for (body, field) in [
            (r#"{"model":"m","path":"/etc/Modelfile"}"#, "path"),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x","images":[]}]}"#,
                "images",
            ),
        ] {
            let e = serde_json::from_str::<CreateRequest>(body)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("unknown field `{field}`")), "{e}");
        }
        let copy: CopyRequest =
            serde_json::from_str(r#"{"source":"a","destination":"b"}"#).expect("parses");
        assert_eq!(
            (copy.source.as_str(), copy.destination.as_str()),
            ("a", "b")
        );
        assert!(serde_json::from_str::<CopyRequest>(r#"{"source":"a"}"#).is_err());
        assert!(
            serde_json::from_str::<CopyRequest>(r#"{"source":"a","destination":"b","x":1}"#)
                .is_err()
        );
    }

    #[test]
    fn stream_defaults_to_true_and_stats_flatten_on_the_last_object() {
        let req: GenerateRequest =
            serde_json::from_str(r#"{"model":"m","prompt":"hi"}"#).expect("parses");
        assert!(req.stream);
        let last = GenerateResponse {
            model: "m".into(),
            done: true,
            stats: Some(FinalStats {
                eval_count: 3,
                ..FinalStats::default()
            }),
            ..GenerateResponse::default()
        };
        let v = serde_json::to_value(&last).expect("serializes");
        assert_eq!(v["eval_count"], 3);
        assert!(v.get("stats").is_none());
        let mid = GenerateResponse::default();
        let v = serde_json::to_value(&mid).expect("serializes");
        assert!(v.get("eval_count").is_none());
    }

    #[test]
    fn generation_requests_keep_the_fields_they_do_not_name() {
        let g: GenerateRequest = serde_json::from_value(serde_json::json!({
            "model": "m", "prompt": "p", "format": "json", "think": false,
            "options": {"num_predict": 3, "stop": "\n", "num_gpu": 1}
        }))
        .expect("parses");
        assert_eq!(g.format, Some(Value::from("json")));
        assert_eq!(g.extra.keys().collect::<Vec<_>>(), ["think"]);
        let o = g.options.expect("options");
        assert_eq!(o.num_predict, Some(3));
        assert_eq!(
            o.stop.map(crate::openai::Stop::into_vec),
            Some(vec!["\n".to_string()])
        );
        assert_eq!(o.extra.keys().collect::<Vec<_>>(), ["num_gpu"]);
        let c: ChatRequest =
            serde_json::from_value(serde_json::json!({"model": "m", "messages": [], "x": 1}))
                .expect("parses");
        assert_eq!(c.extra.keys().collect::<Vec<_>>(), ["x"]);
        assert!(c.stream, "flattening keeps the defaults");
    }
}
