//! Space lent to clients (the fast path's creates, docs/fast-path.md pieces
//! 2 and 3): a client carves objects from a block the store lent it and
//! seals them with a record through shared memory; the store checks each
//! seal against its own record of what it lent ([`LentSpace`]) and frees
//! what was never sealed when a lease comes back or its client leaves.
//!
//! Lending never evicts and never takes the last of the free room: a block
//! is at most 1/[`LEASE_SHARE`] of the capacity, lent only while the store
//! has [`LEND_ROOM`] times its size free, and lent blocks stay under
//! 1/[`LENT_SHARE`] of the capacity, so a store near full serves creates
//! through the socket as before.

use shoal_core::error::{Result, ShoalError};
use shoal_core::ids::{ClientId, ObjectId};
use shoal_core::location::{Block, ObjectLocation};

use crate::object_table::Slot;

use super::Store;

/// A block is lent only while this many times its size is free.
pub const LEND_ROOM: u64 = 16;
/// Lent, unsealed bytes stay below this share of the capacity (1/n).
pub const LENT_SHARE: u64 = 32;
/// A lease is at most this share of the capacity (1/n).
pub const LEASE_SHARE: u64 = 256;

impl Store {
    /// Lends `client` a block of about `len` bytes (whole lines) from free
    /// room: the lease's number and the block, or `None` when the store is
    /// too full to lend (the client then creates through the socket). Never
    /// evicts.
    pub fn lend(&mut self, client: ClientId, len: u64) -> Option<(u64, Block)> {
        // Small stores lend small blocks.
        let len = self
            .allocator
            .block_len(len.min(self.capacity / LEASE_SHARE))?;
        let free = self.capacity.saturating_sub(self.allocator.used());
        if free < len.saturating_mul(LEND_ROOM)
            || self.lent_bytes + len > self.capacity / LENT_SHARE
        {
            return None;
        }
        let block = self.allocator.allocate(len)?;
        let lease = self.next_lease;
        self.next_lease += 1;
        self.lent_bytes += block.len;
        self.client(client).lent.lend(lease, block);
        Some((lease, block))
    }

    /// Bytes lent to clients and not sealed yet.
    pub fn lent_bytes(&self) -> u64 {
        self.lent_bytes
    }

    /// Creates object `id` for `client` at `location`, inside space lent to
    /// it and not claimed yet: as a create through the socket would (an
    /// unsealed object, its creator holding one reference), in bytes the
    /// client chose. Refused, changing nothing, if the id exists, the range
    /// is off a line boundary, not inside this client's unclaimed lent
    /// space, or the sizes overflow.
    pub fn create_lent(
        &mut self,
        client: ClientId,
        id: ObjectId,
        location: ObjectLocation,
    ) -> Result<()> {
        if self.table.find(&id).is_some() {
            return Err(ShoalError::exists(&id));
        }
        let len = location
            .data_size
            .checked_add(u64::from(location.meta_size))
            .and_then(|total| self.allocator.block_len(total))
            .ok_or_else(|| ShoalError::invalid(format!("object {id}: its sizes overflow")))?;
        if !location.offset.is_multiple_of(self.allocator.line()) {
            return Err(ShoalError::invalid(format!(
                "object {id} at {}: not at a line boundary",
                location.offset
            )));
        }
        let part = Block {
            offset: location.offset,
            len,
        };
        let lease = self
            .clients
            .get_mut(&client)
            .ok_or_else(|| ShoalError::invalid("nothing was lent to this client"))?
            .lent
            .claim(part)?;
        self.lent_bytes -= len;
        let slot = self.insert_created(client, id, location);
        self.client(client).from_lease.insert(slot, lease);
        Ok(())
    }

    /// Removes `client`'s aborted, unsealed object at `slot`, created in
    /// `lease`: its bytes go back to the lease (the client may carve them
    /// again), or to free space if the lease was given back.
    pub(super) fn return_to_lease(&mut self, client: ClientId, slot: Slot, lease: u64) {
        let entry = self.table.remove(slot);
        debug_assert_eq!(entry.refs, 0, "only the creator held an unsealed object");
        let block = self.block_of(&entry);
        if self.client(client).lent.unclaim(lease, block) {
            self.lent_bytes += block.len;
        } else {
            self.allocator.free(block);
            self.space_changed = true;
        }
    }

    /// `client` gives back lease `lease`: what of it was not sealed is free
    /// again.
    pub fn give_back(&mut self, client: ClientId, lease: u64) -> Result<()> {
        let freed = self
            .clients
            .get_mut(&client)
            .ok_or_else(|| ShoalError::invalid("nothing was lent to this client"))?
            .lent
            .give_back(lease)?;
        self.free_unsealed(&freed);
        Ok(())
    }

    /// Frees lent parts that were never sealed.
    pub(super) fn free_unsealed(&mut self, parts: &[Block]) {
        for part in parts {
            self.allocator.free(*part);
            self.lent_bytes -= part.len;
        }
        self.space_changed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{id, store};
    use super::*;

    fn at(offset: u64, data_size: u64) -> ObjectLocation {
        ObjectLocation {
            offset,
            data_size,
            meta_size: 0,
        }
    }

    /// Creates and seals `id` at `location` in `client`'s lent space.
    fn lent_put(
        s: &mut Store,
        client: ClientId,
        id: ObjectId,
        location: ObjectLocation,
        release: bool,
    ) {
        s.create_lent(client, id, location).unwrap();
        s.seal(client, &[id], release).unwrap();
    }

    #[test]
    fn a_lent_object_is_sealed_gettable_and_the_rest_comes_back() {
        let mut s = store(8 << 20);
        let (lease, block) = s.lend(1, 16 << 10).unwrap();
        assert_eq!(s.lent_bytes(), 16 << 10);
        s.check_invariants();
        lent_put(&mut s, 1, id(1), at(block.offset + 128, 100), true);
        s.check_invariants();
        assert_eq!(s.lent_bytes(), (16 << 10) - 128);
        assert_eq!(s.get(2, &id(1)), Some(at(block.offset + 128, 100)));
        s.give_back(1, lease).unwrap();
        s.check_invariants();
        assert_eq!(s.lent_bytes(), 0);
        assert_eq!(s.used(), 128, "only the sealed object is allocated");
        assert_eq!(s.stats().used, 128);
        // The object outlives the block it was carved from.
        s.release(2, &id(1)).unwrap();
        s.delete(&id(1)).unwrap();
        s.check_invariants();
        assert_eq!(s.used(), 0);
    }

    #[test]
    fn bad_seal_records_change_nothing() {
        let mut s = store(8 << 20);
        let (my_lease, mine) = s.lend(1, 4096).unwrap();
        let (their_lease, theirs) = s.lend(2, 4096).unwrap();
        lent_put(&mut s, 1, id(1), at(mine.offset, 64), false);
        s.check_invariants();
        let before = (s.used(), s.lent_bytes(), s.stats().objects);
        let bad = [
            (id(1), at(mine.offset + 64, 8)),         // the id exists
            (id(2), at(mine.offset, 8)),              // sealed twice
            (id(2), at(mine.offset + 32, 64)),        // overlaps a sealed part
            (id(2), at(theirs.offset, 8)),            // another client's space
            (id(2), at(mine.offset + 4096 - 64, 65)), // runs past the block
            (id(2), at(1 << 30, 8)),                  // nowhere
            (id(2), at(mine.offset + 72, 8)),         // inside, off a line boundary
            (
                id(2),
                ObjectLocation {
                    offset: mine.offset + 64,
                    data_size: u64::MAX,
                    meta_size: 1,
                },
            ), // overflows
        ];
        for (i, (oid, location)) in bad.into_iter().enumerate() {
            assert!(s.create_lent(1, oid, location).is_err(), "case {i}");
            s.check_invariants();
            assert_eq!((s.used(), s.lent_bytes(), s.stats().objects), before);
        }
        assert!(s.give_back(1, their_lease).is_err(), "not its lease");
        assert!(s.give_back(1, my_lease + 100).is_err(), "no such lease");
        s.give_back(1, my_lease).unwrap();
        assert!(s.give_back(1, my_lease).is_err(), "given back twice");
        s.check_invariants();
    }

    #[test]
    fn a_client_that_leaves_gets_back_nothing_sealed_and_frees_the_rest() {
        let mut s = store(8 << 20);
        let (_, a) = s.lend(1, 8192).unwrap();
        let (_, b) = s.lend(1, 8192).unwrap();
        lent_put(&mut s, 1, id(1), at(a.offset, 1000), false);
        lent_put(&mut s, 1, id(2), at(b.offset + 4096, 1000), true);
        s.disconnect(1);
        s.check_invariants();
        assert_eq!(s.lent_bytes(), 0);
        assert_eq!(s.used(), 2048, "the two sealed objects stay");
        assert!(s.contains(&id(1)) && s.contains(&id(2)));
        assert_eq!(s.evict(8 << 20), 2048, "and nothing pins them");
        s.check_invariants();
    }

    #[test]
    fn a_store_near_full_lends_nothing_and_lent_space_is_bounded() {
        let mut s = store(8 << 20);
        // A small store lends small blocks.
        assert_eq!(
            s.lend(2, 1 << 20).map(|(_, b)| b.len),
            Some((8 << 20) / LEASE_SHARE)
        );
        s.disconnect(2);
        // At most an eighth of the capacity is lent at once.
        let mut lent = Vec::new();
        while let Some(block) = s.lend(1, 4 << 10) {
            lent.push(block);
        }
        assert_eq!(s.lent_bytes(), (8 << 20) / LENT_SHARE);
        for (lease, _) in lent {
            s.give_back(1, lease).unwrap();
        }
        // Fill to less than LEND_ROOM blocks of room: no more lending.
        let (len, mut n) = (32 << 10, 0u8);
        while s.capacity() - s.used() >= LEND_ROOM * len {
            s.create(1, id(n), 256 << 10, 0).unwrap();
            n += 1;
        }
        assert_eq!(s.lend(1, len), None);
        s.check_invariants();
    }

    #[derive(Debug, Clone)]
    enum Op {
        Lend(u8, u16),
        /// Client, its lease (index), offset into it in lines, lines, id.
        Seal(u8, u8, u16, u8, u8),
        /// A seal record a client forged: any offset.
        Forged(u8, u32, u16, u8),
        GiveBack(u8, u8),
        Leave(u8),
        Put(u8, u16),
        Delete(u8),
        Evict(u16),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let c = 1u8..4;
        prop_oneof![
            (c.clone(), 1u16..2048).prop_map(|(c, n)| Op::Lend(c, n)),
            (c.clone(), any::<u8>(), 0u16..64, 1u8..16, any::<u8>())
                .prop_map(|(c, l, o, n, i)| Op::Seal(c, l, o, n, i)),
            (c.clone(), 0u32..(1 << 20), 1u16..4096, any::<u8>())
                .prop_map(|(c, o, n, i)| Op::Forged(c, o, n, i)),
            (c.clone(), any::<u8>()).prop_map(|(c, l)| Op::GiveBack(c, l)),
            c.prop_map(Op::Leave),
            (any::<u8>(), 1u16..8192).prop_map(|(i, n)| Op::Put(i, n)),
            any::<u8>().prop_map(Op::Delete),
            (0u16..16384).prop_map(Op::Evict),
        ]
    }

    proptest::proptest! {
        /// Whatever clients seal, forge, give back or leave with, and
        /// whatever the store does meanwhile: every byte is in exactly one
        /// of free space, a lease's unsealed part, or an object (the
        /// allocator's usage equals objects plus lent bytes and nothing
        /// overlaps: `check_invariants`), a refused record changes nothing,
        /// and once every client left nothing is lent.
        #[test]
        fn lent_space_is_never_lost_doubled_or_shared(ops in proptest::collection::vec(op(), 1..150)) {
            let mut s = store(1 << 20);
            // Per client: the leases it holds (number, block).
            let mut leases: std::collections::HashMap<u8, Vec<(u64, Block)>> = Default::default();
            for op in ops {
                let before = (s.stats(), s.lent_bytes());
                let refused = match op {
                    Op::Lend(c, n) => {
                        if let Some(lease) = s.lend(u32::from(c), u64::from(n) * 64) {
                            leases.entry(c).or_default().push(lease);
                        }
                        false
                    }
                    Op::Seal(c, l, o, n, i) => {
                        let Some(&(_, block)) = leases.get(&c).and_then(|v| v.get(l as usize % v.len().max(1))) else {
                            continue;
                        };
                        let offset = block.offset + (u64::from(o) * 64) % block.len;
                        let c = u32::from(c);
                        let created = s.create_lent(c, id(i), at(offset, u64::from(n) * 64 - 10));
                        if created.is_ok() {
                            s.check_invariants();
                            // Sealed or aborted, as clients do.
                            if i % 3 == 0 {
                                s.abort(c, &id(i)).unwrap();
                            } else {
                                s.seal(c, &[id(i)], true).unwrap();
                            }
                        }
                        created.is_err()
                    }
                    Op::Forged(c, o, n, i) => {
                        s.create_lent(u32::from(c), id(i), at(u64::from(o), u64::from(n))).is_err()
                    }
                    Op::GiveBack(c, l) => {
                        let list = leases.entry(c).or_default();
                        if list.is_empty() {
                            s.give_back(u32::from(c), u64::from(l)).is_err()
                        } else {
                            let (number, _) = list.remove(l as usize % list.len());
                            s.give_back(u32::from(c), number).unwrap();
                            false
                        }
                    }
                    Op::Leave(c) => {
                        s.disconnect(u32::from(c));
                        leases.remove(&c);
                        false
                    }
                    Op::Put(i, n) => {
                        if s.create(9, id(i), u64::from(n), 0).is_ok() {
                            s.seal(9, &[id(i)], true).unwrap();
                        }
                        false
                    }
                    Op::Delete(i) => {
                        let _ = s.delete(&id(i));
                        false
                    }
                    Op::Evict(n) => {
                        s.evict(u64::from(n) * 64);
                        false
                    }
                };
                s.check_invariants();
                if refused {
                    proptest::prop_assert_eq!((s.stats(), s.lent_bytes()), before);
                }
            }
            for c in 1..4 {
                s.disconnect(c);
            }
            s.check_invariants();
            proptest::prop_assert_eq!(s.lent_bytes(), 0);
        }
    }
}
