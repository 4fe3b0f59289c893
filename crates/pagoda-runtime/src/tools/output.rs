//! The parser the chat routes run over a model's output: its reasoning split off first
//! ([`crate::formats::reasoning`], when the model's format has it: [`Piece::Reasoning`]),
//! then, when tools are offered, calls in the family's markup ([`ToolCallParser`] for
//! `<tool_call>` JSON; [`MarkedCalls`] with a [`super::formats`] syntax for the others; both
//! stream a call's arguments as they are written) and calls written without
//! markup ([`super::bare`]: the whole output one call object naming an offered tool, bare
//! or in a code fence; for the formats whose templates teach it).
//! gpt-oss's harmony output is parsed whole by [`HarmonyParser`] (channels and calls).
//! The routes handle the same [`Piece`]s whatever the format.
//!
//! Invariants: the pieces of any split of the output into deltas are those of one push of the
//! whole ([`OutputParser::parse`]); an output that cannot be a bare call (its first visible
//! character is not `{`, `[` or a fence) is parsed exactly as [`ToolCallParser`] parses it,
//! with no delay; one that may be is held back until its end, then given as whole calls
//! ([`Piece::Call`]) or, when it is not one, parsed as markup.

use super::bare::{BareCallGate, Gated};
use super::formats::ToolCallFormat;
use super::marked::MarkedCalls;
use super::parse::{collect, ParsedOutput, Piece, ToolCallParser};
use super::Offered;
use crate::formats::harmony::HarmonyParser;
use crate::formats::reasoning::{ReasoningFormat, ReasoningSplitter, Split};

/// How a model's output is written: its call syntax and its reasoning markers, chosen from
/// its chat template ([`crate::formats::OutputFormats::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutputFormats {
    pub tools: ToolCallFormat,
    /// The reasoning markers, when the model reasons.
    pub reasoning: Option<ReasoningFormat>,
    /// The prompt opened the reasoning block: the output begins inside it.
    pub reasoning_open: bool,
}

/// The call parser of one format.
#[derive(Debug)]
enum Calls {
    /// No tools offered: content passes.
    Off,
    Hermes(ToolCallParser),
    Marked(MarkedCalls),
}

/// See the module doc.
#[derive(Debug)]
pub struct OutputParser {
    /// gpt-oss's harmony format: this parser takes the whole output (channels and calls).
    harmony: Option<HarmonyParser>,
    reasoning: Option<ReasoningSplitter>,
    calls: Calls,
    /// Holds an output back while it may be a bare call (formats that take them).
    gate: Option<BareCallGate>,
    /// The offered tools' names: a bare call must name one.
    offered: Vec<String>,
    bare_calls: usize,
}

impl OutputParser {
    /// A parser for an output whose request offered tools named `offered`, written as the
    /// fallback prompt and Qwen2.5 write calls, without reasoning.
    pub fn new(offered: Vec<String>) -> Self {
        Self::with_formats(Some(offered.into()), OutputFormats::default())
    }

    /// A parser for `formats`: calls parsed when tools were `offered`, reasoning split when
    /// the format has it.
    pub fn with_formats(offered: Option<Offered>, formats: OutputFormats) -> Self {
        let (calls, gate) = match &offered {
            None => (Calls::Off, None),
            Some(offered) => {
                let calls = match formats.tools.syntax(offered) {
                    Some(syntax) => Calls::Marked(MarkedCalls::new(syntax)),
                    None => Calls::Hermes(ToolCallParser::default()),
                };
                let gate = formats.tools.takes_bare_calls().then(BareCallGate::default);
                (calls, gate)
            }
        };
        let harmony = formats.reasoning == Some(ReasoningFormat::Harmony)
            || formats.tools == ToolCallFormat::Harmony;
        OutputParser {
            harmony: harmony.then(|| HarmonyParser::new(offered.is_some())),
            reasoning: formats
                .reasoning
                .filter(|_| !harmony)
                .map(|f| ReasoningSplitter::new(f, formats.reasoning_open)),
            calls,
            gate,
            offered: offered.map(|o| o.names).unwrap_or_default(),
            bare_calls: 0,
        }
    }

    /// Calls begun so far (streamed calls count from their first piece).
    pub fn calls(&self) -> usize {
        if let Some(h) = &self.harmony {
            return h.calls();
        }
        let parsed = match &self.calls {
            Calls::Off => 0,
            Calls::Hermes(p) => p.calls(),
            Calls::Marked(p) => p.calls(),
        };
        parsed + self.bare_calls
    }

    /// Feeds `delta`; returns what it decided.
    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        if let Some(h) = &mut self.harmony {
            return h.push(delta);
        }
        let splits = match &mut self.reasoning {
            Some(r) => r.push(delta),
            None => vec![Split::Content(delta.to_string())],
        };
        let mut out = Vec::new();
        for s in splits {
            self.split(s, &mut out);
        }
        out
    }

    /// The end of the output: whatever is held back is decided.
    pub fn finish(&mut self) -> Vec<Piece> {
        if let Some(h) = &mut self.harmony {
            return h.finish();
        }
        let mut out = Vec::new();
        if let Some(r) = &mut self.reasoning {
            for s in r.finish() {
                self.split(s, &mut out);
            }
        }
        let rest = match &mut self.gate {
            Some(gate) => match gate.finish(&self.offered) {
                Ok(calls) => {
                    self.bare_calls += calls.len();
                    out.extend(calls.into_iter().map(Piece::Call));
                    String::new()
                }
                Err(rest) => rest,
            },
            None => String::new(),
        };
        match &mut self.calls {
            Calls::Off => {}
            Calls::Hermes(p) => {
                out.extend(p.push(&rest));
                out.extend(p.finish());
            }
            Calls::Marked(p) => {
                out.extend(p.push(&rest));
                out.extend(p.finish());
            }
        }
        out
    }

    fn split(&mut self, s: Split, out: &mut Vec<Piece>) {
        let text = match s {
            Split::Reasoning(r) => {
                out.push(Piece::Reasoning(r));
                return;
            }
            Split::Content(c) => c,
        };
        let text = match &mut self.gate {
            Some(gate) => match gate.push(&text) {
                Gated::Held => return,
                Gated::Pass(t) => t,
            },
            None => text,
        };
        match &mut self.calls {
            Calls::Off => {
                if !text.is_empty() {
                    out.push(Piece::Content(text));
                }
            }
            Calls::Hermes(p) => out.extend(p.push(&text)),
            Calls::Marked(p) => out.extend(p.push(&text)),
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

/// A whole output's reasoning (`None` when it wrote none) and its content and calls, in
/// `formats`, calls parsed when tools were `offered`.
pub fn parse_reply(
    text: &str,
    offered: Option<Offered>,
    formats: OutputFormats,
) -> (Option<String>, ParsedOutput) {
    let pieces = OutputParser::with_formats(offered, formats).parse(text);
    let reasoning = reasoning_of(&pieces);
    (reasoning, collect(pieces))
}

/// The reasoning text of `pieces`, `None` when there is none.
pub fn reasoning_of(pieces: &[Piece]) -> Option<String> {
    let mut out: Option<String> = None;
    for p in pieces {
        if let Piece::Reasoning(r) = p {
            out.get_or_insert_with(String::new).push_str(r);
        }
    }
    out
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
