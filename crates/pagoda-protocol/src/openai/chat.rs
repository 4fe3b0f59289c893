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
    /// Tool calling (`tools`, `tool_choice`, `parallel_tool_calls`, and the older
    /// `functions` / `function_call`): read so the server can refuse what it cannot do yet
    /// instead of ignoring it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
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
    /// Every field not named above (`tool_calls`, `tool_call_id`, `refusal`, ...), for
    /// pagoda-runtime to check.
    #[serde(flatten)]
    pub extra: Extra,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            name: None,
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
                for p in parts {
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
    pub content: Option<String>,
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

/// What a chunk adds to the message: the role on the first chunk, then content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}
