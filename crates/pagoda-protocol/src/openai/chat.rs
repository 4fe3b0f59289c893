//! `POST /v1/chat/completions`: the request, the whole response, and the stream chunks.

use super::{Extra, FinishReason, Stop, StreamOptions, StructuredOutput, TopLogprob, Usage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A chat completion request. Sampling fields beyond OpenAI's (`top_k`, `min_p`,
/// `repetition_penalty`, `ignore_eos`) are the ones vLLM accepts. Every other field lands in
/// `extra` (see the module invariant).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub n: Option<usize>,
    pub stop: Option<Stop>,
    /// Deprecated by OpenAI in favour of `max_completion_tokens`; both are accepted.
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string) to bias in [-100, 100].
    pub logit_bias: Option<BTreeMap<String, f32>>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<usize>,
    pub seed: Option<u64>,
    pub user: Option<String>,
    /// `response_format` and vLLM's structured-output fields.
    #[serde(flatten)]
    pub structured: StructuredOutput,
    /// Functions the model may call. Shapes only here; names, parameters and duplicates are
    /// checked by the runtime (so a 400 can name `tools[i].function.name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool>>,
    /// `"auto"`, `"none"`, `"required"` or `{"type": "function", "function": {"name"}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// The deprecated `functions` / `function_call`: read so the server can refuse them by
    /// name instead of ignoring them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub functions: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<serde_json::Value>,
    #[serde(default)]
    pub ignore_eos: bool,
    /// Pagoda extension: `false` turns speculative decoding off for this request (it is on
    /// when the server was started with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculative: Option<bool>,
    /// vLLM's extension: scheduling priority under `--policy priority`, lower runs earlier
    /// (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Every field not named above (after `structured`'s), for pagoda-runtime to check.
    #[serde(flatten)]
    pub extra: Extra,
}

/// One entry of `tools`: `{"type": "function", "function": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionDefinition>,
    /// Every other key, for pagoda-runtime to refuse by name.
    #[serde(flatten)]
    pub extra: Extra,
}

fn function_kind() -> String {
    "function".into()
}

/// A function the model may call: its name, what it does, and a JSON Schema of its
/// arguments (an object schema; absent means no arguments).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionDefinition {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
    /// Every other key, for pagoda-runtime to refuse by name.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `tool_choice`: a mode (`"auto"`, `"none"`, `"required"`) or one named function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedToolChoice),
}

/// `{"type": "function", "function": {"name": "..."}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedToolChoice {
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionName,
}

/// `{"name": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionName {
    pub name: String,
}

/// One call the assistant made: in a response's `message.tool_calls`, and in the history a
/// client sends back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default)]
    pub id: String,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

/// The function and its arguments, a JSON text (OpenAI sends a string, not an object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: String,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, or a list of content parts of which the text parts are used. May be null on
    /// an assistant message that only called tools.
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The calls an assistant message made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// On a `tool` message: which call this is the result of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On an assistant message: its reasoning, as a response gave it (vLLM's and DeepSeek's
    /// `reasoning_content`); templates that read it (Qwen3's, Gemma 4's) get it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Every field not named above (`refusal`, `annotations`, ...), for pagoda-runtime to
    /// check.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
            extra: Extra::new(),
        }
    }

    /// The text of the message: a string as is, text parts joined with newlines.
    pub fn text(&self) -> Result<String, String> {
        match &self.content {
            None => Ok(String::new()),
            Some(MessageContent::Text(s)) => Ok(s.clone()),
            Some(MessageContent::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for (j, p) in parts.iter().enumerate() {
                    // `cache_control` is a prompt-caching hint; Pagoda caches every prefix.
                    if let Some(k) = p
                        .extra
                        .iter()
                        .find(|(k, v)| *k != "cache_control" && !v.is_null())
                        .map(|(k, _)| k)
                    {
                        return Err(format!(
                            "content part {j} has a field `{k}` this server does not implement"
                        ));
                    }
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => texts.push(t.as_str()),
                        ("text", None) => return Err("a text content part has no `text`".into()),
                        (other, _) => {
                            return Err(format!(
                                "content parts of type `{other}` are not supported; send text"
                            ))
                        }
                    }
                }
                Ok(texts.join("\n"))
            }
        }
    }
}

/// `content` of a [`ChatMessage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One element of a content list (`{"type": "text", "text": "..."}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    /// Every other key of the part (`cache_control`, ...), checked by [`ChatMessage::text`].
    #[serde(flatten)]
    pub extra: Extra,
}

/// The whole (non-streamed) response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub system_fingerprint: Option<String>,
}

/// One choice of a [`ChatCompletionResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// The generated message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantMessage {
    pub role: String,
    /// The text outside tool calls and reasoning; `null` when the message is only calls.
    pub content: Option<String>,
    /// The model's reasoning, split from its answer (vLLM's and DeepSeek's field); absent
    /// when it wrote none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// `logprobs` of a choice or chunk: one entry per generated token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

/// One generated token's log-probability and its alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// One `data:` event of a streamed response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    /// Only on the last chunk, when `stream_options.include_usage` (then `choices` is empty);
    /// `null` on the others, as OpenAI sends it.
    pub usage: Option<Usage>,
    pub system_fingerprint: Option<String>,
}

/// One choice's increment in a [`ChatCompletionChunk`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// What a chunk adds to the message: the role on the first chunk, then content or tool
/// call pieces.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A piece of the model's reasoning ([`AssistantMessage::reasoning_content`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A piece of one tool call in a stream, as OpenAI sends it: the first piece of a call has
/// `index`, `id`, `type`, `function.name` and `function.arguments: ""`; later pieces only
/// `index` and an `arguments` piece. Clients concatenate the pieces per `index`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCallDelta>,
}

/// `function` of a [`ToolCallDelta`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}
