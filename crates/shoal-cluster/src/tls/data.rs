//! The bulk data channel over TLS: its transfers run on blocking worker
//! threads (`bulk`), so both ends end up on rustls' blocking streams. The
//! owner's end is accepted on the async side first, where the request is
//! read and checked on the store thread, then handed to a worker.
//!
//! User-space TLS gives up sendfile's zero-copy send: rustls encrypts from
//! the region's mapping into its own buffer (one copy, the cipher's).

use std::net::TcpStream;

use rustls::{ClientConnection, ServerConnection, StreamOwned};
use shoal_core::error::{ErrorKind, Result, ShoalError};
use tokio_rustls::TlsAcceptor;

use super::{node_of, TlsMaterial, HANDSHAKE_TIMEOUT};

/// The puller's or pusher's end.
pub type ClientStream = StreamOwned<ClientConnection, TcpStream>;
/// The owner's (or push receiver's) end.
pub type ServerStream = StreamOwned<ServerConnection, TcpStream>;
/// The owner's end while the request is read and checked.
pub type AcceptedStream = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// A TLS failure as shoal reports it: the peer, or this node, refused the
/// other's certificate or protocol.
pub fn refused(node: u32, err: impl std::fmt::Display) -> ShoalError {
    ShoalError::new(
        ErrorKind::PermissionDenied,
        format!("node {node} data channel: TLS refused: {err}"),
    )
}

/// The rustls error inside an I/O error, if that is what it is.
pub fn tls_error(err: &std::io::Error) -> Option<&rustls::Error> {
    err.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Client end (blocking, within the socket's timeouts): the handshake with
/// node `to` on a connected socket; only `to`'s certificate is admitted.
pub fn connect(tls: &TlsMaterial, to: u32, socket: TcpStream) -> Result<ClientStream> {
    let connection = ClientConnection::new(tls.configs().client, tls.server_name(to)?)
        .map_err(|e| refused(to, e))?;
    let mut stream = StreamOwned::new(connection, socket);
    while stream.conn.is_handshaking() {
        if let Err(err) = stream.conn.complete_io(&mut stream.sock) {
            return Err(match tls_error(&err) {
                Some(tls) => refused(to, tls),
                None => ShoalError::new(
                    ErrorKind::NodeUnavailable,
                    format!("node {to} data channel: TLS handshake: {err}"),
                ),
            });
        }
    }
    Ok(stream)
}

/// Owner's end: the handshake of an accepted connection and the node its
/// certificate proved. A failure is returned for the log; nothing is sent.
pub async fn accept(
    tls: &TlsMaterial,
    socket: tokio::net::TcpStream,
) -> std::result::Result<(AcceptedStream, u32), String> {
    let acceptor = TlsAcceptor::from(tls.configs().server);
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => return Err(format!("TLS handshake failed: {err}")),
        Err(_) => return Err(format!("no TLS handshake within {HANDSHAKE_TIMEOUT:?}")),
    };
    let node = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|cert| node_of(tls.identity(), cert))
        .ok_or("a certificate of no known node")?;
    Ok((stream, node))
}

/// The accepted stream as a blocking one, for a worker thread.
pub fn into_blocking(stream: AcceptedStream) -> std::io::Result<ServerStream> {
    let (socket, connection) = stream.into_inner();
    let socket = socket.into_std()?;
    socket.set_nonblocking(false)?;
    Ok(StreamOwned::new(connection, socket))
}
