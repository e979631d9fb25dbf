//! Least frequently used: the candidate with the fewest references (its
//! write plus every get) leaves first; among equals, the one referenced
//! longest ago (LRU order), so a burst of one-time objects goes before older
//! ones read as often.
//!
//! Plain LFU never forgets: an object read often long ago outlives newer ones
//! being read now. LRFU (`lrfu.rs`) is the variant that decays old references.
//! O(log n) per operation (an indexed heap, `slot_heap.rs`); 24 bytes of
//! history and 4 of heap index per slot (24 more per candidate in the heap),
//! no allocation per object.

use super::frequency::{FrequencyTracker, Scoring};
use super::policy::EvictionPolicy;
use crate::object_table::Slot;

#[derive(Clone, Copy)]
pub(super) struct LfuHistory {
    references: u64,
    last: u64,
}

pub(super) struct LfuScoring;

impl Scoring for LfuScoring {
    type History = LfuHistory;
    /// (references, logical time of the last one): fewest first, then oldest.
    type Key = (u64, u64);

    fn first(&self, now: u64) -> LfuHistory {
        LfuHistory {
            references: 1,
            last: now,
        }
    }

    fn again(&self, history: LfuHistory, now: u64) -> LfuHistory {
        LfuHistory {
            references: history.references.saturating_add(1),
            last: now,
        }
    }

    fn key(&self, history: LfuHistory) -> (u64, u64) {
        (history.references, history.last)
    }
}

pub struct Lfu {
    tracker: FrequencyTracker<LfuScoring>,
}

impl Default for Lfu {
    fn default() -> Self {
        Self {
            tracker: FrequencyTracker::new(LfuScoring),
        }
    }
}

impl EvictionPolicy for Lfu {
    fn insert(&mut self, slot: Slot) {
        self.tracker.insert(slot);
    }

    fn remove(&mut self, slot: Slot) {
        self.tracker.remove(slot);
    }

    fn touch(&mut self, slot: Slot) {
        self.tracker.touch(slot);
    }

    fn victim(&self) -> Option<Slot> {
        self.tracker.victim()
    }

    fn len(&self) -> usize {
        self.tracker.len()
    }

    fn name(&self) -> &'static str {
        "lfu"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A get as the store reports it: no longer a candidate, counted, released.
    fn get(policy: &mut Lfu, slot: Slot) {
        policy.remove(slot);
        policy.touch(slot);
        policy.insert(slot);
    }

    #[test]
    fn evicts_fewest_references_first_then_oldest() {
        let mut lfu = Lfu::default();
        for s in [1, 2, 3, 4] {
            lfu.insert(s);
        }
        for _ in 0..3 {
            get(&mut lfu, 1);
        }
        get(&mut lfu, 3);
        get(&mut lfu, 2);
        // 4: 1 reference; 3 and 2: 2 each, 3 read before 2; 1: 4 references.
        let mut order = Vec::new();
        while let Some(v) = lfu.victim() {
            order.push(v);
            lfu.remove(v);
        }
        assert_eq!(order, vec![4, 3, 2, 1]);
    }

    #[test]
    fn gets_while_referenced_count() {
        let mut lfu = Lfu::default();
        lfu.insert(1);
        lfu.insert(2);
        // Slot 1 is held by a reader that reads it five times before releasing.
        lfu.remove(1);
        for _ in 0..5 {
            lfu.touch(1);
        }
        assert_eq!(lfu.victim(), Some(2));
        lfu.insert(1);
        get(&mut lfu, 2);
        get(&mut lfu, 2);
        // 2 has 3 references, 1 has 6: 2 goes first although read last.
        assert_eq!(lfu.victim(), Some(2));
    }
}
