//! Calls inside a family's markup, decided whole: content streams as it is written, and each
//! call block (from its opening marker to its closing one, or, for a syntax without one, to
//! where its call is complete, the next opening marker or the end of the output) gives its
//! calls as [`Piece::Call`] once it is whole. The block's syntax is a [`BlockSyntax`]: one
//! per family ([`super::formats`]).
//!
//! Invariants (as [`super::parse::ToolCallParser`]'s): any split of the output into deltas
//! gives the pieces of one push of the whole; an opening marker is never emitted as content
//! while it may still begin a call (a tail that is a prefix of it is held back); a block
//! whose body does not parse stays content, verbatim, markup included; whitespace between a
//! call and the text around it belongs to neither.

use super::parse::{ParsedCall, Piece};
use crate::formats::reasoning::partial_suffix;

/// One family's call block.
pub trait BlockSyntax: std::fmt::Debug + Send {
    /// The marker that opens a block.
    fn open(&self) -> &'static str;
    /// The marker that closes one; `None`: the block ends where [`Self::complete`] says,
    /// at the next opening marker, or at the end of the output.
    fn close(&self) -> Option<&'static str>;
    /// For a syntax without a closing marker: the length of the whole call at the start of
    /// `body`, once it is written (a prefix of the output decides it).
    fn complete(&self, _body: &str) -> Option<usize> {
        None
    }
    /// The calls of a whole block's body, or `None` when it is not one.
    fn parse(&self, body: &str) -> Option<Vec<ParsedCall>>;
}

/// The streaming parser of one [`BlockSyntax`].
#[derive(Debug)]
pub struct MarkedCalls {
    syntax: Box<dyn BlockSyntax>,
    buf: String,
    inside: bool,
    after_call: bool,
    held_ws: String,
    calls: usize,
}

impl MarkedCalls {
    pub fn new(syntax: Box<dyn BlockSyntax>) -> Self {
        MarkedCalls {
            syntax,
            buf: String::new(),
            inside: false,
            after_call: false,
            held_ws: String::new(),
            calls: 0,
        }
    }

    /// Calls emitted so far.
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
        if self.inside {
            self.inside = false;
            self.end_block(&rest, false, &mut out);
        } else if !(self.after_call && rest.trim().is_empty()) {
            self.text(&rest, &mut out);
        }
        if !self.held_ws.is_empty() {
            out.push(Piece::Content(std::mem::take(&mut self.held_ws)));
        }
        out
    }

    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        let open = self.syntax.open();
        if !self.inside {
            if self.after_call {
                let trimmed = self.buf.trim_start().len();
                self.buf.drain(..self.buf.len() - trimmed);
                if self.buf.is_empty() {
                    return false;
                }
                self.after_call = false;
            }
            if let Some(at) = self.buf.find(open) {
                let text = self.buf[..at].to_string();
                self.buf.drain(..at + open.len());
                self.text(&text, out);
                self.inside = true;
                return true;
            }
            let keep = partial_suffix(&self.buf, open);
            let text = self.buf[..self.buf.len() - keep].to_string();
            self.buf.drain(..self.buf.len() - keep);
            self.text(&text, out);
            return false;
        }
        match self.syntax.close() {
            Some(close) => {
                let Some(at) = self.buf.find(close) else {
                    return false;
                };
                let body = self.buf[..at].to_string();
                self.buf.drain(..at + close.len());
                self.inside = false;
                self.end_block(&body, true, out);
                true
            }
            None => {
                let end = self
                    .syntax
                    .complete(&self.buf)
                    .or_else(|| self.buf.find(open));
                let Some(at) = end else {
                    return false;
                };
                let body = self.buf[..at].to_string();
                self.buf.drain(..at);
                self.inside = false;
                self.end_block(&body, false, out);
                true
            }
        }
    }

    /// A block's body is whole (`closed`: its closing marker was consumed).
    fn end_block(&mut self, body: &str, closed: bool, out: &mut Vec<Piece>) {
        match self.syntax.parse(body).filter(|c| !c.is_empty()) {
            Some(calls) => {
                self.held_ws.clear();
                self.after_call = true;
                self.calls += calls.len();
                out.extend(calls.into_iter().map(Piece::Call));
            }
            None => {
                let mut raw = std::mem::take(&mut self.held_ws);
                raw.push_str(self.syntax.open());
                raw.push_str(body);
                if closed {
                    raw.push_str(self.syntax.close().unwrap_or_default());
                }
                self.after_call = false;
                out.push(Piece::Content(raw));
            }
        }
    }

    /// Content: emitted up to its trailing whitespace, which is held back (dropped if a
    /// call follows).
    fn text(&mut self, text: &str, out: &mut Vec<Piece>) {
        if text.is_empty() {
            return;
        }
        let body = text.trim_end();
        if body.is_empty() {
            self.held_ws.push_str(text);
            return;
        }
        let mut emit = std::mem::take(&mut self.held_ws);
        emit.push_str(body);
        out.push(Piece::Content(emit));
        self.held_ws.push_str(&text[body.len()..]);
    }
}

/// The length of the first JSON value (an object or a list) at the start of `text`, leading
/// whitespace included, once it is whole.
pub fn json_value_len(text: &str) -> Option<usize> {
    let lead = text.len() - text.trim_start().len();
    let rest = &text[lead..];
    if !(rest.starts_with('{') || rest.starts_with('[')) {
        return None;
    }
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, b) in rest.bytes().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(lead + i + 1);
                }
            }
            _ => {}
        }
    }
    None
}
