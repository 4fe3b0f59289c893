//! From a request's engine events to its finished choices: [`Collector`] gathers each
//! choice's text, tokens, log-probabilities, finish reason, usage and timings; every front end
//! that answers a request in one piece (the server's non-streamed responses, `pagoda batch`,
//! `pagoda run`, `bench model`, `eval compare`) goes through it.
//!
//! Invariants: choices come back in index order, one per requested choice; a choice the
//! engine never finished (the engine stopped first) reports [`FinishReason::Abort`]; an
//! `Error` event fails the whole request ([`GenerationFailed`]), whatever arrived before it.

use pagoda_engine::{FinishReason, RequestStream, RequestTimings, SampledToken, TokenEvent, Usage};

/// Everything one choice produced.
#[derive(Debug, Clone)]
pub struct ChoiceOutput {
    pub text: String,
    pub tokens: Vec<u32>,
    /// One entry per token when the request asked for log-probabilities.
    pub logprobs: Vec<SampledToken>,
    pub finish: FinishReason,
    pub usage: Usage,
    /// When the choice was queued, scheduled, started and finished (`None` if it never
    /// finished).
    pub timings: Option<RequestTimings>,
}

impl ChoiceOutput {
    fn empty() -> Self {
        ChoiceOutput {
            text: String::new(),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: FinishReason::Abort,
            usage: Usage::default(),
            timings: None,
        }
    }
}

/// The engine failed the request as a whole (a numerical fault, or bad input found late).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GenerationFailed(pub String);

/// Gathers the events of one request into its choices.
#[derive(Debug)]
pub struct Collector {
    choices: Vec<ChoiceOutput>,
}

impl Collector {
    /// A collector for a request of `n` choices.
    pub fn new(n: usize) -> Self {
        Collector {
            choices: (0..n).map(|_| ChoiceOutput::empty()).collect(),
        }
    }

    /// Takes one event; an `Error` event is returned as the request's failure.
    pub fn push(&mut self, event: TokenEvent) -> Result<(), GenerationFailed> {
        match event {
            TokenEvent::Token {
                index,
                token,
                text,
                logprob,
                ..
            } => {
                if let Some(c) = self.choices.get_mut(index) {
                    c.text.push_str(&text);
                    c.tokens.push(token);
                    c.logprobs.extend(logprob);
                }
            }
            TokenEvent::Finished {
                index,
                reason,
                text,
                usage,
                timings,
            } => {
                if let Some(c) = self.choices.get_mut(index) {
                    c.text.push_str(&text);
                    c.finish = reason;
                    c.usage = usage;
                    c.timings = Some(timings);
                }
            }
            TokenEvent::Error { message } => return Err(GenerationFailed(message)),
        }
        Ok(())
    }

    /// The choices, in index order.
    pub fn finish(self) -> Vec<ChoiceOutput> {
        self.choices
    }
}

/// Waits for every event of `stream` (blocking) and returns its `n` choices.
pub fn collect_blocking(
    stream: RequestStream,
    n: usize,
) -> Result<Vec<ChoiceOutput>, GenerationFailed> {
    let mut collector = Collector::new(n);
    for event in stream {
        collector.push(event)?;
    }
    Ok(collector.finish())
}

/// Usage over the choices of one prompt: the prompt once, every choice's completion.
pub fn combined_usage(usages: impl IntoIterator<Item = Usage>) -> Usage {
    let mut total = Usage::default();
    for u in usages {
        total.prompt_tokens = total.prompt_tokens.max(u.prompt_tokens);
        total.cached_prompt_tokens = total.cached_prompt_tokens.max(u.cached_prompt_tokens);
        total.completion_tokens += u.completion_tokens;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn token(index: usize, token: u32, text: &str) -> TokenEvent {
        TokenEvent::Token {
            index,
            token,
            text: text.into(),
            logprob: None,
            at: Instant::now(),
        }
    }

    fn finished(index: usize, text: &str, completion_tokens: usize) -> TokenEvent {
        let now = Instant::now();
        TokenEvent::Finished {
            index,
            reason: FinishReason::Stop,
            text: text.into(),
            usage: Usage {
                prompt_tokens: 4,
                cached_prompt_tokens: 2,
                completion_tokens,
            },
            timings: RequestTimings {
                arrived: now,
                first_scheduled: Some(now),
                first_token: Some(now),
                finished: now,
            },
        }
    }

    #[test]
    fn interleaved_choices_come_back_in_index_order_with_held_back_text() {
        let mut c = Collector::new(2);
        for ev in [
            token(1, 7, "b"),
            token(0, 5, "a"),
            token(0, 6, ""),
            finished(1, "!", 1),
            finished(0, "c", 2),
        ] {
            c.push(ev).expect("no error");
        }
        let out = c.finish();
        assert_eq!(out[0].text, "ac");
        assert_eq!(out[0].tokens, vec![5, 6]);
        assert_eq!(out[1].text, "b!");
        assert_eq!(out[1].finish, FinishReason::Stop);
        assert!(out[1].timings.is_some());
        let total = combined_usage(out.iter().map(|c| c.usage));
        assert_eq!(
            (
                total.prompt_tokens,
                total.cached_prompt_tokens,
                total.completion_tokens
            ),
            (4, 2, 3)
        );
    }

    #[test]
    fn an_error_fails_the_request_and_unfinished_choices_are_aborts() {
        let mut c = Collector::new(2);
        c.push(token(0, 1, "x")).expect("token");
        let e = c
            .push(TokenEvent::Error {
                message: "boom".into(),
            })
            .expect_err("error event");
        assert_eq!(e.0, "boom");
        let out = Collector::new(1).finish();
        assert_eq!(out[0].finish, FinishReason::Abort);
        // Out-of-range indices (never sent by the engine) are ignored, not a panic.
        let mut c = Collector::new(1);
        c.push(token(3, 1, "x")).expect("ignored");
    }
}
