//! `/v1/chat/completions` bodies: the chat [`Plan`] builder ([`check`] without the model,
//! then [`Checked::plan`]: the messages through the model's chat template, the knobs, the
//! tools and the constraint), and the whole (non-streamed) response.

use super::{check_ranges, finish_reason, token_text, usage, Aborted, ResponseHead};
use crate::collect::{combined_usage, ChoiceOutput};
use crate::fields::{check_extra, check_stream_options, Endpoint};
use crate::formats;
use crate::loader::LoadedModel;
use crate::plan::{plain, Plan};
use crate::request::{Bounds, Knobs, LengthRule, RequestError};
use crate::structured::openai_constraint_and_field;
use crate::tools::{self, OutputFormats, ToolSet};
use pagoda_engine::{ConstraintSpec, SampledToken};
use pagoda_model::chat_template::{
    ChatMessage as TemplateMessage, TemplateFunctionCall, TemplateKwargs, TemplateToolCall,
};
use pagoda_model::tokenizer::Tokenizer;
use pagoda_protocol::openai::chat::{
    AssistantMessage, ChatChoice, ChatCompletionRequest, ChatCompletionResponse, ChatLogprobs,
    ChatTokenLogprob, FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta,
};
use pagoda_protocol::openai::{FinishReason, TopLogprob};
use serde_json::Value;

/// A chat body checked without the model: its tool set, structured-output constraint and
/// template messages, each computed once ([`check`]); [`Checked::plan`] binds it to a model.
#[derive(Debug)]
pub struct Checked<'a> {
    req: &'a ChatCompletionRequest,
    tools: Option<ToolSet>,
    /// The structured-output constraint and the field it came from.
    structured: Option<(&'static str, ConstraintSpec)>,
    messages: Vec<TemplateMessage>,
    /// `chat_template_kwargs`, checked.
    kwargs: TemplateKwargs,
    /// `reasoning_effort`, checked (set on the template at [`Checked::plan`]).
    effort: Option<String>,
}

/// Everything about `req` that can be checked without the model: the first half of the
/// chat [`Plan`] builder.
pub fn check(req: &ChatCompletionRequest) -> Result<Checked<'_>, RequestError> {
    check_ranges(req.temperature, req.n, req.top_logprobs)?;
    if req.top_logprobs.is_some() && !req.logprobs {
        return Err(RequestError::param(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        ));
    }
    check_extra(Endpoint::OpenAiChat, &req.extra)?;
    if let Some(o) = &req.stream_options {
        check_stream_options(&o.extra)?;
    }
    let structured = openai_constraint_and_field(&req.structured)?;
    let tools = tool_set(req)?;
    let forcing = tools.as_ref().is_some_and(ToolSet::forces_a_call);
    if structured.is_some() && forcing {
        return Err(RequestError::param(
            "tool_choice",
            "tool_choice forces a call while response_format (or a guided_* field) constrains \
             the output too: send one of them",
        ));
    }
    let kwargs = formats::check_template_kwargs(
        req.extra.get("chat_template_kwargs"),
        "chat_template_kwargs",
    )?;
    let effort = formats::check_effort(req.extra.get("reasoning_effort"), "reasoning_effort")?;
    if effort.is_some() && kwargs.contains_key(formats::REASONING_EFFORT) {
        return Err(RequestError::param(
            "reasoning_effort",
            "`reasoning_effort` is given twice (also in `chat_template_kwargs`): send one",
        ));
    }
    let messages = template_messages(req)?;
    Ok(Checked {
        req,
        tools,
        structured,
        messages,
        kwargs,
        effort,
    })
}

impl Checked<'_> {
    /// The names of the tools whose calls the output is parsed for; `None` when it is not
    /// parsed (no tools, or `tool_choice: "none"`).
    pub fn offered_tools(&self) -> Option<tools::Offered> {
        self.tools.as_ref().map(ToolSet::offered)
    }

    /// The request's plan on `loaded`: the messages (with the model's default system
    /// message and Modelfile MESSAGE turns) and the tools through its chat template (or the
    /// fallback prompt, [`tools::encode_prompt`]); the knobs, with the model's Modelfile
    /// stop strings in front of its own; the output's constraint: the structured-output one,
    /// or the grammar forcing a call when `tool_choice` is `required` or names a function.
    /// Lengths are [`LengthRule::Strict`] (as OpenAI and vLLM refuse).
    pub fn plan(self, loaded: &LoadedModel, bounds: &Bounds) -> Result<Plan, RequestError> {
        let req = self.req;
        let offered_tools = self.offered_tools();
        let mut kwargs = self.kwargs;
        formats::effort_kwargs(
            loaded,
            self.effort.as_deref(),
            "reasoning_effort",
            &mut kwargs,
        )?;
        let prompt = tools::encode_prompt(loaded, self.messages, self.tools.as_ref(), &kwargs)?;
        let template_tools = tools::template_renders_tools(loaded);
        let mut formats = formats::output_formats(loaded, &prompt, template_tools);
        let (constraint_field, constraint) = match self.structured {
            Some((field, c)) => (Some(field), Some(c)),
            None => match self
                .tools
                .as_ref()
                .and_then(|set| tools::forced_call(set, template_tools, formats.tools))
            {
                Some(forced) => {
                    // The grammar writes the call and nothing else: no reasoning to split off
                    // (gpt-oss's harmony channels included), the call in `forced.format`.
                    formats.tools = forced.format;
                    formats.reasoning = None;
                    formats.reasoning_open = false;
                    (Some("tools"), Some(forced.constraint))
                }
                None => (None, None),
            },
        };
        let knobs = Knobs {
            logprobs: req.logprobs.then_some(req.top_logprobs.unwrap_or(0)),
            max_tokens: req.max_completion_tokens.or(req.max_tokens),
            ..shared_knobs!(loaded, req, constraint)
        };
        let bounds = bounds.with_rule(LengthRule::Strict);
        let mut plan = plain(prompt, &loaded.openai_sampling(), knobs, &bounds)?;
        plan.constraint_field = constraint_field;
        plan.offered_tools = offered_tools;
        plan.set_formats(formats);
        Ok(plan)
    }
}

/// The request's tools, checked; `None` when it asks for no tool use (no tools, or
/// `tool_choice: "none"`): then tools are neither rendered nor parsed.
pub fn tool_set(req: &ChatCompletionRequest) -> Result<Option<ToolSet>, RequestError> {
    tools::check_openai(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
        req.functions.as_ref(),
        req.function_call.as_ref(),
    )
}

/// A choice's `finish_reason` once its calls are parsed: `tool_calls` when it made any and
/// stopped on its own; `length` stays `length` (a call cut off by `max_tokens`), as OpenAI
/// reports it.
pub fn finish_with_calls(reason: FinishReason, called: bool) -> FinishReason {
    match reason {
        FinishReason::Stop if called => FinishReason::ToolCalls,
        other => other,
    }
}

/// Parsed calls as OpenAI's `tool_calls`, each with a fresh id.
pub fn openai_calls(calls: Vec<tools::ParsedCall>) -> Vec<ToolCall> {
    calls
        .into_iter()
        .map(|c| ToolCall {
            id: tools::call_id(),
            kind: "function".into(),
            function: FunctionCall {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect()
}

/// The first stream piece of call `index`, as OpenAI sends it: `index`, a fresh `id`,
/// `type`, `function.name` and `arguments: ""`.
pub fn call_start_delta(name: String, index: usize) -> ToolCallDelta {
    ToolCallDelta {
        index,
        id: Some(tools::call_id()),
        kind: Some("function".into()),
        function: Some(FunctionCallDelta {
            name: Some(name),
            arguments: Some(String::new()),
        }),
    }
}

/// A later stream piece of call `index`: only `index` and a piece of `arguments`.
pub fn arguments_delta(arguments: String, index: usize) -> ToolCallDelta {
    ToolCallDelta {
        index,
        function: Some(FunctionCallDelta {
            name: None,
            arguments: Some(arguments),
        }),
        ..ToolCallDelta::default()
    }
}

/// A whole parsed call (one not streamed as it was written) as stream pieces: its
/// [`call_start_delta`], then all its arguments in one [`arguments_delta`].
pub fn call_deltas(call: tools::ParsedCall, index: usize) -> [ToolCallDelta; 2] {
    [
        call_start_delta(call.name, index),
        arguments_delta(call.arguments, index),
    ]
}

/// The whole response for collected `choices`; each choice's text is split into
/// `reasoning_content` (a model that reasons), content and, with `offered` tools,
/// `tool_calls` ([`finish_with_calls`]), as the stream splits it.
pub fn response(
    head: ResponseHead,
    choices: Vec<ChoiceOutput>,
    with_logprobs: bool,
    offered: Option<tools::Offered>,
    formats: OutputFormats,
    tokenizer: &Tokenizer,
) -> Result<ChatCompletionResponse, Aborted> {
    let total = usage(combined_usage(choices.iter().map(|c| c.usage)));
    let choices = choices
        .into_iter()
        .enumerate()
        .map(|(index, c)| {
            let mut finish = finish_reason(c.finish).ok_or(Aborted)?;
            let (reasoning_content, content, tool_calls) =
                if offered.is_some() || formats.reasoning.is_some() {
                    let (reasoning, parsed) = tools::parse_reply(&c.text, offered.clone(), formats);
                    if parsed.calls.is_empty() {
                        (reasoning, parsed.content, None)
                    } else {
                        finish = finish_with_calls(finish, true);
                        (reasoning, parsed.content, Some(openai_calls(parsed.calls)))
                    }
                } else {
                    (None, Some(c.text), None)
                };
            Ok(ChatChoice {
                index,
                message: AssistantMessage {
                    role: "assistant".into(),
                    content,
                    reasoning_content,
                    tool_calls,
                },
                logprobs: with_logprobs.then(|| ChatLogprobs {
                    content: c
                        .logprobs
                        .iter()
                        .map(|lp| logprob_entry(tokenizer, lp))
                        .collect(),
                }),
                finish_reason: Some(finish),
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

/// [`template_messages`] for the tests of the tool rendering.
#[cfg(test)]
pub(crate) fn template_messages_for_test(
    req: &ChatCompletionRequest,
) -> Result<Vec<TemplateMessage>, RequestError> {
    template_messages(req)
}

/// The request's messages as the chat template takes them: assistant `tool_calls` with
/// their `arguments` parsed (templates write them with `tojson`), `tool` results checked
/// against the calls before them and given the called function's `name`.
fn template_messages(req: &ChatCompletionRequest) -> Result<Vec<TemplateMessage>, RequestError> {
    if req.messages.is_empty() {
        return Err(RequestError::param(
            "messages",
            "messages must not be empty",
        ));
    }
    // The calls made so far: id → function name.
    let mut calls: Vec<(String, String)> = Vec::new();
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
            let mut out = TemplateMessage::new(role, text);
            out.reasoning_content = m.reasoning_content.clone();
            if let Some(tc) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
                if role != "assistant" {
                    return Err(RequestError::param(
                        "messages",
                        format!("messages[{i}].tool_calls: only assistant messages carry tool calls"),
                    ));
                }
                let mut list = Vec::with_capacity(tc.len());
                for (j, c) in tc.iter().enumerate() {
                    if c.function.name.is_empty() {
                        return Err(RequestError::param(
                            "messages",
                            format!("messages[{i}].tool_calls[{j}].function.name is missing"),
                        ));
                    }
                    let arguments: Value = if c.function.arguments.trim().is_empty() {
                        Value::Object(Default::default())
                    } else {
                        serde_json::from_str(&c.function.arguments).map_err(|e| {
                            RequestError::param(
                                "messages",
                                format!("messages[{i}].tool_calls[{j}].function.arguments is not JSON: {e}"),
                            )
                        })?
                    };
                    calls.push((c.id.clone(), c.function.name.clone()));
                    list.push(TemplateToolCall {
                        id: (!c.id.is_empty()).then(|| c.id.clone()),
                        kind: "function".into(),
                        function: TemplateFunctionCall {
                            name: c.function.name.clone(),
                            arguments,
                        },
                    });
                }
                out.tool_calls = Some(list);
            }
            if role == "tool" {
                let Some(id) = m.tool_call_id.as_deref() else {
                    return Err(RequestError::param(
                        "messages",
                        format!("messages[{i}].tool_call_id is missing: a tool message answers a call"),
                    ));
                };
                let Some((_, name)) = calls.iter().find(|(c, _)| c == id) else {
                    return Err(RequestError::param(
                        "messages",
                        format!("messages[{i}].tool_call_id `{id}` matches no tool call of an earlier assistant message"),
                    ));
                };
                out.tool_call_id = Some(id.to_string());
                out.name = Some(m.name.clone().unwrap_or_else(|| name.clone()));
            }
            Ok(out)
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
