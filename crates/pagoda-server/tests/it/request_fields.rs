//! Request fields over HTTP (issue 22): structured output is accepted on the four generation
//! routes (OpenAI `response_format` / vLLM `guided_*`, Ollama `format`), bad shapes and
//! unknown fields are 400s naming the field, and the documented accepted-and-ignored fields
//! pass. What the constraint does to the text is the engine's (tested there).

use crate::harness::{config, expect_openai_error, start, tiny_llama};
use serde_json::{json, Value};

fn schema() -> Value {
    json!({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]})
}

fn chat() -> Value {
    json!({
        "model": tiny_llama(),
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
        "temperature": 0,
    })
}

fn completion() -> Value {
    json!({"model": tiny_llama(), "prompt": "hello", "max_tokens": 4, "temperature": 0})
}

fn ollama_chat() -> Value {
    json!({
        "model": tiny_llama(),
        "messages": [{"role": "user", "content": "hello"}],
        "stream": false,
        "options": {"num_predict": 4, "temperature": 0},
    })
}

fn ollama_generate() -> Value {
    json!({"model": tiny_llama(), "prompt": "hello", "stream": false, "options": {"num_predict": 4}})
}

fn with(mut body: Value, field: &str, value: Value) -> Value {
    body[field] = value;
    body
}

#[tokio::test]
async fn structured_output_requests_are_accepted_on_every_route() {
    let s = start(config()).await;
    let json_schema = json!({"type": "json_schema", "json_schema": {"name": "reply", "schema": schema(), "strict": true}});
    let openai = [
        (
            "/v1/chat/completions",
            with(chat(), "response_format", json_schema.clone()),
        ),
        (
            "/v1/chat/completions",
            with(chat(), "response_format", json!({"type": "json_object"})),
        ),
        (
            "/v1/chat/completions",
            with(chat(), "response_format", json!({"type": "text"})),
        ),
        (
            "/v1/chat/completions",
            with(chat(), "guided_choice", json!(["yes", "no"])),
        ),
        (
            "/v1/chat/completions",
            with(
                with(chat(), "response_format", json_schema.clone()),
                "stream",
                json!(true),
            ),
        ),
        (
            "/v1/completions",
            with(completion(), "guided_json", schema()),
        ),
        (
            "/v1/completions",
            with(completion(), "guided_regex", json!("[a-z]+")),
        ),
        (
            "/v1/completions",
            with(completion(), "response_format", json_schema),
        ),
        (
            "/v1/completions",
            with(
                completion(),
                "structured_outputs",
                json!({"grammar": "start: \"a\"+"}),
            ),
        ),
    ];
    for (route, body) in openai {
        let r = s.post(route, body.clone()).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        assert_eq!(status, 200, "{route} {body}: {text}");
    }
    let ollama = [
        ("/api/chat", with(ollama_chat(), "format", json!("json"))),
        ("/api/chat", with(ollama_chat(), "format", schema())),
        ("/api/generate", with(ollama_generate(), "format", schema())),
        (
            "/api/generate",
            with(ollama_generate(), "format", json!("")),
        ),
    ];
    for (route, body) in ollama {
        let r = s.post(route, body.clone()).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        assert_eq!(status, 200, "{route} {body}: {text}");
    }
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn bad_structured_output_is_a_400_naming_the_field() {
    let s = start(config()).await;
    let cases = [
        (
            "/v1/chat/completions",
            with(
                chat(),
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            ),
            "response_format.json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            with(
                chat(),
                "response_format",
                json!({"type": "json_schema", "json_schema": {"schema": schema()}}),
            ),
            "response_format.json_schema.name",
        ),
        (
            "/v1/chat/completions",
            with(
                chat(),
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}),
            ),
            "response_format.json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            with(chat(), "response_format", json!({"type": "yaml"})),
            "response_format.type",
        ),
        (
            "/v1/chat/completions",
            with(chat(), "guided_choice", json!([])),
            "guided_choice",
        ),
        (
            "/v1/completions",
            with(completion(), "guided_choice", json!(["a", 2])),
            "guided_choice",
        ),
        (
            "/v1/completions",
            with(
                with(completion(), "guided_regex", json!("a")),
                "guided_json",
                schema(),
            ),
            "guided_regex",
        ),
    ];
    for (route, body, param) in cases {
        let v = expect_openai_error(s.post(route, body.clone()).await, 400).await;
        assert_eq!(v["error"]["param"], param, "{route} {body}: {v}");
    }
    // Well-formed but refused by the grammar engine: the field that carried it is named.
    let refused = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}});
    for (route, body, param) in [
        (
            "/v1/chat/completions",
            with(
                chat(),
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": refused}}),
            ),
            "response_format",
        ),
        (
            "/v1/chat/completions",
            with(chat(), "guided_json", refused.clone()),
            "guided_json",
        ),
        (
            "/v1/completions",
            with(completion(), "guided_regex", json!("(unclosed")),
            "guided_regex",
        ),
    ] {
        let v = expect_openai_error(s.post(route, body.clone()).await, 400).await;
        assert_eq!(v["error"]["param"], param, "{route} {body}: {v}");
        assert_eq!(v["error"]["code"], "invalid_constraint", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(param)),
            "{v}"
        );
    }
    for (route, body) in [
        ("/api/chat", with(ollama_chat(), "format", json!("yaml"))),
        ("/api/generate", with(ollama_generate(), "format", json!(3))),
        ("/api/chat", with(ollama_chat(), "format", refused.clone())),
    ] {
        let r = s.post(route, body.clone()).await;
        assert_eq!(r.status(), 400, "{route} {body}");
        let v: Value = r.json().await.expect("json");
        assert!(
            v["error"].as_str().is_some_and(|m| m.contains("format")),
            "{v}"
        );
    }
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn unknown_fields_are_a_400_naming_them_on_every_generation_route() {
    let s = start(config()).await;
    for (route, body) in [
        ("/v1/chat/completions", chat()),
        ("/v1/completions", completion()),
    ] {
        let v = expect_openai_error(
            s.post(route, with(body.clone(), "frobnicate", json!(true)))
                .await,
            400,
        )
        .await;
        assert_eq!(v["error"]["param"], "frobnicate", "{route}: {v}");
        // A known-but-unsupported vLLM field is refused the same way.
        let v =
            expect_openai_error(s.post(route, with(body, "min_tokens", json!(3))).await, 400).await;
        assert_eq!(v["error"]["param"], "min_tokens", "{route}: {v}");
    }
    for (route, body) in [
        ("/api/chat", ollama_chat()),
        ("/api/generate", ollama_generate()),
    ] {
        for bad in [
            with(body.clone(), "frobnicate", json!(1)),
            with(
                body.clone(),
                "options",
                json!({"num_predict": 4, "mirostat": 2}),
            ),
            with(
                body.clone(),
                "options",
                json!({"num_predict": 4, "frob": 1}),
            ),
            with(body.clone(), "think", json!(true)),
        ] {
            let r = s.post(route, bad.clone()).await;
            assert_eq!(r.status(), 400, "{route} {bad}");
            let v: Value = r.json().await.expect("json");
            let message = v["error"].as_str().unwrap_or_default();
            let named = ["frobnicate", "options.mirostat", "options.frob", "think"]
                .iter()
                .any(|f| message.contains(&format!("`{f}`")));
            assert!(named, "{route} {bad}: {message}");
        }
    }
    // Inside nested objects too: stream_options, content parts, Ollama messages.
    let streamed = with(chat(), "stream", json!(true));
    let v = expect_openai_error(
        s.post(
            "/v1/chat/completions",
            with(
                streamed,
                "stream_options",
                json!({"include_usage": true, "frob": 1}),
            ),
        )
        .await,
        400,
    )
    .await;
    assert_eq!(v["error"]["param"], "stream_options.frob", "{v}");
    let parts = json!([{"role": "user", "content": [{"type": "text", "text": "hi", "frob": 1}]}]);
    let v = expect_openai_error(
        s.post("/v1/chat/completions", with(chat(), "messages", parts))
            .await,
        400,
    )
    .await;
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`frob`")),
        "{v}"
    );
    for messages in [
        json!([{"role": "user", "content": "hi", "frob": 1}]),
        json!([{"role": "user", "content": "hi", "name": "bob"}]),
    ] {
        let r = s
            .post(
                "/api/chat",
                with(ollama_chat(), "messages", messages.clone()),
            )
            .await;
        assert_eq!(r.status(), 400, "{messages}");
        let v: Value = r.json().await.expect("json");
        let message = v["error"].as_str().unwrap_or_default();
        assert!(
            message.contains("frob") || message.contains("`name`"),
            "{messages}: {message}"
        );
    }
    s.stop().await.expect("clean stop");
}

#[tokio::test]
async fn documented_compatibility_fields_are_accepted() {
    let s = start(config()).await;
    let mut c = chat();
    c["user"] = json!("end-user-1");
    c["metadata"] = json!({"run": "7"});
    c["store"] = json!(false);
    c["service_tier"] = json!("auto");
    c["modalities"] = json!(["text"]);
    c["parallel_tool_calls"] = json!(true);
    c["messages"] = json!([{"role": "user", "content": [
        {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}
    ]}]);
    c["stream"] = json!(true);
    c["stream_options"] = json!({"include_usage": true, "include_obfuscation": true});
    let r = s.post("/v1/chat/completions", c).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let mut oc = ollama_chat();
    oc["messages"] = json!([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "thinking": "they greet me",
         "tool_calls": [{"function": {"name": "now", "arguments": {}}}]},
        {"role": "tool", "content": "noon", "name": "now"},
    ]);
    let r = s.post("/api/chat", oc).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let mut g = ollama_generate();
    g["options"] =
        json!({"num_predict": 4, "num_ctx": 8192, "num_gpu": 99, "num_thread": 4, "stop": "\n"});
    g["think"] = json!(false);
    let r = s.post("/api/generate", g).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    s.stop().await.expect("clean stop");
}
