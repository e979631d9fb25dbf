//! Sending an open file descriptor beside bytes on a Unix socket (SCM_RIGHTS).
//!
//! The daemon hands each client the region's fd once, with the `Welcome`
//! reply; the client maps it. This is how data never crosses the socket.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Sends `bytes` with `fd` attached. Returns bytes written (may be short;
/// the caller writes the rest normally — the fd rides on the first byte).
pub fn send_with_fd(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fd: BorrowedFd<'_>,
) -> std::io::Result<usize> {
    let fds = [fd.as_raw_fd()];
    let cmsgs = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(std::io::Error::from)
}

/// Receives into `buf`, returning the byte count and any fd that came with
/// them (close-on-exec). Extra fds beyond the first are closed.
pub fn recv_with_fd(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut received = None;
    for cmsg in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for fd in fds {
                // SAFETY: the kernel just installed this descriptor in our table; we own it.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if received.is_none() {
                    received = Some(owned);
                }
            }
        }
    }
    Ok((msg.bytes, received))
}
