//! The usage writer's CPU priority: background while it keeps up, normal while it catches up.
//!
//! A usage batch (one SQLite or Postgres transaction) can hold a core for milliseconds. On a
//! core shared with the request workers that time lands directly on the requests waiting
//! behind it (measured: a 3-4 ms writer run delayed a gateway worker by 2.9 ms; the p99 added
//! latency went from ~1.6 ms to under 1 ms with the writer lowered). So the writer runs at
//! Linux's `SCHED_IDLE` policy: any request worker that wakes preempts it at once.
//!
//! Invariants:
//! - Idle priority never costs records: when the backlog (records accepted but not yet
//!   written) passes [`CATCH_UP_BACKLOG`] the writer returns to normal priority and stays there
//!   until the backlog is under [`RELAX_BACKLOG`] (hysteresis, so it does not flap), well
//!   before the channel (`CHANNEL_CAPACITY`) fills and `record` would drop.
//! - While anyone waits for the writer (`UsageLedger::flush`, through [`WriterPriority::urgent`])
//!   it runs at normal priority, so a usage query is never stuck behind a starved writer.
//! - Only the writer thread changes (Linux applies the policy per thread); elsewhere this is a
//!   no-op.

use std::sync::{Mutex, MutexGuard};

use super::{BATCH_MAX, CHANNEL_CAPACITY};

/// Backlog above which the writer runs at normal priority.
pub const CATCH_UP_BACKLOG: u64 = (CHANNEL_CAPACITY / 16) as u64;
/// Backlog under which a catching-up writer goes back to idle priority.
pub const RELAX_BACKLOG: u64 = BATCH_MAX as u64;

/// Scheduling class of the writer thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Runs only when no normal thread wants the core (`SCHED_IDLE`).
    Background,
    /// The default time-sharing class (`SCHED_OTHER`).
    Normal,
}

/// The priority the writer should have with `backlog` records waiting, given its current one.
pub fn next_priority(current: Priority, backlog: u64) -> Priority {
    match current {
        Priority::Background if backlog > CATCH_UP_BACKLOG => Priority::Normal,
        Priority::Normal if backlog < RELAX_BACKLOG => Priority::Background,
        same => same,
    }
}

/// The writer thread's priority, changed by the writer itself (by its backlog) and raised by
/// [`WriterPriority::urgent`] while someone waits for it (`UsageLedger::flush`), so a query for
/// usage is never stuck behind a writer starved by a busy machine.
#[derive(Debug)]
pub struct WriterPriority {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Kernel thread id of the writer; 0 until it registers.
    tid: i32,
    current: Priority,
    /// Callers waiting for the writer (each holds an [`Urgent`]).
    waiting: usize,
}

impl Default for WriterPriority {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                tid: 0,
                current: Priority::Normal,
                waiting: 0,
            }),
        }
    }
}

/// Keeps the writer at normal priority until dropped.
#[must_use]
pub struct Urgent<'a>(&'a WriterPriority);

impl Drop for Urgent<'_> {
    fn drop(&mut self) {
        // The writer lowers itself after its next batch if nothing else keeps it up.
        self.0.lock().waiting -= 1;
    }
}

impl WriterPriority {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is two integers and an enum, always consistent between statements.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called once by the writer thread before its first batch; lowers it to background.
    pub fn register_writer(&self) {
        self.lock().tid = current_tid();
        self.after_batch(0);
    }

    /// Called by the writer after each batch with the records still waiting.
    pub fn after_batch(&self, backlog: u64) {
        let mut s = self.lock();
        let wanted = if s.waiting > 0 {
            Priority::Normal
        } else {
            next_priority(s.current, backlog)
        };
        s.apply(wanted);
    }

    /// Raises the writer to normal priority until the returned guard is dropped.
    pub fn urgent(&self) -> Urgent<'_> {
        let mut s = self.lock();
        s.waiting += 1;
        s.apply(Priority::Normal);
        drop(s);
        Urgent(self)
    }
}

impl State {
    fn apply(&mut self, wanted: Priority) {
        if wanted == self.current || self.tid == 0 {
            return;
        }
        if !set_thread_priority(self.tid, wanted) {
            tracing::debug!(?wanted, "usage writer priority not changed (refused)");
        }
        // Refused (or not Linux): remember the wish anyway, so it is not retried per batch.
        self.current = wanted;
    }
}

/// The calling thread's kernel id (0 where there is none to give).
fn current_tid() -> i32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions and cannot fail.
        unsafe { libc::gettid() }
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

/// Moves thread `tid` (0: the calling thread) to `priority`; `false` when the system refused
/// or has no such class (the thread keeps its previous one).
fn set_thread_priority(tid: i32, priority: Priority) -> bool {
    #[cfg(target_os = "linux")]
    {
        let policy = match priority {
            Priority::Background => libc::SCHED_IDLE,
            Priority::Normal => libc::SCHED_OTHER,
        };
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid, initialised struct that outlives the call; a stale tid
        // only makes the call fail (ESRCH).
        unsafe { libc::sched_setscheduler(tid, policy, &param) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (tid, priority);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catches_up_above_the_high_mark_and_relaxes_below_the_low_mark() {
        let mut p = Priority::Background;
        for (backlog, expected) in [
            (0, Priority::Background),
            (CATCH_UP_BACKLOG, Priority::Background),
            (CATCH_UP_BACKLOG + 1, Priority::Normal),
            // Between the marks it keeps what it has (no flapping).
            (RELAX_BACKLOG + 1, Priority::Normal),
            (RELAX_BACKLOG, Priority::Normal),
            (RELAX_BACKLOG - 1, Priority::Background),
            (RELAX_BACKLOG + 1, Priority::Background),
        ] {
            p = next_priority(p, backlog);
            assert_eq!(p, expected, "backlog {backlog}");
        }
        const { assert!(RELAX_BACKLOG < CATCH_UP_BACKLOG) };
        const { assert!(CATCH_UP_BACKLOG < CHANNEL_CAPACITY as u64) };
    }

    /// The scheduling policy of the calling thread, from /proc (5 = SCHED_IDLE, 0 = OTHER).
    #[cfg(target_os = "linux")]
    fn policy_of_this_thread() -> Option<u32> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        let rest = stat.rsplit_once(')')?.1;
        // Field 41 (policy) is the 39th after the command name.
        rest.split_whitespace().nth(38)?.parse().ok()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_writer_idles_is_raised_while_someone_waits_and_catches_up_on_a_backlog() {
        let control = std::sync::Arc::new(WriterPriority::default());
        let (step_tx, step_rx) = std::sync::mpsc::channel::<Option<u64>>();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let c = control.clone();
        // A stand-in writer: registers, then reports its policy after each "batch".
        let writer = std::thread::spawn(move || {
            c.register_writer();
            seen_tx.send(policy_of_this_thread()).unwrap();
            while let Ok(Some(backlog)) = step_rx.recv() {
                c.after_batch(backlog);
                seen_tx.send(policy_of_this_thread()).unwrap();
            }
        });
        let idle = Some(libc::SCHED_IDLE as u32);
        let normal = Some(libc::SCHED_OTHER as u32);
        assert_eq!(seen_rx.recv().unwrap(), idle, "registered: background");
        {
            let _urgent = control.urgent();
            step_tx.send(Some(0)).unwrap();
            assert_eq!(
                seen_rx.recv().unwrap(),
                normal,
                "raised while a flush waits"
            );
        }
        step_tx.send(Some(0)).unwrap();
        assert_eq!(seen_rx.recv().unwrap(), idle, "lowered once nobody waits");
        step_tx.send(Some(CATCH_UP_BACKLOG + 1)).unwrap();
        assert_eq!(seen_rx.recv().unwrap(), normal, "catching up on a backlog");
        step_tx.send(Some(0)).unwrap();
        assert_eq!(seen_rx.recv().unwrap(), idle);
        step_tx.send(None).unwrap();
        writer.join().unwrap();
    }
}
