//! The request fields Pagoda's wire types do not name (their `extra` maps): each is either
//! documented as accepted and ignored, with the reason (informational fields, hints that
//! size another server's runner), accepted only at its neutral value (a field that would
//! change the output if honoured), or refused with an error naming it. docs/serving.md's
//! "Request fields" tables list every field of the four generation endpoints.
//!
//! Invariant: no field a client sends is dropped unseen — a name not listed here is a 400
//! naming it, unless its value is `null` (which asks for nothing).

use crate::request::RequestError;
use crate::structured::describe;
use serde_json::Value;
use std::collections::BTreeMap;

/// Which request the fields came with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    OpenAiChat,
    /// `POST /v1/completions`.
    OpenAiCompletions,
    /// `POST /api/generate`.
    OllamaGenerate,
    /// `POST /api/chat`.
    OllamaChat,
}

/// What Pagoda does with a field its wire type does not name.
enum Rule {
    /// Accepted whatever its value; the reason it changes nothing is in docs/serving.md.
    Ignored,
    /// Read and checked by the route itself (`chat_template_kwargs`, `think`).
    Read,
    /// Accepted when absent-equivalent (`null`, `false`, the listed values); refused
    /// otherwise, with the reason.
    NeutralOnly(fn(&Value) -> bool, &'static str),
}

fn falsy(v: &Value) -> bool {
    matches!(v, Value::Null | Value::Bool(false))
}

fn text_only(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.iter().all(|m| m == "text"),
        _ => false,
    }
}

fn standard_tier(v: &Value) -> bool {
    matches!(v, Value::Null) || v == "auto" || v == "default"
}

fn zero(v: &Value) -> bool {
    matches!(v, Value::Null) || v.as_f64() == Some(0.0)
}

fn one(v: &Value) -> bool {
    matches!(v, Value::Null) || v.as_f64() == Some(1.0)
}

fn rule(endpoint: Endpoint, name: &str) -> Option<Rule> {
    use Endpoint::*;
    use Rule::*;
    let openai = matches!(endpoint, OpenAiChat | OpenAiCompletions);
    let chat = endpoint == OpenAiChat;
    Some(match name {
        // OpenAI chat: informational or storage fields that do not change the answer.
        "metadata" | "store" | "safety_identifier" | "prompt_cache_key"
        | "prompt_cache_retention" | "prediction"
            if chat =>
        {
            Ignored
        }
        "service_tier" if chat => NeutralOnly(
            standard_tier,
            "Pagoda has one service tier; send \"auto\" or \"default\", or leave it out",
        ),
        "modalities" if chat => NeutralOnly(
            text_only,
            "Pagoda's models write text only; send [\"text\"] or leave it out",
        ),
        "audio" if chat => NeutralOnly(falsy, "Pagoda's models do not speak; leave it out"),
        // For templates that read it (gpt-oss): `crate::formats::effort_kwargs`.
        "reasoning_effort" if chat => Read,
        "verbosity" if chat => NeutralOnly(
            falsy,
            "Pagoda has no control of this for its models; leave it out",
        ),
        "web_search_options" if chat => {
            NeutralOnly(falsy, "Pagoda does not search the web; leave it out")
        }
        // vLLM's template variables: `crate::formats::check_template_kwargs`.
        "chat_template_kwargs" if chat => Read,
        _ if openai => return None,
        // Ollama's thinking switch: `crate::formats::think_kwargs`.
        "think" => Read,
        // Ollama: logprobs are not implemented on the Ollama API yet.
        "logprobs" => NeutralOnly(
            falsy,
            "logprobs are not supported on the Ollama API of this server (the OpenAI API has them); leave it out",
        ),
        "top_logprobs" => NeutralOnly(
            zero,
            "logprobs are not supported on the Ollama API of this server (the OpenAI API has them); leave it out",
        ),
        _ => return None,
    })
}

/// Ollama `options` keys beyond the implemented ones.
fn option_rule(name: &str) -> Option<Rule> {
    use Rule::*;
    Some(match name {
        // Sizes or places Ollama's runner; Pagoda's comes from its own flags and the output
        // does not depend on it.
        "num_ctx" | "num_batch" | "num_gpu" | "main_gpu" | "num_thread" | "use_mmap"
        | "use_mlock" | "numa" | "low_vram" | "f16_kv" | "vocab_only" | "logits_all"
        | "embedding_only" | "num_keep" => Ignored,
        // Deprecated by Ollama, which ignores it too.
        "penalize_newline" => Ignored,
        // Only read by Ollama when `mirostat` is on, which Pagoda refuses.
        "mirostat_tau" | "mirostat_eta" => Ignored,
        "mirostat" => NeutralOnly(
            zero,
            "mirostat sampling is not supported; send 0 or leave it out",
        ),
        "typical_p" => NeutralOnly(
            one,
            "typical sampling is not supported; send 1.0 or leave it out",
        ),
        "tfs_z" => NeutralOnly(
            one,
            "tail-free sampling is not supported; send 1.0 or leave it out",
        ),
        _ => return None,
    })
}

/// `stream_options` keys beyond `include_usage`.
fn stream_option_rule(name: &str) -> Option<Rule> {
    use Rule::*;
    Some(match name {
        // OpenAI pads chunks with random `obfuscation` text against length side channels on
        // its shared network; a self-hosted server's chunks are the client's own.
        "include_obfuscation" => Ignored,
        // vLLM: usage on every chunk.
        "continuous_usage_stats" => NeutralOnly(
            falsy,
            "usage comes once, in the last chunk (`include_usage`); send false or leave it out",
        ),
        _ => return None,
    })
}

/// Fields of an Ollama chat message beyond `role`, `content`, `images`, `tool_calls`,
/// `tool_name` and `thinking` (`name`, older clients' spelling of `tool_name`, is read by the
/// route).
fn ollama_message_rule(_name: &str) -> Option<Rule> {
    None
}

/// Checks `stream_options` keys beyond `include_usage`.
pub fn check_stream_options(extra: &BTreeMap<String, Value>) -> Result<(), RequestError> {
    for (name, value) in extra {
        check_one(
            value,
            stream_option_rule(name),
            format!("stream_options.{name}"),
            "stream_options",
        )?;
    }
    Ok(())
}

/// Checks the fields of Ollama chat message `index` beyond the implemented ones (`name`
/// excluded: the route reads it).
pub fn check_ollama_message(
    index: usize,
    extra: &BTreeMap<String, Value>,
) -> Result<(), RequestError> {
    for (name, value) in extra.iter().filter(|(k, _)| *k != "name") {
        check_one(
            value,
            ollama_message_rule(name),
            format!("messages[{index}].{name}"),
            "an Ollama chat message",
        )?;
    }
    Ok(())
}

/// Checks the fields of a request its wire type did not name.
pub fn check_extra(
    endpoint: Endpoint,
    extra: &BTreeMap<String, Value>,
) -> Result<(), RequestError> {
    for (name, value) in extra {
        check_one(
            value,
            rule(endpoint, name),
            name.clone(),
            endpoint_name(endpoint),
        )?;
    }
    Ok(())
}

/// Checks the keys of an Ollama `options` object beyond the implemented ones.
pub fn check_ollama_options(extra: &BTreeMap<String, Value>) -> Result<(), RequestError> {
    for (name, value) in extra {
        check_one(
            value,
            option_rule(name),
            format!("options.{name}"),
            "Ollama's options",
        )?;
    }
    Ok(())
}

fn check_one(
    value: &Value,
    rule: Option<Rule>,
    param: String,
    place: &str,
) -> Result<(), RequestError> {
    match rule {
        Some(Rule::Ignored | Rule::Read) => Ok(()),
        // `null` asks for nothing, whatever the field (clients send unset fields as null).
        _ if value.is_null() => Ok(()),
        Some(Rule::NeutralOnly(neutral, _)) if neutral(value) => Ok(()),
        Some(Rule::NeutralOnly(_, why)) => Err(RequestError::param(
            param.clone(),
            format!("`{param}` ({}) is not supported: {why}", describe(value)),
        )),
        None => Err(RequestError::param(
            param.clone(),
            format!(
                "unknown field `{param}` in {place}; this server refuses fields it does not implement rather than ignore them (see docs/serving.md, \"Request fields\")"
            ),
        )),
    }
}

fn endpoint_name(e: Endpoint) -> &'static str {
    match e {
        Endpoint::OpenAiChat => "a chat completion request",
        Endpoint::OpenAiCompletions => "a completion request",
        Endpoint::OllamaGenerate => "an /api/generate request",
        Endpoint::OllamaChat => "an /api/chat request",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn extra(name: &str, v: Value) -> BTreeMap<String, Value> {
        [(name.to_string(), v)].into()
    }

    #[test]
    fn unknown_fields_are_refused_by_name_on_every_endpoint() {
        for e in [
            Endpoint::OpenAiChat,
            Endpoint::OpenAiCompletions,
            Endpoint::OllamaGenerate,
            Endpoint::OllamaChat,
        ] {
            let err = check_extra(e, &extra("frobnicate", json!(1))).expect_err("unknown");
            assert_eq!(err.param_name(), Some("frobnicate"));
            assert!(err.message.contains("`frobnicate`"), "{err}");
            assert!(check_extra(e, &BTreeMap::new()).is_ok());
            assert!(check_extra(e, &extra("frobnicate", Value::Null)).is_ok());
        }
        let err = check_ollama_options(&extra("num_frob", json!(1))).expect_err("unknown");
        assert_eq!(err.param_name(), Some("options.num_frob"));
    }

    #[test]
    fn documented_fields_pass_and_others_are_refused_unless_neutral() {
        let ok = [
            (Endpoint::OpenAiChat, "metadata", json!({"k": "v"})),
            (Endpoint::OpenAiChat, "store", json!(true)),
            (Endpoint::OpenAiChat, "safety_identifier", json!("u1")),
            (Endpoint::OpenAiChat, "prompt_cache_key", json!("k")),
            (Endpoint::OpenAiChat, "service_tier", json!("auto")),
            (Endpoint::OpenAiChat, "modalities", json!(["text"])),
            (Endpoint::OpenAiChat, "audio", Value::Null),
            (Endpoint::OpenAiChat, "reasoning_effort", Value::Null),
            (Endpoint::OpenAiChat, "reasoning_effort", json!("low")),
            (Endpoint::OllamaChat, "think", json!(false)),
            // Read by the routes, which check them.
            (Endpoint::OllamaChat, "think", json!(true)),
            (
                Endpoint::OpenAiChat,
                "chat_template_kwargs",
                json!({"enable_thinking": false}),
            ),
            (Endpoint::OllamaGenerate, "logprobs", json!(false)),
            (Endpoint::OllamaGenerate, "top_logprobs", json!(0)),
        ];
        for (e, name, v) in ok {
            check_extra(e, &extra(name, v.clone())).unwrap_or_else(|err| panic!("{name}: {err}"));
        }
        let refused = [
            (Endpoint::OpenAiChat, "service_tier", json!("flex")),
            (Endpoint::OpenAiChat, "modalities", json!(["text", "audio"])),
            (Endpoint::OpenAiChat, "audio", json!({"voice": "alloy"})),
            (Endpoint::OpenAiChat, "verbosity", json!("low")),
            (Endpoint::OpenAiChat, "web_search_options", json!({})),
            // Chat-only fields are unknown on the completions endpoint.
            (Endpoint::OpenAiCompletions, "metadata", json!({})),
            (Endpoint::OpenAiCompletions, "store", json!(false)),
            (
                Endpoint::OpenAiCompletions,
                "chat_template_kwargs",
                json!({}),
            ),
            (Endpoint::OllamaChat, "logprobs", json!(true)),
            (Endpoint::OllamaChat, "top_logprobs", json!(3)),
            // OpenAI's names are unknown on Ollama's routes.
            (Endpoint::OllamaChat, "metadata", json!({})),
        ];
        for (e, name, v) in refused {
            let err = check_extra(e, &extra(name, v.clone())).expect_err(name);
            assert_eq!(err.param_name(), Some(name), "{err}");
        }
    }

    #[test]
    fn ollama_options_accept_runner_sizes_and_refuse_other_samplers() {
        for (name, v) in [
            ("num_ctx", json!(8192)),
            ("num_gpu", json!(99)),
            ("num_thread", json!(8)),
            ("use_mmap", json!(true)),
            ("num_keep", json!(5)),
            ("penalize_newline", json!(true)),
            ("mirostat", json!(0)),
            ("typical_p", json!(1.0)),
            ("tfs_z", json!(1)),
        ] {
            check_ollama_options(&extra(name, v)).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for (name, v) in [
            ("mirostat", json!(2)),
            ("typical_p", json!(0.7)),
            ("tfs_z", json!(0.9)),
        ] {
            let e = check_ollama_options(&extra(name, v)).expect_err(name);
            assert_eq!(e.param_name(), Some(format!("options.{name}").as_str()));
        }
    }
}
