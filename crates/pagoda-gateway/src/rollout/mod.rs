//! Canary rollouts: automatic promotion through traffic steps and automatic rollback.
//!
//! Owns [`Rollouts`], every route's rollout keyed by the route's model name. The request path
//! reads [`Rollouts::canary_percent`] (lock-free: an atomic per rollout behind an `ArcSwap`
//! map) to split traffic, then reports each finished request with [`Rollouts::record`] and each
//! response id with [`Rollouts::remember_response`]; `POST /v1/feedback` calls
//! [`Rollouts::feedback`]. [`Rollouts::tick`] (run by [`Rollouts::spawn_analysis`]) compares the
//! canary with stable in the current step's window and promotes or rolls back; the admin API
//! uses [`Rollouts::status`], [`Rollouts::promote`], [`Rollouts::pause`], [`Rollouts::resume`],
//! [`Rollouts::abort`] and [`Rollouts::restart`] (through [`Rollouts::act`]).
//!
//! With Redis configured ([`Rollouts::shared`]) the rollouts are one system across gateway
//! instances: the phase (state, step, window, step start), every instance's step statistics
//! and the history of changes live in Redis (see `shared`); the analysis loop syncs every
//! rollout every 250 ms, and decisions and admin actions are written by compare-and-set before
//! any instance applies them. Without Redis each instance runs its rollouts alone, in memory,
//! and a restart starts them again from the first step.
//!
//! Decision rules (per rollout, while progressing, at most once per `interval_s`):
//! - Roll back at once (canary 0 %) when the canary has at least `max(10, min_requests / 5)`
//!   requests in the step and is worse than stable beyond a threshold on error rate, p99
//!   latency or p99 TTFT (both ratio and `latency_slack_ms` exceeded), or negative-feedback rate
//!   (at least 5 feedbacks each side). Stable needs the same number of requests; when it has
//!   fewer in this step (at 100 % it has none), the stable statistics of the latest earlier step
//!   that had enough are used, and with none the comparison is skipped.
//! - Otherwise promote when the step has been held `hold_s` and the canary served
//!   `min_requests` requests in it; statistics restart with each step. Passing the last step
//!   completes the rollout with the canary at 100 %, whatever the last step's percent.
//!
//! Invariants: a rollback or abort is a traffic switch only (the percent read by the next
//! request is 0); the gateway never stops a version. A reload keeps the state of a rollout
//! whose stable and canary are unchanged, starts a new one otherwise. Latency quantiles are
//! about 1 % accurate (see `stats`). Feedback counts into the statistics of the step current
//! when it arrives; a second feedback for the same response replaces the first if that one was
//! counted in the same step (an earlier step's statistics are gone). Feedback for a response of
//! a route without a rollout, or of a version that is neither stable nor canary, is accepted
//! and not counted.

pub mod analysis;
pub mod controller;
pub mod feedback;
pub mod shared;
pub mod stats;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use serde::{Serialize, Serializer};
use tokio::task::JoinHandle;

use crate::config::GatewayConfig;

use controller::Controller;
use feedback::{ResponseMemory, DEFAULT_CAPACITY};
use shared::{HistoryEntry, RedisRolloutStore};
pub use stats::StatsSummary;

/// The analysis loop never runs more often than this.
const MIN_ANALYSIS_PERIOD: Duration = Duration::from_millis(100);
/// The analysis loop runs at least this often, so each rollout is analysed close to its own
/// `interval_s` (a rollout is skipped until its interval has passed) and a reload that adds a
/// rollout or shortens an interval is picked up quickly.
const MAX_ANALYSIS_PERIOD: Duration = Duration::from_secs(1);

/// How one proxied request ended, as rollout statistics see it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// False for 5xx, timeouts, connection errors, broken streams.
    pub ok: bool,
    /// Whole request, until the last byte.
    pub latency: Duration,
    /// Time to the first token, for streams.
    pub ttft: Option<Duration>,
}

/// Where a rollout stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutState {
    /// Moving through the steps: automatic promotion and rollback.
    Progressing,
    /// Held at the current percent by an operator; no automatic changes.
    Paused,
    /// Passed the last step: the canary serves 100 %.
    Completed,
    /// The canary was worse than stable: it gets 0 %; `reason` names the metric and values.
    RolledBack { reason: String },
    /// Stopped by an operator: the canary gets 0 %.
    Aborted,
}

impl RolloutState {
    /// `progressing`, `paused`, `completed`, `rolled_back` or `aborted`.
    pub fn name(&self) -> &'static str {
        match self {
            RolloutState::Progressing => "progressing",
            RolloutState::Paused => "paused",
            RolloutState::Completed => "completed",
            RolloutState::RolledBack { .. } => "rolled_back",
            RolloutState::Aborted => "aborted",
        }
    }
}

/// Serialised as its [`RolloutState::name`]; the reason is [`RolloutStatus::reason`].
impl Serialize for RolloutState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// One rollout, as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RolloutStatus {
    pub route: String,
    pub stable: String,
    pub canary: String,
    pub state: RolloutState,
    /// Why it was rolled back or aborted.
    pub reason: Option<String>,
    /// Index into `steps`.
    pub step: usize,
    pub steps: Vec<f64>,
    /// Canary traffic share now, 0..=100.
    pub canary_percent: f64,
    pub hold_s: f64,
    pub min_requests: u64,
    /// When the current step (and its statistics window) began.
    pub step_started_unix_ms: u64,
    pub step_age_s: f64,
    /// Over every gateway instance when the state is shared.
    pub stable_stats: StatsSummary,
    pub canary_stats: StatsSummary,
    /// The changes recorded in the shared state, oldest first (shared mode only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<HistoryEntry>>,
}

/// What an operator can do to a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Promote,
    Pause,
    Resume,
    Abort,
    Restart,
}

impl Action {
    /// The action named in `POST /admin/rollouts/{route}/{action}`.
    pub fn parse(name: &str) -> Option<Action> {
        Some(match name {
            "promote" => Action::Promote,
            "pause" => Action::Pause,
            "resume" => Action::Resume,
            "abort" => Action::Abort,
            "restart" => Action::Restart,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Action::Promote => "promote",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Abort => "abort",
            Action::Restart => "restart",
        }
    }

    /// Applies the action to `c` (the controller itself, or a fork in shared mode).
    fn apply(self, c: &Controller, now: Instant) -> Result<RolloutStatus, RolloutError> {
        match self {
            Action::Promote => c.promote(now).map(|(_, status)| status),
            Action::Pause => c.pause(now),
            Action::Resume => c.resume(now),
            Action::Abort => c.abort(now),
            Action::Restart => Ok(c.restart(now)),
        }
    }
}

/// A change made by the automatic analysis.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RolloutEvent {
    Promoted {
        route: String,
        canary: String,
        step: usize,
        from_percent: f64,
        to_percent: f64,
    },
    Completed {
        route: String,
        canary: String,
    },
    RolledBack {
        route: String,
        canary: String,
        reason: String,
    },
}

/// Why an admin action on a rollout was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RolloutError {
    #[error("route '{0}' has no rollout: add a `rollout` to its [[route]] in the config (GET /admin/rollouts lists the rollouts)")]
    UnknownRoute(String),
    #[error("the rollout of route '{route}' is {state}, not in progress: {hint}")]
    NotProgressing {
        route: String,
        state: String,
        hint: String,
    },
    #[error("the shared rollout state is unavailable: {0} (check that Redis is reachable; routing keeps the last state read)")]
    Shared(String),
    #[error("the rollout of route '{0}' kept changing under this action (other gateway instances acting at the same time): try again")]
    Contended(String),
}

/// Why feedback was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FeedbackError {
    #[error("unknown response id '{0}': it was never served by this gateway, or it is too old (the gateway remembers only its most recent responses, 100 000 by default)")]
    UnknownResponse(String),
}

/// All rollouts, keyed by route model name.
pub struct Rollouts {
    controllers: ArcSwap<HashMap<String, Arc<Controller>>>,
    responses: Mutex<ResponseMemory>,
    /// Serialises `sync` calls (readers never take it).
    sync_lock: Mutex<()>,
    /// The shared store when Redis is configured.
    shared: Option<Arc<RedisRolloutStore>>,
}

impl Default for Rollouts {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Rollouts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let routes: Vec<String> = self.controllers.load().keys().cloned().collect();
        f.debug_struct("Rollouts").field("routes", &routes).finish()
    }
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Rollouts {
    /// No rollouts; remembers the last 100 000 response ids for feedback.
    pub fn new() -> Self {
        Self::with_response_capacity(DEFAULT_CAPACITY)
    }

    /// No rollouts; remembers the last `capacity` response ids for feedback.
    pub fn with_response_capacity(capacity: usize) -> Self {
        Self {
            controllers: ArcSwap::from_pointee(HashMap::new()),
            responses: Mutex::new(ResponseMemory::new(capacity)),
            sync_lock: Mutex::new(()),
            shared: None,
        }
    }

    /// No rollouts yet; their state will be shared through `store` with every gateway instance
    /// that uses the same Redis and prefix.
    pub fn shared(store: RedisRolloutStore) -> Self {
        Self {
            shared: Some(Arc::new(store)),
            ..Self::new()
        }
    }

    /// Whether the state is shared through Redis.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Shared mode: reads (or first stores) every rollout's shared phase now, so an instance
    /// that starts or reloads routes by the shared state before its first request. A no-op
    /// without Redis.
    pub async fn refresh_shared(&self) -> Result<(), RolloutError> {
        let Some(store) = &self.shared else {
            return Ok(());
        };
        let controllers = self.controllers.load_full();
        for c in controllers.values() {
            shared::refresh(store, c, Instant::now())
                .await
                .map_err(|e| RolloutError::Shared(e.to_string()))?;
        }
        Ok(())
    }

    /// Shared mode: one sync of every rollout with Redis (see [`shared::sync_rollout`]);
    /// returns the decisions this instance made. Errors are per rollout and logged by the caller.
    pub async fn sync_shared(&self, now: Instant) -> Vec<Result<RolloutEvent, RolloutError>> {
        let Some(store) = &self.shared else {
            return Vec::new();
        };
        let controllers = self.controllers.load_full();
        let mut out = Vec::new();
        for c in controllers.values() {
            match shared::sync_rollout(store, c, now).await {
                Ok(Some(event)) => out.push(Ok(event)),
                Ok(None) => {}
                Err(e) => out.push(Err(RolloutError::Shared(e.to_string()))),
            }
        }
        out
    }

    /// An operator's action on `route`'s rollout. Shared mode: tried on a copy of the freshly
    /// read shared state and written by compare-and-set (retried a few times when another
    /// instance changes the rollout meanwhile), then applied here; every instance follows
    /// within [`shared::SYNC_PERIOD`].
    pub async fn act(&self, route: &str, action: Action) -> Result<RolloutStatus, RolloutError> {
        let c = self.get_or_err(route)?;
        let Some(store) = &self.shared else {
            let status = action.apply(&c, Instant::now())?;
            log_action(route, action, &status);
            return Ok(status);
        };
        let shared_err = |e: shared::SharedError| RolloutError::Shared(e.to_string());
        for _ in 0..5 {
            let now = Instant::now();
            shared::refresh(store, &c, now).await.map_err(shared_err)?;
            let fork = c.fork();
            action.apply(&fork, now)?;
            let expected = c.epoch();
            let phase = fork.phase(expected + 1);
            let entry = store.entry(action.name(), &phase, None);
            if store
                .compare_and_set(&c, expected, &phase, Some(&entry))
                .await
                .map_err(shared_err)?
            {
                c.adopt(&phase, now);
                let status = c.status(now);
                log_action(route, action, &status);
                return Ok(status);
            }
        }
        Err(RolloutError::Contended(route.to_string()))
    }

    /// Every rollout's status, with the shared history of changes in shared mode.
    pub async fn status_with_history(&self) -> Vec<RolloutStatus> {
        let mut all = self.status();
        let Some(store) = &self.shared else {
            return all;
        };
        for status in &mut all {
            if let Some(c) = self.get(&status.route) {
                match store.history(&c).await {
                    Ok(h) => status.history = Some(h),
                    Err(e) => {
                        tracing::warn!(route = %status.route, error = %e, "cannot read the rollout history")
                    }
                }
            }
        }
        all
    }

    /// Matches the rollouts to `config` (at start and on every reload): a route whose rollout
    /// has the same stable and canary keeps its state and statistics and takes the new steps and
    /// thresholds; a changed pair starts over at the first step; rollouts gone from the config
    /// are dropped.
    pub fn sync(&self, config: &GatewayConfig) {
        let _serial = relock(&self.sync_lock);
        let old = self.controllers.load_full();
        let now = Instant::now();
        let mut next = HashMap::new();
        for route in &config.routes {
            let Some(rollout) = &route.rollout else {
                continue;
            };
            let controller = match old.get(&route.model) {
                Some(c) if c.same_pair(rollout) => {
                    c.update_config(rollout);
                    Arc::clone(c)
                }
                _ => {
                    tracing::info!(route = %route.model, stable = %rollout.stable, canary = %rollout.canary,
                        "rollout started at {} %", rollout.steps.first().copied().unwrap_or(0.0));
                    Arc::new(Controller::new(&route.model, rollout, now))
                }
            };
            next.insert(route.model.clone(), controller);
        }
        self.controllers.store(Arc::new(next));
    }

    fn get(&self, route: &str) -> Option<Arc<Controller>> {
        self.controllers.load().get(route).cloned()
    }

    fn get_or_err(&self, route: &str) -> Result<Arc<Controller>, RolloutError> {
        self.get(route)
            .ok_or_else(|| RolloutError::UnknownRoute(route.to_string()))
    }

    /// The canary's traffic share (0..=100) on `route`, `None` without a rollout. Lock-free.
    pub fn canary_percent(&self, route: &str) -> Option<f64> {
        self.controllers.load().get(route).map(|c| c.percent())
    }

    /// The stable and canary target names of `route`'s rollout.
    pub fn pair(&self, route: &str) -> Option<(String, String)> {
        self.get(route)
            .map(|c| (c.stable().to_string(), c.canary().to_string()))
    }

    /// Counts a finished request of `version` on `route` in the current step; versions that
    /// are neither stable nor canary, and routes without a rollout, are ignored.
    pub fn record(&self, route: &str, version: &str, outcome: Outcome) {
        if let Some(c) = self.controllers.load().get(route) {
            c.record(version, &outcome);
        }
    }

    /// Remembers which route and version produced `response_id`, for a later feedback.
    pub fn remember_response(&self, response_id: &str, route: &str, version: &str) {
        relock(&self.responses).remember(response_id, route, version);
    }

    /// A thumbs up (`positive`) or down for a response; a second one for the same response
    /// replaces the first.
    pub fn feedback(&self, response_id: &str, positive: bool) -> Result<(), FeedbackError> {
        let mut responses = relock(&self.responses);
        let entry = responses
            .get_mut(response_id)
            .ok_or_else(|| FeedbackError::UnknownResponse(response_id.to_string()))?;
        let Some(controller) = self.get(&entry.route) else {
            return Ok(());
        };
        if let Some(generation) = controller.feedback(&entry.version, positive, entry.counted) {
            entry.counted = Some((positive, generation));
        }
        Ok(())
    }

    /// Runs the analysis of every rollout that is due at `now`; returns what changed.
    pub fn tick(&self, now: Instant) -> Vec<RolloutEvent> {
        let controllers = self.controllers.load_full();
        controllers.values().filter_map(|c| c.tick(now)).collect()
    }

    /// The period of the analysis loop: the smallest configured `interval_s`, clamped to
    /// 100 ms ..= 1 s (each rollout is still analysed only once per its own interval).
    pub fn analysis_period(&self) -> Duration {
        self.controllers
            .load()
            .values()
            .map(|c| c.interval())
            .min()
            .map_or(MAX_ANALYSIS_PERIOD, |d| {
                d.clamp(MIN_ANALYSIS_PERIOD, MAX_ANALYSIS_PERIOD)
            })
    }

    /// Runs [`Rollouts::tick`] forever at [`Rollouts::analysis_period`], logging each event
    /// (info for promotions, warn for rollbacks). Needs a Tokio runtime.
    pub fn spawn_analysis(self: Arc<Self>) -> JoinHandle<()> {
        if self.is_shared() {
            return self.spawn_shared_sync();
        }
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(self.analysis_period()).await;
                for event in self.tick(Instant::now()) {
                    log_event(&event);
                }
            }
        })
    }

    /// Shared mode's loop: [`Rollouts::sync_shared`] every [`shared::SYNC_PERIOD`], logging
    /// this instance's decisions and (at most every 10 s) Redis failures.
    fn spawn_shared_sync(self: Arc<Self>) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut last_warning: Option<Instant> = None;
            loop {
                tokio::time::sleep(shared::SYNC_PERIOD).await;
                for result in self.sync_shared(Instant::now()).await {
                    match result {
                        Ok(event) => log_event(&event),
                        Err(e) => {
                            if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                                tracing::warn!(error = %e, "rollout sync failed");
                                last_warning = Some(Instant::now());
                            }
                        }
                    }
                }
            }
        })
    }

    /// Every rollout, sorted by route.
    pub fn status(&self) -> Vec<RolloutStatus> {
        let now = Instant::now();
        let mut all: Vec<RolloutStatus> = self
            .controllers
            .load()
            .values()
            .map(|c| c.status(now))
            .collect();
        all.sort_by(|a, b| a.route.cmp(&b.route));
        all
    }

    /// One rollout's status.
    pub fn status_of(&self, route: &str) -> Result<RolloutStatus, RolloutError> {
        Ok(self.get_or_err(route)?.status(Instant::now()))
    }

    /// Moves `route`'s canary to the next step now (or completes it), whatever the statistics.
    pub fn promote(&self, route: &str) -> Result<RolloutStatus, RolloutError> {
        let (event, status) = self.get_or_err(route)?.promote(Instant::now())?;
        tracing::info!(route, "manual promotion: {}", describe(&event));
        Ok(status)
    }

    /// Holds `route`'s rollout at its current percent: no automatic promotion or rollback.
    pub fn pause(&self, route: &str) -> Result<RolloutStatus, RolloutError> {
        let status = self.get_or_err(route)?.pause(Instant::now())?;
        tracing::info!(route, "rollout paused at {} %", status.canary_percent);
        Ok(status)
    }

    /// Lets a paused rollout continue.
    pub fn resume(&self, route: &str) -> Result<RolloutStatus, RolloutError> {
        let status = self.get_or_err(route)?.resume(Instant::now())?;
        tracing::info!(route, "rollout resumed at {} %", status.canary_percent);
        Ok(status)
    }

    /// Sends all of `route`'s traffic back to stable (canary 0 %) and stops the rollout.
    pub fn abort(&self, route: &str) -> Result<RolloutStatus, RolloutError> {
        let status = self.get_or_err(route)?.abort(Instant::now())?;
        tracing::warn!(route, canary = %status.canary, "rollout aborted by an operator: canary at 0 %");
        Ok(status)
    }

    /// Starts `route`'s rollout over from its first step with fresh statistics (after a
    /// rollback or abort, once the canary is fixed).
    pub fn restart(&self, route: &str) -> Result<RolloutStatus, RolloutError> {
        let status = self.get_or_err(route)?.restart(Instant::now());
        tracing::info!(route, "rollout restarted at {} %", status.canary_percent);
        Ok(status)
    }
}

fn log_action(route: &str, action: Action, status: &RolloutStatus) {
    tracing::info!(
        route,
        action = action.name(),
        state = status.state.name(),
        percent = status.canary_percent,
        "rollout changed by an operator"
    );
}

/// Logs an analysis event: info for promotions and completion, warn for rollbacks.
pub fn log_event(event: &RolloutEvent) {
    match event {
        RolloutEvent::RolledBack {
            route,
            canary,
            reason,
        } => {
            tracing::warn!(%route, %canary, %reason, "canary rolled back to 0 %: {reason}");
        }
        RolloutEvent::Promoted { route, canary, .. }
        | RolloutEvent::Completed { route, canary } => {
            tracing::info!(%route, %canary, "{}", describe(event));
        }
    }
}

/// A one-line description of an event.
pub fn describe(event: &RolloutEvent) -> String {
    match event {
        RolloutEvent::Promoted {
            canary,
            step,
            from_percent,
            to_percent,
            ..
        } => format!(
            "canary '{canary}' promoted from {from_percent} % to {to_percent} % (step {step})"
        ),
        RolloutEvent::Completed { canary, .. } => {
            format!("canary '{canary}' completed its rollout: it serves 100 %")
        }
        RolloutEvent::RolledBack { canary, reason, .. } => {
            format!("canary '{canary}' rolled back to 0 %: {reason}")
        }
    }
}

#[cfg(test)]
mod tests;
