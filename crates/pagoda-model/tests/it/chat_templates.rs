//! The families' real chat templates (llama.cpp's `models/templates/`, copied into
//! `tests/golden/templates/`) render exactly as transformers renders them: plain, with a
//! system turn, with tools, with a call and its result, with reasoning in the history, and with
//! `enable_thinking` unset, true and false where the template reads it (and gpt-oss's
//! `reasoning_effort` unset, low and high). The goldens are
//! `scripts/golden_templates.py`'s.

use pagoda_model::chat_template::{ChatMessage, ChatTemplate, TemplateKwargs};
use serde_json::Value;

#[test]
fn chat_template_goldens() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
    let golden: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{dir}/chat_templates.json")).expect("golden"),
    )
    .expect("golden JSON");
    let tools = golden["tools"].as_array().expect("tools").clone();
    // The renders that write today's date (gpt-oss's `strftime_now`) were made on this day.
    let rendered_on = golden["rendered_on"].as_str().expect("rendered_on");
    let today = ChatTemplate::new(
        "{{ strftime_now('%Y-%m-%d') }}".into(),
        String::new(),
        String::new(),
    )
    .expect("date template")
    .render_with::<Value>(&[], None, false, &TemplateKwargs::new())
    .expect("today");
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in golden["cases"].as_array().expect("cases") {
        let name = case["template"].as_str().expect("template");
        let source = std::fs::read_to_string(format!("{dir}/templates/{name}")).expect("template");
        let template = ChatTemplate::new(source, "<BOS>".into(), "<EOS>".into()).expect(name);
        let conversation = case["conversation"].as_str().expect("conversation");
        let messages: Vec<ChatMessage> =
            serde_json::from_value(golden["conversations"][conversation].clone())
                .expect("messages");
        let kwargs: TemplateKwargs =
            serde_json::from_value(case["kwargs"].clone()).expect("kwargs");
        let with_tools = case["tools"].as_bool().unwrap_or(false);
        let got = template.render_with(
            &messages,
            with_tools.then_some(tools.as_slice()),
            true,
            &kwargs,
        );
        let what = format!("{name} / {conversation} / {}", case["kwargs"]);
        let expected = case["expected"]
            .as_str()
            .map(|e| e.replace(rendered_on, &today));
        match (expected.as_deref(), got) {
            (Some(expected), Ok(got)) if got == expected => {}
            (None, Err(_)) => {}
            (expected, got) => failures.push(format!(
                "{what}:\n  transformers: {expected:?}\n  pagoda:       {got:?}"
            )),
        }
        checked += 1;
    }
    assert!(checked >= 200, "{checked} renders checked");
    assert!(
        failures.is_empty(),
        "{} of {checked} renders differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Granite 4.0's chat template (the granite4h golden folder's, and its GGUF's copy) renders
/// the conversations above as transformers' renderer does
/// (`scripts/golden_granite4_template.py`).
#[test]
fn granite4_chat_template_renders_as_transformers() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
    let models = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden");
    let read = |p: String| -> Value {
        serde_json::from_str(&std::fs::read_to_string(&p).expect("golden")).expect("JSON")
    };
    let shared = read(format!("{dir}/chat_templates.json"));
    let golden = read(format!("{dir}/granite4h_chat_template.json"));
    let tools = shared["tools"].as_array().expect("tools").clone();
    for file in ["tiny-granite4h", "tiny-granite4h.gguf"] {
        let source = pagoda_model::open_model(std::path::Path::new(&format!("{models}/{file}")))
            .expect("model opens");
        let template = source.chat_template.expect("a chat template");
        for case in golden["cases"].as_array().expect("cases") {
            let conversation = case["conversation"].as_str().expect("conversation");
            let messages: Vec<ChatMessage> =
                serde_json::from_value(shared["conversations"][conversation].clone())
                    .expect("messages");
            let with_tools = case["tools"].as_bool().unwrap_or(false);
            let got = template
                .render_with(
                    &messages,
                    with_tools.then_some(tools.as_slice()),
                    true,
                    &TemplateKwargs::new(),
                )
                .unwrap_or_else(|e| panic!("{file} / {conversation}: {e}"));
            assert_eq!(
                got,
                case["expected"].as_str().expect("expected"),
                "{file} / {conversation}"
            );
        }
    }
}
