//! One route's rollout: its state machine, current step and statistics.
//!
//! States: `Progressing` (automatic promotion and rollback) -> `Completed` (canary at 100 %),
//! or -> `RolledBack` / `Aborted` (canary at 0 %); `Paused` freezes the percent and all automatic
//! changes until resumed. Invariants: the atomic `percent` is written only while the state lock
//! is held, and always equals what the state says (`steps[step]` while progressing or paused,
//! 100 when completed, 0 when rolled back or aborted), so a reader of [`Controller::percent`]
//! sees a rollback as soon as the lock is released. Each step has its own statistics,
//! identified by a process-wide unique `generation`, reset when the step changes.
//!
//! Shared mode (several gateway instances, state in Redis; see `shared`): the controller's
//! [`SharedPhase`] is what instances agree on. A change is decided on a [`Controller::fork`]
//! (local statistics merged with the other instances'), written to Redis by compare-and-set on
//! the phase's `epoch`, and only then taken with [`Controller::adopt`], so a change that loses
//! the race never reaches the request path. `window` numbers the statistics windows (steps):
//! it grows whenever a step starts, and the instances publish their statistics per window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::config::RolloutConfig;

use super::analysis::{min_compare_samples, regressions};
use super::stats::VersionStats;
use super::{Outcome, RolloutError, RolloutEvent, RolloutState, RolloutStatus};

/// Source of statistics generations, unique across all controllers of the process.
static GENERATION: AtomicU64 = AtomicU64::new(1);

fn next_generation() -> u64 {
    GENERATION.fetch_add(1, Ordering::Relaxed)
}

/// A rollout is analysed again once this share of its interval has passed (timer jitter).
const INTERVAL_TOLERANCE: f64 = 0.9;

/// The part of a rollout the instances agree on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedPhase {
    /// Bumped by every change; compare-and-set compares it.
    pub epoch: u64,
    /// Statistics window (step) number; a new one starts with each step.
    pub window: u64,
    /// A [`RolloutState`] name.
    pub state: String,
    /// Why it was rolled back.
    pub reason: Option<String>,
    pub step: usize,
    pub step_started_unix_ms: u64,
}

/// One route's rollout.
#[derive(Debug)]
pub struct Controller {
    route: String,
    stable: String,
    canary: String,
    /// Canary share 0..=100 as `f64` bits.
    percent: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: RolloutConfig,
    state: RolloutState,
    step: usize,
    step_started: Instant,
    step_started_wall: SystemTime,
    generation: u64,
    stable_stats: VersionStats,
    canary_stats: VersionStats,
    /// Stable's statistics of an earlier step, compared against when stable gets too little
    /// traffic now (at 100 % it gets none).
    baseline: Option<VersionStats>,
    last_analysis: Option<Instant>,
    /// Version of the shared phase this state matches (0: never shared).
    epoch: u64,
    /// Number of the current statistics window (step); grows when a step starts.
    window: u64,
    /// The other instances' statistics in this window (stable, canary), shared mode only.
    peers: Option<(VersionStats, VersionStats)>,
}

impl Controller {
    /// Starts a rollout of `config` on `route` at its first step.
    pub fn new(route: &str, config: &RolloutConfig, now: Instant) -> Self {
        let first = config.steps.first().copied().unwrap_or(0.0);
        Self {
            route: route.to_string(),
            stable: config.stable.clone(),
            canary: config.canary.clone(),
            percent: AtomicU64::new(first.to_bits()),
            inner: Mutex::new(Inner {
                config: config.clone(),
                state: RolloutState::Progressing,
                step: 0,
                step_started: now,
                step_started_wall: SystemTime::now(),
                generation: next_generation(),
                stable_stats: VersionStats::default(),
                canary_stats: VersionStats::default(),
                baseline: None,
                last_analysis: None,
                epoch: 0,
                window: 1,
                peers: None,
            }),
        }
    }

    /// A copy to try a change on: the same state, with the other instances' statistics merged
    /// into its own (so its analysis sees the whole step).
    pub fn fork(&self) -> Controller {
        let inner = self.lock();
        let mut copy = Inner {
            config: inner.config.clone(),
            state: inner.state.clone(),
            step: inner.step,
            step_started: inner.step_started,
            step_started_wall: inner.step_started_wall,
            generation: inner.generation,
            stable_stats: inner.stable_stats.clone(),
            canary_stats: inner.canary_stats.clone(),
            baseline: inner.baseline.clone(),
            last_analysis: inner.last_analysis,
            epoch: inner.epoch,
            window: inner.window,
            peers: None,
        };
        if let Some((stable, canary)) = &inner.peers {
            copy.stable_stats.merge(stable);
            copy.canary_stats.merge(canary);
        }
        Controller {
            route: self.route.clone(),
            stable: self.stable.clone(),
            canary: self.canary.clone(),
            percent: AtomicU64::new(self.percent.load(Ordering::Acquire)),
            inner: Mutex::new(copy),
        }
    }

    /// The phase to share: this state at `epoch` (the stored epoch plus one for a change).
    pub fn phase(&self, epoch: u64) -> SharedPhase {
        let inner = self.lock();
        let reason = match &inner.state {
            RolloutState::RolledBack { reason } => Some(reason.clone()),
            _ => None,
        };
        SharedPhase {
            epoch,
            window: inner.window,
            state: inner.state.name().to_string(),
            reason,
            step: inner.step,
            step_started_unix_ms: unix_ms(inner.step_started_wall),
        }
    }

    /// The shared epoch this state matches (0 before the first sync).
    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// Takes a phase read from (or just written to) the shared store, unless this state is
    /// already at its epoch or newer. A new window starts a new step here too, with this
    /// instance's and the other instances' stable statistics as the baseline; the step's start
    /// is the phase's wall-clock time. Returns whether anything changed.
    pub fn adopt(&self, phase: &SharedPhase, now: Instant) -> bool {
        let mut inner = self.lock();
        if phase.epoch <= inner.epoch {
            return false;
        }
        let state = match phase.state.as_str() {
            "progressing" => RolloutState::Progressing,
            "paused" => RolloutState::Paused,
            "completed" => RolloutState::Completed,
            "rolled_back" => RolloutState::RolledBack {
                reason: phase.reason.clone().unwrap_or_default(),
            },
            "aborted" => RolloutState::Aborted,
            other => {
                // Written by another gateway version: keep routing by what this one knows.
                tracing::warn!(route = %self.route, state = other,
                    "ignoring a shared rollout phase in an unknown state; upgrade this gateway");
                return false;
            }
        };
        inner.epoch = phase.epoch;
        inner.state = state;
        let last = inner.config.steps.len().saturating_sub(1);
        inner.step = phase.step.min(last);
        if phase.window != inner.window {
            if let Some((stable, _)) = inner.peers.take() {
                inner.stable_stats.merge(&stable);
            }
            inner.start_step(now);
            inner.window = phase.window;
            inner.last_analysis = None;
        }
        let wall = UNIX_EPOCH + Duration::from_millis(phase.step_started_unix_ms);
        let age = SystemTime::now().duration_since(wall).unwrap_or_default();
        inner.step_started_wall = wall;
        inner.step_started = now.checked_sub(age).unwrap_or(now);
        let percent = match inner.state {
            RolloutState::Completed => 100.0,
            RolloutState::RolledBack { .. } | RolloutState::Aborted => 0.0,
            _ => inner.current_step_percent(),
        };
        self.set_percent(percent);
        true
    }

    /// This instance's own statistics of the current window: (window, stable, canary).
    pub fn local_stats(&self) -> (u64, VersionStats, VersionStats) {
        let inner = self.lock();
        (
            inner.window,
            inner.stable_stats.clone(),
            inner.canary_stats.clone(),
        )
    }

    /// Sets the other instances' statistics of `window` (ignored when this state has moved on
    /// to another window meanwhile).
    pub fn set_peer_stats(&self, window: u64, stable: VersionStats, canary: VersionStats) {
        let mut inner = self.lock();
        if inner.window == window {
            inner.peers = Some((stable, canary));
        }
    }

    /// When the fork it was decided on last analysed (shared mode: the fork's analysis time is
    /// kept, so the rollout is still analysed once per interval).
    pub fn last_analysis(&self) -> Option<Instant> {
        self.lock().last_analysis
    }

    /// See [`Controller::last_analysis`].
    pub fn set_last_analysis(&self, at: Option<Instant>) {
        self.lock().last_analysis = at;
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn set_percent(&self, p: f64) {
        self.percent.store(p.to_bits(), Ordering::Release);
    }

    /// The route (model name) this rollout is on.
    pub fn route(&self) -> &str {
        &self.route
    }

    /// The stable version's target name.
    pub fn stable(&self) -> &str {
        &self.stable
    }

    /// The canary version's target name.
    pub fn canary(&self) -> &str {
        &self.canary
    }

    /// Current canary share, 0..=100 (lock-free).
    pub fn percent(&self) -> f64 {
        f64::from_bits(self.percent.load(Ordering::Acquire))
    }

    /// True when `config` rolls out the same canary against the same stable version.
    pub fn same_pair(&self, config: &RolloutConfig) -> bool {
        self.stable == config.stable && self.canary == config.canary
    }

    /// Takes new steps, hold, thresholds, ... of an unchanged pair; keeps state and statistics.
    /// With fewer steps than before, a running rollout moves to the new last step.
    pub fn update_config(&self, config: &RolloutConfig) {
        let mut inner = self.lock();
        inner.config = config.clone();
        if matches!(
            inner.state,
            RolloutState::Progressing | RolloutState::Paused
        ) {
            let last = inner.config.steps.len().saturating_sub(1);
            inner.step = inner.step.min(last);
            self.set_percent(inner.current_step_percent());
        }
    }

    /// How often this rollout wants to be analysed.
    pub fn interval(&self) -> Duration {
        Duration::try_from_secs_f64(self.lock().config.interval_s.max(0.0)).unwrap_or(Duration::MAX)
    }

    /// Adds a finished request of `version`; other versions are ignored.
    pub fn record(&self, version: &str, outcome: &Outcome) {
        let mut inner = self.lock();
        if let Some(stats) = self.stats_of(&mut inner, version) {
            stats.record(outcome.ok, outcome.latency, outcome.ttft);
        }
    }

    fn stats_of<'a>(&self, inner: &'a mut Inner, version: &str) -> Option<&'a mut VersionStats> {
        if version == self.canary {
            Some(&mut inner.canary_stats)
        } else if version == self.stable {
            Some(&mut inner.stable_stats)
        } else {
            None
        }
    }

    /// Counts a thumbs up/down for a response of `version`. `previous` is the feedback already
    /// counted for the same response (thumbs up?, generation): it is taken back when it was
    /// counted in the current step. Returns the generation the feedback was counted in, `None`
    /// for a version that is neither stable nor canary.
    pub fn feedback(
        &self,
        version: &str,
        positive: bool,
        previous: Option<(bool, u64)>,
    ) -> Option<u64> {
        let mut inner = self.lock();
        let generation = inner.generation;
        let stats = self.stats_of(&mut inner, version)?;
        if let Some((was_positive, g)) = previous {
            if g == generation {
                stats.remove_feedback(was_positive);
            }
        }
        stats.add_feedback(positive);
        Some(generation)
    }

    /// The automatic decision: roll back a worse canary, promote a held and healthy step.
    /// Does nothing unless progressing and the rollout's interval has passed since the last
    /// analysis.
    pub fn tick(&self, now: Instant) -> Option<RolloutEvent> {
        let mut inner = self.lock();
        if inner.state != RolloutState::Progressing || !inner.analysis_due(now) {
            return None;
        }
        inner.last_analysis = Some(now);
        let reasons = inner.regressions();
        if !reasons.is_empty() {
            return Some(self.roll_back(&mut inner, reasons.join("; ")));
        }
        if inner.step_done(now) {
            return Some(self.advance(&mut inner, now));
        }
        None
    }

    fn roll_back(&self, inner: &mut Inner, reason: String) -> RolloutEvent {
        self.set_percent(0.0);
        inner.state = RolloutState::RolledBack {
            reason: reason.clone(),
        };
        RolloutEvent::RolledBack {
            route: self.route.clone(),
            canary: self.canary.clone(),
            reason,
        }
    }

    /// Moves to the next step (statistics reset), or completes after the last one.
    fn advance(&self, inner: &mut Inner, now: Instant) -> RolloutEvent {
        let from = inner.current_step_percent();
        if inner.step + 1 >= inner.config.steps.len() {
            inner.state = RolloutState::Completed;
            self.set_percent(100.0);
            return RolloutEvent::Completed {
                route: self.route.clone(),
                canary: self.canary.clone(),
            };
        }
        inner.step += 1;
        inner.start_step(now);
        let to = inner.current_step_percent();
        self.set_percent(to);
        RolloutEvent::Promoted {
            route: self.route.clone(),
            canary: self.canary.clone(),
            step: inner.step,
            from_percent: from,
            to_percent: to,
        }
    }

    /// Manual promotion: the next step now, whatever the statistics say. A paused rollout
    /// stays paused at the new step.
    pub fn promote(&self, now: Instant) -> Result<(RolloutEvent, RolloutStatus), RolloutError> {
        let mut inner = self.lock();
        self.require_running(&inner)?;
        let event = self.advance(&mut inner, now);
        Ok((event, self.status_of(&inner, now)))
    }

    /// Freezes the rollout at its current percent; idempotent.
    pub fn pause(&self, now: Instant) -> Result<RolloutStatus, RolloutError> {
        let mut inner = self.lock();
        self.require_running(&inner)?;
        inner.state = RolloutState::Paused;
        Ok(self.status_of(&inner, now))
    }

    /// Lets a paused rollout go on (its step's hold time and statistics are kept); idempotent.
    pub fn resume(&self, now: Instant) -> Result<RolloutStatus, RolloutError> {
        let mut inner = self.lock();
        self.require_running(&inner)?;
        inner.state = RolloutState::Progressing;
        Ok(self.status_of(&inner, now))
    }

    /// Sends all traffic back to stable (canary 0 %) and stops the rollout.
    pub fn abort(&self, now: Instant) -> Result<RolloutStatus, RolloutError> {
        let mut inner = self.lock();
        if matches!(
            inner.state,
            RolloutState::Aborted | RolloutState::RolledBack { .. }
        ) {
            return Err(self.not_running(&inner));
        }
        self.set_percent(0.0);
        inner.state = RolloutState::Aborted;
        Ok(self.status_of(&inner, now))
    }

    /// Starts the rollout again from its first step with fresh statistics, whatever its state.
    pub fn restart(&self, now: Instant) -> RolloutStatus {
        let mut inner = self.lock();
        inner.state = RolloutState::Progressing;
        inner.step = 0;
        inner.baseline = None;
        inner.start_step(now);
        inner.last_analysis = None;
        self.set_percent(inner.current_step_percent());
        self.status_of(&inner, now)
    }

    fn require_running(&self, inner: &Inner) -> Result<(), RolloutError> {
        match inner.state {
            RolloutState::Progressing | RolloutState::Paused => Ok(()),
            _ => Err(self.not_running(inner)),
        }
    }

    fn not_running(&self, inner: &Inner) -> RolloutError {
        let hint = match inner.state {
            RolloutState::Completed => {
                "the canary already serves 100 %; make it the route's target in the config, or abort to send all traffic back to stable"
            }
            _ => {
                "traffic is on stable; restart the rollout to try the canary again from the first step, or change the canary in the config"
            }
        };
        RolloutError::NotProgressing {
            route: self.route.clone(),
            state: inner.state.name().to_string(),
            hint: hint.to_string(),
        }
    }

    /// The admin API's view.
    pub fn status(&self, now: Instant) -> RolloutStatus {
        let inner = self.lock();
        self.status_of(&inner, now)
    }

    fn status_of(&self, inner: &Inner, now: Instant) -> RolloutStatus {
        let reason = match &inner.state {
            RolloutState::RolledBack { reason } => Some(reason.clone()),
            RolloutState::Aborted => Some("aborted by an operator".to_string()),
            _ => None,
        };
        RolloutStatus {
            route: self.route.clone(),
            stable: self.stable.clone(),
            canary: self.canary.clone(),
            state: inner.state.clone(),
            reason,
            step: inner.step,
            steps: inner.config.steps.clone(),
            canary_percent: self.percent(),
            hold_s: inner.config.hold_s,
            min_requests: inner.config.min_requests,
            step_started_unix_ms: unix_ms(inner.step_started_wall),
            step_age_s: now
                .saturating_duration_since(inner.step_started)
                .as_secs_f64(),
            stable_stats: inner.with_peers(&inner.stable_stats, |p| &p.0).summary(),
            canary_stats: inner.with_peers(&inner.canary_stats, |p| &p.1).summary(),
            history: None,
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Inner {
    fn current_step_percent(&self) -> f64 {
        self.config.steps.get(self.step).copied().unwrap_or(100.0)
    }

    fn analysis_due(&self, now: Instant) -> bool {
        let Some(last) = self.last_analysis else {
            return true;
        };
        let elapsed = now.saturating_duration_since(last).as_secs_f64();
        elapsed >= self.config.interval_s * INTERVAL_TOLERANCE
    }

    /// Resets the statistics for a new step, keeping stable's as the baseline when they are
    /// big enough to compare against.
    fn start_step(&mut self, now: Instant) {
        let min = min_compare_samples(self.config.min_requests);
        let stable = std::mem::take(&mut self.stable_stats);
        if stable.requests >= min {
            self.baseline = Some(stable);
        }
        self.canary_stats = VersionStats::default();
        self.step_started = now;
        self.step_started_wall = SystemTime::now();
        self.generation = next_generation();
        self.window += 1;
        self.peers = None;
    }

    /// `own` with the other instances' share of the window added (shared mode).
    fn with_peers(
        &self,
        own: &VersionStats,
        pick: impl Fn(&(VersionStats, VersionStats)) -> &VersionStats,
    ) -> VersionStats {
        let mut all = own.clone();
        if let Some(peers) = &self.peers {
            all.merge(pick(peers));
        }
        all
    }

    fn regressions(&self) -> Vec<String> {
        let min = min_compare_samples(self.config.min_requests);
        let stable = match &self.baseline {
            Some(baseline) if self.stable_stats.requests < min => baseline,
            _ => &self.stable_stats,
        };
        regressions(&self.canary_stats, stable, &self.config.thresholds, min)
    }

    fn step_done(&self, now: Instant) -> bool {
        let held = now
            .saturating_duration_since(self.step_started)
            .as_secs_f64();
        held >= self.config.hold_s && self.canary_stats.requests >= self.config.min_requests
    }
}
