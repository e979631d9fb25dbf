//! The shared object index: a read-mostly table in shared memory that the
//! daemon writes and every client of the node reads, so a get of a sealed,
//! resident object needs no round trip (docs/fast-path.md, piece 4).
//!
//! Layout, in a file of its own (a sealed memfd: clients can map it only
//! read-only and cannot resize it):
//!
//! | offset | field |
//! | --- | --- |
//! | 0 | magic `SHOALIDX`, slot count (u64, a power of two), closed (u64: 1 once the daemon stopped), asleep (u64: 1 while the daemon waits for a doorbell, [`super::writes`]) |
//! | 64 + 64·p | slot `p`: version, state, id (3 words), offset, data size, metadata size |
//! | 64 + 64·slots | the creating filter: [`CREATING`] u32 counters |
//!
//! Each slot is one 64-byte line of u64 words. The daemon is the only
//! writer; a slot changes under a sequence lock (version odd while it is
//! being written), and readers retry a read that saw an odd or changed
//! version. Open addressing with linear probing from a hash of the id; a
//! removed entry leaves a tombstone (probing goes on past it) that a later
//! publish reuses. No entry is ever moved: a client's reference counts are
//! kept per slot position ([`super::readers`]), so a position names the same
//! object for as long as it is live there.
//!
//! Written by hand: concurrent hash maps (dashmap, papaya) live in one
//! process's heap; this table has a fixed layout in a file other processes
//! map, and its retry rule is part of the protocol.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{Result, ShoalError};
use crate::ids::ObjectId;
use crate::location::ObjectLocation;

const MAGIC: u64 = u64::from_le_bytes(*b"SHOALIDX");
const HEADER: usize = 64;
const SLOT: usize = 64;
const WORDS: usize = SLOT / 8;

/// A lookup gives up after this many positions (and a publish never places
/// an entry further from its home): a miss costs at most this many slot
/// reads, then the socket path answers.
pub const MAX_PROBE: usize = 32;

const EMPTY: u64 = 0;
const LIVE: u64 = 1;
const TOMBSTONE: u64 = 2;

// Word positions inside a slot.
const VERSION: usize = 0;
const STATE: usize = 1;
const ID: usize = 2; // three words: 20 id bytes, zero-padded
const OFFSET: usize = 5;
const DATA_SIZE: usize = 6;
const META_SIZE: usize = 7;

/// Bytes of an index of `slots` slots, with the creating filter after them.
pub fn bytes_needed(slots: u32) -> usize {
    HEADER + SLOT * slots as usize + 4 * CREATING
}

/// Counters of the creating filter: objects being written (created, not
/// sealed or aborted) per hash of their id. A client about to create in lent
/// space asks the daemon instead when its id's counter is not zero, so an id
/// another client is writing is refused at create, as on the socket path.
pub const CREATING: usize = 4096;

fn creating_counter(id: &ObjectId) -> usize {
    home(id, usize::MAX) % CREATING
}

/// The slot count for a region of `region_size` bytes: one slot per 16 KiB
/// of region (the index is ~0.4 % of it), between 2^12 and 2^20.
pub fn slots_for(region_size: u64) -> u32 {
    let wanted = (region_size / (16 << 10)).clamp(1 << 12, 1 << 20);
    wanted.next_power_of_two().min(1 << 20) as u32
}

/// Where an id's probe starts. Fixed, not seeded: every process must agree.
/// (A caller choosing colliding ids only makes its own gets take the socket.)
fn home(id: &ObjectId, mask: usize) -> usize {
    let words = id_words(id);
    let mixed = words[0]
        ^ words[1].rotate_left(21)
        ^ words[2].rotate_left(42).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed.wrapping_mul(0xbf58_476d_1ce4_e5b9) >> 32) as usize & mask
}

fn id_words(id: &ObjectId) -> [u64; 3] {
    let b = id.as_bytes();
    let mut tail = [0u8; 8];
    tail[..4].copy_from_slice(&b[16..20]);
    [
        u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        u64::from_le_bytes(tail),
    ]
}

/// The words of a mapped index.
struct Words {
    map: MmapRaw,
    slots: usize,
}

impl Words {
    fn word(&self, index: usize) -> &AtomicU64 {
        debug_assert!(index < (HEADER + SLOT * self.slots) / 8);
        // SAFETY: the mapping is at least `bytes_needed(slots)` long (checked
        // when attached), page-aligned, and lives as long as `self`; every
        // process touches these words only atomically.
        unsafe { &*(self.map.as_mut_ptr().cast::<AtomicU64>().add(index)) }
    }

    fn slot(&self, position: usize, word: usize) -> &AtomicU64 {
        self.word(HEADER / 8 + position * WORDS + word)
    }

    /// Counter `i` of the creating filter.
    fn filter(&self, i: usize) -> &AtomicU32 {
        debug_assert!(i < CREATING);
        // SAFETY: the filter's u32 counters follow the slots inside the
        // mapping (bytes_needed counts them), 4-byte aligned.
        unsafe {
            &*(self
                .map
                .as_mut_ptr()
                .add(HEADER + SLOT * self.slots)
                .cast::<AtomicU32>()
                .add(i))
        }
    }
}

/// One live entry as a reader saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The slot it is in: the reader's reference is counted there.
    pub position: u32,
    /// The slot's version when read: unchanged after the reference was
    /// counted means the entry was still live.
    pub version: u64,
    /// Where the object is in this node's region, as the slot said at `version`.
    pub location: ObjectLocation,
}

/// The daemon's side: the only writer.
pub struct IndexWriter {
    file: OwnedFd,
    words: Words,
    live: usize,
}

impl Drop for IndexWriter {
    fn drop(&mut self) {
        self.close();
    }
}

impl IndexWriter {
    /// A new, empty index of `slots` slots (a power of two) in a memfd that
    /// clients can map only read-only.
    pub fn create(slots: u32) -> Result<Self> {
        if !slots.is_power_of_two() {
            return Err(ShoalError::invalid("index slots must be a power of two"));
        }
        let file = sealed_memfd("shoal-index", bytes_needed(slots) as u64)?;
        let map = MmapOptions::new()
            .len(bytes_needed(slots))
            .map_raw(&File::from(file.try_clone().map_err(io("dup the index"))?))
            .map_err(io("map the index"))?;
        // The daemon's mapping above stays writable; every later one is
        // read-only (F_SEAL_FUTURE_WRITE): a client cannot write the index.
        add_seals(file.as_fd(), libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL)?;
        let words = Words {
            map,
            slots: slots as usize,
        };
        words.word(0).store(MAGIC, Ordering::Relaxed);
        words.word(1).store(u64::from(slots), Ordering::Release);
        Ok(Self {
            file,
            words,
            live: 0,
        })
    }

    /// Says whether the daemon sleeps until a client rings its doorbell
    /// (clients that published a write record then ring it).
    pub fn set_asleep(&self, asleep: bool) {
        self.words
            .word(3)
            .store(u64::from(asleep), Ordering::SeqCst);
    }

    /// Counts `id` as being written (`true`) or not any more (`false`).
    pub fn note_creating(&self, id: &ObjectId, creating: bool) {
        let counter = self.words.filter(creating_counter(id));
        if creating {
            counter.fetch_add(1, Ordering::SeqCst);
        } else {
            // Never below zero, whatever went before.
            let _ = counter.fetch_update(Ordering::SeqCst, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// Tells readers the daemon is stopping: every lookup misses from now
    /// on, so clients ask the daemon (and learn it is gone) instead of
    /// answering from an index nobody maintains. (A daemon killed outright
    /// cannot say so: its clients keep reading what it had published, whose
    /// memory stays theirs while mapped, until their next request fails.)
    pub fn close(&mut self) {
        self.words.word(2).store(1, Ordering::SeqCst);
    }

    /// The file clients map.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// The slot count (a power of two), as the `FastReads` reply and the header say it.
    pub fn slots(&self) -> u32 {
        self.words.slots as u32
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no entry is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    fn state(&self, position: usize) -> u64 {
        self.words.slot(position, STATE).load(Ordering::Relaxed)
    }

    /// Makes `id` visible to readers at `location`. `None` when it cannot
    /// be placed: the table is 3/4 full, or every position within
    /// [`MAX_PROBE`] of its home is taken (readers then miss it and ask
    /// the daemon). `avoid` names positions that must not be reused yet.
    pub fn publish(
        &mut self,
        id: &ObjectId,
        location: ObjectLocation,
        avoid: impl Fn(u32) -> bool,
    ) -> Option<u32> {
        if self.live >= self.words.slots / 4 * 3 {
            return None;
        }
        let mask = self.words.slots - 1;
        let start = home(id, mask);
        let mut free = None;
        for step in 0..MAX_PROBE {
            let position = (start + step) & mask;
            match self.state(position) {
                EMPTY => {
                    free = free.or(Some(position));
                    break;
                }
                TOMBSTONE if free.is_none() && !avoid(position as u32) => free = Some(position),
                LIVE if self.id_at(position) == *id => {
                    debug_assert!(false, "{id} published twice");
                    return None;
                }
                _ => {}
            }
        }
        let position = free?;
        let words = id_words(id);
        self.write(position, |slot| {
            slot(STATE).store(LIVE, Ordering::Relaxed);
            for (i, w) in words.iter().enumerate() {
                slot(ID + i).store(*w, Ordering::Relaxed);
            }
            slot(OFFSET).store(location.offset, Ordering::Relaxed);
            slot(DATA_SIZE).store(location.data_size, Ordering::Relaxed);
            slot(META_SIZE).store(u64::from(location.meta_size), Ordering::Relaxed);
        });
        self.live += 1;
        Some(position as u32)
    }

    /// Takes the entry at `position` out of view: readers that counted a
    /// reference before this see the version changed and give it back, or
    /// are seen by the daemon's next look at the reference tables (the two
    /// sides' sequentially consistent store-then-load, as in Dekker's
    /// algorithm: docs/fast-path.md, invariant 4).
    pub fn unpublish(&mut self, position: u32) {
        let position = position as usize;
        if self.state(position) != LIVE {
            return;
        }
        self.write(position, |slot| {
            slot(STATE).store(TOMBSTONE, Ordering::Relaxed);
        });
        self.live -= 1;
    }

    /// Puts an entry just unpublished back (its object turned out to be in
    /// use): same position, new version.
    pub fn republish(&mut self, position: u32) {
        let position = position as usize;
        if self.state(position) != TOMBSTONE {
            return;
        }
        self.write(position, |slot| {
            slot(STATE).store(LIVE, Ordering::Relaxed);
        });
        self.live += 1;
    }

    /// The id live at `position`, if one is.
    pub fn live_at(&self, position: u32) -> Option<ObjectId> {
        let position = position as usize & (self.words.slots - 1);
        (self.state(position) == LIVE).then(|| self.id_at(position))
    }

    fn id_at(&self, position: usize) -> ObjectId {
        let mut bytes = [0u8; 24];
        for i in 0..3 {
            let w = self.words.slot(position, ID + i).load(Ordering::Relaxed);
            bytes[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        ObjectId::from_slice(&bytes[..20]).expect("20 bytes")
    }

    /// One seqlock write: version odd, the fields, version even. The odd
    /// store is sequentially consistent: it is the store half of the
    /// store-then-load pairing with readers' reference counts.
    fn write<'a>(&'a self, position: usize, fill: impl FnOnce(&dyn Fn(usize) -> &'a AtomicU64)) {
        let slot = |word| self.words.slot(position, word);
        let version = slot(VERSION);
        let v = version.load(Ordering::Relaxed);
        version.store(v.wrapping_add(1), Ordering::SeqCst);
        fence(Ordering::Release);
        fill(&slot);
        version.store(v.wrapping_add(2), Ordering::SeqCst);
    }
}

/// A client's side: maps the index read-only and looks ids up.
pub struct IndexReader {
    words: Words,
}

impl IndexReader {
    /// Maps the index behind `fd` (received from the daemon) read-only and
    /// checks its header against its length. A header that does not fit is
    /// a protocol error, never an out-of-bounds read.
    pub fn attach(fd: BorrowedFd<'_>) -> Result<Self> {
        let file = File::from(fd.try_clone_to_owned().map_err(io("dup the index"))?);
        let len = file.metadata().map_err(io("stat the index"))?.len();
        if len < HEADER as u64 {
            return Err(ShoalError::protocol("the object index is too short"));
        }
        let map = MmapOptions::new()
            .len(len as usize)
            .map_raw_read_only(&file)
            .map_err(io("map the index"))?;
        let header = Words { map, slots: 0 };
        let magic = header.word(0).load(Ordering::Relaxed);
        let slots = header.word(1).load(Ordering::Acquire);
        if magic != MAGIC
            || !slots.is_power_of_two()
            || slots > 1 << 24
            || bytes_needed(slots as u32) as u64 > len
        {
            return Err(ShoalError::protocol(
                "not an object index, or a truncated one",
            ));
        }
        Ok(Self {
            words: Words {
                map: header.map,
                slots: slots as usize,
            },
        })
    }

    /// The slot count the header gives (a power of two, checked at attach): the length a
    /// reference table for this index has.
    pub fn slots(&self) -> u32 {
        self.words.slots as u32
    }

    /// Whether an object with `id`'s hash is being written (created through
    /// the daemon and not sealed or aborted): maybe `id` itself.
    pub fn maybe_creating(&self, id: &ObjectId) -> bool {
        self.words
            .filter(creating_counter(id))
            .load(Ordering::SeqCst)
            != 0
    }

    /// Whether the daemon sleeps until its doorbell rings (read after a
    /// write record was published: SeqCst on both sides, so either the
    /// daemon sees the record before it sleeps or this sees it asleep).
    pub fn daemon_asleep(&self) -> bool {
        self.words.word(3).load(Ordering::SeqCst) != 0
    }

    /// The live entry for `id`, if the index has one. Lock-free: a read that
    /// races a write is retried (a few times, then counted as a miss).
    pub fn lookup(&self, id: &ObjectId) -> Option<Found> {
        if self.words.word(2).load(Ordering::Acquire) != 0 {
            return None;
        }
        let mask = self.words.slots - 1;
        let want = id_words(id);
        let start = home(id, mask);
        for step in 0..MAX_PROBE {
            let position = (start + step) & mask;
            let (version, state, words, location) = self.read_slot(position)?;
            match state {
                EMPTY => return None,
                LIVE if words == want => {
                    return Some(Found {
                        position: position as u32,
                        version,
                        location,
                    })
                }
                _ => {}
            }
        }
        None
    }

    /// The slot's current version (after a reader counted its reference).
    pub fn version(&self, position: u32) -> u64 {
        self.words
            .slot(position as usize & (self.words.slots - 1), VERSION)
            .load(Ordering::SeqCst)
    }

    /// A consistent snapshot of one slot, or `None` after a few torn reads.
    fn read_slot(&self, position: usize) -> Option<(u64, u64, [u64; 3], ObjectLocation)> {
        let slot = |word| self.words.slot(position, word);
        for _ in 0..64 {
            let v1 = slot(VERSION).load(Ordering::Acquire);
            if v1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let state = slot(STATE).load(Ordering::Relaxed);
            let words = [
                slot(ID).load(Ordering::Relaxed),
                slot(ID + 1).load(Ordering::Relaxed),
                slot(ID + 2).load(Ordering::Relaxed),
            ];
            let location = ObjectLocation {
                offset: slot(OFFSET).load(Ordering::Relaxed),
                data_size: slot(DATA_SIZE).load(Ordering::Relaxed),
                meta_size: slot(META_SIZE).load(Ordering::Relaxed) as u32,
            };
            fence(Ordering::Acquire);
            if slot(VERSION).load(Ordering::Relaxed) == v1 {
                return Some((v1, state, words, location));
            }
        }
        None
    }
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> ShoalError {
    move |e| ShoalError::io(what, e)
}

/// A memfd of `len` bytes that can be neither shrunk nor grown (a client
/// truncating a file the daemon maps would crash the daemon with SIGBUS).
/// The caller adds `F_SEAL_SEAL` once it added every seal it wants.
pub(crate) fn sealed_memfd(name: &str, len: u64) -> Result<OwnedFd> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
        .map_err(|e| ShoalError::io("memfd_create", std::io::Error::from(e)))?;
    nix::unistd::ftruncate(&fd, len as i64)
        .map_err(|e| ShoalError::io("size the memfd", std::io::Error::from(e)))?;
    add_seals(fd.as_fd(), libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)?;
    Ok(fd)
}

pub(crate) fn add_seals(fd: BorrowedFd<'_>, seals: libc::c_int) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor we own; F_ADD_SEALS takes an int.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    if rc < 0 {
        let err = std::io::Error::last_os_error();
        return Err(ShoalError::io("seal the memfd", err));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> ObjectId {
        let mut b = [0u8; 20];
        b[..4].copy_from_slice(&n.to_le_bytes());
        b[19] = 7;
        ObjectId(b)
    }

    fn at(offset: u64) -> ObjectLocation {
        ObjectLocation {
            offset,
            data_size: 100,
            meta_size: 3,
        }
    }

    #[test]
    fn published_entries_are_found_and_unpublished_ones_are_not() {
        let mut writer = IndexWriter::create(1 << 12).unwrap();
        let reader = IndexReader::attach(writer.fd()).unwrap();
        let p = writer.publish(&id(1), at(4096), |_| false).unwrap();
        let found = reader.lookup(&id(1)).unwrap();
        assert_eq!(found.position, p);
        assert_eq!(found.location, at(4096));
        assert_eq!(found.version % 2, 0);
        assert!(reader.lookup(&id(2)).is_none());
        writer.unpublish(p);
        assert!(reader.lookup(&id(1)).is_none());
        assert_ne!(reader.version(p), found.version, "the version moved");
        writer.republish(p);
        assert_eq!(reader.lookup(&id(1)).unwrap().position, p);
        drop(writer);
        assert!(
            reader.lookup(&id(1)).is_none(),
            "a closed index finds nothing"
        );
    }

    #[test]
    fn probing_goes_past_tombstones_and_reuses_them() {
        let mut writer = IndexWriter::create(1 << 12).unwrap();
        let reader = IndexReader::attach(writer.fd()).unwrap();
        let positions: Vec<u32> = (0..3000)
            .map(|n| {
                writer
                    .publish(&id(n), at(u64::from(n) * 64), |_| false)
                    .unwrap()
            })
            .collect();
        for n in (0..3000).step_by(2) {
            writer.unpublish(positions[n as usize]);
        }
        for n in 0..3000u32 {
            let found = reader.lookup(&id(n));
            assert_eq!(found.is_some(), n % 2 == 1, "id {n}");
            if let Some(f) = found {
                assert_eq!(f.location.offset, u64::from(n) * 64);
            }
        }
        assert_eq!(writer.len(), 1500);
        // Reuse: 1500 more fit, and all 3000 live ones are found.
        for n in 3000..4500u32 {
            writer
                .publish(&id(n), at(u64::from(n) * 64), |_| false)
                .unwrap();
        }
        for n in (1..4500u32).filter(|n| *n >= 3000 || n % 2 == 1) {
            assert!(reader.lookup(&id(n)).is_some(), "id {n}");
        }
    }

    #[test]
    fn a_full_table_refuses_and_avoided_positions_are_not_reused() {
        let mut writer = IndexWriter::create(1 << 12).unwrap();
        let mut placed = 0;
        for n in 0..5000 {
            if writer.publish(&id(n), at(0), |_| false).is_some() {
                placed += 1;
            }
        }
        assert_eq!(placed, (1 << 12) / 4 * 3, "3/4 of the slots, then refused");
        let mut small = IndexWriter::create(1 << 12).unwrap();
        let p = small.publish(&id(1), at(0), |_| false).unwrap();
        small.unpublish(p);
        let q = small.publish(&id(1), at(64), |pos| pos == p).unwrap();
        assert_ne!(p, q, "an avoided tombstone is skipped");
        small.unpublish(q);
        let r = small.publish(&id(1), at(64), |_| false).unwrap();
        assert_eq!(r, p, "the first tombstone of the probe is reused");
    }

    #[test]
    fn clients_cannot_write_or_resize_the_index() {
        let writer = IndexWriter::create(1 << 12).unwrap();
        let file = File::from(writer.fd().try_clone_to_owned().unwrap());
        assert!(
            MmapOptions::new().len(4096).map_raw(&file).is_err(),
            "writable map"
        );
        assert!(file.set_len(0).is_err(), "truncate");
        assert!(file.set_len(1 << 30).is_err(), "grow");
    }

    #[test]
    fn a_forged_index_is_refused() {
        let fd = sealed_memfd("forged", 4096).unwrap();
        assert!(IndexReader::attach(fd.as_fd()).is_err());
        let short = sealed_memfd("short", 8).unwrap();
        assert!(IndexReader::attach(short.as_fd()).is_err());
    }

    #[test]
    fn readers_racing_the_writer_see_whole_entries() {
        let mut writer = IndexWriter::create(1 << 12).unwrap();
        let reader = IndexReader::attach(writer.fd()).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut seen = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for n in 0..64u32 {
                        if let Some(f) = reader.lookup(&id(n)) {
                            // Offset and sizes were written together.
                            assert_eq!(f.location.data_size, f.location.offset + 1);
                            assert_eq!(f.location.meta_size as u64, f.location.offset % 7);
                            seen += 1;
                        }
                    }
                }
                seen
            });
            for round in 0..2000u64 {
                let positions: Vec<u32> = (0..64u32)
                    .map(|n| {
                        let offset = round * 64 + u64::from(n);
                        let loc = ObjectLocation {
                            offset,
                            data_size: offset + 1,
                            meta_size: (offset % 7) as u32,
                        };
                        writer.publish(&id(n), loc, |_| false).unwrap()
                    })
                    .collect();
                for p in positions {
                    writer.unpublish(p);
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        writer.publish(&id(1), at(1), |_| false).unwrap();
        assert!(reader.lookup(&id(1)).is_some());
    }
}
