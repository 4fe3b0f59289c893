//! Closed objects by default: a JSON schema's object that lists `properties` and says nothing
//! of `additionalProperties` gets `"additionalProperties": false` before it is compiled.
//!
//! JSON Schema itself allows any other key there, and a constrained model then tends to go on
//! inventing keys until `max_tokens` cuts the JSON short. What clients mean by such a schema
//! (Pydantic's, OpenAI's strict mode, Ollama's `format`) is the listed keys; xgrammar (vLLM's
//! default, `strict_mode`), vLLM's guidance backend (`disable_additional_properties`) and
//! llama.cpp's schema converter all read it that way. A schema that wants other keys says
//! `"additionalProperties": true` (or gives their schema) and gets them.
//!
//! Invariants: only schema positions are visited (a property *named* `properties` is not a
//! keyword); an explicit `additionalProperties`, `patternProperties` or
//! `unevaluatedProperties` is left as written; an `allOf` branch is not closed (its
//! properties are completed by the other branches, and closing each would reject them all).

use serde_json::{Map, Value};

/// Closes every object of `schema` that lists `properties` without saying whether others are
/// allowed (see the module doc).
pub fn close_objects(schema: &mut Value) {
    visit(schema, true);
}

/// Keywords whose value is one schema.
const ONE: &[&str] = &[
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
];
/// Keywords whose value is a list of schemas.
const LIST: &[&str] = &["anyOf", "oneOf", "prefixItems", "items"];
/// Keywords whose value maps names to schemas.
const MAP: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

fn visit(schema: &mut Value, close: bool) {
    let Value::Object(map) = schema else {
        return;
    };
    if close && map.contains_key("properties") && !says_what_else(map) {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in map.iter_mut() {
        let key = key.as_str();
        if ONE.contains(&key) && value.is_object() {
            visit(value, true);
        }
        if LIST.contains(&key) {
            if let Value::Array(items) = value {
                items.iter_mut().for_each(|s| visit(s, true));
            }
        }
        if key == "allOf" {
            if let Value::Array(items) = value {
                items.iter_mut().for_each(|s| visit(s, false));
            }
        }
        if MAP.contains(&key) {
            if let Value::Object(named) = value {
                named.values_mut().for_each(|s| visit(s, true));
            }
        }
    }
}

/// Whether the object schema says what happens to keys beyond `properties`.
fn says_what_else(map: &Map<String, Value>) -> bool {
    [
        "additionalProperties",
        "patternProperties",
        "unevaluatedProperties",
    ]
    .iter()
    .any(|k| map.contains_key(*k))
        || map.contains_key("allOf")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn closed(mut v: Value) -> Value {
        close_objects(&mut v);
        v
    }

    #[test]
    fn objects_with_properties_are_closed_at_every_depth() {
        let got = closed(json!({
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
                "list": {"type": "array", "items": {"properties": {"y": {}}}},
                "properties": {"type": "string"},
            },
            "$defs": {"d": {"properties": {"z": {}}}},
            "anyOf": [{"properties": {"w": {}}}],
        }));
        assert_eq!(got["additionalProperties"], false);
        assert_eq!(got["properties"]["a"]["additionalProperties"], false);
        assert_eq!(
            got["properties"]["list"]["items"]["additionalProperties"],
            false
        );
        assert_eq!(got["$defs"]["d"]["additionalProperties"], false);
        assert_eq!(got["anyOf"][0]["additionalProperties"], false);
        // A property named like a keyword is a property, not a keyword.
        assert_eq!(got["properties"]["properties"], json!({"type": "string"}));
        assert!(got["properties"].get("additionalProperties").is_none());
    }

    #[test]
    fn what_the_schema_says_is_kept() {
        for v in [
            json!({"properties": {"a": {}}, "additionalProperties": true}),
            json!({"properties": {"a": {}}, "additionalProperties": {"type": "integer"}}),
            json!({"properties": {"a": {}}, "patternProperties": {"^x": {}}}),
            json!({"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]}),
            json!({"type": "object"}),
            json!(true),
            json!({"type": "string"}),
        ] {
            assert_eq!(closed(v.clone()), v);
        }
        // allOf branches stay open: each lists only part of the keys.
        let v = closed(json!({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}));
        assert!(v["allOf"][0].get("additionalProperties").is_none());
    }
}
