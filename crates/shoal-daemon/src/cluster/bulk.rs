//! This node's end of the bulk data channel (`shoal_cluster::bulk`): serving
//! ranges of its objects to pulling peers, pulling ranges from theirs, and
//! receiving pushes into objects peers allocated here (remote allocation
//! over the network; the pushing end is `push`).
//!
//! The request is read and checked on the store thread (the caller's
//! identity, its reference, the range); the bytes then move on a blocking
//! worker thread so a 100 MB transfer never stalls the store. The object is
//! pinned under `principals::SEND` for the whole transfer, until the puller
//! acknowledges the last byte: sendfile lends the region's pages to the
//! socket, so they must not be reused while bytes may still be read from
//! them, even if the puller's own reference is reclaimed (its lease ran
//! out) meanwhile.
//!
//! A push is checked as a pull is (the caller's credential, the range), and
//! takes bytes only for an object the caller allocated here and has not
//! sealed. The object is held under `principals::RECEIVE` for the transfer
//! (`Store::hold_unsealed`): an abort meanwhile (the caller's, or its
//! restart or fencing) hides it at once and frees its memory only after the
//! last byte was written.

use std::rc::Rc;

use shoal_cluster::auth::{PeerIdentity, Refusal};
use shoal_cluster::bulk::{
    answer_push, fetch_range, receive_range, send_error, send_range, Kind, Request, Wire,
};
use shoal_cluster::tls::data::{Blocking, Io, Session};
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;
use tokio::net::{TcpListener, TcpStream};

use crate::accept::AcceptBackoff;
use crate::cluster::peers::{join_all, RPC_TIMEOUT};
use crate::cluster::state::Cluster;
use crate::principals;

/// A data-channel connection as accepted, while its request is read and
/// checked on the store thread.
enum Accepted {
    Plain(TcpStream),
    /// Over TLS, from the node its certificate proved.
    Tls(Box<Session>, u32),
}

impl Accepted {
    fn io(&mut self) -> &mut dyn Io {
        match self {
            Self::Plain(stream) => stream,
            Self::Tls(session, _) => session.io(),
        }
    }

    /// The node a TLS certificate proved; `None` in cleartext.
    fn proven(&self) -> Option<u32> {
        match self {
            Self::Plain(_) => None,
            Self::Tls(_, node) => Some(*node),
        }
    }

    /// The connection for a blocking worker thread.
    fn into_wire(self) -> std::io::Result<Wire> {
        match self {
            Self::Plain(stream) => Ok(Wire::Plain(stream.into_std()?)),
            Self::Tls(session, _) => Ok(match session.into_blocking()? {
                Blocking::User(records) => Wire::Tls(records),
                Blocking::Kernel(socket) => Wire::Kernel(socket),
            }),
        }
    }
}

impl Cluster {
    /// Binds this node's data channel (a busy port fails the start) and
    /// serves it under the supervisor.
    pub async fn start_data_channel(self: &Rc<Self>, identity: PeerIdentity) -> Result<()> {
        let address = self.topology().node(self.me)?.data_listen_address();
        let listener = TcpListener::bind(address.to_string())
            .await
            .map_err(|e| ShoalError::io(&format!("bind data channel {address}"), e))?;
        let cluster = self.clone();
        self.supervisor.spawn_local("data channel", async move {
            let mut backoff = AcceptBackoff::new("data channel");
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        backoff.succeeded();
                        let (served, identity) = (cluster.clone(), identity.clone());
                        cluster
                            .supervisor
                            .spawn_local("data transfer", served.serve_range(stream, identity));
                    }
                    Err(err) => backoff.failed(err).await,
                }
            }
        });
        tracing::debug!(%address, "data channel listening");
        Ok(())
    }

    /// Serves one request: (with TLS: proves both ends,) checks it, pins
    /// the object, sends, unpins.
    async fn serve_range(self: Rc<Self>, stream: TcpStream, identity: PeerIdentity) {
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "?".to_owned(), |a| a.to_string());
        let mut stream = match &self.tls {
            None => Accepted::Plain(stream),
            Some(tls) => match shoal_cluster::tls::data::accept(tls, stream).await {
                Ok((stream, node)) => Accepted::Tls(Box::new(stream), node),
                Err(why) => {
                    tracing::warn!(%peer, "data channel connection refused: {why}");
                    return;
                }
            },
        };
        let request = match tokio::time::timeout(RPC_TIMEOUT, Request::read(&mut stream.io())).await
        {
            Ok(Ok(request)) => request,
            Ok(Err(err)) => {
                tracing::warn!(%peer, %err, "data channel request refused");
                send_error(&mut stream.io(), &err).await;
                return;
            }
            Err(_) => {
                tracing::warn!(%peer, "data channel request timed out");
                return;
            }
        };
        if let Some(proven) = stream.proven().filter(|&node| node != request.from) {
            let err = ShoalError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "a request claiming node {} over node {proven}'s TLS connection",
                    request.from
                ),
            );
            tracing::warn!(%peer, %err, "data channel request refused");
            send_error(&mut stream.io(), &err).await;
            return;
        }
        if request.kind == Kind::Push {
            return self.receive_push(stream, &identity, request, &peer).await;
        }
        let pinned = match self.pin(&identity, &request) {
            Ok(location) => location,
            Err(err) => {
                tracing::warn!(%peer, from = request.from, %err, "data channel request refused");
                send_error(&mut stream.io(), &err).await;
                return;
            }
        };
        let id = request.id;
        let sent = match stream.into_wire() {
            Ok(socket) => {
                let metrics = self.node.metrics().clone();
                metrics
                    .peer_calls
                    .transfer_sent(socket.encryption().as_str());
                let region = self.node.region().clone();
                let start = pinned.offset + request.offset;
                let len = request.len;
                tokio::task::spawn_blocking(move || {
                    // SAFETY: [start, start + len) is inside the object (checked
                    // by `pin`), which SEND keeps allocated and, sealed,
                    // unmodified until the unpin below, after this returns.
                    unsafe {
                        send_range(socket, region.fd(), region.base(), start, len, RPC_TIMEOUT)
                    }
                })
                .await
                .unwrap_or_else(|e| Err(ShoalError::io("data channel worker", e)))
            }
            Err(err) => Err(err.into()),
        };
        if let Err(err) = sent {
            tracing::debug!(%peer, from = request.from, %id, %err, "data channel send failed");
        }
        // The pin may have been the last reference to a deleted object.
        self.node.mutate(|store| {
            if let Err(err) = store.release(principals::SEND, &id) {
                tracing::error!(%id, %err, "data channel pin lost");
            }
        });
    }

    /// The other member a request comes from, if its credential is the one
    /// that member must present (the same check as the peer RPC's).
    fn verified_peer(&self, identity: &PeerIdentity, request: &Request) -> Result<u32> {
        match identity.verify(Some(&request.token), Some(request.from)) {
            Ok(from) if from != self.me => Ok(from),
            Ok(from) | Err(Refusal::NotAMember(from)) => Err(ShoalError::invalid(format!(
                "node {from} is not a peer of node {}",
                self.me
            ))),
            Err(refusal) => Err(ShoalError::invalid(refusal.to_string())),
        }
    }

    /// Checks a request and pins the object it names; `Err` pins nothing.
    fn pin(&self, identity: &PeerIdentity, request: &Request) -> Result<ObjectLocation> {
        let from = self.verified_peer(identity, request)?;
        let id = request.id;
        self.node.mutate(|store| {
            if !store.holds(principals::peer(from), &id) {
                return Err(ShoalError::new(
                    ErrorKind::ObjectNotFound,
                    format!("node {from} holds no reference to {id}"),
                ));
            }
            let location = store.location(&id).ok_or_else(|| {
                ShoalError::new(ErrorKind::ObjectNotFound, format!("{id} was deleted"))
            })?;
            let inside = request
                .offset
                .checked_add(request.len)
                .is_some_and(|end| end <= location.size());
            if !inside {
                return Err(ShoalError::invalid(format!(
                    "range {}+{} outside {id} ({} bytes)",
                    request.offset,
                    request.len,
                    location.size()
                )));
            }
            // Visible (just located), so this takes the pin. A copy, not a
            // read: the peer's Acquire was the read.
            store.get_for_copy(principals::SEND, &id);
            Ok(location)
        })
    }

    /// Receives one pushed range: checks it, holds the object, reads the
    /// bytes into it, answers, lets go.
    async fn receive_push(
        self: Rc<Self>,
        mut stream: Accepted,
        identity: &PeerIdentity,
        request: Request,
        peer: &str,
    ) {
        let held = self
            .verified_peer(identity, &request)
            .and_then(|from| self.hold_for_push(from, &request));
        let location = match held {
            Ok(location) => location,
            Err(err) => {
                tracing::warn!(%peer, from = request.from, %err, "data channel request refused");
                send_error(&mut stream.io(), &err).await;
                return;
            }
        };
        let id = request.id;
        let received = match stream.into_wire() {
            Ok(mut socket) => {
                let region = self.node.region().clone();
                let start = location.offset + request.offset;
                let len = request.len as usize;
                tokio::task::spawn_blocking(move || {
                    // SAFETY: [start, start + len) lies inside the object
                    // (checked by `hold_for_push`), which RECEIVE holds: its
                    // memory stays allocated until the release below, after
                    // this returns, whatever its creator does meanwhile.
                    // Unsealed, it is written by pushes of its creator only
                    // (a creator pushing overlapping ranges garbles its own
                    // object, nothing else).
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(region.base().add(start as usize), len)
                    };
                    let outcome = receive_range(&mut socket, dst, RPC_TIMEOUT);
                    answer_push(&mut socket, &outcome);
                    outcome
                })
                .await
                .unwrap_or_else(|e| Err(ShoalError::io("data channel worker", e)))
            }
            Err(err) => Err(err.into()),
        };
        if let Err(err) = received {
            tracing::debug!(%peer, from = request.from, %id, %err, "data channel receive failed");
        }
        // The hold may be the last of an object aborted meanwhile: freed now.
        self.node.mutate(|store| {
            if let Err(err) = store.release(principals::RECEIVE, &id) {
                tracing::error!(%id, %err, "data channel hold lost");
            }
        });
    }

    /// Holds the object a push writes; `Err` holds nothing. Only an object
    /// `from` allocated here and has not sealed takes pushed bytes.
    fn hold_for_push(&self, from: u32, request: &Request) -> Result<ObjectLocation> {
        let id = request.id;
        self.node.mutate(|store| {
            let location = store
                .hold_unsealed(principals::RECEIVE, principals::peer(from), &id)
                .map_err(|err| {
                    ShoalError::new(
                        err.kind(),
                        format!("node {from} is not writing {id} here: {}", err.message()),
                    )
                })?;
            let inside = request
                .offset
                .checked_add(request.len)
                .is_some_and(|end| end <= location.size());
            if !inside {
                let _ = store.release(principals::RECEIVE, &id);
                return Err(ShoalError::invalid(format!(
                    "range {}+{} outside {id} ({} bytes)",
                    request.offset,
                    request.len,
                    location.size()
                )));
            }
            Ok(location)
        })
    }

    /// Pulls `len` bytes of an object this node holds a reference to on
    /// `owner` into `dst`, in `parts` ranges over as many connections.
    pub async fn fetch(
        &self,
        owner: u32,
        id: ObjectId,
        len: u64,
        dst: *mut u8,
        parts: u64,
    ) -> Result<()> {
        self.peers.reachable(owner)?; // a peer known to be down fails at once
                                      // Resolved by each range's connection: a host name is looked up again.
        let address = self.topology().node(owner)?.data.clone();
        let token = self.identity.token_for(owner)?;
        let parts = parts.clamp(1, 8).min(len.max(1));
        let step = len.div_ceil(parts);
        let dst = dst as usize;
        let ranges = (0..parts)
            .map(|p| (p * step, ((p + 1) * step).min(len)))
            .filter(|(start, end)| start < end);
        let calls = ranges.map(|(start, end)| {
            let request = Request {
                kind: Kind::Pull,
                from: self.me,
                token: token.to_vec(),
                id,
                offset: start,
                len: end - start,
            };
            let address = address.clone();
            let tls = self.tls.clone();
            let worker = tokio::task::spawn_blocking(move || {
                // SAFETY: `dst` is the start of a local object of `len` bytes
                // this node just created and nobody else writes; each range
                // is a disjoint part of it.
                let part = unsafe {
                    std::slice::from_raw_parts_mut(
                        (dst as *mut u8).add(start as usize),
                        (end - start) as usize,
                    )
                };
                fetch_range(owner, &address, &request, part, RPC_TIMEOUT, tls.as_deref())
            });
            async move {
                worker
                    .await
                    .unwrap_or_else(|e| Err(ShoalError::io("data channel worker", e)))
            }
        });
        join_all(calls).await.into_iter().collect()
    }
}
