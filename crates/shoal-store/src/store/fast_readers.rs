//! The fast path's readers (docs/fast-path.md), as the store sees them:
//! sealed objects in memory are published in a shared index that clients
//! read without the daemon, and what clients hold through it is counted in
//! reference tables the store looks at only when it is about to free
//! memory. Here: offering the fast path and attaching reference tables,
//! publishing objects, keeping an object a fast-path reader holds (a
//! reference in [`FAST_READERS`]' name) until its readers are gone
//! ([`Store::sweep_fast_readers`]), and telling the eviction policy of the
//! reads clients made without the daemon ([`Store::record_fast_reads`]).

use shoal_core::error::{Result, ShoalError};
use shoal_core::fast_path::readers::Readers;
use shoal_core::ids::{ClientId, ObjectId};
use shoal_core::location::ObjectLocation;

use crate::object_table::{Entry, Residency, Slot};

use super::{Store, FAST_READERS};

/// Objects [`Store::record_fast_reads`] looks at per call: bounded work on
/// the daemon's thread (a few µs); a larger store is covered over calls.
const FAST_READ_SCAN: usize = 4096;

impl Store {
    /// Offers the fast path: sealed, resident objects are published in a
    /// shared index of `slots` slots from now on (objects sealed before are
    /// published too), and clients may ask for a reference table.
    pub fn enable_fast_reads(&mut self, slots: u32) -> Result<()> {
        self.readers = Some(Readers::new(slots)?);
        let slots: Vec<Slot> = self.table.iter().map(|(slot, _)| slot).collect();
        for slot in slots {
            self.publish(slot);
        }
        Ok(())
    }

    /// Stops offering the fast path (the daemon is stopping): clients'
    /// lookups miss from now on and go to the socket.
    pub fn close_fast_reads(&mut self) {
        if let Some(readers) = self.readers.as_mut() {
            readers.index_mut().close();
        }
    }

    /// The fast path's shared state, if offered.
    pub fn fast_reads(&self) -> Option<&Readers> {
        self.readers.as_ref()
    }

    /// A reference table for `client`: the index's fd and the table's, for
    /// the client to map. `None` without the fast path.
    pub fn add_fast_reader(
        &mut self,
        client: ClientId,
    ) -> Result<Option<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)>> {
        let Some(readers) = self.readers.as_mut() else {
            return Ok(None);
        };
        let dup = |fd: std::os::fd::BorrowedFd<'_>| {
            fd.try_clone_to_owned()
                .map_err(|e| ShoalError::io("dup a fast-path descriptor", e))
        };
        let table = readers.add_client(client)?;
        Ok(Some((dup(readers.index().fd())?, table)))
    }

    /// Attaches another node's reference table (`fd`, a sealed memfd its
    /// daemon made for one of its clients) under `owner`, that node's
    /// principal, and its `key`: the client's counts there keep objects
    /// as a local client's do (docs/fast-path.md "Gets of other nodes'
    /// objects"). Dropped with `owner` ([`disconnect`](Self::disconnect)),
    /// moved with it ([`transfer_client`](Self::transfer_client)).
    pub fn attach_peer_reads(
        &mut self,
        owner: ClientId,
        key: u64,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<()> {
        let Some(readers) = self.readers.as_mut() else {
            return Err(ShoalError::invalid("this node offers no fast path"));
        };
        readers.attach_peer_table(owner, key, fd)
    }

    /// Whether `owner` (a peer's principal) has reference tables attached
    /// here, revoked ones included (they go with it).
    pub fn has_peer_tables(&self, owner: ClientId) -> bool {
        self.readers
            .as_ref()
            .is_some_and(|r| r.has_peer_tables(owner))
    }

    /// Objects kept for fast-path readers: the ones whose readers are all
    /// gone are given back (and freed, if deleted meanwhile). Returns how
    /// many. Cheap when nothing is kept; the daemon calls it periodically
    /// and whenever a client leaves, and eviction calls it first.
    pub fn sweep_fast_readers(&mut self) -> usize {
        let Some(readers) = self.readers.as_ref() else {
            return 0;
        };
        let done: Vec<(u32, Slot)> = self
            .adopted
            .iter()
            .filter(|(position, _)| !readers.held(**position))
            .map(|(p, s)| (*p, *s))
            .collect();
        for (position, slot) in &done {
            self.adopted.remove(position);
            let id = self.table.get(*slot).expect("adopted slot is live").id;
            self.release_slot(FAST_READERS, *slot, &id)
                .expect("adopted objects hold a reference");
        }
        done.len()
    }

    /// Keeps every eviction candidate a fast-path reader holds now (a scan
    /// of the tables of clients that say they hold something; nothing when
    /// none does).
    pub(super) fn keep_held_candidates(&mut self) {
        let Some(readers) = self.readers.as_ref() else {
            return;
        };
        if !readers.any_holding() {
            return;
        }
        let mut held: Vec<Slot> = readers
            .held_positions()
            .into_iter()
            .filter_map(|p| {
                let id = readers.index().live_at(p)?;
                let slot = self.table.find(&id)?;
                let entry = self.table.get(slot)?;
                (entry.fast_position() == Some(p) && Self::is_candidate(entry)).then_some(slot)
            })
            .collect();
        held.sort_unstable();
        held.dedup();
        for slot in held {
            self.drop_candidate(slot);
            if !self.kept_for_fast_readers_now(slot, true) {
                // Let go meanwhile: a candidate again.
                let len = self.block_of(self.table.get(slot).expect("live")).len;
                self.add_candidate(slot, len);
            }
        }
    }

    /// Objects kept for fast-path readers right now.
    pub fn kept_for_fast_readers(&self) -> usize {
        self.adopted.len()
    }

    /// Publishes a sealed, visible object in memory in the shared index (a
    /// no-op without the fast path, for an object already there, or when
    /// the index has no room: readers then ask the daemon).
    pub(super) fn publish(&mut self, slot: Slot) {
        let Some(readers) = self.readers.as_mut() else {
            return;
        };
        let entry = self.table.get_mut(slot).expect("live slot");
        let in_memory = matches!(entry.residency, Residency::Resident | Residency::Kept);
        if entry.fast_position().is_some() || !entry.is_visible() || !in_memory {
            return;
        }
        let location = ObjectLocation {
            offset: entry.offset,
            data_size: entry.data_size,
            meta_size: entry.meta_size,
        };
        let adopted = &self.adopted;
        let position = readers
            .index_mut()
            .publish(&entry.id, location, |p| adopted.contains_key(&p));
        if let Some(position) = position {
            // Reads count from now on.
            readers.read_since_last_look(position);
        }
        entry.set_fast_position(position);
    }

    /// Whether a client read `slot`'s object through the fast path since the
    /// eviction policy last heard of its reads.
    pub(super) fn read_through_fast_path(&mut self, slot: Slot) -> bool {
        let Some(readers) = self.readers.as_mut() else {
            return false;
        };
        let entry = self.table.get(slot).expect("live slot");
        entry
            .fast_position()
            .is_some_and(|position| readers.read_since_last_look(position))
    }

    /// Before an object's memory is freed or handed to a tier: takes it out
    /// of the shared index and looks whether a fast-path reader holds it.
    /// If one does, the object is kept — a reference in [`FAST_READERS`]'
    /// name, published again if `keep_visible` — and `true` is returned.
    pub(super) fn kept_for_fast_readers_now(&mut self, slot: Slot, keep_visible: bool) -> bool {
        let Some(readers) = self.readers.as_mut() else {
            return false;
        };
        let entry = self.table.get_mut(slot).expect("live slot");
        let Some(position) = entry.fast_position() else {
            return false;
        };
        if self.adopted.contains_key(&position) {
            return true; // kept already
        }
        readers.index_mut().unpublish(position);
        if !readers.held(position) {
            entry.set_fast_position(None);
            return false;
        }
        if keep_visible {
            readers.index_mut().republish(position);
        }
        entry.refs += 1;
        *self.client(FAST_READERS).refs.entry(slot).or_insert(0) += 1;
        self.adopted.insert(position, slot);
        true
    }

    /// Records the reads clients made through the fast path since the last
    /// look, as their gets would have been recorded had they come through
    /// the socket (the access clock, the policy's touch), for up to
    /// [`FAST_READ_SCAN`] objects from where the last call stopped. The
    /// daemon calls it every few milliseconds: fast-path gets are invisible
    /// to the store when they happen, and without it a policy that times
    /// reads (forecast) would see them only when it picks the object as a
    /// victim (second chance), all at that moment. Nothing to do (and no
    /// object looked at) when no client got anything since the last call.
    /// Returns how many reads were recorded.
    pub fn record_fast_reads(&mut self) -> usize {
        let Some(gets) = self.readers.as_ref().map(Readers::gets) else {
            return 0;
        };
        if gets == self.fast_gets_looked_at && self.fast_read_cursor == 0 {
            return 0;
        }
        self.fast_gets_looked_at = gets;
        // A read changes no room: waiters for space are not woken for it.
        let space_changed = self.space_changed;
        let bound = self.table.slot_bound();
        let (mut at, mut looked, mut recorded) = (self.fast_read_cursor, 0, 0);
        while at < bound && looked < FAST_READ_SCAN {
            let slot = at as Slot;
            at += 1;
            let Some(position) = self
                .table
                .get(slot)
                .filter(|e| e.is_visible())
                .and_then(Entry::fast_position)
            else {
                continue;
            };
            looked += 1;
            let readers = self.readers.as_mut().expect("checked above");
            if readers.read_since_last_look(position) {
                self.record_read(slot);
                recorded += 1;
            }
        }
        self.fast_read_cursor = if at < bound { at } else { 0 };
        self.space_changed = space_changed;
        recorded
    }

    /// A read of `slot` the store learned of after the fact: timed now on
    /// the access clock and told to the policy, as a get would have been.
    fn record_read(&mut self, slot: Slot) {
        let candidate = Self::is_candidate(self.table.get(slot).expect("live slot"));
        if candidate {
            self.drop_candidate(slot);
        }
        self.time_read(slot);
        if candidate {
            let len = self.block_of(self.table.get(slot).expect("live")).len;
            self.add_candidate(slot, len);
        }
    }

    /// Counts `id` in the fast path's creating filter (or stops counting it).
    pub(super) fn note_creating(&self, id: &ObjectId, creating: bool) {
        if let Some(readers) = &self.readers {
            readers.index().note_creating(id, creating);
        }
    }

    /// Gets clients made through the fast path (0 without it).
    pub fn fast_gets(&self) -> u64 {
        self.readers.as_ref().map_or(0, Readers::gets)
    }
}
