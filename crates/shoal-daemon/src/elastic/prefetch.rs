//! Prefetch on growth (issue 11, item 3; off unless `--elastic-prefetch
//! SIZE` / `prefetch` in `[node.elastic]`): the objects that left memory
//! because the store was shrunk come back in the background when its
//! capacity grows again, so the data job finds them there instead of
//! restoring each on its get.
//!
//! Victims are remembered while the store is below its full capacity —
//! the controller's own evictions and those of creates and restores that a
//! full-sized store would not have made — and brought back in the order
//! they are predicted to be read next: an object's last read plus the
//! interval between its last two reads, on the store's access clock (one
//! tick per get). For a job that scans its data in cycles (an iterative
//! job's passes) that is the scan's own order from where it stands — the
//! objects read longest ago come next — where bringing the newest victims
//! first (this module's first version) was exactly the scan's reverse.
//! Objects read once (no interval yet) come after, newest read first.
//!
//! Each time the store shrinks below its full size, at most the byte budget
//! of what left memory comes back. One background loop (the controller
//! starts it when the store grows) restores them one at a time, each only
//! into the room the store has free just then (a prefetch never evicts
//! anything to make room; the data job's own restores take room too, so
//! what does not fit yet waits for the next growth), stops as soon as the
//! store shrinks again, and tries each victim once per shrink.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use shoal_core::error::Result;
use shoal_core::event::ObjectEvent;
use shoal_core::ObjectId;
use shoal_store::object_table::{Access, Residency};
use shoal_store::store::{Verdict, Victim};

use crate::node::{NodeEvent, NodeListener};
use crate::tiers::restore::RestoreOutcome;

/// Objects whose reads are remembered at most: 64 k records of ~64 bytes.
/// Past it the half least likely to be read soon is forgotten (amortised
/// O(log n) per eviction).
const MAX_REMEMBERED: usize = 1 << 16;

/// What prefetches restore through: the daemon's operations implement it
/// (`ops/restore.rs`). A trait, because the controller sits below the
/// operations in the daemon's layers and must not import them.
pub trait Restorer {
    /// Restores `id` from the tiers into memory (`NotBelow`: nothing to do,
    /// in memory already or gone).
    fn restore_object(
        &self,
        id: ObjectId,
    ) -> Pin<Box<dyn Future<Output = Result<RestoreOutcome>> + '_>>;
}

/// One object that left memory while the store was shrunk.
#[derive(Debug, Clone, Copy)]
struct Remembered {
    bytes: u64,
    /// Its reads, carried across evictions: an object restored and evicted
    /// again has a fresh entry in the store, whose first read gives the
    /// interval against the read remembered here.
    access: Access,
    /// Still to bring back (false once taken: the record stays for the
    /// interval of its next eviction).
    pending: bool,
}

impl Remembered {
    /// Sorts the victims: ticks until the predicted next read (0 when due
    /// or overdue by less than one interval), then objects without a usable
    /// prediction, newest read first.
    fn order(&self, now: u64) -> (u8, u64) {
        let Access { last, interval } = self.access;
        let due = last.saturating_add(interval);
        if interval > 0 && now <= due.saturating_add(interval) {
            (0, due.saturating_sub(now))
        } else {
            (1, u64::MAX - last)
        }
    }
}

/// Where a remembered victim is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum InMemory {
    /// Not in memory: to bring back.
    No,
    /// Back (a get restored it): nothing to bring.
    Yes,
    /// Still leaving (a tier copying it out): not yet, not forgotten.
    Leaving,
}

impl InMemory {
    /// From the store's view of a visible object.
    pub(super) fn of(residency: Option<Residency>) -> Self {
        match residency {
            None => InMemory::No,
            Some(Residency::Evicting) => InMemory::Leaving,
            Some(Residency::Resident | Residency::Kept) => InMemory::Yes,
        }
    }
}

/// Victims the refill loop orders at a time (one sort of the records per
/// this many restores).
const BATCH: usize = 32;

pub(super) struct Prefetch {
    /// Bytes brought back per shrink at most.
    budget: u64,
    /// Bytes taken since the store last shrank below its full size.
    spent: Cell<u64>,
    /// Set by the controller while the store is below its full capacity:
    /// only those evictions are remembered.
    recording: Cell<bool>,
    /// Set by the controller at a step that lowered the capacity.
    shrinking: Cell<bool>,
    /// The refill loop is running.
    refilling: Cell<bool>,
    /// The room the loop last stopped at, short of its next victim: no new
    /// loop until the store has more.
    blocked_at: Cell<Option<u64>>,
    victims: RefCell<HashMap<ObjectId, Remembered>>,
    /// Records still to bring back.
    pending: Cell<usize>,
}

impl Prefetch {
    pub(super) fn new(budget: u64) -> Self {
        Self {
            budget,
            spent: Cell::new(0),
            recording: Cell::new(false),
            shrinking: Cell::new(false),
            refilling: Cell::new(false),
            blocked_at: Cell::new(None),
            victims: RefCell::new(HashMap::new()),
            pending: Cell::new(0),
        }
    }

    /// Whether the controller's last step lowered the capacity: a refill
    /// stops at its next victim.
    pub(super) fn set_shrinking(&self, shrinking: bool) {
        self.shrinking.set(shrinking);
        if shrinking {
            self.blocked_at.set(None);
        }
    }

    pub(super) fn shrinking(&self) -> bool {
        self.shrinking.get()
    }

    /// Victims still to bring back.
    pub(super) fn pending(&self) -> usize {
        self.pending.get()
    }

    /// Claims the refill loop for a caller that will run it, given the
    /// store's free `room`: false while one runs, the store shrinks,
    /// nothing is pending, or the last loop stopped at no less room.
    pub(super) fn start_refill(&self, room: u64) -> bool {
        if self.refilling.get()
            || self.shrinking.get()
            || self.pending.get() == 0
            || self.spent.get() >= self.budget
            || self.blocked_at.get().is_some_and(|at| room <= at)
        {
            return false;
        }
        self.refilling.set(true);
        self.blocked_at.set(None);
        true
    }

    /// The loop ended; `blocked_at`: the room it stopped at, if its next
    /// victim did not fit (rather than none being left).
    pub(super) fn refill_done(&self, blocked_at: Option<u64>) {
        self.refilling.set(false);
        self.blocked_at.set(blocked_at);
    }

    /// A taken victim whose restore brought nothing back (in memory
    /// already, gone, or failed): its bytes back in the budget.
    pub(super) fn refund(&self, bytes: u64) {
        self.spent.set(self.spent.get().saturating_sub(bytes));
    }

    /// A victim taken but not restored (no room by the time its turn came,
    /// or the store shrank): pending again, its bytes back in the budget.
    pub(super) fn put_back(&self, id: &ObjectId) {
        if let Some(r) = self.victims.borrow_mut().get_mut(id) {
            if !r.pending {
                r.pending = true;
                self.pending.set(self.pending.get() + 1);
                self.spent.set(self.spent.get().saturating_sub(r.bytes));
            }
        }
    }

    /// Whether evictions from now on are remembered: true while the store
    /// is below its full size. Each shrink from full starts a new budget.
    pub(super) fn set_recording(&self, recording: bool) {
        if recording && !self.recording.replace(recording) {
            self.spent.set(0);
        }
        self.recording.set(recording);
    }

    /// [`take`](Self::take) at most [`BATCH`] victims: the refill loop's
    /// next ones.
    pub(super) fn take_batch(
        &self,
        room: u64,
        now: u64,
        in_memory: impl Fn(&ObjectId) -> InMemory,
    ) -> Vec<(ObjectId, u64)> {
        self.take(room, now, in_memory, BATCH)
    }

    /// The remembered victims to bring back now: not in memory (those back
    /// already are no longer pending; those still leaving wait), in the order they are predicted to be read
    /// from `now` (the store's access clock), at most `most`, while their
    /// bytes fit `room` and what is left of the budget. They are marked
    /// taken (a restore that fails is not retried at the next growth).
    fn take(
        &self,
        room: u64,
        now: u64,
        in_memory: impl Fn(&ObjectId) -> InMemory,
        most: usize,
    ) -> Vec<(ObjectId, u64)> {
        let mut room = room.min(self.budget.saturating_sub(self.spent.get()));
        let mut victims = self.victims.borrow_mut();
        let mut pending: Vec<(ObjectId, Remembered)> = Vec::new();
        for (id, r) in victims.iter_mut().filter(|(_, r)| r.pending) {
            match in_memory(id) {
                InMemory::No => pending.push((*id, *r)),
                InMemory::Yes => {
                    r.pending = false;
                    self.pending.set(self.pending.get() - 1);
                }
                // Its memory is freed when its spill ends: a later turn.
                InMemory::Leaving => {}
            }
        }
        pending.sort_by_key(|(id, r)| (r.order(now), id.0));
        let mut taken = Vec::new();
        for (id, r) in pending {
            if r.bytes > room || taken.len() == most {
                break;
            }
            room -= r.bytes;
            self.spent.set(self.spent.get() + r.bytes);
            victims.get_mut(&id).expect("listed above").pending = false;
            self.pending.set(self.pending.get() - 1);
            taken.push((id, r.bytes));
        }
        taken
    }

    fn remember(&self, victim: &Victim) {
        let bytes = victim.location.size();
        if bytes > self.budget {
            return;
        }
        let mut victims = self.victims.borrow_mut();
        let mut access = victim.access;
        if let Some(before) = victims.get(&victim.id) {
            if access.last == 0 {
                // Not read since it came back: its history is the record's.
                access = before.access;
            } else if access.interval == 0 && before.access.last != 0 {
                access.interval = access.last.saturating_sub(before.access.last);
            }
        }
        let was_pending = victims
            .insert(
                victim.id,
                Remembered {
                    bytes,
                    access,
                    pending: true,
                },
            )
            .is_some_and(|r| r.pending);
        if !was_pending {
            self.pending.set(self.pending.get() + 1);
        }
        if victims.len() > MAX_REMEMBERED {
            let now = victims.values().map(|r| r.access.last).max().unwrap_or(0);
            // Pending first, then the soonest predicted read.
            let mut order: Vec<_> = victims
                .iter()
                .map(|(id, r)| (!r.pending, r.order(now), *id))
                .collect();
            order.sort_unstable();
            for (_, _, id) in order.split_off(MAX_REMEMBERED / 2) {
                if victims.remove(&id).is_some_and(|r| r.pending) {
                    self.pending.set(self.pending.get() - 1);
                }
            }
        }
    }

    #[cfg(test)]
    fn take_all(
        &self,
        room: u64,
        now: u64,
        in_memory: impl Fn(&ObjectId) -> InMemory,
    ) -> Vec<(ObjectId, u64)> {
        self.take(room, now, in_memory, usize::MAX)
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.victims.borrow().len()
    }
}

impl NodeListener for Prefetch {
    fn on_event(&self, event: &NodeEvent) {
        if let NodeEvent::Object(ObjectEvent::Removed { id, deleted: true }) = event {
            if self
                .victims
                .borrow_mut()
                .remove(id)
                .is_some_and(|r| r.pending)
            {
                self.pending.set(self.pending.get() - 1);
            }
        }
    }

    fn on_evicting(&self, victim: &Victim) -> Verdict {
        if self.recording.get() {
            self.remember(victim);
        }
        Verdict::Free
    }
}

#[cfg(test)]
mod tests {
    use shoal_core::location::ObjectLocation;

    use super::*;

    fn oid(n: u32) -> ObjectId {
        let mut id = [0u8; shoal_core::ids::ID_LEN];
        id[..4].copy_from_slice(&n.to_be_bytes());
        ObjectId(id)
    }

    fn victim(n: u32, size: u64, last: u64, interval: u64) -> Victim {
        Victim {
            id: oid(n),
            location: ObjectLocation {
                offset: 0,
                data_size: size,
                meta_size: 0,
            },
            access: Access { last, interval },
        }
    }

    fn numbers(taken: Vec<(ObjectId, u64)>) -> Vec<u32> {
        taken
            .iter()
            .map(|(id, _)| u32::from_be_bytes(id.0[..4].try_into().unwrap()))
            .collect()
    }

    fn back_if(id: &ObjectId, n: u32) -> InMemory {
        if *id == oid(n) {
            InMemory::Yes
        } else {
            InMemory::No
        }
    }

    const NOTHING_RESIDENT: fn(&ObjectId) -> InMemory = |_| InMemory::No;

    #[test]
    fn remembers_only_while_recording_within_the_budget_and_the_room() {
        let prefetch = Prefetch::new(10);
        prefetch.on_evicting(&victim(9, 1, 5, 1));
        assert_eq!(prefetch.remembered(), 0, "not shrunk: not remembered");
        prefetch.set_recording(true);
        for n in 0..5 {
            assert_eq!(
                prefetch.on_evicting(&victim(n, 3, 10 + n as u64, 0)),
                Verdict::Free
            );
        }
        // A victim larger than the budget is never remembered.
        prefetch.on_evicting(&victim(7, 11, 20, 0));
        assert_eq!(prefetch.remembered(), 5);
        // No intervals: newest read first; 7 bytes of room take two.
        assert_eq!(numbers(prefetch.take_all(7, 20, NOTHING_RESIDENT)), [4, 3]);
        assert!(prefetch.take_all(2, 20, NOTHING_RESIDENT).is_empty());
        // The budget caps what one shrink brings back: 10 bytes, 6 spent.
        assert_eq!(numbers(prefetch.take_all(100, 20, NOTHING_RESIDENT)), [2]);
        assert!(prefetch.take_all(100, 20, NOTHING_RESIDENT).is_empty());
        // Still shrunk: the same budget. Back at full size, then shrunk
        // again: a new one.
        prefetch.set_recording(true);
        assert!(prefetch.take_all(100, 20, NOTHING_RESIDENT).is_empty());
        prefetch.set_recording(false);
        prefetch.set_recording(true);
        assert_eq!(
            numbers(prefetch.take_all(100, 20, NOTHING_RESIDENT)),
            [1, 0]
        );
    }

    /// A job reading 10 objects in cycles (one tick per read), the store
    /// shrunk so that each is evicted once read (its fresh entry after a
    /// restore has no interval of its own): when it grows back with the
    /// scan at object 6, the next objects come back in the scan's order
    /// from there.
    #[test]
    fn brings_a_cyclic_scans_victims_back_in_the_scans_order_from_where_it_stands() {
        let prefetch = Prefetch::new(1 << 20);
        prefetch.set_recording(true);
        let objects = 10u64;
        let mut clock = 0;
        for pass in 0..3 {
            for n in 0..objects {
                clock += 1;
                // The first pass ran resident: the store knew the interval.
                let interval = if pass == 0 { objects } else { 0 };
                prefetch.on_evicting(&victim(n as u32, 1, clock, interval));
                if pass == 2 && n == 6 {
                    break;
                }
            }
        }
        let taken = numbers(prefetch.take_all(1 << 20, clock, NOTHING_RESIDENT));
        assert_eq!(taken, [7, 8, 9, 0, 1, 2, 3, 4, 5, 6]);
        // The objects in memory already are skipped.
        prefetch.on_evicting(&victim(3, 1, clock + 1, 0));
        prefetch.on_evicting(&victim(4, 1, clock + 2, 0));
        assert_eq!(
            numbers(prefetch.take_all(1 << 20, clock + 2, |id| back_if(id, 3))),
            [4]
        );
    }

    #[test]
    fn an_object_read_often_comes_before_one_read_long_ago_and_deleted_ones_are_forgotten() {
        let prefetch = Prefetch::new(1 << 20);
        prefetch.set_recording(true);
        // Read every 2 ticks, last at 98; read every 50, last at 60; read
        // every 10 ticks but last at 20: stopped being read (stale).
        prefetch.on_evicting(&victim(1, 1, 60, 50));
        prefetch.on_evicting(&victim(2, 1, 98, 2));
        prefetch.on_evicting(&victim(3, 1, 20, 10));
        prefetch.on_evicting(&victim(4, 1, 99, 0));
        prefetch.on_event(&NodeEvent::Object(ObjectEvent::Removed {
            id: oid(4),
            deleted: true,
        }));
        assert_eq!(
            numbers(prefetch.take_all(1 << 20, 100, NOTHING_RESIDENT)),
            [2, 1, 3]
        );
    }

    #[test]
    fn a_restore_that_brings_nothing_back_costs_no_budget_and_a_spent_budget_starts_no_loop() {
        let prefetch = Prefetch::new(20);
        prefetch.set_recording(true);
        for n in 0..4 {
            prefetch.on_evicting(&victim(n, 10, n as u64 + 1, 0));
        }
        assert_eq!(
            numbers(prefetch.take_batch(100, 5, NOTHING_RESIDENT)),
            [3, 2]
        );
        assert!(!prefetch.start_refill(100), "the budget is spent");
        // The second was in no tier (restore answered NotBelow): refunded.
        prefetch.refund(10);
        assert!(prefetch.start_refill(100));
        assert_eq!(numbers(prefetch.take_batch(100, 5, NOTHING_RESIDENT)), [1]);
        // Put back: pending again and refunded, so it fits the budget again.
        prefetch.put_back(&oid(1));
        assert_eq!(numbers(prefetch.take_batch(100, 5, NOTHING_RESIDENT)), [1]);
    }

    #[test]
    fn one_refill_loop_at_a_time_none_while_shrinking_and_none_until_more_room_than_it_stopped_at()
    {
        let prefetch = Prefetch::new(1 << 20);
        assert!(!prefetch.start_refill(100), "nothing remembered");
        prefetch.set_recording(true);
        for n in 0..3 {
            prefetch.on_evicting(&victim(n, 10, n as u64 + 1, 0));
        }
        prefetch.set_shrinking(true);
        assert!(!prefetch.start_refill(100), "the store is shrinking");
        prefetch.set_shrinking(false);
        assert!(prefetch.start_refill(100));
        assert!(!prefetch.start_refill(100), "one loop at a time");
        // The loop takes two, restores one, and finds no room for the other.
        let batch = numbers(prefetch.take_batch(20, 3, NOTHING_RESIDENT));
        assert_eq!(batch, [2, 1]);
        assert_eq!(prefetch.pending(), 1);
        prefetch.put_back(&oid(1));
        assert_eq!(prefetch.pending(), 2);
        prefetch.refill_done(Some(5));
        assert!(!prefetch.start_refill(5), "no more room than it stopped at");
        assert!(prefetch.start_refill(10));
        // The one put back comes first again, its bytes back in the budget.
        assert_eq!(
            numbers(prefetch.take_batch(100, 3, NOTHING_RESIDENT)),
            [1, 0]
        );
        prefetch.refill_done(None);
        assert!(!prefetch.start_refill(100), "nothing left");
        // A victim still leaving (a spill copying it out) waits, pending.
        prefetch.on_evicting(&victim(8, 10, 8, 0));
        assert!(prefetch
            .take_batch(100, 9, |_| InMemory::Leaving)
            .is_empty());
        assert_eq!(prefetch.pending(), 1);
        assert_eq!(numbers(prefetch.take_batch(100, 9, NOTHING_RESIDENT)), [8]);
        // A victim back in memory by a get is no longer pending.
        prefetch.on_evicting(&victim(7, 10, 9, 0));
        assert!(prefetch.take_batch(100, 9, |id| back_if(id, 7)).is_empty());
        assert_eq!(prefetch.pending(), 0);
    }

    #[test]
    fn the_records_stay_bounded() {
        let prefetch = Prefetch::new(u64::MAX);
        prefetch.set_recording(true);
        for n in 0..(MAX_REMEMBERED as u32 + 10) {
            prefetch.on_evicting(&victim(n, 1, n as u64 + 1, 0));
        }
        assert!(prefetch.remembered() <= MAX_REMEMBERED);
        // The newest survive.
        let taken = numbers(prefetch.take_all(1, u64::MAX, NOTHING_RESIDENT));
        assert_eq!(taken, [MAX_REMEMBERED as u32 + 9]);
    }
}
