//! The grammar that forces a call in Qwen3-Coder's and Qwen3.5's own markup
//! ([`super::ToolCallFormat::Qwen3Coder`]): per call
//! `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n…</function>\n</tool_call>`,
//! which the format's parser reads back (`formats/qwen3coder.rs`).
//!
//! Values: a parameter whose schema says `"type": "string"` is raw text (no `<` in it, at
//! most `maxLength` characters, or one of its `enum` strings); any other parameter is JSON
//! valid against its schema (objects closed, whitespace bounded, as the JSON form of
//! [`super::forced_call`] writes it). Parameters come in the schema's order, the required
//! ones always, the others optionally.
//!
//! Invariant: a schema this markup cannot express exactly (a string with a `pattern`,
//! `format`, `minLength`, a union of types, …) gives `None`, and the caller forces the JSON
//! form instead, so a forced call is never looser than its schema says.

use super::{forced_grammar_head, function_name, FORCED_CALL_WHITESPACE};
use pagoda_protocol::openai::chat::Tool;
use serde_json::Value;

/// String keywords the raw-text value honours (the others are annotations).
const STRING_KEYWORDS: &[&str] = &[
    "type",
    "maxLength",
    "enum",
    "description",
    "title",
    "default",
    "examples",
];

/// The largest `maxLength` written as a counted repetition.
const MAX_COUNTED_LENGTH: u64 = 4096;

/// The Lark grammar forcing one call of one of `allowed` (several, a newline apart, when
/// `parallel`), or `None` when a parameter's schema cannot be written in this markup.
pub fn grammar(allowed: &[&Tool], parallel: bool) -> Option<String> {
    let mut g = forced_grammar_head(allowed.len(), parallel, "<tool_call>\\n", "</tool_call>");
    for (i, t) in allowed.iter().enumerate() {
        let params = t.function.as_ref().and_then(|f| f.parameters.as_ref());
        let properties = params
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object);
        let required: Vec<&str> = params
            .and_then(|p| p.get("required"))
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut parts = Vec::new();
        for (k, (key, schema)) in properties.into_iter().flatten().enumerate() {
            let rule = format!("fn_{i}_p{k}");
            g.push_str(&format!("{rule}: {}\n", parameter(key, schema)?));
            let optional = if required.contains(&key.as_str()) {
                ""
            } else {
                "?"
            };
            parts.push(format!("{rule}{optional}"));
        }
        g.push_str(&format!(
            "fn_{i}: {} {} \"</function>\\n\"\n",
            literal(&format!("<function={}>\n", function_name(t))),
            parts.join(" ")
        ));
    }
    Some(g)
}

/// A Lark string literal of `text` (JSON's escapes).
fn literal(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// One parameter's rule body: its opening marker, its value and its closing marker.
fn parameter(key: &str, schema: &Value) -> Option<String> {
    let open = literal(&format!("<parameter={key}>\n"));
    let close = "\\n</parameter>\\n";
    let obj = schema.as_object()?;
    if obj.get("type").and_then(Value::as_str) == Some("string") {
        if obj.keys().any(|k| !STRING_KEYWORDS.contains(&k.as_str())) {
            return None;
        }
        if let Some(options) = obj.get("enum") {
            let options: Vec<String> = options
                .as_array()?
                .iter()
                .map(|o| o.as_str().map(|s| literal(&format!("{s}\n</parameter>\n"))))
                .collect::<Option<_>>()?;
            return (!options.is_empty()).then(|| format!("{open} ({})", options.join(" | ")));
        }
        // A bound past MAX_COUNTED_LENGTH is left unbounded: a counted repetition is a
        // lexer state per character, and a client's maxLength must not size the automaton.
        let repeat = match obj.get("maxLength") {
            Some(n) => match n.as_u64()? {
                n if n <= MAX_COUNTED_LENGTH => format!("{{0,{n}}}"),
                _ => "*".to_string(),
            },
            None => "*".to_string(),
        };
        // One terminal for the text and the closing marker: a value may hold newlines, and
        // only the whole regex tells the value's last newline from the marker's.
        return Some(format!(
            "{open} /[^<]{repeat}{}/",
            close.replace('/', "\\/")
        ));
    }
    if obj.get("type").is_some_and(|t| !t.is_string()) {
        return None; // a union of types: string or not decides how the value is written
    }
    let mut schema = Value::Object(obj.clone());
    pagoda_engine::close_objects(&mut schema);
    if let Some(o) = schema.as_object_mut() {
        o.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_pattern": FORCED_CALL_WHITESPACE}),
        );
    }
    Some(format!("{open} %json {schema} \"{close}\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, parameters: Value) -> Tool {
        serde_json::from_value(json!({"type": "function",
            "function": {"name": name, "parameters": parameters}}))
        .expect("a tool")
    }

    #[test]
    fn strings_are_raw_text_and_other_values_json() {
        let t = tool(
            "get_weather",
            json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 12, "description": "a city"},
                "unit": {"type": "string", "enum": ["C", "F"]},
                "days": {"type": "integer"}},
                "required": ["city"]}),
        );
        let g = grammar(&[&t], false).expect("expressible");
        assert!(g.starts_with("start: call\ncall: \"<tool_call>\\n\" (fn_0) \"</tool_call>\"\n"));
        assert!(
            g.contains("fn_0_p0: \"<parameter=city>\\n\" /[^<]{0,12}\\n<\\/parameter>\\n/"),
            "{g}"
        );
        assert!(
            g.contains(
                "fn_0_p1: \"<parameter=unit>\\n\" (\"C\\n</parameter>\\n\" | \"F\\n</parameter>\\n\")"
            ),
            "{g}"
        );
        assert!(
            g.contains("fn_0_p2: \"<parameter=days>\\n\" %json {"),
            "{g}"
        );
        assert!(
            g.contains(
                "fn_0: \"<function=get_weather>\\n\" fn_0_p0 fn_0_p1? fn_0_p2? \"</function>\\n\""
            ),
            "{g}"
        );
    }

    #[test]
    fn a_huge_max_length_does_not_size_the_lexer() {
        let t = tool(
            "f",
            json!({"type": "object", "properties": {"x": {"type": "string", "maxLength": 4_000_000_000u64}}}),
        );
        let g = grammar(&[&t], false).expect("expressible");
        assert!(g.contains("/[^<]*\\n<\\/parameter>\\n/"), "{g}");
    }

    #[test]
    fn a_schema_the_markup_cannot_hold_is_left_to_the_json_form() {
        for schema in [
            json!({"type": "string", "pattern": "^[A-Z]+$"}),
            json!({"type": "string", "minLength": 2}),
            json!({"type": ["string", "null"]}),
            json!({"type": "string", "enum": [1, 2]}),
        ] {
            let t = tool("f", json!({"type": "object", "properties": {"x": schema}}));
            assert_eq!(grammar(&[&t], true), None, "{schema}");
        }
    }

    #[test]
    fn a_function_without_parameters_and_parallel_calls() {
        let t = tool("now", json!({"type": "object"}));
        let g = grammar(&[&t], true).expect("expressible");
        assert!(g.starts_with("start: call (\"\\n\" call)*\n"), "{g}");
        assert!(
            g.contains("fn_0: \"<function=now>\\n\"  \"</function>\\n\""),
            "{g}"
        );
    }
}
