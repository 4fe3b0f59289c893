//! `POST /v1/completions` (the legacy text completion API): request, response, chunks.

use super::{Extra, FinishReason, Stop, StreamOptions, StructuredOutput, Usage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A text completion request. Every field not named here lands in `extra` (see the module
/// invariant).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// OpenAI's default is 16.
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub n: Option<usize>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// Number of most likely alternatives to return per token (0..=5 in OpenAI's API).
    pub logprobs: Option<usize>,
    /// Return the prompt before the completion.
    #[serde(default)]
    pub echo: bool,
    pub suffix: Option<String>,
    pub best_of: Option<usize>,
    pub seed: Option<u64>,
    pub user: Option<String>,
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
    /// `response_format` and vLLM's structured-output fields (as vLLM takes them here too).
    #[serde(flatten)]
    pub structured: StructuredOutput,
    /// Every field not named above (after `structured`'s), for pagoda-runtime to check.
    #[serde(flatten)]
    pub extra: Extra,
}

/// The default `max_tokens` of the completions API.
pub const DEFAULT_MAX_TOKENS: usize = 16;

/// `prompt`: text or token ids, one prompt or a batch of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// One prompt of a [`Prompt`] batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

impl Prompt {
    /// The prompts of the batch, in order (each gets `n` choices).
    pub fn into_inputs(self) -> Vec<PromptInput> {
        match self {
            Prompt::Text(s) => vec![PromptInput::Text(s)],
            Prompt::Texts(v) => v.into_iter().map(PromptInput::Text).collect(),
            Prompt::Tokens(t) => vec![PromptInput::Tokens(t)],
            Prompt::TokenLists(v) => v.into_iter().map(PromptInput::Tokens).collect(),
        }
    }
}

/// The whole (non-streamed) response; a streamed chunk has the same shape, one choice
/// increment at a time, and `usage` only on the last chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Option<Usage>,
    pub system_fingerprint: Option<String>,
}

/// One choice of a [`CompletionResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// The legacy logprobs layout: parallel lists over the tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<BTreeMap<String, f32>>>,
    pub text_offset: Vec<usize>,
}
