//! Forecast: Belady's rule on a forecast of each candidate's next read —
//! the candidate predicted to be read farthest in the future leaves first.
//!
//! The forecast is the store's read history ([`Access`]): an object last read
//! at `last`, `interval` gets after the read before, is predicted to be read
//! next at `last + interval`. For an iterative job (passes over the same data)
//! that is the pass order itself, and in a store smaller than a pass it keeps
//! a fixed part of the data resident where LRU keeps nothing (LRU evicts each
//! object just before the scan comes back to it). The history survives
//! evictions (the store's `ghost_reads`), so a restored object keeps its
//! forecast.
//!
//! Objects with no forecast leave before any object with a live one, in LRU
//! order (by when they became candidates): objects read fewer than twice —
//! new ones a producer just wrote included, so a pipeline behaves as under
//! LRU and a one-time scan of new data cannot push out data read over and
//! over — and, before those, objects whose forecast went stale (not read for
//! two intervals: the pattern stopped).
//!
//! Time is the store's access clock (one tick per get), not wall time, so a
//! forecast holds when the machine slows down. "Now" is the clock at the
//! latest insertion: a read is followed by its release, which inserts.
//! O(log n) per operation: three indexed heaps (`slot_heap.rs`).

use std::cmp::Reverse;

use super::policy::{EvictionPolicy, Reads};
use super::slot_heap::SlotHeap;
use crate::object_table::{Access, Slot};

#[derive(Default)]
pub struct Forecast {
    /// No forecast: by the clock when they became candidates, oldest first.
    unknown: SlotHeap<u64>,
    /// Live forecasts by predicted next read, farthest first.
    farthest: SlotHeap<Reverse<u64>>,
    /// The same slots by when their forecast goes stale, soonest first.
    stale_at: SlotHeap<u64>,
    now: u64,
}

impl EvictionPolicy for Forecast {
    fn insert(&mut self, slot: Slot) {
        self.insert_with_reads(
            slot,
            Reads {
                access: Access::default(),
                now: self.now,
            },
        );
    }

    fn insert_with_reads(&mut self, slot: Slot, reads: Reads) {
        self.remove(slot);
        self.now = self.now.max(reads.now);
        let Access { last, interval } = reads.access;
        let stale_at = last.saturating_add(interval.saturating_mul(2));
        if interval == 0 || stale_at < self.now {
            self.unknown.upsert(slot, reads.now);
        } else {
            self.farthest.upsert(slot, Reverse(last + interval));
            self.stale_at.upsert(slot, stale_at);
        }
    }

    fn remove(&mut self, slot: Slot) {
        if !self.unknown.remove(slot) {
            self.farthest.remove(slot);
            self.stale_at.remove(slot);
        }
    }

    fn touch(&mut self, _slot: Slot) {}

    fn victim(&self) -> Option<Slot> {
        if let Some((at, slot)) = self.stale_at.min_entry() {
            if at < self.now {
                return Some(slot);
            }
        }
        self.unknown.min().or_else(|| self.farthest.min())
    }

    fn len(&self) -> usize {
        self.unknown.len() + self.farthest.len()
    }

    fn name(&self) -> &'static str {
        "forecast"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(last: u64, interval: u64, now: u64) -> Reads {
        Reads {
            access: Access { last, interval },
            now,
        }
    }

    fn drain(f: &mut Forecast) -> Vec<Slot> {
        let mut order = Vec::new();
        while let Some(v) = f.victim() {
            order.push(v);
            f.remove(v);
        }
        order
    }

    #[test]
    fn the_farthest_predicted_read_leaves_first() {
        let mut f = Forecast::default();
        // A cyclic scan of period 10 read 1, 2, 3 at 11, 12, 13: 3 is read
        // again last (at 23), so it goes first; 1 (due at 21) stays longest.
        f.insert_with_reads(1, reads(11, 10, 11));
        f.insert_with_reads(2, reads(12, 10, 12));
        f.insert_with_reads(3, reads(13, 10, 13));
        assert_eq!(drain(&mut f), vec![3, 2, 1]);
    }

    #[test]
    fn objects_without_a_forecast_go_first_in_lru_order() {
        let mut f = Forecast::default();
        f.insert_with_reads(1, reads(5, 4, 5)); // due at 9
        f.insert_with_reads(2, reads(0, 0, 6)); // written, never read
        f.insert_with_reads(3, reads(7, 0, 7)); // read once
        f.insert_with_reads(4, reads(0, 0, 8));
        assert_eq!(drain(&mut f), vec![2, 3, 4, 1]);
    }

    #[test]
    fn a_forecast_overdue_by_an_interval_is_stale() {
        let mut f = Forecast::default();
        f.insert_with_reads(1, reads(10, 5, 10)); // due 15, stale after 20
        f.insert_with_reads(2, reads(12, 0, 12)); // no forecast
        assert_eq!(f.victim(), Some(2));
        // The clock moves on past 20 (other objects read and released).
        f.insert_with_reads(3, reads(21, 0, 21));
        assert_eq!(f.victim(), Some(1), "stale goes before no forecast");
        // Inserted stale: no forecast, in LRU order.
        f.remove(1);
        f.insert_with_reads(1, reads(10, 5, 30));
        assert_eq!(drain(&mut f), vec![2, 3, 1]);
    }

    #[test]
    fn reinsertion_moves_a_slot_between_classes() {
        let mut f = Forecast::default();
        f.insert_with_reads(1, reads(0, 0, 1));
        f.insert_with_reads(1, reads(2, 1, 2));
        assert_eq!(f.len(), 1);
        f.insert_with_reads(1, reads(0, 0, 3));
        assert_eq!(f.len(), 1);
        assert_eq!(drain(&mut f), vec![1]);
        assert!(f.is_empty());
    }
}
