//! The bulk data channel over TLS: its transfers run on blocking worker
//! threads (`bulk`), and both ends keep the session's records themselves
//! there (`records`): a received range is decrypted in place where it
//! belongs, a sent one sealed into one reused buffer. The dialing end (a
//! puller, or a pusher) makes its handshake on its worker. The answering
//! end is accepted on the async side first, where the request is read and
//! checked on the store thread, then its keys go with the socket to a
//! worker.
//!
//! User-space TLS gives up sendfile's zero-copy send: the sender encrypts
//! from the region's mapping into its buffer (one copy, the cipher's).
//! Where the kernel takes TLS sessions (`kernel`), the answering end hands
//! its session to the socket after the handshake and sends with sendfile.

use std::net::TcpStream;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsAcceptor;

pub use super::records::tls_error;
use super::records::{self, HandshakeError, Records};
use super::{handshake, kernel, proven, TlsMaterial};

/// The owner's end while the request is read and checked.
pub type AcceptedStream = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// Both halves of an async connection: what a request is read from and
/// an error sent on, whatever carries it.
pub trait Io: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Io for T {}

/// An answering end's session, before the transfer's worker thread.
pub enum Session {
    /// rustls while the request is read; then `records` (`into_blocking`).
    User(Box<AcceptedStream>),
    /// The kernel encrypts (kTLS).
    Kernel(Box<ktls::KtlsStream<tokio::net::TcpStream>>),
}

/// A session on a worker thread (blocking).
pub enum Blocking {
    /// Its records sealed and opened in this process.
    User(Box<Records>),
    /// A kTLS socket: written, read and sendfile'd as a plain one.
    Kernel(TcpStream),
}

/// A TLS failure as shoal reports it: the peer, or this node, refused the
/// other's certificate or protocol.
pub fn refused(node: u32, err: impl std::fmt::Display) -> ShoalError {
    ShoalError::new(
        ErrorKind::PermissionDenied,
        format!("node {node} data channel: TLS refused: {err}"),
    )
}

/// Dialing end (blocking, within the socket's timeouts): the handshake with
/// node `to` on a connected socket; only `to`'s certificate is admitted.
pub fn connect(tls: &TlsMaterial, to: u32, socket: TcpStream) -> Result<Records> {
    records::connect(tls.configs().client, tls.server_name(to)?, socket).map_err(|err| match err {
        HandshakeError::Tls(err) => refused(to, err),
        HandshakeError::Io(err) => ShoalError::new(
            ErrorKind::NodeUnavailable,
            format!("node {to} data channel: TLS handshake: {err}"),
        ),
    })
}

/// Owner's end: the handshake of an accepted connection (its session
/// handed to the kernel where it takes it) and the node its certificate
/// proved. A failure is returned for the log; nothing is sent.
pub async fn accept(
    tls: &TlsMaterial,
    socket: tokio::net::TcpStream,
) -> std::result::Result<(Session, u32), String> {
    let acceptor = TlsAcceptor::from(tls.configs().server);
    if !kernel::available() {
        let stream = handshake(acceptor.accept(socket)).await?;
        let node = proven(tls, stream.get_ref().1)?;
        return Ok((Session::User(Box::new(stream)), node));
    }
    // Corked: rustls reads no record past the handshake, so none is lost
    // when the session moves to the socket.
    let stream = handshake(acceptor.accept(ktls::CorkStream::new(socket))).await?;
    let node = proven(tls, stream.get_ref().1)?;
    let stream = ktls::config_ktls_server(stream)
        .await
        .map_err(|err| format!("kernel TLS: {err}"))?;
    Ok((Session::Kernel(Box::new(stream)), node))
}

impl Session {
    /// The session while the request is read and checked.
    pub fn io(&mut self) -> &mut dyn Io {
        match self {
            Self::User(stream) => stream.as_mut(),
            Self::Kernel(stream) => stream.as_mut(),
        }
    }

    /// The session on a blocking socket, for a worker thread.
    pub fn into_blocking(self) -> std::io::Result<Blocking> {
        match self {
            Self::User(stream) => {
                let (socket, connection) = stream.into_inner();
                let socket = socket.into_std()?;
                socket.set_nonblocking(false)?;
                let records = records::answering(connection, socket)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                Ok(Blocking::User(Box::new(records)))
            }
            Self::Kernel(stream) => match stream.into_raw() {
                // The request was read whole, and the puller sends nothing
                // more until the bytes: anything left would be lost.
                (Some(left), _) if !left.is_empty() => Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "bytes after the request before the transfer",
                )),
                (_, socket) => {
                    let socket = socket.into_std()?;
                    socket.set_nonblocking(false)?;
                    Ok(Blocking::Kernel(socket))
                }
            },
        }
    }
}
