//! gpt-oss's harmony response format: the output is a run of messages, each
//! `[<|start|>ROLE[ to=RECIPIENT]]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY`
//! ended by `<|end|>`, `<|return|>` or `<|call|>` (the first message's `<|start|>assistant`
//! is the end of the prompt). The recipient may stand in the role header or after the
//! channel, as OpenAI's harmony guide shows both.
//!
//! A message goes by its header:
//! - to `functions.NAME`, with tools offered: a call of `NAME`, its body the arguments JSON,
//!   streamed as written (whitespace outside strings left out): [`Piece::CallStart`] once the
//!   header is whole, [`Piece::CallArguments`] as the body comes, [`Piece::CallEnd`] at its
//!   end (an empty body is `{}`);
//! - channel `analysis`: reasoning ([`Piece::Reasoning`]);
//! - anything else (`final`, a `commentary` preamble, a recipient that is not an offered
//!   function): content.
//!
//! Text before any header is content, as written. Markup (headers, markers) is never emitted.
//!
//! Invariants: any split of the output into deltas gives the same pieces, concatenated by
//! kind, as one push of the whole (a tail that may begin a marker is held back until the
//! next delta decides); a call's argument pieces concatenate to its `arguments`.

use crate::tools::parse::{ParsedCall, Piece};
use crate::tools::partial::{held_tail, minify};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
/// The markers that end a message's body.
const ENDS: [&str; 4] = ["<|end|>", "<|return|>", "<|call|>", START];

/// Where a message's body goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Reasoning,
    Content,
    /// A call: its name, its raw arguments so far and the arguments sent.
    Call {
        name: String,
        raw: String,
        sent: String,
    },
}

#[derive(Debug)]
enum State {
    /// Before any header: content until a marker.
    Lead,
    /// In a header (the text so far is in `buf`).
    Header,
    /// In a body.
    Body(Route),
}

/// The streaming parser: [`push`](Self::push) each delta, then [`finish`](Self::finish).
#[derive(Debug)]
pub struct HarmonyParser {
    /// Calls to `functions.NAME` are calls (tools were offered).
    calls_on: bool,
    state: State,
    buf: String,
    calls: usize,
}

impl HarmonyParser {
    pub fn new(calls_on: bool) -> Self {
        HarmonyParser {
            calls_on,
            state: State::Lead,
            buf: String::new(),
            calls: 0,
        }
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.state, State::Lead) {
            State::Lead => push_text(&mut out, Piece::Content(rest)),
            // A header cut off: markup, dropped.
            State::Header => {}
            State::Body(route) => {
                let route = self.body_text(route, &rest, &mut out);
                self.end_body(route, &mut out);
            }
        }
        out
    }

    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match std::mem::replace(&mut self.state, State::Lead) {
            State::Lead => {
                let first = [START, CHANNEL]
                    .iter()
                    .filter_map(|m| self.buf.find(m).map(|at| (at, *m)))
                    .min();
                if let Some((at, marker)) = first {
                    let text = self.buf[..at].to_string();
                    push_text(out, Piece::Content(text));
                    let skip = if marker == START {
                        at + START.len()
                    } else {
                        at
                    };
                    self.buf.drain(..skip);
                    self.state = State::Header;
                    return true;
                }
                let keep = held_tail(&self.buf, START).max(held_tail(&self.buf, CHANNEL));
                let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                push_text(out, Piece::Content(text));
                false
            }
            State::Header => {
                let Some(at) = self.buf.find(MESSAGE) else {
                    self.state = State::Header;
                    return false;
                };
                let header: String = self.buf.drain(..at + MESSAGE.len()).collect();
                let route = self.route(&header[..at]);
                if let Route::Call { name, .. } = &route {
                    self.calls += 1;
                    out.push(Piece::CallStart { name: name.clone() });
                }
                self.state = State::Body(route);
                true
            }
            State::Body(route) => {
                let end = ENDS
                    .iter()
                    .filter_map(|m| self.buf.find(m).map(|at| (at, *m)))
                    .min();
                match end {
                    Some((at, marker)) => {
                        let text: String = self.buf.drain(..at).collect();
                        let route = self.body_text(route, &text, out);
                        self.end_body(route, out);
                        // `<|start|>` begins the next header; the others end the message.
                        self.buf.drain(..marker.len());
                        self.state = State::Header;
                        if marker != START {
                            // The next message's `<|start|>` (or the end).
                            self.state = State::Lead;
                        }
                        true
                    }
                    None => {
                        let keep = ENDS
                            .iter()
                            .map(|m| held_tail(&self.buf, m))
                            .max()
                            .unwrap_or(0);
                        let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                        let route = self.body_text(route, &text, out);
                        self.state = State::Body(route);
                        false
                    }
                }
            }
        }
    }

    /// The route of a message whose header (without `<|message|>`) is `header`.
    fn route(&self, header: &str) -> Route {
        let recipient = header.split_once("to=").map(|(_, r)| {
            r.split(|c: char| c.is_whitespace() || c == '<')
                .next()
                .unwrap_or("")
        });
        if let Some(name) = recipient.and_then(|r| r.strip_prefix("functions.")) {
            if self.calls_on && !name.is_empty() {
                return Route::Call {
                    name: name.to_string(),
                    raw: String::new(),
                    sent: String::new(),
                };
            }
            return Route::Content;
        }
        let channel = header.split_once(CHANNEL).map(|(_, c)| {
            c.split(|c: char| c.is_whitespace() || c == '<')
                .next()
                .unwrap_or("")
        });
        match channel {
            Some("analysis") if recipient.is_none() => Route::Reasoning,
            _ => Route::Content,
        }
    }

    /// Body text for `route`.
    fn body_text(&mut self, route: Route, text: &str, out: &mut Vec<Piece>) -> Route {
        match route {
            Route::Reasoning => {
                push_text(out, Piece::Reasoning(text.to_string()));
                Route::Reasoning
            }
            Route::Content => {
                push_text(out, Piece::Content(text.to_string()));
                Route::Content
            }
            Route::Call {
                name,
                mut raw,
                mut sent,
            } => {
                raw.push_str(text);
                let args = minify(&raw);
                if let Some(new) = args.strip_prefix(sent.as_str()).filter(|n| !n.is_empty()) {
                    out.push(Piece::CallArguments(new.to_string()));
                    sent = args;
                }
                Route::Call { name, raw, sent }
            }
        }
    }

    /// A message's body ended.
    fn end_body(&mut self, route: Route, out: &mut Vec<Piece>) {
        if let Route::Call {
            name,
            raw,
            mut sent,
        } = route
        {
            if sent.is_empty() {
                sent.push_str("{}");
                out.push(Piece::CallArguments(sent.clone()));
            }
            out.push(Piece::CallEnd {
                call: ParsedCall {
                    name,
                    arguments: sent,
                },
                text: raw,
            });
        }
    }
}

/// `piece` onto `out`, unless its text is empty.
fn push_text(out: &mut Vec<Piece>, piece: Piece) {
    match &piece {
        Piece::Content(t) | Piece::Reasoning(t) if t.is_empty() => {}
        _ => out.push(piece),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::parse::collect;
    use proptest::prelude::*;

    fn parse(text: &str, calls: bool) -> Vec<Piece> {
        let mut p = HarmonyParser::new(calls);
        let mut pieces = p.push(text);
        pieces.extend(p.finish());
        pieces
    }

    fn reasoning(pieces: &[Piece]) -> String {
        pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Reasoning(r) => Some(r.as_str()),
                _ => None,
            })
            .collect()
    }

    const ANSWER: &str = "<|channel|>analysis<|message|>User greets. Reply.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>";
    const CALL: &str = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
    const CALL_IN_ROLE: &str = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\"}";

    #[test]
    fn channels_split_into_reasoning_content_and_calls() {
        let pieces = parse(ANSWER, true);
        assert_eq!(reasoning(&pieces), "User greets. Reply.");
        let out = collect(pieces);
        assert_eq!(out.content.as_deref(), Some("Hello! How can I help?"));
        for text in [CALL, CALL_IN_ROLE] {
            let pieces = parse(text, true);
            assert_eq!(reasoning(&pieces), "Need weather.");
            assert!(pieces.contains(&Piece::CallStart {
                name: "get_weather".into()
            }));
            let out = collect(pieces);
            assert_eq!(out.content, None);
            assert_eq!(
                out.calls,
                vec![ParsedCall {
                    name: "get_weather".into(),
                    arguments: "{\"city\":\"Paris\"}".into()
                }]
            );
        }
        // Tools not offered: the call's body is content.
        let out = collect(parse(CALL, false));
        assert!(out.calls.is_empty());
        assert_eq!(out.content.as_deref(), Some("{\"city\": \"Paris\"}"));
        // A commentary preamble is content; text without markup is content.
        let out = collect(parse(
            "<|channel|>commentary<|message|>Checking.<|end|>",
            true,
        ));
        assert_eq!(out.content.as_deref(), Some("Checking."));
        assert_eq!(
            collect(parse("plain text", true)).content.as_deref(),
            Some("plain text")
        );
    }

    #[test]
    fn the_call_starts_at_its_header() {
        let mut p = HarmonyParser::new(true);
        let head =
            p.push("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
        assert_eq!(
            head,
            vec![Piece::CallStart {
                name: "get_weather".into()
            }]
        );
        assert_eq!(p.push("{\"ci"), vec![Piece::CallArguments("{\"ci".into())]);
        assert_eq!(p.calls(), 1);
    }

    proptest! {
        #[test]
        fn any_split_gives_the_whole_parse(
            which in 0usize..3,
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
        ) {
            let text = [ANSWER, CALL, CALL_IN_ROLE][which];
            let whole = parse(text, true);
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (text.len() + 1)).collect();
            at.extend([0, text.len()]);
            at.sort_unstable();
            at.dedup();
            let mut p = HarmonyParser::new(true);
            let mut pieces = Vec::new();
            for w in at.windows(2) {
                pieces.extend(p.push(&text[w[0]..w[1]]));
            }
            pieces.extend(p.finish());
            let args = |ps: &[Piece]| -> String {
                ps.iter()
                    .filter_map(|p| match p {
                        Piece::CallArguments(a) => Some(a.as_str()),
                        _ => None,
                    })
                    .collect()
            };
            prop_assert_eq!(args(&pieces), args(&whole));
            prop_assert_eq!(reasoning(&pieces), reasoning(&whole));
            prop_assert_eq!(collect(pieces), collect(whole));
        }
    }
}
