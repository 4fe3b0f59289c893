//! Each family's calls parsed whole and streamed: the same calls, content and reasoning for
//! every split of the output into two deltas and for one character at a time; bad markup
//! stays content.

use super::super::output::{parse_reply, OutputFormats, OutputParser};
use super::super::parse::{collect, ParsedOutput, Piece};
use super::*;
use crate::formats::reasoning::ReasoningFormat;
use proptest::prelude::*;

fn offered() -> Vec<String> {
    vec!["get_weather".into(), "now".into()]
}

fn formats(tools: ToolCallFormat) -> OutputFormats {
    OutputFormats {
        tools,
        reasoning: None,
        reasoning_open: false,
    }
}

/// The reply of `text` parsed whole, checked to be what every split gives.
fn split_invariant(text: &str, f: OutputFormats) -> (Option<String>, ParsedOutput) {
    let whole = parse_reply(text, Some(offered().into()), f);
    let gather = |pieces: Vec<Piece>| (super::super::reasoning_of(&pieces), collect(pieces));
    for at in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
        let mut p = OutputParser::with_formats(Some(offered().into()), f);
        let mut pieces = p.push(&text[..at]);
        pieces.extend(p.push(&text[at..]));
        pieces.extend(p.finish());
        assert_eq!(gather(pieces), whole, "{text:?} split at {at}");
    }
    let mut p = OutputParser::with_formats(Some(offered().into()), f);
    let mut pieces = Vec::new();
    for c in text.chars() {
        pieces.extend(p.push(&c.to_string()));
    }
    pieces.extend(p.finish());
    assert_eq!(gather(pieces), whole, "{text:?} by characters");
    whole
}

fn call(name: &str, args: serde_json::Value) -> ParsedCall {
    ParsedCall {
        name: name.into(),
        arguments: args.to_string(),
    }
}

#[test]
fn detection_follows_the_templates_markup() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../pagoda-model/tests/golden/templates"
    );
    for (name, want) in [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", ToolCallFormat::Hermes),
        ("Qwen-Qwen3-0.6B.jinja", ToolCallFormat::Hermes),
        ("Qwen-QwQ-32B.jinja", ToolCallFormat::Hermes),
        ("Qwen3-Coder.jinja", ToolCallFormat::Qwen3Coder),
        ("Qwen3.5-4B.jinja", ToolCallFormat::Qwen3Coder),
        (
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            ToolCallFormat::Llama3,
        ),
        (
            "meta-llama-Llama-3.2-3B-Instruct.jinja",
            ToolCallFormat::Llama3,
        ),
        (
            "meta-llama-Llama-3.3-70B-Instruct.jinja",
            ToolCallFormat::Llama3,
        ),
        ("google-gemma-4-31B-it.jinja", ToolCallFormat::Gemma4),
        (
            "google-gemma-4-31B-it-interleaved.jinja",
            ToolCallFormat::Gemma4,
        ),
        (
            "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
            ToolCallFormat::Mistral,
        ),
        (
            "Mistral-Small-3.2-24B-Instruct-2506.jinja",
            ToolCallFormat::Mistral,
        ),
        ("openai-gpt-oss-120b.jinja", ToolCallFormat::Harmony),
    ] {
        let source = std::fs::read_to_string(format!("{dir}/{name}")).expect(name);
        assert_eq!(ToolCallFormat::detect(&source), want, "{name}");
    }
    for (name, want) in [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", None),
        ("Qwen-Qwen3-0.6B.jinja", Some(ReasoningFormat::Think)),
        ("Qwen3.5-4B.jinja", Some(ReasoningFormat::Think)),
        (
            "HuggingFaceTB-SmolLM3-3B.jinja",
            Some(ReasoningFormat::Think),
        ),
        (
            "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
            Some(ReasoningFormat::Think),
        ),
        (
            "google-gemma-4-31B-it.jinja",
            Some(ReasoningFormat::GemmaChannel),
        ),
        (
            "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
            Some(ReasoningFormat::MistralThink),
        ),
        ("Mistral-Small-3.2-24B-Instruct-2506.jinja", None),
        ("openai-gpt-oss-120b.jinja", Some(ReasoningFormat::Harmony)),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", None),
    ] {
        let source = std::fs::read_to_string(format!("{dir}/{name}")).expect(name);
        assert_eq!(ReasoningFormat::detect(&source), want, "{name}");
    }
}

#[test]
fn qwen3_coder_calls() {
    let text = "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"c\"}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>";
    let (_, p) = split_invariant(text, formats(ToolCallFormat::Qwen3Coder));
    assert_eq!(p.content.as_deref(), Some("Checking."));
    assert_eq!(
        p.calls,
        vec![
            call(
                "get_weather",
                serde_json::json!({"city": "New York", "days": 3, "opts": {"unit": "c"}})
            ),
            call("now", serde_json::json!({})),
        ]
    );
}

#[test]
fn mistral_calls_both_forms() {
    let f = formats(ToolCallFormat::Mistral);
    let text = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]now[CALL_ID]abc123def[ARGS]{}";
    let (_, p) = split_invariant(text, f);
    assert_eq!(p.content, None);
    assert_eq!(
        p.calls,
        vec![
            call("get_weather", serde_json::json!({"city": "Paris"})),
            call("now", serde_json::json!({}))
        ]
    );
    let text = "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]";
    let (_, p) = split_invariant(text, f);
    assert_eq!(p.calls.len(), 2);
    assert_eq!(
        p.calls[1],
        call("get_weather", serde_json::json!({"city": "Oslo"}))
    );
}

#[test]
fn llama3_bare_json_and_python_tag() {
    let f = formats(ToolCallFormat::Llama3);
    let (_, p) = split_invariant(
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
        f,
    );
    assert_eq!(
        p.calls,
        vec![call("get_weather", serde_json::json!({"city": "Rome"}))]
    );
    let (_, p) = split_invariant(
        "<|python_tag|>{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
        f,
    );
    assert_eq!(p.calls.len(), 2);
    let (_, p) = split_invariant(
        "<|python_tag|>brave_search.call(query=\"weather, \\\"Rome\\\"\", n=3, fresh=True)",
        f,
    );
    assert_eq!(
        p.calls,
        vec![call(
            "brave_search",
            serde_json::json!({"query": "weather, \"Rome\"", "n": 3, "fresh": true})
        )]
    );
    // Prose is content at once.
    let (_, p) = split_invariant("It is sunny.", f);
    assert_eq!(p.content.as_deref(), Some("It is sunny."));
}

#[test]
fn phi4_calls() {
    let (_, p) = split_invariant(
        "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\"}}]<|/tool_call|>",
        formats(ToolCallFormat::Phi4),
    );
    assert_eq!(
        p.calls,
        vec![call("get_weather", serde_json::json!({"city": "Lima"}))]
    );
}

#[test]
fn gemma4_calls() {
    let text = "<|tool_call>call:get_weather{city:<|\"|>Paris, France<|\"|>,days:3,opts:{metric:true,tags:[<|\"|>a<|\"|>,null]}}<tool_call|><|tool_call>call:now{}<tool_call|>";
    let (_, p) = split_invariant(text, formats(ToolCallFormat::Gemma4));
    assert_eq!(p.content, None);
    assert_eq!(
        p.calls,
        vec![
            call(
                "get_weather",
                serde_json::json!({"city": "Paris, France", "days": 3, "opts": {"metric": true, "tags": ["a", null]}})
            ),
            call("now", serde_json::json!({})),
        ]
    );
}

#[test]
fn reasoning_then_calls() {
    let f = OutputFormats {
        tools: ToolCallFormat::Hermes,
        reasoning: Some(ReasoningFormat::Think),
        reasoning_open: false,
    };
    let (r, p) = split_invariant(
        "<think>\nNeed weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>",
        f,
    );
    assert_eq!(r.as_deref(), Some("Need weather."));
    assert_eq!(p.content, None);
    assert_eq!(
        p.calls,
        vec![call("get_weather", serde_json::json!({"city": "Paris"}))]
    );
    let f = OutputFormats {
        tools: ToolCallFormat::Gemma4,
        reasoning: Some(ReasoningFormat::GemmaChannel),
        reasoning_open: false,
    };
    let (r, p) = split_invariant(
        "<|channel>thought\nHmm.<channel|>Sure.<|tool_call>call:now{}<tool_call|>",
        f,
    );
    assert_eq!(r.as_deref(), Some("Hmm."));
    assert_eq!(p.content.as_deref(), Some("Sure."));
    assert_eq!(p.calls.len(), 1);
}

#[test]
fn bad_markup_stays_content() {
    for (format, text) in [
        (
            ToolCallFormat::Qwen3Coder,
            "<tool_call>not xml</tool_call> after",
        ),
        (ToolCallFormat::Qwen3Coder, "<tool_call>\n<function=get_wea"),
        (ToolCallFormat::Mistral, "[TOOL_CALLS]not a call"),
        (
            ToolCallFormat::Llama3,
            "<|python_tag|>{\"name\": \"x\", \"parameters\": [1]}",
        ),
        (
            ToolCallFormat::Phi4,
            "<|tool_call|>[{\"name\": 1}]<|/tool_call|>",
        ),
        (ToolCallFormat::Phi4, "<|tool_call|>[{\"name\": \"now\""),
        (ToolCallFormat::Gemma4, "<|tool_call>call:now"),
        (ToolCallFormat::Gemma4, "text <|tool_"),
    ] {
        let (_, p) = split_invariant(text, formats(format));
        assert!(p.calls.is_empty(), "{format:?} {text}");
        assert_eq!(p.content.as_deref(), Some(text), "{format:?}");
    }
}

/// Once its name is read a call is streamed, and never taken back: a block cut off (or
/// with markup the reader does not know) ends the call where it is.
#[test]
fn started_calls_end_where_the_block_ends() {
    for (format, text, args) in [
        (
            ToolCallFormat::Qwen3Coder,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis",
            "{\"city\":\"Paris\"}",
        ),
        (
            ToolCallFormat::Qwen3Coder,
            "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\njunk</tool_call>",
            "{\"days\":3}",
        ),
        (
            ToolCallFormat::Mistral,
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": ",
            "{\"city\":",
        ),
        (ToolCallFormat::Mistral, "[TOOL_CALLS]now[CALL_ID]ab", "{}"),
        (
            ToolCallFormat::Gemma4,
            "<|tool_call>call:now{a:<|\"|>x}<tool_call|>",
            "{\"a\":\"x}\"}",
        ),
        (ToolCallFormat::Gemma4, "<|tool_call>call:now{", "{}"),
        (
            ToolCallFormat::Gemma4,
            "<|tool_call>call:now{a:[1,{b:",
            "{\"a\":[1,{\"b\":null}]}",
        ),
        (
            ToolCallFormat::Phi4,
            "<|tool_call|>[{\"name\": \"now\", \"arguments\": {\"a\": [1, ",
            "{\"a\":[1,",
        ),
    ] {
        let (_, p) = split_invariant(text, formats(format));
        assert_eq!(p.content, None, "{format:?} {text}");
        assert_eq!(p.calls.len(), 1, "{format:?} {text}");
        assert_eq!(p.calls[0].arguments, args, "{format:?} {text}");
    }
}

/// The streamed view of `pieces`: each call's name and its arguments as the deltas give
/// them (a whole call's at once).
fn streamed(pieces: &[Piece]) -> Vec<(String, String)> {
    let mut calls: Vec<(String, String)> = Vec::new();
    for p in pieces {
        match p {
            Piece::CallStart { name } => calls.push((name.clone(), String::new())),
            Piece::CallArguments(a) => calls.last_mut().expect("a call started").1.push_str(a),
            Piece::Call(c) => calls.push((c.name.clone(), c.arguments.clone())),
            _ => {}
        }
    }
    calls
}

/// The pieces of `text` pushed in `cuts`-chosen deltas.
fn pieces_in(text: &str, cuts: &[usize], f: OutputFormats) -> Vec<Piece> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|c| {
            let mut i = c % (text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            i
        })
        .collect();
    at.push(0);
    at.push(text.len());
    at.sort_unstable();
    at.dedup();
    let mut p = OutputParser::with_formats(Some(schemas()), f);
    let mut pieces = Vec::new();
    for w in at.windows(2) {
        pieces.extend(p.push(&text[w[0]..w[1]]));
    }
    pieces.extend(p.finish());
    pieces
}

/// The offered tools with their schemas: `get_weather`'s `city` and `note` are strings.
fn schemas() -> crate::tools::Offered {
    let mut o = crate::tools::Offered::from(offered());
    o.string_params.insert(
        "get_weather".into(),
        ["city".to_string(), "note".to_string()].into(),
    );
    o
}

#[test]
fn qwen3_coder_values_follow_the_schema() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n1984\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=note>\nsay \"hi\"\nok\n</parameter>\n</function>\n</tool_call>";
    let f = formats(ToolCallFormat::Qwen3Coder);
    let (_, p) = parse_reply(text, Some(schemas()), f);
    assert_eq!(
        p.calls,
        vec![call(
            "get_weather",
            serde_json::json!({"city": "1984", "days": 3, "note": "say \"hi\"\nok"})
        )]
    );
    // Without the schema, a number is a number.
    let (_, p) = parse_reply(text, Some(offered().into()), f);
    assert_eq!(
        p.calls[0].arguments,
        "{\"city\":1984,\"days\":3,\"note\":\"say \\\"hi\\\"\\nok\"}"
    );
}

#[test]
fn first_deltas_give_the_name_then_the_arguments_grow() {
    // (format, the text up to where the name is known, the rest)
    for (format, head, rest, args) in [
        (
            ToolCallFormat::Qwen3Coder,
            "<tool_call>\n<function=get_weather>",
            "\n<parameter=city>\nNew York\n</parameter>\n</function>\n</tool_call>",
            "{\"city\":\"New York\"}",
        ),
        (
            ToolCallFormat::Mistral,
            "[TOOL_CALLS]get_weather[ARGS]",
            "{\"city\": \"New York\"}",
            "{\"city\":\"New York\"}",
        ),
        (
            ToolCallFormat::Phi4,
            "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {",
            "\"city\": \"New York\"}}]<|/tool_call|>",
            "{\"city\":\"New York\"}",
        ),
        (
            ToolCallFormat::Llama3,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {",
            "\"city\": \"New York\"}}",
            "{\"city\":\"New York\"}",
        ),
        (
            ToolCallFormat::Gemma4,
            "<|tool_call>call:get_weather{",
            "city:<|\"|>New York<|\"|>}<tool_call|>",
            "{\"city\":\"New York\"}",
        ),
    ] {
        let mut p = OutputParser::with_formats(Some(schemas()), formats(format));
        let first = p.push(head);
        assert_eq!(
            first.first(),
            Some(&Piece::CallStart {
                name: "get_weather".into()
            }),
            "{format:?}: {first:?}"
        );
        assert_eq!(p.calls(), 1);
        let mut fragments = 0;
        let mut sent: String = first
            .iter()
            .filter_map(|x| match x {
                Piece::CallArguments(a) => Some(a.as_str()),
                _ => None,
            })
            .collect();
        for c in rest.chars() {
            for piece in p.push(&c.to_string()) {
                match piece {
                    Piece::CallArguments(a) => {
                        fragments += 1;
                        sent.push_str(&a);
                    }
                    Piece::CallEnd { call, .. } => assert_eq!(call.arguments, args),
                    other => panic!("{format:?}: {other:?}"),
                }
            }
        }
        p.finish();
        assert_eq!(sent, args, "{format:?}");
        // The value's text arrives piece by piece, not at the end.
        assert!(fragments >= 8, "{format:?}: {fragments} fragments");
    }
}

#[test]
fn llama_calls_split_at_semicolons_outside_strings() {
    let text = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"a; b\"}}; {\"parameters\": {}, \"name\": \"now\"}";
    let (_, p) = split_invariant(text, formats(ToolCallFormat::Llama3));
    assert_eq!(
        p.calls,
        vec![
            call("get_weather", serde_json::json!({"city": "a; b"})),
            call("now", serde_json::json!({}))
        ]
    );
    let whole = LlamaPythonTag
        .parse("{\"name\": \"now\", \"parameters\": {\"q\": \"x;y\"}};")
        .unwrap();
    assert_eq!(whole, vec![call("now", serde_json::json!({"q": "x;y"}))]);
}

/// Calls of every family whose streamed form is checked below.
fn call_texts() -> Vec<(ToolCallFormat, &'static str)> {
    vec![
        (ToolCallFormat::Qwen3Coder, "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew </par York\n\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=note>\n\u{e9}t\u{e9} \"q\" \\ </parameter>\n<parameter=opts>\n{\"a\": [1, \"}\"]}\n</parameter>\n</function>\n<function=now>\n</function>\n</tool_call>\nDone."),
        (ToolCallFormat::Mistral, "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Par\\\"is\", \"n\": [1, {\"x\": \"}\"}]}[TOOL_CALLS]now[CALL_ID]a1b2[ARGS]{}"),
        (ToolCallFormat::Mistral, "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}, {\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}, \"id\": \"x\"}]"),
        (ToolCallFormat::Phi4, "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"L<|ima\"}}, {\"name\": \"now\", \"arguments\": {}}]<|/tool_call|> ok"),
        (ToolCallFormat::Llama3, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"a;b\"}}; {\"name\": \"now\", \"parameters\": {}}"),
        (ToolCallFormat::Gemma4, "Hi<|tool_call>call:get_weather{city:<|\"|>Par<|is, \"F\"<|\"|>,days:3,opts:{metric:true,tags:[<|\"|>a<|\"|>,null,-1.5]}}<tool_call|><|tool_call>call:now{}<tool_call|>"),
    ]
}

proptest! {
    /// Every family's calls, pushed in any deltas: the same content and calls as one push
    /// of the whole, and each call's argument deltas concatenate to its arguments.
    #[test]
    fn streamed_arguments_are_split_invariant(
        which in 0usize..6,
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let (format, text) = call_texts()[which];
        let f = formats(format);
        let whole = parse_reply(text, Some(schemas()), f);
        let pieces = pieces_in(text, &cuts, f);
        let view = streamed(&pieces);
        let got = collect(pieces);
        prop_assert_eq!(&got, &whole.1);
        let calls: Vec<(String, String)> = got
            .calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone()))
            .collect();
        prop_assert_eq!(view, calls);
        for c in &got.calls {
            prop_assert!(serde_json::from_str::<serde_json::Value>(&c.arguments).is_ok(), "{}", c.arguments);
        }
    }
}

#[test]
fn every_familys_calls_parse_as_expected() {
    let expect = [
        vec![
            (
                "get_weather",
                serde_json::json!({"city": "New </par York\n", "days": 3, "note": "\u{e9}t\u{e9} \"q\" \\ ", "opts": {"a": [1, "}"]}}),
            ),
            ("now", serde_json::json!({})),
        ],
        vec![
            (
                "get_weather",
                serde_json::json!({"city": "Par\"is", "n": [1, {"x": "}"}]}),
            ),
            ("now", serde_json::json!({})),
        ],
        vec![
            ("now", serde_json::json!({})),
            ("get_weather", serde_json::json!({"city": "Oslo"})),
            ("get_weather", serde_json::json!({"city": "Rome"})),
        ],
        vec![
            ("get_weather", serde_json::json!({"city": "L<|ima"})),
            ("now", serde_json::json!({})),
        ],
        vec![
            ("get_weather", serde_json::json!({"city": "a;b"})),
            ("now", serde_json::json!({})),
        ],
        vec![
            (
                "get_weather",
                serde_json::json!({"city": "Par<|is, \"F\"", "days": 3, "opts": {"metric": true, "tags": ["a", null, -1.5]}}),
            ),
            ("now", serde_json::json!({})),
        ],
    ];
    for ((format, text), want) in call_texts().into_iter().zip(expect) {
        let (_, p) = split_invariant(text, formats(format));
        let got: Vec<(String, serde_json::Value)> = p
            .calls
            .iter()
            .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap()))
            .collect();
        let want: Vec<(String, serde_json::Value)> =
            want.into_iter().map(|(n, v)| (n.to_string(), v)).collect();
        assert_eq!(got, want, "{format:?}");
    }
}

fn fragments() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("[TOOL_CALLS]".to_string()),
        Just("get_weather[ARGS]{\"city\": \"a}\"}".to_string()),
        Just("<|tool_call>".to_string()),
        Just("call:now{a:<|\"|>b<|\"|>}".to_string()),
        Just("<tool_call|>".to_string()),
        Just("<tool_call>".to_string()),
        Just("</tool_call>".to_string()),
        Just("<function=now>\n</function>".to_string()),
        Just("<function=get_weather>\n<parameter=city>\n".to_string()),
        Just("</parameter>".to_string()),
        Just("<|\"|>".to_string()),
        Just("call:get_weather{a:[".to_string()),
        Just("[{\"name\": \"now\", \"arguments\": {\"x\": ".to_string()),
        Just("<|python_tag|>".to_string()),
        Just("{\"name\": \"now\", \"parameters\": {}}".to_string()),
        Just("<think>".to_string()),
        Just("</think>".to_string()),
        Just("\n".to_string()),
        Just("{".to_string()),
        Just("<".to_string()),
        "[a-z é]{0,5}",
    ]
}

proptest! {
    /// Any text in any format, split anywhere: the pieces of one push of the whole.
    #[test]
    fn any_split_in_any_format(
        parts in proptest::collection::vec(fragments(), 0..10),
        cut in any::<usize>(),
        which in 0usize..6,
        think in any::<bool>(),
    ) {
        let tools = [
            ToolCallFormat::Hermes,
            ToolCallFormat::Qwen3Coder,
            ToolCallFormat::Llama3,
            ToolCallFormat::Mistral,
            ToolCallFormat::Phi4,
            ToolCallFormat::Gemma4,
        ][which];
        let f = OutputFormats {
            tools,
            reasoning: think.then_some(ReasoningFormat::Think),
            reasoning_open: false,
        };
        let text: String = parts.concat();
        let whole = parse_reply(&text, Some(offered().into()), f);
        let mut at = if text.is_empty() { 0 } else { cut % (text.len() + 1) };
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        let mut p = OutputParser::with_formats(Some(offered().into()), f);
        let mut pieces = p.push(&text[..at]);
        pieces.extend(p.push(&text[at..]));
        pieces.extend(p.finish());
        let view = streamed(&pieces);
        let got = (super::super::reasoning_of(&pieces), collect(pieces));
        let calls: Vec<(String, String)> = got
            .1
            .calls
            .iter()
            .map(|c| (c.name.clone(), c.arguments.clone()))
            .collect();
        prop_assert_eq!(view, calls);
        prop_assert_eq!(got, whole);
    }
}

/// gpt-oss: the whole output goes through the harmony parser, whatever was offered.
#[test]
fn harmony_channels_and_calls_through_the_output_parser() {
    let f = OutputFormats {
        tools: ToolCallFormat::Harmony,
        reasoning: Some(ReasoningFormat::Harmony),
        reasoning_open: false,
    };
    let text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    let (r, p) = split_invariant(text, f);
    assert_eq!(r.as_deref(), Some("Need weather."));
    assert_eq!(p.content, None);
    assert_eq!(
        p.calls,
        vec![call("get_weather", serde_json::json!({"city": "Paris"}))]
    );
    // No tools offered: reasoning and content still split.
    let answer = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>";
    let pieces = OutputParser::with_formats(None, f).parse(answer);
    assert_eq!(
        super::super::reasoning_of(&pieces).as_deref(),
        Some("Easy.")
    );
    assert_eq!(collect(pieces).content.as_deref(), Some("4"));
}
