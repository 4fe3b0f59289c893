//! Tool calling over HTTP with the tiny test model: tools make the prompt longer,
//! `tool_choice: "none"` does not, a round trip of calls and results is accepted, every bad
//! input is a 400 naming its field, and streams with tools stay well-formed. The tiny model's
//! 256-token context is too short for the fallback prompt, so these run on a copy of it whose
//! template renders tools compactly (the template path; the fallback's text is the runtime's
//! unit tests). Which calls a real model makes is scripts/conformance's business; the parser
//! and the stream's call pieces are the runtime's unit tests.

use crate::harness::{config, expect_openai_error, golden, sse_data, start, TestServer};
use serde_json::{json, Value};

/// A template that reads `tools` and `tool_calls`, in few tokens.
const TEMPLATE: &str = "{{ bos_token }}{% if tools %}{{ '<|im_start|>system\ntools:' }}{% for t in tools %} {{ t.function.name }}{% endfor %}{{ '<|im_end|>\n' }}{% endif %}{% for message in messages %}{% if message.tool_calls %}{{ '<|im_start|>assistant\n' }}{% for c in message.tool_calls %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}{{ '<|im_end|>\n' }}{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A copy of tiny-llama with [`TEMPLATE`], served from a temporary model dir as the default
/// model (requests name none: `"model": ""`).
async fn server() -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tmp");
    let model = dir.path().join("tiny-tools");
    std::fs::create_dir(&model).expect("mkdir");
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(golden("tiny-llama").join(f), model.join(f)).expect("copy");
    }
    std::fs::write(model.join("chat_template.jinja"), TEMPLATE).expect("template");
    let mut c = config();
    c.model_dirs.push(dir.path().to_path_buf());
    c.models = vec![model.display().to_string()];
    (start(c).await, dir)
}

fn body(extra: Value) -> Value {
    let mut b = json!({
        "model": "",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "max_tokens": 6,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

fn weather() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

async fn prompt_tokens(s: &TestServer, b: Value) -> u64 {
    let r = s.post("/v1/chat/completions", b).await;
    let status = r.status();
    let v: Value = r.json().await.expect("json");
    assert_eq!(status, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["role"], "assistant");
    assert!(
        m["content"].is_string() || m["tool_calls"].is_array(),
        "{v}"
    );
    let finish = v["choices"][0]["finish_reason"].as_str().expect("finish");
    assert!(["stop", "length", "tool_calls"].contains(&finish), "{v}");
    v["usage"]["prompt_tokens"].as_u64().expect("usage")
}

#[tokio::test]
async fn tools_are_rendered_into_the_prompt_unless_tool_choice_is_none() {
    let (s, _dir) = server().await;
    let plain = prompt_tokens(&s, body(json!({}))).await;
    let with = prompt_tokens(&s, body(json!({"tools": weather()}))).await;
    let none = prompt_tokens(&s, body(json!({"tools": weather(), "tool_choice": "none"}))).await;
    let required = prompt_tokens(
        &s,
        body(json!({"tools": weather(), "tool_choice": "required"})),
    )
    .await;
    let named = prompt_tokens(
        &s,
        body(json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false})),
    )
    .await;
    assert!(with > plain + 20, "{with} vs {plain}");
    assert_eq!(none, plain);
    assert_eq!(required, with);
    assert_eq!(named, with);
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_round_trip_of_calls_and_results_is_accepted() {
    let (s, _dir) = server().await;
    let messages = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": "{\"temp_c\": 21}"}
    ]);
    let short = prompt_tokens(&s, body(json!({"tools": weather()}))).await;
    let long = prompt_tokens(&s, body(json!({"tools": weather(), "messages": messages}))).await;
    assert!(long > short + 10, "{long} vs {short}");
    // Without tools, the history with calls still renders (the final-answer turn).
    prompt_tokens(&s, body(json!({"messages": messages}))).await;
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn every_bad_tool_input_is_a_400_naming_its_field() {
    let (s, _dir) = server().await;
    let w = weather()[0].clone();
    let cases = [
        (
            json!({"tools": [{"type": "function", "function": {"description": "no name"}}]}),
            "tools",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
            "tools",
        ),
        (json!({"tools": [w, w]}), "tools"),
        (
            json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "other"}}}),
            "tool_choice",
        ),
        (
            json!({"tools": weather(), "tool_choice": "always"}),
            "tool_choice",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"functions": [{"name": "f"}]}), "functions"),
        (json!({"function_call": {"name": "f"}}), "function_call"),
        (
            json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_nope", "content": "1"}]}),
            "messages",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}),
            "messages",
        ),
    ];
    for (extra, param) in cases {
        let mut b = body(extra.clone());
        b["stream"] = json!(true);
        let v = expect_openai_error(s.post("/v1/chat/completions", b).await, 400).await;
        assert_eq!(v["error"]["param"], param, "{extra} → {v}");
    }
    // Ollama: the same checks of `tools`.
    let r = s
        .post(
            "/api/chat",
            json!({"model": "", "stream": false,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}),
        )
        .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("tools[0].function.parameters")),
        "{v}"
    );
    assert!(s.wait_kv_empty().await);
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn streams_with_tools_are_well_formed() {
    let (s, _dir) = server().await;
    for choice in [json!("auto"), json!("required")] {
        let mut b = body(
            json!({"tools": weather(), "tool_choice": choice, "stream": true,
            "n": 2, "logprobs": true, "stream_options": {"include_usage": true}}),
        );
        b["temperature"] = json!(1.0);
        let r = s.post("/v1/chat/completions", b).await;
        assert_eq!(r.status(), 200);
        let text = r.text().await.expect("body");
        let data = sse_data(&text);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
        let mut finished = 0;
        let mut content = [String::new(), String::new()];
        for d in &data[..data.len() - 1] {
            let v: Value = serde_json::from_str(d).expect("chunk json");
            assert_eq!(v["object"], "chat.completion.chunk", "{v}");
            for c in v["choices"].as_array().expect("choices") {
                let i = c["index"].as_u64().expect("index") as usize;
                if let Some(t) = c["delta"]["content"].as_str() {
                    content[i].push_str(t);
                }
                for call in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                    assert!(call["index"].is_u64(), "{call}");
                }
                if let Some(f) = c["finish_reason"].as_str() {
                    assert!(["stop", "length", "tool_calls"].contains(&f));
                    finished += 1;
                }
            }
        }
        assert_eq!(finished, 2);
        for c in &content {
            assert!(!c.contains("<tool_call>{\"name\""), "{c}");
        }
    }
    s.stop().await.expect("clean stop");
}

/// A call the model is made to write (`tool_choice` names the function): streamed, its
/// arguments arrive in pieces as they are written, under one index, after a header with the
/// id, type and name; they concatenate to the non-streamed response's arguments; every
/// token's logprobs are sent once. (The tiny model's city string runs until `max_tokens`:
/// both give the arguments as written, cut off, with `finish_reason: "length"`.)
#[tokio::test]
async fn a_streamed_call_sends_its_arguments_in_pieces() {
    let (s, _dir) = server().await;
    let mut b = body(json!({"tools": weather(), "parallel_tool_calls": false,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}));
    b["max_tokens"] = json!(60);
    // The forced call's JSON may have whitespace anywhere, and the tiny model likes it: its
    // whitespace tokens are biased away, so that it gets to the arguments.
    b["logit_bias"] =
        json!({"202": -100, "203": -100, "206": -100, "225": -100, "271": -100, "310": -100});
    let r = s.post("/v1/chat/completions", b.clone()).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    let choice = &v["choices"][0];
    // Cut off by max_tokens: `length`, as OpenAI reports it, with the call as written so far.
    assert_eq!(choice["finish_reason"], "length", "{v}");
    let calls = choice["message"]["tool_calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let whole = calls[0]["function"]["arguments"]
        .as_str()
        .expect("arguments");
    assert!(whole.starts_with('{'), "{whole}");

    b["stream"] = json!(true);
    b["logprobs"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let r = s.post("/v1/chat/completions", b).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("body");
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let (mut header, mut pieces, mut logprobs) = (None, Vec::new(), 0);
    let (mut finish, mut completion_tokens) = (None, None);
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).expect("chunk json");
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            completion_tokens = Some(n);
        }
        for c in v["choices"].as_array().expect("choices") {
            logprobs += c["logprobs"]["content"].as_array().map_or(0, Vec::len);
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
            for call in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(call["index"], 0, "{call}");
                if header.is_none() {
                    assert!(call["id"].as_str().is_some_and(|i| i.starts_with("call_")));
                    assert_eq!(call["type"], "function");
                    assert_eq!(call["function"]["arguments"], "");
                    header = Some(call["function"]["name"].clone());
                } else {
                    let mut keys: Vec<&String> = call.as_object().expect("delta").keys().collect();
                    keys.sort();
                    assert_eq!(keys, ["function", "index"], "{call}");
                    assert!(call["function"].get("name").is_none(), "{call}");
                    pieces.push(
                        call["function"]["arguments"]
                            .as_str()
                            .expect("a piece")
                            .to_string(),
                    );
                }
            }
        }
    }
    assert_eq!(header, Some(json!("get_weather")), "{text}");
    assert!(pieces.len() >= 2, "{pieces:?}");
    assert_eq!(pieces.concat(), whole, "{text}");
    assert_eq!(finish.as_deref(), Some("length"));
    assert_eq!(Some(logprobs as u64), completion_tokens, "{text}");
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn ollama_chat_takes_tools_and_tool_history() {
    let (s, _dir) = server().await;
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "21 C", "tool_name": "get_weather"}
    ]);
    for stream in [false, true] {
        let r = s
            .post(
                "/api/chat",
                json!({"model": "", "stream": stream, "messages": messages,
                "tools": weather(), "options": {"num_predict": 5, "temperature": 0}}),
            )
            .await;
        assert_eq!(r.status(), 200);
        let text = r.text().await.expect("body");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("ndjson"))
            .collect();
        let last = lines.last().expect("a line");
        assert_eq!(last["done"], true, "{text}");
        assert!(last["prompt_eval_count"].as_u64().is_some_and(|n| n > 20));
        for l in &lines {
            assert_eq!(l["message"]["role"], "assistant");
            if let Some(calls) = l["message"]["tool_calls"].as_array() {
                assert!(calls.iter().all(|c| c["function"]["arguments"].is_object()));
            }
        }
    }
    s.stop().await.expect("clean stop");
}
