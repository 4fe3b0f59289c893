//! The OpenAI API as Pagoda serves it: shared pieces here (usage, stop lists, the error
//! body, the model list), one module per endpoint family.
//!
//! Invariant: request types accept what the official SDKs send; fields they do not name are
//! kept in their `extra` map (never dropped unseen), which pagoda-runtime checks: a field
//! documented as accepted-and-ignored passes, anything else is refused naming it. Response
//! types serialize to what the SDKs parse.

pub mod chat;
pub mod completion;
pub mod embedding;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The fields of a request its type does not name, by name (checked by pagoda-runtime).
pub type Extra = BTreeMap<String, Value>;

/// The structured-output fields both generation endpoints take: OpenAI's `response_format`
/// and vLLM's `guided_*` and `structured_outputs`. Kept as JSON values so that
/// pagoda-runtime's checks name the exact field at fault (serde's errors name none); at most
/// one of them may constrain a request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StructuredOutput {
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    /// vLLM: a JSON schema (an object, or a string holding one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_json: Option<Value>,
    /// vLLM: a regular expression the whole output matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_regex: Option<Value>,
    /// vLLM: a list of strings, one of which is the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_choice: Option<Value>,
    /// vLLM: a grammar (Lark syntax, as llguidance reads it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_grammar: Option<Value>,
    /// vLLM's newer spelling: `{"json" | "regex" | "choice" | "grammar" | "json_object"}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_outputs: Option<Value>,
}

/// Token counts of one response (`usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

impl Usage {
    /// Usage with `total_tokens` filled in and the cached count reported.
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens }),
        }
    }
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Send one last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
    /// Every other option, for pagoda-runtime to check.
    #[serde(flatten)]
    pub extra: Extra,
}

/// Why a choice ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ContentFilter,
    ToolCalls,
}

/// The body of every error response: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: ErrorDetail,
}

/// `error` of an [`ErrorResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `rate_limit_error`, `server_error`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<String>,
}

impl ErrorResponse {
    pub fn new(kind: &str, message: impl Into<String>) -> Self {
        ErrorResponse {
            error: ErrorDetail {
                message: message.into(),
                kind: kind.to_string(),
                param: None,
                code: None,
            },
        }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.error.param = Some(param.into());
        self
    }

    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.error.code = Some(code.into());
        self
    }
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<ModelCard>,
}

impl ModelList {
    pub fn new(data: Vec<ModelCard>) -> Self {
        ModelList {
            object: "list".into(),
            data,
        }
    }
}

/// One entry of [`ModelList`] (also `GET /v1/models/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    pub owned_by: String,
    /// For a LoRA adapter: where it was loaded from (vLLM's `root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// For a LoRA adapter: its base model (vLLM's `parent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Pagoda's: what the model does, in the words of Ollama's `/api/show` — `completion`
    /// (chat and text generation) or `embedding`. Absent where the server does not say
    /// (OpenAI's own cards, other servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Vec<String>>,
}

impl ModelCard {
    pub fn new(id: impl Into<String>, created: u64) -> Self {
        ModelCard {
            id: id.into(),
            object: "model".into(),
            created,
            owned_by: "pagoda".into(),
            root: None,
            parent: None,
            capabilities: None,
        }
    }
}

/// `POST /v1/load_lora_adapter` (vLLM's API); `base_model` is Pagoda's: which loaded model
/// the adapter is for (default: the server's first model).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadLoraAdapterRequest {
    pub lora_name: String,
    pub lora_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_model: Option<String>,
}

/// `POST /v1/unload_lora_adapter` (vLLM's API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnloadLoraAdapterRequest {
    pub lora_name: String,
}

/// One alternative of a `top_logprobs` list (chat format).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    /// UTF-8 bytes of the token (it may be part of a character).
    pub bytes: Option<Vec<u8>>,
}

#[cfg(test)]
mod tests {
    use super::chat::ChatCompletionRequest;
    use super::completion::CompletionRequest;
    use serde_json::json;

    #[test]
    fn structured_fields_are_named_and_everything_else_lands_in_extra() {
        let req: ChatCompletionRequest = serde_json::from_value(json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 1,
            "max_tokens": 4,
            "response_format": {"type": "json_object"},
            "guided_regex": "a+",
            "metadata": {"k": "v"},
            "frobnicate": true,
        }))
        .expect("parses");
        assert_eq!(req.temperature, Some(1.0));
        assert_eq!(req.max_tokens, Some(4));
        assert_eq!(
            req.structured.response_format,
            Some(json!({"type": "json_object"}))
        );
        assert_eq!(req.structured.guided_regex, Some(json!("a+")));
        assert_eq!(
            req.extra.keys().collect::<Vec<_>>(),
            ["frobnicate", "metadata"]
        );
        let req: CompletionRequest = serde_json::from_value(json!({
            "model": "m", "prompt": "p", "guided_choice": ["a"], "best_of": 1, "zzz": null,
        }))
        .expect("parses");
        assert_eq!(req.structured.guided_choice, Some(json!(["a"])));
        assert_eq!(req.best_of, Some(1));
        assert!(!req.stream);
        assert_eq!(req.extra.keys().collect::<Vec<_>>(), ["zzz"]);
    }
}
