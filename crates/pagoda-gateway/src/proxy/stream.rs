//! Relaying a committed SSE stream to the client while tallying it.
//!
//! The relay re-frames each upstream event (so a usage-only chunk the gateway asked for, but
//! the client did not, can be dropped), notes the time to the first content chunk, the usage
//! the backend reports and the response id, and keeps a bounded copy for the cache. With a
//! [`Redaction`] each event names the route instead of the upstream (`privacy.rs`), so the
//! cached copy does too.
//!
//! Invariants:
//! - a relayed stream is never retried or replayed: the retry policy (`retry.rs`) ends when
//!   the first chunk commits the stream, since the client already has part of an answer;
//! - a stream that breaks after its first byte (upstream error, idle timeout, or an end
//!   without `[DONE]`) ends with an OpenAI-style error event and never with `[DONE]`, so a
//!   client cannot mistake a cut answer for a complete one; with a [`Redaction`] that event
//!   names the route and the request id, and why it broke goes to the log only;
//! - the `on_end` callback runs exactly once: when the stream finishes, or when it is dropped
//!   because the client went away (then `client_gone` is set);
//! - the replica permit is held until that moment.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::{BoxStream, Stream, StreamExt};
use pagoda_protocol::sse::{data_event, SseReader, DONE};
use serde_json::Value;

use crate::error::ApiError;
use crate::privacy::Redaction;
use crate::upstream::ReplicaPermit;

/// What the relay saw.
#[derive(Debug, Default, Clone)]
pub struct StreamTally {
    pub ttft: Option<Duration>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Content chunks relayed (the completion-token estimate when the backend sent no usage).
    pub content_chunks: u64,
    pub response_id: Option<String>,
    /// `[DONE]` arrived.
    pub completed: bool,
    /// Why the stream was cut, when it was.
    pub broken: Option<String>,
    pub client_gone: bool,
    /// The relayed bytes, when they fit in the cache limit.
    pub copy: Option<Vec<u8>>,
}

type OnEnd = Box<dyn FnOnce(StreamTally) + Send>;

struct Finisher {
    tally: StreamTally,
    on_end: Option<OnEnd>,
    _permit: Option<ReplicaPermit>,
}

impl Finisher {
    fn finish(&mut self) {
        if let Some(f) = self.on_end.take() {
            f(std::mem::take(&mut self.tally));
        }
    }
}

impl Drop for Finisher {
    fn drop(&mut self) {
        if self.on_end.is_some() {
            if !self.tally.completed && self.tally.broken.is_none() {
                self.tally.client_gone = true;
            }
            self.finish();
        }
    }
}

/// Options of one relay.
pub struct RelayOptions {
    pub started: Instant,
    pub idle_timeout: Duration,
    /// Drop usage-only chunks (the client did not ask for `stream_options.include_usage`).
    pub strip_usage_chunk: bool,
    /// Keep a copy up to this many bytes (0 = no copy).
    pub copy_limit: usize,
    /// The request's id and route, for the log line of a broken stream.
    pub request_id: String,
    pub route: String,
    /// Rewrites what events say about the upstream; None relays them as they come
    /// (`server.expose_upstream_details`).
    pub redaction: Option<Redaction>,
}

struct State {
    first: Option<Bytes>,
    rest: BoxStream<'static, reqwest::Result<Bytes>>,
    reader: SseReader,
    out: VecDeque<Bytes>,
    options: RelayOptions,
    finisher: Finisher,
    ended: bool,
}

/// Relays `first` then `rest`; `on_end` gets the tally once.
pub fn relay(
    first: Bytes,
    rest: BoxStream<'static, reqwest::Result<Bytes>>,
    permit: Option<ReplicaPermit>,
    options: RelayOptions,
    on_end: OnEnd,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    let copy = (options.copy_limit > 0).then(Vec::new);
    let state = State {
        first: Some(first),
        rest,
        reader: SseReader::new(),
        out: VecDeque::new(),
        options,
        finisher: Finisher {
            tally: StreamTally {
                copy,
                ..StreamTally::default()
            },
            on_end: Some(on_end),
            _permit: permit,
        },
        ended: false,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(b) = st.out.pop_front() {
                return Some((Ok(b), st));
            }
            if st.ended {
                st.finisher.finish();
                return None;
            }
            let chunk = match st.first.take() {
                Some(first) => Ok(first),
                None => match tokio::time::timeout(st.options.idle_timeout, st.rest.next()).await {
                    Err(_) => Err(format!(
                        "the backend sent nothing for {} ms",
                        st.options.idle_timeout.as_millis()
                    )),
                    Ok(None) if st.finisher.tally.completed => {
                        st.ended = true;
                        continue;
                    }
                    Ok(None) => Err("the backend closed the stream before its end marker".into()),
                    Ok(Some(Err(e))) => Err(format!("the backend stream failed: {e}")),
                    Ok(Some(Ok(bytes))) => Ok(bytes),
                },
            };
            match chunk {
                Ok(bytes) => st.process(&bytes),
                Err(reason) => st.break_with(reason),
            }
        }
    })
}

impl State {
    fn process(&mut self, bytes: &[u8]) {
        for event in self.reader.feed(bytes) {
            if self.finisher.tally.completed {
                continue; // nothing after [DONE]
            }
            if event.is_done() {
                self.finisher.tally.completed = true;
                self.ended = true;
                self.emit(data_event(DONE));
                continue;
            }
            let data = match serde_json::from_str::<Value>(&event.data) {
                Ok(mut v) => {
                    if self.observe(&v) {
                        continue;
                    }
                    match &self.options.redaction {
                        Some(r) if r.rewrite_value(&mut v, false) => v.to_string(),
                        _ => event.data,
                    }
                }
                Err(_) => match &self.options.redaction {
                    Some(r) => r.scrub(&event.data, None).unwrap_or(event.data),
                    None => event.data,
                },
            };
            self.emit(data_event(&data));
        }
    }

    /// Notes what the event tells; true when it must not be relayed.
    fn observe(&mut self, v: &Value) -> bool {
        let tally = &mut self.finisher.tally;
        if tally.response_id.is_none() {
            tally.response_id = v.get("id").and_then(Value::as_str).map(str::to_string);
        }
        if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
            tally.prompt_tokens = usage.get("prompt_tokens").and_then(Value::as_u64);
            tally.completion_tokens = usage.get("completion_tokens").and_then(Value::as_u64);
        }
        let choices = v.get("choices").and_then(Value::as_array);
        let has_choices = choices.is_some_and(|c| !c.is_empty());
        if has_choices {
            if tally.ttft.is_none() {
                tally.ttft = Some(self.options.started.elapsed());
            }
            tally.content_chunks += 1;
        }
        if v.get("error").is_some() {
            tally.broken = Some(format!("the backend sent an error event: {}", v["error"]));
        }
        self.options.strip_usage_chunk
            && !has_choices
            && v.get("usage").is_some_and(|u| u.is_object())
    }

    fn emit(&mut self, text: String) {
        let tally = &mut self.finisher.tally;
        if let Some(copy) = &mut tally.copy {
            if copy.len() + text.len() <= self.options.copy_limit {
                copy.extend_from_slice(text.as_bytes());
            } else {
                tally.copy = None;
            }
        }
        self.out.push_back(Bytes::from(text));
    }

    fn break_with(&mut self, reason: String) {
        let options = &self.options;
        tracing::warn!(request_id = %options.request_id, route = %options.route, %reason, "stream broken after its first byte");
        let error = match &options.redaction {
            Some(_) => ApiError::stream_cut(&options.route, &options.request_id),
            None => ApiError::stream_broken(format!("the answer was cut off: {reason}")),
        };
        let payload = serde_json::to_string(&error.body()).unwrap_or_default();
        self.finisher.tally.broken = Some(reason);
        self.finisher.tally.copy = None;
        self.out.push_back(Bytes::from(data_event(&payload)));
        self.ended = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn chunk(id: &str, text: &str) -> String {
        data_event(
            &serde_json::json!({"id": id, "choices": [{"index": 0, "delta": {"content": text}}]})
                .to_string(),
        )
    }

    async fn run(parts: Vec<reqwest::Result<Bytes>>, strip: bool) -> (String, StreamTally) {
        run_with(parts, strip, None).await
    }

    async fn run_with(
        parts: Vec<reqwest::Result<Bytes>>,
        strip: bool,
        redaction: Option<Redaction>,
    ) -> (String, StreamTally) {
        let seen = Arc::new(Mutex::new(None));
        let s2 = seen.clone();
        let mut iter = parts.into_iter();
        let first = match iter.next() {
            Some(Ok(b)) => b,
            _ => Bytes::new(),
        };
        let rest = futures_util::stream::iter(iter.collect::<Vec<_>>()).boxed();
        let options = RelayOptions {
            started: Instant::now(),
            idle_timeout: Duration::from_secs(5),
            strip_usage_chunk: strip,
            copy_limit: 1 << 20,
            request_id: "req-1".into(),
            route: "chat".into(),
            redaction,
        };
        let out: Vec<_> = relay(
            first,
            rest,
            None,
            options,
            Box::new(move |t| *s2.lock().unwrap() = Some(t)),
        )
        .collect()
        .await;
        let text: String = out
            .into_iter()
            .map(|b| String::from_utf8(b.unwrap().to_vec()).unwrap())
            .collect();
        let tally = seen.lock().unwrap().take().expect("on_end ran");
        (text, tally)
    }

    #[tokio::test]
    async fn a_complete_stream_is_relayed_and_tallied() {
        let usage = data_event(
            r#"{"id":"r","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2}}"#,
        );
        let parts = vec![
            Ok(Bytes::from(chunk("r", "Hel"))),
            Ok(Bytes::from(format!("{}{}", chunk("r", "lo"), usage))),
            Ok(Bytes::from(data_event(DONE))),
        ];
        let (text, tally) = run(parts, true).await;
        assert!(text.ends_with("data: [DONE]\n\n"));
        assert!(
            !text.contains("usage"),
            "the usage chunk the client did not ask for is dropped"
        );
        assert_eq!(tally.prompt_tokens, Some(7));
        assert_eq!(tally.completion_tokens, Some(2));
        assert_eq!(tally.response_id.as_deref(), Some("r"));
        assert!(tally.completed && tally.broken.is_none() && tally.ttft.is_some());
        assert_eq!(tally.copy.as_deref(), Some(text.as_bytes()));
    }

    #[tokio::test]
    async fn a_stream_cut_mid_way_ends_with_an_error_event_not_done() {
        let parts = vec![Ok(Bytes::from(chunk("r", "Hel")))];
        let (text, tally) = run(parts, true).await;
        assert!(!text.contains("[DONE]"));
        let last = SseReader::new().feed(text.as_bytes()).pop().unwrap();
        let v: Value = serde_json::from_str(&last.data).unwrap();
        assert_eq!(v["error"]["code"], "stream_broken");
        assert!(tally.broken.is_some());
        assert!(tally.copy.is_none(), "a broken stream is never cached");
    }

    #[tokio::test]
    async fn events_split_across_chunks_are_joined() {
        let whole = format!("{}{}", chunk("r", "a"), data_event(DONE));
        let (a, b) = whole.split_at(10);
        let parts = vec![
            Ok(Bytes::from(a.to_string())),
            Ok(Bytes::from(b.to_string())),
        ];
        let (text, tally) = run(parts, false).await;
        assert_eq!(text, whole);
        assert_eq!(tally.content_chunks, 1);
    }

    #[tokio::test]
    async fn a_redacted_relay_names_the_route_in_events_and_in_its_break() {
        let event = |model: &str| {
            data_event(
                &serde_json::json!({"id": "r", "model": model, "choices": [{"index": 0, "delta": {"content": "hi"}}]})
                    .to_string(),
            )
        };
        let redaction = Redaction::new("chat", "secret-7b", Some("http://10.1.2.3:9000"));
        let parts = vec![Ok(Bytes::from(event("secret-7b")))];
        let (text, tally) = run_with(parts, true, Some(redaction)).await;
        let events = SseReader::new().feed(text.as_bytes());
        let first: Value = serde_json::from_str(&events[0].data).unwrap();
        assert_eq!(first["model"], "chat");
        assert_eq!(first["choices"][0]["delta"]["content"], "hi");
        let last: Value = serde_json::from_str(&events[1].data).unwrap();
        assert_eq!(
            last["error"]["message"],
            "route `chat`: the answer was cut off; retry the request (request id req-1)"
        );
        assert_eq!(last["error"]["code"], "stream_broken");
        assert!(
            !text.contains("secret-7b") && !text.contains("10.1.2.3"),
            "{text}"
        );
        assert!(tally.broken.is_some(), "the reason stays in the ledger");
    }
}
