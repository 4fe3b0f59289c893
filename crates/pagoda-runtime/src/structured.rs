//! Structured output: the request fields that constrain what a model may write, read into
//! the engine's [`ConstraintSpec`]. OpenAI's `response_format` (`text`, `json_object`,
//! `json_schema`), vLLM's `guided_json` / `guided_regex` / `guided_choice` /
//! `guided_grammar` and its newer `structured_outputs` object ([`openai_constraint`]), and
//! Ollama's `format` ([`ollama_format`]).
//!
//! Invariants: at most one field constrains a request (two are refused, both named); a field
//! of the wrong shape is refused naming it (`response_format.json_schema.schema`,
//! `guided_choice`, ...), never ignored; `null` is the same as leaving a field out. Whether a
//! schema or grammar compiles is the engine's check, when the request is submitted.

use crate::request::RequestError;
use pagoda_engine::ConstraintSpec;
use pagoda_protocol::openai::StructuredOutput;
use serde_json::{Map, Value};

/// Longest `json_schema.name` OpenAI allows.
pub const MAX_SCHEMA_NAME: usize = 64;

/// The constraint the OpenAI request's structured-output fields ask for, if any.
pub fn openai_constraint(s: &StructuredOutput) -> Result<Option<ConstraintSpec>, RequestError> {
    Ok(openai_constraint_and_field(s)?.map(|(_, c)| c))
}

/// The constraint the OpenAI request's structured-output fields ask for and the field it came
/// from (`response_format`, `guided_json`, ...: what a 400 for a constraint the grammar
/// engine refuses names), if any.
pub fn openai_constraint_and_field(
    s: &StructuredOutput,
) -> Result<Option<(&'static str, ConstraintSpec)>, RequestError> {
    let present = |v: &Option<Value>| v.as_ref().filter(|v| !v.is_null()).cloned();
    let mut found: Vec<(&'static str, ConstraintSpec)> = Vec::new();
    if let Some(v) = present(&s.response_format) {
        if let Some(c) = response_format(&v)? {
            found.push(("response_format", c));
        }
    }
    if let Some(v) = present(&s.guided_json) {
        found.push(("guided_json", json_schema_value(v, "guided_json")?));
    }
    if let Some(v) = present(&s.guided_regex) {
        found.push(("guided_regex", regex(&v, "guided_regex")?));
    }
    if let Some(v) = present(&s.guided_choice) {
        found.push(("guided_choice", choice(&v, "guided_choice")?));
    }
    if let Some(v) = present(&s.guided_grammar) {
        found.push(("guided_grammar", grammar(&v, "guided_grammar")?));
    }
    if let Some(v) = present(&s.structured_outputs) {
        if let Some(field_and_constraint) = structured_outputs(&v)? {
            found.push(field_and_constraint);
        }
    }
    one_of(found)
}

/// Ollama's `format`: `"json"` is any JSON object, an object is a JSON schema; `null` and
/// `""` (what older clients send for "no format") ask for nothing.
pub fn ollama_format(format: Option<&Value>) -> Result<Option<ConstraintSpec>, RequestError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(ConstraintSpec::JsonObject)),
        Some(Value::Object(o)) => Ok(Some(ConstraintSpec::JsonSchema(Value::Object(o.clone())))),
        Some(other) => Err(RequestError::param(
            "format",
            format!(
                "format must be \"json\" or a JSON schema object, got {}",
                describe(other)
            ),
        )),
    }
}

/// At most one constraint: two are refused, naming both fields.
fn one_of(
    found: Vec<(&'static str, ConstraintSpec)>,
) -> Result<Option<(&'static str, ConstraintSpec)>, RequestError> {
    let mut it = found.into_iter();
    let first = it.next();
    if let (Some((a, _)), Some((b, _))) = (&first, it.next()) {
        return Err(RequestError::param(
            b,
            format!("`{a}` and `{b}` both constrain the output; send only one of them"),
        ));
    }
    Ok(first)
}

/// `response_format`; `None` for `{"type": "text"}`.
fn response_format(v: &Value) -> Result<Option<ConstraintSpec>, RequestError> {
    const P: &str = "response_format";
    let o = object(v, P)?;
    let kind = match o.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(other) => {
            return Err(RequestError::param(
                "response_format.type",
                format!(
                    "response_format.type must be a string, got {}",
                    describe(other)
                ),
            ))
        }
        None => {
            return Err(RequestError::param(
                "response_format.type",
                "response_format needs a `type`: text, json_object or json_schema",
            ))
        }
    };
    let allowed: &[&str] = match kind {
        "text" | "json_object" => &["type"],
        "json_schema" => &["type", "json_schema"],
        other => {
            return Err(RequestError::param(
                "response_format.type",
                format!(
                    "response_format.type `{other}` is not supported; use text, json_object or json_schema"
                ),
            ))
        }
    };
    if let Some(k) = o.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(RequestError::param(
            format!("response_format.{k}"),
            format!("response_format of type `{kind}` takes no `{k}`"),
        ));
    }
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(ConstraintSpec::JsonObject)),
        _ => json_schema_format(o.get("json_schema")).map(Some),
    }
}

/// `response_format.json_schema`: `{"name", "schema", "strict"?, "description"?}`.
fn json_schema_format(v: Option<&Value>) -> Result<ConstraintSpec, RequestError> {
    const P: &str = "response_format.json_schema";
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Err(RequestError::param(
            P,
            "response_format of type json_schema needs `json_schema`: {\"name\", \"schema\"}",
        ));
    };
    let o = object(v, P)?;
    for k in o.keys() {
        if !["name", "schema", "strict", "description"].contains(&k.as_str()) {
            return Err(RequestError::param(
                format!("{P}.{k}"),
                format!("{P} takes name, schema, strict and description, not `{k}`"),
            ));
        }
    }
    match o.get("name") {
        Some(Value::String(name)) => {
            let ok = !name.is_empty()
                && name.len() <= MAX_SCHEMA_NAME
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !ok {
                return Err(RequestError::param(
                    "response_format.json_schema.name",
                    format!(
                        "{P}.name must be 1 to {MAX_SCHEMA_NAME} characters of a-z, A-Z, 0-9, _ and -, got `{name}`"
                    ),
                ));
            }
        }
        Some(other) => {
            return Err(RequestError::param(
                "response_format.json_schema.name",
                format!("{P}.name must be a string, got {}", describe(other)),
            ))
        }
        None => {
            return Err(RequestError::param(
                "response_format.json_schema.name",
                format!("{P} needs a `name`"),
            ))
        }
    }
    if let Some(v) = o.get("strict").filter(|v| !(v.is_null() || v.is_boolean())) {
        return Err(RequestError::param(
            "response_format.json_schema.strict",
            format!("{P}.strict must be true or false, got {}", describe(v)),
        ));
    }
    if let Some(v) = o
        .get("description")
        .filter(|v| !(v.is_null() || v.is_string()))
    {
        return Err(RequestError::param(
            "response_format.json_schema.description",
            format!("{P}.description must be a string, got {}", describe(v)),
        ));
    }
    match o.get("schema") {
        Some(Value::Object(schema)) => {
            Ok(ConstraintSpec::JsonSchema(Value::Object(schema.clone())))
        }
        None | Some(Value::Null) => Err(RequestError::param(
            "response_format.json_schema.schema",
            format!("{P} needs a `schema` (a JSON Schema object)"),
        )),
        Some(other) => Err(RequestError::param(
            "response_format.json_schema.schema",
            format!(
                "{P}.schema must be a JSON Schema object, got {}",
                describe(other)
            ),
        )),
    }
}

/// A JSON schema given as an object or as a string holding one (vLLM's `guided_json`).
fn json_schema_value(v: Value, param: &'static str) -> Result<ConstraintSpec, RequestError> {
    let schema = match v {
        Value::String(s) => serde_json::from_str::<Value>(&s).map_err(|e| {
            RequestError::param(
                param,
                format!("{param} is a string but not JSON: {e}; send the schema as an object"),
            )
        })?,
        other => other,
    };
    match schema {
        Value::Object(_) => Ok(ConstraintSpec::JsonSchema(schema)),
        other => Err(RequestError::param(
            param,
            format!(
                "{param} must be a JSON Schema object, got {}",
                describe(&other)
            ),
        )),
    }
}

fn regex(v: &Value, param: &'static str) -> Result<ConstraintSpec, RequestError> {
    match v {
        Value::String(s) if !s.is_empty() => Ok(ConstraintSpec::Regex(s.clone())),
        Value::String(_) => Err(RequestError::param(
            param,
            format!("{param} must not be empty"),
        )),
        other => Err(RequestError::param(
            param,
            format!(
                "{param} must be a regular expression (a string), got {}",
                describe(other)
            ),
        )),
    }
}

fn choice(v: &Value, param: &'static str) -> Result<ConstraintSpec, RequestError> {
    let Value::Array(items) = v else {
        return Err(RequestError::param(
            param,
            format!("{param} must be a list of strings, got {}", describe(v)),
        ));
    };
    if items.is_empty() {
        return Err(RequestError::param(
            param,
            format!("{param} must list at least one string"),
        ));
    }
    items
        .iter()
        .map(|item| match item {
            Value::String(s) => Ok(s.clone()),
            other => Err(RequestError::param(
                param,
                format!(
                    "{param} must be a list of strings; it holds {}",
                    describe(other)
                ),
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(ConstraintSpec::Choice)
}

fn grammar(v: &Value, param: &'static str) -> Result<ConstraintSpec, RequestError> {
    match v {
        Value::String(s) if !s.trim().is_empty() => Ok(ConstraintSpec::Lark(s.clone())),
        Value::String(_) => Err(RequestError::param(
            param,
            format!("{param} must not be empty"),
        )),
        other => Err(RequestError::param(
            param,
            format!(
                "{param} must be a grammar in Lark syntax (a string), got {}",
                describe(other)
            ),
        )),
    }
}

/// vLLM's `structured_outputs`: one of `json`, `regex`, `choice`, `grammar`, `json_object`.
fn structured_outputs(v: &Value) -> Result<Option<(&'static str, ConstraintSpec)>, RequestError> {
    const P: &str = "structured_outputs";
    let o = object(v, P)?;
    let mut found = Vec::new();
    for (k, v) in o {
        if v.is_null() {
            continue;
        }
        let c = match k.as_str() {
            "json" => json_schema_value(v.clone(), "structured_outputs.json")?,
            "regex" => regex(v, "structured_outputs.regex")?,
            "choice" => choice(v, "structured_outputs.choice")?,
            "grammar" => grammar(v, "structured_outputs.grammar")?,
            "json_object" => match v {
                Value::Bool(true) => ConstraintSpec::JsonObject,
                Value::Bool(false) => continue,
                other => {
                    return Err(RequestError::param(
                        "structured_outputs.json_object",
                        format!(
                            "structured_outputs.json_object must be true or false, got {}",
                            describe(other)
                        ),
                    ))
                }
            },
            other => {
                return Err(RequestError::param(
                    format!("{P}.{other}"),
                    format!(
                        "{P}.{other} is not supported; use one of json, regex, choice, grammar or json_object"
                    ),
                ))
            }
        };
        let name = match k.as_str() {
            "json" => "structured_outputs.json",
            "regex" => "structured_outputs.regex",
            "choice" => "structured_outputs.choice",
            "grammar" => "structured_outputs.grammar",
            _ => "structured_outputs.json_object",
        };
        found.push((name, c));
    }
    one_of(found)
}

fn object<'a>(v: &'a Value, param: &'static str) -> Result<&'a Map<String, Value>, RequestError> {
    v.as_object().ok_or_else(|| {
        RequestError::param(
            param,
            format!("{param} must be an object, got {}", describe(v)),
        )
    })
}

/// A value's JSON type, for messages.
pub(crate) fn describe(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(body: Value) -> Result<Option<ConstraintSpec>, RequestError> {
        let s: StructuredOutput = serde_json::from_value(body).expect("shape");
        openai_constraint(&s)
    }

    fn refused(body: Value) -> String {
        let e = parse(body.clone())
            .err()
            .unwrap_or_else(|| panic!("accepted: {body}"));
        assert!(!e.message.is_empty());
        e.param_name()
            .unwrap_or_else(|| panic!("no param for {body}: {e}"))
            .to_string()
    }

    #[test]
    fn each_field_maps_to_its_constraint() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let cases = [
            (json!({}), None),
            (json!({"response_format": null}), None),
            (json!({"response_format": {"type": "text"}}), None),
            (
                json!({"response_format": {"type": "json_object"}}),
                Some(ConstraintSpec::JsonObject),
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "Thing_1", "schema": schema, "strict": true, "description": "a thing"}}}),
                Some(ConstraintSpec::JsonSchema(schema.clone())),
            ),
            (
                json!({"guided_json": schema}),
                Some(ConstraintSpec::JsonSchema(schema.clone())),
            ),
            (
                json!({"guided_json": schema.to_string()}),
                Some(ConstraintSpec::JsonSchema(schema.clone())),
            ),
            (
                json!({"guided_regex": "[0-9]+"}),
                Some(ConstraintSpec::Regex("[0-9]+".into())),
            ),
            (
                json!({"guided_choice": ["yes", "no"]}),
                Some(ConstraintSpec::Choice(vec!["yes".into(), "no".into()])),
            ),
            (
                json!({"guided_grammar": "start: \"a\"+"}),
                Some(ConstraintSpec::Lark("start: \"a\"+".into())),
            ),
            (
                json!({"structured_outputs": {"json": schema}}),
                Some(ConstraintSpec::JsonSchema(schema.clone())),
            ),
            (
                json!({"structured_outputs": {"regex": "a|b"}}),
                Some(ConstraintSpec::Regex("a|b".into())),
            ),
            (
                json!({"structured_outputs": {"choice": ["x"]}}),
                Some(ConstraintSpec::Choice(vec!["x".into()])),
            ),
            (
                json!({"structured_outputs": {"grammar": "start: \"x\""}}),
                Some(ConstraintSpec::Lark("start: \"x\"".into())),
            ),
            (
                json!({"structured_outputs": {"json_object": true}}),
                Some(ConstraintSpec::JsonObject),
            ),
            // `text` next to a real constraint asks for nothing, so it is not a second one.
            (
                json!({"response_format": {"type": "text"}, "guided_regex": "a"}),
                Some(ConstraintSpec::Regex("a".into())),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(
                parse(body.clone()).unwrap_or_else(|e| panic!("{body}: {e}")),
                want,
                "{body}"
            );
        }
    }

    #[test]
    fn bad_shapes_are_refused_naming_the_field() {
        let schema = json!({"type": "object"});
        let cases = [
            (json!({"response_format": "json"}), "response_format"),
            (json!({"response_format": {}}), "response_format.type"),
            (
                json!({"response_format": {"type": 3}}),
                "response_format.type",
            ),
            (
                json!({"response_format": {"type": "xml"}}),
                "response_format.type",
            ),
            (
                json!({"response_format": {"type": "json_object", "schema": schema}}),
                "response_format.schema",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format.json_schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "has space", "schema": schema}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": "yes"}}}),
                "response_format.json_schema.strict",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "extra": 1}}}),
                "response_format.json_schema.extra",
            ),
            (json!({"guided_json": 5}), "guided_json"),
            (json!({"guided_json": "not json"}), "guided_json"),
            (json!({"guided_json": "[1, 2]"}), "guided_json"),
            (json!({"guided_regex": ""}), "guided_regex"),
            (json!({"guided_regex": ["a"]}), "guided_regex"),
            (json!({"guided_choice": []}), "guided_choice"),
            (json!({"guided_choice": ["a", 1]}), "guided_choice"),
            (json!({"guided_choice": "a"}), "guided_choice"),
            (json!({"guided_grammar": " "}), "guided_grammar"),
            (json!({"guided_grammar": {}}), "guided_grammar"),
            (json!({"structured_outputs": "json"}), "structured_outputs"),
            (
                json!({"structured_outputs": {"structural_tag": "x"}}),
                "structured_outputs.structural_tag",
            ),
            (
                json!({"structured_outputs": {"choice": []}}),
                "structured_outputs.choice",
            ),
            (
                json!({"structured_outputs": {"json_object": "yes"}}),
                "structured_outputs.json_object",
            ),
        ];
        for (body, want) in cases {
            assert_eq!(refused(body.clone()), want, "{body}");
        }
    }

    #[test]
    fn two_constraints_are_refused_naming_both() {
        let pairs = [
            json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}),
            json!({"guided_json": {}, "guided_choice": ["a"]}),
            json!({"guided_grammar": "start: \"a\"", "structured_outputs": {"regex": "a"}}),
            json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}),
        ];
        for body in pairs {
            let e = parse(body.clone())
                .err()
                .unwrap_or_else(|| panic!("accepted: {body}"));
            let names: Vec<&str> = body
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            assert!(e.param.is_some(), "{body}");
            if names.len() == 2 {
                for n in names {
                    assert!(e.message.contains(n), "{body}: {e}");
                }
            } else {
                assert!(e.message.contains("structured_outputs.regex"), "{e}");
                assert!(e.message.contains("structured_outputs.choice"), "{e}");
            }
        }
    }

    #[test]
    fn ollama_format_is_json_or_a_schema() {
        let schema = json!({"type": "object", "properties": {"age": {"type": "integer"}}});
        assert_eq!(ollama_format(None).expect("none"), None);
        assert_eq!(ollama_format(Some(&Value::Null)).expect("null"), None);
        assert_eq!(ollama_format(Some(&json!(""))).expect("empty"), None);
        assert_eq!(
            ollama_format(Some(&json!("json"))).expect("json"),
            Some(ConstraintSpec::JsonObject)
        );
        assert_eq!(
            ollama_format(Some(&schema)).expect("schema"),
            Some(ConstraintSpec::JsonSchema(schema.clone()))
        );
        for bad in [json!("yaml"), json!(1), json!(true), json!(["json"])] {
            let e = ollama_format(Some(&bad))
                .err()
                .unwrap_or_else(|| panic!("accepted: {bad}"));
            assert_eq!(e.param_name(), Some("format"), "{bad}");
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn leaf() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                (-3i64..3).prop_map(Value::from),
                "[a-z_ ]{0,6}".prop_map(Value::from),
                Just(json!("json_schema")),
                Just(json!("json_object")),
                Just(json!({"type": "object"})),
            ]
        }

        fn value() -> impl Strategy<Value = Value> {
            leaf().prop_recursive(3, 16, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                    proptest::collection::btree_map(
                        "type|json_schema|name|schema|strict|json|regex|choice|grammar|[a-z]{1,4}",
                        inner,
                        0..4
                    )
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            /// Whatever the structured-output fields hold, the answer is at most one
            /// constraint or an error naming a field — never a panic, never a silent drop
            /// of a field that asked for something.
            #[test]
            fn any_fields_give_one_constraint_or_a_named_error(
                fields in proptest::collection::btree_map(
                    "response_format|guided_json|guided_regex|guided_choice|guided_grammar|structured_outputs",
                    value(),
                    0..3,
                )
            ) {
                let body = Value::Object(fields.clone().into_iter().collect());
                match parse(body) {
                    Ok(None) => {
                        // Nothing constrains: every field is null, text, or an empty/false
                        // structured_outputs.
                        for (k, v) in &fields {
                            let nothing = v.is_null()
                                || (k == "response_format" && v.get("type") == Some(&json!("text")))
                                || (k == "structured_outputs"
                                    && v.as_object().is_some_and(|o| o.values().all(|x| x.is_null() || x == &json!(false))));
                            prop_assert!(nothing, "{k}: {v} asked for nothing?");
                        }
                    }
                    Ok(Some(_)) => {}
                    Err(e) => {
                        let p = e.param_name().unwrap_or_default().to_string();
                        prop_assert!(fields.keys().any(|k| p.starts_with(k.as_str())), "{p}: {e}");
                    }
                }
            }
        }
    }
}
