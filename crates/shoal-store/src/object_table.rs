//! The object table: every object the store knows, keyed by id.
//!
//! Entries live in a dense slot vector and are found through a hash table of
//! slot numbers (not of ids), so the index costs ~5 bytes per bucket and an
//! object's whole daemon-side footprint stays well under 128 bytes even with
//! millions of small objects. Slot numbers are stable for an object's life,
//! which lets the eviction policy and per-client reference maps use them as
//! compact handles.

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use std::hash::BuildHasher;

use shoal_core::ids::{ClientId, ObjectId};

pub type Slot = u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectState {
    /// Created, being written by its creator; invisible to get.
    Created,
    /// Immutable from now on.
    Sealed,
}

/// Whether an object's bytes are in memory for good, or on their way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    Resident,
    /// Chosen for eviction and held by a listener that is copying its bytes
    /// out (a tier): its memory stays allocated and unchanged until the
    /// holder finishes; it stays visible, and a get meanwhile keeps it.
    Evicting,
    /// Its holder could not take it out (a tier full or failing): it stays
    /// in memory and is no eviction candidate until the holder readmits it,
    /// so a failing tier never turns eviction into a retry loop.
    Kept,
}

/// When an object was last read, on the store's access clock (one tick per
/// get), and the ticks between its last two reads: what an elastic store's
/// prefetch uses to bring a cyclic scan's next objects back first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access {
    /// 0: never read.
    pub last: u64,
    /// 0: read fewer than twice.
    pub interval: u64,
}

/// [`Access`] packed into one word, so an entry stays within a cache line
/// (`entry_stays_small`): the last read in the high [`CLOCK_BITS`] bits
/// (the clock wraps after 2^40 gets, ~12 days at a million a second; only
/// a prefetch's order across the wrap suffers), the interval in the low 24
/// (saturating at 16 M gets: "long ago" is all a prefetch needs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackedAccess(u64);

pub const CLOCK_BITS: u32 = 40;
const INTERVAL_BITS: u32 = 64 - CLOCK_BITS;
const INTERVAL_MAX: u64 = (1 << INTERVAL_BITS) - 1;
pub const CLOCK_MASK: u64 = (1 << CLOCK_BITS) - 1;

impl PackedAccess {
    pub fn get(self) -> Access {
        Access {
            last: self.0 >> INTERVAL_BITS,
            interval: self.0 & INTERVAL_MAX,
        }
    }

    /// A read at `now` (the clock, taken modulo 2^40).
    pub fn record(&mut self, now: u64) {
        let now = now & CLOCK_MASK;
        let Access { last, interval } = self.get();
        let interval = if last == 0 {
            interval
        } else {
            (now.wrapping_sub(last) & CLOCK_MASK).min(INTERVAL_MAX)
        };
        self.0 = (now << INTERVAL_BITS) | interval;
    }
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub id: ObjectId,
    /// Offset of the data in the region; metadata follows the data.
    pub offset: u64,
    pub data_size: u64,
    pub meta_size: u32,
    /// References held by clients (the creator's included).
    pub refs: u32,
    /// The client that created it: the only one that may write, seal or
    /// abort it; kept after the seal as the client that wrote its bytes.
    pub creator: ClientId,
    pub state: ObjectState,
    /// Deleted while referenced (or being evicted): invisible, freed on the
    /// last release (or when the eviction finishes).
    pub delete_pending: bool,
    pub residency: Residency,
    /// Its readers are done with it (`Store::cool`): once unreferenced it
    /// leaves memory before the policy's own candidates; a read clears it.
    pub cold: bool,
    pub access: PackedAccess,
    /// Its position in the shared object index (the fast path), while it
    /// is published there — or, once unpublished, until the daemon has
    /// seen that no client's reference table counts that position.
    /// [`NO_POSITION`] if none (a plain u32: the entry stays 64 bytes).
    fast_position: u32,
}

/// [`Entry`] has no position in the shared index.
const NO_POSITION: u32 = u32::MAX;

impl Entry {
    /// A new entry, not published in the shared index.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: ObjectId,
        offset: u64,
        data_size: u64,
        meta_size: u32,
        refs: u32,
        creator: ClientId,
        state: ObjectState,
        access: PackedAccess,
    ) -> Self {
        Self {
            id,
            offset,
            data_size,
            meta_size,
            refs,
            creator,
            state,
            delete_pending: false,
            residency: Residency::Resident,
            cold: false,
            access,
            fast_position: NO_POSITION,
        }
    }

    pub fn fast_position(&self) -> Option<u32> {
        (self.fast_position != NO_POSITION).then_some(self.fast_position)
    }

    pub fn set_fast_position(&mut self, position: Option<u32>) {
        self.fast_position = position.unwrap_or(NO_POSITION);
    }

    pub fn total_size(&self) -> u64 {
        self.data_size + self.meta_size as u64
    }

    /// Visible to get/contains: sealed and not on its way out.
    pub fn is_visible(&self) -> bool {
        self.state == ObjectState::Sealed && !self.delete_pending
    }
}

#[derive(Default)]
pub struct ObjectTable {
    slots: Vec<Option<Entry>>,
    free_slots: Vec<Slot>,
    index: HashTable<Slot>,
    hasher: RandomState,
}

impl ObjectTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// One past the largest slot number ever used (for policies sizing arrays).
    pub fn slot_bound(&self) -> usize {
        self.slots.len()
    }

    pub fn find(&self, id: &ObjectId) -> Option<Slot> {
        let hash = self.hasher.hash_one(id);
        let slots = &self.slots;
        self.index
            .find(hash, |&s| {
                slots[s as usize].as_ref().is_some_and(|e| e.id == *id)
            })
            .copied()
    }

    pub fn get(&self, slot: Slot) -> Option<&Entry> {
        self.slots.get(slot as usize).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, slot: Slot) -> Option<&mut Entry> {
        self.slots.get_mut(slot as usize).and_then(Option::as_mut)
    }

    /// Inserts an entry whose id is not in the table (the caller checked).
    pub fn insert(&mut self, entry: Entry) -> Slot {
        debug_assert!(self.find(&entry.id).is_none(), "duplicate id {}", entry.id);
        let hash = self.hasher.hash_one(entry.id);
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(entry);
                slot
            }
            None => {
                self.slots.push(Some(entry));
                (self.slots.len() - 1) as Slot
            }
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.insert_unique(hash, slot, |&s| {
            hasher.hash_one(slots[s as usize].as_ref().expect("indexed slot is live").id)
        });
        slot
    }

    pub fn remove(&mut self, slot: Slot) -> Entry {
        let entry = self.slots[slot as usize]
            .take()
            .expect("removing a live slot");
        let hash = self.hasher.hash_one(entry.id);
        match self.index.find_entry(hash, |&s| s == slot) {
            Ok(found) => {
                found.remove();
            }
            Err(_) => unreachable!("slot {slot} missing from the index"),
        }
        self.free_slots.push(slot);
        entry
    }

    pub fn iter(&self) -> impl Iterator<Item = (Slot, &Entry)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i as Slot, e)))
    }

    /// Heap bytes held by the table (for the per-object overhead report).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Option<Entry>>()
            + self.free_slots.capacity() * std::mem::size_of::<Slot>()
            + self.index.capacity() * (std::mem::size_of::<Slot>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: ObjectId) -> Entry {
        Entry {
            id,
            offset: 0,
            data_size: 1,
            meta_size: 0,
            refs: 0,
            creator: 0,
            state: ObjectState::Created,
            delete_pending: false,
            residency: Residency::Resident,
            cold: false,
            access: PackedAccess::default(),
            fast_position: NO_POSITION,
        }
    }

    #[test]
    fn reads_pack_into_one_word_and_wrap_with_the_clock() {
        let mut a = PackedAccess::default();
        assert_eq!(a.get(), Access::default());
        a.record(7);
        assert_eq!(
            a.get(),
            Access {
                last: 7,
                interval: 0
            }
        );
        a.record(12);
        assert_eq!(
            a.get(),
            Access {
                last: 12,
                interval: 5
            }
        );
        a.record(12 + INTERVAL_MAX + 100);
        assert_eq!(a.get().interval, INTERVAL_MAX, "saturates");
        let mut w = PackedAccess::default();
        w.record(CLOCK_MASK - 1);
        w.record(CLOCK_MASK + 3);
        assert_eq!(
            w.get(),
            Access {
                last: 2,
                interval: 4
            }
        );
    }

    #[test]
    fn insert_find_remove_reuse() {
        let mut t = ObjectTable::new();
        let ids: Vec<_> = (0..100).map(|_| ObjectId::random()).collect();
        let slots: Vec<_> = ids.iter().map(|id| t.insert(entry(*id))).collect();
        for (id, slot) in ids.iter().zip(&slots) {
            assert_eq!(t.find(id), Some(*slot));
        }
        let gone = t.remove(slots[7]);
        assert_eq!(gone.id, ids[7]);
        assert_eq!(t.find(&ids[7]), None);
        assert_eq!(t.len(), 99);
        let again = t.insert(entry(ObjectId::random()));
        assert_eq!(again, slots[7], "freed slots are reused");
        assert_eq!(t.iter().count(), 100);
    }

    #[test]
    fn entry_stays_small() {
        assert!(std::mem::size_of::<Option<Entry>>() <= 64);
    }
}
