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

use crate::ids::ObjectId;

pub type Slot = u32;
pub type ClientId = u32;

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
}

impl Entry {
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
        }
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
