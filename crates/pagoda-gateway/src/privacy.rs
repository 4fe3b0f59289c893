//! What a client may learn about the upstreams behind a route.
//!
//! With `server.expose_upstream_details = false` (the default) a client sees the route's name —
//! the model it asked for — and never the backend model behind the route, a replica's address
//! or a connection error. This module owns the rewriting of answers relayed from an upstream
//! ([`Redaction`]). The gateway's own upstream errors are phrased in terms of the route by
//! `ApiError::route_unavailable`, `route_timeout` and `stream_cut`; the details they leave out
//! (replica, backend model, error) go to a log line that carries the request id.
//!
//! A [`Redaction`] rewrites, in a relayed JSON answer or SSE event:
//! - the top-level `model` to the route's name;
//! - every mention of a hidden name — the backend model the gateway asked for, the `model` the
//!   backend reported, the replica's URL, its `host:port` and its host — to the route's name,
//!   in the strings under an `error` member (OpenAI error bodies, SSE error events) and, for
//!   an error answer (status >= 400), in every string of the body (vLLM puts its `message` at
//!   the top level, FastAPI its `detail`);
//! - a body that is not JSON, as text, the same way.
//!
//! Invariants: the content of an answer (messages, text, embeddings) is never changed; a
//! hidden name is replaced only where it is not part of a longer alphanumeric word (a backend
//! model called `a` leaves "failure" alone), in one pass (a replacement is never rescanned); a
//! body that needs no change is relayed byte for byte.

use bytes::Bytes;
use serde_json::Value;

/// How relayed answers are rewritten for one served request (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Redaction {
    route: String,
    /// Names the client must not see: no empty one, none equal to `route`, longest first (a
    /// URL is matched before the `host:port` inside it).
    hidden: Vec<String>,
}

impl Redaction {
    /// For an answer of `replica_url` (None: no replica, e.g. a canned reply) serving
    /// `backend_model` under the client-facing `route`.
    pub fn new(route: &str, backend_model: &str, replica_url: Option<&str>) -> Self {
        let mut hidden = vec![backend_model.to_string()];
        if let Some(url) = replica_url {
            let url = url.trim_end_matches('/');
            hidden.push(url.to_string());
            let authority = authority_of(url);
            hidden.push(authority.to_string());
            hidden.push(host_of(authority).to_string());
        }
        hidden.retain(|name| !name.is_empty() && name != route);
        hidden.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        hidden.dedup();
        Self {
            route: route.to_string(),
            hidden,
        }
    }

    /// The client-facing model name that replaces the hidden ones.
    pub fn route(&self) -> &str {
        &self.route
    }

    /// Rewrites a parsed answer or SSE event in place (`is_error`: the answer's HTTP status is
    /// >= 400, so all of its strings are error text); true when anything changed.
    pub fn rewrite_value(&self, answer: &mut Value, is_error: bool) -> bool {
        let Some(fields) = answer.as_object_mut() else {
            return is_error && self.scrub_strings(answer, None);
        };
        let reported = match fields.get_mut("model") {
            Some(Value::String(model)) if *model != self.route => {
                Some(std::mem::replace(model, self.route.clone()))
            }
            _ => None,
        };
        let extra = reported.as_deref();
        let mut changed = reported.is_some();
        if is_error {
            for value in fields.values_mut() {
                changed |= self.scrub_strings(value, extra);
            }
        } else if let Some(error) = fields.get_mut("error") {
            changed |= self.scrub_strings(error, extra);
        }
        changed
    }

    /// A complete relayed body, given with its parse when it is JSON: the rewritten body, or
    /// `body` itself when nothing needed to change.
    pub fn rewrite_body(&self, body: Bytes, parsed: Option<Value>, is_error: bool) -> Bytes {
        match parsed {
            Some(mut answer) => {
                if !self.rewrite_value(&mut answer, is_error) {
                    return body;
                }
                // Serialising a `Value` cannot fail (its map keys are strings).
                serde_json::to_vec(&answer).map_or(body, Bytes::from)
            }
            None => match std::str::from_utf8(&body)
                .ok()
                .and_then(|text| self.scrub(text, None))
            {
                Some(text) => Bytes::from(text),
                None => body,
            },
        }
    }

    /// `text` with every standalone hidden name (and `extra`, when given) replaced by the
    /// route's name; None when there was none.
    pub fn scrub(&self, text: &str, extra: Option<&str>) -> Option<String> {
        let mut names: Vec<&str> = self.hidden.iter().map(String::as_str).collect();
        if let Some(extra) = extra.filter(|e| !e.is_empty() && *e != self.route) {
            let at = names.partition_point(|n| n.len() >= extra.len());
            names.insert(at, extra);
        }
        if !names.iter().any(|name| text.contains(name)) {
            return None;
        }
        replace_standalone(text, &names, &self.route)
    }

    /// Scrubs every string inside `value`; true when one changed.
    fn scrub_strings(&self, value: &mut Value, extra: Option<&str>) -> bool {
        match value {
            Value::String(text) => match self.scrub(text, extra) {
                Some(scrubbed) => {
                    *text = scrubbed;
                    true
                }
                None => false,
            },
            Value::Array(items) => items
                .iter_mut()
                .fold(false, |changed, v| self.scrub_strings(v, extra) | changed),
            Value::Object(fields) => fields
                .values_mut()
                .fold(false, |changed, v| self.scrub_strings(v, extra) | changed),
            _ => false,
        }
    }
}

/// `host:port` of a URL (`user:pass@` dropped), or the URL itself when it has no scheme.
fn authority_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
}

/// The host of a `host:port` (an IPv6 host keeps its brackets).
fn host_of(authority: &str) -> &str {
    match authority.rsplit_once(':') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// One pass over `text`: at each position the first of `names` (longest first) that starts
/// there and is not part of a longer alphanumeric word is replaced by `with`. None when
/// nothing was replaced.
fn replace_standalone(text: &str, names: &[&str], with: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut at = 0;
    while at < text.len() {
        let rest = &text[at..];
        let found = names
            .iter()
            .find(|name| rest.starts_with(**name) && stands_alone(text, at, name));
        match found {
            Some(name) => {
                out.push_str(&text[copied..at]);
                out.push_str(with);
                at += name.len();
                copied = at;
            }
            None => at += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

/// Whether `name`, found at byte `at` of `text`, is not glued to letters or digits on a side
/// where it itself starts or ends with one.
fn stands_alone(text: &str, at: usize, name: &str) -> bool {
    let glued_before = name.starts_with(char::is_alphanumeric)
        && text[..at]
            .chars()
            .next_back()
            .is_some_and(char::is_alphanumeric);
    let glued_after = name.ends_with(char::is_alphanumeric)
        && text[at + name.len()..]
            .chars()
            .next()
            .is_some_and(char::is_alphanumeric);
    !glued_before && !glued_after
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn redaction() -> Redaction {
        Redaction::new("chat", "qwen2.5:7b", Some("http://10.0.0.5:8000/"))
    }

    #[test]
    fn hidden_names_are_the_model_url_authority_and_host_longest_first() {
        assert_eq!(
            redaction().hidden,
            [
                "http://10.0.0.5:8000",
                "10.0.0.5:8000",
                "qwen2.5:7b",
                "10.0.0.5"
            ]
        );
        assert_eq!(
            authority_of("https://u:p@h.example:443/v1"),
            "h.example:443"
        );
        assert_eq!(host_of("[::1]:8000"), "[::1]");
        assert_eq!(host_of("gpu-node"), "gpu-node");
        // The route's own name is never hidden.
        assert!(Redaction::new("chat", "chat", None).hidden.is_empty());
    }

    #[test]
    fn answers_name_the_route_and_keep_their_content() {
        let mut v = json!({"model": "qwen2.5:7b", "choices": [{"message": {"content": "I am qwen2.5:7b"}}]});
        assert!(redaction().rewrite_value(&mut v, false));
        assert_eq!(v["model"], "chat");
        assert_eq!(v["choices"][0]["message"]["content"], "I am qwen2.5:7b");
        let mut already = json!({"model": "chat"});
        assert!(!redaction().rewrite_value(&mut already, false));
    }

    #[test]
    fn error_texts_lose_the_model_the_reported_model_and_the_address() {
        let mut v = json!({"model": "qwen2.5:7b-0601", "error": {"message":
            "model qwen2.5:7b-0601 at http://10.0.0.5:8000/v1 (10.0.0.5) is busy"}});
        assert!(redaction().rewrite_value(&mut v, false));
        assert_eq!(
            v["error"]["message"], "model chat at chat/v1 (chat) is busy",
            "the reported snapshot name is hidden, not just its prefix"
        );
        // vLLM's error shape: the message at the top level of an error answer.
        let mut v = json!({"object": "error", "message": "The model `qwen2.5:7b` does not exist."});
        assert!(redaction().rewrite_value(&mut v, true));
        assert_eq!(v["message"], "The model `chat` does not exist.");
    }

    #[test]
    fn names_inside_longer_words_are_left_alone() {
        let r = Redaction::new("chat", "a", None);
        assert_eq!(r.scrub("stub failure", None), None);
        assert_eq!(
            r.scrub("model a: failure", None).as_deref(),
            Some("model chat: failure")
        );
        // One pass: the replacement is not rescanned (route contains a hidden name).
        let r = Redaction::new("llama-chat", "llama", None);
        assert_eq!(
            r.scrub("llama down", None).as_deref(),
            Some("llama-chat down")
        );
    }

    #[test]
    fn bodies_that_need_no_change_are_relayed_as_they_came() {
        let body = Bytes::from_static(b"{\"b\": 1, \"model\": \"chat\"}");
        let parsed = serde_json::from_slice(&body).ok();
        assert_eq!(redaction().rewrite_body(body.clone(), parsed, false), body);
        let text = Bytes::from_static(b"upstream http://10.0.0.5:8000 refused");
        assert_eq!(
            redaction().rewrite_body(text, None, true),
            Bytes::from_static(b"upstream chat refused")
        );
    }
}
