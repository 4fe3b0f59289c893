//! `/v1/chat/completions` bodies: the checks, the messages through the model's chat
//! template, the knobs, and the whole (non-streamed) response.

use super::{check_ranges, finish_reason, token_text, usage, Aborted, ResponseHead};
use crate::collect::{combined_usage, ChoiceOutput};
use crate::loader::LoadedModel;
use crate::request::{Knobs, RequestError};
use pagoda_engine::SampledToken;
use pagoda_model::chat_template::ChatMessage as TemplateMessage;
use pagoda_model::tokenizer::Tokenizer;
use pagoda_protocol::openai::chat::{
    AssistantMessage, ChatChoice, ChatCompletionRequest, ChatCompletionResponse, ChatLogprobs,
    ChatTokenLogprob,
};
use pagoda_protocol::openai::TopLogprob;
use serde_json::Value;

/// Everything about `req` that can be checked without the model.
pub fn check(req: &ChatCompletionRequest) -> Result<(), RequestError> {
    check_ranges(req.temperature, req.n, req.top_logprobs)?;
    if req.top_logprobs.is_some() && !req.logprobs {
        return Err(RequestError::param(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        ));
    }
    if let Some(f) = &req.response_format {
        if f.kind != "text" {
            return Err(RequestError::param(
                "response_format",
                format!(
                    "response_format `{}` is not supported yet; use text",
                    f.kind
                ),
            ));
        }
    }
    refuse_tools(req)?;
    template_messages(req).map(drop)
}

/// The prompt's token ids: the messages (with the model's default system message and
/// Modelfile MESSAGE turns) through its chat template.
pub fn prompt(loaded: &LoadedModel, req: &ChatCompletionRequest) -> Result<Vec<u32>, RequestError> {
    let messages = template_messages(req)?;
    loaded
        .encode_chat(&loaded.with_preset(messages))
        .map_err(|e| {
            RequestError::param("messages", format!("cannot apply the chat template: {e}"))
        })
}

/// The request's knobs, with the model's Modelfile stop strings in front of its own.
pub fn knobs(loaded: &LoadedModel, req: &ChatCompletionRequest) -> Knobs {
    Knobs {
        logprobs: req.logprobs.then_some(req.top_logprobs.unwrap_or(0)),
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        ..shared_knobs!(loaded, req)
    }
}

/// The whole response for collected `choices`.
pub fn response(
    head: ResponseHead,
    choices: Vec<ChoiceOutput>,
    with_logprobs: bool,
    tokenizer: &Tokenizer,
) -> Result<ChatCompletionResponse, Aborted> {
    let total = usage(combined_usage(choices.iter().map(|c| c.usage)));
    let choices = choices
        .into_iter()
        .enumerate()
        .map(|(index, c)| {
            Ok(ChatChoice {
                index,
                message: AssistantMessage {
                    role: "assistant".into(),
                    content: Some(c.text),
                },
                logprobs: with_logprobs.then(|| ChatLogprobs {
                    content: c
                        .logprobs
                        .iter()
                        .map(|lp| logprob_entry(tokenizer, lp))
                        .collect(),
                }),
                finish_reason: Some(finish_reason(c.finish).ok_or(Aborted)?),
            })
        })
        .collect::<Result<Vec<_>, Aborted>>()?;
    Ok(ChatCompletionResponse {
        id: head.id,
        object: "chat.completion".into(),
        created: head.created,
        model: head.model,
        choices,
        usage: total,
        system_fingerprint: None,
    })
}

/// One token's entry in `logprobs.content`.
pub fn logprob_entry(tokenizer: &Tokenizer, lp: &SampledToken) -> ChatTokenLogprob {
    let token = token_text(tokenizer, lp.token);
    ChatTokenLogprob {
        bytes: Some(token.as_bytes().to_vec()),
        token,
        logprob: lp.logprob.unwrap_or(f32::NEG_INFINITY),
        top_logprobs: lp
            .top_logprobs
            .iter()
            .map(|t| {
                let token = token_text(tokenizer, t.token);
                TopLogprob {
                    bytes: Some(token.as_bytes().to_vec()),
                    token,
                    logprob: t.logprob,
                }
            })
            .collect(),
    }
}

/// The request's messages as the chat template takes them.
fn template_messages(req: &ChatCompletionRequest) -> Result<Vec<TemplateMessage>, RequestError> {
    if req.messages.is_empty() {
        return Err(RequestError::param(
            "messages",
            "messages must not be empty",
        ));
    }
    req.messages
        .iter()
        .map(|m| {
            let role = match m.role.as_str() {
                "developer" => "system",
                r @ ("system" | "user" | "assistant" | "tool") => r,
                other => {
                    return Err(RequestError::param(
                        "messages",
                        format!("unknown role `{other}`; use system, user, assistant or tool"),
                    ))
                }
            };
            let text = m.text().map_err(|e| RequestError::param("messages", e))?;
            Ok(TemplateMessage::new(role, text))
        })
        .collect()
}

/// Tool calling is not implemented yet: a request that asks for it is refused with the field
/// named, never answered as if the tools were not there. A `tool_choice` of `"none"` (or
/// `"auto"` with no tools) asks for nothing and passes.
fn refuse_tools(req: &ChatCompletionRequest) -> Result<(), RequestError> {
    let asks = |v: &Option<Value>| match v {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    };
    for (field, value) in [("tools", &req.tools), ("functions", &req.functions)] {
        if asks(value) {
            return Err(RequestError::param(
                field,
                format!("`{field}` (tool calling) is not supported by this server yet; send the request without it"),
            ));
        }
    }
    for (field, value) in [
        ("tool_choice", &req.tool_choice),
        ("function_call", &req.function_call),
    ] {
        match value.as_ref().and_then(Value::as_str) {
            None if value.as_ref().is_none_or(Value::is_null) => {}
            Some("none" | "auto") => {}
            _ => {
                return Err(RequestError::param(
                    field,
                    format!(
                        "`{field}` asks for a tool call, which this server does not support yet"
                    ),
                ))
            }
        }
    }
    Ok(())
}
