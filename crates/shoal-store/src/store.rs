//! The store: object table + allocator + eviction policy + client references.
//!
//! This is the whole object life cycle (create → write → seal → get/release →
//! delete) as synchronous state transitions. Every operation validates first
//! and mutates only when it will succeed, so a bad request changes nothing.
//! Waiting (a get for an object not sealed yet, a create on a full store) is
//! the daemon's business: it retries these calls when something changes.
//!
//! Eviction is a decision, not a deletion: the policy names a victim, and an
//! [`EvictionGate`] (installed by the daemon, which asks the subsystems that
//! listen to it) says whether the victim's memory may be freed at once or
//! must stay until a holder — a tier copying the bytes out — calls
//! [`Store::finish_eviction`]. Without a gate every victim is freed at once.
//!
//! Each concern is one child module holding an `impl Store` block:
//! `life_cycle` (create → write → seal → get/release → delete), `eviction`
//! (candidates, victims and the gate), `fast_readers` (the shared index and
//! the objects kept for its readers), `clients` (per-client state,
//! disconnect, transfer), `placement` (where a block goes, resize),
//! `capacity`, `stats` (listings and counters), `invariants` and `lending`
//! (space lent for the fast path's creates). This file holds the types they
//! share, the store's state and its constructor, and the small helpers all
//! of them use: the children name this file's items, never the reverse, so
//! the modules form no cycle.

use std::collections::BTreeMap;

use foldhash::HashMapExt;

/// Per-client maps are on the get path: foldhash, not SipHash.
type HashMap<K, V> = foldhash::HashMap<K, V>;
type HashSet<T> = foldhash::HashSet<T>;

use shoal_core::event::ObjectEvent;
use shoal_core::fast_path::readers::Readers;
use shoal_core::ids::{ClientId, ObjectId};
use shoal_core::location::{Block, ObjectLocation};

use crate::allocator::Allocator;
use crate::eviction::{EvictionPolicy, Lru};
use crate::ghost_reads::{GhostReads, DEFAULT_GHOSTS};
use crate::object_table::{Access, Entry, ObjectTable, Slot};

/// An object the policy chose to leave memory, told to the gate while its
/// bytes are still valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Victim {
    pub id: ObjectId,
    pub location: ObjectLocation,
    /// Its reads on the store's access clock (see [`Store::access_clock`]).
    pub access: Access,
}

/// The gate's answer for one victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody needs the bytes: free the memory now.
    Free,
    /// Someone reads the bytes first; the memory stays allocated (and the
    /// object visible) until [`Store::finish_eviction`].
    Hold,
}

/// Decides, per victim, whether its memory may go at once. Called inside
/// the store's own operation: it must decide, never reach back into the
/// store.
pub trait EvictionGate {
    fn decide(&mut self, victim: &Victim) -> Verdict;
}

/// The principal holding references for clients that took them through the
/// shared index (the fast path), which the store learns of only when it is
/// about to free the memory: such an object is kept, with one reference in
/// this name, until no client's reference table counts it
/// ([`Store::sweep_fast_readers`]).
pub const FAST_READERS: ClientId = ClientId::MAX;

/// What one client holds: references per object and the objects it is writing.
#[derive(Default)]
struct ClientState {
    refs: HashMap<Slot, u32>,
    /// A set, not a list: a client may hold hundreds of thousands of
    /// unsealed objects, and seal, abort and disconnect must stay O(ids).
    creating: HashSet<Slot>,
    /// Space lent to it (the fast path's creates).
    lent: crate::lent::LentSpace,
    /// Its unsealed objects created in lent space, and the lease of each:
    /// an abort gives the bytes back to that lease.
    from_lease: HashMap<Slot, u64>,
}

pub struct Store {
    table: ObjectTable,
    allocator: Allocator,
    policy: Box<dyn EvictionPolicy>,
    /// Candidates their readers are done with ([`Store::cool`]), in the
    /// order they were cooled: they leave before the policy's own, the most
    /// recently cooled first.
    cold: Lru,
    clients: HashMap<ClientId, ClientState>,
    capacity: u64,
    /// The largest capacity the store has had: an object above it is too
    /// large, one below it only waits for room (a shrunk elastic store
    /// grows back).
    ceiling: u64,
    evictions: u64,
    evicted_bytes: u64,
    /// Ticks once per get: the time base of [`Access`].
    access_clock: u64,
    /// The read history of objects evicted from memory, given back to the
    /// entry that restores them.
    ghosts: GhostReads,
    /// Bytes of the policy's candidates (kept as they come and go, so a
    /// short create never walks the table).
    evictable_bytes: u64,
    /// Bytes of victims a holder is still copying out.
    evicting_bytes: u64,
    gate: Option<Box<dyn EvictionGate>>,
    /// Memory was freed, an object became evictable or the capacity grew
    /// since the last [`take_space_changed`](Self::take_space_changed).
    space_changed: bool,
    events: Vec<ObjectEvent>,
    /// The fast path's shared index and clients' reference tables (docs/
    /// fast-path.md); `None` when the daemon does not offer it.
    readers: Option<Readers>,
    /// Objects kept for fast-path readers, by the index position whose
    /// counts hold them.
    adopted: HashMap<u32, Slot>,
    /// Bytes lent to clients and not sealed yet (allocated, in no object).
    lent_bytes: u64,
    /// [`Store::record_fast_reads`]: where its next call goes on, and the
    /// clients' fast-path gets when its last call began.
    fast_read_cursor: usize,
    fast_gets_looked_at: u64,
    /// The number the next lease gets (unique in this store's life).
    next_lease: u64,
    /// Unsealed objects created with [`Placement::Growing`], by the end of
    /// their block: a growing create after one of them leaves it room.
    /// Entries whose object was sealed, aborted or moved are dropped when
    /// the next growing create looks.
    growing: BTreeMap<u64, (Slot, ObjectId)>,
}

/// Where a create puts an object's block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Best fit: the smallest free block that holds it.
    #[default]
    Packed,
    /// An object that will grow in place through [`Store::resize`] (a file
    /// being written): in the largest free block, halfway in when another
    /// growing object ends right before it (`Allocator::allocate_growing`).
    Growing,
}

impl Store {
    /// A store over a region of `region_size` bytes, of which at most
    /// `capacity` may be used, objects aligned and padded to `line` bytes.
    pub fn new(
        region_size: u64,
        capacity: u64,
        line: u64,
        policy: Box<dyn EvictionPolicy>,
    ) -> Self {
        let allocator = Allocator::new(region_size, line);
        Self {
            table: ObjectTable::new(),
            // Never more than the allocator can hand out (whole lines).
            capacity: capacity.min(allocator.size()),
            ceiling: capacity.min(allocator.size()),
            allocator,
            policy,
            cold: Lru::default(),
            clients: HashMap::new(),
            evictions: 0,
            evicted_bytes: 0,
            access_clock: 0,
            ghosts: GhostReads::new(DEFAULT_GHOSTS),
            evictable_bytes: 0,
            evicting_bytes: 0,
            gate: None,
            space_changed: false,
            events: Vec::new(),
            fast_read_cursor: 0,
            fast_gets_looked_at: 0,
            readers: None,
            adopted: HashMap::new(),
            lent_bytes: 0,
            next_lease: 1,
            growing: BTreeMap::new(),
        }
    }

    /// Events since the last call (seals, removals, aborts), for the node
    /// to hand on.
    pub fn take_events(&mut self) -> Vec<ObjectEvent> {
        std::mem::take(&mut self.events)
    }

    /// Whether memory may have become available since the last call (freed,
    /// newly evictable, or a larger capacity): waiting creates retry.
    pub fn take_space_changed(&mut self) -> bool {
        std::mem::take(&mut self.space_changed)
    }

    fn client(&mut self, client: ClientId) -> &mut ClientState {
        self.clients.entry(client).or_default()
    }

    fn block_of(&self, entry: &Entry) -> Block {
        let len = self
            .allocator
            .block_len(entry.total_size())
            .expect("sizes were checked at create");
        Block {
            offset: entry.offset,
            len,
        }
    }

    fn pinned_bytes(&self) -> u64 {
        self.allocator.used() - self.evictable_bytes - self.evicting_bytes
    }
}

mod capacity;
mod clients;
mod eviction;
mod fast_readers;
mod invariants;
mod lending;
mod life_cycle;
mod placement;
mod stats;
#[cfg(test)]
mod test_support;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_never_exceeds_whole_lines_of_the_region() {
        let s = Store::new(1000, 1 << 20, 64, Box::new(Lru::default()));
        assert_eq!(s.stats().capacity, 960);
    }
}
