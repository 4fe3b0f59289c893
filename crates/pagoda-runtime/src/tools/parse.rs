//! The model's output text → content and tool calls, whole or as it streams.
//!
//! A call is `<tool_call>` + a JSON object `{"name": <string>, "arguments": <object>}` +
//! `</tool_call>` (whitespace around the JSON allowed; `parameters` is read as `arguments`,
//! and `arguments` given as a string holding a JSON object is read as that object). That is
//! what Qwen2.5's template asks for and what the fallback prompt asks for.
//!
//! A call comes in one of two forms:
//! - **Streamed**: its body begins, whitespace aside, `{"name": "<name>", "arguments": {` —
//!   a non-empty JSON string name first, then the arguments as an object. Once that much is
//!   written (before any `</tool_call>`), the call is committed: [`Piece::CallStart`] gives
//!   its name, then [`Piece::CallArguments`] give the arguments object's text exactly as the
//!   model writes it, as it arrives (a piece may end inside a JSON token, as OpenAI's do),
//!   and [`Piece::CallEnd`] gives the whole call when it ends. The arguments end where their
//!   object closes: JSON strings (with their escapes) and brace/bracket depth are tracked, so
//!   a `}` or a `</tool_call>` inside a string value is part of the arguments. What follows
//!   the object (the outer `}`, whitespace) up to the call's end is dropped.
//!   The call ends at the first `</tool_call>` (consumed) or `<tool_call>` (the next call)
//!   outside a JSON string, or at the end of the output. A `<` outside a string (never valid
//!   JSON) is held back only while it may begin either markup; markup is never arguments.
//!   `arguments` is the arguments text as written: the pieces concatenated, not
//!   re-serialized, and not checked — an object cut off by the end of the output (max
//!   tokens) or closed but not valid JSON is still the call's arguments. **Once committed, a
//!   call is never retracted.**
//! - **Whole**: any other body (`arguments` before `name`, `parameters`, `arguments` as a
//!   string, no `arguments`, not JSON) is decided at `</tool_call>` or at the end of the
//!   output, and gives one [`Piece::Call`] when it parses, with `arguments` re-serialized as
//!   compact JSON (object keys in the order written: serde_json is built with
//!   `preserve_order`, which llguidance turns on). A body that does not parse (or has no
//!   name, or non-object arguments) stays content, verbatim, markup included: nothing the
//!   model wrote is lost, nothing fails.
//!
//! Invariants:
//! - [`ToolCallParser`] gives the same content (concatenated), the same calls and, for a
//!   streamed call, the same name and arguments text for any split of the text into deltas;
//!   [`parse_output`] is one push of the whole text, so a non-streamed response gives each
//!   call's arguments exactly as the stream's pieces concatenate.
//! - `<tool_call>` markup is never emitted as content while it may still become a call: a
//!   text ending in a prefix of `<tool_call>` is held back until the next delta decides.
//!   Markup (`<tool_call>`, `</tool_call>`, the JSON around the arguments) is never emitted
//!   as arguments.
//! - A whole call is emitted once it is complete (its `</tool_call>` seen, or at the end of
//!   the output when its JSON is whole); a streamed call is emitted as it is written and is
//!   never turned back into content.
//! - Every call started is counted by [`ToolCallParser::calls`] in order: the `n`th
//!   [`Piece::CallStart`] or [`Piece::Call`] is call `n`, and [`Piece::CallArguments`] and
//!   [`Piece::CallEnd`] belong to the last call started.
//! - Whitespace between a call and the text around it belongs to neither (Qwen writes a
//!   newline between calls); with no call parsed, the content is exactly the text.
//! - Calls are found anywhere in the text, inside a `<think>…</think>` reasoning block too (a
//!   model that calls from within its reasoning does not lose the call); the reasoning itself
//!   stays in the content.

use serde_json::Value;

/// Opens a call.
pub const OPEN: &str = "<tool_call>";
/// Closes a call.
pub const CLOSE: &str = "</tool_call>";

/// One call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// A streamed call's arguments text as the model wrote it (an object, unless it was cut
    /// off or the model wrote bad JSON); a whole call's, compact JSON text of an object.
    pub arguments: String,
}

/// What a push of text gives: content text, a streamed call's pieces, or a whole call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    /// A streamed call begins (its name); its arguments follow in [`Piece::CallArguments`].
    CallStart {
        name: String,
    },
    /// The next piece of the streamed call's arguments text, as written.
    CallArguments(String),
    /// The streamed call has ended: `call` as its pieces gave it (`arguments`: the pieces
    /// concatenated), and `text`, the call as the model wrote it, markup included (for a
    /// consumer that cannot send these arguments as a call and keeps them as content).
    CallEnd {
        call: ParsedCall,
        text: String,
    },
    /// A whole call, decided at its end and not streamed.
    Call(ParsedCall),
    /// Reasoning text, split from the answer ([`crate::formats::reasoning`]); never part of
    /// the content.
    Reasoning(String),
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

/// Pieces (from any number of pushes) as one [`ParsedOutput`]: streamed calls are taken
/// from their [`Piece::CallEnd`].
pub fn collect(pieces: impl IntoIterator<Item = Piece>) -> ParsedOutput {
    let mut content = String::new();
    let mut calls = Vec::new();
    for p in pieces {
        match p {
            Piece::Content(t) => content.push_str(&t),
            Piece::Call(c) | Piece::CallEnd { call: c, .. } => calls.push(c),
            Piece::CallStart { .. } | Piece::CallArguments(_) | Piece::Reasoning(_) => {}
        }
    }
    let content = if !calls.is_empty() && content.trim().is_empty() {
        None
    } else {
        Some(content)
    };
    ParsedOutput { content, calls }
}

/// Where the parser is inside a call.
#[derive(Debug)]
enum Call {
    /// The body so far (in `buf`) may still begin the streamed form.
    Head,
    /// Not the streamed form: decided whole at `</tool_call>` or at the end.
    Whole,
    /// The streamed form, committed.
    Streamed(Streamed),
}

/// A committed call.
#[derive(Debug)]
struct Streamed {
    name: String,
    /// The call's text consumed so far, from `<tool_call>`.
    text: String,
    /// The arguments text emitted so far.
    arguments: String,
    scan: Scan,
    /// The arguments object has closed: what follows, up to the call's end, is dropped.
    closed: bool,
}

/// The incremental parser: [`push`](Self::push) each delta, then [`finish`](Self::finish).
#[derive(Debug, Default)]
pub struct ToolCallParser {
    /// Text not decided yet: inside a call, the call's body so far (from where a streamed
    /// call's emitted text ends); outside, a tail that may begin `<tool_call>`.
    buf: String,
    /// Inside a call: what is known of it.
    call: Option<Call>,
    /// Just after a parsed call: leading whitespace is dropped.
    after_call: bool,
    /// Whitespace at the end of the content so far, held back: dropped if a call follows.
    held_ws: String,
    /// Calls started so far (streamed calls count from their start).
    calls: usize,
}

impl ToolCallParser {
    /// Calls started so far: emitted whole, or streamed (counted from their
    /// [`Piece::CallStart`]).
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds `delta`; returns what it decided.
    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// The end of the output: whatever is held back is decided.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match self.call.take() {
            Some(Call::Head | Call::Whole) => self.end_whole(&rest, false, &mut out),
            Some(Call::Streamed(mut s)) => {
                // Only a `<` that might have begun markup is left; it was arguments text.
                if !s.closed && !rest.is_empty() {
                    s.arguments.push_str(&rest);
                    out.push(Piece::CallArguments(rest.clone()));
                }
                s.text.push_str(&rest);
                self.end_streamed(s, &mut out);
            }
            None => {
                if !(self.after_call && rest.trim().is_empty()) {
                    self.text(&rest, &mut out);
                }
            }
        }
        if !self.held_ws.is_empty() {
            out.push(Piece::Content(std::mem::take(&mut self.held_ws)));
        }
        out
    }

    /// Decides what `buf` allows; `false` when it needs more text.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match self.call.take() {
            None => self.step_outside(out),
            Some(Call::Head) => self.step_head(out),
            Some(Call::Whole) => {
                let Some(end) = self.buf.find(CLOSE) else {
                    self.call = Some(Call::Whole);
                    return false;
                };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.end_whole(&body, true, out);
                true
            }
            Some(Call::Streamed(s)) => self.step_streamed(s, out),
        }
    }

    /// Outside a call: content up to the next `<tool_call>`.
    fn step_outside(&mut self, out: &mut Vec<Piece>) -> bool {
        if self.after_call {
            let trimmed = self.buf.trim_start().len();
            self.buf.drain(..self.buf.len() - trimmed);
            if self.buf.is_empty() {
                return false;
            }
            self.after_call = false;
        }
        if let Some(start) = self.buf.find(OPEN) {
            let text = self.buf[..start].to_string();
            self.buf.drain(..start + OPEN.len());
            self.text(&text, out);
            self.call = Some(Call::Head);
            return true;
        }
        let keep = partial_open_len(&self.buf);
        let text = self.buf[..self.buf.len() - keep].to_string();
        self.buf.drain(..self.buf.len() - keep);
        self.text(&text, out);
        false
    }

    /// A call's body so far: committed once it begins the streamed form before any
    /// `</tool_call>`; whole once it cannot.
    fn step_head(&mut self, out: &mut Vec<Piece>) -> bool {
        let head = head(&self.buf);
        let close = match &head {
            Head::Start { args_at, .. } => self.buf[..*args_at].find(CLOSE),
            _ => self.buf.find(CLOSE),
        };
        match head {
            Head::Start { name, args_at } if close.is_none() => {
                let mut text = OPEN.to_string();
                text.push_str(&self.buf[..args_at]);
                self.buf.drain(..args_at);
                self.held_ws.clear();
                self.calls += 1;
                out.push(Piece::CallStart { name: name.clone() });
                self.call = Some(Call::Streamed(Streamed {
                    name,
                    text,
                    arguments: String::new(),
                    scan: Scan::default(),
                    closed: false,
                }));
                true
            }
            Head::Partial if close.is_none() => {
                self.call = Some(Call::Head);
                false
            }
            _ => {
                self.call = Some(Call::Whole);
                true
            }
        }
    }

    /// A committed call: its arguments as they come, then its end.
    fn step_streamed(&mut self, mut s: Streamed, out: &mut Vec<Piece>) -> bool {
        let b = self.buf.as_bytes();
        let mut i = 0;
        // Where the arguments closed in this text, if they did.
        let mut args_end = None;
        // The call ends at `i`, and this much markup there is its own.
        let mut ends = None;
        while i < b.len() {
            if b[i] == b'<' && !s.scan.in_string {
                let rest = &self.buf[i..];
                if rest.starts_with(CLOSE) {
                    ends = Some(CLOSE.len());
                    break;
                }
                if rest.starts_with(OPEN) {
                    ends = Some(0);
                    break;
                }
                if CLOSE.starts_with(rest) || OPEN.starts_with(rest) {
                    break;
                }
            }
            if !s.closed && s.scan.feed(b[i]) {
                s.closed = true;
                args_end = Some(i + 1);
            }
            i += 1;
        }
        let args = match args_end {
            Some(end) => end,
            None if s.closed => 0,
            None => i,
        };
        if args > 0 {
            let piece = self.buf[..args].to_string();
            s.arguments.push_str(&piece);
            out.push(Piece::CallArguments(piece));
        }
        let used = i + ends.unwrap_or(0);
        s.text.push_str(&self.buf[..used]);
        self.buf.drain(..used);
        if ends.is_some() {
            self.end_streamed(s, out);
            return true;
        }
        self.call = Some(Call::Streamed(s));
        false
    }

    fn end_streamed(&mut self, s: Streamed, out: &mut Vec<Piece>) {
        self.after_call = true;
        out.push(Piece::CallEnd {
            call: ParsedCall {
                name: s.name,
                arguments: s.arguments,
            },
            text: s.text,
        });
    }

    /// A whole call's body is complete (`closed`: its `</tool_call>` was seen).
    fn end_whole(&mut self, body: &str, closed: bool, out: &mut Vec<Piece>) {
        match whole_call(body) {
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

/// The JSON state of a streamed call's arguments, fed byte by byte (the structural
/// characters are ASCII, which never occurs inside a multi-byte UTF-8 character).
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Open braces and brackets.
    pub(crate) depth: usize,
    pub(crate) in_string: bool,
    /// Just after a backslash in a string.
    pub(crate) escaped: bool,
}

impl Scan {
    /// Feeds the next byte; `true` when it closes the arguments object.
    pub(crate) fn feed(&mut self, c: u8) -> bool {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == b'\\' {
                self.escaped = true;
            } else if c == b'"' {
                self.in_string = false;
            }
            return false;
        }
        match c {
            b'"' => self.in_string = true,
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                return self.depth == 0;
            }
            _ => {}
        }
        false
    }
}

/// How far a call's body begins the streamed form.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Head {
    /// It may still: the body is a prefix of it.
    Partial,
    /// It cannot.
    No,
    /// It does: the name, and where the arguments object's `{` is.
    Start { name: String, args_at: usize },
}

/// Whether `body` begins `{"name": "<name>", "arguments": {` (JSON whitespace anywhere
/// between the tokens; the name a JSON string, non-empty once trimmed).
fn head(body: &str) -> Head {
    head_keys(body, &["arguments"])
}

/// One token of a streamed call's head.
#[derive(Clone, Copy)]
enum Token {
    Lit(&'static str),
    /// The name: a JSON string.
    Name,
    /// The arguments key: a JSON string, one of the keys allowed.
    Key,
}

/// Whether `body` begins `{"name": "<name>", "<key>": {` with `<key>` one of `keys`, as
/// [`head`] (Llama writes `parameters`).
pub(crate) fn head_keys(body: &str, keys: &[&str]) -> Head {
    const TOKENS: [Token; 8] = [
        Token::Lit("{"),
        Token::Lit("\"name\""),
        Token::Lit(":"),
        Token::Name,
        Token::Lit(","),
        Token::Key,
        Token::Lit(":"),
        Token::Lit("{"),
    ];
    let b = body.as_bytes();
    let mut i = 0;
    let mut name = None;
    for token in TOKENS {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        if i == b.len() {
            return Head::Partial;
        }
        match token {
            Token::Lit(lit) => {
                for &c in lit.as_bytes() {
                    if i == b.len() {
                        return Head::Partial;
                    }
                    if b[i] != c {
                        return Head::No;
                    }
                    i += 1;
                }
            }
            Token::Name | Token::Key => {
                if b[i] != b'"' {
                    return Head::No;
                }
                let start = i;
                let mut scan = Scan::default();
                scan.feed(b'"');
                i += 1;
                while scan.in_string {
                    if i == b.len() {
                        return Head::Partial;
                    }
                    scan.feed(b[i]);
                    i += 1;
                }
                let Ok(text) = serde_json::from_str::<String>(&body[start..i]) else {
                    return Head::No;
                };
                match token {
                    Token::Name if !text.trim().is_empty() => name = Some(text.trim().to_string()),
                    Token::Key if keys.contains(&text.as_str()) => {}
                    _ => return Head::No,
                }
            }
        }
    }
    match name {
        Some(name) => Head::Start {
            name,
            args_at: i - 1,
        },
        None => Head::No,
    }
}

/// A call's body (the text between `<tool_call>` and `</tool_call>`) as a call, or `None`
/// when it is not one: the streamed form gives its arguments text as written (up to where
/// the object closes, or all of it when it does not), as the parser does; any other, the
/// whole JSON read, with `arguments` re-serialized.
pub fn parse_call(body: &str) -> Option<ParsedCall> {
    if let Head::Start { name, args_at } = head(body) {
        let rest = &body[args_at..];
        let mut scan = Scan::default();
        let end = rest
            .bytes()
            .position(|c| scan.feed(c))
            .map_or(rest.len(), |i| i + 1);
        return Some(ParsedCall {
            name,
            arguments: rest[..end].to_string(),
        });
    }
    whole_call(body)
}

/// A body not in the streamed form as a call, or `None` when it is not one.
fn whole_call(body: &str) -> Option<ParsedCall> {
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

    /// All pieces of `text` pushed in `parts`-sized steps (in chars), then finished.
    fn pieces_by(text: &str, step: usize) -> Vec<Piece> {
        let chars: Vec<char> = text.chars().collect();
        let mut p = ToolCallParser::default();
        let mut out = Vec::new();
        for chunk in chars.chunks(step.max(1)) {
            out.extend(p.push(&chunk.iter().collect::<String>()));
        }
        out.extend(p.finish());
        out
    }

    /// Checks the streamed calls' pieces are well-formed: each `CallStart` is followed only
    /// by its `CallArguments` and then its `CallEnd`, whose call has that name and the
    /// pieces concatenated as arguments. Returns each streamed call's argument pieces.
    fn streamed_calls(pieces: &[Piece]) -> Vec<(String, Vec<String>)> {
        let mut calls: Vec<(String, Vec<String>)> = Vec::new();
        let mut open = false;
        for p in pieces {
            match p {
                Piece::CallStart { name } => {
                    assert!(!open, "{pieces:?}");
                    open = true;
                    calls.push((name.clone(), Vec::new()));
                }
                Piece::CallArguments(a) => {
                    assert!(open, "{pieces:?}");
                    assert!(!a.is_empty());
                    calls.last_mut().unwrap().1.push(a.clone());
                }
                Piece::CallEnd { call, text } => {
                    assert!(open, "{pieces:?}");
                    open = false;
                    let (name, args) = calls.last().unwrap();
                    assert_eq!(&call.name, name);
                    assert_eq!(call.arguments, args.concat());
                    assert!(text.starts_with(OPEN) && text.contains(&call.arguments));
                }
                Piece::Content(_) | Piece::Call(_) | Piece::Reasoning(_) => {
                    assert!(!open, "{pieces:?}")
                }
            }
        }
        assert!(!open, "{pieces:?}");
        calls
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
        // The streamed form: the arguments as written.
        assert_eq!(
            p.calls,
            vec![
                call("get_weather", "{\"city\": \"Paris\", \"unit\": \"c\"}"),
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
            "<tool_call>not json</tool_call> after",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            "<tool_call>{\"name\": \"\", \"arguments\": {\"a\": 1}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1\"}</tool_call>",
            "<tool_call>{\"name\": \"a</tool_call>\", \"arguments\": {}}",
            "<tool_call>{\"name\": \"f\", \"argu",
            "a <tool_call>",
        ] {
            let p = parse_output(t);
            assert!(p.calls.is_empty(), "{t}");
            assert_eq!(p.content.as_deref(), Some(t));
        }
    }

    #[test]
    fn committed_calls_are_never_retracted() {
        for (t, args) in [
            // Arguments cut off by the end of the output (max tokens).
            (
                "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, ",
                "{\"a\": [1, ",
            ),
            // Whole arguments, the call's end never written.
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}",
                "{\"a\": 1}",
            ),
            // Closed early by the markup.
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",
                "{",
            ),
            // Closed, but not JSON.
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\" 1, }}</tool_call>",
                "{\"a\" 1, }",
            ),
            // A `<` that begins no markup is arguments text.
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1 <b}}</tool_call>",
                "{\"a\": 1 <b}",
            ),
            // A dangling `<` at the end too.
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": <",
                "{\"a\": <",
            ),
        ] {
            for step in 1..=t.len() {
                let pieces = pieces_by(t, step);
                let streamed = streamed_calls(&pieces);
                assert_eq!(streamed.len(), 1, "{t}");
                assert_eq!(streamed[0].1.concat(), args, "{t}");
                assert_eq!(
                    collect(pieces),
                    ParsedOutput {
                        content: None,
                        calls: vec![call("f", args)]
                    },
                    "{t} by {step}"
                );
            }
        }
    }

    #[test]
    fn other_forms_are_whole_and_compact() {
        for (t, args) in [
            (
                "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>",
                "{\"a\":1}",
            ),
            (
                "<tool_call>{\"name\": \"f\", \"parameters\": { \"b\": 2, \"a\": 1 }}</tool_call>",
                "{\"b\":2,\"a\":1}",
            ),
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
                "{\"a\":1}",
            ),
            ("<tool_call>{\"name\": \"f\"}</tool_call>", "{}"),
            (
                "<tool_call>{\"name\": \"f\", \"id\": 3, \"arguments\": {\"a\": 1}}</tool_call>",
                "{\"a\":1}",
            ),
        ] {
            let pieces = pieces_by(t, 1);
            assert_eq!(pieces, vec![Piece::Call(call("f", args))], "{t}");
            assert_eq!(
                parse_call(&t[OPEN.len()..t.len() - CLOSE.len()]),
                Some(call("f", args))
            );
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
    fn a_streamed_call_token_by_token() {
        // Braces, brackets, escaped quotes and backslashes, the markup and non-ASCII text
        // inside strings; the outer `}` and the markup around are not arguments.
        let args = "{\"q\": \"a } { ] \\\" \\\\\", \"n\": [1, {\"m\": \"</tool_call><tool_call>\"}], \"é\": {}}";
        let t = format!("Let me look.\n<tool_call>\n{{ \"name\" : \"search\" ,\n \"arguments\": {args}}}\n</tool_call>\n<tool_call>{{\"name\":\"now\",\"arguments\":{{}}}}</tool_call>\nDone.");
        for step in 1..=4 {
            let pieces = pieces_by(&t, step);
            // The name comes first, before any arguments piece.
            let first_call = pieces
                .iter()
                .position(|p| !matches!(p, Piece::Content(_)))
                .unwrap();
            assert_eq!(
                pieces[first_call],
                Piece::CallStart {
                    name: "search".into()
                }
            );
            let streamed = streamed_calls(&pieces);
            assert_eq!(streamed.len(), 2);
            assert_eq!(streamed[0].1.concat(), args);
            assert_eq!(streamed[1].1.concat(), "{}");
            if step == 1 {
                // One piece per character: nothing held back inside a string.
                assert_eq!(streamed[0].1.len(), args.chars().count());
            }
            assert_eq!(
                collect(pieces),
                ParsedOutput {
                    content: Some("Let me look.Done.".into()),
                    calls: vec![call("search", args), call("now", "{}")]
                }
            );
        }
        // The whole parse and parse_call agree.
        assert_eq!(parse_output(&t).calls[0], call("search", args));
        let body = format!("\n{{\"name\": \"search\", \"arguments\": {args}}}\n");
        assert_eq!(parse_call(&body), Some(call("search", args)));
    }

    #[test]
    fn markup_outside_a_string_ends_a_streamed_call() {
        // `<tool_call>` before the arguments close: the call ends (cut off) and the next one
        // begins.
        let t = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1\n<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
        for step in 1..=t.len() {
            let pieces = pieces_by(t, step);
            let streamed = streamed_calls(&pieces);
            assert_eq!(streamed.len(), 2);
            assert_eq!(
                collect(pieces).calls,
                vec![call("f", "{\"a\": 1\n"), call("g", "{}")]
            );
        }
        // Text after the arguments up to the markup is the call's, not content.
        let p = parse_output(
            "<tool_call>{\"name\": \"f\", \"arguments\": {}, \"x\": \"</tool_call>\"} ok",
        );
        assert_eq!(p.calls, vec![call("f", "{}")]);
        assert_eq!(p.content.as_deref(), Some("\"} ok"));
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
                match g {
                    Piece::Content(c) | Piece::CallArguments(c) => {
                        assert!(!c.contains('<'), "{c:?}")
                    }
                    _ => {}
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

    #[test]
    fn calls_counts_a_streamed_call_from_its_start() {
        let mut p = ToolCallParser::default();
        assert!(p.push("<tool_call>{\"name\": \"f\", \"argum").is_empty());
        assert_eq!(p.calls(), 0);
        assert_eq!(
            p.push("ents\": {\"a\""),
            vec![
                Piece::CallStart { name: "f".into() },
                Piece::CallArguments("{\"a\"".into())
            ]
        );
        assert_eq!(p.calls(), 1);
        assert_eq!(
            p.push(": 1}}\n</tool_"),
            vec![Piece::CallArguments(": 1}".into())]
        );
        assert_eq!(
            p.push("call>"),
            vec![Piece::CallEnd {
                call: call("f", "{\"a\": 1}"),
                text: "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>"
                    .into()
            }]
        );
        assert!(p.finish().is_empty());
        assert_eq!(p.calls(), 1);
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
            Just("{\"arguments\": {\"x\": 1}, \"name\": \"w\"}".to_string()),
            Just("<tool_call>{\"name\": \"s\", \"arguments\": {\"k\": \"}</tool_call>{\\\"\", \"n\": [1, {\"m\": 2}]}}</tool_call>".to_string()),
            Just("{ \"name\" : \"g\" , \"arguments\" : {".to_string()),
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("{".to_string()),
            Just("}".to_string()),
            Just("]".to_string()),
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
        /// Any split of any text into deltas gives what one push gives, and the streamed
        /// calls' pieces are well-formed and the same.
        #[test]
        fn any_split_gives_the_whole_parse(
            parts in proptest::collection::vec(fragments(), 0..12),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
        ) {
            let text: String = parts.concat();
            let whole = parse_output(&text);
            let whole_streamed = streamed_calls(&pieces_by(&text, text.chars().count()));
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
            let streamed: Vec<(String, String)> = streamed_calls(&pieces)
                .into_iter()
                .map(|(n, a)| (n, a.concat()))
                .collect();
            let whole_streamed: Vec<(String, String)> = whole_streamed
                .into_iter()
                .map(|(n, a)| (n, a.concat()))
                .collect();
            prop_assert_eq!(streamed, whole_streamed);
            let starts = pieces
                .iter()
                .filter(|p| matches!(p, Piece::CallStart { .. } | Piece::Call(_)))
                .count();
            prop_assert_eq!(starts, p.calls());
            prop_assert_eq!(collect(pieces), whole.clone());
            if whole.calls.is_empty() {
                prop_assert_eq!(whole.content.as_deref(), Some(text.as_str()));
            }
        }
    }
}
