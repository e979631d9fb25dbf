//! An indexed binary min-heap of slots keyed by a score: the candidate order
//! of the frequency policies (LFU, LRFU).
//!
//! Written by hand rather than taken from a crate because the policies need
//! what `std::collections::BinaryHeap` lacks (removing or re-keying an
//! arbitrary slot in O(log n)) and slots are dense small integers, so the
//! position index is a plain array (4 bytes per slot) instead of the hash map
//! the indexed-heap crates keep: no allocation per object.

use crate::object_table::Slot;

const NOT_IN_HEAP: u32 = u32::MAX;

pub(super) struct SlotHeap<K> {
    /// Heap-ordered (key, slot) pairs; the slot breaks ties so the order is total.
    entries: Vec<(K, Slot)>,
    /// `position[slot]` is the slot's index in `entries`, or `NOT_IN_HEAP`.
    position: Vec<u32>,
}

impl<K> Default for SlotHeap<K> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            position: Vec::new(),
        }
    }
}

impl<K: Ord + Copy> SlotHeap<K> {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn contains(&self, slot: Slot) -> bool {
        self.index_of(slot).is_some()
    }

    /// The slot with the smallest key.
    pub(super) fn min(&self) -> Option<Slot> {
        self.entries.first().map(|&(_, slot)| slot)
    }

    /// The smallest key and its slot.
    pub(super) fn min_entry(&self) -> Option<(K, Slot)> {
        self.entries.first().copied()
    }

    /// Adds `slot` with `key`, or re-keys it if present.
    pub(super) fn upsert(&mut self, slot: Slot, key: K) {
        if let Some(i) = self.index_of(slot) {
            self.entries[i].0 = key;
            let i = self.sift_up(i);
            self.sift_down(i);
            return;
        }
        let s = slot as usize;
        if s >= self.position.len() {
            self.position.resize(s + 1, NOT_IN_HEAP);
        }
        self.entries.push((key, slot));
        let i = self.entries.len() - 1;
        self.position[s] = i as u32;
        self.sift_up(i);
    }

    /// Removes `slot`; returns whether it was present.
    pub(super) fn remove(&mut self, slot: Slot) -> bool {
        let Some(i) = self.index_of(slot) else {
            return false;
        };
        let last = self.entries.len() - 1;
        self.swap(i, last);
        self.entries.pop();
        self.position[slot as usize] = NOT_IN_HEAP;
        if i < self.entries.len() {
            let i = self.sift_up(i);
            self.sift_down(i);
        }
        true
    }

    fn index_of(&self, slot: Slot) -> Option<usize> {
        match self.position.get(slot as usize) {
            Some(&p) if p != NOT_IN_HEAP => Some(p as usize),
            _ => None,
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.entries.swap(a, b);
        self.position[self.entries[a].1 as usize] = a as u32;
        self.position[self.entries[b].1 as usize] = b as u32;
    }

    fn sift_up(&mut self, mut i: usize) -> usize {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.entries[i] >= self.entries[parent] {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
        i
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.entries.len();
        loop {
            let (left, right) = (2 * i + 1, 2 * i + 2);
            let mut smallest = i;
            if left < n && self.entries[left] < self.entries[smallest] {
                smallest = left;
            }
            if right < n && self.entries[right] < self.entries[smallest] {
                smallest = right;
            }
            if smallest == i {
                return;
            }
            self.swap(i, smallest);
            i = smallest;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Against a model map: after any mix of upserts and removes, the
        /// minimum is the model's smallest (key, slot) and the lengths agree.
        #[test]
        fn matches_a_sorted_model(ops in prop::collection::vec((0u32..40, 0u32..1000, any::<bool>()), 0..400)) {
            let mut heap = SlotHeap::default();
            let mut model: BTreeMap<Slot, u32> = BTreeMap::new();
            for (slot, key, insert) in ops {
                if insert {
                    heap.upsert(slot, key);
                    model.insert(slot, key);
                } else {
                    prop_assert_eq!(heap.remove(slot), model.remove(&slot).is_some());
                }
                let expected = model.iter().map(|(&s, &k)| (k, s)).min().map(|(_, s)| s);
                prop_assert_eq!(heap.min(), expected);
                prop_assert_eq!(heap.len(), model.len());
                for s in 0..40 {
                    prop_assert_eq!(heap.contains(s), model.contains_key(&s));
                }
            }
        }
    }
}
