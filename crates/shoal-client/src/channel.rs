//! The framed connection to the daemon: requests out, replies in, one
//! request in flight; the handshake that hands over the region's fd; and
//! the decoding of replies every call shares.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use shoal_core::busy_poll;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::fast_path::readers::FastReads;
use shoal_core::fd_passing::{recv_with_fd, recv_with_fds};
use shoal_core::protocol::{FrameHeader, Reply, Request, FRAME_HEADER_LEN, PROTOCOL_VERSION};
use shoal_core::ObjectId;

use crate::lent;

/// What the daemon told us at connect.
#[derive(Debug, Clone, Copy)]
pub struct StoreInfo {
    /// This connection's id at the daemon (what its references are held by).
    pub client_id: u32,
    /// Bytes of the region mapped here (objects' offsets are into it).
    pub region_size: u64,
    /// Bytes the store may use, at connect time (an elastic store's moves later).
    pub capacity: u64,
    /// The unit objects are aligned and padded to, in bytes.
    pub line_size: u64,
    /// The daemon keeps the region resident; the mapping was populated.
    pub resident: bool,
    /// The daemon is a node of a cluster (objects may live in peers' regions).
    pub clustered: bool,
}

/// Bytes read ahead of the replies decoded so far, in a buffer zeroed once
/// and reused: a call costs no allocation or clearing of read space.
const READ_CHUNK: usize = 64 * 1024;

/// A framed connection: requests out, replies in.
pub(crate) struct Channel {
    pub(crate) stream: UnixStream,
    /// Received bytes not decoded yet are `input[start..end]`.
    input: Vec<u8>,
    start: usize,
    end: usize,
    /// Frames queued for the next write (one-way requests such as releases
    /// ride along with the next request: one system call, one wake-up of
    /// the daemon), then the request being sent.
    output: Vec<u8>,
    /// The fast path, closed when the connection turns out dead.
    pub(crate) fast: Option<Arc<FastReads>>,
    /// Requests queued or sent so far.
    pub(crate) requests: u64,
}

impl Channel {
    fn new(stream: UnixStream) -> Self {
        Self {
            stream,
            input: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            output: Vec::new(),
            fast: None,
            requests: 0,
        }
    }

    /// Received bytes not decoded yet.
    pub(crate) fn pending(&self) -> &[u8] {
        &self.input[self.start..self.end]
    }

    /// Queues a one-way request, sent with the next [`send`](Self::send)
    /// or [`flush`](Self::flush).
    pub(crate) fn queue(&mut self, request: &Request) {
        request.encode(&mut self.output);
        self.requests += 1;
    }

    /// Writes the queued requests, if any.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if self.output.is_empty() {
            return Ok(());
        }
        let written = self.stream.write_all(&self.output);
        self.output.clear();
        Ok(written?)
    }

    /// Sends the queued requests and `request` in one write.
    fn send(&mut self, request: &Request) -> Result<()> {
        self.queue(request);
        self.flush()
    }

    /// Reads until `need` bytes are pending.
    pub(crate) fn fill(&mut self, need: usize) -> Result<()> {
        while self.end - self.start < need {
            if self.start + need > self.input.len() {
                // Move what is pending to the front, growing only for a
                // frame larger than the buffer.
                self.input.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
                if need > self.input.len() {
                    self.input.resize(need.next_multiple_of(READ_CHUNK), 0);
                }
            }
            let n = self.read_some()?;
            if n == 0 {
                return Err(ShoalError::new(
                    ErrorKind::Disconnected,
                    "the daemon closed the connection",
                ));
            }
            self.end += n;
        }
        Ok(())
    }

    /// Reads what has arrived, polling for the busy-poll window before it
    /// sleeps (see [`shoal_core::busy_poll`]): a reply that comes within it
    /// costs no wake-up of this thread. On a machine with no free core it
    /// sleeps at once (woken with priority when the reply comes).
    fn read_some(&mut self) -> std::io::Result<usize> {
        let window = busy_poll::window_now();
        if !window.is_zero() {
            let deadline = Instant::now() + window;
            let fd = self.stream.as_raw_fd();
            loop {
                let space = &mut self.input[self.end..];
                // SAFETY: recv writes at most `space.len()` bytes into our own
                // buffer; MSG_DONTWAIT only makes it return instead of sleeping.
                let n = unsafe {
                    libc::recv(
                        fd,
                        space.as_mut_ptr().cast(),
                        space.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n >= 0 {
                    return Ok(n as usize);
                }
                let err = std::io::Error::last_os_error();
                match err.kind() {
                    std::io::ErrorKind::WouldBlock => {}
                    std::io::ErrorKind::Interrupted => continue,
                    _ => return Err(err),
                }
                if Instant::now() >= deadline || !busy_poll::pause() {
                    break;
                }
            }
        }
        self.stream.read(&mut self.input[self.end..])
    }

    /// The next reply, as sent (an `Error` reply stays one).
    pub(crate) fn recv(&mut self) -> Result<Reply> {
        self.fill(FRAME_HEADER_LEN)?;
        let header = FrameHeader::parse(self.pending())?.expect("header bytes present");
        let len = FRAME_HEADER_LEN + header.len as usize;
        self.fill(len)?;
        let reply = Reply::decode(
            header,
            &self.input[self.start + FRAME_HEADER_LEN..self.start + len],
        );
        self.start += len;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        reply
    }

    /// Sends a request and returns its reply, turning `Error` replies into `Err`.
    pub(crate) fn call(&mut self, request: &Request) -> Result<Reply> {
        let reply = self.send(request).and_then(|()| self.recv());
        if let (Err(err), Some(fast)) = (&reply, &self.fast) {
            if err.kind() == ErrorKind::Disconnected {
                // The daemon is gone: the index answers no more gets.
                fast.close();
            }
        }
        match reply? {
            Reply::Error { kind, message } => Err(ShoalError::new(kind, message)),
            reply => Ok(reply),
        }
    }

    /// A request whose reply comes with fds attached (nothing else may be
    /// in flight): the reply and its fds, in order.
    pub(crate) fn call_with_fds(&mut self, request: &Request) -> Result<(Reply, Vec<OwnedFd>)> {
        self.send(request)?;
        debug_assert!(self.pending().is_empty(), "no reply may be pending");
        let (n, fds) = recv_with_fds(self.stream.as_fd(), &mut self.input[self.end..])?;
        if n == 0 {
            return Err(ShoalError::new(
                ErrorKind::Disconnected,
                "the daemon closed the connection",
            ));
        }
        self.end += n;
        Ok((self.recv()?, fds))
    }

    /// Hello → Welcome, receiving the region's fd on the way.
    pub(crate) fn handshake(path: &Path) -> Result<(Self, StoreInfo, OwnedFd)> {
        let stream = UnixStream::connect(path).map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::NotFound
                || e.kind() == std::io::ErrorKind::ConnectionRefused
            {
                ErrorKind::Disconnected
            } else {
                ErrorKind::Io
            };
            ShoalError::new(kind, format!("connect to {}: {e}", path.display()))
        })?;
        // Before a single byte goes out: a daemon of another user (one
        // squatting the socket's name) must not receive our data.
        shoal_core::local_auth::check_daemon(stream.as_fd(), path)?;
        let mut channel = Channel::new(stream);
        channel.send(&Request::Hello {
            version: PROTOCOL_VERSION,
            pid: std::process::id(),
        })?;
        let mut first = [0u8; 256];
        let (n, fd) = recv_with_fd(channel.stream.as_fd(), &mut first)?;
        if n == 0 {
            return Err(ShoalError::new(
                ErrorKind::Disconnected,
                "the daemon closed the connection during the handshake",
            ));
        }
        channel.input[..n].copy_from_slice(&first[..n]);
        channel.end = n;
        let reply = channel.recv()?;
        let info = match reply {
            Reply::Welcome {
                version: _,
                client_id,
                region_size,
                capacity,
                line_size,
                resident,
                clustered,
            } => StoreInfo {
                client_id,
                region_size,
                capacity,
                line_size,
                resident,
                clustered,
            },
            Reply::Error { kind, message } => return Err(ShoalError::new(kind, message)),
            other => {
                return Err(ShoalError::protocol(format!(
                    "expected Welcome, got {other:?}"
                )))
            }
        };
        let fd = fd.ok_or_else(|| {
            ShoalError::protocol("Welcome arrived without the region's file descriptor")
        })?;
        Ok((channel, info, fd))
    }

    /// The daemon's end of this connection, for a client waiting on shared
    /// memory (a seal through the write channel).
    pub(crate) fn daemon(&self) -> Connected<'_> {
        Connected(&self.stream)
    }
}

/// The daemon's end of a connection, for a client waiting on shared memory.
pub(crate) struct Connected<'a>(&'a UnixStream);

impl lent::Daemon for Connected<'_> {
    fn alive(&self) -> bool {
        lent::daemon_alive(self.0.as_fd())
    }
}

/// `Ok` for an `Ok` reply.
pub(crate) fn expect_ok(reply: Reply) -> Result<()> {
    match reply {
        Reply::Ok => Ok(()),
        other => Err(unexpected(other)),
    }
}

/// A reply the request does not take.
pub(crate) fn unexpected(reply: Reply) -> ShoalError {
    ShoalError::protocol(format!("unexpected reply {reply:?}"))
}

/// One result per id from a `Statuses` reply.
pub(crate) fn per_id(reply: Reply, ids: &[ObjectId], what: &str) -> Result<Vec<Result<()>>> {
    match reply {
        Reply::Statuses { errors } if errors.len() == ids.len() => Ok(errors
            .into_iter()
            .zip(ids)
            .map(|(e, id)| match e {
                None => Ok(()),
                Some(ErrorKind::ObjectNotFound) => Err(ShoalError::not_found(id)),
                Some(kind) => Err(ShoalError::new(kind, format!("{what} {id}: {kind:?}"))),
            })
            .collect()),
        other => Err(unexpected(other)),
    }
}
