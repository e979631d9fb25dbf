//! The read history of objects that left memory ("ghosts"), keyed by id.
//!
//! An object evicted down a tier loses its table entry, and with it its
//! [`Access`] record. When it is restored, a policy that forecasts reads
//! (`eviction::Forecast`) would see a stranger — and under a cyclic scan
//! in a store smaller than the data every object is such a stranger each
//! pass. The store keeps the history of what it evicted here and hands it
//! back to the entry a restore creates, so a restored object's next read
//! measures its true interval.
//!
//! Bounded: at most `capacity` ghosts, the oldest forgotten first (a FIFO
//! of insertions; a ghost taken back or forgotten leaves a stale queue
//! entry, skipped when it reaches the front by its sequence number).

use std::collections::{HashMap, VecDeque};

use shoal_core::ids::ObjectId;

use crate::object_table::PackedAccess;

/// Default bound: 2^18 ghosts, ~18 MiB at most (id, record, sequence and
/// the map's and queue's share per ghost).
pub const DEFAULT_GHOSTS: usize = 1 << 18;

pub struct GhostReads {
    capacity: usize,
    ghosts: HashMap<ObjectId, (PackedAccess, u64)>,
    /// Insertion order: (id, sequence number of that insertion).
    order: VecDeque<(ObjectId, u64)>,
    next_seq: u64,
}

impl GhostReads {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            ghosts: HashMap::new(),
            order: VecDeque::new(),
            next_seq: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.ghosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ghosts.is_empty()
    }

    /// `id` left memory with this history. Never-read objects are not
    /// remembered: there is nothing to carry.
    pub fn remember(&mut self, id: ObjectId, access: PackedAccess) {
        if self.capacity == 0 || access == PackedAccess::default() {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.ghosts.insert(id, (access, seq));
        self.order.push_back((id, seq));
        while self.ghosts.len() > self.capacity {
            self.pop_oldest();
        }
        // Stale queue entries (taken or re-remembered ids) are bounded too:
        // compact when they outnumber the live ones.
        if self.order.len() > 2 * self.capacity.max(16) {
            let ghosts = &self.ghosts;
            self.order
                .retain(|(id, seq)| ghosts.get(id).is_some_and(|&(_, s)| s == *seq));
        }
    }

    /// The history `id` left with, forgotten here (the entry carries it now).
    pub fn take(&mut self, id: &ObjectId) -> Option<PackedAccess> {
        self.ghosts.remove(id).map(|(access, _)| access)
    }

    /// `id` is gone for good (deleted): its history must not pass to a
    /// future object that reuses the id.
    pub fn forget(&mut self, id: &ObjectId) {
        self.ghosts.remove(id);
    }

    fn pop_oldest(&mut self) {
        while let Some((id, seq)) = self.order.pop_front() {
            if self.ghosts.get(&id).is_some_and(|&(_, s)| s == seq) {
                self.ghosts.remove(&id);
                return;
            }
        }
    }

    /// Heap bytes held (for the store's bookkeeping figure).
    pub fn heap_bytes(&self) -> usize {
        let entry = std::mem::size_of::<(ObjectId, (PackedAccess, u64))>() + 8;
        self.ghosts.capacity() * entry
            + self.order.capacity() * std::mem::size_of::<(ObjectId, u64)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId([n; shoal_core::ids::ID_LEN])
    }

    fn read_at(t: u64) -> PackedAccess {
        let mut a = PackedAccess::default();
        a.record(t);
        a
    }

    #[test]
    fn takes_back_what_it_remembered_once() {
        let mut g = GhostReads::new(4);
        g.remember(id(1), read_at(7));
        assert_eq!(g.take(&id(1)).map(|a| a.get().last), Some(7));
        assert_eq!(g.take(&id(1)), None);
        g.remember(id(2), PackedAccess::default());
        assert!(g.is_empty(), "a never-read object carries nothing");
    }

    #[test]
    fn forgets_the_oldest_beyond_its_bound() {
        let mut g = GhostReads::new(3);
        for n in 1..=5 {
            g.remember(id(n), read_at(n as u64));
        }
        assert_eq!(g.len(), 3);
        assert_eq!(g.take(&id(1)), None);
        assert_eq!(g.take(&id(2)), None);
        assert!(g.take(&id(5)).is_some());
    }

    #[test]
    fn a_re_remembered_id_counts_from_its_newest_insertion() {
        let mut g = GhostReads::new(2);
        g.remember(id(1), read_at(1));
        g.remember(id(2), read_at(2));
        g.remember(id(1), read_at(3)); // evicted again, newer history
        g.remember(id(3), read_at(4)); // the oldest live one, 2, goes
        assert_eq!(g.take(&id(2)), None);
        assert_eq!(g.take(&id(1)).map(|a| a.get().last), Some(3));
        assert!(g.take(&id(3)).is_some());
    }

    #[test]
    fn stale_queue_entries_stay_bounded() {
        let mut g = GhostReads::new(16);
        for round in 0..1000u64 {
            g.remember(id((round % 4) as u8), read_at(round + 1));
            g.take(&id(((round + 1) % 4) as u8));
        }
        assert!(g.order.len() <= 2 * 16 + 1, "queue {}", g.order.len());
        g.forget(&id(0));
        assert_eq!(g.take(&id(0)), None);
    }
}
