//! Who goes first: the admission policies ([`Policy`]), the batching modes ([`BatchingMode`]),
//! and the orderings the scheduler derives from them each step.
//!
//! Invariants: every ordering here is a total order with a deterministic tie-break (queue
//! position or arrival counter), so a step is a pure function of the scheduler's state and
//! `now`. Aging adds the same amount per second to every sequence, so it changes the rank of
//! two sequences only through their arrival times: an old request eventually outranks a newer
//! one of higher priority, and nothing starves.

use super::predict::{self, OutputEstimate};
use super::sequence::Sequence;
use super::{SchedulerError, SeqId};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::time::Instant;

/// The order waiting sequences are admitted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// First come, first served (preempted sequences go back to the front).
    #[default]
    Fcfs,
    /// Highest effective priority first: `priority + aging_per_sec * seconds waited`.
    Priority,
    /// Shortest job first, by predicted job length: tokens left to compute (the prompt, or
    /// all tokens after a preemption) plus expected output tokens left, minus
    /// `aging_per_sec * seconds waited`. The expected output is `max_tokens` when the client
    /// set it, else the scheduler's running estimate of output lengths (capped by
    /// `max_tokens`; see [`predict`](super::predict)).
    Sjf,
}

impl Policy {
    pub const NAMES: &'static str = "fcfs, priority, sjf";

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Fcfs => "fcfs",
            Policy::Priority => "priority",
            Policy::Sjf => "sjf",
        }
    }
}

impl FromStr for Policy {
    type Err = SchedulerError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fcfs" => Ok(Policy::Fcfs),
            "priority" => Ok(Policy::Priority),
            "sjf" => Ok(Policy::Sjf),
            _ => Err(SchedulerError::UnknownPolicy(s.to_string())),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether new sequences may join a running batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BatchingMode {
    /// Sequences join and leave the batch every step (continuous batching).
    #[default]
    Continuous,
    /// A batch is admitted only when nothing runs, and runs until all of it has finished.
    Static,
}

impl BatchingMode {
    pub const NAMES: &'static str = "continuous, static";

    pub fn as_str(self) -> &'static str {
        match self {
            BatchingMode::Continuous => "continuous",
            BatchingMode::Static => "static",
        }
    }
}

impl FromStr for BatchingMode {
    type Err = SchedulerError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "continuous" => Ok(BatchingMode::Continuous),
            "static" => Ok(BatchingMode::Static),
            _ => Err(SchedulerError::UnknownBatchingMode(s.to_string())),
        }
    }
}

impl fmt::Display for BatchingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Seconds `seq` has waited since it arrived.
fn waited_secs(seq: &Sequence, now: Instant) -> f64 {
    now.saturating_duration_since(seq.arrival).as_secs_f64()
}

/// `priority + aging_per_sec * seconds waited`: higher runs first and is preempted last.
pub(crate) fn effective_priority(seq: &Sequence, now: Instant, aging_per_sec: f64) -> f64 {
    seq.priority as f64 + aging_per_sec * waited_secs(seq, now)
}

/// Sorts running sequences best first: highest effective priority, then oldest arrival
/// (under every policy — the policy orders admission; rank among the running decides who is
/// served first and who is preempted: the scheduler preempts from the end, i.e. the lowest
/// effective priority, then the newest).
pub(super) fn sort_running(
    aging_per_sec: f64,
    now: Instant,
    seqs: &HashMap<SeqId, Sequence>,
    running: &mut [SeqId],
) {
    let key = |id: &SeqId| {
        seqs.get(id).map_or((f64::NEG_INFINITY, u64::MAX), |s| {
            (effective_priority(s, now, aging_per_sec), s.order)
        })
    };
    running.sort_by(|a, b| {
        let (pa, oa) = key(a);
        let (pb, ob) = key(b);
        pb.total_cmp(&pa).then(oa.cmp(&ob))
    });
}

/// The waiting queue in admission order under `policy`. Ties keep queue order, so preempted
/// sequences, which go back to the front, win them.
pub(super) fn waiting_order(
    policy: Policy,
    aging_per_sec: f64,
    now: Instant,
    seqs: &HashMap<SeqId, Sequence>,
    waiting: &VecDeque<SeqId>,
    estimate: &OutputEstimate,
) -> Vec<SeqId> {
    let mut ids: Vec<SeqId> = waiting.iter().copied().collect();
    let key = |id: &SeqId| -> f64 {
        let Some(s) = seqs.get(id) else {
            return f64::INFINITY;
        };
        match policy {
            Policy::Fcfs => 0.0,
            // Ascending sort: negate so the highest priority comes first.
            Policy::Priority => -effective_priority(s, now, aging_per_sec),
            Policy::Sjf => {
                predict::predicted_len(s, estimate) - aging_per_sec * waited_secs(s, now)
            }
        }
    };
    if policy != Policy::Fcfs {
        // sort_by is stable: equal keys keep queue order.
        ids.sort_by(|a, b| key(a).total_cmp(&key(b)));
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in [Policy::Fcfs, Policy::Priority, Policy::Sjf] {
            assert_eq!(p.to_string().parse::<Policy>().unwrap(), p);
        }
        for m in [BatchingMode::Continuous, BatchingMode::Static] {
            assert_eq!(m.to_string().parse::<BatchingMode>().unwrap(), m);
        }
        assert_eq!(" SJF ".parse::<Policy>().unwrap(), Policy::Sjf);
        let e = "lifo".parse::<Policy>().unwrap_err().to_string();
        assert!(e.contains("lifo") && e.contains("fcfs"), "{e}");
        assert!("batchy".parse::<BatchingMode>().is_err());
        assert_eq!(Policy::default(), Policy::Fcfs);
        assert_eq!(BatchingMode::default(), BatchingMode::Continuous);
    }
}
