//! Where a create's block goes ([`Placement`]: best fit, or in room to grow
//! for a file being written), the block an object's size needs, and how an
//! unsealed object's block changes size in place ([`Store::resize`]).

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::{ClientId, ObjectId};
use shoal_core::location::Block;

use crate::object_table::ObjectState;

use super::{Placement, Store};

impl Store {
    /// The block an object of `total` bytes needs; `ObjectTooLarge` beyond
    /// the store's capacity.
    pub(super) fn padded_len(&self, id: &ObjectId, total: u64) -> Result<u64> {
        self.allocator
            .block_len(total)
            .filter(|&len| len <= self.ceiling)
            .ok_or_else(|| {
                ShoalError::new(
                    ErrorKind::ObjectTooLarge,
                    format!(
                        "object {id} needs {total} bytes but the store's capacity is {} bytes",
                        self.ceiling
                    ),
                )
            })
    }

    /// A free block of `len` bytes placed as `placement` says, if the
    /// allocator has one (capacity is the caller's check).
    pub(super) fn place(&mut self, len: u64, placement: Placement) -> Option<Block> {
        match placement {
            Placement::Packed => self.allocator.allocate(len),
            Placement::Growing => {
                // Only objects still unsealed where they were are growing.
                let (table, allocator) = (&self.table, &self.allocator);
                self.growing.retain(|&end, &mut (slot, id)| {
                    table.get(slot).is_some_and(|e| {
                        e.id == id
                            && e.state == ObjectState::Created
                            && allocator
                                .block_len(e.total_size())
                                .is_some_and(|len| e.offset + len == end)
                    })
                });
                let growing = &self.growing;
                self.allocator
                    .allocate_growing(len, |at| growing.contains_key(&at))
            }
        }
    }

    /// Resizes an object its creator has not sealed to `data_size` data
    /// bytes, in place: a shrink gives the block's tail back at once; a
    /// growth takes the free space right after the block if it is there
    /// and the capacity allows, and otherwise answers false with nothing
    /// changed (the caller creates a larger object instead, which may
    /// evict). The bytes up to the smaller size stay where they are. For a
    /// file written piece by piece (the POSIX view): it grows as written
    /// and is sealed at its final length. Objects with metadata (it follows
    /// the data) and objects in lent space (the lease owns the block) are
    /// refused.
    pub fn resize(&mut self, client: ClientId, id: &ObjectId, data_size: u64) -> Result<bool> {
        let slot = self.own_unsealed(client, id)?;
        if self
            .clients
            .get(&client)
            .is_some_and(|state| state.from_lease.contains_key(&slot))
        {
            return Err(ShoalError::invalid(format!(
                "object {id} was created in lent space and cannot be resized"
            )));
        }
        let entry = self.table.get(slot).expect("found slot is live");
        if entry.meta_size != 0 {
            return Err(ShoalError::invalid(format!(
                "object {id} has metadata after its data and cannot be resized"
            )));
        }
        let block = self.block_of(entry);
        let len = self.padded_len(id, data_size)?;
        if len < block.len {
            self.allocator.free(Block {
                offset: block.offset + len,
                len: block.len - len,
            });
            // Creates waiting for room may fit now.
            self.space_changed = true;
        } else if len > block.len {
            let fits = self.allocator.used() + (len - block.len) <= self.capacity;
            if !fits || !self.allocator.extend(block, len) {
                return Ok(false);
            }
        }
        self.table
            .get_mut(slot)
            .expect("found slot is live")
            .data_size = data_size;
        // A growing object's room is after its new end.
        if let Some(entry) = self.growing.remove(&(block.offset + block.len)) {
            self.growing.insert(block.offset + len, entry);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{id, store};
    use super::*;

    /// Any object's location, unsealed ones included.
    fn placed(s: &Store, n: u8) -> Option<(u64, u64)> {
        s.largest(16)
            .into_iter()
            .find(|o| o.id == id(n))
            .map(|o| (o.location.offset, o.location.data_size))
    }

    #[test]
    fn unsealed_objects_shrink_and_grow_in_place() {
        let mut s = store(64 * 16);
        let a = s.create(1, id(1), 64 * 4, 0).unwrap();
        s.create(1, id(2), 64, 0).unwrap();
        // Shrinking frees the tail at once; the head stays where it was.
        assert!(s.resize(1, &id(1), 100).unwrap());
        assert_eq!(s.used(), 64 * 2 + 64);
        assert_eq!(placed(&s, 1), Some((a.offset, 100)));
        s.check_invariants();
        // Growing takes the freed tail back, but not past the neighbour.
        assert!(s.resize(1, &id(1), 64 * 4).unwrap());
        assert!(!s.resize(1, &id(1), 64 * 5).unwrap());
        assert_eq!(placed(&s, 1), Some((a.offset, 64 * 4)));
        assert_eq!(s.used(), 64 * 5);
        // Past the capacity: never; past the ceiling: too large.
        assert!(s.resize(1, &id(2), 64 * 12).unwrap());
        assert!(!s.resize(1, &id(2), 64 * 13).unwrap());
        assert_eq!(
            s.resize(1, &id(2), 64 * 17).unwrap_err().kind(),
            ErrorKind::ObjectTooLarge
        );
        // Sealed at its final size: the size readers see.
        assert!(s.resize(1, &id(2), 0).unwrap());
        s.seal(1, &[id(1), id(2)], true).unwrap();
        assert_eq!(s.get(3, &id(2)).unwrap().data_size, 0);
        assert_eq!(s.used(), 64 * 5);
        s.check_invariants();
    }

    #[test]
    fn files_written_at_once_each_grow_in_place() {
        let kib = 1024;
        let mut s = store(1024 * kib);
        let files: Vec<ObjectId> = (1..=4).map(id).collect();
        for &f in &files {
            s.create_placed(1, f, 4 * kib, 0, Placement::Growing)
                .unwrap();
        }
        // Each has room after it: all grow in place, turn by turn, to a
        // fifth of the store.
        for size in (8..=200).step_by(8) {
            for f in &files {
                assert!(s.resize(1, f, size * kib).unwrap(), "{f} at {size} KiB");
            }
        }
        // Best fit packs them side by side: only the last could grow.
        let mut packed = store(1024 * kib);
        for n in 5..=8 {
            packed.create(1, id(n), 4 * kib, 0).unwrap();
        }
        assert!(!packed.resize(1, &id(5), 8 * kib).unwrap());
        assert!(packed.resize(1, &id(8), 8 * kib).unwrap());
        // A sealed file grows no more: the next one goes right after it.
        let mut t = store(1024 * kib);
        t.create_placed(1, id(1), 4 * kib, 0, Placement::Growing)
            .unwrap();
        t.seal(1, &[id(1)], false).unwrap();
        let next = t
            .create_placed(1, id(2), 4 * kib, 0, Placement::Growing)
            .unwrap();
        assert_eq!(next.offset, 4 * kib);
        s.check_invariants();
        t.check_invariants();
    }

    #[test]
    fn resizes_that_are_not_the_creators_to_make_change_nothing() {
        let mut s = store(64 * 16);
        s.create(1, id(1), 64, 0).unwrap();
        s.create(1, id(2), 64, 8).unwrap();
        s.create(1, id(3), 64, 0).unwrap();
        s.seal(1, &[id(3)], false).unwrap();
        let kind = |r: Result<bool>| r.unwrap_err().kind();
        assert_eq!(kind(s.resize(2, &id(1), 32)), ErrorKind::NotOwner);
        assert_eq!(kind(s.resize(1, &id(2), 32)), ErrorKind::InvalidArgument);
        assert_eq!(
            kind(s.resize(1, &id(3), 32)),
            ErrorKind::ObjectAlreadySealed
        );
        assert_eq!(kind(s.resize(1, &id(9), 32)), ErrorKind::ObjectNotFound);
        assert_eq!(s.used(), 64 * 4);
        assert_eq!(placed(&s, 1).map(|p| p.1), Some(64));
        s.check_invariants();
    }
}
