//! The bulk data channel: network-mode pulls move object bytes over plain
//! TCP, beside the peer RPC rather than through it.
//!
//! Why not gRPC: a streamed gRPC reply copies every chunk into a message,
//! frames it into HTTP/2 and decodes it again on the other side, about
//! 1 GiB/s on loopback. Here the owner hands its region's pages to the kernel
//! with sendfile(2) (no user-space copy) and the puller receives straight
//! into the new object's memory (the kernel's one copy). Authority stays with
//! the RPC: a range is served only to a node that holds a reference to the
//! object, taken by an Acquire call; this channel only checks the token.
//!
//! One range per connection, blocking I/O on a worker thread, a fixed
//! header written by hand: no framing library makes "token, id, range, ack"
//! simpler than these few lines.
//!
//! Request (puller → owner), integers little endian:
//!
//! ```text
//! "SHB1" | from: u32 | token_len: u16 | token | id: [u8; 20] | offset: u64 | len: u64
//! ```
//!
//! Reply (owner → puller): `0u8` then exactly `len` bytes, after which the
//! puller sends one byte (`ACK`) so the owner keeps the object pinned until
//! every byte left the pages sendfile lent to the socket. Or, instead of the
//! bytes: `kind: u8` (a non-zero shoal `ErrorKind` code) | `msg_len: u16` | msg.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::BorrowedFd;
use std::time::Duration;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::{ObjectId, ID_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const MAGIC: &[u8; 4] = b"SHB1";
/// Tokens longer than this are refused before they are read.
pub const MAX_TOKEN: usize = 4096;
/// The puller's acknowledgement after the last byte.
pub const ACK: u8 = 0xA5;
const MAX_MESSAGE: usize = u16::MAX as usize;
/// Receive buffer asked for on the puller's side: large transfers stall on a
/// small window (the kernel clamps it to net.core.rmem_max).
const RECEIVE_BUFFER: usize = 8 << 20;

/// One range of one object, as the puller asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub from: u32,
    pub token: Vec<u8>,
    pub id: ObjectId,
    pub offset: u64,
    pub len: u64,
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 4 + 2 + self.token.len() + ID_LEN + 16);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.from.to_le_bytes());
        out.extend_from_slice(&(self.token.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.token);
        out.extend_from_slice(&self.id.0);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Reads a request; anything malformed is a `Protocol` error and nothing
    /// more is read (an oversized token length is refused before its bytes).
    pub async fn read(reader: &mut (impl AsyncRead + Unpin)) -> Result<Self> {
        let mut head = [0u8; 10];
        reader.read_exact(&mut head).await?;
        if &head[..4] != MAGIC {
            return Err(ShoalError::protocol("not a shoal data-channel request"));
        }
        let from = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
        let token_len = u16::from_le_bytes(head[8..10].try_into().expect("2 bytes")) as usize;
        if token_len > MAX_TOKEN {
            return Err(ShoalError::protocol(format!(
                "a token of {token_len} bytes (at most {MAX_TOKEN})"
            )));
        }
        let mut rest = vec![0u8; token_len + ID_LEN + 16];
        reader.read_exact(&mut rest).await?;
        let (token, rest) = rest.split_at(token_len);
        let (id, range) = rest.split_at(ID_LEN);
        Ok(Self {
            from,
            token: token.to_vec(),
            id: ObjectId(id.try_into().expect("20 bytes")),
            offset: u64::from_le_bytes(range[..8].try_into().expect("8 bytes")),
            len: u64::from_le_bytes(range[8..].try_into().expect("8 bytes")),
        })
    }
}

/// Owner side: refuses a request with a typed error the puller re-raises.
pub async fn send_error(writer: &mut (impl AsyncWrite + Unpin), err: &ShoalError) {
    let message = err.message().as_bytes();
    let message = &message[..message.len().min(MAX_MESSAGE)];
    let mut out = Vec::with_capacity(3 + message.len());
    out.push(err.kind().code() as u8);
    out.extend_from_slice(&(message.len() as u16).to_le_bytes());
    out.extend_from_slice(message);
    let _ = writer.write_all(&out).await;
    let _ = writer.shutdown().await;
}

/// Owner side (blocking): sends `len` bytes at `offset` of the region behind
/// `fd` (mapped at `base`), then waits for the puller's acknowledgement.
/// sendfile(2) where the region's file supports it (tmpfs, hugetlbfs);
/// plain writes from the mapping otherwise (device regions).
///
/// # Safety
/// `base` maps the region behind `fd`, and `[offset, offset + len)` lies
/// inside it and stays allocated and unmodified until this returns.
pub unsafe fn send_range(
    mut socket: TcpStream,
    fd: BorrowedFd<'_>,
    base: *const u8,
    offset: u64,
    len: u64,
    timeout: Duration,
) -> Result<()> {
    socket.set_nonblocking(false)?;
    socket.set_write_timeout(Some(timeout))?;
    socket.set_read_timeout(Some(timeout))?;
    socket.write_all(&[0])?;
    let mut at = offset as i64;
    let end = (offset + len) as i64;
    while at < end {
        let count = ((end - at) as usize).min(1 << 30);
        match nix::sys::sendfile::sendfile64(&socket, fd, Some(&mut at), count) {
            Ok(0) => return Err(ShoalError::io("sendfile", "the region ended early")),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS) => {
                // SAFETY: inside the mapped region, pinned (the caller's contract).
                let rest = unsafe {
                    std::slice::from_raw_parts(base.add(at as usize), (end - at) as usize)
                };
                socket.write_all(rest)?;
                at = end;
            }
            Err(errno) => return Err(std::io::Error::from(errno).into()),
        }
    }
    let mut ack = [0u8; 1];
    socket.read_exact(&mut ack)?;
    if ack[0] != ACK {
        return Err(ShoalError::protocol(
            "a data-channel acknowledgement that is not ACK",
        ));
    }
    Ok(())
}

/// Puller side (blocking): asks `addr` (node `owner`'s data channel) for a
/// range and receives it into `dst`. `addr` is resolved for each range (a
/// host name is looked up again: the owner may have moved), and each address
/// it stands for is tried in turn. A node that cannot be reached, or stalls
/// for `timeout`, is `NodeUnavailable`; an error the owner sends back keeps
/// its kind.
pub fn fetch_range(
    owner: u32,
    addr: impl ToSocketAddrs + std::fmt::Display,
    request: &Request,
    dst: &mut [u8],
    timeout: Duration,
) -> Result<()> {
    debug_assert_eq!(dst.len() as u64, request.len);
    let unavailable = |what: &str, err: &dyn std::fmt::Display| {
        ShoalError::new(
            ErrorKind::NodeUnavailable,
            format!("node {owner} data channel {addr}: {what}: {err}"),
        )
    };
    let mut socket = connect(&addr, timeout).map_err(|e| unavailable("connect", &e))?;
    let setup = || -> std::io::Result<()> {
        socket.set_nodelay(true)?;
        socket.set_read_timeout(Some(timeout))?;
        socket.set_write_timeout(Some(timeout))?;
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBuf, &RECEIVE_BUFFER)
            .map_err(std::io::Error::from)
    };
    setup().map_err(|e| unavailable("socket options", &e))?;
    socket
        .write_all(&request.encode())
        .map_err(|e| unavailable("send request", &e))?;
    let io_error = |what: &str, e: std::io::Error| match e.kind() {
        IoKind::WouldBlock | IoKind::TimedOut => unavailable(what, &"stalled"),
        _ => unavailable(what, &e),
    };
    let mut status = [0u8; 1];
    socket
        .read_exact(&mut status)
        .map_err(|e| io_error("read reply", e))?;
    if status[0] != 0 {
        let mut len = [0u8; 2];
        socket
            .read_exact(&mut len)
            .map_err(|e| io_error("read error", e))?;
        let mut message = vec![0u8; u16::from_le_bytes(len) as usize];
        socket
            .read_exact(&mut message)
            .map_err(|e| io_error("read error", e))?;
        let kind = ErrorKind::from_code(status[0] as u16).unwrap_or(ErrorKind::Protocol);
        return Err(ShoalError::new(
            kind,
            format!("node {owner}: {}", String::from_utf8_lossy(&message)),
        ));
    }
    let mut got = 0;
    while got < dst.len() {
        match socket.read(&mut dst[got..]) {
            Ok(0) => {
                return Err(unavailable(
                    "receive",
                    &format!("closed after {got} of {} bytes", dst.len()),
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(e) => return Err(io_error("receive", e)),
        }
    }
    // Best effort: the bytes are all here; a lost ack only delays the owner's unpin.
    let _ = socket.write_all(&[ACK]);
    Ok(())
}

/// Connects to the first address `addr` resolves to that answers.
fn connect(addr: &impl ToSocketAddrs, timeout: Duration) -> std::io::Result<TcpStream> {
    let mut last = None;
    for one in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&one, timeout) {
            Ok(socket) => return Ok(socket),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(IoKind::NotFound, "the address resolves to nothing")
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Seek;
    use std::net::{SocketAddr, TcpListener};
    use std::os::fd::AsFd;

    fn request(len: u64) -> Request {
        Request {
            from: 3,
            token: b"secret".to_vec(),
            id: ObjectId([7; ID_LEN]),
            offset: 4096,
            len,
        }
    }

    #[tokio::test]
    async fn requests_round_trip_and_malformed_ones_are_refused() {
        let r = request(123);
        let bytes = r.encode();
        assert_eq!(Request::read(&mut bytes.as_slice()).await.unwrap(), r);

        let mut bad = bytes.clone();
        bad[0] = b'X';
        let err = Request::read(&mut bad.as_slice()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol);

        let mut huge = bytes.clone();
        huge[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
        let err = Request::read(&mut huge.as_slice()).await.unwrap_err();
        assert!(err.message().contains("token"), "{err}");

        for cut in [0, 5, 12, bytes.len() - 1] {
            let err = Request::read(&mut &bytes[..cut]).await.unwrap_err();
            assert_ne!(err.kind(), ErrorKind::InvalidArgument, "{cut}: {err}");
        }
    }

    /// A file-backed "region" served by `send_range` on a thread.
    fn serve_file(
        data: &[u8],
        offset: u64,
        len: u64,
    ) -> (SocketAddr, std::thread::JoinHandle<Result<()>>) {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(data).unwrap();
        file.rewind().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mapped = data.to_vec();
        let handle = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut head = vec![0u8; request(0).encode().len()];
            socket.read_exact(&mut head).unwrap();
            // SAFETY: `mapped` is a copy of the file, alive for the call.
            unsafe {
                send_range(
                    socket,
                    file.as_fd(),
                    mapped.as_ptr(),
                    offset,
                    len,
                    Duration::from_secs(5),
                )
            }
        });
        (addr, handle)
    }

    #[test]
    fn a_range_arrives_whole_and_acknowledged() {
        let data: Vec<u8> = (0..(3 << 20) as u32)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let (offset, len) = (4096u64, (2 << 20) + 17);
        let (addr, server) = serve_file(&data, offset, len);
        let mut dst = vec![0u8; len as usize];
        fetch_range(1, addr, &request(len), &mut dst, Duration::from_secs(5)).unwrap();
        assert_eq!(dst, &data[offset as usize..(offset + len) as usize]);
        server.join().unwrap().unwrap();
    }

    #[test]
    fn an_owner_error_keeps_its_kind_and_a_dead_owner_is_unavailable() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let (socket, _) = listener.accept().unwrap();
                socket.set_nonblocking(true).unwrap();
                let mut socket = tokio::net::TcpStream::from_std(socket).unwrap();
                Request::read(&mut socket).await.unwrap();
                let err = ShoalError::new(ErrorKind::ObjectNotFound, "no such object");
                send_error(&mut socket, &err).await;
            });
        });
        let mut dst = vec![0u8; 10];
        let err = fetch_range(1, addr, &request(10), &mut dst, Duration::from_secs(5)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
        assert!(err.message().contains("no such object"), "{err}");
        server.join().unwrap();

        // Nobody listens there any more.
        let err = fetch_range(1, addr, &request(10), &mut dst, Duration::from_secs(1)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodeUnavailable, "{err}");
    }

    #[test]
    fn an_owner_that_stops_sending_is_unavailable_within_the_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            socket.write_all(&[0, 1, 2, 3]).unwrap(); // status OK, then 3 of 10 bytes
            std::thread::sleep(Duration::from_millis(800));
        });
        let started = std::time::Instant::now();
        let mut dst = vec![0u8; 10];
        let err =
            fetch_range(1, addr, &request(10), &mut dst, Duration::from_millis(300)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodeUnavailable, "{err}");
        assert!(started.elapsed() < Duration::from_millis(700));
        server.join().unwrap();
    }
}
