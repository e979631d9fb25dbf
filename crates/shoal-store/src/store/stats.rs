//! What the store reports about its objects: listings (each object's
//! references counted through the daemon and the fast path alike), the
//! largest objects, the stats, and the heap its bookkeeping takes.

use shoal_core::location::ObjectLocation;
use shoal_core::protocol::{ObjectInfo, StoreStats};

use crate::eviction::EvictionPolicy;
use crate::object_table::{Entry, ObjectState, Slot};

use super::{Store, FAST_READERS};

impl Store {
    /// Every allocated object, deleted ones still held included (tests).
    #[cfg(test)]
    pub(crate) fn list_all(&self) -> Vec<ObjectInfo> {
        self.table.iter().map(|(_, e)| self.info(e)).collect()
    }

    pub fn list(&self) -> Vec<ObjectInfo> {
        self.table
            .iter()
            .filter(|(_, e)| !e.delete_pending)
            .map(|(_, e)| self.info(e))
            .collect()
    }

    /// References to `e`'s object: through the daemon, and those clients
    /// count through the fast path (the reference kept in their name while
    /// they hold it is not counted twice).
    fn references(&self, e: &Entry) -> u32 {
        let fast = match (e.fast_position(), &self.readers) {
            (Some(position), Some(readers)) => readers.references(position),
            _ => 0,
        };
        let kept = if self.adopted.is_empty() {
            0
        } else {
            self.clients
                .get(&FAST_READERS)
                .and_then(|c| c.refs.get(&self.table.find(&e.id).expect("live")))
                .copied()
                .unwrap_or(0)
        };
        (e.refs - kept).saturating_add(fast)
    }

    /// A listing row for `e`, its references counted as [`Self::references`].
    fn info(&self, e: &Entry) -> ObjectInfo {
        ObjectInfo {
            refs: self.references(e),
            ..object_info(e)
        }
    }

    /// The `n` largest objects in memory (data + metadata), largest first:
    /// one pass over the table keeping a heap of `n`, for an operator's view.
    pub fn largest(&self, n: usize) -> Vec<ObjectInfo> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let mut heap: BinaryHeap<Reverse<(u64, Slot)>> = BinaryHeap::with_capacity(n + 1);
        for (slot, e) in self.table.iter().filter(|(_, e)| !e.delete_pending) {
            heap.push(Reverse((e.data_size + u64::from(e.meta_size), slot)));
            if heap.len() > n {
                heap.pop();
            }
        }
        heap.into_sorted_vec()
            .into_iter()
            .filter_map(|Reverse((_, slot))| self.table.get(slot).map(|e| self.info(e)))
            .collect()
    }

    pub fn stats(&self) -> StoreStats {
        let mut stats = StoreStats {
            capacity: self.capacity,
            region_size: self.allocator.size(),
            used: self.allocator.used() - self.lent_bytes,
            lent: self.lent_bytes,
            clients: self.clients.keys().filter(|c| **c != FAST_READERS).count() as u64,
            evictions: self.evictions,
            evicted_bytes: self.evicted_bytes,
            line_size: self.allocator.line(),
            policy: self.policy.name(),
            evictable: (self.policy.len() + self.cold.len()) as u64,
            ..Default::default()
        };
        for (_, e) in self.table.iter() {
            stats.objects += 1;
            stats.sealed += (e.state == ObjectState::Sealed) as u64;
            stats.referenced += (self.references(e) > 0) as u64;
        }
        stats
    }

    /// Daemon heap bytes spent on bookkeeping (table, policy, allocator), for
    /// the per-object overhead measurement.
    pub fn bookkeeping_bytes(&self) -> usize {
        self.table.heap_bytes()
            + self.table.slot_bound() * 8
            + self.allocator.free_blocks() * 96
            + self.ghosts.heap_bytes()
    }
}

/// How a listing shows an object in memory.
fn object_info(e: &Entry) -> ObjectInfo {
    ObjectInfo {
        id: e.id,
        location: ObjectLocation {
            offset: e.offset,
            data_size: e.data_size,
            meta_size: e.meta_size,
        },
        sealed: e.state == ObjectState::Sealed,
        refs: e.refs,
        resident: true,
        tiers: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{id, store};
    use super::*;

    #[test]
    fn largest_lists_the_biggest_objects_biggest_first_and_skips_deleted_ones() {
        let mut s = store(1 << 20);
        for (n, size) in [(1u8, 300u64), (2, 100), (3, 5000), (4, 700), (5, 4000)] {
            s.create(1, id(n), size, 0).unwrap();
        }
        s.seal(1, &[id(1), id(2), id(3), id(4)], true).unwrap();
        let sizes = |s: &Store, n| -> Vec<(u8, u64)> {
            s.largest(n)
                .iter()
                .map(|o| (o.id.0[0], o.location.data_size))
                .collect()
        };
        // Unsealed objects count too (they hold memory).
        assert_eq!(sizes(&s, 3), [(3, 5000), (5, 4000), (4, 700)]);
        assert_eq!(sizes(&s, 10).len(), 5);
        assert!(s.largest(0).is_empty());
        s.delete(&id(3)).unwrap();
        assert_eq!(sizes(&s, 2), [(5, 4000), (4, 700)]);
    }
}
