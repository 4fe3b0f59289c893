//! An exact sliding-window log: the entries (time, cost) of the last 60 s and their sum.
//!
//! Invariant: the costs admitted under `limit` in any 60 s window (half-open, `[t, t + 60 s)`)
//! sum to at most `limit`, a burst of up to `limit` at once is allowed, and arrivals spaced at
//! exactly `limit` per minute are never refused. (A GCRA/token bucket with burst = limit cannot
//! give the first and second together: it lets up to 2 x limit through in one minute.) Entries
//! must be pushed in nondecreasing time; memory is one entry per admitted request in the window.

use std::collections::VecDeque;

/// Window length in microseconds.
pub(crate) const WINDOW_US: u64 = 60_000_000;

#[derive(Debug, Clone, Copy)]
struct Entry {
    at_us: u64,
    cost: u64,
    id: u64,
}

/// The log of one key and one limit (requests or tokens).
#[derive(Debug, Default, Clone)]
pub(crate) struct Window {
    entries: VecDeque<Entry>,
    total: u64,
}

impl Window {
    /// Drops entries that left the window at `now_us` (an entry at `a` counts while `a + 60 s > now`).
    pub(crate) fn trim(&mut self, now_us: u64) {
        while let Some(e) = self.entries.front() {
            if e.at_us.saturating_add(WINDOW_US) > now_us {
                break;
            }
            self.total = self.total.saturating_sub(e.cost);
            self.entries.pop_front();
        }
    }

    /// `Ok` if `cost` more fits under `limit` now (call [`Window::trim`] first); else the
    /// microseconds until it will (assuming nothing else is admitted). `cost <= limit` required.
    pub(crate) fn check(&self, now_us: u64, cost: u64, limit: u64) -> Result<(), u64> {
        if self.total.saturating_add(cost) <= limit {
            return Ok(());
        }
        let mut remaining = self.total;
        for e in &self.entries {
            remaining = remaining.saturating_sub(e.cost);
            if remaining.saturating_add(cost) <= limit {
                return Err(e
                    .at_us
                    .saturating_add(WINDOW_US)
                    .saturating_sub(now_us)
                    .max(1));
            }
        }
        Err(WINDOW_US)
    }

    /// Records `cost` at `now_us` under `id` (zero costs are not recorded).
    pub(crate) fn push(&mut self, now_us: u64, cost: u64, id: u64) {
        if cost == 0 {
            return;
        }
        let at_us = self.entries.back().map_or(now_us, |b| b.at_us.max(now_us));
        self.entries.push_back(Entry { at_us, cost, id });
        self.total = self.total.saturating_add(cost);
    }

    /// Lowers entry `id`'s cost by up to `by` (no-op once it left the window).
    pub(crate) fn reduce(&mut self, id: u64, by: u64) {
        if let Some(e) = self.entries.iter_mut().rev().find(|e| e.id == id) {
            let cut = by.min(e.cost);
            e.cost -= cut;
            self.total = self.total.saturating_sub(cut);
        }
    }

    /// The sum of the costs in the window (as of the last trim).
    #[cfg(test)]
    pub(crate) fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_up_to_limit_then_retry_when_the_oldest_leaves() {
        let mut w = Window::default();
        for i in 0..3 {
            w.trim(1000 + i);
            assert!(w.check(1000 + i, 1, 3).is_ok());
            w.push(1000 + i, 1, i);
        }
        assert_eq!(w.check(2000, 1, 3), Err(1000 + WINDOW_US - 2000));
        w.trim(1000 + WINDOW_US);
        assert_eq!(w.total(), 2);
        assert!(w.check(1000 + WINDOW_US, 1, 3).is_ok());
    }

    #[test]
    fn reduce_refunds_and_stops_at_zero() {
        let mut w = Window::default();
        w.push(0, 100, 7);
        w.reduce(7, 30);
        assert_eq!(w.total(), 70);
        w.reduce(7, 500);
        assert_eq!(w.total(), 0);
        w.reduce(99, 5);
        assert_eq!(w.total(), 0);
    }
}
