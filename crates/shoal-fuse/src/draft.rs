//! A file's bytes while it is written: straight in an unsealed store
//! object, which grows with the file and is sealed at the file's length
//! when the file is closed.
//!
//! Growth first asks the store to extend the object in place (`Resize`,
//! protocol 10: the free space right after it, when there is some); when
//! it cannot, a larger object is created (it may evict, and waits for room
//! like any create), the bytes so far are copied into it and the old one
//! is aborted. Sizes at least double, so a file is copied at most about
//! once more on average, and usually not at all. At the seal the object is
//! resized down to the file's length, which frees its tail.
//!
//! So a written byte is copied once here (from fuser's request buffer into
//! the object) and never again at close: the close is a resize, a name and
//! a seal. Readers of the name see the previous version until that seal.
//!
//! After the seal the draft keeps a reference to its sealed object: reads
//! through the handle still see it, and a write after the close's flush
//! (through a still-open handle, a shared mmap written back late) starts a
//! new object from a copy of it.

use std::collections::BTreeMap;

use libc::c_int;
use shoal_core::ObjectId;

/// The smallest object a draft makes, and the unit its sizes round up to:
/// small enough that an open file does not hold much of the store, large
/// enough that a file grows a few times, not once per write.
pub const GRAIN: u64 = 1 << 20;

/// An object a draft holds: its id, and which of the store's connections
/// holds it (made it, or took the reference): the one every later call
/// about it goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub id: ObjectId,
    pub conn: usize,
}

/// What a draft needs from the store (the mount's connections; a fake in
/// tests). Errors are errnos, already mapped.
pub trait DraftStore {
    /// Creates an unsealed object of `data_size` bytes; its id and the
    /// address of its bytes in this process. With `wait`, a full store is
    /// given the mount's wait for room (its drain may free some) before
    /// ENOSPC; without, ENOSPC at once.
    fn create(&self, data_size: u64, wait: bool) -> Result<(Held, *mut u8), c_int>;
    /// Resizes an unsealed object in place; false: no room right after it.
    fn resize(&self, object: Held, data_size: u64) -> Result<bool, c_int>;
    /// `[at, at + len)` of the object's bytes is about to be written: its
    /// page tables filled in one go (the store's mapping does it once per
    /// chunk in the process), not a write fault per 4 KiB page.
    fn prepare_write(&self, object: Held, at: *mut u8, len: usize);
    /// Binds `name` to the object and seals it (keeping this reference).
    fn seal_named(&self, object: Held, name: &str) -> Result<(), c_int>;
    /// Whether the object is sealed (after a seal that failed); `None`
    /// when the store cannot say.
    fn is_sealed(&self, object: Held) -> Option<bool>;
    fn abort(&self, object: Held);
    fn release(&self, object: Held);
}

/// The store object holding a draft's bytes.
struct Object {
    held: Held,
    /// Its bytes in this process's mapping (an integer, so the draft can
    /// move between the session threads).
    address: usize,
    /// Its data size: room for the file up to here.
    capacity: u64,
    /// Sealed (and referenced by this draft): read-only from now on.
    sealed: bool,
}

/// A file being written (see the module's doc).
#[derive(Default)]
pub struct Draft {
    object: Option<Object>,
    len: u64,
    /// Ranges below `len` that read as zeros but whose memory still holds
    /// whatever the block held before (start -> end, disjoint): a write
    /// past the end leaves a gap, and zeroing it at once was 13 % of the
    /// mount's CPU under random writes, which fill such gaps soon after.
    /// Zeroed when the bytes are read, copied or sealed.
    holes: BTreeMap<u64, u64>,
}

/// Holes kept before all are zeroed: bounds the map under tiny scattered
/// writes.
const MAX_HOLES: usize = 4096;

impl Draft {
    /// A draft of a sealed version: `len` bytes at `address`, one reference
    /// to it held as `held` (given to the draft). Nothing
    /// is copied until the first write or truncate.
    pub fn from_sealed(held: Held, address: *const u8, len: u64) -> Self {
        Self {
            object: Some(Object {
                held,
                address: address as usize,
                capacity: len,
                sealed: true,
            }),
            len,
            holes: BTreeMap::new(),
        }
    }

    /// A draft holding a copy of `bytes` (the tests' files).
    #[cfg(test)]
    pub fn from_bytes(store: &dyn DraftStore, bytes: &[u8]) -> Result<Self, c_int> {
        let mut draft = Self::default();
        if !bytes.is_empty() {
            draft.write(store, 0, bytes, u64::MAX)?;
        }
        Ok(draft)
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// The file's bytes (its holes zeroed first).
    pub fn bytes(&mut self) -> &[u8] {
        self.fill_holes();
        match &self.object {
            // SAFETY: the object is this draft's (created by it, or sealed
            // and referenced by it) and holds at least `len` bytes; writes
            // to it need `&mut self`.
            Some(o) => unsafe {
                std::slice::from_raw_parts(o.address as *const u8, self.len as usize)
            },
            None => &[],
        }
    }

    /// Writes `data` at `offset`, growing the file (zeros in any gap) up to
    /// `max` bytes; beyond it EFBIG.
    pub fn write(
        &mut self,
        store: &dyn DraftStore,
        offset: u64,
        data: &[u8],
        max: u64,
    ) -> Result<usize, c_int> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&end| end <= max)
            .ok_or(libc::EFBIG)?;
        self.reserve(store, end.max(self.len), max)?;
        let base = self.object.as_ref().expect("reserved").address as *mut u8;
        if offset > self.len {
            self.holes.insert(self.len, offset);
        }
        self.written(offset, end);
        // SAFETY: reserved: the object holds at least `end` bytes, and
        // nobody else writes it (unsealed, this draft's); `data` is fuser's
        // buffer, not in the object.
        unsafe { shoal_core::copy::copy_to_shared(base.add(offset as usize), data) };
        self.len = self.len.max(end);
        if self.holes.len() > MAX_HOLES {
            self.fill_holes();
        }
        Ok(data.len())
    }

    /// Takes `[from, to)` out of the holes: its bytes are being written.
    fn written(&mut self, from: u64, to: u64) {
        let covered: Vec<(u64, u64)> = self
            .holes
            .range(..to)
            .rev()
            .take_while(|&(_, &end)| end > from)
            .map(|(&start, &end)| (start, end))
            .collect();
        for (start, end) in covered {
            self.holes.remove(&start);
            if start < from {
                self.holes.insert(start, from);
            }
            if end > to {
                self.holes.insert(to, end);
            }
        }
    }

    /// Zeroes the holes' memory: the bytes are about to be read, copied
    /// or sealed.
    fn fill_holes(&mut self) {
        let Some(o) = self.object.as_ref().filter(|o| !o.sealed) else {
            self.holes.clear();
            return;
        };
        for (start, end) in std::mem::take(&mut self.holes) {
            // SAFETY: holes lie below `len`, inside this draft's unsealed
            // object, which nobody else writes.
            unsafe {
                (o.address as *mut u8)
                    .add(start as usize)
                    .write_bytes(0, (end - start) as usize)
            };
        }
    }

    /// Sets the file's length (zeros when it grows) up to `max`.
    pub fn truncate(&mut self, store: &dyn DraftStore, size: u64, max: u64) -> Result<(), c_int> {
        if size > max {
            return Err(libc::EFBIG);
        }
        if size == self.len {
            return Ok(());
        }
        self.reserve(store, size, max)?;
        if size > self.len {
            self.holes.insert(self.len, size);
        } else {
            // What is cut off is no hole any more.
            self.written(size, self.len);
        }
        self.len = size;
        Ok(())
    }

    /// Seals the file as `name`'s new version at its length; its id. A
    /// draft whose object is sealed already (a seal that failed after
    /// sealing, as when a tier could not give the durability asked for)
    /// seals a fresh copy: every commit is a new attempt.
    pub fn seal(&mut self, store: &dyn DraftStore, name: &str) -> Result<ObjectId, c_int> {
        if self.object.as_ref().is_none_or(|o| o.sealed) {
            // Exactly the file: nothing to grow into.
            self.reserve(store, self.len, self.len)?;
        }
        self.fill_holes();
        let o = self.object.as_mut().expect("reserved");
        if o.capacity != self.len {
            // A shrink: always in place.
            if !store.resize(o.held, self.len)? {
                return Err(libc::EIO);
            }
            o.capacity = self.len;
        }
        if let Err(e) = store.seal_named(o.held, name) {
            // Read-only from now on if it did get sealed, or may have:
            // never written into again (a draft that was not sealed after
            // all is released, and the daemon drops it with the connection).
            o.sealed = store.is_sealed(o.held) != Some(false);
            return Err(e);
        }
        o.sealed = true;
        Ok(o.held.id)
    }

    /// Lets the object go: an unsealed one is aborted, a sealed one's
    /// reference released.
    pub fn finish(&mut self, store: &dyn DraftStore) {
        if let Some(o) = self.object.take() {
            if o.sealed {
                store.release(o.held);
            } else {
                store.abort(o.held);
            }
        }
        self.len = 0;
        self.holes.clear();
    }

    /// Makes sure an unsealed object of this draft holds `need` bytes:
    /// the object grown in place, else a new one with the bytes so far.
    /// Each way is tried at the doubled size first and then at just what
    /// is needed, so a file that fits the store is never refused for the
    /// doubling; only the last try waits for room.
    fn reserve(&mut self, store: &dyn DraftStore, need: u64, max: u64) -> Result<(), c_int> {
        // Doubling grows an object being written; a sealed one is copied
        // into an object sized for what is needed now.
        let from = self
            .object
            .as_ref()
            .filter(|o| !o.sealed)
            .map_or(0, |o| o.capacity);
        let grown = grown_capacity(need, from, max);
        let exact = grown_capacity(need, 0, max).min(grown);
        let sizes = if exact < grown {
            vec![grown, exact]
        } else {
            vec![grown]
        };
        if let Some(o) = &mut self.object {
            if !o.sealed && o.capacity >= need {
                return Ok(());
            }
            if !o.sealed {
                for &size in &sizes {
                    if store.resize(o.held, size)? {
                        // About to be written: write faults one 4 KiB page
                        // at a time were 18 % of the mount's CPU writing
                        // 16 KiB blocks (perf).
                        store.prepare_write(
                            o.held,
                            (o.address + o.capacity as usize) as *mut u8,
                            (size - o.capacity) as usize,
                        );
                        o.capacity = size;
                        return Ok(());
                    }
                }
            }
        }
        let capacity = if self.object.is_none() && need == 0 {
            0 // an empty file
        } else {
            grown
        };
        let (held, address, capacity) = match store.create(capacity, sizes.len() == 1) {
            Ok((held, address)) => (held, address, capacity),
            Err(libc::ENOSPC) if sizes.len() > 1 => {
                let (held, address) = store.create(exact, true)?;
                (held, address, exact)
            }
            Err(e) => return Err(e),
        };
        let kept = self.len.min(need) as usize;
        if kept > 0 {
            // SAFETY: the new object holds `capacity` >= `kept` bytes and
            // is this draft's; the old one holds `len` >= `kept`.
            unsafe { shoal_core::copy::copy_to_shared(address, &self.bytes()[..kept]) };
        }
        if let Some(old) = self.object.take() {
            if old.sealed {
                store.release(old.held);
            } else {
                store.abort(old.held);
            }
        }
        self.object = Some(Object {
            held,
            address: address as usize,
            capacity,
            sealed: false,
        });
        Ok(())
    }
}

/// The next size for a file that needs `need` bytes in an object of
/// `capacity`: at least double, at least [`GRAIN`], in whole grains, at
/// most `max` (the store's capacity) but never below `need`.
fn grown_capacity(need: u64, capacity: u64, max: u64) -> u64 {
    let doubled = capacity.saturating_mul(2).max(GRAIN).max(need);
    doubled
        .checked_next_multiple_of(GRAIN)
        .unwrap_or(u64::MAX)
        .min(max)
        .max(need)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// A store of separate heap buffers; in-place growth succeeds while
    /// `room` says so.
    #[derive(Default)]
    struct FakeStore {
        objects: RefCell<HashMap<ObjectId, (Vec<u8>, bool)>>,
        room: std::cell::Cell<bool>,
        creates: std::cell::Cell<usize>,
        names: RefCell<Vec<(String, ObjectId)>>,
        next: std::cell::Cell<u8>,
        /// Creates larger than this find no room.
        limit: std::cell::Cell<u64>,
        /// Bytes of objects let go, kept so that a draft still pointing at
        /// one (several drafts of one version) reads freed-but-valid memory
        /// as a region would.
        gone: RefCell<Vec<Vec<u8>>>,
        /// Ranges asked to be made ready for writing: (object, start, len).
        prepared: RefCell<Vec<(ObjectId, usize, usize)>>,
    }

    impl FakeStore {
        fn forget(&self, id: ObjectId) {
            if let Some((bytes, _)) = self.objects.borrow_mut().remove(&id) {
                self.gone.borrow_mut().push(bytes);
            }
        }
    }

    /// The fake has one connection.
    fn held(id: ObjectId) -> Held {
        Held { id, conn: 0 }
    }

    fn fake() -> FakeStore {
        let store = FakeStore::default();
        store.room.set(true);
        store.limit.set(u64::MAX);
        store
    }

    impl DraftStore for FakeStore {
        fn create(&self, data_size: u64, _wait: bool) -> Result<(Held, *mut u8), c_int> {
            if data_size > self.limit.get() {
                return Err(libc::ENOSPC);
            }
            self.creates.set(self.creates.get() + 1);
            self.next.set(self.next.get() + 1);
            let id = ObjectId([self.next.get(); 20]);
            // Garbage, as a reused block of the region would hold; room to
            // grow in place up to 64 MiB.
            assert!(data_size <= 64 << 20);
            let mut bytes = vec![0xAB; 64 << 20];
            let address = bytes.as_mut_ptr();
            self.objects.borrow_mut().insert(id, (bytes, false));
            Ok((held(id), address))
        }
        fn resize(&self, object: Held, data_size: u64) -> Result<bool, c_int> {
            let objects = self.objects.borrow();
            let (bytes, _) = objects.get(&object.id).ok_or(libc::ENOENT)?;
            Ok(data_size as usize <= bytes.len() && self.room.get())
        }
        fn prepare_write(&self, object: Held, at: *mut u8, len: usize) {
            let objects = self.objects.borrow();
            let (bytes, _) = objects.get(&object.id).expect("a live object");
            let start = at as usize - bytes.as_ptr() as usize;
            assert!(start + len <= bytes.len(), "inside the object");
            self.prepared.borrow_mut().push((object.id, start, len));
        }
        fn seal_named(&self, object: Held, name: &str) -> Result<(), c_int> {
            let mut objects = self.objects.borrow_mut();
            let (_, sealed) = objects.get_mut(&object.id).ok_or(libc::ENOENT)?;
            *sealed = true;
            self.names.borrow_mut().push((name.into(), object.id));
            Ok(())
        }
        fn is_sealed(&self, object: Held) -> Option<bool> {
            Some(self.objects.borrow().get(&object.id).is_some_and(|o| o.1))
        }
        fn abort(&self, object: Held) {
            self.forget(object.id);
        }
        fn release(&self, object: Held) {
            self.forget(object.id);
        }
    }

    #[test]
    fn writes_grow_fill_gaps_with_zeros_and_stop_at_the_limit() {
        let store = fake();
        let mut d = Draft::default();
        assert_eq!(d.write(&store, 4, b"xy", 100), Ok(2));
        assert_eq!(d.bytes(), b"\0\0\0\0xy");
        d.write(&store, 1, b"ab", 100).unwrap();
        assert_eq!(d.bytes(), b"\0ab\0xy");
        assert_eq!(d.write(&store, 99, b"zz", 100), Err(libc::EFBIG));
        assert_eq!(d.write(&store, u64::MAX, b"z", u64::MAX), Err(libc::EFBIG));
        d.truncate(&store, 2, 100).unwrap();
        assert_eq!(d.bytes(), b"\0a");
        d.truncate(&store, 5, 100).unwrap();
        assert_eq!(d.bytes(), b"\0a\0\0\0", "growth by truncate reads as zeros");
        assert_eq!(d.truncate(&store, 101, 100), Err(libc::EFBIG));
        assert_eq!(store.creates.get(), 1);
    }

    #[test]
    fn gaps_are_zeroed_only_where_nothing_was_written_by_the_time_they_are_read() {
        let store = fake();
        let mut d = Draft::default();
        // Blocks written out of order, as fio's random writes do: each gap
        // is a hole until written; the object's memory holds garbage (0xAB).
        d.write(&store, 30, b"dd", 100).unwrap();
        d.write(&store, 10, b"bb", 100).unwrap();
        d.write(&store, 20, b"cc", 100).unwrap();
        assert_eq!(d.holes.len(), 3, "{:?}", d.holes);
        d.write(&store, 0, &[b'a'; 10], 100).unwrap();
        d.write(&store, 12, &[b'x'; 8], 100).unwrap();
        assert_eq!(d.holes.iter().collect::<Vec<_>>(), vec![(&22, &30)]);
        // A truncate into the hole, then past the end: zeros, never garbage.
        d.truncate(&store, 25, 100).unwrap();
        d.truncate(&store, 28, 100).unwrap();
        let mut want = vec![b'a'; 10];
        want.extend(b"bb");
        want.extend([b'x'; 8]);
        want.extend(b"cc");
        want.extend([0; 6]);
        assert_eq!(d.bytes(), &want[..]);
        assert!(d.holes.is_empty());
        // A seal zeroes what is left first.
        d.write(&store, 40, b"e", 100).unwrap();
        d.seal(&store, "f").unwrap();
        assert!(d.holes.is_empty());
        assert_eq!(&d.bytes()[28..40], &[0; 12]);
        // Scattered tiny writes: the holes are bounded.
        let mut many = Draft::default();
        for i in (0..2 * MAX_HOLES as u64).rev() {
            many.write(&store, 2 * i + 1, b"z", u64::MAX).unwrap();
        }
        assert!(many.holes.len() <= MAX_HOLES);
        assert!(many.bytes().chunks(2).all(|c| c == b"\0z"));
    }

    #[test]
    fn growth_is_in_place_when_the_store_has_room_and_a_copy_otherwise() {
        let store = fake();
        let mut d = Draft::default();
        let block: Vec<u8> = (0..GRAIN).map(|i| i as u8).collect();
        for i in 0..4 {
            d.write(&store, i * GRAIN, &block, u64::MAX).unwrap();
        }
        assert_eq!(store.creates.get(), 1, "grown in place");
        // Each growth in place made exactly its new bytes ready for writing.
        let prepared = store.prepared.borrow().clone();
        assert!(!prepared.is_empty());
        let mut end = prepared[0].1;
        for &(_, start, len) in &prepared {
            assert_eq!(start, end, "the grown range, from the old capacity on");
            end = start + len;
        }
        assert!(end as u64 >= 4 * GRAIN);
        store.room.set(false);
        d.write(&store, 4 * GRAIN, &block, u64::MAX).unwrap();
        assert_eq!(store.creates.get(), 2, "a larger object");
        assert_eq!(store.objects.borrow().len(), 1, "the old one aborted");
        assert_eq!(d.len(), 5 * GRAIN);
        assert!(d.bytes().chunks(GRAIN as usize).all(|c| c == block));
    }

    #[test]
    fn a_seal_names_the_file_and_later_writes_start_a_new_object_from_it() {
        let store = fake();
        let mut d = Draft::default();
        d.write(&store, 0, b"hello", u64::MAX).unwrap();
        let first = d.seal(&store, "a/b").unwrap();
        assert_eq!(store.is_sealed(held(first)), Some(true));
        d.write(&store, 5, b"!", u64::MAX).unwrap();
        assert_eq!(store.creates.get(), 2, "a write after the seal copies it");
        assert_eq!(d.bytes(), b"hello!");
        let second = d.seal(&store, "a/b").unwrap();
        assert_ne!(first, second);
        assert!(!store.objects.borrow().contains_key(&first), "released");
        // Sealing again (a seal that failed once sealed) makes a new version.
        let third = d.seal(&store, "a/b").unwrap();
        assert_ne!(third, second);
        assert_eq!(d.bytes(), b"hello!");
        d.finish(&store);
        assert!(store.objects.borrow().is_empty());
        // An empty file is an object of no bytes.
        let mut empty = Draft::default();
        let id = empty.seal(&store, "e").unwrap();
        assert_eq!(store.names.borrow().last(), Some(&("e".to_owned(), id)));
        // A draft never sealed leaves nothing behind.
        let mut dropped = Draft::from_bytes(&store, b"xyz").unwrap();
        assert_eq!(dropped.bytes(), b"xyz");
        dropped.finish(&store);
        assert_eq!(store.objects.borrow().len(), 1);
    }

    #[test]
    fn a_file_that_fits_is_not_refused_for_the_doubling() {
        let store = fake();
        let mut d = Draft::default();
        let block = vec![7u8; GRAIN as usize];
        for i in 0..4 {
            d.write(&store, i * GRAIN, &block, u64::MAX).unwrap();
        }
        // In place: 4 MiB would double to 8; only 5 fit right after it.
        store.room.set(false);
        store.limit.set(5 * GRAIN);
        d.write(&store, 4 * GRAIN, &block, u64::MAX).unwrap();
        assert_eq!(d.len(), 5 * GRAIN);
        assert_eq!(store.creates.get(), 2);
        assert_eq!(
            d.write(&store, 5 * GRAIN, &block, u64::MAX),
            Err(libc::ENOSPC)
        );
        assert_eq!(d.len(), 5 * GRAIN, "a refused write changes nothing");
        assert!(d.bytes().iter().all(|&b| b == 7));
    }

    #[test]
    fn a_sealed_version_is_copied_only_when_changed_and_only_what_is_kept() {
        let store = fake();
        let mut first = Draft::default();
        first.write(&store, 0, &[5u8; 3 << 20], u64::MAX).unwrap();
        let id = first.seal(&store, "f").unwrap();
        let address = first.bytes().as_ptr();
        // A second handle's draft of that version: no copy until changed.
        let mut d = Draft::from_sealed(held(id), address, 3 << 20);
        assert_eq!(d.bytes(), first.bytes());
        assert_eq!(store.creates.get(), 1);
        // Truncated to nothing: a small fresh object, nothing copied.
        d.truncate(&store, 0, u64::MAX).unwrap();
        assert_eq!(d.len(), 0);
        assert_eq!(store.creates.get(), 2);
        // Kept in part: only that part, in an object of its size.
        let mut e = Draft::from_sealed(held(id), address, 3 << 20);
        e.truncate(&store, 5, u64::MAX).unwrap();
        assert_eq!(e.bytes(), &[5u8; 5]);
        // Sealing a draft that is sealed already makes an exact copy.
        let mut g = Draft::from_sealed(held(id), address, 3 << 20);
        let again = g.seal(&store, "f").unwrap();
        assert_ne!(again, id);
        assert_eq!(g.bytes(), first.bytes());
    }

    #[test]
    fn capacities_double_in_whole_grains_within_the_limit() {
        assert_eq!(grown_capacity(1, 0, u64::MAX), GRAIN);
        assert_eq!(grown_capacity(GRAIN + 1, GRAIN, u64::MAX), 2 * GRAIN);
        assert_eq!(grown_capacity(5 * GRAIN, 2 * GRAIN, u64::MAX), 5 * GRAIN);
        assert_eq!(
            grown_capacity(3 * GRAIN, 2 * GRAIN, 3 * GRAIN + 5),
            3 * GRAIN + 5
        );
        assert_eq!(grown_capacity(7, 0, 10), 10);
        assert_eq!(grown_capacity(u64::MAX, 1, u64::MAX), u64::MAX);
    }
}
