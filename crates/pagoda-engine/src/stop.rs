//! Stop strings over streamed text, and why a generation finished.
//!
//! Owns [`StopMatcher`], which sits between the detokenizer and the client: text goes in as it
//! is decoded, in arbitrary chunks, and comes out as soon as it is certain not to be part of a
//! stop string. Also owns [`FinishReason`].
//!
//! # Semantics
//!
//! The output (everything emitted plus the final [`StopMatcher::flush`]) is exactly the whole
//! text cut right before the *earliest* occurrence of any stop string (OpenAI semantics: the
//! stop sequence itself is not included), i.e. `text[..min over stops of text.find(stop)]`,
//! however the text was chunked. When two stop strings could match, the one that starts first
//! wins, even if a later-starting one completed first: with stops `"abcd"` and `"c"`, the
//! text `"abc"` is held until the next chunk says whether `"abcd"` completes.
//!
//! # Invariants
//!
//! - Nothing emitted is ever retracted: emitted text never contains the start of a stop
//!   occurrence. The matcher holds back the pending text from the earliest position whose
//!   suffix is a proper prefix of some stop string.
//! - The held-back text is shorter than the longest stop string, so memory is bounded no
//!   matter how long the generation runs.
//! - Cuts are on `char` boundaries (stop strings are `&str`, and a match always starts at a
//!   stop string's first byte, which is a boundary), so emitted text is always valid UTF-8 and
//!   a multi-byte stop string split across chunks still matches.
//! - After a hit (or a flush), the matcher is finished: `push` emits nothing and reports
//!   `stopped` as it was, `flush` returns an empty string.

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` reached or the context is full.
    Length,
    /// The client went away or the request was cancelled.
    Abort,
}

impl FinishReason {
    /// The lower-case name used on the wire (`"stop"`, `"length"`, `"abort"`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// What one [`StopMatcher::push`] lets through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text safe to send now.
    pub emit: String,
    /// A stop string was hit: `emit` ends right before it, and generation should end.
    pub stopped: bool,
}

/// Finds stop strings in streamed text. See the module docs for the exact semantics.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not emitted yet.
    pending: String,
    stopped: bool,
    finished: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would stop before any text).
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self {
            stops,
            pending: String::new(),
            stopped: false,
            finished: false,
        }
    }

    /// Whether a stop string was hit.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds newly decoded text. Returns the text that can be emitted now and whether a stop
    /// string was hit; on a hit, nothing after the stop string's start is ever emitted.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.finished {
            return StopOutcome {
                emit: String::new(),
                stopped: self.stopped,
            };
        }
        self.pending.push_str(text);
        let hit = self.earliest_match();
        let hold = self.earliest_partial();
        match (hit, hold) {
            // A stop string starting earlier may still complete: emit only what precedes it.
            (Some(at), Some(h)) if h < at => self.emit_until(h),
            (Some(at), _) => {
                self.pending.truncate(at);
                self.stopped = true;
                self.finished = true;
                StopOutcome {
                    emit: std::mem::take(&mut self.pending),
                    stopped: true,
                }
            }
            (None, Some(h)) => self.emit_until(h),
            (None, None) => StopOutcome {
                emit: std::mem::take(&mut self.pending),
                stopped: false,
            },
        }
    }

    /// At the end of generation (EOS, max_tokens): returns the held-back tail, cut at a stop
    /// string if one is in it. The matcher is finished afterwards.
    pub fn flush(&mut self) -> String {
        if self.finished {
            return String::new();
        }
        self.finished = true;
        if let Some(at) = self.earliest_match() {
            self.pending.truncate(at);
            self.stopped = true;
        }
        std::mem::take(&mut self.pending)
    }

    /// Emits `pending[..at]` and keeps the rest.
    fn emit_until(&mut self, at: usize) -> StopOutcome {
        let rest = self.pending.split_off(at);
        StopOutcome {
            emit: std::mem::replace(&mut self.pending, rest),
            stopped: false,
        }
    }

    /// Start of the earliest complete stop string in `pending`.
    fn earliest_match(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
    }

    /// Earliest position whose suffix of `pending` is a non-empty proper prefix of some stop
    /// string (so a later chunk could complete a match starting there).
    fn earliest_partial(&self) -> Option<usize> {
        let p = self.pending.as_bytes();
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let from = p.len().saturating_sub(longest.saturating_sub(1));
        (from..p.len()).find(|&i| {
            self.pending.is_char_boundary(i)
                && self.stops.iter().any(|s| {
                    let tail = &p[i..];
                    tail.len() < s.len() && s.as_bytes().starts_with(tail)
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect())
    }

    /// Pushes each chunk, then flushes if not stopped; returns (all emitted text, stopped).
    fn run(stops: &[&str], chunks: &[&str]) -> (String, bool) {
        let mut m = matcher(stops);
        let mut out = String::new();
        for c in chunks {
            let o = m.push(c);
            out.push_str(&o.emit);
            if o.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.flush());
        (out, m.is_stopped())
    }

    #[test]
    fn stop_split_across_pushes() {
        let mut m = matcher(&["is"]);
        let a = m.push("Par");
        assert_eq!(
            a,
            StopOutcome {
                emit: "Par".into(),
                stopped: false
            }
        );
        let b = m.push("i");
        assert_eq!(
            b,
            StopOutcome {
                emit: String::new(),
                stopped: false
            },
            "'i' is held"
        );
        let c = m.push("s is nice");
        assert_eq!(
            c,
            StopOutcome {
                emit: String::new(),
                stopped: true
            }
        );
        // Finished: nothing more comes out.
        assert_eq!(
            m.push("more"),
            StopOutcome {
                emit: String::new(),
                stopped: true
            }
        );
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn held_text_is_released_when_it_stops_being_a_prefix() {
        let mut m = matcher(&["</s>"]);
        assert_eq!(m.push("a <").emit, "a ");
        assert_eq!(m.push("/").emit, "");
        assert_eq!(m.push("b").emit, "</b");
        assert!(!m.is_stopped());
    }

    #[test]
    fn stop_at_the_very_start() {
        assert_eq!(run(&["Hi"], &["Hi there"]), (String::new(), true));
        assert_eq!(run(&["Hi"], &["H", "i", " there"]), (String::new(), true));
    }

    #[test]
    fn held_back_tail_is_flushed_at_the_end() {
        let mut m = matcher(&["STOP"]);
        assert_eq!(m.push("the end ST").emit, "the end ");
        assert_eq!(m.flush(), "ST");
        assert!(!m.is_stopped());
        assert_eq!(m.flush(), "", "flush is idempotent");
    }

    #[test]
    fn earliest_starting_stop_wins_even_if_it_completes_later() {
        // "c" completes first, but "abcd" started earlier.
        assert_eq!(
            run(&["abcd", "c"], &["ab", "c", "d"]),
            (String::new(), true)
        );
        // ... and when "abcd" does not complete, "c" still cuts.
        assert_eq!(run(&["abcd", "c"], &["ab", "c", "x"]), ("ab".into(), true));
        // ... also when generation ends while "abc" is held.
        assert_eq!(run(&["abcd", "c"], &["ab", "c"]), ("ab".into(), true));
    }

    #[test]
    fn overlapping_stop_strings() {
        assert_eq!(run(&["bcd", "ab"], &["xa", "bcd"]), ("x".into(), true));
        assert_eq!(run(&["aab", "ab"], &["a", "a", "b"]), (String::new(), true));
        assert_eq!(
            run(&["aab", "ab"], &["caa", "c", "ab"]),
            ("caac".into(), true)
        );
    }

    #[test]
    fn multibyte_stop_across_chunks() {
        // "好的" is 6 bytes; the chunks split it between characters.
        assert_eq!(run(&["好的"], &["你好", "的世界"]), ("你".into(), true));
        // A stop whose first char matches but the second does not.
        assert_eq!(run(&["好的"], &["你好", "吗"]), ("你好吗".into(), false));
        assert_eq!(run(&["é!"], &["caf", "é", "!"]), ("caf".into(), true));
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        assert_eq!(run(&["", ""], &["abc"]), ("abc".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn finish_reason_names() {
        assert_eq!(FinishReason::Stop.as_str(), "stop");
        assert_eq!(FinishReason::Length.as_str(), "length");
        assert_eq!(FinishReason::Abort.as_str(), "abort");
    }

    /// Splits `text` at the given char counts (clamped), keeping UTF-8 intact.
    fn chunk(text: &str, cuts: &[usize]) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        let mut points: Vec<usize> = cuts.iter().map(|&c| c % (chars.len() + 1)).collect();
        points.push(0);
        points.push(chars.len());
        points.sort_unstable();
        points
            .windows(2)
            .map(|w| chars[w[0]..w[1]].iter().collect())
            .collect()
    }

    proptest! {
        #[test]
        fn streamed_equals_cut_at_first_stop(
            text in "[abé好]{0,40}",
            stops in proptest::collection::vec("[abé好]{0,4}", 0..4),
            cuts in proptest::collection::vec(0usize..64, 0..12),
        ) {
            let chunks = chunk(&text, &cuts);
            let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
            let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let (out, stopped) = run(&stop_refs, &refs);
            let first = stops
                .iter()
                .filter(|s| !s.is_empty())
                .filter_map(|s| text.find(s.as_str()))
                .min();
            let expected = first.map_or(text.as_str(), |at| &text[..at]);
            prop_assert_eq!(out.as_str(), expected);
            prop_assert_eq!(stopped, first.is_some());
        }

        /// A two-letter alphabet makes stop strings nested inside one another common (the
        /// case where a later-starting stop completes first and must not win).
        #[test]
        fn streamed_equals_cut_at_first_stop_nested_stops(
            text in "[ab]{0,16}",
            stops in proptest::collection::vec("[ab]{1,3}", 1..4),
            cuts in proptest::collection::vec(0usize..17, 0..16),
        ) {
            let chunks = chunk(&text, &cuts);
            let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
            let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let (out, stopped) = run(&stop_refs, &refs);
            let first = stops.iter().filter_map(|s| text.find(s.as_str())).min();
            let expected = first.map_or(text.as_str(), |at| &text[..at]);
            prop_assert_eq!(out.as_str(), expected);
            prop_assert_eq!(stopped, first.is_some());
        }

        #[test]
        fn held_back_text_is_bounded(
            text in "[ab]{0,200}",
            stops in proptest::collection::vec("[ab]{1,5}", 1..3),
        ) {
            let mut m = StopMatcher::new(stops);
            for c in text.chars() {
                let mut buf = [0u8; 4];
                if m.push(c.encode_utf8(&mut buf)).stopped {
                    break;
                }
                prop_assert!(m.pending.len() < 5, "{:?}", m.pending);
            }
        }
    }
}
