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

/// The keywords for an Ollama `think`: `Some(true)`/`Some(false)` switch thinking through
/// the template's [`THINKING_SWITCH`]. Refused (naming `think`) when the model does not reason
/// and thinking is asked for, or when the template cannot switch thinking off.
pub fn think_kwargs(
    loaded: &LoadedModel,
    think: Option<bool>,
) -> Result<TemplateKwargs, RequestError> {
    let mut kwargs = TemplateKwargs::new();
    let Some(think) = think else {
        return Ok(kwargs);
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
