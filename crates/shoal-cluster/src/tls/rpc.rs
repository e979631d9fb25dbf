//! The peer RPC over TLS: the connections tonic's server is fed (each
//! handshake on a task of its own, so a slow or hostile peer never holds
//! up the accept loop), and the connector tonic's channels dial with.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::transport::server::Connected;

use super::{handshake, proven, TlsMaterial, HANDSHAKE_TIMEOUT};
use crate::auth::TlsPeer;

/// Accepted connections waiting for the server at most.
const BACKLOG: usize = 64;

/// A peer's TLS connection, with the node its certificate proved.
pub struct PeerConnection {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    peer: TlsPeer,
}

impl Connected for PeerConnection {
    type ConnectInfo = TlsPeer;

    fn connect_info(&self) -> TlsPeer {
        self.peer
    }
}

impl AsyncRead for PeerConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for PeerConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Accepts on `listener` and yields the connections whose handshake
/// admitted a known node; the others are logged and dropped. Stops when
/// the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<TlsMaterial>,
) -> tonic::codegen::tokio_stream::wrappers::ReceiverStream<std::io::Result<PeerConnection>> {
    let (admitted, stream) = mpsc::channel(BACKLOG);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = admitted.closed() => return,
            };
            match accepted {
                Ok((tcp, remote)) => {
                    let (admitted, tls) = (admitted.clone(), tls.clone());
                    tokio::spawn(async move {
                        if let Some(connection) = accept(tcp, remote, &tls).await {
                            let _ = admitted.send(Ok(connection)).await;
                        }
                    });
                }
                Err(err) => {
                    // Out of descriptors, most likely: wait instead of spinning.
                    tracing::warn!(%err, "peer RPC accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    });
    tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(stream)
}

/// The handshake of one connection; `None` (logged) if it failed.
async fn accept(tcp: TcpStream, remote: SocketAddr, tls: &TlsMaterial) -> Option<PeerConnection> {
    let _ = tcp.set_nodelay(true);
    let acceptor = TlsAcceptor::from(tls.configs().server);
    let admitted = handshake(acceptor.accept(tcp))
        .await
        .and_then(|stream| Ok((proven(tls, stream.get_ref().1)?, stream)));
    let (node, stream) = match admitted {
        Ok(admitted) => admitted,
        Err(why) => {
            tracing::warn!(%remote, "peer RPC connection refused: {why}");
            return None;
        }
    };
    Some(PeerConnection {
        stream,
        peer: TlsPeer {
            node,
            remote: Some(remote),
        },
    })
}

/// What tonic's channel to node `to` dials with: TCP to the address in the
/// URI (a host name resolved on every connection), then a handshake that
/// admits only `to`'s certificate.
pub fn connector(
    tls: Arc<TlsMaterial>,
    to: u32,
) -> impl tower::Service<
    tonic::codegen::http::Uri,
    Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |uri: tonic::codegen::http::Uri| {
        let tls = tls.clone();
        async move {
            let invalid =
                |what: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
            let authority = uri
                .authority()
                .ok_or_else(|| invalid(format!("no address in {uri}")))?
                .as_str()
                .to_owned();
            let name = tls.server_name(to).map_err(|e| invalid(e.to_string()))?;
            let tcp = TcpStream::connect(authority).await?;
            tcp.set_nodelay(true)?;
            let connector = TlsConnector::from(tls.configs().client);
            let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, tcp))
                .await
                .map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake")
                })??;
            Ok(TokioIo::new(stream))
        }
    })
}

/// A channel to node `to` through `endpoint`, connected on first use: over
/// TLS with `tls`, cleartext without.
pub fn channel(
    endpoint: tonic::transport::Endpoint,
    tls: Option<&Arc<TlsMaterial>>,
    to: u32,
) -> tonic::transport::Channel {
    match tls {
        Some(tls) => endpoint.connect_with_connector_lazy(connector(tls.clone(), to)),
        None => endpoint.connect_lazy(),
    }
}
