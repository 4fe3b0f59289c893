//! The OpenAI API: `/v1/models`, `/v1/chat/completions`, `/v1/completions`,
//! `/v1/embeddings`. The bodies' checks, knobs and whole responses are pagoda-runtime's
//! (`pagoda_runtime::openai`, shared with `pagoda batch`); shared here: the SSE response.
//!
//! Invariant: every error leaves as OpenAI's error JSON with its status and is counted in
//! `pagoda:request_errors_total`.

mod chat;
mod completions;
mod embeddings;
pub(crate) mod lora;
mod models;

use crate::error::ApiError;
use crate::generation::Generation;
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::stream::{self, SelectAll, Stream, StreamExt};
use pagoda_engine::TokenEvent;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;

pub use embeddings::MAX_INPUTS as MAX_EMBEDDING_INPUTS;

/// The `/v1` routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*id}", get(models::one))
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/embeddings", post(embeddings::handle))
        .route("/v1/load_lora_adapter", post(lora::load))
        .route("/v1/unload_lora_adapter", post(lora::unload))
}

/// Turns a handler's result into a response, counting errors.
pub(crate) fn respond(app: &AppState, result: Result<Response, ApiError>) -> Response {
    match result {
        Ok(r) => r,
        Err(e) => {
            app.metrics.count_error(e.status.as_u16());
            e.into_response()
        }
    }
}

/// Events of several generations (one per prompt), tagged with the prompt's index.
pub(crate) type Merged = SelectAll<Pin<Box<dyn Stream<Item = (usize, TokenEvent)> + Send>>>;

/// Merges generations into one event stream; dropping it drops (aborts) them all.
pub(crate) fn merge(generations: Vec<Generation>) -> Merged {
    stream::select_all(generations.into_iter().enumerate().map(|(p, g)| {
        let s = stream::unfold(g, |mut g| async move {
            let ev = g.next().await?;
            Some((ev, g))
        })
        .map(move |ev| (p, ev));
        Box::pin(s) as Pin<Box<dyn Stream<Item = (usize, TokenEvent)> + Send>>
    }))
}

/// Turns one streamed request's engine events into SSE frames.
pub(crate) trait FrameWriter: Send + 'static {
    /// Frames for event `ev` of prompt `prompt`.
    fn on_event(&mut self, prompt: usize, ev: TokenEvent, out: &mut VecDeque<String>);
    /// Frames after the last event (the usage chunk), before `[DONE]`.
    fn on_end(&mut self, out: &mut VecDeque<String>);
}

/// The frames of a streamed response: `first`, then each event's, then the end's and
/// `[DONE]`. Dropping the stream drops the generations (aborting them).
pub(crate) fn frames<W: FrameWriter>(
    events: Merged,
    writer: W,
    first: VecDeque<String>,
) -> impl Stream<Item = String> + Send + 'static {
    stream::unfold(
        (events, writer, first, false),
        |(mut events, mut writer, mut pending, mut done)| async move {
            loop {
                if let Some(f) = pending.pop_front() {
                    return Some((f, (events, writer, pending, done)));
                }
                if done {
                    return None;
                }
                match events.next().await {
                    Some((p, ev)) => writer.on_event(p, ev, &mut pending),
                    None => {
                        writer.on_end(&mut pending);
                        pending.push_back(pagoda_protocol::sse::data_event(
                            pagoda_protocol::sse::DONE,
                        ));
                        done = true;
                    }
                }
            }
        },
    )
}

/// An SSE response over a stream of already framed events.
pub(crate) fn sse(frames: impl Stream<Item = String> + Send + 'static) -> Response {
    let body = Body::from_stream(frames.map(|f| Ok::<_, Infallible>(Bytes::from(f))));
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// One SSE `data:` frame of a serializable value.
pub(crate) fn frame<T: serde::Serialize>(value: &T) -> String {
    pagoda_protocol::sse::data_event(&serde_json::to_string(value).unwrap_or_default())
}

/// The frame a stream ends with after a failure: OpenAI's error object as an event.
pub(crate) fn error_frame(message: &str) -> String {
    frame(&ApiError::generation_failed(message).openai_body())
}
