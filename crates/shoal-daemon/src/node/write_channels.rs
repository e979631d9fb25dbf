//! Clients' write channels as the node keeps them (docs/fast-path.md,
//! pieces 2 and 3): one per client that asked, and the doorbell, an eventfd
//! clients write when the daemon said it sleeps.
//!
//! The records themselves are applied by `ops::lent`; this registry only
//! hands them out, answers them, and forgets a client's channel when it
//! leaves or breaks the protocol.

use std::cell::RefCell;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

use foldhash::HashMap;
use shoal_core::durability::Durability;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::fast_path::writes::{Record, WriteChannel};
use shoal_core::ids::ClientId;

/// How many records one client's channel yields per poll round: a busy
/// client cannot hold the daemon's thread for long.
pub const ROUND: usize = 64;

pub struct WriteChannels {
    channels: RefCell<HashMap<ClientId, WriteChannel>>,
    /// Queries (deletes, contains) taken and not answered yet: each is
    /// answered once a round finds no record left, so after every record
    /// any client published before it.
    queries: RefCell<Vec<(ClientId, u64, Record)>>,
    /// `None`: no eventfd could be made; the daemon offers no channels.
    doorbell: Option<OwnedFd>,
}

impl Default for WriteChannels {
    fn default() -> Self {
        // SAFETY: eventfd with a zero counter and flags; returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        Self {
            channels: RefCell::default(),
            queries: RefCell::default(),
            // SAFETY: a fresh descriptor this process owns.
            doorbell: (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }),
        }
    }
}

impl WriteChannels {
    /// The doorbell, if the daemon has one.
    pub fn doorbell(&self) -> Option<BorrowedFd<'_>> {
        self.doorbell.as_ref().map(AsFd::as_fd)
    }

    /// Opens `client`'s channel: its fd and a copy of the doorbell, for the
    /// client. A second request replaces nothing (an error).
    pub fn open(&self, client: ClientId, default_level: Durability) -> Result<(OwnedFd, OwnedFd)> {
        let doorbell = self
            .doorbell
            .as_ref()
            .ok_or_else(|| ShoalError::invalid("this daemon has no doorbell"))?
            .try_clone()
            .map_err(|e| ShoalError::io("dup the doorbell", e))?;
        let mut channels = self.channels.borrow_mut();
        if channels.contains_key(&client) {
            return Err(ShoalError::invalid(
                "this client has a write channel already",
            ));
        }
        let (channel, fd) = WriteChannel::create(default_level)?;
        channels.insert(client, channel);
        Ok((fd, doorbell))
    }

    /// Forgets `client`'s channel (it left, or broke the protocol).
    pub fn close(&self, client: ClientId) {
        self.channels.borrow_mut().remove(&client);
    }

    pub fn has(&self, client: ClientId) -> bool {
        self.channels.borrow().contains_key(&client)
    }

    /// Whether any client published a record not taken yet.
    pub fn any_pending(&self) -> bool {
        self.channels.borrow().values().any(WriteChannel::has_next)
    }

    /// The clients with records waiting.
    pub fn pending(&self) -> Vec<ClientId> {
        self.channels
            .borrow()
            .iter()
            .filter(|(_, c)| c.has_next())
            .map(|(&client, _)| client)
            .collect()
    }

    /// Takes up to [`ROUND`] of `client`'s records. An error: its channel
    /// is broken (the caller drops the client).
    pub fn take(&self, client: ClientId) -> Result<Vec<(u64, Record)>> {
        let mut channels = self.channels.borrow_mut();
        let Some(channel) = channels.get_mut(&client) else {
            return Ok(Vec::new());
        };
        let mut records = Vec::new();
        while records.len() < ROUND {
            match channel.take()? {
                Some(record) => records.push(record),
                None => break,
            }
        }
        Ok(records)
    }

    /// Keeps a query taken from `client`'s ring until [`take_queries`](Self::take_queries).
    pub fn defer_query(&self, client: ClientId, sequence: u64, record: Record) {
        self.queries.borrow_mut().push((client, sequence, record));
    }

    /// The queries kept so far, in the order they were taken.
    pub fn take_queries(&self) -> Vec<(ClientId, u64, Record)> {
        std::mem::take(&mut *self.queries.borrow_mut())
    }

    /// Answers `client`'s record `sequence` (nothing if the client is gone).
    pub fn answer(&self, client: ClientId, sequence: u64, outcome: Option<ErrorKind>) {
        if let Some(channel) = self.channels.borrow().get(&client) {
            channel.answer(sequence, outcome);
        }
    }
}
