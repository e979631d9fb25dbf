//! Sending an open file descriptor beside bytes on a Unix socket (SCM_RIGHTS).
//!
//! The daemon hands each client the region's fd once, with the `Welcome`
//! reply, the fast path's two with `FastReads`, two per owner node with
//! `PeerReads`; the client maps them.
//! This is how data never crosses the socket.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Sends `bytes` with `fds` attached (in order). Returns bytes written (may
/// be short; the caller writes the rest normally — the fds ride on the first
/// byte).
pub fn send_with_fds(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<usize> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let cmsgs = [ControlMessage::ScmRights(&raw)];
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(std::io::Error::from)
}

/// Fds one message may carry here (`PeerReads`: two per owner node); more
/// are closed by the kernel.
pub const MAX_FDS: usize = 64;

/// Receives into `buf`, returning the byte count and every fd that came
/// with them, in order (close-on-exec; at most [`MAX_FDS`]).
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut received = Vec::new();
    for cmsg in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            // SAFETY: the kernel just installed these descriptors in our
            // table; we own them (dropping one closes it).
            received.extend(
                fds.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    Ok((msg.bytes, received))
}

/// Receives into `buf`, returning the byte count and any fd that came with
/// them (close-on-exec). Extra fds beyond the first are closed.
pub fn recv_with_fd(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let (n, fds) = recv_with_fds(socket, buf)?;
    Ok((n, fds.into_iter().next()))
}
