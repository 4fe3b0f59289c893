//! Fuzz target: arbitrary bytes as the body of every request the server reads with
//! `crate::body::json`, through `pagoda_protocol::json::parse_body`, plus the SSE reader and
//! writer of `pagoda_protocol::sse`. Any panic or failed assertion is a bug.
//!
//! For each wire type that parses, the target runs the type's cheap pure methods (Ollama
//! `keep_alive` durations, chat message text, prompt and stop lists, model names) and a
//! serde round trip: serializing is a fixed point after one step, and where every float of
//! the value is finite the value read back equals the one parsed. (An f32 field given a number
//! past f32's range, `"temperature": 1e39`, reads as infinity, which JSON writes as `null`; the
//! server's range checks refuse such values with the parameter named, so that loss is
//! accepted and only the fixed point is asserted then.)
//!
//! The same bytes, cut at a point taken from the input, go through `SseReader` in two pieces
//! and must give the events of one piece; each event's data framed again with `data_event`
//! reads back unchanged; and the bytes as (lossy) text framed as one payload read back as that
//! payload with its line ends made `\n`.
//!
//! Run: `cd fuzz && cargo +nightly fuzz run request_body corpus/request_body` (seeds:
//! `fuzz/seeds/request_body/`, see fuzz/README.md).

#![no_main]

use libfuzzer_sys::fuzz_target;
use pagoda_protocol::json::parse_body;
use pagoda_protocol::ollama::{self, KeepAlive};
use pagoda_protocol::openai::{self, chat, completion, embedding};
use pagoda_protocol::sse::{data_event, SseReader};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt::Debug;

/// The body of the legacy `/api/embeddings`. The server's type is private to
/// `pagoda-server/src/ollama/embed.rs` (`LegacyRequest`); this has the same fields and serde
/// attributes, so the same bytes parse to the same shape.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct LegacyEmbeddingsRequest {
    model: String,
    #[serde(default)]
    prompt: String,
}

/// Longest a `keep_alive` can last, in seconds (`KeepAlive::duration` caps at 1e12).
const MAX_KEEP_ALIVE_SECS: f64 = 1e12;

fuzz_target!(|data: &[u8]| {
    requests(data);
    sse(data);
    keep_alive_text(data);
});

/// Every request type the server accepts, from the same bytes.
fn requests(data: &[u8]) {
    // OpenAI.
    if let Some(r) = body::<chat::ChatCompletionRequest>(data) {
        for m in &r.messages {
            let _ = m.text();
        }
        let _ = r.stop.clone().map(openai::Stop::into_vec);
        round_trip(&r, openai_floats_finite(&r.logit_bias, &sampling_chat(&r)));
    }
    if let Some(r) = body::<completion::CompletionRequest>(data) {
        let _ = r.prompt.clone().into_inputs();
        let _ = r.stop.clone().map(openai::Stop::into_vec);
        round_trip(
            &r,
            openai_floats_finite(&r.logit_bias, &sampling_completion(&r)),
        );
    }
    if let Some(r) = body::<embedding::EmbeddingRequest>(data) {
        round_trip(&r, true);
    }
    if let Some(r) = body::<openai::LoadLoraAdapterRequest>(data) {
        round_trip(&r, true);
    }
    if let Some(r) = body::<openai::UnloadLoraAdapterRequest>(data) {
        round_trip(&r, true);
    }

    // Ollama.
    if let Some(r) = body::<ollama::GenerateRequest>(data) {
        keep_alive(r.keep_alive.as_ref());
        round_trip(&r, options_finite(r.options.as_ref()));
    }
    if let Some(r) = body::<ollama::ChatRequest>(data) {
        keep_alive(r.keep_alive.as_ref());
        round_trip(&r, options_finite(r.options.as_ref()));
    }
    if let Some(r) = body::<ollama::EmbedRequest>(data) {
        keep_alive(r.keep_alive.as_ref());
        round_trip(&r, options_finite(r.options.as_ref()));
    }
    if let Some(r) = body::<LegacyEmbeddingsRequest>(data) {
        round_trip(&r, true);
    }
    if let Some(r) = body::<ollama::ShowRequest>(data) {
        let name = r.model_name();
        assert!(name == r.model || name == r.name);
        round_trip(&r, true);
    }
    // `/api/pull` and `/api/delete` read the same type.
    if let Some(r) = body::<ollama::PullRequest>(data) {
        let name = r.model_name();
        assert!(name == r.model || name == r.name);
        round_trip(&r, true);
    }
    // `parameters` holds free JSON numbers: only the fixed point is asserted.
    if let Some(r) = body::<ollama::CreateRequest>(data) {
        let _ = r.model_name();
        round_trip(&r, false);
    }
    if let Some(r) = body::<ollama::CopyRequest>(data) {
        round_trip(&r, true);
    }
}

/// `parse_body` as the server calls it; an error is fine, a panic is not.
fn body<T: DeserializeOwned>(data: &[u8]) -> Option<T> {
    parse_body::<T>(data).ok()
}

/// Serializes `v` and reads it back: the second serialization equals the first, and when
/// `lossless` (every float finite) the value read back equals `v`.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(v: &T, lossless: bool) {
    let text = serde_json::to_vec(v).expect("a parsed request serializes");
    let back: T = match parse_body(&text) {
        Ok(back) => back,
        Err(e) => panic!(
            "{v:?} serialized as {} does not parse back: {e}",
            String::from_utf8_lossy(&text)
        ),
    };
    let again = serde_json::to_vec(&back).expect("a parsed request serializes");
    assert_eq!(
        String::from_utf8_lossy(&text),
        String::from_utf8_lossy(&again),
        "serializing is not a fixed point"
    );
    if lossless {
        assert_eq!(
            &back,
            v,
            "round trip through {}",
            String::from_utf8_lossy(&text)
        );
    }
}

/// Ollama `keep_alive`: reading it never panics, and a finite answer is within the cap.
fn keep_alive(k: Option<&KeepAlive>) {
    if let Some(Ok(Some(d))) = k.map(KeepAlive::duration) {
        assert!(d.as_secs_f64() <= MAX_KEEP_ALIVE_SECS, "{k:?} -> {d:?}");
    }
}

/// The input as a Go-style duration string, and its first 8 bytes as a number of seconds.
fn keep_alive_text(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    keep_alive(Some(&KeepAlive::Text(text)));
    if let Some(bytes) = data.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
        keep_alive(Some(&KeepAlive::Seconds(f64::from_le_bytes(bytes))));
    }
}

fn sampling_chat(r: &chat::ChatCompletionRequest) -> [Option<f32>; 6] {
    [
        r.temperature,
        r.top_p,
        r.min_p,
        r.presence_penalty,
        r.frequency_penalty,
        r.repetition_penalty,
    ]
}

fn sampling_completion(r: &completion::CompletionRequest) -> [Option<f32>; 6] {
    [
        r.temperature,
        r.top_p,
        r.min_p,
        r.presence_penalty,
        r.frequency_penalty,
        r.repetition_penalty,
    ]
}

fn openai_floats_finite(
    bias: &Option<std::collections::BTreeMap<String, f32>>,
    sampling: &[Option<f32>],
) -> bool {
    sampling.iter().flatten().all(|x| x.is_finite())
        && bias.iter().flat_map(|b| b.values()).all(|x| x.is_finite())
}

fn options_finite(o: Option<&ollama::Options>) -> bool {
    o.is_none_or(|o| {
        [
            o.temperature,
            o.top_p,
            o.min_p,
            o.repeat_penalty,
            o.presence_penalty,
            o.frequency_penalty,
        ]
        .iter()
        .flatten()
        .all(|x| x.is_finite())
    })
}

/// The SSE reader on the raw bytes (whole, and cut in two) and the writer on them as text.
fn sse(data: &[u8]) {
    let cut = cut_point(data);
    let whole = SseReader::new().feed(data);
    let mut reader = SseReader::new();
    let mut pieces = reader.feed(&data[..cut]);
    pieces.extend(reader.feed(&data[cut..]));
    assert_eq!(whole, pieces, "cut at {cut}");

    for ev in &whole {
        let framed = data_event(&ev.data);
        let back = SseReader::new().feed(framed.as_bytes());
        assert_eq!(back.len(), 1, "{:?} framed as {framed:?}", ev.data);
        assert_eq!(back[0].data, ev.data, "framed as {framed:?}");
    }

    let payload = String::from_utf8_lossy(data);
    let framed = data_event(&payload);
    let bytes = framed.as_bytes();
    let cut = cut.min(bytes.len());
    let mut reader = SseReader::new();
    let mut back = reader.feed(&bytes[..cut]);
    back.extend(reader.feed(&bytes[cut..]));
    let expected = payload.replace("\r\n", "\n").replace('\r', "\n");
    assert_eq!(back.len(), 1, "{payload:?} framed as {framed:?}");
    assert_eq!(back[0].data, expected, "framed as {framed:?}");
}

/// Where to cut the input in two: taken from its first and last bytes, so mutations move it.
fn cut_point(data: &[u8]) -> usize {
    match (data.first(), data.last()) {
        (Some(&a), Some(&b)) => (usize::from(a) * 256 + usize::from(b)) % (data.len() + 1),
        _ => 0,
    }
}
