//! References taken without a round trip: each client counts the objects it
//! got from the shared index in a table of its own (one u32 per index
//! position, in a memfd the daemon made for it), and the daemon reads every
//! live client's table before it frees memory an index entry pointed at.
//!
//! The rule that makes this safe (docs/fast-path.md, invariant 4) is a
//! store-then-load on each side, all sequentially consistent:
//! - a reader adds 1 at the entry's position, then re-reads the slot's
//!   version and gives the count back if it changed;
//! - the daemon unpublishes the entry (a version change), then reads the
//!   counts at its position.
//!
//! Either the daemon sees the count, or the reader sees the new version:
//! never neither. A count is only ever "zero or not" to the daemon, so a
//! client writing garbage into its own table can only keep objects in
//! memory (as holding references would), never free one another reads.
//!
//! A client's table dies with its connection: the daemon drops it, so
//! whatever a killed client held is released at once.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use super::index::{add_seals, sealed_memfd, Found, IndexReader, IndexWriter};
use crate::error::{Result, ShoalError};
use crate::ids::ObjectId;
use crate::object_table::ClientId;

/// Bytes of a reference table for an index of `slots` slots: a 64-byte
/// header (u64 words: the client's fast-path gets so far; references it
/// holds now; revoked — set by the daemon when the connection ends, after
/// which the client's gets take no reference), then per position the
/// references held (u32) and the gets made there (u32, wrapping; the
/// daemon's eviction policy learns of fast-path reads from it).
pub fn table_bytes(slots: u32) -> usize {
    HEADER + 8 * slots as usize
}

const HEADER: usize = 64;

/// One table of counts, mapped read-write.
struct Counts {
    map: MmapRaw,
    slots: usize,
}

impl Counts {
    fn map(fd: BorrowedFd<'_>, slots: u32) -> Result<Self> {
        let file = File::from(
            fd.try_clone_to_owned()
                .map_err(|e| ShoalError::io("dup", e))?,
        );
        let len = file
            .metadata()
            .map_err(|e| ShoalError::io("stat a reference table", e))?
            .len();
        if len < table_bytes(slots) as u64 {
            return Err(ShoalError::protocol("the reference table is too short"));
        }
        let map = MmapOptions::new()
            .len(table_bytes(slots))
            .map_raw(&file)
            .map_err(|e| ShoalError::io("map a reference table", e))?;
        Ok(Self {
            map,
            slots: slots as usize,
        })
    }

    /// The references held at `position`.
    fn at(&self, position: u32) -> &AtomicU32 {
        self.word(position, 0)
    }

    /// The gets made at `position`.
    fn reads(&self, position: u32) -> &AtomicU32 {
        self.word(position, 1)
    }

    fn word(&self, position: u32, which: usize) -> &AtomicU32 {
        let position = position as usize & (self.slots - 1);
        // SAFETY: in bounds (masked; the mapping holds the header and
        // `slots` pairs), aligned (page-aligned base), alive as long as
        // `self`; every process touches the table only atomically.
        unsafe {
            &*(self
                .map
                .as_mut_ptr()
                .add(HEADER)
                .cast::<AtomicU32>()
                .add(2 * position + which))
        }
    }

    /// The client's fast-path gets so far.
    fn total(&self) -> &AtomicU64 {
        self.header(0)
    }

    /// References the client holds now (its own bookkeeping: a hint for the
    /// daemon, never a safety input).
    fn holding(&self) -> &AtomicU64 {
        self.header(1)
    }

    /// Set by the daemon once it stopped reading this table.
    fn revoked(&self) -> &AtomicU64 {
        self.header(2)
    }

    fn header(&self, word: usize) -> &AtomicU64 {
        debug_assert!(word < HEADER / 8);
        // SAFETY: a header word, in bounds and aligned.
        unsafe { &*(self.map.as_mut_ptr().cast::<AtomicU64>().add(word)) }
    }
}

/// The daemon's side: the index it publishes in, and every connected
/// client's reference table.
pub struct Readers {
    index: IndexWriter,
    /// Per position, the sum of clients' get counters when the daemon last
    /// looked (private to the daemon).
    seen: Vec<u32>,
    /// Mapped only: the fd went to the client (the daemon keeps no fd per
    /// client for this, so the fast path does not halve how many clients
    /// a daemon's fd limit allows).
    tables: foldhash::HashMap<ClientId, Counts>,
    /// Fast-path gets of clients that have gone.
    gets_of_departed: u64,
}

impl Readers {
    pub fn new(slots: u32) -> Result<Self> {
        Ok(Self {
            index: IndexWriter::create(slots)?,
            seen: vec![0; slots as usize],
            tables: foldhash::HashMap::default(),
            gets_of_departed: 0,
        })
    }

    pub fn index(&self) -> &IndexWriter {
        &self.index
    }

    pub fn index_mut(&mut self) -> &mut IndexWriter {
        &mut self.index
    }

    /// A table for `client` (replacing any it had): the returned fd goes to
    /// the client, which maps it and counts its references there.
    pub fn add_client(&mut self, client: ClientId) -> Result<OwnedFd> {
        let slots = self.index.slots();
        let fd = sealed_memfd("shoal-refs", table_bytes(slots) as u64)?;
        add_seals(fd.as_fd(), libc::F_SEAL_SEAL)?;
        let counts = Counts::map(fd.as_fd(), slots)?;
        self.tables.insert(client, counts);
        Ok(fd)
    }

    /// Whether `client` has a reference table (reads through the index).
    pub fn has_client(&self, client: ClientId) -> bool {
        self.tables.contains_key(&client)
    }

    /// Whether `client` counts any reference at all (a scan of its table:
    /// for rare decisions, such as which idle connection to close).
    pub fn holds_any(&self, client: ClientId) -> bool {
        self.tables.get(&client).is_some_and(|counts| {
            (0..counts.slots as u32).any(|p| counts.at(p).load(Ordering::Relaxed) != 0)
        })
    }

    /// Drops `client`'s table and with it every reference it counted.
    /// Returns whether it had one.
    pub fn remove_client(&mut self, client: ClientId) -> bool {
        let Some(counts) = self.tables.remove(&client) else {
            return false;
        };
        // A client still alive (its connection closed by the daemon) must
        // not count references nobody reads any more: it sees this after
        // counting and gives the reference back (the same pairing as the
        // index's version).
        counts.revoked().store(1, Ordering::SeqCst);
        self.gets_of_departed += counts.total().load(Ordering::Relaxed);
        true
    }

    /// Positions at which some client counts a reference, from the tables
    /// of clients that say they hold any (a scan of those tables).
    pub fn held_positions(&self) -> Vec<u32> {
        let mut held = Vec::new();
        for counts in self.tables.values() {
            if counts.holding().load(Ordering::Relaxed) == 0 {
                continue;
            }
            held.extend(
                (0..counts.slots as u32).filter(|&p| counts.at(p).load(Ordering::Relaxed) != 0),
            );
        }
        held
    }

    /// Whether any client says it holds a reference now (a hint).
    pub fn any_holding(&self) -> bool {
        self.tables
            .values()
            .any(|c| c.holding().load(Ordering::Relaxed) != 0)
    }

    /// Gets served through the fast path so far, by every client (as the
    /// clients count them: a metric, not a safety input).
    pub fn gets(&self) -> u64 {
        self.tables.values().fold(self.gets_of_departed, |sum, t| {
            sum.wrapping_add(t.total().load(Ordering::Relaxed))
        })
    }

    /// References clients count at `position` (for listings; capped per
    /// client, as a client writes its own table).
    pub fn references(&self, position: u32) -> u32 {
        self.tables.values().fold(0u32, |sum, t| {
            sum.saturating_add(t.at(position).load(Ordering::Relaxed).min(1 << 16))
        })
    }

    pub fn clients(&self) -> usize {
        self.tables.len()
    }

    /// Whether a client got the object at `position` through the fast path
    /// since the last look (the first look after a publish only takes the
    /// count). An eviction policy's "was it read?" for reads it never saw.
    pub fn read_since_last_look(&mut self, position: u32) -> bool {
        let sum = self.tables.values().fold(0u32, |sum, t| {
            sum.wrapping_add(t.reads(position).load(Ordering::Relaxed))
        });
        let mask = self.seen.len() - 1;
        let seen = &mut self.seen[position as usize & mask];
        std::mem::replace(seen, sum) != sum
    }

    /// Whether any live client counts a reference at `position`. Called
    /// after the entry there was unpublished (see the module's rule).
    pub fn held(&self, position: u32) -> bool {
        fence(Ordering::SeqCst);
        self.tables
            .values()
            .any(|counts| counts.at(position).load(Ordering::SeqCst) != 0)
    }
}

/// A client's side: the index, read-only, and its own reference table.
pub struct FastReads {
    index: IndexReader,
    counts: Counts,
    /// This client learned its daemon is gone (its connection failed): no
    /// more answers from the index.
    closed: std::sync::atomic::AtomicBool,
}

impl FastReads {
    /// Maps the index and this client's table, both received from the
    /// daemon. A table shorter than the index needs is refused.
    pub fn attach(index: BorrowedFd<'_>, table: BorrowedFd<'_>) -> Result<Self> {
        let index = IndexReader::attach(index)?;
        let counts = Counts::map(table, index.slots())?;
        Ok(Self {
            index,
            counts,
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Takes a reference to `id` if the index has it: `None` means "ask the
    /// daemon" (not published, being removed, or a race lost twice).
    pub fn acquire(&self, id: &ObjectId) -> Option<Found> {
        if self.closed.load(Ordering::Relaxed) {
            return None;
        }
        for _ in 0..2 {
            let found = self.index.lookup(id)?;
            let count = self.counts.at(found.position);
            count.fetch_add(1, Ordering::SeqCst);
            if self.counts.revoked().load(Ordering::SeqCst) != 0 {
                count.fetch_sub(1, Ordering::SeqCst);
                self.close();
                return None;
            }
            if self.index.version(found.position) == found.version {
                self.counts.holding().fetch_add(1, Ordering::Relaxed);
                self.counts
                    .reads(found.position)
                    .fetch_add(1, Ordering::Relaxed);
                self.counts.total().fetch_add(1, Ordering::Relaxed);
                return Some(found);
            }
            // Unpublished (or moved) meanwhile: the daemon may not have seen
            // our count, so it must not stand.
            count.fetch_sub(1, Ordering::SeqCst);
        }
        None
    }

    /// Whether `id` is published: sealed, visible and in memory (`false`
    /// says nothing: ask the daemon).
    pub fn published(&self, id: &ObjectId) -> bool {
        !self.closed.load(Ordering::Relaxed) && self.index.lookup(id).is_some()
    }

    /// Whether `id` may be being written by some client (ask the daemon).
    pub fn maybe_creating(&self, id: &ObjectId) -> bool {
        self.index.maybe_creating(id)
    }

    /// Whether the daemon sleeps until its doorbell rings.
    pub fn daemon_asleep(&self) -> bool {
        self.index.daemon_asleep()
    }

    /// Stops answering from the index: the connection to the daemon failed
    /// (a killed daemon cannot close its index itself).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Whether [`close`](Self::close) was called (the daemon is gone).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// [`acquire`](Self::acquire) for an object in `mapping` (the client's
    /// view of the region): a location outside it (only a corrupt index
    /// could say so) is given back and missed; the range is populated for
    /// reading.
    pub fn acquire_in(&self, id: &ObjectId, mapping: &crate::region::Mapping) -> Option<Found> {
        let found = self.acquire(id)?;
        let l = found.location;
        if !mapping.holds(&l) {
            self.release(found.position);
            return None;
        }
        mapping.populate_on_use(l.offset, l.size(), false);
        Some(found)
    }

    /// Gives back a reference [`acquire`](Self::acquire) took at `position`.
    pub fn release(&self, position: u32) {
        let count = self.counts.at(position);
        // Never below zero, whatever the caller does twice.
        if count
            .fetch_update(Ordering::Release, Ordering::Relaxed, |c| c.checked_sub(1))
            .is_ok()
        {
            self.counts.holding().fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// References this client counts at `position` (tests, diagnostics).
    pub fn count(&self, position: u32) -> u32 {
        self.counts.at(position).load(Ordering::Relaxed)
    }
}

/// The daemon's mutations of the index and the reader tables, for tests in
/// one process: both sides over the same memfds.
#[cfg(test)]
pub(crate) fn pair(slots: u32, client: ClientId) -> (Readers, FastReads) {
    let mut readers = Readers::new(slots).expect("memfd");
    let table = readers.add_client(client).expect("table");
    let fast = FastReads::attach(readers.index().fd(), table.as_fd()).unwrap();
    (readers, fast)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::location::ObjectLocation;

    fn id(n: u8) -> ObjectId {
        ObjectId([n; 20])
    }

    const AT: ObjectLocation = ObjectLocation {
        offset: 128,
        data_size: 10,
        meta_size: 0,
    };

    #[test]
    fn a_reference_is_seen_until_released_and_a_dropped_client_holds_nothing() {
        let (mut readers, fast) = pair(1 << 12, 7);
        let p = readers.index_mut().publish(&id(1), AT, |_| false).unwrap();
        let found = fast.acquire(&id(1)).unwrap();
        assert_eq!(found.location, AT);
        readers.index_mut().unpublish(p);
        assert!(readers.held(p));
        fast.release(p);
        assert!(!readers.held(p));
        fast.release(p);
        assert_eq!(fast.count(p), 0, "a second release does not wrap");
        readers.index_mut().republish(p);
        fast.acquire(&id(1)).unwrap();
        assert!(readers.held(p));
        assert!(readers.remove_client(7));
        assert!(!readers.held(p), "the table went with its client");
    }

    #[test]
    fn an_unpublished_entry_cannot_be_acquired() {
        let (mut readers, fast) = pair(1 << 12, 1);
        let p = readers.index_mut().publish(&id(2), AT, |_| false).unwrap();
        readers.index_mut().unpublish(p);
        assert!(fast.acquire(&id(2)).is_none());
        assert_eq!(fast.count(p), 0);
    }

    /// The Dekker pairing under real threads: the daemon unpublishes and
    /// looks; while it believes no reader holds the object ("freed"), no
    /// reader may be holding a reference it acquired.
    #[test]
    fn the_daemon_never_misses_a_reference_that_stands() {
        use std::sync::atomic::AtomicBool;
        let (readers, fast) = pair(1 << 12, 1);
        let readers = std::sync::Mutex::new(readers);
        let stop = AtomicBool::new(false);
        let freed = AtomicBool::new(false);
        let position = readers
            .lock()
            .unwrap()
            .index_mut()
            .publish(&id(3), AT, |_| false)
            .unwrap();
        let (mut frees, mut kept) = (0, 0);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut held = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(found) = fast.acquire(&id(3)) {
                        held += 1;
                        assert!(
                            !freed.load(Ordering::SeqCst),
                            "a reference stands on memory the daemon freed"
                        );
                        fast.release(found.position);
                    }
                }
                held
            });
            for _ in 0..50_000 {
                let mut r = readers.lock().unwrap();
                r.index_mut().unpublish(position);
                if r.held(position) {
                    kept += 1;
                } else {
                    frees += 1;
                    freed.store(true, Ordering::SeqCst);
                    std::hint::spin_loop();
                    freed.store(false, Ordering::SeqCst);
                }
                r.index_mut().republish(position);
                drop(r);
                // Published a while, so the reader gets references too.
                for _ in 0..200 {
                    std::hint::spin_loop();
                }
            }
            stop.store(true, Ordering::Relaxed);
            assert!(reader.join().unwrap() > 0, "the reader got references");
        });
        assert!(frees > 0);
        let _ = kept;
    }
}
