//! The bulk data channel: network-mode pulls and pushes move object bytes
//! over plain TCP, beside the peer RPC rather than through it.
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
//!
//! A push (network-mode remote allocation: a node writes the bytes of an
//! object it allocated on another node) is the same header under the magic
//! `"SHP1"`, the range being one of the receiving node's object. The
//! receiver answers `0u8` (send) or an error as above; the pusher then sends
//! exactly `len` bytes (sendfile from its own region) and the receiver
//! answers once more: `0u8` when every byte is in the object, or an error.
//! The pusher seals only after that answer.
//!
//! With TLS (`tls`), the same bytes travel inside a TLS 1.3 session whose
//! certificates prove both ends; the owner then encrypts from the region's
//! mapping in user space instead of sendfile ([`Wire`]).

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::BorrowedFd;
use std::time::Duration;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::{ObjectId, ID_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::tls::data::tls_error;
use crate::tls::records::Records;
use crate::tls::TlsMaterial;

pub const MAGIC: &[u8; 4] = b"SHB1";
/// The magic of a push.
pub const PUSH_MAGIC: &[u8; 4] = b"SHP1";
/// Tokens longer than this are refused before they are read.
pub const MAX_TOKEN: usize = 4096;
/// The puller's acknowledgement after the last byte.
pub const ACK: u8 = 0xA5;
const MAX_MESSAGE: usize = u16::MAX as usize;
/// Receive buffer asked for on the puller's side: large transfers stall on a
/// small window (the kernel clamps it to net.core.rmem_max).
const RECEIVE_BUFFER: usize = 8 << 20;

/// Which way the bytes of a request go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// From the node asked to the node asking (a network-mode get).
    Pull,
    /// From the node asking into an object it allocated on the node asked.
    Push,
}

impl Kind {
    fn magic(self) -> &'static [u8; 4] {
        match self {
            Kind::Pull => MAGIC,
            Kind::Push => PUSH_MAGIC,
        }
    }
}

/// One range of one object, as the puller (or pusher) asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub kind: Kind,
    pub from: u32,
    pub token: Vec<u8>,
    pub id: ObjectId,
    pub offset: u64,
    pub len: u64,
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 4 + 2 + self.token.len() + ID_LEN + 16);
        out.extend_from_slice(self.kind.magic());
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
        let kind = match &head[..4] {
            m if m == MAGIC => Kind::Pull,
            m if m == PUSH_MAGIC => Kind::Push,
            _ => return Err(ShoalError::protocol("not a shoal data-channel request")),
        };
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
            kind,
            from,
            token: token.to_vec(),
            id: ObjectId(id.try_into().expect("20 bytes")),
            offset: u64::from_le_bytes(range[..8].try_into().expect("8 bytes")),
            len: u64::from_le_bytes(range[8..].try_into().expect("8 bytes")),
        })
    }
}

/// An error as the channel sends it: kind, length, message.
fn error_frame(err: &ShoalError) -> Vec<u8> {
    let message = err.message().as_bytes();
    let message = &message[..message.len().min(MAX_MESSAGE)];
    let mut out = Vec::with_capacity(3 + message.len());
    out.push(err.kind().code() as u8);
    out.extend_from_slice(&(message.len() as u16).to_le_bytes());
    out.extend_from_slice(message);
    out
}

/// Owner side: refuses a request with a typed error the puller re-raises.
pub async fn send_error(writer: &mut (impl AsyncWrite + Unpin), err: &ShoalError) {
    let _ = writer.write_all(&error_frame(err)).await;
    let _ = writer.shutdown().await;
}

/// One data-channel connection on a worker thread.
pub enum Wire {
    /// Cleartext TCP: bytes leave the region by sendfile(2).
    Plain(TcpStream),
    /// TLS, its records sealed and opened in this process (a received
    /// range's in place), this node dialing or answering.
    Tls(Box<Records>),
    /// TLS the kernel encrypts (kTLS), this node answering: a socket
    /// like a plain one, sendfile included.
    Kernel(TcpStream),
}

/// How a connection's bytes are protected (`shoal_data_channel_transfers_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encryption {
    /// Cleartext.
    None,
    /// TLS encrypted by rustls in this process.
    UserSpace,
    /// TLS encrypted by the kernel (kTLS): sendfile kept.
    Kernel,
}

impl Encryption {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::UserSpace => "tls-userspace",
            Self::Kernel => "tls-kernel",
        }
    }
}

impl Wire {
    /// The TCP socket underneath (for its options).
    pub fn socket(&self) -> &TcpStream {
        match self {
            Self::Plain(socket) | Self::Kernel(socket) => socket,
            Self::Tls(records) => records.socket(),
        }
    }

    pub fn encryption(&self) -> Encryption {
        match self {
            Self::Plain(_) => Encryption::None,
            Self::Tls(_) => Encryption::UserSpace,
            Self::Kernel(_) => Encryption::Kernel,
        }
    }
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Plain(socket) | Self::Kernel(socket) => socket.read(buf),
            Self::Tls(records) => records.read(buf),
        }
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Plain(socket) | Self::Kernel(socket) => socket.write(buf),
            Self::Tls(records) => records.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Plain(socket) | Self::Kernel(socket) => socket.flush(),
            Self::Tls(records) => records.flush(),
        }
    }
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
    mut socket: Wire,
    fd: BorrowedFd<'_>,
    base: *const u8,
    offset: u64,
    len: u64,
    timeout: Duration,
) -> Result<()> {
    socket.socket().set_nonblocking(false)?;
    socket.socket().set_write_timeout(Some(timeout))?;
    socket.socket().set_read_timeout(Some(timeout))?;
    socket.write_all(&[0])?;
    // SAFETY: the caller's contract.
    unsafe { send_file(&mut socket, fd, base, offset, len) }?;
    let mut ack = [0u8; 1];
    socket.read_exact(&mut ack)?;
    if ack[0] != ACK {
        return Err(ShoalError::protocol(
            "a data-channel acknowledgement that is not ACK",
        ));
    }
    Ok(())
}

/// Writes `[offset, offset + len)` of the region behind `fd` (mapped at
/// `base`) to `socket`: sendfile(2) where the file supports it, plain
/// writes from the mapping otherwise (and always through TLS).
///
/// # Safety
/// `base` maps the region behind `fd` and the range lies inside it.
unsafe fn send_file(
    socket: &mut Wire,
    fd: BorrowedFd<'_>,
    base: *const u8,
    offset: u64,
    len: u64,
) -> Result<()> {
    let socket = match socket {
        Wire::Plain(socket) | Wire::Kernel(socket) => socket,
        tls => {
            // SAFETY: inside the mapped region (the caller's contract).
            let bytes =
                unsafe { std::slice::from_raw_parts(base.add(offset as usize), len as usize) };
            tls.write_all(bytes)?;
            tls.flush()?;
            return Ok(());
        }
    };
    let mut at = offset as i64;
    let end = (offset + len) as i64;
    while at < end {
        let count = ((end - at) as usize).min(1 << 30);
        match nix::sys::sendfile::sendfile64(&*socket, fd, Some(&mut at), count) {
            Ok(0) => return Err(ShoalError::io("sendfile", "the region ended early")),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS) => {
                // SAFETY: inside the mapped region (the caller's contract).
                let rest = unsafe {
                    std::slice::from_raw_parts(base.add(at as usize), (end - at) as usize)
                };
                socket.write_all(rest)?;
                at = end;
            }
            Err(errno) => return Err(std::io::Error::from(errno).into()),
        }
    }
    Ok(())
}

/// The node at the other end of a connection, named in its errors.
struct Far<A> {
    node: u32,
    addr: A,
}

impl<A: ToSocketAddrs + std::fmt::Display> Far<A> {
    fn unavailable(&self, what: &str, err: &dyn std::fmt::Display) -> ShoalError {
        ShoalError::new(
            ErrorKind::NodeUnavailable,
            format!(
                "node {} data channel {}: {what}: {err}",
                self.node, self.addr
            ),
        )
    }

    fn io(&self, what: &str, e: std::io::Error) -> ShoalError {
        if let Some(tls) = tls_error(&e) {
            // The owner refused our certificate (an alert), or we its bytes.
            return crate::tls::data::refused(self.node, tls);
        }
        match e.kind() {
            IoKind::WouldBlock | IoKind::TimedOut => self.unavailable(what, &"stalled"),
            _ => self.unavailable(what, &e),
        }
    }

    /// Connects (with TLS: and proves both ends) and sends `request`.
    /// Unreachable, or stalled for `timeout`: `NodeUnavailable`; a TLS
    /// refusal either way: `PermissionDenied`.
    fn ask(&self, request: &Request, timeout: Duration, tls: Option<&TlsMaterial>) -> Result<Wire> {
        let socket = connect(&self.addr, timeout).map_err(|e| self.unavailable("connect", &e))?;
        options(&socket, timeout).map_err(|e| self.unavailable("socket options", &e))?;
        let mut socket = match tls {
            None => Wire::Plain(socket),
            Some(tls) => Wire::Tls(Box::new(crate::tls::data::connect(tls, self.node, socket)?)),
        };
        socket
            .write_all(&request.encode())
            .and_then(|()| socket.flush())
            .map_err(|e| self.io("send request", e))?;
        Ok(socket)
    }

    /// Reads a status byte: `Ok` for 0, else the error that follows, its
    /// kind kept.
    fn status(&self, socket: &mut Wire, what: &str) -> Result<()> {
        let mut status = [0u8; 1];
        socket
            .read_exact(&mut status)
            .map_err(|e| self.io(what, e))?;
        if status[0] == 0 {
            return Ok(());
        }
        let mut len = [0u8; 2];
        socket
            .read_exact(&mut len)
            .map_err(|e| self.io("read error", e))?;
        let mut message = vec![0u8; u16::from_le_bytes(len) as usize];
        socket
            .read_exact(&mut message)
            .map_err(|e| self.io("read error", e))?;
        let kind = ErrorKind::from_code(status[0] as u16).unwrap_or(ErrorKind::Protocol);
        Err(ShoalError::new(
            kind,
            format!("node {}: {}", self.node, String::from_utf8_lossy(&message)),
        ))
    }
}

/// Blocking I/O with `timeout` on each call, and the large receive buffer.
fn options(socket: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    socket.set_nonblocking(false)?;
    socket.set_nodelay(true)?;
    socket.set_read_timeout(Some(timeout))?;
    socket.set_write_timeout(Some(timeout))?;
    nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::RcvBuf, &RECEIVE_BUFFER)
        .map_err(std::io::Error::from)
}

/// Reads exactly `dst.len()` bytes into `dst` (the kernel's one copy; over
/// TLS each record is then opened where it landed).
fn receive(socket: &mut Wire, dst: &mut [u8]) -> std::result::Result<(), (usize, std::io::Error)> {
    if let Wire::Tls(records) = socket {
        return records.receive_exact(dst);
    }
    let mut got = 0;
    while got < dst.len() {
        match socket.read(&mut dst[got..]) {
            Ok(0) => return Err((got, IoKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == IoKind::Interrupted => {}
            Err(e) => return Err((got, e)),
        }
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
    tls: Option<&TlsMaterial>,
) -> Result<()> {
    debug_assert_eq!(dst.len() as u64, request.len);
    let far = Far { node: owner, addr };
    let mut socket = far.ask(request, timeout, tls)?;
    far.status(&mut socket, "read reply")?;
    receive(&mut socket, dst).map_err(|(got, e)| match e.kind() {
        IoKind::UnexpectedEof => far.unavailable(
            "receive",
            &format!("closed after {got} of {} bytes", dst.len()),
        ),
        _ => far.io("receive", e),
    })?;
    // Best effort: the bytes are all here; a lost ack only delays the owner's unpin.
    let _ = socket.write_all(&[ACK]).and_then(|()| socket.flush());
    Ok(())
}

/// Pusher side (blocking): asks `addr` (node `node`'s data channel) to take
/// `request.len` bytes into its object `request.id` at `request.offset`,
/// and sends them from `[offset, offset + request.len)` of this node's
/// region behind `fd` (mapped at `base`). Returns once the node answered
/// that every byte is in its object. A node that cannot be reached, or
/// stalls for `timeout`, is `NodeUnavailable`; an error the node sends back
/// (a refused request) keeps its kind.
///
/// # Safety
/// `base` maps the region behind `fd`, and the range lies inside it.
#[allow(clippy::too_many_arguments)] // one range, where, how long, how
pub unsafe fn push_range(
    node: u32,
    addr: impl ToSocketAddrs + std::fmt::Display,
    request: &Request,
    fd: BorrowedFd<'_>,
    base: *const u8,
    offset: u64,
    timeout: Duration,
    tls: Option<&TlsMaterial>,
) -> Result<()> {
    debug_assert_eq!(request.kind, Kind::Push);
    let far = Far { node, addr };
    let mut socket = far.ask(request, timeout, tls)?;
    far.status(&mut socket, "read reply")?;
    // SAFETY: the caller's contract.
    unsafe { send_file(&mut socket, fd, base, offset, request.len) }
        .map_err(|e| far.unavailable("send", &e))?;
    far.status(&mut socket, "read answer")
}

/// Receiving side (blocking): tells the pusher to send, then reads its
/// `dst.len()` bytes straight into `dst` (the kernel's one copy). Answer
/// with [`answer_push`] afterwards. A pusher that closes early or stalls for
/// `timeout` is an error (nothing left to answer).
pub fn receive_range(socket: &mut Wire, dst: &mut [u8], timeout: Duration) -> Result<()> {
    options(socket.socket(), timeout)?;
    socket.write_all(&[0]).and_then(|()| socket.flush())?;
    receive(socket, dst).map_err(|(got, e)| match tls_error(&e) {
        // Bytes changed in flight, or not a record of this session.
        Some(tls) => ShoalError::new(
            ErrorKind::PermissionDenied,
            format!("a push's data channel: TLS refused after {got} bytes: {tls}"),
        ),
        None => ShoalError::io(&format!("receive a push ({got} of {} bytes)", dst.len()), e),
    })
}

/// Receiving side (blocking): the push's final answer, `0u8` or a typed
/// error; best effort (a pusher that is gone learns nothing anyway).
pub fn answer_push(socket: &mut Wire, outcome: &Result<()>) {
    let _ = match outcome {
        Ok(()) => socket.write_all(&[0]),
        Err(err) => socket.write_all(&error_frame(err)),
    }
    .and_then(|()| socket.flush());
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
            kind: Kind::Pull,
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

        let push = Request {
            kind: Kind::Push,
            ..r.clone()
        };
        let encoded = push.encode();
        assert_eq!(&encoded[..4], PUSH_MAGIC);
        assert_eq!(Request::read(&mut encoded.as_slice()).await.unwrap(), push);

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
                    Wire::Plain(socket),
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
        fetch_range(
            1,
            addr,
            &request(len),
            &mut dst,
            Duration::from_secs(5),
            None,
        )
        .unwrap();
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
        let err = fetch_range(
            1,
            addr,
            &request(10),
            &mut dst,
            Duration::from_secs(5),
            None,
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
        assert!(err.message().contains("no such object"), "{err}");
        server.join().unwrap();

        // Nobody listens there any more.
        let err = fetch_range(
            1,
            addr,
            &request(10),
            &mut dst,
            Duration::from_secs(1),
            None,
        )
        .unwrap_err();
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
        let err = fetch_range(
            1,
            addr,
            &request(10),
            &mut dst,
            Duration::from_millis(300),
            None,
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodeUnavailable, "{err}");
        assert!(started.elapsed() < Duration::from_millis(700));
        server.join().unwrap();
    }

    /// A receiving node on a thread: `refuse` answers the request with that
    /// error; otherwise the bytes land in a buffer of `len`, returned.
    fn receiver(
        len: usize,
        refuse: Option<ShoalError>,
    ) -> (SocketAddr, std::thread::JoinHandle<Result<Vec<u8>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = std::thread::spawn(move || {
            let (socket, _) = listener.accept().unwrap();
            socket.set_nonblocking(true).unwrap();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let (request, socket) = runtime.block_on(async {
                let mut socket = tokio::net::TcpStream::from_std(socket).unwrap();
                let request = Request::read(&mut socket).await.unwrap();
                if let Some(err) = &refuse {
                    send_error(&mut socket, err).await;
                }
                (request, socket.into_std().unwrap())
            });
            if let Some(err) = refuse {
                return Err(err);
            }
            assert_eq!((request.kind, request.len), (Kind::Push, len as u64));
            let mut socket = Wire::Plain(socket);
            let mut dst = vec![0u8; len];
            let outcome = receive_range(&mut socket, &mut dst, Duration::from_secs(5));
            answer_push(&mut socket, &outcome);
            outcome.map(|()| dst)
        });
        (addr, handle)
    }

    fn push_request(len: u64) -> Request {
        Request {
            kind: Kind::Push,
            ..request(len)
        }
    }

    #[test]
    fn a_push_lands_whole_and_is_answered_after_the_last_byte() {
        let data: Vec<u8> = (0..(3 << 20) as u32)
            .map(|i| (i * 17 % 253) as u8)
            .collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&data).unwrap();
        let (offset, len) = (8192u64, (2 << 20) + 5);
        let (addr, node) = receiver(len as usize, None);
        // SAFETY: `data` is a copy of the file, alive for the call.
        unsafe {
            push_range(
                1,
                addr,
                &push_request(len),
                file.as_fd(),
                data.as_ptr(),
                offset,
                Duration::from_secs(5),
                None,
            )
        }
        .unwrap();
        let got = node.join().unwrap().unwrap();
        assert_eq!(got, &data[offset as usize..(offset + len) as usize]);
    }

    #[test]
    fn a_refused_push_keeps_its_kind_and_an_absent_node_is_unavailable() {
        let file = tempfile::tempfile().unwrap();
        let refusal = ShoalError::new(ErrorKind::NotOwner, "not your object");
        let (addr, node) = receiver(10, Some(refusal));
        let push = |addr| {
            // SAFETY: a zero-length range of an empty file is never read:
            // the node refuses (or is absent) before any byte is sent.
            unsafe {
                push_range(
                    1,
                    addr,
                    &push_request(10),
                    file.as_fd(),
                    std::ptr::null(),
                    0,
                    Duration::from_secs(1),
                    None,
                )
            }
        };
        let err = push(addr).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotOwner, "{err}");
        assert!(err.message().contains("not your object"), "{err}");
        node.join().unwrap().unwrap_err();
        let err = push(addr).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NodeUnavailable, "{err}");
    }

    #[test]
    fn a_pusher_that_stops_sending_is_an_error_within_the_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let pusher = std::thread::spawn(move || {
            let mut socket = TcpStream::connect(addr).unwrap();
            socket.write_all(&[1, 2, 3]).unwrap(); // 3 of 10 bytes, then silence
            std::thread::sleep(Duration::from_millis(800));
        });
        let (socket, _) = listener.accept().unwrap();
        let mut socket = Wire::Plain(socket);
        let started = std::time::Instant::now();
        let mut dst = vec![0u8; 10];
        let err = receive_range(&mut socket, &mut dst, Duration::from_millis(300)).unwrap_err();
        assert!(err.message().contains("3 of 10"), "{err}");
        assert!(started.elapsed() < Duration::from_millis(700));
        pusher.join().unwrap();
    }
}
