//! One client connection: decode frames, run requests against the store,
//! write replies in order.
//!
//! Replies to all requests that arrived in one read are written with one
//! write, so a client that pipelines pays one wake-up for the lot.

use std::future::pending;
use std::os::fd::{AsFd, AsRawFd};
use std::rc::Rc;
use std::time::Duration;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::fd_passing::send_with_fd;
use shoal_core::protocol::{
    decode_request, CreateSpec, Located, Notification, PeerRegion, Reply, Request, PROTOCOL_VERSION,
};
use shoal_core::store::ObjectLocation;
use shoal_core::ObjectId;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use shoal_cluster::Access;
use shoal_core::coherence::CoherenceMode;

use crate::cluster::{lending, ClusterRef, Remote, PEER_CLIENT_BASE};
use crate::server::Shared;

const READ_CHUNK: usize = 64 * 1024;
/// The store client that owns network-mode copies while they are pulled.
pub(crate) const COPY_CLIENT: u32 = PEER_CLIENT_BASE - 1;
/// Objects at least this large are pulled in parallel ranges.
const PARALLEL_PULL: u64 = 8 << 20;

/// How often a get waiting for objects on other nodes asks again.
const REMOTE_POLL_MIN: Duration = Duration::from_millis(2);
const REMOTE_POLL_MAX: Duration = Duration::from_millis(50);

pub(crate) async fn serve(shared: Rc<Shared>, stream: UnixStream) {
    let client = shared.new_client();
    let mut connection = Connection {
        shared: shared.clone(),
        stream,
        client,
        welcomed: false,
    };
    match connection.run().await {
        Ok(()) => tracing::debug!(client, "client disconnected"),
        Err(err) if err.kind() == ErrorKind::Disconnected => {
            tracing::debug!(client, %err, "client gone")
        }
        Err(err) => tracing::warn!(client, %err, "dropping client"),
    }
    shared.client_gone(client);
}

struct Connection {
    shared: Rc<Shared>,
    stream: UnixStream,
    client: u32,
    welcomed: bool,
}

/// What handling a request asks the connection loop to do next.
enum Next {
    Continue,
    /// Registered before its `Ok` was queued, so no seal after the reply is missed.
    Subscribe(mpsc::Receiver<Notification>),
}

impl Connection {
    async fn run(&mut self) -> Result<()> {
        let mut input: Vec<u8> = Vec::with_capacity(READ_CHUNK);
        let mut output: Vec<u8> = Vec::with_capacity(READ_CHUNK);
        loop {
            let mut consumed = 0;
            let mut next = Next::Continue;
            loop {
                let (request, used) = match decode_request(&input[consumed..]) {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(err) => {
                        // Answer what came before the bad frame, then hang up.
                        let _ = self.stream.write_all(&output).await;
                        return Err(err);
                    }
                };
                consumed += used;
                next = match self.handle(request, &mut output).await {
                    Ok(next) => next,
                    Err(err) => {
                        // A frame that decodes but breaks the connection rules
                        // (a request before Hello, a second Hello): answer the
                        // requests before it, then hang up.
                        if err.kind() == ErrorKind::Protocol {
                            let _ = self.stream.write_all(&output).await;
                        }
                        return Err(err);
                    }
                };
                if matches!(next, Next::Subscribe(_)) {
                    break;
                }
            }
            input.drain(..consumed);
            if !output.is_empty() {
                self.stream.write_all(&output).await?;
                output.clear();
            }
            if let Next::Subscribe(notifications) = next {
                return self.stream_notifications(notifications).await;
            }
            input.reserve(READ_CHUNK);
            if self.stream.read_buf(&mut input).await? == 0 {
                if !input.is_empty() {
                    return Err(ShoalError::protocol(format!(
                        "connection closed inside a frame ({} bytes pending)",
                        input.len()
                    )));
                }
                return Ok(());
            }
        }
    }

    async fn handle(&mut self, request: Request, out: &mut Vec<u8>) -> Result<Next> {
        if !self.welcomed && !matches!(request, Request::Hello { .. }) {
            return Err(ShoalError::protocol("the first request must be Hello"));
        }
        let reply = match request {
            Request::Hello { version, pid } => {
                if self.welcomed {
                    return Err(ShoalError::protocol("Hello sent twice"));
                }
                if version != PROTOCOL_VERSION {
                    Reply::Error {
                        kind: ErrorKind::VersionMismatch,
                        message: format!(
                            "client speaks protocol {version}, daemon {PROTOCOL_VERSION}"
                        ),
                    }
                    .encode(out);
                    return Ok(Next::Continue);
                }
                self.welcomed = true;
                tracing::debug!(client = self.client, pid, "client connected");
                self.send_welcome(out).await?;
                return Ok(Next::Continue);
            }
            Request::Create {
                timeout_ms,
                objects,
            } => match self.create(timeout_ms, &objects).await? {
                Ok(locations) => Reply::Created {
                    generation: 0,
                    offsets: locations.iter().map(|l| l.offset).collect(),
                },
                Err(err) => Reply::error(&err),
            },
            Request::CreateOn {
                node,
                timeout_ms,
                objects,
            } => {
                let me = self.shared.cluster.as_ref().map_or(0, |c| c.me);
                let result = match self.shared.cluster.clone() {
                    _ if node == me => self
                        .create(timeout_ms, &objects)
                        .await?
                        .map(|locations| (0, locations)),
                    None => Err(ShoalError::invalid(format!(
                        "create on node {node}: this daemon is not part of a cluster"
                    ))),
                    Some(cluster) => {
                        let specs: Vec<_> = objects
                            .iter()
                            .map(|o| (o.id, o.data_size, o.meta_size))
                            .collect();
                        cluster
                            .allocate(self.client, node, &specs, timeout_ms)
                            .await
                    }
                };
                match result {
                    Ok((generation, locations)) => Reply::Created {
                        generation,
                        offsets: locations.iter().map(|l| l.offset).collect(),
                    },
                    Err(err) => Reply::error(&err),
                }
            }
            Request::Seal { release, ids } => {
                // Objects this client allocated on other nodes are sealed there.
                let (remote, ids): (Vec<ObjectId>, Vec<ObjectId>) =
                    ids.into_iter().partition(|id| {
                        self.shared
                            .cluster
                            .as_ref()
                            .is_some_and(|c| c.creation(self.client, id).is_some())
                    });
                if !remote.is_empty() {
                    let cluster = self.shared.cluster.clone().expect("remote creations");
                    if let Err(err) = cluster
                        .finish_remote(self.client, &remote, true, release)
                        .await
                    {
                        Reply::error(&err).encode(out);
                        return Ok(Next::Continue);
                    }
                    if ids.is_empty() {
                        Reply::Ok.encode(out);
                        return Ok(Next::Continue);
                    }
                }
                let result = self
                    .shared
                    .store
                    .borrow_mut()
                    .seal(self.client, &ids, release);
                self.shared.publish();
                if release {
                    self.shared.space.notify_waiters();
                }
                if result.is_ok() {
                    self.shared.announce_sealed(&ids).await;
                }
                result.map_or_else(|e| Reply::error(&e), |()| Reply::Ok)
            }
            Request::Abort { id } if self.remote_creation(&id) => {
                let cluster = self.shared.cluster.clone().expect("remote creations");
                let result = cluster
                    .finish_remote(self.client, &[id], false, false)
                    .await;
                result.map_or_else(|e| Reply::error(&e), |()| Reply::Ok)
            }
            Request::Abort { id } => {
                let result = self.shared.store.borrow_mut().abort(self.client, &id);
                self.shared.publish();
                self.shared.space.notify_waiters();
                result.map_or_else(|e| Reply::error(&e), |()| Reply::Ok)
            }
            Request::Get { timeout_ms, ids } => Reply::Objects {
                objects: self.get(timeout_ms, &ids).await?,
            },
            Request::Release { ids } => {
                let client = self.client;
                let mut store = self.shared.store.borrow_mut();
                let release_local = |id: &ObjectId| {
                    if let Err(err) = store.release(client, id) {
                        tracing::debug!(client, %err, "release ignored");
                    }
                };
                let remote = match &self.shared.cluster {
                    Some(cluster) => cluster.unhold_remote(client, &ids, release_local),
                    None => {
                        ids.iter().for_each(release_local);
                        Vec::new()
                    }
                };
                drop(store);
                if let (false, Some(cluster)) = (remote.is_empty(), self.shared.cluster.clone()) {
                    tokio::task::spawn_local(async move { cluster.release(remote).await });
                }
                self.shared.publish();
                self.shared.space.notify_waiters();
                return Ok(Next::Continue);
            }
            Request::Delete { ids } => {
                let mut errors: Vec<Option<ErrorKind>> = {
                    let mut store = self.shared.store.borrow_mut();
                    ids.iter()
                        .map(|id| {
                            let copy = self.shared.cluster.as_ref().is_some_and(|c| c.is_copy(id));
                            let local = store.delete(id).err().map(|e| e.kind());
                            // Deleting a network-mode copy deletes the object at its owner.
                            if copy {
                                Some(ErrorKind::ObjectNotFound)
                            } else {
                                local
                            }
                        })
                        .collect()
                };
                let deleted: Vec<ObjectId> = (0..ids.len())
                    .filter(|&i| errors[i].is_none())
                    .map(|i| ids[i])
                    .collect();
                let holders = lending::holders(&self.shared, &deleted);
                self.shared.publish();
                if let Some(cluster) = self.shared.cluster.clone() {
                    // Loans revoked, then gone from the directory, before the
                    // delete is answered: no get sees the old object
                    // afterwards, and the id can be created again anywhere.
                    lending::revoke(&self.shared, holders).await;
                    if !deleted.is_empty() {
                        cluster.unregister(&deleted).await;
                    }
                    // Not here: maybe on another node, which deletes it there.
                    let elsewhere: Vec<usize> = (0..ids.len())
                        .filter(|&i| errors[i] == Some(ErrorKind::ObjectNotFound))
                        .collect();
                    if !elsewhere.is_empty() {
                        let wanted: Vec<ObjectId> = elsewhere.iter().map(|&i| ids[i]).collect();
                        let results = cluster.delete_remote(&wanted).await;
                        for (&i, result) in elsewhere.iter().zip(results) {
                            errors[i] = result;
                        }
                    }
                }
                Reply::Statuses { errors }
            }
            Request::Contains { id } => Reply::Bool(self.shared.store.borrow().contains(&id)),
            Request::List => Reply::List {
                objects: self.shared.store.borrow().list(),
            },
            Request::Stats => Reply::Stats(self.shared.store.borrow().stats()),
            Request::Evict { bytes } => {
                let mut freed = self.shared.store.borrow_mut().evict(bytes);
                // Objects other nodes keep on loan are referenced: ask for the idle ones.
                if freed < bytes && lending::take_back_idle(&self.shared).await {
                    freed += self.shared.store.borrow_mut().evict(bytes - freed);
                }
                self.shared.publish();
                Reply::Evicted { bytes: freed }
            }
            Request::ClusterInfo => match &self.shared.cluster {
                None => Reply::error(&ShoalError::invalid("this daemon is not part of a cluster")),
                Some(cluster) => Reply::ClusterInfo {
                    node: cluster.me,
                    coherent: cluster.topology.coherence == CoherenceMode::Coherent,
                    simulated: cluster.topology.simulate_caches,
                    nodes: cluster
                        .topology
                        .nodes
                        .iter()
                        .map(|n| PeerRegion {
                            node: n.id,
                            mapped: n.access == Access::Mapped,
                            alive: cluster.is_alive(n.id),
                            region_size: n.region_size,
                            path: n.region.display().to_string(),
                        })
                        .collect(),
                },
            },
            Request::Subscribe => {
                let notifications = self.shared.subscribe();
                Reply::Ok.encode(out);
                return Ok(Next::Subscribe(notifications));
            }
        };
        reply.encode(out);
        Ok(Next::Continue)
    }

    /// Network mode: copies an object of a node whose memory cannot be mapped
    /// into this node's region (pulled over the owner's data channel, in
    /// parallel ranges), seals the copy under the same id, tells the id's home
    /// (so a delete drops the copy) and answers it as a local object. The
    /// reference taken at the owner covers the transfer and the announcement,
    /// and is released after them. `None` if another client of this node is
    /// pulling the same object right now.
    async fn pull(
        &self,
        cluster: &ClusterRef,
        id: ObjectId,
        remote: Remote,
    ) -> Result<Option<Located>> {
        let l = remote.location;
        let created = self
            .shared
            .store
            .borrow_mut()
            .create_batch(COPY_CLIENT, &[(id, l.data_size, l.meta_size)]);
        let release_remote = || {
            let held = cluster.unhold(self.client, &[id]);
            let cluster = cluster.clone();
            tokio::task::spawn_local(async move { cluster.release(held).await });
        };
        let local = match created {
            Ok(locations) => locations[0],
            Err(err) => {
                release_remote();
                return if err.kind() == ErrorKind::ObjectExists {
                    Ok(None)
                } else {
                    Err(err)
                };
            }
        };
        let size = l.size();
        let parts = if size >= PARALLEL_PULL { 4 } else { 1 };
        // SAFETY: the copy's block lies inside our region (the allocator
        // hands out in-range blocks) and is ours until sealed.
        let dst = unsafe { self.shared.region.base().add(local.offset as usize) };
        let fetched = cluster.fetch(remote.owner, id, size, dst, parts).await;
        let sealed = {
            let mut store = self.shared.store.borrow_mut();
            match fetched {
                Err(err) => {
                    let _ = store.abort(COPY_CLIENT, &id);
                    Err(err)
                }
                Ok(()) => store
                    .seal(COPY_CLIENT, &[id], true)
                    .map(|()| store.get(self.client, &id)),
            }
        };
        self.shared.publish();
        let location = match sealed {
            Ok(location) => location,
            Err(err) => {
                release_remote();
                return Err(err);
            }
        };
        // Announced while the owner's reference still pins the original, so
        // the home can tell a copy of the current object from one of an
        // object deleted (or replaced) meanwhile.
        let kept = cluster.announce_copies(&[id], remote.owner, &[l]).await[0];
        release_remote();
        if !kept {
            // This get still answers (it overlapped the delete), but the copy
            // goes: hidden now, freed when the client releases it.
            let _ = self.shared.store.borrow_mut().delete(&id);
            self.shared.publish();
        }
        Ok(location.map(|location| Located::local(cluster.me, location)))
    }

    fn remote_creation(&self, id: &ObjectId) -> bool {
        self.shared
            .cluster
            .as_ref()
            .is_some_and(|c| c.creation(self.client, id).is_some())
    }

    /// Sends pending replies, then the Welcome with the region's fd attached.
    async fn send_welcome(&mut self, out: &mut Vec<u8>) -> Result<()> {
        if !out.is_empty() {
            self.stream.write_all(out).await?;
            out.clear();
        }
        let stats = self.shared.store.borrow().stats();
        let mut frame = Vec::new();
        Reply::Welcome {
            version: PROTOCOL_VERSION,
            client_id: self.client,
            region_size: stats.region_size,
            capacity: stats.capacity,
            line_size: stats.line_size,
            resident: self.shared.resident,
            clustered: self.shared.cluster.is_some(),
        }
        .encode(&mut frame);
        let region_fd = self.shared.region.fd();
        let sent = self
            .stream
            .async_io(Interest::WRITABLE, || {
                send_with_fd(self.stream.as_fd(), &frame, region_fd)
            })
            .await?;
        self.stream.write_all(&frame[sent..]).await?;
        Ok(())
    }

    /// Creates all objects or none. On a full store, waits up to `timeout_ms`
    /// for memory to be released before giving up with `StoreFull`.
    async fn create(
        &mut self,
        timeout_ms: u32,
        objects: &[CreateSpec],
    ) -> Result<Result<Vec<ObjectLocation>>> {
        let specs: Vec<_> = objects
            .iter()
            .map(|o| (o.id, o.data_size, o.meta_size))
            .collect();
        let cluster = self.shared.cluster.clone();
        let ids: Vec<ObjectId> = objects.iter().map(|o| o.id).collect();
        if let Some(cluster) = &cluster {
            // Ids are unique cluster-wide: claim them at their homes first.
            if let Err(err) = cluster.register(&ids).await {
                return Ok(Err(err));
            }
        }
        let result = self.create_local(timeout_ms, &specs).await;
        if let (Some(cluster), Ok(Err(_)) | Err(_)) = (&cluster, &result) {
            cluster.unregister(&ids).await;
        }
        result
    }

    async fn create_local(
        &mut self,
        timeout_ms: u32,
        specs: &[(ObjectId, u64, u32)],
    ) -> Result<Result<Vec<ObjectLocation>>> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
        let mut loans_asked = false;
        loop {
            let space = self.shared.space.notified();
            tokio::pin!(space);
            space.as_mut().enable();
            let result = self
                .shared
                .store
                .borrow_mut()
                .create_batch(self.client, specs);
            self.shared.publish();
            match result {
                // Other nodes' idle loans pin objects here: ask for them first.
                Err(err) if err.kind() == ErrorKind::StoreFull && !loans_asked => {
                    loans_asked = true;
                    lending::take_back_idle(&self.shared).await;
                }
                Err(err) if err.kind() == ErrorKind::StoreFull && Instant::now() < deadline => {
                    tokio::select! {
                        _ = space => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                        _ = peer_gone(&self.stream) => return Err(ShoalError::new(ErrorKind::Disconnected, "client left while waiting for space")),
                    }
                }
                other => return Ok(other),
            }
        }
    }

    /// Gets every id, waiting up to `timeout_ms` (-1: forever) for ones not
    /// sealed yet. Each object found holds one reference for this client.
    async fn get(&mut self, timeout_ms: i64, ids: &[ObjectId]) -> Result<Vec<Option<Located>>> {
        let deadline = u64::try_from(timeout_ms)
            .ok()
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        let mut found: Vec<Option<Located>> = vec![None; ids.len()];
        let mut missing = ids.len();
        // Objects on other nodes are polled (their seals are not announced
        // here), backing off to REMOTE_POLL_MAX.
        let mut poll = REMOTE_POLL_MIN;
        loop {
            let sealed = self.shared.sealed.notified();
            tokio::pin!(sealed);
            sealed.as_mut().enable();
            {
                let mut store = self.shared.store.borrow_mut();
                for (slot, id) in found.iter_mut().zip(ids) {
                    if slot.is_none() {
                        *slot = self.shared.get_local(&mut store, self.client, id);
                        missing -= slot.is_some() as usize;
                    }
                }
            }
            if missing > 0 {
                if let Some(cluster) = self.shared.cluster.clone() {
                    let positions: Vec<usize> =
                        (0..ids.len()).filter(|&i| found[i].is_none()).collect();
                    let wanted: Vec<ObjectId> = positions.iter().map(|&i| ids[i]).collect();
                    let remote = match cluster.get(self.client, &wanted).await {
                        Ok(remote) => remote,
                        // A down home or owner, a peer that misbehaves: the ids
                        // stay missing; the client's connection is not at fault.
                        Err(err) => {
                            if err.kind() == ErrorKind::NodeUnavailable {
                                tracing::debug!(%err, "remote get");
                            } else {
                                tracing::warn!(%err, "remote get");
                            }
                            vec![None; wanted.len()]
                        }
                    };
                    for (&i, r) in positions.iter().zip(remote) {
                        let Some(r) = r else { continue };
                        if r.network {
                            // Unmappable owner: pull a copy into our region.
                            match self.pull(&cluster, ids[i], r).await {
                                Ok(Some(located)) => found[i] = Some(located),
                                Ok(None) => continue,
                                // No room for the copy, owner gone: missing for now.
                                Err(err) => {
                                    tracing::debug!(%err, id = %ids[i], "network pull");
                                    continue;
                                }
                            }
                        } else {
                            found[i] = Some(Located {
                                node: r.owner,
                                generation: r.generation,
                                location: r.location,
                                invalidate: false,
                            });
                        }
                        missing -= 1;
                    }
                }
            }
            if missing == 0 || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(found);
            }
            let wake = match (&self.shared.cluster, deadline) {
                (Some(_), Some(d)) => Some(d.min(Instant::now() + poll)),
                (Some(_), None) => Some(Instant::now() + poll),
                (None, d) => d,
            };
            poll = (poll * 2).min(REMOTE_POLL_MAX);
            tokio::select! {
                _ = sealed => {}
                _ = sleep_until(wake) => {}
                _ = peer_gone(&self.stream) => return Err(ShoalError::new(ErrorKind::Disconnected, "client left while waiting in get")),
            }
        }
    }

    async fn stream_notifications(
        &mut self,
        mut notifications: mpsc::Receiver<Notification>,
    ) -> Result<()> {
        let mut frame = Vec::new();
        let mut scratch = [0u8; 256];
        loop {
            tokio::select! {
                notification = notifications.recv() => {
                    let Some(notification) = notification else { return Ok(()) };
                    frame.clear();
                    Reply::Notification(notification).encode(&mut frame);
                    self.stream.write_all(&frame).await?;
                }
                read = self.stream.read(&mut scratch) => {
                    if read? == 0 {
                        return Ok(());
                    }
                    // A subscriber sends nothing after Subscribe; ignore stray bytes.
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => pending().await,
    }
}

/// Resolves when the client hangs up while we wait on its behalf (so a
/// killed client's waiting get or create ends, and its references go).
/// Stays pending if the client pipelined more requests.
async fn peer_gone(stream: &UnixStream) {
    loop {
        if stream.readable().await.is_err() {
            return;
        }
        let mut byte = [0u8; 1];
        let peeked = stream.try_io(Interest::READABLE, || {
            // SAFETY: recv into a 1-byte stack buffer on our own socket; MSG_PEEK leaves the data queued.
            let n = unsafe {
                libc::recv(
                    stream.as_raw_fd(),
                    byte.as_mut_ptr().cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n)
            }
        });
        match peeked {
            Ok(0) => return,
            Ok(_) => pending::<()>().await,
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        }
    }
}
