//! Chat templates rendered in `pagoda template-worker` processes (the pool the binary installs):
//! the same prompts as jinja2 renders, and a template's memory held to the worker's limit
//! while this process stays small and keeps rendering.

use pagoda_model::chat_template::{
    ChatMessage, ChatTemplate, TemplateFunctionCall, TemplateToolCall,
};
use pagoda_model::template_sandbox::{self, WorkerCommand};
use pagoda_model::ModelError;
use serde_json::Value;

fn install_pool() {
    // Tests of this binary may run in one process: the first installs the pool.
    let _ = template_sandbox::install(
        WorkerCommand {
            program: env!("CARGO_BIN_EXE_pagoda").into(),
            args: vec!["template-worker".into()],
        },
        2,
    );
}

/// An OpenAI message of the golden file as the template sees it (arguments as JSON values).
fn template_message(m: &Value) -> ChatMessage {
    let text = |k: &str| m[k].as_str().map(str::to_string);
    ChatMessage {
        role: text("role").unwrap(),
        content: text("content").unwrap_or_default(),
        tool_calls: m["tool_calls"].as_array().map(|calls| {
            calls
                .iter()
                .map(|c| TemplateToolCall {
                    id: c["id"].as_str().map(str::to_string),
                    kind: "function".into(),
                    function: TemplateFunctionCall {
                        name: c["function"]["name"].as_str().unwrap().into(),
                        arguments: serde_json::from_str(
                            c["function"]["arguments"].as_str().unwrap(),
                        )
                        .unwrap(),
                    },
                })
                .collect()
        }),
        tool_call_id: text("tool_call_id"),
        name: text("name"),
        reasoning_content: text("reasoning_content"),
    }
}

#[test]
fn worker_renders_tools_and_tool_calls_as_jinja2_does() {
    install_pool();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden");
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("chat_qwen25_tools.json")).unwrap(),
    )
    .unwrap();
    let t = ChatTemplate::new(
        g["chat_template"].as_str().unwrap().into(),
        String::new(),
        "<|im_end|>".into(),
    )
    .unwrap();
    for case in g["cases"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(template_message)
            .collect();
        let tools = case["tools"].as_array().cloned();
        let got = t
            .render_with_tools(&messages, tools.as_deref(), true)
            .unwrap();
        assert_eq!(
            got,
            case["rendered"].as_str().unwrap(),
            "case {}",
            case["name"]
        );
    }
}

#[test]
fn a_template_over_the_memory_limit_fails_its_render_and_the_next_render_works() {
    install_pool();
    let doubling = "{% set ns = namespace(s='xxxxxxxx') %}{% if messages[0].content == 'boom' %}\
                    {% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{% endif %}\
                    {{ ns.s | length }}";
    let t = ChatTemplate::new(doubling.into(), String::new(), String::new()).unwrap();
    let rss_before = rss_kib();
    let started = std::time::Instant::now();
    match t.render(&[ChatMessage::new("user", "boom")], true) {
        Err(ModelError::TemplateLimit(m)) => assert!(m.contains("MiB of memory"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
    assert!(
        rss_kib() < rss_before + 100 * 1024,
        "{} -> {}",
        rss_before,
        rss_kib()
    );
    // A new worker takes the next render.
    assert_eq!(
        t.render(&[ChatMessage::new("user", "hi")], true).unwrap(),
        "8"
    );
    // Many renders at once, more than the pool's workers: each gets its answer.
    std::thread::scope(|s| {
        for i in 0..6 {
            let t = &t;
            s.spawn(move || {
                let content = if i == 3 { "boom" } else { "hi" };
                let r = t.render(&[ChatMessage::new("user", content)], true);
                assert_eq!(r.is_ok(), i != 3, "{r:?}");
            });
        }
    });
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}
