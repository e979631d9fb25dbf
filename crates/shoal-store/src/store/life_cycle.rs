//! The object life cycle: create → write → seal → get/release → delete (and
//! abort, and a transfer's hold on an object still being written), each a
//! synchronous state transition that validates first and mutates only when
//! it will succeed; and the lookups of where an object stands in it.

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::event::ObjectEvent;
use shoal_core::ids::{ClientId, ObjectId};
use shoal_core::location::ObjectLocation;

use crate::object_table::{Entry, ObjectState, Residency, Slot};

use super::{Placement, Store};

impl Store {
    /// Creates an unsealed object and gives its creator one reference.
    /// Evicts unreferenced sealed objects (LRU first) if space is short.
    pub fn create(
        &mut self,
        client: ClientId,
        id: ObjectId,
        data_size: u64,
        meta_size: u32,
    ) -> Result<ObjectLocation> {
        self.create_placed(client, id, data_size, meta_size, Placement::Packed)
    }

    /// [`create`](Self::create) with its block placed as `placement` says.
    pub fn create_placed(
        &mut self,
        client: ClientId,
        id: ObjectId,
        data_size: u64,
        meta_size: u32,
        placement: Placement,
    ) -> Result<ObjectLocation> {
        if self.table.find(&id).is_some() {
            return Err(ShoalError::exists(&id));
        }
        let total = data_size.checked_add(meta_size as u64).ok_or_else(|| {
            ShoalError::invalid(format!(
                "object {id}: size {data_size} + {meta_size} overflows"
            ))
        })?;
        let len = self.padded_len(&id, total)?;
        let block = self.allocate(len, placement).ok_or_else(|| {
            let coming = if self.evicting_bytes > 0 {
                format!(", {} bytes on their way out", self.evicting_bytes)
            } else {
                String::new()
            };
            ShoalError::new(
                ErrorKind::StoreFull,
                format!(
                    "no room for object {id} ({total} bytes): {} of {} bytes used, {} bytes in referenced or unsealed objects{coming}",
                    self.allocator.used(),
                    self.capacity,
                    self.pinned_bytes()
                ),
            )
        })?;
        let location = ObjectLocation {
            offset: block.offset,
            data_size,
            meta_size,
        };
        self.insert_created(client, id, location);
        if placement == Placement::Growing {
            let slot = self.table.find(&id).expect("just created");
            self.growing.insert(block.offset + block.len, (slot, id));
        }
        Ok(location)
    }

    /// Enters object `id` at `location` (allocated) as unsealed, written by
    /// `client`, which holds one reference to it.
    pub(super) fn insert_created(
        &mut self,
        client: ClientId,
        id: ObjectId,
        location: ObjectLocation,
    ) -> Slot {
        let slot = self.table.insert(Entry::new(
            id,
            location.offset,
            location.data_size,
            location.meta_size,
            1,
            client,
            ObjectState::Created,
            // A restore brings back the history its object left with.
            self.ghosts.take(&id).unwrap_or_default(),
        ));
        self.note_creating(&id, true);
        let state = self.client(client);
        state.creating.insert(slot);
        *state.refs.entry(slot).or_insert(0) += 1;
        slot
    }

    /// Creates several objects, all or none: on the first failure the ones
    /// already made are aborted and the error is returned.
    pub fn create_batch(
        &mut self,
        client: ClientId,
        specs: &[(ObjectId, u64, u32)],
    ) -> Result<Vec<ObjectLocation>> {
        self.create_batch_placed(client, specs, Placement::Packed)
    }

    /// [`create_batch`](Self::create_batch) with each block placed as
    /// `placement` says.
    pub fn create_batch_placed(
        &mut self,
        client: ClientId,
        specs: &[(ObjectId, u64, u32)],
        placement: Placement,
    ) -> Result<Vec<ObjectLocation>> {
        let mut made = Vec::with_capacity(specs.len());
        for (id, data_size, meta_size) in specs {
            match self.create_placed(client, *id, *data_size, *meta_size, placement) {
                Ok(location) => made.push(location),
                Err(err) => {
                    // Rolled back silently: these objects never existed for
                    // anyone but this call (no Aborted event: a cluster node
                    // must not unregister ids its create still holds).
                    let events = self.events.len();
                    for (id, _, _) in &specs[..made.len()] {
                        let slot = self.own_unsealed(client, id).expect("just created");
                        self.abort_slot(client, slot);
                    }
                    self.events.truncate(events);
                    return Err(err);
                }
            }
        }
        Ok(made)
    }

    /// Removes an object and frees its memory (no references may remain;
    /// the caller made sure it is no eviction candidate any more).
    pub(super) fn remove_slot(&mut self, slot: Slot) {
        let entry = self.table.remove(slot);
        if let (Some(position), Some(readers)) = (entry.fast_position(), self.readers.as_mut()) {
            // Callers look for fast-path readers first; an entry still
            // published here would be a bug, and must not stay visible.
            debug_assert!(false, "{} freed while published", entry.id);
            readers.index_mut().unpublish(position);
        }
        debug_assert_eq!(entry.refs, 0, "removing referenced object {}", entry.id);
        debug_assert_ne!(
            entry.residency,
            Residency::Evicting,
            "{} still held",
            entry.id
        );
        let block = self.block_of(&entry);
        self.allocator.free(block);
        self.space_changed = true;
        // A pending delete was announced when it was requested.
        if entry.state == ObjectState::Sealed && !entry.delete_pending {
            // Evicted: it lives on below, and so does its read history.
            self.ghosts.remember(entry.id, entry.access);
            self.events.push(ObjectEvent::Removed {
                id: entry.id,
                deleted: false,
            });
        }
    }

    pub(super) fn own_unsealed(&self, client: ClientId, id: &ObjectId) -> Result<Slot> {
        let slot = self
            .table
            .find(id)
            .ok_or_else(|| ShoalError::not_found(id))?;
        let entry = self.table.get(slot).expect("found slot is live");
        if entry.state == ObjectState::Sealed {
            return Err(ShoalError::new(
                ErrorKind::ObjectAlreadySealed,
                format!("object {id} is already sealed"),
            ));
        }
        if entry.delete_pending {
            // Aborted while a transfer still holds it (`hold_unsealed`).
            return Err(ShoalError::not_found(id));
        }
        if entry.creator != client {
            return Err(ShoalError::new(
                ErrorKind::NotOwner,
                format!("object {id} is being written by another client"),
            ));
        }
        Ok(slot)
    }

    /// Seals objects this client created. All or nothing: if any id fails
    /// validation none is sealed. With `release`, the creator's reference is
    /// dropped at once (the put path).
    pub fn seal(&mut self, client: ClientId, ids: &[ObjectId], release: bool) -> Result<()> {
        let mut slots = Vec::with_capacity(ids.len());
        for id in ids {
            slots.push(self.own_unsealed(client, id)?);
        }
        // Each slot leaves the creator's set once: a second removal is a
        // duplicate id, and the set is put back as it was.
        let state = self.client(client);
        if let Some(twice) = slots.iter().position(|slot| !state.creating.remove(slot)) {
            state.creating.extend(&slots[..twice]);
            return Err(ShoalError::invalid(format!(
                "object {} appears twice in one seal",
                ids[twice]
            )));
        }
        let state = self.client(client);
        if !state.from_lease.is_empty() {
            for slot in &slots {
                state.from_lease.remove(slot);
            }
        }
        for (slot, id) in slots.iter().zip(ids) {
            let entry = self.table.get_mut(*slot).expect("validated");
            entry.state = ObjectState::Sealed;
            let (data_size, meta_size) = (entry.data_size, entry.meta_size);
            self.events.push(ObjectEvent::Sealed {
                id: *id,
                data_size,
                meta_size,
            });
        }
        for (&slot, id) in slots.iter().zip(ids) {
            self.publish(slot);
            // Only now out of the creating filter: a client's lent create
            // checks the filter, then the index, and must find the id in
            // one of them (decremented first, a create of the id just
            // sealed slipped between them and was refused only at its seal:
            // shoal-client's fast_path test, 1 run in ~10).
            self.note_creating(id, false);
            // The creator may have dropped its reference before sealing.
            let entry = self.table.get(slot).expect("validated");
            if Self::is_candidate(entry) {
                let len = self.block_of(entry).len;
                self.add_candidate(slot, len);
            }
        }
        if release {
            // The creator's reference may already be gone (a client library
            // that released its create buffer before sealing): sealing still
            // succeeds and there is nothing left to release.
            for (slot, id) in slots.iter().zip(ids) {
                if self.client(client).refs.contains_key(slot) {
                    self.release_slot(client, *slot, id)?;
                }
            }
        }
        Ok(())
    }

    /// Drops an object its creator has not sealed; its memory is free at once.
    pub fn abort(&mut self, client: ClientId, id: &ObjectId) -> Result<()> {
        let slot = self.own_unsealed(client, id)?;
        self.abort_slot(client, slot);
        Ok(())
    }

    fn abort_slot(&mut self, client: ClientId, slot: Slot) {
        let state = self.client(client);
        state.creating.remove(&slot);
        let held = state.refs.remove(&slot).unwrap_or(0);
        let lease = state.from_lease.remove(&slot);
        let entry = self.table.get_mut(slot).expect("aborting a live slot");
        entry.refs -= held;
        let id = entry.id;
        self.note_creating(&id, false);
        match lease {
            // Created in lent space: the bytes go back to the lease.
            Some(lease) => self.return_to_lease(client, slot, lease),
            None => self.drop_unsealed(slot),
        }
        self.events.push(ObjectEvent::Aborted { id });
    }

    /// Frees an aborted object's memory, unless a transfer still holds it
    /// ([`hold_unsealed`](Self::hold_unsealed)): then it is gone from view
    /// now and its memory is freed when the last holder releases it.
    pub(super) fn drop_unsealed(&mut self, slot: Slot) {
        let entry = self.table.get_mut(slot).expect("aborting a live slot");
        if entry.refs > 0 {
            entry.delete_pending = true;
        } else {
            self.remove_slot(slot);
        }
    }

    /// Takes a reference for `holder` to an object `creator` is still
    /// writing, so its memory stays allocated while `holder` writes into it
    /// from another thread: if the creator aborts meanwhile (or goes), the
    /// object leaves view at once but its memory is freed only when the
    /// last holder releases it. A node receiving a peer's bytes into an
    /// object that peer allocated there holds it for the transfer. Refused
    /// (changing nothing) if `id` is not `creator`'s unsealed object, or
    /// was created in lent space.
    pub fn hold_unsealed(
        &mut self,
        holder: ClientId,
        creator: ClientId,
        id: &ObjectId,
    ) -> Result<ObjectLocation> {
        let slot = self.own_unsealed(creator, id)?;
        if self
            .clients
            .get(&creator)
            .is_some_and(|state| state.from_lease.contains_key(&slot))
        {
            return Err(ShoalError::invalid(format!(
                "object {id} was created in lent space"
            )));
        }
        let entry = self.table.get_mut(slot).expect("found slot is live");
        entry.refs += 1;
        let location = ObjectLocation {
            offset: entry.offset,
            data_size: entry.data_size,
            meta_size: entry.meta_size,
        };
        *self.client(holder).refs.entry(slot).or_insert(0) += 1;
        Ok(location)
    }

    /// Looks an id up and, if it is sealed and visible, takes a reference for
    /// the client. `None` means "not (yet) available": the caller may wait.
    pub fn get(&mut self, client: ClientId, id: &ObjectId) -> Option<ObjectLocation> {
        self.get_with_creator(client, id)
            .map(|(location, _)| location)
    }

    /// [`get`](Self::get), also naming the client that created (and so
    /// wrote) the object: a cluster node tells its objects written by other
    /// nodes' clients apart by it.
    pub fn get_with_creator(
        &mut self,
        client: ClientId,
        id: &ObjectId,
    ) -> Option<(ObjectLocation, ClientId)> {
        self.take_reference(client, id, true)
    }

    /// A reference for the daemon's own copy of the bytes (a drain writing
    /// them to a tier): like [`get`](Self::get), but no read of the object,
    /// so its access history ([`Access`](crate::object_table::Access)) stays the clients'.
    pub fn get_for_copy(&mut self, client: ClientId, id: &ObjectId) -> Option<ObjectLocation> {
        self.take_reference(client, id, false)
            .map(|(location, _)| location)
    }

    fn take_reference(
        &mut self,
        client: ClientId,
        id: &ObjectId,
        read: bool,
    ) -> Option<(ObjectLocation, ClientId)> {
        let slot = self.table.find(id)?;
        let entry = self.table.get_mut(slot).expect("found slot is live");
        if !entry.is_visible() {
            return None;
        }
        let was_candidate = Self::is_candidate(entry);
        entry.refs += 1;
        if read {
            self.access_clock += 1;
            entry.access.record(self.access_clock);
        }
        let location = ObjectLocation {
            offset: entry.offset,
            data_size: entry.data_size,
            meta_size: entry.meta_size,
        };
        let creator = entry.creator;
        if was_candidate {
            let len = self
                .allocator
                .block_len(location.size())
                .expect("sizes were checked at create");
            self.leave_candidates(slot);
            self.evictable_bytes -= len;
        }
        if read {
            self.uncool(slot);
        }
        self.policy.touch(slot);
        *self.client(client).refs.entry(slot).or_insert(0) += 1;
        Some((location, creator))
    }

    /// Drops one of the client's references to `id`.
    pub fn release(&mut self, client: ClientId, id: &ObjectId) -> Result<()> {
        let slot = self
            .table
            .find(id)
            .ok_or_else(|| ShoalError::not_found(id))?;
        self.release_slot(client, slot, id)
    }

    pub(super) fn release_slot(
        &mut self,
        client: ClientId,
        slot: Slot,
        id: &ObjectId,
    ) -> Result<()> {
        let state = self.client(client);
        match state.refs.get_mut(&slot) {
            None => {
                return Err(ShoalError::invalid(format!(
                    "client holds no reference to object {id}"
                )));
            }
            Some(count) if *count > 1 => *count -= 1,
            Some(_) => {
                state.refs.remove(&slot);
            }
        }
        self.drop_ref(slot);
        Ok(())
    }

    pub(super) fn drop_ref(&mut self, slot: Slot) {
        let entry = self.table.get_mut(slot).expect("referenced slot is live");
        entry.refs -= 1;
        if entry.refs > 0 || entry.residency == Residency::Evicting {
            // (A victim's holder frees it when done.)
            return;
        }
        if entry.delete_pending {
            if !self.kept_for_fast_readers_now(slot, false) {
                self.remove_slot(slot);
            }
        } else if entry.state == ObjectState::Sealed && entry.residency == Residency::Resident {
            let len = self.block_of(self.table.get(slot).expect("live")).len;
            self.add_candidate(slot, len);
        }
    }

    /// Deletes a sealed object. A referenced one disappears from view now and
    /// is freed when its last reference is released (one being evicted,
    /// when its holder finishes).
    pub fn delete(&mut self, id: &ObjectId) -> Result<()> {
        // Gone for good, in memory or not: a future object under this id
        // starts without history.
        self.ghosts.forget(id);
        let slot = self
            .table
            .find(id)
            .ok_or_else(|| ShoalError::not_found(id))?;
        let entry = self.table.get_mut(slot).expect("found slot is live");
        if entry.state != ObjectState::Sealed {
            return Err(ShoalError::new(
                ErrorKind::ObjectNotSealed,
                format!("object {id} is not sealed; its creator may abort it"),
            ));
        }
        if entry.delete_pending {
            return Err(ShoalError::not_found(id));
        }
        // Announced now, referenced or not (`remove_slot` stays silent).
        if Self::is_candidate(entry) {
            self.drop_candidate(slot);
        }
        let entry = self.table.get_mut(slot).expect("found slot is live");
        entry.delete_pending = true;
        let free_now = entry.refs == 0 && entry.residency != Residency::Evicting;
        let position = entry.fast_position();
        self.events.push(ObjectEvent::Removed {
            id: *id,
            deleted: true,
        });
        if free_now {
            if !self.kept_for_fast_readers_now(slot, false) {
                self.remove_slot(slot);
            }
        } else if let (Some(position), Some(readers)) = (position, self.readers.as_mut()) {
            // Gone from view now; its readers are looked for when the last
            // reference goes.
            readers.index_mut().unpublish(position);
        }
        Ok(())
    }

    /// Where a sealed, visible object lives (no reference taken).
    pub fn location(&self, id: &ObjectId) -> Option<ObjectLocation> {
        let entry = self.table.get(self.table.find(id)?)?;
        entry.is_visible().then_some(ObjectLocation {
            offset: entry.offset,
            data_size: entry.data_size,
            meta_size: entry.meta_size,
        })
    }

    /// The client that created `id` (and so wrote it), if it is visible.
    pub fn creator(&self, id: &ObjectId) -> Option<ClientId> {
        let entry = self.table.get(self.table.find(id)?)?;
        entry.is_visible().then_some(entry.creator)
    }

    /// Whether `id` exists and is still being written (not aborted while
    /// a transfer holds it).
    pub fn is_unsealed(&self, id: &ObjectId) -> bool {
        self.table
            .find(id)
            .and_then(|s| self.table.get(s))
            .is_some_and(|e| e.state == ObjectState::Created && !e.delete_pending)
    }

    /// Where a visible object's bytes stand: `None` if it is not visible
    /// (unknown, unsealed, deleted, or gone from memory).
    pub fn residency(&self, id: &ObjectId) -> Option<Residency> {
        self.table
            .find(id)
            .and_then(|s| self.table.get(s))
            .filter(|e| e.is_visible())
            .map(|e| e.residency)
    }

    /// Whether `id` has an entry here in any state (being created included).
    pub fn knows(&self, id: &ObjectId) -> bool {
        self.table.find(id).is_some()
    }

    /// Whether `id`'s entry here is a deleted object that references still
    /// keep (its memory goes with the last one): known, but no longer held.
    pub fn is_deleted(&self, id: &ObjectId) -> bool {
        self.table
            .find(id)
            .and_then(|s| self.table.get(s))
            .is_some_and(|e| e.delete_pending)
    }

    pub fn contains(&self, id: &ObjectId) -> bool {
        self.table
            .find(id)
            .and_then(|s| self.table.get(s))
            .is_some_and(Entry::is_visible)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{id, store};
    use super::*;

    #[test]
    fn life_cycle() {
        let mut s = store(4096);
        let loc = s.create(1, id(1), 100, 10).unwrap();
        assert_eq!(loc.offset % 64, 0);
        assert!(!s.contains(&id(1)));
        assert_eq!(s.get(2, &id(1)), None, "unsealed objects are invisible");
        s.seal(1, &[id(1)], false).unwrap();
        assert!(s.contains(&id(1)));
        assert_eq!(s.get(2, &id(1)), Some(loc));
        s.release(1, &id(1)).unwrap();
        s.release(2, &id(1)).unwrap();
        s.check_invariants();
        s.delete(&id(1)).unwrap();
        assert!(!s.contains(&id(1)));
        assert_eq!(s.stats().used, 0);
        let events = s.take_events();
        assert_eq!(events.len(), 2);
        s.check_invariants();
    }

    #[test]
    fn bad_requests_change_nothing() {
        let mut s = store(4096);
        s.create(1, id(1), 10, 0).unwrap();
        let before = s.list();
        assert_eq!(
            s.create(2, id(1), 10, 0).unwrap_err().kind(),
            ErrorKind::ObjectExists
        );
        assert_eq!(
            s.seal(2, &[id(1)], false).unwrap_err().kind(),
            ErrorKind::NotOwner
        );
        assert_eq!(s.abort(2, &id(1)).unwrap_err().kind(), ErrorKind::NotOwner);
        assert_eq!(
            s.seal(1, &[id(9)], false).unwrap_err().kind(),
            ErrorKind::ObjectNotFound
        );
        assert_eq!(
            s.seal(1, &[id(1), id(9)], false).unwrap_err().kind(),
            ErrorKind::ObjectNotFound
        );
        assert_eq!(
            s.seal(1, &[id(1), id(1)], false).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            s.delete(&id(1)).unwrap_err().kind(),
            ErrorKind::ObjectNotSealed
        );
        assert_eq!(
            s.create(1, id(2), 5000, 0).unwrap_err().kind(),
            ErrorKind::ObjectTooLarge
        );
        assert_eq!(
            s.create(1, id(2), u64::MAX, 10).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            s.release(3, &id(1)).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(s.list(), before);
        s.seal(1, &[id(1)], false).unwrap();
        assert_eq!(
            s.seal(1, &[id(1)], false).unwrap_err().kind(),
            ErrorKind::ObjectAlreadySealed
        );
        assert_eq!(
            s.abort(1, &id(1)).unwrap_err().kind(),
            ErrorKind::ObjectAlreadySealed
        );
        s.check_invariants();
    }

    #[test]
    fn a_get_names_the_client_that_wrote_the_object() {
        let mut s = store(4096);
        let loc = s.create(7, id(1), 100, 0).unwrap();
        s.seal(7, &[id(1)], true).unwrap();
        assert_eq!(s.get_with_creator(2, &id(1)), Some((loc, 7)));
        assert_eq!(s.get(2, &id(1)), Some(loc));
        assert_eq!(s.list()[0].refs, 2);
        s.check_invariants();
    }

    #[test]
    fn seal_and_release_after_the_creator_already_released() {
        let mut s = store(4096);
        s.create(1, id(1), 10, 0).unwrap();
        s.create(1, id(2), 10, 0).unwrap();
        s.release(1, &id(1)).unwrap(); // the creator's buffer went first
        s.seal(1, &[id(1), id(2)], true).unwrap();
        assert_eq!(s.stats().objects, 2);
        assert!(s.list().iter().all(|o| o.refs == 0 && o.sealed));
        // Both are now evictable, like any unreferenced sealed object.
        assert_eq!(s.evict(128), 128);
        s.check_invariants();
    }

    #[test]
    fn batch_create_is_all_or_nothing() {
        let mut s = store(4096);
        s.create(1, id(3), 10, 0).unwrap();
        let err = s
            .create_batch(1, &[(id(1), 10, 0), (id(2), 10, 0), (id(3), 10, 0)])
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectExists);
        assert!(s.table.find(&id(1)).is_none() && s.table.find(&id(2)).is_none());
        assert_eq!(
            s.create_batch(1, &[(id(1), 10, 0), (id(2), 10, 0)])
                .unwrap()
                .len(),
            2
        );
        s.check_invariants();
    }

    #[test]
    fn delete_while_referenced_is_deferred() {
        let mut s = store(4096);
        s.create(1, id(1), 10, 0).unwrap();
        s.seal(1, &[id(1)], true).unwrap();
        s.get(2, &id(1)).unwrap();
        assert!(!s.is_deleted(&id(1)));
        s.delete(&id(1)).unwrap();
        assert!(!s.contains(&id(1)));
        assert!(
            s.knows(&id(1)) && s.is_deleted(&id(1)),
            "known, but deleted"
        );
        assert_eq!(s.get(3, &id(1)), None);
        assert!(s.stats().used > 0, "memory stays while referenced");
        s.release(2, &id(1)).unwrap();
        assert_eq!(s.stats().used, 0);
        assert!(!s.knows(&id(1)) && !s.is_deleted(&id(1)));
        let removals = s
            .take_events()
            .iter()
            .filter(|e| matches!(e, ObjectEvent::Removed { .. }))
            .count();
        assert_eq!(removals, 1, "one removal notification per object");
        s.check_invariants();
    }

    #[test]
    fn a_held_unsealed_object_outlives_its_abort_until_released() {
        let mut s = store(4096);
        let loc = s.create(1, id(1), 100, 0).unwrap();
        assert_eq!(s.hold_unsealed(9, 1, &id(1)).unwrap(), loc);
        let used = s.used();
        s.abort(1, &id(1)).unwrap();
        // Gone from view, its memory still allocated for the holder.
        assert!(!s.contains(&id(1)) && !s.is_unsealed(&id(1)));
        assert_eq!(s.used(), used);
        assert!(s.list().is_empty());
        let err = s.seal(1, &[id(1)], false).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
        assert_eq!(
            s.abort(1, &id(1)).unwrap_err().kind(),
            ErrorKind::ObjectNotFound
        );
        assert_eq!(
            s.hold_unsealed(9, 1, &id(1)).unwrap_err().kind(),
            ErrorKind::ObjectNotFound
        );
        s.check_invariants();
        s.release(9, &id(1)).unwrap();
        assert_eq!(s.used(), 0);
        assert!(s.table.find(&id(1)).is_none());
        s.check_invariants();

        // The creator disconnects instead: the same.
        s.create(2, id(2), 100, 0).unwrap();
        s.hold_unsealed(9, 2, &id(2)).unwrap();
        s.disconnect(2);
        assert!(s.used() > 0 && s.list().is_empty());
        s.check_invariants();
        s.release(9, &id(2)).unwrap();
        assert_eq!(s.used(), 0);
        s.check_invariants();
    }

    #[test]
    fn a_held_unsealed_object_sealed_by_its_creator_is_an_ordinary_object() {
        let mut s = store(4096);
        s.create(1, id(1), 100, 0).unwrap();
        s.hold_unsealed(9, 1, &id(1)).unwrap();
        s.seal(1, &[id(1)], true).unwrap();
        assert!(s.contains(&id(1)));
        assert_eq!(s.stats().evictable, 0, "held: no eviction candidate");
        s.release(9, &id(1)).unwrap();
        assert_eq!(s.stats().evictable, 1);
        s.check_invariants();
    }

    #[test]
    fn only_the_creators_unsealed_objects_can_be_held() {
        let mut s = store(4096);
        s.create(1, id(1), 100, 0).unwrap();
        let kind = |r: Result<ObjectLocation>| r.unwrap_err().kind();
        assert_eq!(kind(s.hold_unsealed(9, 2, &id(1))), ErrorKind::NotOwner);
        assert_eq!(
            kind(s.hold_unsealed(9, 1, &id(2))),
            ErrorKind::ObjectNotFound
        );
        s.seal(1, &[id(1)], true).unwrap();
        assert_eq!(
            kind(s.hold_unsealed(9, 1, &id(1))),
            ErrorKind::ObjectAlreadySealed
        );
        assert!(!s.has_references(9));
        s.check_invariants();
    }
}
