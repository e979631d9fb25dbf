//! What the frequency policies (LFU, LRFU) share: a per-slot reference
//! history kept across the times a slot is referenced (not a candidate), and
//! the candidates ordered by a score of that history.
//!
//! # Whose history a slot carries
//! The store reports a get as `remove` (the object is referenced again, so no
//! longer a candidate) followed at once by `touch`; it reports a freed slot
//! (delete, eviction, abort) as `remove` with no `touch` after it. So:
//! - `touch` after `remove` continues the object's history (a get);
//! - `insert` after a `remove` that no `touch` followed starts a fresh
//!   history: the slot now holds a different object.
//!
//! The one case this cannot tell apart: a new object sealed while its creator
//! still holds it, read by another client before the creator releases it,
//! inherits the previous object's history in that slot. That only misorders
//! eviction (never evicts a referenced object), and the usual put path (seal
//! and release in one request) does not hit it.
//!
//! Time is a logical clock that ticks once per reference (a fresh insert, a
//! touch), as in Lee et al. and Alluxio's LRFU, so scores do not depend on
//! wall time and a victim query needs no clock.

use super::slot_heap::SlotHeap;
use crate::object_table::Slot;

/// How a policy scores a slot's references.
pub(super) trait Scoring {
    /// What the policy remembers of one object's references (a few bytes).
    type History: Copy;
    /// Candidates are evicted smallest key first. Keys must keep their
    /// relative order as the clock advances without references (LRFU's
    /// decaying CRF is normalised to make this hold).
    type Key: Ord + Copy;

    /// The history of an object whose first known reference is at `now`.
    fn first(&self, now: u64) -> Self::History;
    /// The history after one more reference at `now` (`now` > any earlier one).
    fn again(&self, history: Self::History, now: u64) -> Self::History;
    fn key(&self, history: Self::History) -> Self::Key;
}

#[derive(Clone, Copy)]
enum SlotHistory<H> {
    /// Never seen, or its history was dropped.
    Unknown,
    /// The current object's history.
    Live(H),
    /// `remove`d with no `touch` since: a get continues it, an insert drops it.
    Detached(H),
}

pub(super) struct FrequencyTracker<S: Scoring> {
    scoring: S,
    histories: Vec<SlotHistory<S::History>>,
    candidates: SlotHeap<S::Key>,
    clock: u64,
}

impl<S: Scoring> FrequencyTracker<S> {
    pub(super) fn new(scoring: S) -> Self {
        Self {
            scoring,
            histories: Vec::new(),
            candidates: SlotHeap::default(),
            clock: 0,
        }
    }

    pub(super) fn scoring(&self) -> &S {
        &self.scoring
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn history_mut(&mut self, slot: Slot) -> &mut SlotHistory<S::History> {
        let i = slot as usize;
        if i >= self.histories.len() {
            self.histories.resize(i + 1, SlotHistory::Unknown);
        }
        &mut self.histories[i]
    }

    pub(super) fn insert(&mut self, slot: Slot) {
        let history = match *self.history_mut(slot) {
            SlotHistory::Live(h) => h,
            // A new object in this slot: its write is its first reference.
            SlotHistory::Unknown | SlotHistory::Detached(_) => {
                let now = self.tick();
                self.scoring.first(now)
            }
        };
        *self.history_mut(slot) = SlotHistory::Live(history);
        let key = self.scoring.key(history);
        self.candidates.upsert(slot, key);
    }

    pub(super) fn remove(&mut self, slot: Slot) {
        self.candidates.remove(slot);
        if let Some(entry) = self.histories.get_mut(slot as usize) {
            if let SlotHistory::Live(h) = *entry {
                *entry = SlotHistory::Detached(h);
            }
        }
    }

    /// Counts a reference whether or not `slot` is a candidate: gets arrive
    /// while the object is referenced, and they are what frequency is made of.
    pub(super) fn touch(&mut self, slot: Slot) {
        let now = self.tick();
        let history = match *self.history_mut(slot) {
            SlotHistory::Live(h) | SlotHistory::Detached(h) => self.scoring.again(h, now),
            SlotHistory::Unknown => self.scoring.first(now),
        };
        *self.history_mut(slot) = SlotHistory::Live(history);
        if self.candidates.contains(slot) {
            let key = self.scoring.key(history);
            self.candidates.upsert(slot, key);
        }
    }

    pub(super) fn victim(&self) -> Option<Slot> {
        self.candidates.min()
    }

    pub(super) fn len(&self) -> usize {
        self.candidates.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts references; the key is the count alone.
    struct Count;

    impl Scoring for Count {
        type History = u64;
        type Key = u64;
        fn first(&self, _now: u64) -> u64 {
            1
        }
        fn again(&self, history: u64, _now: u64) -> u64 {
            history + 1
        }
        fn key(&self, history: u64) -> u64 {
            history
        }
    }

    fn count_of(tracker: &FrequencyTracker<Count>, slot: Slot) -> Option<u64> {
        match tracker.histories.get(slot as usize)? {
            SlotHistory::Live(h) | SlotHistory::Detached(h) => Some(*h),
            SlotHistory::Unknown => None,
        }
    }

    #[test]
    fn a_get_continues_the_history_and_a_freed_slot_starts_over() {
        let mut t = FrequencyTracker::new(Count);
        t.insert(3); // sealed: 1 reference
        t.remove(3); // a get: referenced again...
        t.touch(3); // ...and counted
        t.touch(3); // a second get while referenced
        t.insert(3); // released: a candidate with 3 references
        assert_eq!(count_of(&t, 3), Some(3));
        t.remove(3); // deleted: no touch follows
        t.insert(3); // a new object in the same slot
        assert_eq!(count_of(&t, 3), Some(1));
    }

    #[test]
    fn touches_of_a_never_inserted_slot_are_kept_for_its_insert() {
        let mut t = FrequencyTracker::new(Count);
        t.touch(7); // sealed with the creator's reference held, read by another client
        t.touch(7);
        assert_eq!(t.len(), 0);
        assert_eq!(t.victim(), None);
        t.insert(7);
        assert_eq!(count_of(&t, 7), Some(2));
    }
}
