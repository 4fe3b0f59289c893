//! The model's output text → content and tool calls, whole or as it streams.
//!
//! A call is `<tool_call>` + a JSON object `{"name": <string>, "arguments": <object>}` +
//! `</tool_call>` (whitespace around the JSON allowed; `parameters` is read as `arguments`,
//! and `arguments` given as a string holding a JSON object is read as that object). That is
//! what Qwen2.5's template asks for and what the fallback prompt asks for.
//!
//! Invariants:
//! - [`ToolCallParser`] gives the same content (concatenated) and the same calls for any
//!   split of the text into deltas; [`parse_output`] is one push of the whole text.
//! - `<tool_call>` markup is never emitted as content while it may still become a call: a
//!   text ending in a prefix of `<tool_call>` is held back until the next delta decides.
//! - A call is emitted once it is complete (its `</tool_call>` seen, or at the end of the
//!   output when its JSON is whole), so a call is never half-sent and then retracted.
//! - A call whose JSON does not parse (or has no name, or non-object arguments) stays content,
//!   verbatim, markup included: nothing the model wrote is lost, nothing fails.
//! - Whitespace between a call and the text around it belongs to neither (Qwen writes a
//!   newline between calls); with no call parsed, the content is exactly the text.
//! - Calls are found anywhere in the text, inside a `<think>…</think>` reasoning block too (a
//!   model that calls from within its reasoning does not lose the call); the reasoning itself
//!   stays in the content.
//! - `arguments` is re-serialized as compact JSON (object keys in sorted order).

use serde_json::Value;

/// Opens a call.
pub const OPEN: &str = "<tool_call>";
/// Closes a call.
pub const CLOSE: &str = "</tool_call>";

/// One call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// Compact JSON text of an object.
    pub arguments: String,
}

/// What a push of text gives: content text, or a whole call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    Call(ParsedCall),
}

/// A whole output split into content and calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedOutput {
    /// The text outside calls; `None` when calls were parsed and nothing else but whitespace
    /// was written. Without calls, the text as the model wrote it.
    pub content: Option<String>,
    pub calls: Vec<ParsedCall>,
}

/// The whole output `text` as content and calls.
pub fn parse_output(text: &str) -> ParsedOutput {
    let mut p = ToolCallParser::default();
    let mut pieces = p.push(text);
    pieces.extend(p.finish());
    collect(pieces)
}

/// Pieces (from any number of pushes) as one [`ParsedOutput`].
pub fn collect(pieces: impl IntoIterator<Item = Piece>) -> ParsedOutput {
    let mut content = String::new();
    let mut calls = Vec::new();
    for p in pieces {
        match p {
            Piece::Content(t) => content.push_str(&t),
            Piece::Call(c) => calls.push(c),
        }
    }
    let content = if !calls.is_empty() && content.trim().is_empty() {
        None
    } else {
        Some(content)
    };
    ParsedOutput { content, calls }
}

/// The incremental parser: [`push`](Self::push) each delta, then [`finish`](Self::finish).
#[derive(Debug, Default)]
pub struct ToolCallParser {
    /// Text not decided yet: inside a call, the call's body so far; outside, a tail that may
    /// begin `<tool_call>`.
    buf: String,
    in_call: bool,
    /// Just after a parsed call: leading whitespace is dropped.
    after_call: bool,
    /// Whitespace at the end of the content so far, held back: dropped if a call follows.
    held_ws: String,
    /// Calls emitted so far.
    calls: usize,
}

impl ToolCallParser {
    /// Calls emitted so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds `delta`; returns what it decided.
    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        loop {
            if self.in_call {
                let Some(end) = self.buf.find(CLOSE) else {
                    break;
                };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.in_call = false;
                self.end_call(&body, true, &mut out);
                continue;
            }
            if self.after_call {
                let trimmed = self.buf.trim_start().len();
                self.buf.drain(..self.buf.len() - trimmed);
                if self.buf.is_empty() {
                    break;
                }
                self.after_call = false;
            }
            if let Some(start) = self.buf.find(OPEN) {
                let text = self.buf[..start].to_string();
                self.buf.drain(..start + OPEN.len());
                self.text(&text, &mut out);
                self.in_call = true;
                continue;
            }
            let keep = partial_open_len(&self.buf);
            let text = self.buf[..self.buf.len() - keep].to_string();
            self.buf.drain(..self.buf.len() - keep);
            self.text(&text, &mut out);
            break;
        }
        out
    }

    /// The end of the output: whatever is held back is decided.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        if self.in_call {
            self.in_call = false;
            self.end_call(&rest, false, &mut out);
        } else if !(self.after_call && rest.trim().is_empty()) {
            self.text(&rest, &mut out);
        }
        if !self.held_ws.is_empty() {
            out.push(Piece::Content(std::mem::take(&mut self.held_ws)));
        }
        out
    }

    /// A call's body is complete (`closed`: its `</tool_call>` was seen).
    fn end_call(&mut self, body: &str, closed: bool, out: &mut Vec<Piece>) {
        match parse_call(body) {
            Some(call) => {
                self.held_ws.clear();
                self.calls += 1;
                self.after_call = true;
                out.push(Piece::Call(call));
            }
            None => {
                let mut raw = std::mem::take(&mut self.held_ws);
                raw.push_str(OPEN);
                raw.push_str(body);
                if closed {
                    raw.push_str(CLOSE);
                }
                out.push(Piece::Content(raw));
            }
        }
    }

    /// Content text: emitted up to its trailing whitespace, which is held back.
    fn text(&mut self, text: &str, out: &mut Vec<Piece>) {
        if text.is_empty() {
            return;
        }
        let mut all = std::mem::take(&mut self.held_ws);
        all.push_str(text);
        let body = all.trim_end().len();
        self.held_ws = all[body..].to_string();
        all.truncate(body);
        if !all.is_empty() {
            out.push(Piece::Content(all));
        }
    }
}

/// The length of the longest tail of `s` that is a proper prefix of [`OPEN`].
fn partial_open_len(s: &str) -> usize {
    (1..OPEN.len())
        .rev()
        .find(|&n| s.len() >= n && s.is_char_boundary(s.len() - n) && s.ends_with(&OPEN[..n]))
        .unwrap_or(0)
}

/// A call's body as a call, or `None` when it is not one.
pub fn parse_call(body: &str) -> Option<ParsedCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let arguments = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s).ok()? {
            o @ Value::Object(_) => o,
            _ => return None,
        },
        Some(o @ Value::Object(_)) => o.clone(),
        Some(_) => return None,
    };
    Some(ParsedCall {
        name: name.to_string(),
        arguments: serde_json::to_string(&arguments).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn call(name: &str, args: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn plain_text_is_content_unchanged() {
        for t in [
            "",
            "hello",
            "  a <b> c\n\n",
            "<tool",
            "a <tool_cal",
            "x </tool_call>",
        ] {
            assert_eq!(
                parse_output(t),
                ParsedOutput {
                    content: Some(t.into()),
                    calls: vec![]
                }
            );
        }
    }

    #[test]
    fn qwen_calls_parse_and_content_is_null() {
        let t = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let p = parse_output(t);
        assert_eq!(p.content, None);
        assert_eq!(
            p.calls,
            vec![
                call("get_weather", "{\"city\":\"Paris\",\"unit\":\"c\"}"),
                call("now", "{}")
            ]
        );
    }

    #[test]
    fn text_around_calls_and_reasoning_kept() {
        let t = "<think>I need the weather.</think>\n\nLet me check.\n<tool_call>{\"name\":\"w\",\"parameters\":{\"a\":1}}</tool_call>\nDone.";
        let p = parse_output(t);
        assert_eq!(
            p.content.as_deref(),
            Some("<think>I need the weather.</think>\n\nLet me check.Done.")
        );
        assert_eq!(p.calls, vec![call("w", "{\"a\":1}")]);
        // A call inside the reasoning block is still a call.
        let p = parse_output(
            "<think>x <tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call></think>",
        );
        assert_eq!(p.calls, vec![call("f", "{}")]);
        assert_eq!(p.content.as_deref(), Some("<think>x</think>"));
    }

    #[test]
    fn bad_calls_stay_content() {
        for t in [
            "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",
            "<tool_call>not json</tool_call> after",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}",
            "a <tool_call>",
        ] {
            let p = parse_output(t);
            assert!(p.calls.is_empty(), "{t}");
            assert_eq!(p.content.as_deref(), Some(t));
        }
    }

    #[test]
    fn unterminated_whole_call_and_string_arguments() {
        let p = parse_output(
            "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": [1, 2]}\"}\n",
        );
        assert_eq!(p.calls, vec![call("f", "{\"x\":[1,2]}")]);
        assert_eq!(p.content, None);
    }

    #[test]
    fn markup_split_across_deltas_is_never_content() {
        let mut p = ToolCallParser::default();
        let mut pieces = Vec::new();
        for d in [
            "Hi <",
            "tool",
            "_ca",
            "ll>{\"name\":\"f\"",
            ",\"arguments\":{}}</to",
            "ol_call>",
        ] {
            let got = p.push(d);
            for g in &got {
                if let Piece::Content(c) = g {
                    assert!(!c.contains('<'), "{c:?}");
                }
            }
            pieces.extend(got);
        }
        pieces.extend(p.finish());
        assert_eq!(
            collect(pieces),
            ParsedOutput {
                content: Some("Hi".into()),
                calls: vec![call("f", "{}")]
            }
        );
    }

    fn fragments() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("<tool_call>".to_string()),
            Just("</tool_call>".to_string()),
            Just(
                "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"q\": \"a b\"}}\n</tool_call>"
                    .to_string()
            ),
            Just("{\"name\": \"f\", \"arguments\": {}}".to_string()),
            Just("<think>".to_string()),
            Just("</think>".to_string()),
            Just("\n".to_string()),
            Just(" ".to_string()),
            Just("<".to_string()),
            Just("<tool".to_string()),
            "[a-z é]{0,6}",
        ]
    }

    proptest! {
        /// Any split of any text into deltas gives what one push gives.
        #[test]
        fn any_split_gives_the_whole_parse(
            parts in proptest::collection::vec(fragments(), 0..12),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
        ) {
            let text: String = parts.concat();
            let whole = parse_output(&text);
            let mut points: Vec<usize> = cuts
                .iter()
                .map(|c| if text.is_empty() { 0 } else { c % (text.len() + 1) })
                .filter(|&c| text.is_char_boundary(c))
                .collect();
            points.sort_unstable();
            let mut p = ToolCallParser::default();
            let mut pieces = Vec::new();
            let mut at = 0;
            for c in points {
                pieces.extend(p.push(&text[at..c]));
                at = c;
            }
            pieces.extend(p.push(&text[at..]));
            pieces.extend(p.finish());
            prop_assert_eq!(collect(pieces), whole.clone());
            if whole.calls.is_empty() {
                prop_assert_eq!(whole.content.as_deref(), Some(text.as_str()));
            }
        }
    }
}
