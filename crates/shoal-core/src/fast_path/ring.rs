//! A single-producer single-consumer ring of fixed-size records in shared
//! memory: how a client sends one-way messages (seal, release) to the daemon
//! without a system call (docs/fast-path.md, piece 1).
//!
//! Layout, from a 64-byte aligned base (offsets, so each process may map it
//! anywhere):
//!
//! | offset | field |
//! | --- | --- |
//! | 0 | magic `SHOALRNG`, record size (u32), capacity in records (u32, a power of two) |
//! | 64 | tail (u64): records published so far; written by the producer only |
//! | 128 | head (u64): records consumed so far; written by the consumer only |
//! | 192 | `capacity` records of `record size` bytes |
//!
//! Publishing is one release store of the tail after the records were
//! written; consuming starts with an acquire load of it. So a record is
//! either wholly visible or not at all: a producer killed while writing one
//! leaves it unpublished, and the bytes a producer wrote before publishing
//! (an object's, before its seal record) are visible to the consumer before
//! the record is. The consumer treats everything the producer wrote as
//! untrusted (a tail out of bounds is an error, never a crash); the record
//! bytes are copied out before the caller looks at them.
//!
//! Written by hand: ring crates (ringbuf, crossbeam) own their memory inside
//! one process; this one lives at a fixed layout in a file both processes map,
//! and its crash behaviour is part of the protocol.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, ShoalError};

const MAGIC: [u8; 8] = *b"SHOALRNG";
const TAIL: usize = 64;
const HEAD: usize = 128;
const RECORDS: usize = 192;

/// Bytes a ring of `capacity` records of `record_size` bytes takes.
pub const fn bytes_needed(record_size: u32, capacity: u32) -> usize {
    RECORDS + record_size as usize * capacity as usize
}

/// The shape of a ring, read from (or written to) its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    record_size: usize,
    capacity: u64,
}

/// A ring's memory: base pointer and length, with the header checked.
struct Memory {
    base: *mut u8,
    shape: Shape,
}

impl Memory {
    /// # Safety
    /// `base` must be 64-byte aligned and valid for `len` bytes of reads and
    /// writes for as long as the returned value is used (shared memory the
    /// other end may write at any time).
    unsafe fn attach(base: *mut u8, len: usize) -> Result<Self> {
        if !(base as usize).is_multiple_of(64) || len < RECORDS {
            return Err(ShoalError::invalid(
                "a ring needs 64-byte aligned memory of ≥ 192 bytes",
            ));
        }
        let mut header = [0u8; 16];
        // SAFETY: 16 bytes inside the range (len ≥ 192).
        unsafe { std::ptr::copy_nonoverlapping(base, header.as_mut_ptr(), 16) };
        let record_size = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
        let capacity = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes"));
        if header[..8] != MAGIC
            || record_size == 0
            || !capacity.is_power_of_two()
            || bytes_needed(record_size, capacity) > len
        {
            return Err(ShoalError::protocol(
                "not a ring, or one larger than its memory",
            ));
        }
        Ok(Self {
            base,
            shape: Shape {
                record_size: record_size as usize,
                capacity: u64::from(capacity),
            },
        })
    }

    fn counter(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is 64 or 128: 8-byte aligned (base is 64-aligned) and
        // inside the checked range; the counter lives as long as the mapping,
        // which outlives `self` (attach's contract).
        unsafe { &*self.base.add(at).cast::<AtomicU64>() }
    }

    fn slot(&self, index: u64) -> *mut u8 {
        let slot = (index & (self.shape.capacity - 1)) as usize;
        // SAFETY: slot < capacity: inside the records area checked at attach.
        unsafe { self.base.add(RECORDS + slot * self.shape.record_size) }
    }
}

/// Writes an empty ring's header into `[base, base + len)`.
///
/// # Safety
/// As [`Producer::attach`]; nobody may use the ring while it is initialised.
pub unsafe fn init(base: *mut u8, len: usize, record_size: u32, capacity: u32) -> Result<()> {
    if !(base as usize).is_multiple_of(64)
        || record_size == 0
        || !capacity.is_power_of_two()
        || bytes_needed(record_size, capacity) > len
    {
        return Err(ShoalError::invalid(format!(
            "a ring of {capacity} records of {record_size} bytes does not fit {len} aligned bytes"
        )));
    }
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&record_size.to_le_bytes());
    header[12..16].copy_from_slice(&capacity.to_le_bytes());
    // SAFETY: inside the range (checked above); the counters are zeroed with
    // atomic stores.
    unsafe {
        std::ptr::copy_nonoverlapping(header.as_ptr(), base, 16);
        (*base.add(TAIL).cast::<AtomicU64>()).store(0, Ordering::Relaxed);
        (*base.add(HEAD).cast::<AtomicU64>()).store(0, Ordering::Release);
    }
    Ok(())
}

/// The producing end (a client): stages records, then publishes them.
pub struct Producer {
    memory: Memory,
    /// Records staged so far (published ones included).
    staged: u64,
    /// The tail as last published.
    published: u64,
}

impl Producer {
    /// Attaches to a ring [`init`] made.
    ///
    /// # Safety
    /// `base` must be 64-byte aligned and valid for `len` bytes of reads and
    /// writes for the producer's whole life; one producer per ring.
    pub unsafe fn attach(base: *mut u8, len: usize) -> Result<Self> {
        // SAFETY: the caller's contract.
        let memory = unsafe { Memory::attach(base, len)? };
        let tail = memory.counter(TAIL).load(Ordering::Relaxed);
        Ok(Self {
            memory,
            staged: tail,
            published: tail,
        })
    }

    /// Writes `record` into the next free slot without making it visible:
    /// `Ok(false)` when the ring is full. Records shorter than the record
    /// size are padded with zeros.
    pub fn stage(&mut self, record: &[u8]) -> Result<bool> {
        let shape = self.memory.shape;
        if record.len() > shape.record_size {
            return Err(ShoalError::invalid(format!(
                "a record of {} bytes in a ring of {}-byte records",
                record.len(),
                shape.record_size
            )));
        }
        let head = self.memory.counter(HEAD).load(Ordering::Acquire);
        if self.staged.wrapping_sub(head) >= shape.capacity {
            return Ok(false);
        }
        let slot = self.memory.slot(self.staged);
        // SAFETY: the slot is inside the ring and free (the consumer is past
        // it); record_size bytes long.
        unsafe {
            std::ptr::copy_nonoverlapping(record.as_ptr(), slot, record.len());
            std::ptr::write_bytes(slot.add(record.len()), 0, shape.record_size - record.len());
        }
        self.staged += 1;
        Ok(true)
    }

    /// Makes every staged record visible to the consumer, in order, after
    /// everything this thread wrote before (one release store).
    pub fn publish(&mut self) {
        if self.staged != self.published {
            self.memory
                .counter(TAIL)
                .store(self.staged, Ordering::Release);
            self.published = self.staged;
        }
    }

    /// Records staged so far, published or not (the next one's number).
    pub fn staged(&self) -> u64 {
        self.staged
    }

    /// [`stage`](Self::stage) then [`publish`](Self::publish).
    pub fn push(&mut self, record: &[u8]) -> Result<bool> {
        let staged = self.stage(record)?;
        self.publish();
        Ok(staged)
    }
}

/// The consuming end (the daemon): takes published records in order.
pub struct Consumer {
    memory: Memory,
    head: u64,
}

impl Consumer {
    /// Attaches to a ring [`init`] made.
    ///
    /// # Safety
    /// As [`Producer::attach`]; one consumer per ring.
    pub unsafe fn attach(base: *mut u8, len: usize) -> Result<Self> {
        // SAFETY: the caller's contract.
        let memory = unsafe { Memory::attach(base, len)? };
        let head = memory.counter(HEAD).load(Ordering::Relaxed);
        Ok(Self { memory, head })
    }

    /// The record size of this ring.
    pub fn record_size(&self) -> usize {
        self.memory.shape.record_size
    }

    /// Whether a published record is waiting (one load).
    pub fn has_next(&self) -> bool {
        self.memory.counter(TAIL).load(Ordering::Acquire) != self.head
    }

    /// Copies the next published record into `out` (record size bytes) and
    /// frees its slot: `Ok(false)` when none is published. A tail the
    /// producer could not have written (behind the head, or more than the
    /// capacity ahead) is a protocol error: the producer is broken or
    /// hostile, and its ring is not read again.
    pub fn pop(&mut self, out: &mut [u8]) -> Result<bool> {
        let shape = self.memory.shape;
        if out.len() != shape.record_size {
            return Err(ShoalError::invalid("the output must be one record long"));
        }
        let tail = self.memory.counter(TAIL).load(Ordering::Acquire);
        let pending = tail.wrapping_sub(self.head);
        if pending > shape.capacity {
            return Err(ShoalError::protocol(format!(
                "ring tail {tail} against head {} and capacity {}",
                self.head, shape.capacity
            )));
        }
        if pending == 0 {
            return Ok(false);
        }
        let slot = self.memory.slot(self.head);
        // SAFETY: a published slot inside the ring, record_size bytes long.
        unsafe { std::ptr::copy_nonoverlapping(slot, out.as_mut_ptr(), shape.record_size) };
        self.head += 1;
        // The slot may be reused once the producer sees the new head.
        self.memory
            .counter(HEAD)
            .store(self.head, Ordering::Release);
        Ok(true)
    }
}

// SAFETY: each end is used by one thread at a time (`&mut self` methods);
// the memory is shared memory whose cross-thread protocol is the atomics
// above.
unsafe impl Send for Producer {}
// SAFETY: as for `Producer`.
unsafe impl Send for Consumer {}

#[cfg(test)]
mod tests {
    use super::*;

    /// 64-byte aligned memory for a ring (a Vec of 64-byte blocks).
    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Block([u8; 64]);

    fn memory(bytes: usize) -> Vec<Block> {
        vec![Block([0; 64]); bytes.div_ceil(64)]
    }

    fn ring(record_size: u32, capacity: u32) -> (Vec<Block>, Producer, Consumer) {
        let len = bytes_needed(record_size, capacity);
        let mut mem = memory(len);
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: `mem` is 64-aligned, `len` bytes long, and outlives both
        // ends in every test (returned alongside them, dropped after them).
        unsafe {
            init(base, len, record_size, capacity).unwrap();
            let producer = Producer::attach(base, len).unwrap();
            let consumer = Consumer::attach(base, len).unwrap();
            (mem, producer, consumer)
        }
    }

    #[test]
    fn records_come_out_in_order_across_wrap_around_and_a_full_ring_refuses() {
        let (_mem, mut p, mut c) = ring(16, 4);
        let mut out = [0u8; 16];
        for round in 0u8..10 {
            for i in 0..4 {
                assert!(p.push(&[round, i]).unwrap());
            }
            assert!(!p.push(&[99]).unwrap(), "full");
            for i in 0..4 {
                assert!(c.pop(&mut out).unwrap());
                assert_eq!(&out[..3], &[round, i, 0], "padded with zeros");
            }
            assert!(!c.pop(&mut out).unwrap(), "empty");
        }
        assert!(p.push(&[0; 17]).is_err(), "longer than a record");
        assert!(c.pop(&mut [0; 8]).is_err(), "output of the wrong size");
    }

    #[test]
    fn a_staged_record_is_invisible_until_published() {
        // A producer killed between writing a record and publishing it (or
        // in the middle of writing it) leaves nothing the consumer can see.
        let (_mem, mut p, mut c) = ring(8, 8);
        let mut out = [0u8; 8];
        assert!(p.stage(b"seal-1").unwrap());
        assert!(p.stage(b"seal-2").unwrap());
        assert!(!c.pop(&mut out).unwrap());
        p.publish();
        assert!(c.pop(&mut out).unwrap());
        assert_eq!(&out[..6], b"seal-1");
        assert!(c.pop(&mut out).unwrap());
        assert_eq!(&out[..6], b"seal-2");
        assert!(!c.pop(&mut out).unwrap());
        // Staged slots count against the capacity before they are published.
        for _ in 0..8 {
            assert!(p.stage(b"x").unwrap());
        }
        assert!(!p.stage(b"x").unwrap());
    }

    proptest::proptest! {
        /// Any sequence of stage / publish / pop behaves as a queue of
        /// published records: what pop returns is exactly the published
        /// records, in order, and staging refuses exactly when capacity
        /// records are staged and not consumed.
        #[test]
        fn the_ring_behaves_as_a_queue_of_published_records(
            ops in proptest::collection::vec(0u8..3, 0..400),
        ) {
            let (_mem, mut p, mut c) = ring(8, 8);
            let mut published = std::collections::VecDeque::new();
            let mut staged = Vec::new();
            let mut next = 0u64;
            let mut out = [0u8; 8];
            for op in ops {
                match op {
                    0 => {
                        let fits = published.len() + staged.len() < 8;
                        proptest::prop_assert_eq!(p.stage(&next.to_le_bytes()).unwrap(), fits);
                        if fits {
                            staged.push(next);
                            next += 1;
                        }
                    }
                    1 => {
                        p.publish();
                        published.extend(staged.drain(..));
                    }
                    _ => {
                        let got = c.pop(&mut out).unwrap();
                        proptest::prop_assert_eq!(got, !published.is_empty());
                        if got {
                            proptest::prop_assert_eq!(
                                u64::from_le_bytes(out),
                                published.pop_front().unwrap()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_second_producer_process_continues_where_the_first_published() {
        // The daemon keeps the ring when a client reconnects its producer:
        // attach reads the published tail, dropping anything only staged.
        let (mut mem, mut p, mut c) = ring(8, 4);
        p.push(b"one").unwrap();
        p.stage(b"lost").unwrap();
        // The first producer is gone (never used again); a new one attaches.
        let len = bytes_needed(8, 4);
        // SAFETY: the same memory as above, still alive.
        let mut p = unsafe { Producer::attach(mem.as_mut_ptr().cast(), len).unwrap() };
        p.push(b"two").unwrap();
        let mut out = [0u8; 8];
        assert!(c.pop(&mut out).unwrap());
        assert_eq!(&out[..3], b"one");
        assert!(c.pop(&mut out).unwrap());
        assert_eq!(&out[..3], b"two");
        assert!(!c.pop(&mut out).unwrap());
    }

    #[test]
    fn a_corrupt_tail_or_header_is_an_error_not_a_crash() {
        let (mut mem, mut p, mut c) = ring(8, 4);
        let base = mem.as_mut_ptr().cast::<u8>();
        p.push(b"ok").unwrap();
        // A hostile producer writes a tail far ahead of the head.
        // SAFETY: the tail counter inside the ring's memory.
        unsafe { (*base.add(TAIL).cast::<AtomicU64>()).store(1000, Ordering::Release) };
        assert!(c.pop(&mut [0; 8]).is_err());
        // Headers that do not describe a ring inside the memory.
        let len = bytes_needed(8, 4);
        // SAFETY: inside the memory; the ends above are not used again.
        unsafe {
            *base.add(12) = 3; // capacity 3: not a power of two
            assert!(Consumer::attach(base, len).is_err());
            *base = b'X';
            assert!(Producer::attach(base, len).is_err());
            assert!(init(base, len, 8, 8).is_err(), "8 records do not fit");
            assert!(init(base.add(8), len - 8, 8, 2).is_err(), "misaligned");
            assert!(Consumer::attach(base, 100).is_err(), "too short");
        }
    }

    #[test]
    fn two_threads_exchange_many_records_in_order_and_bytes_written_before_are_seen() {
        // The producer writes a payload outside the ring, then a record
        // naming it: the consumer must see the payload's final bytes (the
        // seal's ordering: object bytes before the seal record).
        const N: u64 = 50_000;
        let (mut mem, mut p, mut c) = ring(16, 64);
        let payloads: Vec<AtomicU64> = (0..64).map(|_| AtomicU64::new(0)).collect();
        let payloads = &payloads;
        let _keep = &mut mem;
        std::thread::scope(|scope| {
            scope.spawn(move || {
                for i in 1..=N {
                    let slot = (i % 64) as usize;
                    // A relaxed store: only the ring's release orders it.
                    payloads[slot].store(i, Ordering::Relaxed);
                    let mut record = [0u8; 16];
                    record[..8].copy_from_slice(&i.to_le_bytes());
                    while !p.push(&record).unwrap() {
                        std::thread::yield_now();
                    }
                }
            });
            let mut out = [0u8; 16];
            let mut next = 1;
            while next <= N {
                if c.pop(&mut out).unwrap() {
                    let i = u64::from_le_bytes(out[..8].try_into().unwrap());
                    assert_eq!(i, next, "in order, none lost");
                    let seen = payloads[(i % 64) as usize].load(Ordering::Relaxed);
                    assert!(seen >= i, "payload {seen} older than its record {i}");
                    next += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        });
    }
}
