//! Notifications of seals and removals, on a connection of their own.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use shoal_core::error::{ErrorKind, Result};
use shoal_core::event::ObjectEvent;
use shoal_core::protocol::{Reply, Request, FRAME_HEADER_LEN};

use crate::channel::{expect_ok, unexpected, Channel};

/// A stream of seal and removal notifications from a daemon.
pub struct Subscription {
    channel: Channel,
}

impl Subscription {
    /// Subscribes on a connection of its own to the daemon at `socket`.
    pub fn connect(socket: impl AsRef<Path>) -> Result<Self> {
        let (mut channel, _, _fd) = Channel::handshake(socket.as_ref())?;
        expect_ok(channel.call(&Request::Subscribe)?)?;
        Ok(Self { channel })
    }

    /// A second handle on the subscription's socket: shutting it down ends a
    /// `next` blocked in another thread (it returns `Disconnected`).
    pub fn closer(&self) -> Result<UnixStream> {
        Ok(self.channel.stream.try_clone()?)
    }

    /// The next notification, waiting at most `timeout` (`None`: forever).
    /// `Ok(None)` on timeout.
    pub fn next(&mut self, timeout: Option<Duration>) -> Result<Option<ObjectEvent>> {
        if self.channel.pending().len() < FRAME_HEADER_LEN {
            self.channel.stream.set_read_timeout(timeout)?;
            let result = self.channel.fill(FRAME_HEADER_LEN);
            self.channel.stream.set_read_timeout(None)?;
            match result {
                Err(err) if err.kind() == ErrorKind::Io && self.channel.pending().is_empty() => {
                    return Ok(None)
                }
                other => other?,
            }
        }
        match self.channel.recv()? {
            Reply::Notification(n) => Ok(Some(n)),
            other => Err(unexpected(other)),
        }
    }
}
