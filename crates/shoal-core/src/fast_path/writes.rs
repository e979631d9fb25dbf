//! The write channel: how a client seals objects it allocated in space the
//! daemon lent it, releases references and gives lent space back, without
//! the socket (docs/fast-path.md, pieces 2 and 3).
//!
//! One memfd per client, made by the daemon and mapped read-write by both:
//!
//! | offset | field |
//! | --- | --- |
//! | 0 | a [`ring`] of [`RECORDS`] records of [`RECORD`] bytes (client → daemon) |
//! | [`RESULTS`] | one u32 per ring slot: the daemon's answer to the record last taken from it |
//! | [`WAITING`] | u32, written by the client: 1 while it sleeps on an answer (futex) |
//! | [`LEVEL`] | u32, written by the daemon before it hands the channel over: the node's default durability (0 memory, 1 local, 2 backing) |
//!
//! An answer is `(sequence + 1) << 8 | outcome` (24 bits of the record's
//! sequence number, so a client tells its answer from the slot's previous
//! one): outcome 0 is success, otherwise the error kind's code. The daemon
//! answers every record it takes, in order, so a slot always holds the
//! answer to the last record that used it.
//!
//! The client trusts nothing but the answer to its own record; the daemon
//! trusts nothing the client wrote: records are copied out of the ring and
//! checked against the daemon's own bookkeeping (lent space, references)
//! before anything changes, and a record that does not decode ends the
//! client's connection.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

use super::index::{add_seals, sealed_memfd};
use super::ring::{self, Consumer, Producer};
use crate::durability::Durability;
use crate::error::{ErrorKind, Result, ShoalError};
use crate::ids::{ObjectId, ID_LEN};
use crate::location::ObjectLocation;

/// Bytes per record.
pub const RECORD: u32 = 64;
/// Records in a client's ring: a seal of more objects at once is sent in
/// parts of this many.
pub const RECORDS: u32 = 256;
/// Where the answers start.
pub const RESULTS: usize = ring::bytes_needed(RECORD, RECORDS).next_multiple_of(64);
/// Where the client's "asleep on an answer" word is.
pub const WAITING: usize = (RESULTS + 4 * RECORDS as usize).next_multiple_of(64);
/// Where the node's default durability is (what a seal without a level
/// waits for: a client need not wait for a seal's answer to memory).
pub const LEVEL: usize = WAITING + 8;
/// Bytes of a write channel.
pub const CHANNEL_BYTES: usize = WAITING + 64;

const SEAL: u8 = 1;
const RELEASE: u8 = 2;
const GIVE_BACK: u8 = 3;
const CREATE: u8 = 4;
const ABORT: u8 = 5;
const DELETE: u8 = 6;
const CONTAINS: u8 = 7;

/// What a client tells the daemon through its ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// This client creates object `id` at `location`, inside space lent to
    /// it: as the socket's Create would (unsealed, one creator reference).
    Create {
        /// The new object's id (bytes 8..28).
        id: ObjectId,
        /// Where and how big: a line-aligned block inside a part of this client's leases
        /// not claimed yet (offset bytes 32..40, data size 40..48, metadata size 4..8).
        location: ObjectLocation,
    },
    /// Object `id`, created by this client, is written: seal it (and with
    /// `release` drop the creator's reference), as the socket's Seal does.
    Seal {
        /// The object to seal (bytes 8..28).
        id: ObjectId,
        /// Also drop the creator's reference once sealed (byte 1).
        release: bool,
        /// The level to reach before the answer; `None` for the node's default (byte 2:
        /// the level's byte + 1, 0 for the default).
        durability: Option<Durability>,
    },
    /// Drops object `id`, created by this client and not sealed.
    Abort {
        /// The unsealed object to drop (bytes 8..28).
        id: ObjectId,
    },
    /// Drops one reference this client took through the daemon.
    Release {
        /// The object whose reference goes (bytes 8..28).
        id: ObjectId,
    },
    /// Lease number `lease` is given back: what of it was not sealed
    /// returns to the daemon's free space.
    GiveBack {
        /// The lease's number, as the `Lent` reply gave it (bytes 32..40).
        lease: u64,
    },
    /// Deletes object `id`, as the socket's Delete does (answered once no
    /// get on the node can find it).
    Delete {
        /// The object to delete (bytes 8..28).
        id: ObjectId,
    },
    /// Whether object `id` is in the store, as the socket's Contains (answer
    /// 0: yes; `ObjectNotFound`: no).
    Contains {
        /// The object asked about (bytes 8..28).
        id: ObjectId,
    },
}

impl Record {
    /// Whether the record asks something the client waits for (applied
    /// after every client's records published before it).
    pub fn is_query(&self) -> bool {
        matches!(self, Record::Delete { .. } | Record::Contains { .. })
    }
}

impl Record {
    /// The record's 64 bytes as they go into the ring (layout in docs/protocol.md,
    /// "FastWrites"; every byte not listed there is 0).
    pub fn encode(&self) -> [u8; RECORD as usize] {
        let mut out = [0u8; RECORD as usize];
        match *self {
            Record::Create { id, location } => {
                out[0] = CREATE;
                out[4..8].copy_from_slice(&location.meta_size.to_le_bytes());
                out[8..8 + ID_LEN].copy_from_slice(id.as_bytes());
                out[32..40].copy_from_slice(&location.offset.to_le_bytes());
                out[40..48].copy_from_slice(&location.data_size.to_le_bytes());
            }
            Record::Seal {
                id,
                release,
                durability,
            } => {
                out[0] = SEAL;
                out[1] = u8::from(release);
                out[2] = durability.map_or(0, |d| d as u8 + 1);
                out[8..8 + ID_LEN].copy_from_slice(id.as_bytes());
            }
            Record::Abort { id } => {
                out[0] = ABORT;
                out[8..8 + ID_LEN].copy_from_slice(id.as_bytes());
            }
            Record::Release { id } => {
                out[0] = RELEASE;
                out[8..8 + ID_LEN].copy_from_slice(id.as_bytes());
            }
            Record::Delete { id } => {
                out[0] = DELETE;
                out[8..8 + ID_LEN].copy_from_slice(id.as_bytes());
            }
            Record::Contains { id } => {
                out[0] = CONTAINS;
                out[8..8 + ID_LEN].copy_from_slice(id.as_bytes());
            }
            Record::GiveBack { lease } => {
                out[0] = GIVE_BACK;
                out[32..40].copy_from_slice(&lease.to_le_bytes());
            }
        }
        out
    }

    /// Decodes a record a client wrote: anything but what [`encode`](Self::encode)
    /// makes is a protocol error.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() != RECORD as usize {
            return Err(ShoalError::protocol("a write record of the wrong size"));
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let id = || {
            let mut b = [0u8; ID_LEN];
            b.copy_from_slice(&bytes[8..8 + ID_LEN]);
            ObjectId(b)
        };
        let zero = |range: std::ops::Range<usize>| bytes[range].iter().all(|&b| b == 0);
        let record = match bytes[0] {
            CREATE if zero(1..4) && zero(28..32) && zero(48..64) => Record::Create {
                id: id(),
                location: ObjectLocation {
                    offset: u64_at(32),
                    data_size: u64_at(40),
                    meta_size: u32::from_le_bytes(bytes[4..8].try_into().expect("4")),
                },
            },
            SEAL if bytes[1] <= 1 && bytes[2] <= 3 && zero(3..8) && zero(28..64) => Record::Seal {
                id: id(),
                release: bytes[1] == 1,
                durability: match bytes[2] {
                    0 => None,
                    d => Durability::from_u8(d - 1),
                },
            },
            ABORT if zero(1..8) && zero(28..64) => Record::Abort { id: id() },
            RELEASE if zero(1..8) && zero(28..64) => Record::Release { id: id() },
            DELETE if zero(1..8) && zero(28..64) => Record::Delete { id: id() },
            CONTAINS if zero(1..8) && zero(28..64) => Record::Contains { id: id() },
            GIVE_BACK if zero(1..32) && zero(40..64) => Record::GiveBack { lease: u64_at(32) },
            _ => {
                return Err(ShoalError::protocol(format!(
                    "a write record that does not decode (kind {})",
                    bytes[0]
                )))
            }
        };
        Ok(record)
    }
}

/// The answer word for record `sequence` with `outcome`.
fn answer_word(sequence: u64, outcome: Option<ErrorKind>) -> u32 {
    let tag = ((sequence + 1) & 0xff_ffff) as u32;
    let code = outcome.map_or(0, |k| k.code().min(255) as u32);
    tag << 8 | code
}

/// A mapped write channel.
struct Channel {
    map: MmapRaw,
}

impl Channel {
    fn map(fd: BorrowedFd<'_>) -> Result<Self> {
        let file = File::from(
            fd.try_clone_to_owned()
                .map_err(|e| ShoalError::io("dup", e))?,
        );
        let len = file
            .metadata()
            .map_err(|e| ShoalError::io("stat a write channel", e))?
            .len();
        if len < CHANNEL_BYTES as u64 {
            return Err(ShoalError::protocol("the write channel is too short"));
        }
        let map = MmapOptions::new()
            .len(CHANNEL_BYTES)
            .map_raw(&file)
            .map_err(|e| ShoalError::io("map a write channel", e))?;
        Ok(Self { map })
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        debug_assert!(at + 4 <= CHANNEL_BYTES && at.is_multiple_of(4));
        // SAFETY: in bounds (checked at map), aligned (page-aligned base,
        // `at` a multiple of 4), alive as long as `self`; both processes
        // touch these words only atomically.
        unsafe { &*self.map.as_mut_ptr().add(at).cast::<AtomicU32>() }
    }

    fn answer(&self, sequence: u64) -> &AtomicU32 {
        self.word(RESULTS + 4 * (sequence % u64::from(RECORDS)) as usize)
    }

    fn waiting(&self) -> &AtomicU32 {
        self.word(WAITING)
    }

    fn level(&self) -> &AtomicU32 {
        self.word(LEVEL)
    }
}

/// The daemon's end of one client's channel.
pub struct WriteChannel {
    channel: Channel,
    consumer: Consumer,
    taken: u64,
}

impl WriteChannel {
    /// A new channel on a node whose seals without a level reach
    /// `default_level`; the fd goes to the client (the daemon keeps only its
    /// mapping, no descriptor per client).
    pub fn create(default_level: Durability) -> Result<(Self, OwnedFd)> {
        let fd = sealed_memfd("shoal-writes", CHANNEL_BYTES as u64)?;
        add_seals(fd.as_fd(), libc::F_SEAL_SEAL)?;
        let channel = Channel::map(fd.as_fd())?;
        channel
            .level()
            .store(default_level as u32, Ordering::SeqCst);
        let base = channel.map.as_mut_ptr();
        let len = ring::bytes_needed(RECORD, RECORDS);
        // SAFETY: the mapping is page-aligned and CHANNEL_BYTES ≥ len long;
        // nobody else has the fd yet. The consumer lives beside the mapping
        // in `Self` and is dropped with it.
        let consumer = unsafe {
            ring::init(base, len, RECORD, RECORDS)?;
            Consumer::attach(base, len)?
        };
        Ok((
            Self {
                channel,
                consumer,
                taken: 0,
            },
            fd,
        ))
    }

    /// The next published record and its sequence number; `Ok(None)` when
    /// there is none. An error (a broken ring or record) means the client
    /// is broken or hostile: stop reading this channel, drop the client.
    pub fn take(&mut self) -> Result<Option<(u64, Record)>> {
        let mut bytes = [0u8; RECORD as usize];
        if !self.consumer.pop(&mut bytes)? {
            return Ok(None);
        }
        let sequence = self.taken;
        self.taken += 1;
        Ok(Some((sequence, Record::decode(&bytes)?)))
    }

    /// Whether a record is waiting (one load: the poller's idle check).
    pub fn has_next(&self) -> bool {
        self.consumer.has_next()
    }

    /// Answers record `sequence` and wakes its client if it sleeps on it.
    pub fn answer(&self, sequence: u64, outcome: Option<ErrorKind>) {
        let word = self.channel.answer(sequence);
        word.store(answer_word(sequence, outcome), Ordering::SeqCst);
        if self.channel.waiting().load(Ordering::SeqCst) != 0 {
            futex_wake(word);
        }
    }
}

/// The client's end.
pub struct WriteSender {
    channel: Channel,
    producer: Producer,
    /// Sequence number of the next record staged.
    next: u64,
    /// What a seal without a level waits for on this node.
    default_level: Durability,
}

// SAFETY: the producer's memory is the channel's mapping, owned by the same
// value; used through `&mut self` only.
unsafe impl Send for WriteSender {}

impl WriteSender {
    /// Maps the channel the daemon made for this client.
    pub fn attach(fd: BorrowedFd<'_>) -> Result<Self> {
        let channel = Channel::map(fd)?;
        // SAFETY: page-aligned, CHANNEL_BYTES long, alive as long as `self`
        // (the producer is dropped with the mapping); this client is the
        // ring's one producer.
        let producer = unsafe {
            Producer::attach(
                channel.map.as_mut_ptr(),
                ring::bytes_needed(RECORD, RECORDS),
            )?
        };
        let next = producer.staged();
        // A level this build does not know is taken as the strongest: the
        // client then waits for every seal's answer, as it always may.
        let default_level = u8::try_from(channel.level().load(Ordering::SeqCst))
            .ok()
            .and_then(Durability::from_u8)
            .unwrap_or(Durability::Backing);
        Ok(Self {
            channel,
            producer,
            next,
            default_level,
        })
    }

    /// The level a seal without one reaches on this node (a seal to
    /// memory needs no answer from the daemon once its create was taken).
    pub fn default_level(&self) -> Durability {
        self.default_level
    }

    /// Stages `record` (not visible yet): its sequence number, or `None`
    /// when the ring is full (publish and wait for the daemon first).
    pub fn stage(&mut self, record: &Record) -> Result<Option<u64>> {
        if !self.producer.stage(&record.encode())? {
            return Ok(None);
        }
        self.next += 1;
        Ok(Some(self.next - 1))
    }

    /// Makes every staged record visible to the daemon, after every write
    /// this thread made before (the objects' bytes among them).
    pub fn publish(&mut self) {
        self.producer.publish();
    }

    /// The daemon's answer to record `sequence`, if it came.
    pub fn answered(&self, sequence: u64) -> Option<Option<ErrorKind>> {
        let word = self.channel.answer(sequence).load(Ordering::SeqCst);
        if word >> 8 != ((sequence + 1) & 0xff_ffff) as u32 {
            return None;
        }
        Some(match word & 0xff {
            0 => None,
            code => Some(ErrorKind::from_code(code as u16).unwrap_or(ErrorKind::Protocol)),
        })
    }

    /// Whether record `sequence` was answered, or its slot already holds
    /// the answer to a later record (the daemon answered it before: records
    /// applied on the spot are answered in order).
    pub fn settled(&self, sequence: u64) -> bool {
        let word = self.channel.answer(sequence).load(Ordering::SeqCst);
        let want = ((sequence + 1) & 0xff_ffff) as u32;
        word != 0 && (word >> 8).wrapping_sub(want) & 0xff_ffff < 1 << 23
    }

    /// Waits for the answer to record `sequence`: polls for `spin` (while
    /// polling pays: [`crate::busy_poll::pause`]), then sleeps on the
    /// answer word, asking `alive` every `check` whether the daemon is
    /// still there (`false`: `Disconnected`).
    pub fn wait(
        &self,
        sequence: u64,
        spin: Duration,
        check: Duration,
        alive: impl FnMut() -> bool,
    ) -> Result<Option<ErrorKind>> {
        self.wait_for(sequence, spin, check, alive, |s| s.answered(sequence))
    }

    /// [`wait`](Self::wait) until record `sequence` is [`settled`](Self::settled).
    pub fn wait_settled(
        &self,
        sequence: u64,
        spin: Duration,
        check: Duration,
        alive: impl FnMut() -> bool,
    ) -> Result<()> {
        self.wait_for(sequence, spin, check, alive, |s| {
            s.settled(sequence).then_some(())
        })
    }

    fn wait_for<R>(
        &self,
        sequence: u64,
        spin: Duration,
        check: Duration,
        mut alive: impl FnMut() -> bool,
        look: impl Fn(&Self) -> Option<R>,
    ) -> Result<R> {
        let start = Instant::now();
        loop {
            if let Some(answer) = look(self) {
                return Ok(answer);
            }
            if start.elapsed() >= spin || !crate::busy_poll::pause() {
                break;
            }
        }
        if spin.is_zero() {
            let busy = crate::busy_poll::busy_spin();
            while start.elapsed() < busy {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
                if let Some(answer) = look(self) {
                    return Ok(answer);
                }
            }
        }
        let word = self.channel.answer(sequence);
        loop {
            self.channel.waiting().store(1, Ordering::SeqCst);
            let seen = word.load(Ordering::SeqCst);
            if let Some(answer) = look(self) {
                self.channel.waiting().store(0, Ordering::Relaxed);
                return Ok(answer);
            }
            futex_wait(word, seen, check);
            self.channel.waiting().store(0, Ordering::Relaxed);
            if let Some(answer) = look(self) {
                return Ok(answer);
            }
            if !alive() {
                return Err(ShoalError::new(
                    ErrorKind::Disconnected,
                    "the daemon went away before it answered a record",
                ));
            }
        }
    }
}

/// Sleeps while `word` holds `seen`, at most `timeout` (a shared futex: the
/// word lives in a file both processes map).
fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a live, aligned u32 of a shared mapping with a
    // valid relative timeout; it only reads the word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
        )
    };
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live, aligned u32 of a shared mapping.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> ObjectId {
        ObjectId([n; ID_LEN])
    }

    #[test]
    fn records_survive_encoding_and_anything_else_is_refused() {
        let records = [
            Record::Create {
                id: id(1),
                location: ObjectLocation {
                    offset: 4096,
                    data_size: 1000,
                    meta_size: 24,
                },
            },
            Record::Create {
                id: id(2),
                location: ObjectLocation {
                    offset: 0,
                    data_size: u64::MAX,
                    meta_size: u32::MAX,
                },
            },
            Record::Seal {
                id: id(1),
                release: true,
                durability: Some(Durability::Local),
            },
            Record::Seal {
                id: id(2),
                release: false,
                durability: None,
            },
            Record::Abort { id: id(4) },
            Record::Release { id: id(3) },
            Record::GiveBack { lease: 1 << 40 },
            Record::Delete { id: id(5) },
            Record::Contains { id: id(6) },
        ];
        for record in records {
            let bytes = record.encode();
            assert_eq!(Record::decode(&bytes).unwrap(), record);
            // Any byte a decoder ignores must be refused when set.
            for at in 0..RECORD as usize {
                let mut forged = bytes;
                forged[at] ^= 0x80;
                if let Ok(other) = Record::decode(&forged) {
                    assert_ne!(other, record, "byte {at} was ignored");
                }
            }
        }
        assert!(Record::decode(&[0u8; 64]).is_err());
        assert!(Record::decode(&[0u8; 63]).is_err());
    }

    #[test]
    fn a_record_is_answered_through_the_shared_file_and_a_waiter_wakes() {
        let (mut daemon, fd) = WriteChannel::create(Durability::Memory).unwrap();
        let mut client = WriteSender::attach(fd.as_fd()).unwrap();
        assert_eq!(daemon.take().unwrap(), None);
        let record = Record::Release { id: id(9) };
        let seq = client.stage(&record).unwrap().unwrap();
        assert_eq!(daemon.take().unwrap(), None, "staged, not published");
        client.publish();
        assert!(daemon.has_next());
        assert_eq!(daemon.take().unwrap(), Some((seq, record)));
        assert_eq!(client.answered(seq), None);
        let answering = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            daemon.answer(seq, Some(ErrorKind::ObjectNotFound));
            daemon
        });
        let answer = client
            .wait(seq, Duration::ZERO, Duration::from_secs(5), || true)
            .unwrap();
        assert_eq!(answer, Some(ErrorKind::ObjectNotFound));
        let mut daemon = answering.join().unwrap();
        // The next record's answer is told apart from this one's.
        let seq2 = client.stage(&record).unwrap().unwrap();
        client.publish();
        assert_eq!(client.answered(seq2), None);
        daemon.take().unwrap();
        daemon.answer(seq2, None);
        assert_eq!(client.answered(seq2), Some(None));
        assert!(client.settled(seq2));
        // A record not taken yet is not settled; once a later record has
        // its slot, it is (its answer came first).
        let seq3 = client.stage(&record).unwrap().unwrap();
        client.publish();
        assert!(!client.settled(seq3));
        daemon.take().unwrap();
        daemon.answer(seq3, None);
        for _ in 0..RECORDS {
            let later = client.stage(&record).unwrap().unwrap();
            client.publish();
            daemon.take().unwrap();
            daemon.answer(later, None);
        }
        assert_eq!(client.answered(seq3), None, "its slot holds a later answer");
        assert!(client.settled(seq3));
    }

    #[test]
    fn the_nodes_default_level_reaches_the_client() {
        for level in Durability::ALL {
            let (_daemon, fd) = WriteChannel::create(level).unwrap();
            assert_eq!(
                WriteSender::attach(fd.as_fd()).unwrap().default_level(),
                level
            );
        }
        // A level the client does not know: it waits for every answer.
        let (daemon, fd) = WriteChannel::create(Durability::Memory).unwrap();
        daemon.channel.level().store(77, Ordering::SeqCst);
        let client = WriteSender::attach(fd.as_fd()).unwrap();
        assert_eq!(client.default_level(), Durability::Backing);
    }

    #[test]
    fn a_waiter_gives_up_when_the_daemon_is_gone() {
        let (_daemon, fd) = WriteChannel::create(Durability::Memory).unwrap();
        let mut client = WriteSender::attach(fd.as_fd()).unwrap();
        let seq = client
            .stage(&Record::GiveBack { lease: 0 })
            .unwrap()
            .unwrap();
        client.publish();
        let err = client
            .wait(seq, Duration::ZERO, Duration::from_millis(10), || false)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Disconnected);
    }

    #[test]
    fn a_forged_ring_tail_is_an_error_for_the_daemon_not_a_crash() {
        let (mut daemon, fd) = WriteChannel::create(Durability::Memory).unwrap();
        let channel = Channel::map(fd.as_fd()).unwrap();
        // The tail lives at byte 64 of the ring (ring.rs): a client writes
        // nonsense there.
        // SAFETY: inside the mapping, 8-byte aligned.
        unsafe {
            (*channel
                .map
                .as_mut_ptr()
                .add(64)
                .cast::<std::sync::atomic::AtomicU64>())
            .store(u64::MAX / 3, Ordering::SeqCst)
        };
        assert_eq!(daemon.take().unwrap_err().kind(), ErrorKind::Protocol);
    }
}
