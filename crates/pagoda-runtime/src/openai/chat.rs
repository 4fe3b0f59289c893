//! `/v1/chat/completions` bodies: the checks, the messages through the model's chat
//! template, the knobs, and the whole (non-streamed) response.

use super::{check_ranges, finish_reason, token_text, usage, Aborted, ResponseHead};
use crate::collect::{combined_usage, ChoiceOutput};
use crate::fields::{check_extra, Endpoint};
use crate::loader::LoadedModel;
use crate::request::{Knobs, RequestError};
use crate::structured::openai_constraint;
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
    check_extra(Endpoint::OpenAiChat, &req.extra)?;
    openai_constraint(&req.structured)?;
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

/// The request's knobs, with the model's Modelfile stop strings in front of its own and the
/// structured-output constraint (an error only for a request [`check`] refuses).
pub fn knobs(loaded: &LoadedModel, req: &ChatCompletionRequest) -> Result<Knobs, RequestError> {
    Ok(Knobs {
        logprobs: req.logprobs.then_some(req.top_logprobs.unwrap_or(0)),
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        ..shared_knobs!(loaded, req)
    })
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
        .enumerate()
        .map(|(i, m)| {
            check_message_fields(i, &m.extra)?;
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

/// A message's fields beyond `role`, `content` and `name`: the tool-calling ones
/// (`tool_calls`, `tool_call_id`) belong to issue 22's tools work; `refusal` and
/// `annotations`, which an assistant message read back from a response carries, are
/// informational; `null` asks for nothing; anything else is refused naming
/// `messages[i].field`.
fn check_message_fields(
    i: usize,
    extra: &pagoda_protocol::openai::Extra,
) -> Result<(), RequestError> {
    for (k, v) in extra {
        match k.as_str() {
            "tool_calls" | "tool_call_id" | "refusal" | "annotations" => {}
            _ if v.is_null() => {}
            _ => {
                let param = format!("messages[{i}].{k}");
                return Err(RequestError::param(
                    param.clone(),
                    format!("unknown message field `{param}`; this server refuses fields it does not implement rather than ignore them"),
                ));
            }
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(extra: Value) -> ChatCompletionRequest {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        serde_json::from_value(body).expect("parses")
    }

    fn refused(extra: Value) -> String {
        let e = check(&request(extra.clone()))
            .err()
            .unwrap_or_else(|| panic!("accepted: {extra}"));
        e.param_name().unwrap_or_default().to_string()
    }

    #[test]
    fn check_refuses_unknown_and_bad_fields_by_name() {
        assert!(check(&request(json!({}))).is_ok());
        assert!(check(&request(
            json!({"user": "u", "metadata": {"a": "b"}, "store": false})
        ))
        .is_ok());
        assert!(check(&request(
            json!({"response_format": {"type": "json_object"}})
        ))
        .is_ok());
        assert_eq!(refused(json!({"best_of": 2})), "best_of");
        assert_eq!(refused(json!({"guided_choice": []})), "guided_choice");
        assert_eq!(
            refused(json!({"response_format": {"type": "json_object"}, "guided_json": {}})),
            "guided_json"
        );
        assert_eq!(
            refused(
                json!({"messages": [{"role": "user", "content": "x", "cache_control": {"type": "ephemeral"}}]})
            ),
            "messages[0].cache_control"
        );
        // What an assistant message read back from a response carries passes.
        assert!(check(&request(json!({"messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "y", "refusal": null, "annotations": []},
            {"role": "user", "content": "z", "audio": null},
        ]})))
        .is_ok());
    }

    #[test]
    fn the_constraint_reaches_the_knobs_and_the_engine_request() {
        use crate::request::{engine_request, Bounds, LengthRule};
        let schema = json!({"type": "object"});
        let req = request(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}),
        );
        let constraint = openai_constraint(&req.structured).expect("valid");
        let knobs = Knobs {
            n: 1,
            constraint,
            ..Knobs::default()
        };
        let bounds = Bounds {
            context: 100,
            vocab_size: 1000,
            rule: LengthRule::Strict,
            max_tokens_limit: None,
            priority_scheduling: false,
        };
        let r = engine_request(vec![1; 5], &Default::default(), knobs, &bounds).expect("ok");
        assert_eq!(
            r.constraint,
            Some(pagoda_engine::ConstraintSpec::JsonSchema(schema))
        );
    }
}
