//! Server-Sent Events framing, as the OpenAI streaming API uses it: each event is
//! `data: <json>\n\n`, and the stream ends with `data: [DONE]\n\n`.
//!
//! [`SseReader`] is the incremental client side (for the gateway and the load generator):
//! bytes arrive in arbitrary pieces and complete events come out.
//!
//! Invariants: [`data_event`] never emits a line end (`\n`, `\r`) inside a `data:` line
//! (multi-line payloads, whatever their line ends, become several `data:` lines, which readers
//! join with `\n`), so a payload can never end its event early; the reader yields an
//! event only once its blank line has arrived, and handles `\n`, `\r\n` and `\r` line ends.

/// The payload of the event that ends an OpenAI stream.
pub const DONE: &str = "[DONE]";

/// Frames `payload` as one event: one `data:` line per line of `payload`, whose lines end at
/// `\n`, `\r\n` or a lone `\r`, as [`SseReader`] splits them (a `\r` left inside a `data:`
/// line would end it early, and `\r\r` would end the event).
pub fn data_event(payload: &str) -> String {
    let mut out = String::with_capacity(payload.len() + 8);
    let mut rest = payload;
    loop {
        out.push_str("data: ");
        match rest.find(['\r', '\n']) {
            Some(i) => {
                out.push_str(&rest[..i]);
                out.push('\n');
                let ending = if rest[i..].starts_with("\r\n") { 2 } else { 1 };
                rest = &rest[i + ending..];
            }
            None => {
                out.push_str(rest);
                out.push('\n');
                break;
            }
        }
    }
    out.push('\n');
    out
}

/// One parsed event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// `event:` field, when given.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

impl SseEvent {
    /// Whether this is the `[DONE]` sentinel.
    pub fn is_done(&self) -> bool {
        self.data == DONE
    }
}

/// Incremental SSE parser.
#[derive(Debug, Default)]
pub struct SseReader {
    buffer: Vec<u8>,
    current: SseEvent,
    has_data: bool,
    /// The last byte fed was `\r`: a following `\n` belongs to the same line end.
    after_cr: bool,
}

impl SseReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns the events they completed, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.buffer);
                    if let Some(ev) = self.line(&line) {
                        events.push(ev);
                    }
                }
                _ => self.buffer.push(b),
            }
        }
        events
    }

    /// Handles one complete line; a blank line dispatches the event being built.
    fn line(&mut self, line: &[u8]) -> Option<SseEvent> {
        if line.is_empty() {
            if !self.has_data {
                self.current = SseEvent::default();
                return None;
            }
            self.has_data = false;
            return Some(std::mem::take(&mut self.current));
        }
        if line[0] == b':' {
            return None; // comment / keep-alive
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.find(':') {
            Some(i) => {
                let v = &text[i + 1..];
                (&text[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&text[..], ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.current.event = Some(value.to_string()),
            _ => {} // id, retry: not used by the OpenAI API
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_and_reads_back_json_and_done() {
        let wire = format!("{}{}", data_event(r#"{"a":1}"#), data_event(DONE));
        assert_eq!(wire, "data: {\"a\":1}\n\ndata: [DONE]\n\n");
        let events = SseReader::new().feed(wire.as_bytes());
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].data, r#"{"a":1}"#);
        assert!(events[1].is_done());
    }

    #[test]
    fn comments_crlf_and_event_names() {
        let wire = b": keep-alive\r\nevent: error\r\ndata: x\r\ndata: y\r\n\r\n";
        let events = SseReader::new().feed(wire);
        assert_eq!(
            events,
            vec![SseEvent {
                event: Some("error".into()),
                data: "x\ny".into()
            }]
        );
    }

    /// Found by the `request_body` fuzz target (kept as
    /// fuzz/seeds/request_body/regression_sse_lone_cr.bin): a lone `\r` inside a payload was
    /// written as is, so the reader ended the `data:` line there and lost the rest; `\r\r`
    /// ended the event and let the payload start another.
    #[test]
    fn data_event_ends_lines_at_a_lone_carriage_return() {
        assert_eq!(data_event("a\rb"), "data: a\ndata: b\n\n");
        assert_eq!(data_event("a\r\nb\n"), "data: a\ndata: b\ndata: \n\n");
        assert_eq!(data_event("\r"), "data: \ndata: \n\n");
        let events = SseReader::new().feed(data_event("x\r\rdata: injected").as_bytes());
        assert_eq!(
            events,
            vec![SseEvent {
                event: None,
                data: "x\n\ndata: injected".into()
            }]
        );
        let payload = "{\"name\r\0\0)pe\":ptrug}";
        let events = SseReader::new().feed(data_event(payload).as_bytes());
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data, "{\"name\n\0\0)pe\":ptrug}");
    }

    #[test]
    fn an_event_without_its_blank_line_is_not_yielded() {
        let mut r = SseReader::new();
        assert!(r.feed(b"data: partial\n").is_empty());
        assert_eq!(r.feed(b"\n").len(), 1);
    }

    proptest! {
        /// Whatever the payloads and however the bytes are cut, the reader gives back
        /// exactly the framed payloads.
        #[test]
        fn framing_round_trips_under_any_split(
            payloads in proptest::collection::vec("[^\r]{0,40}", 0..8),
            cuts in proptest::collection::vec(0usize..400, 0..10),
        ) {
            let wire: String = payloads.iter().map(|p| data_event(p)).collect();
            let bytes = wire.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut reader = SseReader::new();
            let mut got = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([bytes.len()]) {
                got.extend(reader.feed(&bytes[at..c]));
                at = c;
            }
            let data: Vec<String> = got.into_iter().map(|e| e.data).collect();
            prop_assert_eq!(data, payloads);
        }

        /// Arbitrary bytes never panic the reader.
        #[test]
        fn arbitrary_bytes_do_not_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = SseReader::new().feed(&bytes);
        }
    }
}
