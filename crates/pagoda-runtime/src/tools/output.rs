//! The parser the chat routes run over a model's output when tools are offered: calls in
//! `<tool_call>` markup ([`ToolCallParser`], streamed as they are written) and calls written
//! without markup ([`super::bare`]: the whole output one call object naming an offered
//! tool, bare or in a code fence).
//!
//! Invariants: the pieces of any split of the output into deltas are those of one push of the
//! whole ([`OutputParser::parse`]); an output that cannot be a bare call (its first visible
//! character is not `{`, `[` or a fence) is parsed exactly as [`ToolCallParser`] parses it,
//! with no delay; one that may be is held back until its end, then given as whole calls
//! ([`Piece::Call`]) or, when it is not one, parsed as markup.

use super::bare::{BareCallGate, Gated};
use super::parse::{collect, ParsedOutput, Piece, ToolCallParser};

/// See the module doc.
#[derive(Debug)]
pub struct OutputParser {
    markup: ToolCallParser,
    gate: BareCallGate,
    /// The offered tools' names: a bare call must name one.
    offered: Vec<String>,
    bare_calls: usize,
}

impl OutputParser {
    /// A parser for an output whose request offered tools named `offered`.
    pub fn new(offered: Vec<String>) -> Self {
        OutputParser {
            markup: ToolCallParser::default(),
            gate: BareCallGate::default(),
            offered,
            bare_calls: 0,
        }
    }

    /// Calls begun so far (streamed calls count from their first piece).
    pub fn calls(&self) -> usize {
        self.markup.calls() + self.bare_calls
    }

    /// Feeds `delta`; returns what it decided.
    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        match self.gate.push(delta) {
            Gated::Held => Vec::new(),
            Gated::Pass(text) => self.markup.push(&text),
        }
    }

    /// The end of the output: whatever is held back is decided.
    pub fn finish(&mut self) -> Vec<Piece> {
        match self.gate.finish(&self.offered) {
            Ok(calls) => {
                self.bare_calls += calls.len();
                calls.into_iter().map(Piece::Call).collect()
            }
            Err(rest) => {
                let mut pieces = self.markup.push(&rest);
                pieces.extend(self.markup.finish());
                pieces
            }
        }
    }

    /// The pieces of a whole output.
    pub fn parse(mut self, text: &str) -> Vec<Piece> {
        let mut pieces = self.push(text);
        pieces.extend(self.finish());
        pieces
    }
}

/// A whole output's content and calls, given the offered tools' names.
pub fn parse_output_offered(text: &str, offered: Vec<String>) -> ParsedOutput {
    collect(OutputParser::new(offered).parse(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn offered() -> Vec<String> {
        vec!["get_weather".into()]
    }

    #[test]
    fn bare_fenced_and_markup_calls_are_all_calls() {
        for text in [
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        ] {
            let p = parse_output_offered(text, offered());
            assert_eq!(p.content, None, "{text}");
            assert_eq!(p.calls.len(), 1, "{text}");
            assert_eq!(p.calls[0].name, "get_weather");
            let args: serde_json::Value = serde_json::from_str(&p.calls[0].arguments).unwrap();
            assert_eq!(args, serde_json::json!({"city": "Paris"}));
        }
        // Not offered, or not the whole output: content.
        for text in [
            "{\"name\": \"other\", \"arguments\": {}}",
            "Sure: {\"name\": \"get_weather\", \"arguments\": {}}",
            "{\"city\": \"Paris\"}",
        ] {
            let p = parse_output_offered(text, offered());
            assert!(p.calls.is_empty(), "{text}");
            assert_eq!(p.content.as_deref(), Some(text));
        }
    }

    #[test]
    fn prose_streams_without_delay() {
        let mut p = OutputParser::new(offered());
        assert_eq!(p.push("It"), vec![Piece::Content("It".into())]);
        let mut p = OutputParser::new(offered());
        assert!(p.push("{\"na").is_empty());
        assert!(p.push("me\": \"get_weather\"}").is_empty());
        assert!(matches!(&p.finish()[..], [Piece::Call(c)] if c.name == "get_weather"));
        assert_eq!(p.calls(), 1);
    }

    proptest! {
        /// Any split gives what one push of the whole gives.
        #[test]
        fn any_split_gives_the_whole_parse(
            parts in proptest::collection::vec(prop_oneof![
                Just("```json\n".to_string()),
                Just("```".to_string()),
                Just("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}".to_string()),
                Just("<tool_call>".to_string()),
                Just("</tool_call>".to_string()),
                Just("\n".to_string()),
                "[a-z {}\"]{0,4}",
            ], 0..8),
            cut in any::<usize>(),
        ) {
            let text: String = parts.concat();
            let whole = parse_output_offered(&text, offered());
            let mut at = if text.is_empty() { 0 } else { cut % (text.len() + 1) };
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            let mut p = OutputParser::new(offered());
            let mut pieces = p.push(&text[..at]);
            pieces.extend(p.push(&text[at..]));
            pieces.extend(p.finish());
            prop_assert_eq!(collect(pieces), whole);
        }
    }
}
