//! Per-client state: which clients are known, what each holds (references,
//! and the objects it is still writing), and what becomes of that when a
//! client disconnects or its holdings move to another principal.

use shoal_core::event::ObjectEvent;
use shoal_core::ids::{ClientId, ObjectId};
use shoal_core::location::Block;

use super::{ClientState, Store};
use crate::object_table::ObjectState;

impl Store {
    pub fn register_client(&mut self, client: ClientId) {
        self.clients.entry(client).or_default();
    }

    /// Whether `client` holds nothing here: no reference and no object it is
    /// still writing (closing its connection would change nothing).
    pub fn client_holds_nothing(&self, client: ClientId) -> bool {
        self.clients
            .get(&client)
            .is_none_or(|c| c.refs.is_empty() && c.creating.is_empty() && c.lent.is_empty())
            && !self.readers.as_ref().is_some_and(|r| r.holds_any(client))
    }

    /// Whether `client` is known (connected, or a reserved principal).
    pub fn has_client(&self, client: ClientId) -> bool {
        self.clients.contains_key(&client)
    }

    /// Whether `client` holds a reference to `id`.
    pub fn holds(&self, client: ClientId, id: &ObjectId) -> bool {
        let Some(slot) = self.table.find(id) else {
            return false;
        };
        self.clients
            .get(&client)
            .is_some_and(|c| c.refs.contains_key(&slot))
    }

    /// Bytes of the sealed objects that only `client` references: what its
    /// releases would make eviction candidates, or free (the tiers' drain
    /// pins, say, as opposed to objects clients hold as well).
    pub fn bytes_only_referenced_by(&self, client: ClientId) -> u64 {
        let Some(state) = self.clients.get(&client) else {
            return 0;
        };
        state
            .refs
            .iter()
            .filter_map(|(slot, count)| self.table.get(*slot).filter(|e| e.refs == *count))
            .filter(|e| e.state == ObjectState::Sealed)
            .map(|e| self.block_of(e).len)
            .sum()
    }

    /// Whether `client` holds any reference at all.
    pub fn has_references(&self, client: ClientId) -> bool {
        self.clients
            .get(&client)
            .is_some_and(|c| !c.refs.is_empty())
    }

    /// A client went away: its references are released and whatever it was
    /// still writing is aborted.
    pub fn disconnect(&mut self, client: ClientId) {
        if let Some(readers) = self.readers.as_mut() {
            if readers.remove_client(client) && !self.adopted.is_empty() {
                self.sweep_fast_readers();
            }
        }
        let Some(state) = self.clients.remove(&client) else {
            return;
        };
        // What it was lent and did not seal is free again (computed from
        // the daemon's records, whatever the client wrote).
        let unsealed: Vec<Block> = state.lent.unsealed().collect();
        self.free_unsealed(&unsealed);
        for slot in &state.creating {
            let held = state.refs.get(slot).copied().unwrap_or(0);
            let entry = self.table.get_mut(*slot).expect("unsealed slot is live");
            entry.refs -= held;
            let id = entry.id;
            self.note_creating(&id, false);
            self.drop_unsealed(*slot);
            // Like an abort: a cluster node unregisters the id.
            self.events.push(ObjectEvent::Aborted { id });
        }
        for (slot, count) in state.refs {
            if state.creating.contains(&slot) {
                continue;
            }
            for _ in 0..count {
                self.drop_ref(slot);
            }
        }
    }

    /// Moves every reference and unsealed object of `from` to `to`, which
    /// keeps what it already holds: the memory stays as it is, held by a
    /// principal `from` cannot act as (a cluster owner fencing a peer cut off
    /// past its lease). `from` is left registered and holding nothing; its
    /// unsealed objects can no longer be sealed by it. Returns the number of
    /// sealed objects it referenced and of unsealed objects moved.
    pub fn transfer_client(&mut self, from: ClientId, to: ClientId) -> (usize, usize) {
        if let Some(readers) = self.readers.as_mut() {
            readers.transfer_peer_tables(from, to);
        }
        let Some(state) = self.clients.insert(from, ClientState::default()) else {
            self.clients.remove(&from);
            return (0, 0);
        };
        let sealed = state
            .refs
            .keys()
            .filter(|slot| !state.creating.contains(slot))
            .count();
        let moved = (sealed, state.creating.len());
        for slot in &state.creating {
            self.table
                .get_mut(*slot)
                .expect("unsealed slot is live")
                .creator = to;
        }
        let target = self.client(to);
        for (slot, count) in state.refs {
            *target.refs.entry(slot).or_default() += count;
        }
        target.creating.extend(state.creating);
        // Lent space stays held: `from`'s leases cannot be given back by
        // anyone now, and go when `from` is forgotten.
        self.clients.get_mut(&from).expect("inserted above").lent = state.lent;
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{id, store};
    use super::*;
    use crate::eviction::Lru;
    use shoal_core::error::ErrorKind;

    #[test]
    fn bytes_only_one_client_references_leave_out_what_others_hold_too() {
        let mut s = store(64 * 8);
        for n in 0..3 {
            s.create(1, id(n), 64, 0).unwrap();
            s.seal(1, &[id(n)], true).unwrap();
            s.get(7, &id(n)).unwrap(); // a drain's pin, say
        }
        s.get(7, &id(0)).unwrap(); // twice: still its alone
        s.get(2, &id(1)).unwrap(); // a client holds id(1) as well
        s.create(7, id(3), 64, 0).unwrap(); // unsealed: no release frees it
        assert_eq!(s.bytes_only_referenced_by(7), 2 * 64);
        s.release(2, &id(1)).unwrap();
        assert_eq!(s.bytes_only_referenced_by(7), 3 * 64);
        assert_eq!(s.bytes_only_referenced_by(2), 0);
        assert_eq!(s.bytes_only_referenced_by(9), 0, "an unknown client");
    }

    #[test]
    fn disconnect_releases_and_aborts() {
        let mut s = store(4096);
        s.create(1, id(1), 10, 0).unwrap();
        s.seal(1, &[id(1)], true).unwrap();
        s.get(2, &id(1)).unwrap();
        s.get(2, &id(1)).unwrap();
        s.create(2, id(2), 10, 0).unwrap();
        s.disconnect(2);
        assert!(s.contains(&id(1)));
        assert!(
            s.table.find(&id(2)).is_none(),
            "unsealed object of a dead client is aborted"
        );
        assert_eq!(s.stats().referenced, 0);
        s.check_invariants();
    }

    #[test]
    fn a_transferred_client_s_memory_stays_held_and_its_writes_cannot_be_sealed() {
        let mut s = Store::new(1024, 1024, 64, Box::new(Lru::default()));
        s.create(1, id(1), 64, 0).unwrap();
        s.seal(1, &[id(1)], true).unwrap();
        s.get(7, &id(1)).unwrap(); // the peer reads it
        s.get(7, &id(1)).unwrap();
        let writing = s.create(7, id(2), 64, 0).unwrap().offset; // and writes another
        s.get(9, &id(1)).unwrap(); // the fence principal held it already
        let held = [s.location(&id(1)).unwrap().offset, writing];
        assert_eq!(s.transfer_client(7, 9), (1, 1));
        s.check_invariants();
        assert!(s.client_holds_nothing(7));
        assert_eq!(
            s.seal(7, &[id(2)], true).unwrap_err().kind(),
            ErrorKind::NotOwner
        );
        assert!(s.release(7, &id(1)).is_err(), "the peer holds nothing now");
        // Nothing is freed or evictable: a delete waits for the holder.
        s.delete(&id(1)).unwrap();
        assert_eq!(s.evict(1024), 0);
        let new = s.create(1, id(3), 64, 0).unwrap().offset;
        assert!(!held.contains(&new), "a held block was reused");
        // Releasing the fence principal frees both.
        s.disconnect(9);
        s.check_invariants();
        assert!(!s.contains(&id(1)));
        assert!(!s.contains(&id(2)));
        assert_eq!(s.transfer_client(42, 9), (0, 0));
        assert!(!s.has_client(42));
    }

    #[test]
    fn sealing_and_dropping_many_unsealed_objects_is_linear() {
        // 200k ids: quadratic bookkeeping would take minutes here.
        let n = 200_000u32;
        let ids: Vec<ObjectId> = (0..n)
            .map(|i| {
                let mut b = [0u8; 20];
                b[..4].copy_from_slice(&i.to_le_bytes());
                ObjectId(b)
            })
            .collect();
        let mut s = store(64 * 2 * n as u64);
        let started = std::time::Instant::now();
        let specs: Vec<_> = ids.iter().map(|id| (*id, 1, 0)).collect();
        s.create_batch(1, &specs).unwrap();
        s.seal(1, &ids[..n as usize / 2], true).unwrap();
        s.disconnect(1);
        assert_eq!(s.stats().objects, u64::from(n / 2));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }
}
