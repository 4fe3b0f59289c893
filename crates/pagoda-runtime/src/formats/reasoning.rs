//! Reasoning output split from the answer, as it streams: `<think>…</think>` (Qwen3, QwQ,
//! Qwen3.5, SmolLM3, the DeepSeek-R1 distills), `[THINK]…[/THINK]` (Ministral 3 Reasoning)
//! and Gemma 4's `<|channel>thought…<channel|>`.
//!
//! Rules (as vLLM's reasoning parsers and llama.cpp's split them):
//! - Reasoning is only ever the output's first block: the output begins inside it when the
//!   prompt ends with the opening marker (a template that writes `<think>` into the
//!   generation prompt, as the R1 distills and QwQ do: [`ReasoningFormat::prompt_opens`]),
//!   or when its first visible characters are the opening marker. Anything else is content,
//!   verbatim, and a marker later in the answer stays content.
//! - The block ends at the closing marker; whitespace just inside the markers and just after
//!   the closing one belongs to neither side. A block the output never closes (cut off by
//!   `max_tokens`) is reasoning to its end.
//!
//! Invariants: any split of the output into deltas gives the same reasoning and content
//! (concatenated) as one push of the whole; markup is never emitted as either, and text is
//! held back only while it may still be markup or whitespace whose side is not decided.

/// A family's reasoning markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// `<think>` … `</think>`.
    Think,
    /// `[THINK]` … `[/THINK]` (Mistral's control tokens).
    MistralThink,
    /// `<|channel>thought` … `<channel|>` (Gemma 4).
    GemmaChannel,
    /// gpt-oss's harmony messages: the `analysis` channel is reasoning; parsed by
    /// [`super::harmony::HarmonyParser`], not by [`ReasoningSplitter`].
    Harmony,
}

impl ReasoningFormat {
    /// The format a chat template's source teaches, if any (detected by its markup, as
    /// llama.cpp's `common/chat` detects formats).
    pub fn detect(template: &str) -> Option<ReasoningFormat> {
        if template.contains("<|channel|>analysis") {
            Some(ReasoningFormat::Harmony)
        } else if template.contains("<|channel>thought") {
            Some(ReasoningFormat::GemmaChannel)
        } else if template.contains("[THINK]") {
            Some(ReasoningFormat::MistralThink)
        } else if template.contains("<think>") || template.contains("</think>") {
            Some(ReasoningFormat::Think)
        } else {
            None
        }
    }

    pub fn open(self) -> &'static str {
        match self {
            ReasoningFormat::Think => "<think>",
            ReasoningFormat::MistralThink => "[THINK]",
            ReasoningFormat::GemmaChannel => "<|channel>thought",
            ReasoningFormat::Harmony => "<|channel|>analysis<|message|>",
        }
    }

    pub fn close(self) -> &'static str {
        match self {
            ReasoningFormat::Think => "</think>",
            ReasoningFormat::MistralThink => "[/THINK]",
            ReasoningFormat::GemmaChannel => "<channel|>",
            ReasoningFormat::Harmony => "<|end|>",
        }
    }

    /// Whether a prompt whose text ends with `prompt_tail` leaves the output inside the
    /// reasoning block (the template opened it).
    pub fn prompt_opens(self, prompt_tail: &str) -> bool {
        self != ReasoningFormat::Harmony && prompt_tail.trim_end().ends_with(self.open())
    }
}

/// What the splitter decided about some text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Split {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing visible yet: the output may still open a block.
    Start,
    /// Inside the block; `fresh`: nothing visible written in it yet.
    Inside { fresh: bool },
    /// Just after the block: leading whitespace is dropped.
    After,
    /// The answer: everything passes.
    Content,
}

/// The streaming splitter: [`push`](Self::push) each delta, then [`finish`](Self::finish).
#[derive(Debug)]
pub struct ReasoningSplitter {
    format: ReasoningFormat,
    state: State,
    /// Text not decided yet.
    buf: String,
}

impl ReasoningSplitter {
    /// A splitter for `format`; `inside`: the prompt opened the block.
    pub fn new(format: ReasoningFormat, inside: bool) -> Self {
        ReasoningSplitter {
            format,
            state: if inside {
                State::Inside { fresh: true }
            } else {
                State::Start
            },
            buf: String::new(),
        }
    }

    /// Feeds `delta`; returns what it decided.
    pub fn push(&mut self, delta: &str) -> Vec<Split> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// The end of the output.
    pub fn finish(&mut self) -> Vec<Split> {
        let rest = std::mem::take(&mut self.buf);
        let mut out = Vec::new();
        match self.state {
            // Whitespace held back, or a prefix of the opening marker that never completed.
            State::Start | State::Content => push(&mut out, Split::Content(rest)),
            // A block cut off keeps what it wrote (a prefix of the closing marker too),
            // trailing whitespace aside.
            State::Inside { .. } => push(&mut out, Split::Reasoning(rest.trim_end().to_string())),
            State::After => {}
        }
        self.state = State::Content;
        out
    }

    /// Decides what `buf` allows; `false` when it needs more text.
    fn step(&mut self, out: &mut Vec<Split>) -> bool {
        match self.state {
            State::Content => {
                push(out, Split::Content(std::mem::take(&mut self.buf)));
                false
            }
            State::Start => {
                let visible = self.buf.trim_start();
                let open = self.format.open();
                if let Some(rest) = visible.strip_prefix(open) {
                    self.buf = rest.to_string();
                    self.state = State::Inside { fresh: true };
                    true
                } else if visible.is_empty() || open.starts_with(visible) {
                    false
                } else {
                    self.state = State::Content;
                    true
                }
            }
            State::Inside { fresh } => {
                if fresh {
                    let trimmed = self.buf.trim_start().len();
                    self.buf.drain(..self.buf.len() - trimmed);
                    if self.buf.is_empty() {
                        return false;
                    }
                    self.state = State::Inside { fresh: false };
                }
                let close = self.format.close();
                if let Some(at) = self.buf.find(close) {
                    let text = self.buf[..at].trim_end().to_string();
                    self.buf.drain(..at + close.len());
                    push(out, Split::Reasoning(text));
                    self.state = State::After;
                    return true;
                }
                // Hold back a tail that may begin the closing marker, and trailing
                // whitespace (dropped if the marker follows).
                let keep = partial_suffix(&self.buf, close);
                let body_end = self.buf.len() - keep;
                let emit_end = self.buf[..body_end].trim_end().len();
                let text = self.buf[..emit_end].to_string();
                self.buf.drain(..emit_end);
                push(out, Split::Reasoning(text));
                false
            }
            State::After => {
                let trimmed = self.buf.trim_start().len();
                self.buf.drain(..self.buf.len() - trimmed);
                if self.buf.is_empty() {
                    return false;
                }
                self.state = State::Content;
                true
            }
        }
    }
}

fn push(out: &mut Vec<Split>, s: Split) {
    match &s {
        Split::Reasoning(t) | Split::Content(t) if t.is_empty() => {}
        _ => out.push(s),
    }
}

/// The length of the longest tail of `text` that is a proper prefix of `marker`.
pub(crate) fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// A whole output's reasoning (`None` when there was none) and content.
pub fn split_whole(format: ReasoningFormat, inside: bool, text: &str) -> (Option<String>, String) {
    let mut s = ReasoningSplitter::new(format, inside);
    let mut parts = s.push(text);
    parts.extend(s.finish());
    gather(parts)
}

/// Splits (from any number of pushes) as one reasoning text and one content text.
pub fn gather(parts: impl IntoIterator<Item = Split>) -> (Option<String>, String) {
    let (mut reasoning, mut content) = (None::<String>, String::new());
    for p in parts {
        match p {
            Split::Reasoning(r) => reasoning.get_or_insert_with(String::new).push_str(&r),
            Split::Content(c) => content.push_str(&c),
        }
    }
    (reasoning, content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL: [ReasoningFormat; 3] = [
        ReasoningFormat::Think,
        ReasoningFormat::MistralThink,
        ReasoningFormat::GemmaChannel,
    ];

    fn by_every_split(format: ReasoningFormat, inside: bool, text: &str) {
        let whole = split_whole(format, inside, text);
        for at in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let mut s = ReasoningSplitter::new(format, inside);
            let mut parts = s.push(&text[..at]);
            parts.extend(s.push(&text[at..]));
            parts.extend(s.finish());
            assert_eq!(gather(parts), whole, "{text:?} split at {at}");
        }
        // One character at a time.
        let mut s = ReasoningSplitter::new(format, inside);
        let mut parts = Vec::new();
        for c in text.chars() {
            parts.extend(s.push(&c.to_string()));
        }
        parts.extend(s.finish());
        assert_eq!(gather(parts), whole, "{text:?} by characters");
    }

    #[test]
    fn each_family_splits_its_block_whole_and_streamed() {
        for f in ALL {
            let (o, c) = (f.open(), f.close());
            let text = format!("{o}\nLet me think.\n{c}\n\nThe answer is 4.");
            assert_eq!(
                split_whole(f, false, &text),
                (Some("Let me think.".into()), "The answer is 4.".into())
            );
            by_every_split(f, false, &text);
            // The prompt opened the block (R1 distills, QwQ).
            let text = format!("Let me think.\n{c}\n\nThe answer is 4.");
            assert_eq!(
                split_whole(f, true, &text),
                (Some("Let me think.".into()), "The answer is 4.".into())
            );
            by_every_split(f, true, &text);
        }
    }

    #[test]
    fn no_block_is_content_verbatim_and_later_markers_stay_content() {
        for f in ALL {
            for text in [
                String::new(),
                "Plain answer.".to_string(),
                format!("Answer first {} then {}", f.open(), f.close()),
                format!("  {}", &f.open()[..3]),
                format!("x{}", f.open()),
            ] {
                assert_eq!(
                    split_whole(f, false, &text),
                    (None, text.clone()),
                    "{text:?}"
                );
                by_every_split(f, false, &text);
            }
        }
    }

    #[test]
    fn an_unclosed_block_is_reasoning_to_the_end() {
        for f in ALL {
            let text = format!("{}\nstill thinking ", f.open());
            assert_eq!(
                split_whole(f, false, &text),
                (Some("still thinking".into()), String::new())
            );
            by_every_split(f, false, &text);
            let text = format!("thinking {}", &f.close()[..2]);
            by_every_split(f, true, &text);
            assert_eq!(split_whole(f, true, "").0, None);
        }
    }

    #[test]
    fn detection_and_prompt_opening() {
        assert_eq!(
            ReasoningFormat::detect("{{ '<think>\\n' }}"),
            Some(ReasoningFormat::Think)
        );
        assert_eq!(
            ReasoningFormat::detect("'[THINK]' + x + '[/THINK]'"),
            Some(ReasoningFormat::MistralThink)
        );
        assert_eq!(
            ReasoningFormat::detect("'<|channel>thought\\n<channel|>'"),
            Some(ReasoningFormat::GemmaChannel)
        );
        assert_eq!(ReasoningFormat::detect("<|im_start|>"), None);
        assert!(ReasoningFormat::Think.prompt_opens("<|im_start|>assistant\n<think>\n"));
        assert!(!ReasoningFormat::Think.prompt_opens("assistant\n<think>\n\n</think>\n\n"));
    }

    proptest! {
        #[test]
        fn any_split_gives_the_whole_split(
            parts in proptest::collection::vec(prop_oneof![
                Just("<think>".to_string()),
                Just("</think>".to_string()),
                Just("</thi".to_string()),
                Just("<".to_string()),
                Just("\n".to_string()),
                Just(" ".to_string()),
                "[a-z é<>/]{0,5}",
            ], 0..10),
            cut in any::<usize>(),
            inside in any::<bool>(),
        ) {
            let text: String = parts.concat();
            let whole = split_whole(ReasoningFormat::Think, inside, &text);
            let mut at = if text.is_empty() { 0 } else { cut % (text.len() + 1) };
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            let mut s = ReasoningSplitter::new(ReasoningFormat::Think, inside);
            let mut got = s.push(&text[..at]);
            got.extend(s.push(&text[at..]));
            got.extend(s.finish());
            prop_assert_eq!(gather(got), whole);
        }
    }
}
