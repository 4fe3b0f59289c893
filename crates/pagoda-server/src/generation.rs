//! One request's run through the engine, shared by both APIs: admission control (queue
//! limit), submission of its `pagoda_runtime::Plan`, the event stream with metrics observed on the way, the structured log line
//! when it ends, and [`collect`] for non-streamed responses (through the runtime's
//! [`Collector`], as `pagoda batch` collects).
//!
//! Invariants: a [`Generation`] holds its model's [`Lease`] for as long as it lives;
//! dropping it (a client that went away) aborts the engine request, which frees its KV
//! blocks, and counts it in `pagoda:request_success_total{finished_reason="abort"}`; exactly
//! one log line is written per request.

use crate::error::ApiError;
use crate::metrics::RequestObserver;
use crate::registry::Lease;
use crate::state::AppState;
use pagoda_engine::{EngineRequest, RequestStream, TokenEvent};
use pagoda_runtime::{ChoiceOutput, Collector, Plan};
use std::time::Instant;

/// A submitted request and what is known of it so far.
pub struct Generation {
    pub lease: Lease,
    pub id: String,
    /// The response's `x-request-id`, which the error log lines carry too.
    http_request_id: Option<String>,
    stream: RequestStream,
    observer: RequestObserver,
    started: Instant,
    first_token: Option<Instant>,
    prompt_tokens: usize,
    completion_tokens: usize,
    open_choices: usize,
    outcome: Option<&'static str>,
}

impl Generation {
    /// Submits `plan` on `lease`'s engine, refusing with 429 when the model's queue
    /// (requests beyond the running batch) is full; a constraint the engine refuses is
    /// named by the plan's constraint field.
    pub fn start(app: &AppState, lease: Lease, plan: Plan, id: String) -> Result<Self, ApiError> {
        let constraint_field = plan.constraint_field;
        Self::submit(app, lease, plan.request, id).map_err(|e| e.constraint_param(constraint_field))
    }

    fn submit(
        app: &AppState,
        lease: Lease,
        mut request: EngineRequest,
        id: String,
    ) -> Result<Self, ApiError> {
        if request.adapter.is_none() {
            request.adapter = lease.adapter.clone();
        }
        let limit = app.config.max_num_seqs_per_model() + app.config.max_queue;
        if lease.in_flight() > limit {
            return Err(ApiError::queue_full(app.config.max_queue));
        }
        app.admit()?;
        let n = request.n;
        let prompt_tokens = request.prompt.len();
        let stream = lease.engine.submit(request)?;
        let observer = app.metrics.observe(&lease.name);
        Ok(Generation {
            lease,
            id,
            http_request_id: crate::request_id::current(),
            stream,
            observer,
            started: Instant::now(),
            first_token: None,
            prompt_tokens,
            completion_tokens: 0,
            open_choices: n,
            outcome: None,
        })
    }

    /// The next event; `None` after the last.
    pub async fn next(&mut self) -> Option<TokenEvent> {
        let ev = self.stream.next_event().await?;
        match &ev {
            TokenEvent::Token { index, at, .. } => {
                self.first_token.get_or_insert(*at);
                self.completion_tokens += 1;
                self.observer.token(*index, *at);
            }
            TokenEvent::Finished {
                index,
                reason,
                timings,
                ..
            } => {
                self.observer.finished(*index, *reason, timings);
                self.open_choices = self.open_choices.saturating_sub(1);
                if self.open_choices == 0 {
                    self.outcome = Some(reason.as_str());
                }
            }
            TokenEvent::Error { .. } => self.outcome = Some("error"),
        }
        Some(ev)
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if self.outcome.is_none() {
            // The client went away first: counted as vLLM counts it.
            self.observer.client_disconnected();
        }
        let ms = |i: Instant| i.duration_since(self.started).as_secs_f64() * 1e3;
        tracing::info!(
            request_id = %self.id,
            x_request_id = self.http_request_id.as_deref().unwrap_or("-"),
            model = %self.lease.name,
            version = %self.lease.version,
            prompt_tokens = self.prompt_tokens,
            completion_tokens = self.completion_tokens,
            ttft_ms = self.first_token.map(ms),
            e2e_ms = ms(Instant::now()),
            outcome = self.outcome.unwrap_or("client_disconnected"),
            "request"
        );
    }
}

/// Runs a generation to its end and returns its choices in index order.
pub async fn collect(generation: &mut Generation, n: usize) -> Result<Vec<ChoiceOutput>, ApiError> {
    let mut collector = Collector::new(n);
    while let Some(ev) = generation.next().await {
        collector.push(ev)?;
    }
    Ok(collector.finish())
}
