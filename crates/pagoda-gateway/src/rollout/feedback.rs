//! The bounded memory of recent responses, so `POST /v1/feedback` can find which route and
//! version produced a response id.
//!
//! Invariants: at most `capacity` ids are kept, the oldest remembered first out; every id in
//! the order queue is in the map and the other way round; each id carries at most one counted
//! feedback (a second one replaces it), tagged with the statistics generation it was counted in.

use std::collections::{HashMap, VecDeque};

/// Response ids kept by default.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// What is known about one response.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseEntry {
    pub route: String,
    pub version: String,
    /// The feedback already counted for this response: thumbs up?, and the statistics
    /// generation (rollout step) it was counted in.
    pub counted: Option<(bool, u64)>,
}

/// Recent response ids, oldest evicted first.
#[derive(Debug)]
pub struct ResponseMemory {
    capacity: usize,
    entries: HashMap<String, ResponseEntry>,
    order: VecDeque<String>,
}

impl ResponseMemory {
    /// Keeps at most `capacity` ids (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Remembers that `id` was answered by `version` of `route`; an id seen again is updated in
    /// place (and keeps its place in the eviction order).
    pub fn remember(&mut self, id: &str, route: &str, version: &str) {
        let entry = ResponseEntry {
            route: route.to_string(),
            version: version.to_string(),
            counted: None,
        };
        if let Some(old) = self.entries.get_mut(id) {
            *old = entry;
            return;
        }
        while self.order.len() >= self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(id.to_string(), entry);
        self.order.push_back(id.to_string());
    }

    /// The entry of `id`, if still remembered.
    pub fn get_mut(&mut self, id: &str) -> Option<&mut ResponseEntry> {
        self.entries.get_mut(id)
    }

    /// Number of remembered ids.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn oldest_is_evicted_first() {
        let mut m = ResponseMemory::new(2);
        m.remember("a", "r", "v1");
        m.remember("b", "r", "v1");
        m.remember("c", "r", "v2");
        assert!(m.get_mut("a").is_none());
        assert_eq!(m.get_mut("c").unwrap().version, "v2");
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn remembering_again_updates_in_place() {
        let mut m = ResponseMemory::new(2);
        m.remember("a", "r", "v1");
        m.remember("a", "r", "v2");
        assert_eq!(m.len(), 1);
        assert_eq!(m.get_mut("a").unwrap().version, "v2");
    }

    proptest! {
        #[test]
        fn never_more_than_capacity(ids in proptest::collection::vec(0u32..50, 0..200), cap in 1usize..20) {
            let mut m = ResponseMemory::new(cap);
            for id in &ids {
                m.remember(&id.to_string(), "r", "v");
                prop_assert!(m.len() <= cap);
                prop_assert_eq!(m.len(), m.order.len());
            }
            if let Some(last) = ids.last() {
                prop_assert!(m.get_mut(&last.to_string()).is_some());
            }
        }
    }
}
