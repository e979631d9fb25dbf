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
//!
//! Peer tables (docs/fast-path.md "Gets of other nodes' objects"): in a
//! mapped, coherent cluster a client also counts references to another
//! node's objects, in a table its own daemon made ([`PeerTable`]) and the
//! owner attached ([`Readers::attach_peer_table`]). The owner reads it like
//! a client's table (and writes only its revoked word, when it drops it); its daemon revokes it when the client
//! leaves (the owner then ignores it) and closes it to new gets when the
//! owner seems gone.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use super::index::{add_seals, sealed_memfd, Found, IndexReader, IndexWriter};
use crate::error::{Result, ShoalError};
use crate::ids::ClientId;
use crate::ids::ObjectId;

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

    /// Set by a peer table's daemon when the owner seems gone: no new gets
    /// (references already counted still stand at the owner).
    fn stopped(&self) -> &AtomicU64 {
        self.header(3)
    }

    fn is_revoked(&self) -> bool {
        self.revoked().load(Ordering::SeqCst) != 0
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
    /// Tables of other nodes' clients, by the peer's principal and the
    /// peer's key for the table. One its daemon revoked counts nothing and
    /// is dropped at the peer's next attach.
    peer_tables: foldhash::HashMap<(ClientId, u64), Counts>,
    /// Fast-path gets of clients that have gone.
    gets_of_departed: u64,
}

impl Readers {
    /// A new, empty index of `slots` slots (a power of two: see `index::slots_for`) and no
    /// tables yet.
    pub fn new(slots: u32) -> Result<Self> {
        Ok(Self {
            index: IndexWriter::create(slots)?,
            seen: vec![0; slots as usize],
            tables: foldhash::HashMap::default(),
            peer_tables: foldhash::HashMap::default(),
            gets_of_departed: 0,
        })
    }

    /// Every table whose counts stand: the clients' and the peer tables
    /// their daemons did not revoke.
    fn live_tables(&self) -> impl Iterator<Item = &Counts> {
        self.tables
            .values()
            .chain(self.peer_tables.values().filter(|c| !c.is_revoked()))
    }

    /// Attaches a peer's table (`fd`, received from the peer's daemon by
    /// `/proc/PID/fd`): its counts keep objects from being freed from now
    /// on, under `owner` (the peer's principal) and the peer's `key`. The
    /// table must be a memfd sealed against shrinking (so no one can make
    /// this daemon fault on it) and as long as the index needs. The peer's
    /// tables it revoked since are dropped first.
    pub fn attach_peer_table(
        &mut self,
        owner: ClientId,
        key: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: fcntl on a descriptor the caller holds; F_GET_SEALS takes no argument.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(ShoalError::invalid(
                "a peer's reference table must be a memfd sealed against shrinking",
            ));
        }
        let counts = Counts::map(fd, self.index.slots())?;
        self.drop_peer_tables(|o, c| o == owner && c.is_revoked());
        self.peer_tables.insert((owner, key), counts);
        Ok(())
    }

    /// Drops the peer tables `drop` names, revoked (their clients count
    /// nothing there any more), their gets kept in the total. Returns
    /// whether it dropped any.
    fn drop_peer_tables(&mut self, drop: impl Fn(ClientId, &Counts) -> bool) -> bool {
        let dropped: Vec<Counts> = self
            .peer_tables
            .extract_if(|(o, _), c| drop(*o, c))
            .map(|(_, c)| c)
            .collect();
        for counts in &dropped {
            counts.revoked().store(1, Ordering::SeqCst);
            let gets = counts.total().load(Ordering::Relaxed);
            self.gets_of_departed = self.gets_of_departed.wrapping_add(gets);
        }
        !dropped.is_empty()
    }

    /// Whether `owner` has peer tables here (revoked ones included).
    pub fn has_peer_tables(&self, owner: ClientId) -> bool {
        self.peer_tables.keys().any(|(o, _)| *o == owner)
    }

    /// Peer tables attached now (revoked ones not dropped yet included).
    pub fn peer_tables(&self) -> usize {
        self.peer_tables.len()
    }

    /// Moves `from`'s peer tables to `to` (a fenced peer's holdings go to
    /// quarantine with its other references).
    pub fn transfer_peer_tables(&mut self, from: ClientId, to: ClientId) {
        let moved: Vec<((ClientId, u64), Counts)> = self
            .peer_tables
            .extract_if(|(o, _), _| *o == from)
            .collect();
        for ((_, key), counts) in moved {
            self.peer_tables.insert((to, key), counts);
        }
    }

    /// The index, for lookups of what is published where.
    pub fn index(&self) -> &IndexWriter {
        &self.index
    }

    /// The index, to publish and unpublish in (the store does so as objects come and go).
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

    /// Whether `client` counts any reference at all (a scan of its table,
    /// or of a peer's live tables: for rare decisions, such as which idle
    /// connection to close).
    pub fn holds_any(&self, client: ClientId) -> bool {
        let holds = |counts: &Counts| {
            (0..counts.slots as u32).any(|p| counts.at(p).load(Ordering::Relaxed) != 0)
        };
        self.tables.get(&client).is_some_and(holds)
            || self
                .peer_tables
                .iter()
                .any(|((o, _), c)| *o == client && !c.is_revoked() && holds(c))
    }

    /// Drops `client`'s table and with it every reference it counted.
    /// Returns whether it had one.
    pub fn remove_client(&mut self, client: ClientId) -> bool {
        // A peer's tables go with its principal (it restarted, or its
        // quarantine ended).
        let had_peer_tables = self.drop_peer_tables(|o, _| o == client);
        let Some(counts) = self.tables.remove(&client) else {
            return had_peer_tables;
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
        for counts in self.live_tables() {
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
        self.live_tables()
            .any(|c| c.holding().load(Ordering::Relaxed) != 0)
    }

    /// Gets served through the fast path so far, by every client (as the
    /// clients count them: a metric, not a safety input).
    pub fn gets(&self) -> u64 {
        // Every table, revoked ones too: a counter never goes down.
        self.tables
            .values()
            .chain(self.peer_tables.values())
            .fold(self.gets_of_departed, |sum, t| {
                sum.wrapping_add(t.total().load(Ordering::Relaxed))
            })
    }

    /// References clients count at `position` (for listings; capped per
    /// client, as a client writes its own table).
    pub fn references(&self, position: u32) -> u32 {
        self.live_tables().fold(0u32, |sum, t| {
            sum.saturating_add(t.at(position).load(Ordering::Relaxed).min(1 << 16))
        })
    }

    /// Local clients with a reference table (peer tables not counted: see
    /// [`Readers::peer_tables`]).
    pub fn clients(&self) -> usize {
        self.tables.len()
    }

    /// Whether a client got the object at `position` through the fast path
    /// since the last look (the first look after a publish only takes the
    /// count). An eviction policy's "was it read?" for reads it never saw.
    pub fn read_since_last_look(&mut self, position: u32) -> bool {
        let sum = self.live_tables().fold(0u32, |sum, t| {
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
        // (A peer table's revoke is read before its counts: one revoked
        // after this look still counted here, as a client's would.)
        self.live_tables()
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
            if self.counts.revoked().load(Ordering::SeqCst) != 0
                || self.counts.stopped().load(Ordering::SeqCst) != 0
            {
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

/// A reference table this node's daemon made for one of its clients to
/// count references to another node's objects in: the client maps it (as
/// its own table), the owner attaches it. The daemon keeps it to
/// revoke it when the client leaves, or stop its gets when the owner seems
/// gone.
pub struct PeerTable {
    counts: Counts,
    fd: OwnedFd,
}

impl PeerTable {
    /// A table for an owner whose index has `slots` slots, in a memfd sealed
    /// against resizing (the owner refuses any other).
    pub fn create(slots: u32) -> Result<Self> {
        let fd = sealed_memfd("shoal-peer-refs", table_bytes(slots) as u64)?;
        add_seals(fd.as_fd(), libc::F_SEAL_SEAL)?;
        let counts = Counts::map(fd.as_fd(), slots)?;
        Ok(Self { counts, fd })
    }

    /// The table's memfd: handed to the client (which maps it as its own table) and to the
    /// owner (which attaches it through `/proc/PID/fd`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The client left: the owner stops counting what it held, and a
    /// client still alive takes no reference through it.
    pub fn revoke(&self) {
        self.counts.revoked().store(1, Ordering::SeqCst);
    }

    /// References the client says it counts here now.
    pub fn holding(&self) -> u64 {
        self.counts.holding().load(Ordering::Relaxed)
    }

    /// The owner seems gone (restarted, or silent): no new gets through it;
    /// what was counted still stands at the owner, if it is alive.
    pub fn stop(&self) {
        self.counts.stopped().store(1, Ordering::SeqCst);
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

    #[test]
    fn a_peer_table_counts_until_revoked_and_goes_with_its_peer() {
        let mut readers = Readers::new(1 << 12).unwrap();
        let table = PeerTable::create(1 << 12).unwrap();
        const PEER: ClientId = 1 << 20;
        readers.attach_peer_table(PEER, 9, table.fd()).unwrap();
        let fast = FastReads::attach(readers.index().fd(), table.fd()).unwrap();
        let p = readers.index_mut().publish(&id(4), AT, |_| false).unwrap();
        fast.acquire(&id(4)).unwrap();
        readers.index_mut().unpublish(p);
        assert!(readers.held(p), "a peer's count keeps the object");
        assert!(readers.holds_any(PEER));
        readers.transfer_peer_tables(PEER, PEER + 1);
        assert!(readers.held(p) && readers.holds_any(PEER + 1) && !readers.holds_any(PEER));
        table.revoke();
        assert!(!readers.held(p), "a revoked table counts nothing");
        readers.index_mut().republish(p);
        assert!(fast.acquire(&id(4)).is_none(), "and takes no new reference");
        assert_eq!(readers.peer_tables(), 1);
        let second = PeerTable::create(1 << 12).unwrap();
        readers
            .attach_peer_table(PEER + 1, 10, second.fd())
            .unwrap();
        assert_eq!(readers.peer_tables(), 1, "the revoked one was dropped");
        assert!(readers.remove_client(PEER + 1));
        assert_eq!(readers.peer_tables(), 0);
    }

    #[test]
    fn a_stopped_peer_table_takes_no_new_reference_and_keeps_the_old() {
        let mut readers = Readers::new(1 << 12).unwrap();
        let table = PeerTable::create(1 << 12).unwrap();
        readers.attach_peer_table(3, 1, table.fd()).unwrap();
        let fast = FastReads::attach(readers.index().fd(), table.fd()).unwrap();
        let p = readers.index_mut().publish(&id(5), AT, |_| false).unwrap();
        fast.acquire(&id(5)).unwrap();
        table.stop();
        assert!(fast.acquire(&id(5)).is_none());
        readers.index_mut().unpublish(p);
        assert!(readers.held(p), "the reference taken before still stands");
    }

    #[test]
    fn a_peer_table_that_could_shrink_is_refused() {
        let mut readers = Readers::new(1 << 12).unwrap();
        let file = tempfile_table(table_bytes(1 << 12) as u64);
        let err = readers.attach_peer_table(3, 1, file.as_fd()).unwrap_err();
        assert!(err.to_string().contains("sealed"), "{err}");
        // Sealed, but too short for the index.
        let short = PeerTable::create(1 << 10).unwrap();
        assert!(readers.attach_peer_table(3, 2, short.fd()).is_err());
        assert_eq!(readers.peer_tables(), 0);
    }

    fn tempfile_table(len: u64) -> OwnedFd {
        use nix::sys::memfd::{memfd_create, MFdFlags};
        let fd = memfd_create("unsealed", MFdFlags::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&fd, len as i64).unwrap();
        fd
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
