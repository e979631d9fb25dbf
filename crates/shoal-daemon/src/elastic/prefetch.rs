//! Prefetch on growth (issue 11, item 3; off unless `--elastic-prefetch
//! SIZE` / `prefetch` in `[node.elastic]`): the objects a shrink evicted
//! come back into memory in the background when the capacity grows again,
//! so the data job's next pass finds them there instead of restoring each
//! on its get.
//!
//! The policy evicts the coldest object first, so a shrink's last victims
//! were its hottest: they are remembered newest last (at most `budget`
//! bytes of them, the oldest forgotten first) and brought back newest
//! first. A growth brings back only what fits the room the store has free
//! at that step (a prefetch never evicts anything to make room), and
//! nothing while the store is shrinking.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use shoal_core::error::Result;
use shoal_core::store::{Verdict, Victim};
use shoal_core::ObjectId;

use crate::node::{NodeEvent, NodeListener};

/// What prefetches restore through: the daemon's operations implement it
/// (`ops/restore.rs`). A trait, because the controller sits below the
/// operations in the daemon's layers and must not import them.
pub trait Restorer {
    /// Restores `id` from the tiers into memory: `Ok(true)` if it did,
    /// `Ok(false)` if there was nothing to do (in memory, or gone).
    fn restore_object(&self, id: ObjectId) -> Pin<Box<dyn Future<Output = Result<bool>> + '_>>;
}

pub struct Prefetch {
    /// Bytes of victims remembered (and brought back per growth) at most.
    budget: u64,
    /// Set by the controller around its shrink: only those victims count
    /// (not the evictions of creates and restores).
    recording: Cell<bool>,
    /// (id, bytes), newest last.
    victims: RefCell<VecDeque<(ObjectId, u64)>>,
    remembered: Cell<u64>,
}

impl Prefetch {
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            recording: Cell::new(false),
            victims: RefCell::new(VecDeque::new()),
            remembered: Cell::new(0),
        }
    }

    /// Runs `shrink` with this prefetcher remembering its victims.
    pub fn recording<R>(&self, shrink: impl FnOnce() -> R) -> R {
        self.recording.set(true);
        let result = shrink();
        self.recording.set(false);
        result
    }

    /// The newest victims whose bytes fit `room` (and the budget), newest
    /// first; they are forgotten here (a restore that fails is not
    /// retried at the next growth).
    pub fn take_fitting(&self, room: u64) -> Vec<(ObjectId, u64)> {
        let mut room = room.min(self.budget);
        let mut victims = self.victims.borrow_mut();
        let mut taken = Vec::new();
        while let Some(&(id, bytes)) = victims.back() {
            if bytes > room {
                break;
            }
            victims.pop_back();
            self.remembered.set(self.remembered.get() - bytes);
            room -= bytes;
            taken.push((id, bytes));
        }
        taken
    }

    fn remember(&self, id: ObjectId, bytes: u64) {
        if bytes > self.budget {
            return;
        }
        let mut victims = self.victims.borrow_mut();
        victims.push_back((id, bytes));
        let mut remembered = self.remembered.get() + bytes;
        while remembered > self.budget {
            let (_, old) = victims
                .pop_front()
                .expect("remembered bytes are in the list");
            remembered -= old;
        }
        self.remembered.set(remembered);
    }
}

impl NodeListener for Prefetch {
    fn on_event(&self, _event: &NodeEvent) {}

    fn on_evicting(&self, victim: &Victim) -> Verdict {
        if self.recording.get() {
            self.remember(victim.id, victim.location.size());
        }
        Verdict::Free
    }
}

#[cfg(test)]
mod tests {
    use shoal_core::store::ObjectLocation;

    use super::*;

    fn victim(n: u8, size: u64) -> Victim {
        let mut id = [0u8; shoal_core::ids::ID_LEN];
        id[0] = n;
        Victim {
            id: ObjectId(id),
            location: ObjectLocation {
                offset: 0,
                data_size: size,
                meta_size: 0,
            },
        }
    }

    #[test]
    fn remembers_only_a_shrinks_victims_newest_first_within_the_budget_and_the_room() {
        let prefetch = Prefetch::new(10);
        // An eviction outside a shrink (a create's) is not remembered.
        prefetch.on_evicting(&victim(9, 1));
        prefetch.recording(|| {
            for n in 0..5 {
                assert_eq!(prefetch.on_evicting(&victim(n, 3)), Verdict::Free);
            }
        });
        // 5 × 3 bytes over a budget of 10: the three newest stay.
        let ids = |v: Vec<(ObjectId, u64)>| v.iter().map(|(id, _)| id.0[0]).collect::<Vec<_>>();
        assert_eq!(ids(prefetch.take_fitting(7)), vec![4, 3]);
        assert_eq!(ids(prefetch.take_fitting(2)), Vec::<u8>::new());
        assert_eq!(ids(prefetch.take_fitting(100)), vec![2]);
        assert!(prefetch.take_fitting(100).is_empty());
        // A victim larger than the budget is never remembered.
        prefetch.recording(|| prefetch.on_evicting(&victim(7, 11)));
        assert!(prefetch.take_fitting(100).is_empty());
    }
}
