//! Fuzz target: arbitrary bytes as a chat template, compiled and rendered through
//! `pagoda_model::chat_template` with a short conversation and a tool. Any panic, stack
//! overflow, timeout or runaway memory is a bug: a template comes from a client
//! (`/api/create`) or a model file, and must fail its one request at worst.
//!
//! The bytes up to the first NUL are the template (UTF-8, invalid sequences replaced); the
//! bytes after it, if any, are the content of the conversation's user message.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run chat_template corpus/chat_template seeds/chat_template`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pagoda_model::chat_template::{ChatMessage, ChatTemplate};

fuzz_target!(|data: &[u8]| {
    let (source, content) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b"Hello."[..]),
    };
    let source = String::from_utf8_lossy(source).into_owned();
    let Ok(template) = ChatTemplate::new(source, "<s>".into(), "</s>".into()) else {
        return;
    };
    let _ = template.check_limits();
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", String::from_utf8_lossy(content)),
    ];
    let tools = [serde_json::json!({"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})];
    let _ = template.render_with_tools(&messages, Some(&tools[..]), true);
    let _ = template.supports_tools();
});
