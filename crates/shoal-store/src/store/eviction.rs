//! Eviction, the store's side of it: which objects are candidates (sealed,
//! unreferenced, in memory; the policy orders them), the access clock their
//! reads are timed on, choosing victims when a create lacks room or the
//! daemon asks for bytes ([`Store::evict`]), and each victim's way out as
//! the [`EvictionGate`] decides: freed at once, or held until its holder
//! calls [`Store::finish_eviction`] (or [`Store::cancel_eviction`], and
//! later [`Store::readmit`]). The policies themselves are
//! [`crate::eviction`]'s.

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;
use shoal_core::location::{Block, ObjectLocation};

use crate::eviction::{EvictionPolicy, Reads};
use crate::object_table::{Entry, ObjectState, Residency, Slot, CLOCK_MASK};

use super::{EvictionGate, Placement, Store, Verdict, Victim};

impl Store {
    /// Installs the gate every eviction asks from now on.
    pub fn set_eviction_gate(&mut self, gate: Box<dyn EvictionGate>) {
        self.gate = Some(gate);
    }

    /// The clock objects' reads are timed on: the number of gets so far,
    /// modulo 2^40 as [`Access`](crate::object_table::Access) keeps it.
    pub fn access_clock(&self) -> u64 {
        self.access_clock & CLOCK_MASK
    }

    /// Bytes that would be free after every evictable object left and every
    /// eviction in flight finished.
    fn reclaimable(&self) -> u64 {
        self.capacity
            .saturating_sub(self.allocator.used())
            .saturating_add(self.evictable_bytes)
            .saturating_add(self.evicting_bytes)
    }

    /// Finds a block of `len` bytes within capacity, evicting if needed. Does
    /// not evict when even evicting everything evictable could not free
    /// enough bytes. (Fragmentation can still make a create fail after it
    /// evicted: only unreferenced sealed objects, as LRU eviction would.)
    /// Victims the gate holds free nothing yet: the create fails with
    /// `StoreFull` and the caller waits for them to finish.
    pub(super) fn allocate(&mut self, len: u64, placement: Placement) -> Option<Block> {
        let fits = |s: &Self| s.allocator.used() + len <= s.capacity;
        if fits(self) {
            if let Some(block) = self.place(len, placement) {
                return Some(block);
            }
        }
        if !self.adopted.is_empty() {
            // Objects kept for fast-path readers that let go are candidates
            // again.
            self.sweep_fast_readers();
        }
        // Objects fast-path readers hold now are no candidates: found before
        // counting what eviction could free, so a create that cannot fit
        // evicts nothing.
        self.keep_held_candidates();
        if self.reclaimable() < len {
            return None;
        }
        // Held victims that cover the request: it fits once their holders
        // finish, and the caller waits for that.
        let covered = |s: &Self| {
            s.evicting_bytes > 0 && s.allocator.used() - s.evicting_bytes + len <= s.capacity
        };
        if covered(self) {
            return None;
        }
        while let Some(victim) = self.next_victim() {
            self.evict_slot(victim, true);
            if fits(self) {
                if let Some(block) = self.place(len, placement) {
                    return Some(block);
                }
            }
            if covered(self) {
                return None;
            }
        }
        None
    }

    /// Bytes of victims whose holders are still copying them out.
    pub fn evicting_bytes(&self) -> u64 {
        self.evicting_bytes
    }

    /// Whether `entry` is an eviction candidate: sealed, unreferenced,
    /// resident and not on its way out. (Known from the entry, so the hot
    /// paths ask no one.)
    pub(super) fn is_candidate(entry: &Entry) -> bool {
        entry.refs == 0
            && entry.state == ObjectState::Sealed
            && !entry.delete_pending
            && entry.residency == Residency::Resident
    }

    /// `slot`, whose block is `len` bytes, becomes an eviction candidate:
    /// the policy's, or a cold one if its readers are done with it.
    pub(super) fn add_candidate(&mut self, slot: Slot, len: u64) {
        let entry = self.table.get(slot).expect("candidate is live");
        if entry.cold {
            self.cold.insert(slot);
        } else {
            self.policy.insert_with_reads(
                slot,
                Reads {
                    access: entry.access.get(),
                    now: self.access_clock(),
                },
            );
        }
        self.evictable_bytes += len;
        self.space_changed = true;
    }

    /// `slot` stops being a candidate (referenced, chosen, removed); a no-op
    /// for a slot that is not one.
    pub(super) fn drop_candidate(&mut self, slot: Slot) {
        let Some(entry) = self.table.get(slot) else {
            return;
        };
        if Self::is_candidate(entry) {
            let len = self.block_of(entry).len;
            self.leave_candidates(slot);
            self.evictable_bytes -= len;
        }
    }

    /// Takes candidate `slot` out of the list it is in (its bytes stay
    /// counted: the caller's business). The policy hears of a cold one
    /// leaving too: it may hold the slot's read history (a touch while the
    /// object was referenced), and a remove with no touch after it is how
    /// it learns that the slot is freed.
    pub(super) fn leave_candidates(&mut self, slot: Slot) {
        if self.table.get(slot).expect("candidate is live").cold {
            self.cold.remove(slot);
        }
        self.policy.remove(slot);
    }

    /// `id`'s slot, if its object is sealed and visible here; else
    /// `ObjectNotFound`.
    fn visible_slot(&self, id: &ObjectId) -> Result<Slot> {
        self.table
            .find(id)
            .filter(|&s| self.table.get(s).is_some_and(Entry::is_visible))
            .ok_or_else(|| ShoalError::not_found(id))
    }

    /// The next victim: the most recently cooled candidate, else the
    /// policy's choice.
    fn next_victim(&self) -> Option<Slot> {
        self.cold.newest().or_else(|| self.policy.victim())
    }

    /// Times a read of `slot` on the access clock and tells the policy (a
    /// candidate must be out of the policy meanwhile: its reads go in anew).
    /// A read warms a cooled object again.
    pub(super) fn time_read(&mut self, slot: Slot) {
        self.access_clock += 1;
        let now = self.access_clock;
        self.uncool(slot);
        self.table.get_mut(slot).expect("live").access.record(now);
        self.policy.touch(slot);
    }

    /// `slot` is no longer cold; it must not be a candidate now.
    pub(super) fn uncool(&mut self, slot: Slot) {
        self.table.get_mut(slot).expect("live").cold = false;
    }

    /// Its readers are done with object `id` for now: once unreferenced it
    /// leaves memory before every candidate the policy orders, the most
    /// recently cooled first, until a read warms it again. A hint, as
    /// `madvise(MADV_COLD)` is: nothing leaves memory because of it alone.
    /// Reads already made through the fast path count as made before it.
    /// `ObjectNotFound` for an id not sealed and visible in memory here.
    pub fn cool(&mut self, id: &ObjectId) -> Result<()> {
        let slot = self.visible_slot(id)?;
        let candidate = Self::is_candidate(self.table.get(slot).expect("found slot is live"));
        if candidate {
            self.drop_candidate(slot);
        }
        if self.read_through_fast_path(slot) {
            self.time_read(slot);
        }
        self.table.get_mut(slot).expect("live").cold = true;
        if candidate {
            let len = self.block_of(self.table.get(slot).expect("live")).len;
            // A cooled object changes no room: waiters for space need not look again.
            let space_changed = self.space_changed;
            self.add_candidate(slot, len);
            self.space_changed = space_changed;
        }
        Ok(())
    }

    /// Evicts a candidate as the gate decides. Returns the bytes held (0 if
    /// its memory was freed at once), or `None` when it stays: a fast-path
    /// reader holds it, or (with `second_chance`) one read it since the
    /// policy last saw it — then the read is recorded as a get would have
    /// been, and the policy chooses again.
    fn evict_slot(&mut self, slot: Slot, second_chance: bool) -> Option<u64> {
        self.drop_candidate(slot);
        if second_chance && self.read_through_fast_path(slot) {
            // Out of the policy since the top: a candidate again with the read.
            self.time_read(slot);
            let len = self.block_of(self.table.get(slot).expect("live")).len;
            self.add_candidate(slot, len);
            return None;
        }
        if self.kept_for_fast_readers_now(slot, true) {
            return None;
        }
        let (victim, len) = {
            let entry = self.table.get(slot).expect("candidate is live");
            let victim = Victim {
                id: entry.id,
                location: ObjectLocation {
                    offset: entry.offset,
                    data_size: entry.data_size,
                    meta_size: entry.meta_size,
                },
                access: entry.access.get(),
            };
            (victim, self.block_of(entry).len)
        };
        self.evictions += 1;
        self.evicted_bytes += len;
        let verdict = self
            .gate
            .as_mut()
            .map_or(Verdict::Free, |gate| gate.decide(&victim));
        match verdict {
            Verdict::Free => {
                self.remove_slot(slot);
                Some(0)
            }
            Verdict::Hold => {
                self.table.get_mut(slot).expect("live").residency = Residency::Evicting;
                self.evicting_bytes += len;
                Some(len)
            }
        }
    }

    /// A holder finished with an eviction victim: its memory is freed now,
    /// unless a get took a reference meanwhile (then it stays, resident, and
    /// its last release makes it a candidate again). Unknown ids, and
    /// objects not being evicted, are ignored (`false`).
    pub fn finish_eviction(&mut self, id: &ObjectId) -> bool {
        let Some(slot) = self.shift_residency(id, Residency::Evicting, Residency::Resident) else {
            return false;
        };
        if self.table.get(slot).expect("live").refs == 0 {
            self.remove_slot(slot);
            true
        } else {
            // Read meanwhile (through the socket): it stays, visible again
            // to the fast path.
            self.publish(slot);
            false
        }
    }

    /// A holder could not take a victim out (its tier is full or failing):
    /// the object stays in memory, `Kept` — no candidate, so the policy does
    /// not pick it again at once — until [`readmit`](Self::readmit). A
    /// delete that came meanwhile frees it now. Returns whether `id` was
    /// being evicted.
    pub fn cancel_eviction(&mut self, id: &ObjectId) -> bool {
        let Some(slot) = self.shift_residency(id, Residency::Evicting, Residency::Kept) else {
            return false;
        };
        // Creates waiting for these bytes must look again (and fail or evict
        // something else) instead of waiting for an eviction that is over.
        self.space_changed = true;
        let entry = self.table.get(slot).expect("live");
        if entry.refs == 0 && entry.delete_pending {
            self.remove_slot(slot);
        } else {
            self.publish(slot);
        }
        true
    }

    /// A `Kept` object may be evicted again (its tier recovered, or a copy
    /// now exists below so evicting it needs no write). Returns whether it
    /// was kept.
    pub fn readmit(&mut self, id: &ObjectId) -> bool {
        let Some(slot) = self.shift_residency(id, Residency::Kept, Residency::Resident) else {
            return false;
        };
        let entry = self.table.get(slot).expect("live");
        if Self::is_candidate(entry) {
            let len = self.block_of(entry).len;
            self.add_candidate(slot, len);
        }
        true
    }

    /// Moves `id` from residency `from` to `to` (leaving `Evicting` also
    /// takes its bytes off the evicting total). `None`, and nothing changed,
    /// for an unknown id or one not in `from`.
    fn shift_residency(&mut self, id: &ObjectId, from: Residency, to: Residency) -> Option<Slot> {
        let slot = self.table.find(id)?;
        let entry = self.table.get_mut(slot).expect("found slot is live");
        if entry.residency != from {
            return None;
        }
        entry.residency = to;
        if from == Residency::Evicting {
            let len = self.block_of(self.table.get(slot).expect("live")).len;
            self.evicting_bytes -= len;
        }
        Some(slot)
    }

    /// Evicts one object now if it is an eviction candidate (sealed,
    /// unreferenced, in memory), as the gate decides. Returns its block's
    /// bytes, or why it cannot be evicted.
    pub fn evict_object(&mut self, id: &ObjectId) -> Result<u64> {
        let slot = self.visible_slot(id)?;
        let entry = self.table.get(slot).expect("found slot is live");
        if !Self::is_candidate(entry) {
            return Err(ShoalError::new(
                ErrorKind::ObjectInUse,
                format!("object {id} is referenced or already leaving memory"),
            ));
        }
        let len = self.block_of(entry).len;
        match self.evict_slot(slot, false) {
            Some(_) => Ok(len),
            None => Err(ShoalError::new(
                ErrorKind::ObjectInUse,
                format!("object {id} is referenced"),
            )),
        }
    }

    /// Evicts unreferenced sealed objects in policy order until at least
    /// `bytes` are freed or held for freeing (or nothing is left to evict).
    /// Returns those bytes.
    pub fn evict(&mut self, bytes: u64) -> u64 {
        if bytes > 0 && !self.adopted.is_empty() {
            self.sweep_fast_readers();
        }
        let mut freed = 0;
        while freed < bytes {
            let Some(victim) = self.next_victim() else {
                break;
            };
            let len = self
                .table
                .get(victim)
                .map(|e| self.block_of(e).len)
                .unwrap_or(0);
            if self.evict_slot(victim, true).is_some() {
                freed += len;
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{id, store, HoldAll};
    use super::*;
    use crate::object_table::Access;
    use shoal_core::event::ObjectEvent;

    /// Four sealed, unreferenced 64-byte objects in a store of four, LRU
    /// order 0, 1, 2, 3.
    fn full_of_four() -> Store {
        let mut s = store(64 * 4);
        for n in 0..4 {
            s.create(1, id(n), 64, 0).unwrap();
            s.seal(1, &[id(n)], true).unwrap();
        }
        s
    }

    /// Which of ids 0..=9 are in memory.
    fn resident(s: &Store) -> Vec<u8> {
        (0..10).filter(|&n| s.contains(&id(n))).collect()
    }

    #[test]
    fn cooled_objects_leave_before_the_policy_order_most_recently_cooled_first() {
        let mut s = full_of_four();
        s.cool(&id(2)).unwrap();
        s.cool(&id(1)).unwrap();
        s.check_invariants();
        assert_eq!(s.stats().evictable, 4, "cooled objects stay candidates");
        s.create(1, id(10), 64, 0).unwrap();
        assert_eq!(resident(&s), [0, 2, 3], "the last cooled left first");
        s.create(1, id(11), 64, 0).unwrap();
        assert_eq!(resident(&s), [0, 3]);
        s.create(1, id(12), 64, 0).unwrap();
        assert_eq!(resident(&s), [3], "then the policy's order");
        s.check_invariants();
    }

    #[test]
    fn a_read_warms_a_cooled_object_and_a_held_one_cools_at_its_release() {
        let mut s = full_of_four();
        s.cool(&id(0)).unwrap();
        s.get(2, &id(0)).unwrap();
        s.release(2, &id(0)).unwrap(); // read after the cool: LRU order 1, 2, 3, 0
        s.get(2, &id(3)).unwrap();
        s.cool(&id(3)).unwrap(); // referenced: cold from its release on
        s.check_invariants();
        s.create(1, id(10), 64, 0).unwrap();
        assert_eq!(resident(&s), [0, 2, 3], "3 is held; 0 is warm again");
        s.release(2, &id(3)).unwrap();
        s.create(1, id(11), 64, 0).unwrap();
        assert_eq!(resident(&s), [0, 2], "3 left first once released");
        s.check_invariants();
    }

    #[test]
    fn cooling_an_unknown_or_unsealed_object_is_refused_and_changes_nothing() {
        let mut s = full_of_four();
        s.delete(&id(3)).unwrap();
        s.create(1, id(5), 64, 0).unwrap();
        for absent in [id(3), id(5), id(9)] {
            let err = s.cool(&absent).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
        }
        s.check_invariants();
        s.seal(1, &[id(5)], true).unwrap();
        s.create(1, id(10), 64, 0).unwrap();
        assert_eq!(resident(&s), [1, 2, 5], "0 left: plain LRU order");
    }

    #[test]
    fn full_store_evicts_lru_and_never_referenced() {
        let mut s = store(64 * 4);
        for n in 0..4 {
            s.create(1, id(n), 64, 0).unwrap();
            s.seal(1, &[id(n)], n != 0).unwrap(); // id(0) stays referenced
        }
        s.get(2, &id(1)).unwrap();
        s.release(2, &id(1)).unwrap(); // LRU order now: 2, 3, 1
        s.create(1, id(10), 64, 0).unwrap();
        assert!(!s.contains(&id(2)) && s.contains(&id(3)));
        s.create(1, id(11), 64, 0).unwrap();
        assert!(!s.contains(&id(3)) && s.contains(&id(1)) && s.contains(&id(0)));
        assert_eq!(s.stats().evictions, 2);
        s.seal(1, &[id(10), id(11)], true).unwrap();
        s.get(2, &id(10)).unwrap();
        s.get(2, &id(11)).unwrap();
        // Everything referenced or unsealed: a clear error, nothing evicted.
        s.get(2, &id(1)).unwrap();
        let err = s.create(1, id(12), 64, 0).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::StoreFull);
        assert_eq!(s.stats().evictions, 2);
        s.check_invariants();
    }

    fn held_store(size: u64) -> (Store, std::rc::Rc<std::cell::RefCell<Vec<Victim>>>) {
        let mut s = store(size);
        let victims = std::rc::Rc::default();
        s.set_eviction_gate(Box::new(HoldAll(std::rc::Rc::clone(&victims))));
        (s, victims)
    }

    #[test]
    fn a_victim_carries_its_reads_on_the_access_clock() {
        let (mut s, victims) = held_store(64 * 3);
        for n in 0..3 {
            s.create(1, id(n), 64, 0).unwrap();
            s.seal(1, &[id(n)], true).unwrap();
        }
        // Each get ticks the clock: id 0 is read at 1 and 4, id 1 at 2, id 2
        // at 3 (the creator's own reference is no read).
        for n in [0, 1, 2, 0] {
            s.get(2, &id(n)).unwrap();
            s.release(2, &id(n)).unwrap();
        }
        // A copy taken by the daemon (a drain) is no read.
        s.get_for_copy(3, &id(1)).unwrap();
        s.release(3, &id(1)).unwrap();
        s.set_capacity(0);
        let seen: Vec<(u8, Access)> = victims
            .borrow()
            .iter()
            .map(|v| (v.id.0[0], v.access))
            .collect();
        assert_eq!(
            seen,
            [
                (
                    2,
                    Access {
                        last: 3,
                        interval: 0
                    }
                ),
                (
                    0,
                    Access {
                        last: 4,
                        interval: 3
                    }
                ),
                // Last in LRU order (the copy released it last), its reads
                // unchanged.
                (
                    1,
                    Access {
                        last: 2,
                        interval: 0
                    }
                ),
            ]
        );
    }

    #[test]
    fn a_restored_object_takes_back_the_reads_it_left_with() {
        let (mut s, victims) = held_store(64);
        s.create(1, id(0), 64, 0).unwrap();
        s.seal(1, &[id(0)], true).unwrap();
        for _ in 0..2 {
            s.get(2, &id(0)).unwrap(); // reads at 1 and 2
            s.release(2, &id(0)).unwrap();
        }
        s.set_capacity(0);
        assert!(s.finish_eviction(&id(0)), "the holder copied it out");
        assert!(!s.contains(&id(0)));
        s.set_capacity(64);
        // Restored (created again under its id): a read at 3 measures the
        // interval from its last read before the eviction.
        s.create(1, id(0), 64, 0).unwrap();
        s.seal(1, &[id(0)], true).unwrap();
        s.get(2, &id(0)).unwrap();
        s.release(2, &id(0)).unwrap();
        s.set_capacity(0);
        let last = victims.borrow().last().copied().expect("evicted again");
        assert_eq!(
            last.access,
            Access {
                last: 3,
                interval: 1
            }
        );
    }

    #[test]
    fn a_held_victim_keeps_its_memory_until_the_holder_finishes() {
        let (mut s, victims) = held_store(64 * 2);
        for n in 0..2 {
            s.create(1, id(n), 64, 0).unwrap();
            s.seal(1, &[id(n)], true).unwrap();
        }
        let err = s.create(1, id(9), 64, 0).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::StoreFull, "memory comes back later");
        assert_eq!(victims.borrow().len(), 1, "one victim covers the request");
        let victim = victims.borrow()[0];
        assert_eq!(victim.id, id(0), "LRU order");
        assert!(
            s.contains(&id(0)),
            "still visible while its bytes are copied"
        );
        assert_eq!(s.evicting_bytes(), 64);
        assert_eq!(s.residency(&id(0)), Some(Residency::Evicting));
        assert_eq!(s.residency(&id(1)), Some(Residency::Resident));
        assert!(!s
            .take_events()
            .iter()
            .any(|e| matches!(e, ObjectEvent::Removed { .. })));
        s.check_invariants();
        // Asking again chooses no second victim: the first one covers it.
        assert!(s.create(1, id(9), 64, 0).is_err());
        assert_eq!(victims.borrow().len(), 1);
        assert!(s.finish_eviction(&id(0)));
        assert!(!s.contains(&id(0)));
        assert_eq!(s.residency(&id(0)), None);
        assert!(s.take_space_changed());
        assert_eq!(
            s.take_events(),
            vec![ObjectEvent::Removed {
                id: id(0),
                deleted: false
            }]
        );
        s.create(1, id(9), 64, 0).unwrap();
        s.check_invariants();
    }

    #[test]
    fn a_get_during_an_eviction_keeps_the_object() {
        let (mut s, _) = held_store(64 * 2);
        for n in 0..2 {
            s.create(1, id(n), 64, 0).unwrap();
            s.seal(1, &[id(n)], true).unwrap();
        }
        assert_eq!(s.evict(64), 64);
        let location = s.get(2, &id(0)).expect("visible while evicting");
        assert!(!s.finish_eviction(&id(0)), "referenced: it stays");
        assert_eq!(s.get(3, &id(0)), Some(location));
        s.release(2, &id(0)).unwrap();
        s.release(3, &id(0)).unwrap();
        s.check_invariants();
        assert_eq!(s.stats().evictable, 2, "a candidate again");
        assert!(!s.finish_eviction(&id(0)), "a second finish is ignored");
        assert!(!s.finish_eviction(&id(7)), "unknown ids are ignored");
        s.check_invariants();
    }

    #[test]
    fn a_delete_during_an_eviction_frees_when_the_holder_finishes() {
        let (mut s, _) = held_store(64 * 2);
        s.create(1, id(0), 64, 0).unwrap();
        s.seal(1, &[id(0)], true).unwrap();
        assert_eq!(s.evict(1), 64);
        s.delete(&id(0)).unwrap();
        assert!(!s.contains(&id(0)));
        assert_eq!(s.stats().used, 64, "the holder still reads it");
        s.check_invariants();
        assert!(s.finish_eviction(&id(0)));
        assert_eq!(s.stats().used, 0);
        let removals = s
            .take_events()
            .into_iter()
            .filter(|e| matches!(e, ObjectEvent::Removed { .. }))
            .collect::<Vec<_>>();
        assert_eq!(
            removals,
            vec![ObjectEvent::Removed {
                id: id(0),
                deleted: true
            }]
        );
        s.check_invariants();
    }

    #[test]
    fn a_cancelled_eviction_keeps_the_object_out_of_the_candidates_until_readmitted() {
        let mut s = store(64 * 2);
        let held = std::rc::Rc::default();
        s.set_eviction_gate(Box::new(HoldAll(std::rc::Rc::clone(&held))));
        for n in 0..2 {
            s.create(1, id(n), 64, 0).unwrap();
            s.seal(1, &[id(n)], true).unwrap();
        }
        assert!(s.create(1, id(2), 64, 0).is_err(), "victim held, not freed");
        assert_eq!(s.evicting_bytes(), 64);
        assert!(s.cancel_eviction(&id(0)));
        assert!(s.contains(&id(0)) && s.evicting_bytes() == 0);
        assert!(s.take_space_changed(), "waiting creates look again");
        s.check_invariants();
        // Kept: the next create evicts id(1), not id(0) again.
        assert!(s.create(1, id(2), 64, 0).is_err());
        assert!(s.finish_eviction(&id(1)));
        s.create(1, id(2), 64, 0).unwrap();
        s.seal(1, &[id(2)], true).unwrap();
        assert!(s.contains(&id(0)));
        assert!(s.readmit(&id(0)));
        assert!(!s.readmit(&id(0)), "only once");
        assert_eq!(s.evict(64), 64, "a candidate again");
        s.check_invariants();
        // A delete of a kept object frees it.
        s.cancel_eviction(&id(0));
        s.delete(&id(0)).unwrap();
        assert!(!s.contains(&id(0)));
        s.check_invariants();
    }
}
