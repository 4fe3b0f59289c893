use super::*;
use pagoda_model::chat_template::{ChatTemplate, TemplateFunctionCall, TemplateToolCall};
use pagoda_protocol::openai::chat::{ChatCompletionRequest, FunctionDefinition};
use serde_json::json;

fn tool(name: &str, params: Value) -> Tool {
    Tool {
        kind: "function".into(),
        function: Some(FunctionDefinition {
            name: Some(name.into()),
            description: Some(format!("{name} things")),
            parameters: Some(params),
            strict: None,
            extra: Default::default(),
        }),
        extra: Default::default(),
    }
}

fn weather() -> Tool {
    tool(
        "get_weather",
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    )
}

fn req(body: Value) -> ChatCompletionRequest {
    serde_json::from_value(body).unwrap()
}

fn err(body: Value) -> RequestError {
    let r = req(body);
    crate::openai::chat::check(&r).unwrap_err()
}

#[test]
fn choices_map_to_tool_sets() {
    let t = vec![weather()];
    let mode = |m: &str| ToolChoice::Mode(m.into());
    assert_eq!(check_openai(None, None, None, None, None).unwrap(), None);
    assert_eq!(
        check_openai(Some(&t), None, None, None, None)
            .unwrap()
            .unwrap()
            .choice,
        Choice::Auto
    );
    assert_eq!(
        check_openai(Some(&t), Some(&mode("none")), None, None, None).unwrap(),
        None
    );
    assert_eq!(
        check_openai(Some(&[]), Some(&mode("auto")), None, None, None).unwrap(),
        None
    );
    let r = check_openai(Some(&t), Some(&mode("required")), Some(false), None, None)
        .unwrap()
        .unwrap();
    assert_eq!(r.choice, Choice::Required);
    assert!(!r.parallel);
}

#[test]
fn every_bad_tool_input_is_a_400_naming_the_field() {
    let base = |extra: Value| {
        let mut b = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let w = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}});
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            base(json!({"tools": [{"type": "function", "function": {"description": "x"}}]})),
            "tools",
            "tools[0].function.name is missing",
        ),
        (
            base(json!({"tools": [{"type": "function"}]})),
            "tools",
            "tools[0].function is missing",
        ),
        (
            base(json!({"tools": [{"type": "retrieval", "function": {"name": "a"}}]})),
            "tools",
            "tools[0].type",
        ),
        (
            base(
                json!({"tools": [w, {"type": "function", "function": {"name": "x", "parameters": [1]}}]}),
            ),
            "tools",
            "tools[1].function.parameters",
        ),
        (
            base(
                json!({"tools": [{"type": "function", "function": {"name": "a", "examples": []}}]}),
            ),
            "tools",
            "`tools[0].function.examples`",
        ),
        (
            base(
                json!({"tools": [{"type": "function", "function": {"name": "a"}, "cache_control": {}}]}),
            ),
            "tools",
            "`tools[0].cache_control`",
        ),
        (
            base(json!({"tools": [w, w]})),
            "tools",
            "tools[1].function.name `get_weather` is given twice",
        ),
        (
            base(json!({"tools": [{"type": "function", "function": {"name": "a b"}}]})),
            "tools",
            "tools[0].function.name `a b`",
        ),
        (
            base(
                json!({"tools": [w], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            ),
            "tool_choice",
            "`nope`",
        ),
        (
            base(json!({"tools": [w], "tool_choice": "sometimes"})),
            "tool_choice",
            "`sometimes`",
        ),
        (
            base(json!({"tool_choice": "required"})),
            "tool_choice",
            "no `tools`",
        ),
        (
            base(json!({"functions": [{"name": "f"}]})),
            "functions",
            "deprecated",
        ),
        (
            base(json!({"function_call": "auto"})),
            "function_call",
            "deprecated",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]}),
            "messages",
            "messages[1].tool_call_id `call_x` matches no tool call",
        ),
        (
            json!({"model": "m", "messages": [{"role": "tool", "content": "1"}]}),
            "messages",
            "messages[0].tool_call_id is missing",
        ),
        (
            json!({"model": "m", "messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]}),
            "messages",
            "messages[0].tool_calls[0].function.arguments is not JSON",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
            "messages",
            "messages[0].tool_calls",
        ),
    ];
    for (body, param, msg) in cases {
        let e = err(body.clone());
        assert_eq!(e.param_name(), Some(param), "{body} → {e:?}");
        assert!(e.message.contains(msg), "{body} → {}", e.message);
    }
}

#[test]
fn a_tool_round_trip_history_passes() {
    let r = req(
        json!({"model": "m", "tools": [{"type": "function", "function": {"name": "get_weather"}}], "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "22C"}
        ]}),
    );
    let checked = crate::openai::chat::check(&r).unwrap();
    assert_eq!(
        checked.offered_tools().map(|o| o.names),
        Some(vec!["get_weather".to_string()])
    );
}

/// A forced call is written in the model's own markup where there is a grammar of it
/// (Qwen3-Coder, Qwen3.5), and its output is parsed in the format it is written in: the JSON
/// form (Hermes) for every other model, and for a schema the markup cannot hold.
#[test]
fn a_forced_call_is_parsed_in_the_form_it_is_forced_in() {
    let set = ToolSet {
        tools: vec![weather()],
        choice: Choice::Required,
        parallel: false,
    };
    let native = forced_call(&set, true, ToolCallFormat::Qwen3Coder).expect("forced");
    assert_eq!(native.format, ToolCallFormat::Qwen3Coder);
    let ConstraintSpec::Lark(g) = &native.constraint else {
        panic!("{native:?}")
    };
    assert!(g.contains("<function=get_weather>"), "{g}");
    // The fallback prompt (a template without tools) asks for the JSON form.
    let fallback = forced_call(&set, false, ToolCallFormat::Qwen3Coder).expect("forced");
    assert_eq!(fallback.format, ToolCallFormat::Hermes);
    let patterned = ToolSet {
        tools: vec![tool(
            "get_weather",
            json!({"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}}}),
        )],
        ..set.clone()
    };
    let json_form = forced_call(&patterned, true, ToolCallFormat::Qwen3Coder).expect("forced");
    assert_eq!(json_form.format, ToolCallFormat::Hermes);
    for other in [
        ToolCallFormat::Mistral,
        ToolCallFormat::Llama3,
        ToolCallFormat::Gemma4,
    ] {
        let f = forced_call(&set, true, other).expect("forced");
        assert_eq!(f.format, ToolCallFormat::Hermes, "{other:?}");
    }
}

#[test]
fn forced_grammar_for_required_and_named() {
    let set = ToolSet {
        tools: vec![weather(), tool("now", json!({"type": "object"}))],
        choice: Choice::Required,
        parallel: true,
    };
    let Some(ConstraintSpec::Lark(g)) =
        forced_call(&set, true, ToolCallFormat::Hermes).map(|f| f.constraint)
    else {
        panic!()
    };
    assert_eq!(
        g.lines().take(2).collect::<Vec<_>>(),
        [
            "start: call (\"\\n\" call)*",
            "call: \"<tool_call>\\n\" (fn_0 | fn_1) \"\\n</tool_call>\""
        ]
    );
    assert!(g.contains("fn_0: %json {\"x-guidance\": {\"whitespace_pattern\": \"[\\\\x20\\\\x0A\\\\x0D\\\\x09]{1,16}\"}, \"type\": \"object\", \"properties\": {\"name\": {\"const\": \"get_weather\"}, \"arguments\": {\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],\"additionalProperties\":false}}, \"required\": [\"name\", \"arguments\"], \"additionalProperties\": false}"), "{g}");
    // The parameters are closed (only the listed keys), as a json_schema response format is.
    // Every %json body is valid JSON.
    for l in g.lines().filter(|l| l.contains("%json")) {
        let body = &l[l.find('{').unwrap()..];
        serde_json::from_str::<Value>(body).unwrap();
    }
    let named = ToolSet {
        choice: Choice::Named("now".into()),
        parallel: false,
        ..set.clone()
    };
    let Some(ConstraintSpec::Lark(g)) =
        forced_call(&named, false, ToolCallFormat::Hermes).map(|f| f.constraint)
    else {
        panic!()
    };
    assert!(
        g.starts_with("start: call\ncall: \"<tool_call>\" (fn_0) \"</tool_call>\"\n"),
        "{g}"
    );
    assert!(
        g.contains("{\"const\": \"now\"}") && !g.contains("get_weather"),
        "{g}"
    );
    let auto = ToolSet {
        choice: Choice::Auto,
        ..set
    };
    assert_eq!(forced_call(&auto, true, ToolCallFormat::Hermes), None);
}

#[test]
fn knobs_carry_the_forced_call_only_when_forced() {
    // The knobs need a model only for its template and stops; the constraint comes from the
    // request alone (tested through forced_call above). Here: `auto` and `none` force nothing.
    for choice in ["auto", "none"] {
        let r = req(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": choice}),
        );
        let set = crate::openai::chat::tool_set(&r).unwrap();
        assert!(set.is_none_or(|s| forced_call(&s, true, ToolCallFormat::Hermes).is_none()));
    }
}

#[test]
fn fallback_lists_tools_and_writes_history_as_text() {
    let set = ToolSet {
        tools: vec![weather()],
        choice: Choice::Auto,
        parallel: true,
    };
    let mut a = ChatMessage::new("assistant", "");
    a.tool_calls = Some(vec![TemplateToolCall {
        id: Some("call_1".into()),
        kind: "function".into(),
        function: TemplateFunctionCall {
            name: "get_weather".into(),
            arguments: json!({"city": "Paris"}),
        },
    }]);
    let mut t1 = ChatMessage::new("tool", "22C");
    t1.name = Some("get_weather".into());
    let t2 = ChatMessage::new("tool", "sunny");
    let out = fallback_messages(
        vec![ChatMessage::new("user", "weather?"), a, t1, t2],
        Some(&set),
    );
    let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert!(out[0].content.starts_with("# Tools\n"));
    assert!(out[0].content.contains("{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"get_weather things\",\"parameters\":"));
    assert!(out[0].content.ends_with("<tool_call>{\"name\": <function-name>, \"arguments\": <the arguments as a JSON object>}</tool_call>"));
    assert_eq!(
        out[2].content,
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}</tool_call>"
    );
    assert_eq!(
        out[3].content,
        "<tool_response name=\"get_weather\">\n22C\n</tool_response>\n<tool_response name=\"tool\">\nsunny\n</tool_response>"
    );
    // What the fallback asks for is what the parser reads.
    let p = parse_output(&out[2].content);
    assert_eq!(p.calls[0].name, "get_weather");
    // An existing system message gets the section appended.
    let out = fallback_messages(vec![ChatMessage::new("system", "Be brief.")], Some(&set));
    assert!(out[0].content.starts_with("Be brief.\n\n# Tools\n"));
    assert_eq!(out.len(), 1);
}

/// Qwen2.5's own template (tests/golden/chat_qwen25_tools.json, rendered by jinja2 as
/// transformers does) renders tools, calls and results as Pagoda passes them.
#[test]
fn qwen25_template_with_tools_matches_jinja2() {
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
    assert!(t.supports_tools());
    for case in g["cases"].as_array().unwrap() {
        let r: ChatCompletionRequest = serde_json::from_value(json!({
            "model": "m", "messages": case["messages"], "tools": case["tools"]
        }))
        .unwrap();
        crate::openai::chat::check(&r).unwrap();
        let messages = crate::openai::chat::template_messages_for_test(&r).unwrap();
        let set = crate::openai::chat::tool_set(&r).unwrap();
        let got = t
            .render_with_tools(&messages, set.as_ref().map(|s| s.tools.as_slice()), true)
            .unwrap();
        assert_eq!(
            got,
            case["rendered"].as_str().unwrap(),
            "case {}",
            case["name"]
        );
    }
}

/// What the official client's stream accumulator does: content concatenated, each call's
/// pieces merged by `index` (name from the header, arguments concatenated).
fn reassemble(
    deltas: &[pagoda_protocol::openai::chat::ToolCallDelta],
) -> Vec<(String, String, String)> {
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for d in deltas {
        if d.index == calls.len() {
            calls.push(Default::default());
        }
        let c = &mut calls[d.index];
        if let Some(id) = &d.id {
            c.0 = id.clone();
        }
        if let Some(f) = &d.function {
            if let Some(n) = &f.name {
                c.1.push_str(n);
            }
            if let Some(a) = &f.arguments {
                c.2.push_str(a);
            }
        }
    }
    calls
}

#[test]
fn streamed_deltas_reassemble_to_the_whole_response() {
    // A streamed call (name first, arguments an object), another, and a whole one
    // (`parameters`), sent as its two deltas at its end.
    let text = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>{\"name\": \"w\", \"parameters\": {\"b\": 1, \"a\": 2}}</tool_call>";
    let whole = parse_output(text);
    for step in 1..text.len() {
        let mut p = ToolCallParser::default();
        let (mut content, mut deltas) = (String::new(), Vec::new());
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + step).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            pieces.extend(p.push(&text[at..end]));
            at = end;
        }
        pieces.extend(p.finish());
        // The header: index, id, type, name and empty arguments; then only index and
        // arguments.
        let check_head = |head: &pagoda_protocol::openai::chat::ToolCallDelta| {
            assert!(head
                .id
                .as_deref()
                .is_some_and(|i| i.starts_with("call_") && i.len() == 29));
            assert_eq!(head.kind.as_deref(), Some("function"));
            assert_eq!(
                head.function.as_ref().unwrap().arguments.as_deref(),
                Some("")
            );
        };
        let check_args = |d: &pagoda_protocol::openai::chat::ToolCallDelta| {
            assert!(d.id.is_none() && d.kind.is_none());
            assert!(d.function.as_ref().unwrap().name.is_none());
        };
        let mut n = 0;
        let mut argument_pieces = [0; 3];
        for piece in pieces {
            match piece {
                Piece::Content(c) => content.push_str(&c),
                Piece::CallStart { name } => {
                    let head = crate::openai::chat::call_start_delta(name, n);
                    check_head(&head);
                    deltas.push(head);
                    n += 1;
                }
                Piece::CallArguments(a) => {
                    argument_pieces[n - 1] += 1;
                    let d = crate::openai::chat::arguments_delta(a, n - 1);
                    check_args(&d);
                    deltas.push(d);
                }
                Piece::CallEnd { .. } | Piece::Reasoning(_) => {}
                Piece::Call(c) => {
                    let [head, args] = crate::openai::chat::call_deltas(c, n);
                    check_head(&head);
                    check_args(&args);
                    argument_pieces[n] += 1;
                    deltas.push(head);
                    deltas.push(args);
                    n += 1;
                }
            }
        }
        assert_eq!(content, "Sure.");
        let calls = reassemble(&deltas);
        let names: Vec<(&str, &str)> = calls.iter().map(|c| (c.1.as_str(), c.2.as_str())).collect();
        assert_eq!(
            names,
            [
                ("get_weather", "{\"city\": \"Paris\"}"),
                ("now", "{}"),
                ("w", "{\"b\":1,\"a\":2}")
            ]
        );
        // The non-streamed response gives the same calls.
        let whole: Vec<(&str, &str)> = whole
            .calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(names, whole);
        assert_ne!(calls[0].0, calls[1].0);
        // The streamed call's arguments come in pieces as they are written; the whole one
        // in one.
        if step == 1 {
            assert_eq!(argument_pieces[0], "{\"city\": \"Paris\"}".len());
        }
        assert_eq!(argument_pieces[2], 1);
    }
}

/// The other families' calls through the route's deltas: a header (id, name, empty
/// arguments) as soon as the name is known, then the arguments in pieces, reassembling to
/// the non-streamed response's calls.
#[test]
fn every_familys_streamed_deltas_reassemble_to_the_whole_response() {
    use crate::tools::formats::ToolCallFormat;
    use crate::tools::output::{parse_reply, OutputFormats};
    for (tools, text) in [
        (ToolCallFormat::Qwen3Coder, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"),
        (ToolCallFormat::Mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}"),
        (ToolCallFormat::Phi4, "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]<|/tool_call|>"),
        (ToolCallFormat::Llama3, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
        (ToolCallFormat::Gemma4, "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"),
    ] {
        let f = OutputFormats {
            tools,
            ..OutputFormats::default()
        };
        // `city` typed as a string: Qwen3-Coder's value streams as it is written.
        let offered = || {
            let mut o = crate::tools::Offered::from(vec!["get_weather".to_string()]);
            o.string_params
                .insert("get_weather".into(), ["city".to_string()].into());
            Some(o)
        };
        let (_, whole) = parse_reply(text, offered(), f);
        assert_eq!(whole.calls.len(), 1, "{tools:?}");
        let mut p = OutputParser::with_formats(offered(), f);
        let mut deltas = Vec::new();
        let mut n = 0;
        let mut pieces = Vec::new();
        for c in text.chars() {
            pieces.extend(p.push(&c.to_string()));
        }
        pieces.extend(p.finish());
        for piece in pieces {
            match piece {
                Piece::CallStart { name } => {
                    deltas.push(crate::openai::chat::call_start_delta(name, n));
                    n += 1;
                }
                Piece::CallArguments(a) => {
                    deltas.push(crate::openai::chat::arguments_delta(a, n - 1))
                }
                Piece::CallEnd { .. } => {}
                other => panic!("{tools:?}: {other:?}"),
            }
        }
        let head = &deltas[0];
        assert!(head.id.as_deref().is_some_and(|i| i.starts_with("call_")));
        let function = head.function.as_ref().unwrap();
        assert_eq!(function.name.as_deref(), Some("get_weather"));
        assert_eq!(function.arguments.as_deref(), Some(""));
        assert!(deltas.len() > 5, "{tools:?}: {} deltas", deltas.len());
        let calls = reassemble(&deltas);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].1, "get_weather");
        assert_eq!(calls[0].2, whole.calls[0].arguments, "{tools:?}");
        assert_eq!(calls[0].2, "{\"city\":\"Paris\"}", "{tools:?}");
    }
}

#[test]
fn offered_tools_carry_their_string_typed_parameters() {
    let set = ToolSet {
        tools: vec![
            tool(
                "get_weather",
                json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": ["string", "null"]}, "any": {}}}),
            ),
            tool("now", json!({"type": "object"})),
        ],
        choice: Choice::Auto,
        parallel: true,
    };
    let o = set.offered();
    assert_eq!(o.names, ["get_weather", "now"]);
    assert_eq!(
        o.string_params,
        [(
            "get_weather".to_string(),
            ["city".to_string(), "zip".to_string()].into()
        )]
        .into()
    );
}
