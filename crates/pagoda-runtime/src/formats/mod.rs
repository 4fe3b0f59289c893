//! A model family's conversation formats beyond rendering its template: how its output
//! writes calls ([`crate::tools::formats`]) and reasoning ([`reasoning`]), chosen from its chat
//! template's markup ([`output_formats`]); the template keywords a client may pass
//! (`chat_template_kwargs`, checked and bounded by [`check_template_kwargs`]) and the
//! thinking switch (`enable_thinking`, [`thinking_switch`]).
//!
//! Invariants: the formats of a request depend only on the model's template and the rendered
//! prompt, so the routes parse every family's output with the same [`crate::tools::Piece`]s;
//! a template keyword is a JSON object of bounded size and depth that never replaces a
//! variable the render sets itself.

pub mod harmony;
pub mod reasoning;

use crate::loader::LoadedModel;
use crate::request::RequestError;
use crate::tools::{OutputFormats, ToolCallFormat};
use pagoda_model::chat_template::{TemplateKwargs, RESERVED_TEMPLATE_VARIABLES};
use reasoning::ReasoningFormat;
use serde_json::Value;

/// Most bytes of `chat_template_kwargs` (as JSON).
pub const MAX_TEMPLATE_KWARGS_BYTES: usize = 16 * 1024;
/// Deepest nesting of a `chat_template_kwargs` value (the object itself is level 1).
pub const MAX_TEMPLATE_KWARGS_DEPTH: usize = 8;

/// The template variable that switches thinking on and off (Qwen3, QwQ, Qwen3.5, SmolLM3,
/// Gemma 4, the DeepSeek-R1-Distill-Qwen template llama.cpp ships).
pub const THINKING_SWITCH: &str = "enable_thinking";

/// The template variable gpt-oss's template reads for its reasoning effort (`Reasoning: …`
/// in its system message; `medium` when unset).
pub const REASONING_EFFORT: &str = "reasoning_effort";
/// The efforts accepted (OpenAI's `reasoning_effort`, Ollama's `think` levels).
pub const EFFORTS: [&str; 3] = ["low", "medium", "high"];

/// Ollama's `think`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Think {
    /// `true` / `false`: thinking switched on or off.
    Switch(bool),
    /// `"low"`, `"medium"` or `"high"`: a reasoning effort (gpt-oss).
    Effort(String),
}

/// A reasoning effort given in `field`: `None` for null or absent, else one of [`EFFORTS`].
pub fn check_effort(
    value: Option<&Value>,
    field: &'static str,
) -> Result<Option<String>, RequestError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) if EFFORTS.contains(&e.as_str()) => Ok(Some(e.clone())),
        Some(other) => Err(RequestError::param(
            field,
            format!("`{field}` must be one of \"low\", \"medium\" or \"high\", got {other}"),
        )),
    }
}

/// Whether `loaded`'s template reads [`REASONING_EFFORT`].
pub fn takes_effort(loaded: &LoadedModel) -> bool {
    loaded.chat_template.source().contains(REASONING_EFFORT)
}

/// Sets `effort` (given in `field`) as the template's [`REASONING_EFFORT`]; refused, naming
/// `field`, when the template does not read it.
pub fn effort_kwargs(
    loaded: &LoadedModel,
    effort: Option<&str>,
    field: &'static str,
    kwargs: &mut TemplateKwargs,
) -> Result<(), RequestError> {
    let Some(effort) = effort else {
        return Ok(());
    };
    if !takes_effort(loaded) {
        return Err(RequestError::param(
            field,
            format!("`{field}`: this model's chat template has no reasoning effort (it reads no `{REASONING_EFFORT}`); leave it out"),
        ));
    }
    kwargs.insert(REASONING_EFFORT.into(), Value::String(effort.to_string()));
    Ok(())
}

/// The formats of `loaded`'s output for a request whose prompt is `prompt`:
/// `template_tools`: the template rendered the tools (otherwise the fallback prompt asked
/// for `<tool_call>` JSON, whatever the family).
pub fn output_formats(loaded: &LoadedModel, prompt: &[u32], template_tools: bool) -> OutputFormats {
    let source = loaded.chat_template.source();
    let tools = if template_tools {
        ToolCallFormat::detect(source)
    } else {
        ToolCallFormat::Hermes
    };
    let reasoning = ReasoningFormat::detect(source);
    let reasoning_open = reasoning.is_some_and(|f| {
        let tail = &prompt[prompt.len().saturating_sub(16)..];
        loaded
            .tokenizer
            .decode(tail, false)
            .is_ok_and(|t| f.prompt_opens(&t))
    });
    OutputFormats {
        tools,
        reasoning,
        reasoning_open,
    }
}

/// Whether the output's text must keep control tokens for `formats` to be parsed (Mistral's
/// `[TOOL_CALLS]` and `[THINK]`, Gemma 4's `<|tool_call>` and `<|channel>`, Llama's
/// `<|python_tag|>`, Phi's `<|tool_call|>`; `<think>` is kept too, which some conversions
/// mark as a control token).
pub fn keeps_control_tokens(formats: &OutputFormats, tools_offered: bool) -> bool {
    formats.reasoning.is_some() || (tools_offered && formats.tools.markers_are_control_tokens())
}

/// Whether `loaded`'s template reads the thinking switch.
pub fn thinking_switch(loaded: &LoadedModel) -> bool {
    loaded.chat_template.source().contains(THINKING_SWITCH)
}

/// Whether `loaded`'s output may hold reasoning.
pub fn reasons(loaded: &LoadedModel) -> bool {
    ReasoningFormat::detect(loaded.chat_template.source()).is_some()
}

/// A client's `chat_template_kwargs` (named `field` in errors), checked: a JSON object of at
/// most [`MAX_TEMPLATE_KWARGS_BYTES`] and [`MAX_TEMPLATE_KWARGS_DEPTH`] levels, none of whose
/// keys is a variable the render sets itself ([`RESERVED_TEMPLATE_VARIABLES`]).
pub fn check_template_kwargs(
    value: Option<&Value>,
    field: &'static str,
) -> Result<TemplateKwargs, RequestError> {
    let object = match value {
        None | Some(Value::Null) => return Ok(TemplateKwargs::new()),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(RequestError::param(
                field,
                format!("`{field}` must be a JSON object of template variables, got {other}"),
            ))
        }
    };
    let bytes = serde_json::to_string(object).map_or(usize::MAX, |s| s.len());
    if bytes > MAX_TEMPLATE_KWARGS_BYTES {
        return Err(RequestError::param(
            field,
            format!("`{field}` is {bytes} bytes as JSON, more than the limit of {MAX_TEMPLATE_KWARGS_BYTES}"),
        ));
    }
    if depth(&Value::Object(object.clone())) > MAX_TEMPLATE_KWARGS_DEPTH {
        return Err(RequestError::param(
            field,
            format!("`{field}` nests deeper than {MAX_TEMPLATE_KWARGS_DEPTH} levels"),
        ));
    }
    if let Some(k) = object
        .keys()
        .find(|k| RESERVED_TEMPLATE_VARIABLES.contains(&k.as_str()))
    {
        return Err(RequestError::param(
            field,
            format!("`{field}.{k}` is set by the server itself; send it in its own field"),
        ));
    }
    Ok(object.clone())
}

/// Levels of nesting of `v` (a scalar is 0).
fn depth(v: &Value) -> usize {
    match v {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// The keywords for an Ollama `think`: `true`/`false` switch thinking through the
/// template's [`THINKING_SWITCH`]; an effort level sets [`REASONING_EFFORT`] (refused, naming
/// `think`, for a template that does not read it). Refused (naming `think`) when the model does not reason
/// and thinking is asked for, or when the template cannot switch thinking off.
pub fn think_kwargs(
    loaded: &LoadedModel,
    think: Option<&Think>,
) -> Result<TemplateKwargs, RequestError> {
    let mut kwargs = TemplateKwargs::new();
    let think = match think {
        None => return Ok(kwargs),
        Some(Think::Effort(e)) => {
            effort_kwargs(loaded, Some(e), "think", &mut kwargs)?;
            return Ok(kwargs);
        }
        Some(Think::Switch(b)) => *b,
    };
    if think && !reasons(loaded) {
        return Err(RequestError::param(
            "think",
            "`think`: this model does not support thinking (its chat template has no reasoning \
             format); leave `think` out",
        ));
    }
    if thinking_switch(loaded) {
        kwargs.insert(THINKING_SWITCH.into(), Value::Bool(think));
    } else if !think && reasons(loaded) {
        return Err(RequestError::param(
            "think",
            "`think`: this model's chat template cannot switch thinking off (it has no \
             `enable_thinking`); leave `think` out to get its reasoning in `thinking`",
        ));
    }
    Ok(kwargs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efforts_are_low_medium_or_high() {
        assert_eq!(check_effort(None, "reasoning_effort").unwrap(), None);
        assert_eq!(
            check_effort(Some(&Value::Null), "reasoning_effort").unwrap(),
            None
        );
        assert_eq!(
            check_effort(Some(&serde_json::json!("high")), "reasoning_effort").unwrap(),
            Some("high".into())
        );
        for bad in [serde_json::json!("max"), serde_json::json!(1)] {
            let e = check_effort(Some(&bad), "think").unwrap_err();
            assert_eq!(e.param_name(), Some("think"));
        }
    }

    #[test]
    fn template_kwargs_are_bounded_objects() {
        let ok = serde_json::json!({"enable_thinking": false, "x": [1, {"y": 2}]});
        assert_eq!(
            check_template_kwargs(Some(&ok), "chat_template_kwargs")
                .unwrap()
                .len(),
            2
        );
        assert!(check_template_kwargs(None, "chat_template_kwargs")
            .unwrap()
            .is_empty());
        for bad in [
            serde_json::json!([1]),
            serde_json::json!("enable_thinking"),
            serde_json::json!({"messages": []}),
            serde_json::json!({"a": [[[[[[[[[1]]]]]]]]]}),
            serde_json::json!({"a": "x".repeat(MAX_TEMPLATE_KWARGS_BYTES)}),
        ] {
            let e = check_template_kwargs(Some(&bad), "chat_template_kwargs").unwrap_err();
            assert_eq!(
                e.param_name(),
                Some("chat_template_kwargs"),
                "{}",
                e.message
            );
        }
    }
}
