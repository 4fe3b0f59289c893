//! Calls inside a family's markup: content streams as it is written, and each call block
//! (from its opening marker to its closing one, or, for a syntax without one, to where its
//! call is complete, the next opening marker or the end of the output) is read as it grows.
//! The block's syntax is a [`BlockSyntax`]: one per family ([`super::formats`]).
//!
//! A block is **streamed** once its syntax reads a call's name in it
//! ([`BlockSyntax::stream`]): [`Piece::CallStart`] gives the name, [`Piece::CallArguments`]
//! the arguments' JSON text as it is decided (for a syntax that is not JSON, its JSON
//! translation), and [`Piece::CallEnd`] the call once it is whole; the pieces of a call's
//! arguments concatenate to its `arguments`. **A streamed call is never retracted**: what
//! follows it in the block that is not a call is dropped, and a block cut off by the end of
//! the output ends its calls where they are. A block in which no call's name can be read is
//! decided whole at its end ([`BlockSyntax::parse`]: [`Piece::Call`]s, or content, verbatim,
//! markup included, when it is not a call).
//!
//! Invariants (as [`super::parse::ToolCallParser`]'s): any split of the output into deltas
//! gives the same content, the same calls and the same arguments text as one push of the
//! whole; an opening or closing marker is never emitted as content or arguments while it
//! may still be one (a tail that is a prefix of it is held back); whitespace between a call
//! and the text around it belongs to neither.

use super::parse::{ParsedCall, Piece};
use super::partial::{held_tail, Partial};

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
    /// The calls of a block's body so far (`end`: the body is whole), `None` until a call's
    /// name is read; keeps [`super::partial`]'s invariant.
    fn stream(&self, body: &str, end: bool) -> Option<Vec<Partial>>;
    /// The calls of a whole block's body that [`Self::stream`] does not read (a form that
    /// is not streamed), or `None` when it is not one.
    fn parse(&self, _body: &str) -> Option<Vec<ParsedCall>> {
        None
    }
}

/// A streamed call of the current block: its name, the arguments sent, and whether its
/// [`Piece::CallEnd`] was.
#[derive(Debug)]
struct Sent {
    name: String,
    arguments: String,
    ended: bool,
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
    /// The current block's streamed calls (empty: not streamed yet).
    block: Vec<Sent>,
    /// Where in the block's body the text of the last ended call stops.
    text_at: usize,
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
            block: Vec::new(),
            text_at: 0,
        }
    }

    /// Calls begun so far (a streamed call counts from its [`Piece::CallStart`]).
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
        if self.inside {
            self.block_step(true, &mut out);
        } else {
            let rest = std::mem::take(&mut self.buf);
            if !(self.after_call && rest.trim().is_empty()) {
                self.text(&rest, &mut out);
            }
        }
        if !self.held_ws.is_empty() {
            out.push(Piece::Content(std::mem::take(&mut self.held_ws)));
        }
        out
    }

    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        if self.inside {
            return self.block_step(false, out);
        }
        let open = self.syntax.open();
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
        let keep = held_tail(&self.buf, open);
        let text = self.buf[..self.buf.len() - keep].to_string();
        self.buf.drain(..self.buf.len() - keep);
        self.text(&text, out);
        false
    }

    /// Inside a block: streams what its body so far decides; at its end (`at_end`: the end
    /// of the output), decides it. `false` when it needs more text.
    fn block_step(&mut self, at_end: bool, out: &mut Vec<Piece>) -> bool {
        let open = self.syntax.open();
        // (the body's length, the text the block uses, whether the block ended, whether
        // by its closing marker)
        let (body_len, used, ended, closed) = if at_end {
            (self.buf.len(), self.buf.len(), true, false)
        } else {
            match self.syntax.close() {
                Some(close) => match self.buf.find(close) {
                    Some(at) => (at, at + close.len(), true, true),
                    None => (
                        self.buf.len() - held_tail(&self.buf, close),
                        0,
                        false,
                        false,
                    ),
                },
                None => match self
                    .syntax
                    .complete(&self.buf)
                    .or_else(|| self.buf.find(open))
                {
                    Some(at) => (at, at, true, false),
                    None => (self.buf.len() - held_tail(&self.buf, open), 0, false, false),
                },
            }
        };
        let body = self.buf[..body_len].to_string();
        let streamed = self.syntax.stream(&body, ended).filter(|c| !c.is_empty());
        if let Some(calls) = &streamed {
            self.send(calls, &body, ended, closed, out);
        }
        if !ended {
            return false;
        }
        self.buf.drain(..used);
        self.inside = false;
        if self.block.is_empty() {
            self.end_block(&body, closed, out);
        } else {
            if streamed.is_none() {
                // Never so for a syntax that keeps the invariant.
                self.send(&[], &body, true, closed, out);
            }
            self.block.clear();
            self.text_at = 0;
            self.after_call = true;
        }
        true
    }

    /// Sends what `calls` (the block's calls so far) add to what was sent.
    fn send(
        &mut self,
        calls: &[Partial],
        body: &str,
        ended: bool,
        closed: bool,
        out: &mut Vec<Piece>,
    ) {
        if self.block.is_empty() {
            self.held_ws.clear();
        }
        for (k, c) in calls.iter().enumerate() {
            if k == self.block.len() {
                self.calls += 1;
                out.push(Piece::CallStart {
                    name: c.name.clone(),
                });
                self.block.push(Sent {
                    name: c.name.clone(),
                    arguments: String::new(),
                    ended: false,
                });
            }
            let Some(sent) = self.block.get_mut(k) else {
                continue;
            };
            if sent.ended {
                continue;
            }
            debug_assert!(
                c.arguments.starts_with(&sent.arguments),
                "{:?} does not extend {:?}",
                c.arguments,
                sent.arguments
            );
            let new = c
                .arguments
                .strip_prefix(sent.arguments.as_str())
                .filter(|n| !n.is_empty());
            if let Some(new) = new {
                out.push(Piece::CallArguments(new.to_string()));
                sent.arguments.push_str(new);
            }
            let last = k + 1 == calls.len();
            if c.done || !last || ended {
                sent.ended = true;
                let stop = if last && ended {
                    body.len()
                } else {
                    c.end.min(body.len())
                };
                let mut text = if k == 0 {
                    self.syntax.open().to_string()
                } else {
                    String::new()
                };
                text.push_str(body.get(self.text_at..stop).unwrap_or_default());
                if last && ended && closed {
                    text.push_str(self.syntax.close().unwrap_or_default());
                }
                self.text_at = self.text_at.max(stop);
                out.push(Piece::CallEnd {
                    call: ParsedCall {
                        name: sent.name.clone(),
                        arguments: sent.arguments.clone(),
                    },
                    text,
                });
            }
        }
        if ended {
            // Only for a syntax that breaks the invariant: the calls end as sent.
            let open = self.syntax.open();
            for (k, sent) in self.block.iter_mut().enumerate().filter(|(_, s)| !s.ended) {
                sent.ended = true;
                out.push(Piece::CallEnd {
                    call: ParsedCall {
                        name: sent.name.clone(),
                        arguments: sent.arguments.clone(),
                    },
                    text: if k == 0 {
                        open.to_string()
                    } else {
                        String::new()
                    },
                });
            }
        }
    }

    /// A block's body is whole and no call was streamed from it (`closed`: its closing
    /// marker was consumed).
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
