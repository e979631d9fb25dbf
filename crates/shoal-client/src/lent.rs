//! Creates without a round trip (docs/fast-path.md, pieces 2 and 3): small
//! objects are carved from a block the daemon lent this client, announced
//! with a one-way `Create` record, written in place, and sealed through the
//! client's write channel; aborts and releases of references taken through
//! the daemon go there too. The daemon answers each seal through shared
//! memory, so a seal still returns the daemon's verdict (an id another
//! client took meanwhile, a durability the tiers could not give) — it only
//! skips the socket. A seal to memory of an object whose `Create` the
//! daemon already took is not waited for at all: nothing can refuse it, and
//! the daemon applies published records before it answers anything.
//!
//! This is the client's bookkeeping; none of it is trusted by the daemon,
//! which checks every record against its own record of the lent block.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use shoal_core::durability::Durability;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::fast_path::lease::Lease;
use shoal_core::fast_path::readers::FastReads;
use shoal_core::fast_path::writes::{Record, WriteSender, RECORDS};
use shoal_core::location::Block;
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

/// Bytes asked for per lease (the daemon may lend less, or nothing).
pub const LEASE: u64 = 1 << 20;
/// Objects up to this size (data + metadata) are created in lent space;
/// larger ones take the socket, whose round trip is small beside their copy.
pub const MAX_OBJECT: u64 = LEASE / 8;
/// After the daemon had nothing to lend, creates take the socket this long
/// before asking again.
const REFUSED_PAUSE: Duration = Duration::from_millis(100);
/// How often a client waiting for an answer checks that the daemon lives.
const LIVENESS: Duration = Duration::from_millis(100);
/// Deletes or contains asked through the write channel at once; more take
/// the socket.
pub const MAX_QUERIES: usize = 16;

/// What a seal through the write channel needs from the client around it.
pub trait Daemon {
    /// Whether the connection to the daemon is still open.
    fn alive(&self) -> bool;
}

/// Whether the daemon's end of the connection `socket` is still open: a
/// poll for hang-up, without waiting.
pub fn daemon_alive(socket: BorrowedFd<'_>) -> bool {
    let mut poll = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd on a descriptor we hold, no waiting.
    let n = unsafe { libc::poll(&mut poll, 1, 0) };
    n == 0 || poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) == 0
}

pub struct FastWrites {
    sender: WriteSender,
    doorbell: OwnedFd,
    /// A duplicate of the connection's socket, to see the daemon go.
    socket: OwnedFd,
    fast: std::sync::Arc<FastReads>,
    line: u64,
    lease: Option<Lease>,
    /// Leases used up whose objects are still being written.
    retiring: Vec<Lease>,
    /// Objects carved and not sealed or aborted yet, and the sequence
    /// number of each one's `Create` record (its answer explains a refused
    /// seal).
    writing: HashMap<ObjectId, (ObjectLocation, u64)>,
    /// Seals to memory returned without their answer: the seal record's
    /// sequence number, until the daemon applied it (a get of the object
    /// from this client waits for that rather than ask the socket).
    unsettled: HashMap<ObjectId, u64>,
    refused_until: Option<Instant>,
    /// Objects up to this size go into lent space: an eighth of the last
    /// lease (a small store lends small blocks).
    max_object: u64,
}

impl FastWrites {
    /// The channel and doorbell the daemon sent; `socket`, a duplicate of
    /// the connection's, tells a full ring whose daemon is gone from a busy
    /// one.
    pub fn attach(
        channel: BorrowedFd<'_>,
        doorbell: OwnedFd,
        socket: OwnedFd,
        fast: std::sync::Arc<FastReads>,
        line: u64,
    ) -> Result<Self> {
        Ok(Self {
            sender: WriteSender::attach(channel)?,
            doorbell,
            socket,
            fast,
            line,
            lease: None,
            retiring: Vec::new(),
            writing: HashMap::new(),
            unsettled: HashMap::new(),
            refused_until: None,
            max_object: MAX_OBJECT,
        })
    }

    /// The bytes an object of `total` bytes takes (whole lines, at least one).
    fn block_len(&self, total: u64) -> Option<u64> {
        total.max(1).checked_next_multiple_of(self.line)
    }

    /// Whether a create of this size should try lent space now.
    pub fn wants(&self, data_size: u64, meta_size: u32) -> bool {
        data_size
            .checked_add(u64::from(meta_size))
            .is_some_and(|t| t <= self.max_object)
            && self.refused_until.is_none_or(|t| Instant::now() >= t)
    }

    /// Whether some client may be writing `id` (the daemon's creating
    /// filter): then the create goes through the socket, which knows.
    pub fn maybe_taken(&self, id: &ObjectId) -> bool {
        !self.writing.contains_key(id) && self.fast.maybe_creating(id)
    }

    /// Whether `id` is being written here.
    pub fn writing(&self, id: &ObjectId) -> bool {
        self.writing.contains_key(id)
    }

    /// Carves object `id` from the current lease. `Ok(None)`: the lease is
    /// used up (or there is none): ask for a new one with
    /// [`take_lease`](Self::take_lease) and try again.
    pub fn carve(
        &mut self,
        id: ObjectId,
        data_size: u64,
        meta_size: u32,
    ) -> Result<Option<ObjectLocation>> {
        if self.writing.contains_key(&id) || self.fast.published(&id) {
            return Err(ShoalError::exists(&id));
        }
        let len = self
            .block_len(data_size + u64::from(meta_size))
            .expect("checked by wants");
        let Some(offset) = self.lease.as_mut().and_then(|l| l.carve(len)) else {
            return Ok(None);
        };
        let location = ObjectLocation {
            offset,
            data_size,
            meta_size,
        };
        let created = self.stage(&Record::Create { id, location })?;
        self.publish();
        self.writing.insert(id, (location, created));
        Ok(Some(location))
    }

    /// Replaces the current lease by `block` (`None`: the daemon lent
    /// nothing; creates take the socket for a while). The old one is given
    /// back once nothing carved from it is being written.
    pub fn take_lease(&mut self, block: Option<(u64, Block)>) -> Result<()> {
        if let Some(old) = self.lease.take() {
            self.retiring.push(old);
        }
        match block {
            Some((number, block)) => {
                self.max_object = (block.len / 8).min(MAX_OBJECT);
                self.lease = Some(Lease::new(number, block));
            }
            None => self.refused_until = Some(Instant::now() + REFUSED_PAUSE),
        }
        self.give_back_finished()
    }

    /// Gives back every lease nothing is being written in (a create
    /// through the socket found the store full: lent space must not be
    /// what fills it). Returns whether any was.
    pub fn give_back_idle(&mut self) -> Result<bool> {
        if let Some(lease) = self.lease.take() {
            self.retiring.push(lease);
        }
        let had = self.retiring.iter().any(|l| l.writing() == 0);
        self.give_back_finished()?;
        Ok(had)
    }

    /// Gives back the retired leases nothing is written in any more (no
    /// answer awaited: the daemon checks the record against its own).
    fn give_back_finished(&mut self) -> Result<()> {
        let mut i = 0;
        let mut sent = false;
        while i < self.retiring.len() {
            if self.retiring[i].writing() == 0 {
                let lease = self.retiring.swap_remove(i);
                self.stage(&Record::GiveBack {
                    lease: lease.number(),
                })?;
                sent = true;
            } else {
                i += 1;
            }
        }
        if sent {
            self.publish();
        }
        Ok(())
    }

    /// The lease (current or retiring) that `offset` was carved from.
    fn lease_of(&mut self, offset: u64) -> Option<&mut Lease> {
        self.lease
            .iter_mut()
            .chain(self.retiring.iter_mut())
            .find(|l| l.holds(offset))
    }

    fn finished(&mut self, location: ObjectLocation, undo: bool) -> Result<()> {
        let len = self
            .block_len(location.size())
            .expect("carved with this size");
        if let Some(lease) = self.lease_of(location.offset) {
            lease.finished(location.offset, len, undo);
        }
        self.give_back_finished()
    }

    /// Drops object `id` being written here: `false` if it is not.
    pub fn abort(&mut self, id: &ObjectId) -> Result<bool> {
        let Some((location, _)) = self.writing.remove(id) else {
            return Ok(false);
        };
        self.stage(&Record::Abort { id: *id })?;
        self.publish();
        self.finished(location, true)?;
        Ok(true)
    }

    /// Stages a record, publishing and waiting for room while the ring is
    /// full; `Disconnected` if the daemon goes meanwhile (nobody would ever
    /// make room: a release or a close would hang).
    fn stage(&mut self, record: &Record) -> Result<u64> {
        let mut pause = Duration::from_micros(10);
        loop {
            if let Some(sequence) = self.sender.stage(record)? {
                return Ok(sequence);
            }
            self.publish();
            if !daemon_alive(self.socket.as_fd()) {
                return Err(ShoalError::new(
                    ErrorKind::Disconnected,
                    "the daemon closed the connection while its write channel was full",
                ));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// Makes staged records visible, ringing the doorbell if the daemon sleeps.
    fn publish(&mut self) {
        self.sender.publish();
        // The tail's store before the asleep word's load (the daemon does
        // the reverse): one of the two sees the other.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if self.fast.daemon_asleep() {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a local buffer to our eventfd; a
            // failure (counter full) means it is rung already.
            unsafe { libc::write(self.doorbell.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
    }

    /// Seals objects written here: one answer per id, in order. An object
    /// whose seal is refused stays being written (seal it again, or abort),
    /// as on the socket path.
    pub fn seal(
        &mut self,
        ids: &[ObjectId],
        release: bool,
        durability: Option<Durability>,
        daemon: &impl Daemon,
    ) -> Result<Vec<Result<()>>> {
        let mut sequences = Vec::with_capacity(ids.len());
        for id in ids {
            let (location, created) = *self
                .writing
                .get(id)
                .ok_or_else(|| ShoalError::not_found(id))?;
            let sequence = self.stage(&Record::Seal {
                id: *id,
                release,
                durability,
            })?;
            sequences.push((sequence, location, created));
        }
        self.publish();
        // A seal to memory of an object whose create the daemon took cannot
        // be refused (it is this client's, unsealed, named once): its answer
        // is not waited for. The record is published, and the daemon applies
        // every published record before it answers any request, so a get
        // anywhere on the node that misses the index finds the object there.
        let to_memory = durability.unwrap_or(self.sender.default_level()) == Durability::Memory;
        let mut outcomes = Vec::with_capacity(ids.len());
        for (id, (sequence, location, created)) in ids.iter().zip(sequences) {
            let taken = to_memory && self.sender.answered(created) == Some(None);
            let answer = if taken {
                None
            } else {
                self.sender.wait(
                    sequence,
                    shoal_core::busy_poll::window_now(),
                    LIVENESS,
                    || daemon.alive(),
                )?
            };
            if taken {
                self.unsettled.insert(*id, sequence);
            }
            outcomes.push(match answer {
                None => {
                    self.writing.remove(id);
                    self.finished(location, false)?;
                    Ok(())
                }
                Some(kind) => {
                    // A create the daemon refused (the id was taken) says
                    // why better than the seal of an object it never made.
                    let kind = self.sender.answered(created).flatten().unwrap_or(kind);
                    Err(refusal(kind, id))
                }
            });
        }
        if self.unsettled.len() > RECORDS as usize {
            // Most of them are applied long since: forget those.
            let sender = &self.sender;
            self.unsettled
                .retain(|_, &mut sequence| !sender.settled(sequence));
        }
        Ok(outcomes)
    }

    /// Waits until the daemon applied this client's seals of `ids` that
    /// returned without an answer (then the index has them). Returns
    /// whether any was pending.
    pub fn settle(
        &mut self,
        ids: impl IntoIterator<Item = ObjectId>,
        daemon: &impl Daemon,
    ) -> Result<bool> {
        if self.unsettled.is_empty() {
            return Ok(false);
        }
        let mut any = false;
        for id in ids {
            let Some(sequence) = self.unsettled.remove(&id) else {
                continue;
            };
            any = true;
            self.sender.wait_settled(
                sequence,
                shoal_core::busy_poll::window_now(),
                LIVENESS,
                || daemon.alive(),
            )?;
        }
        Ok(any)
    }

    /// Asks the daemon through the write channel — deletes, contains — and
    /// waits for the answers, one per record, in order: a round trip
    /// without the socket (no system call while the daemon polls, futexes
    /// otherwise). At most [`MAX_QUERIES`] at once (each answer has its
    /// ring slot's word until a later record takes the slot).
    pub fn ask(
        &mut self,
        records: &[Record],
        daemon: &impl Daemon,
    ) -> Result<Vec<Option<ErrorKind>>> {
        debug_assert!(records.len() <= MAX_QUERIES && records.iter().all(Record::is_query));
        let mut sequences = Vec::with_capacity(records.len());
        for record in records {
            sequences.push(self.stage(record)?);
        }
        self.publish();
        sequences
            .into_iter()
            .map(|sequence| {
                self.sender.wait(
                    sequence,
                    shoal_core::busy_poll::window_now(),
                    LIVENESS,
                    || daemon.alive(),
                )
            })
            .collect()
    }

    /// Releases references taken through the daemon, without waiting.
    pub fn release(&mut self, ids: &[ObjectId]) -> Result<()> {
        for id in ids {
            self.stage(&Record::Release { id: *id })?;
        }
        self.publish();
        Ok(())
    }
}

fn refusal(kind: ErrorKind, id: &ObjectId) -> ShoalError {
    match kind {
        ErrorKind::ObjectExists => ShoalError::exists(id),
        kind => ShoalError::new(kind, format!("the daemon refused the seal of object {id}")),
    }
}
