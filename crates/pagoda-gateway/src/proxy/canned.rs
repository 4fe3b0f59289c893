//! Canned replies: the last link of a fallback chain, a fixed text in the shape the client
//! asked for (chat or text completion, JSON or an SSE stream), so that an outage degrades to
//! a polite answer instead of an error. Embeddings have no canned form (`None`).
//!
//! Invariant: a canned stream is complete — content chunk, a stop chunk, then `[DONE]` — and
//! reports zero usage, since no model ran.

use bytes::Bytes;
use pagoda_protocol::sse::{data_event, DONE};
use serde_json::json;

use super::Endpoint;

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The reply in the endpoint's shape, or `None` when the endpoint has no canned form.
pub fn reply(
    endpoint: Endpoint,
    stream: bool,
    model: &str,
    text: &str,
    request_id: &str,
) -> Option<Bytes> {
    let created = now_s();
    let usage = json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0});
    let body = match (endpoint, stream) {
        (Endpoint::Embeddings, _) => return None,
        (Endpoint::Chat, false) => json!({
            "id": format!("chatcmpl-{request_id}"), "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage,
        })
        .to_string(),
        (Endpoint::Completions, false) => json!({
            "id": format!("cmpl-{request_id}"), "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": null}],
            "usage": usage,
        })
        .to_string(),
        (Endpoint::Chat, true) => {
            let chunk = |delta: serde_json::Value, finish: Option<&str>| {
                data_event(&json!({
                    "id": format!("chatcmpl-{request_id}"), "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }).to_string())
            };
            [
                chunk(json!({"role": "assistant", "content": text}), None),
                chunk(json!({}), Some("stop")),
                data_event(DONE),
            ]
            .concat()
        }
        (Endpoint::Completions, true) => {
            let chunk = |t: &str, finish: Option<&str>| {
                data_event(&json!({
                    "id": format!("cmpl-{request_id}"), "object": "text_completion", "created": created,
                    "model": model, "choices": [{"index": 0, "text": t, "finish_reason": finish, "logprobs": null}],
                }).to_string())
            };
            [chunk(text, None), chunk("", Some("stop")), data_event(DONE)].concat()
        }
    };
    Some(Bytes::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_protocol::sse::SseReader;

    #[test]
    fn chat_json_has_the_text_and_zero_usage() {
        let b = reply(Endpoint::Chat, false, "sorry", "busy, try later", "r1").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "busy, try later");
        assert_eq!(v["usage"]["total_tokens"], 0);
    }

    #[test]
    fn streams_end_with_stop_and_done() {
        for endpoint in [Endpoint::Chat, Endpoint::Completions] {
            let b = reply(endpoint, true, "sorry", "busy", "r1").unwrap();
            let events = SseReader::new().feed(&b);
            assert_eq!(events.len(), 3);
            assert!(events[2].is_done());
            let stop: serde_json::Value = serde_json::from_str(&events[1].data).unwrap();
            assert_eq!(stop["choices"][0]["finish_reason"], "stop");
        }
        assert!(reply(Endpoint::Embeddings, false, "m", "t", "r").is_none());
    }
}
