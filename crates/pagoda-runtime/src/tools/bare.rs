//! Calls written without `<tool_call>` markup: an output that is, as a whole, one call object
//! `{"name": ..., "arguments": {...}}` (or a JSON list of them), bare or inside one Markdown
//! code fence (```` ``` ```` or ```` ```json ````). Small models trained for tools answer this
//! way more often than not (Qwen2.5-Coder-0.5B does, given Qwen's own template); llama.cpp's
//! Hermes parser accepts the same forms.
//!
//! Invariants:
//! - Only a whole output counts, and only when every object in it names one of the offered
//!   tools and has object arguments (or none): JSON the user asked for, or a call-shaped
//!   object naming something else, stays content, verbatim.
//! - Streaming: [`BareCallGate`] holds the output back only while it may still be such a call
//!   (nothing but whitespace yet, or it starts with `{`, `[` or a fence); once the first
//!   visible characters rule that out, everything passes through at once and from then on
//!   unchanged. So an answer in prose streams as before, and a call is never sent as content
//!   first.

use super::parse::{parse_call, ParsedCall};
use serde_json::Value;

/// The calls `text` is, as a whole, or `None` when it is not a bare call (see the module doc).
pub fn parse_bare_calls(text: &str, offered: &[String]) -> Option<Vec<ParsedCall>> {
    let json = unfence(text.trim())?;
    let value: Value = serde_json::from_str(json).ok()?;
    let objects = match value {
        Value::Array(items) if !items.is_empty() => items,
        o @ Value::Object(_) => vec![o],
        _ => return None,
    };
    objects
        .iter()
        .map(|o| {
            let call = parse_call(&o.to_string())?;
            offered.contains(&call.name).then_some(call)
        })
        .collect()
}

/// `text` without one enclosing Markdown code fence (its info string, if any, must be
/// `json`), or `text` itself when it is not fenced; `None` for a fence that does not close.
fn unfence(text: &str) -> Option<&str> {
    let Some(rest) = text.strip_prefix("```") else {
        return Some(text);
    };
    let (info, body) = rest.split_once('\n')?;
    if !matches!(info.trim(), "" | "json" | "JSON") {
        return None;
    }
    Some(body.strip_suffix("```")?.trim())
}

/// Whether an output starting with `head` (leading whitespace removed) may still turn out to
/// be a bare call.
fn may_be_bare(head: &str) -> bool {
    head.is_empty()
        || head.starts_with('{')
        || head.starts_with('[')
        || head.starts_with("```")
        || "```".starts_with(head)
}

/// What the gate does with a delta.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gated {
    /// Held back: the output may still be a bare call.
    Held,
    /// Not a bare call: this text (everything held so far plus the delta) goes on.
    Pass(String),
}

/// Holds a streamed output back while it may be a bare call (see the module doc).
#[derive(Debug, Default)]
pub struct BareCallGate {
    held: String,
    open: bool,
}

impl BareCallGate {
    /// Feeds `delta`.
    pub fn push(&mut self, delta: &str) -> Gated {
        if self.open {
            return Gated::Pass(delta.to_string());
        }
        self.held.push_str(delta);
        if may_be_bare(self.held.trim_start()) {
            return Gated::Held;
        }
        self.open = true;
        Gated::Pass(std::mem::take(&mut self.held))
    }

    /// The end of the output: the held text as calls, or as text to pass on (possibly empty).
    pub fn finish(&mut self, offered: &[String]) -> Result<Vec<ParsedCall>, String> {
        let held = std::mem::take(&mut self.held);
        self.open = true;
        parse_bare_calls(&held, offered).ok_or(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn offered() -> Vec<String> {
        vec!["get_weather".into(), "now".into()]
    }

    #[test]
    fn fenced_bare_and_listed_calls_parse() {
        let fenced = "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Tokyo\"\n  }\n}\n```";
        let calls = parse_bare_calls(fenced, &offered()).unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
            serde_json::json!({"city": "Tokyo"})
        );
        let bare = " {\"name\": \"now\", \"arguments\": {}}\n";
        assert_eq!(parse_bare_calls(bare, &offered()).unwrap()[0].name, "now");
        let listed = "[{\"name\": \"now\"}, {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}]";
        let calls = parse_bare_calls(listed, &offered()).unwrap();
        assert_eq!(
            calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["now", "get_weather"]
        );
    }

    #[test]
    fn anything_else_is_not_a_call() {
        for t in [
            "",
            "The weather is fine.",
            "{\"name\": \"Paris\", \"country\": \"France\"}",
            "{\"name\": \"unknown_tool\", \"arguments\": {}}",
            "{\"name\": \"now\", \"arguments\": [1]}",
            "[]",
            "[{\"name\": \"now\"}, {\"name\": \"nope\"}]",
            "```python\n{\"name\": \"now\"}\n```",
            "```json\n{\"name\": \"now\"}",
            "Call: {\"name\": \"now\", \"arguments\": {}}",
            "{\"name\": \"now\", \"arguments\": {}} and more",
        ] {
            assert_eq!(parse_bare_calls(t, &offered()), None, "{t:?}");
        }
    }

    #[test]
    fn the_gate_passes_prose_at_its_first_visible_character() {
        let mut g = BareCallGate::default();
        assert_eq!(g.push("\n "), Gated::Held);
        assert_eq!(g.push("Hi"), Gated::Pass("\n Hi".into()));
        assert_eq!(g.push(" {"), Gated::Pass(" {".into()));
        assert_eq!(g.finish(&offered()), Err(String::new()));

        let mut g = BareCallGate::default();
        assert_eq!(g.push("`"), Gated::Held);
        assert_eq!(g.push("`x"), Gated::Pass("``x".into()));
    }

    proptest! {
        /// Whatever the split, the gate's passed text plus its end give back the whole output,
        /// or the calls `parse_bare_calls` finds in it.
        #[test]
        fn any_split_keeps_every_character(
            parts in proptest::collection::vec(prop_oneof![
                Just("```json\n".to_string()),
                Just("```".to_string()),
                Just("{\"name\": \"now\", \"arguments\": {}}".to_string()),
                Just("[".to_string()),
                Just("]".to_string()),
                "[a-z \n{}]{0,5}",
            ], 0..8),
        ) {
            let text: String = parts.concat();
            let mut g = BareCallGate::default();
            let mut passed = String::new();
            for p in &parts {
                if let Gated::Pass(t) = g.push(p) {
                    passed.push_str(&t);
                }
            }
            match g.finish(&offered()) {
                Ok(calls) => {
                    prop_assert_eq!(passed, "");
                    prop_assert_eq!(Some(calls), parse_bare_calls(&text, &offered()));
                }
                Err(rest) => {
                    passed.push_str(&rest);
                    prop_assert_eq!(passed, text);
                }
            }
        }
    }
}
