//! One client connection: decode frames, run requests through the shared
//! operations (`ops`), write replies in order.
//!
//! Replies to all requests that arrived in one read are written with one
//! write, so a client that pipelines pays one wake-up for the lot.

use std::cell::Cell;
use std::future::pending;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::Instant;

use shoal_core::busy_poll;
use shoal_core::coherence::CoherenceMode;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::event::ObjectEvent;
use shoal_core::protocol::{
    decode_request, CreateSpec, FrameHeader, PeerRegion, Reply, Request, FRAME_HEADER_LEN,
};
use shoal_core::ObjectId;
use shoal_store::store::Placement;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tracing::Instrument;

mod attached;

use crate::node::{ClientActivity, Reservation, SMALL_FRAME};
use crate::ops::Ops;

const READ_CHUNK: usize = 64 * 1024;

pub(crate) async fn serve(ops: Rc<Ops>, stream: UnixStream) {
    let client = ops.node.new_client();
    let mut connection = Connection {
        ops: ops.clone(),
        stream,
        client,
        activity: ops.node.client_activity(client),
        welcomed: false,
    };
    match connection
        .run()
        .instrument(tracing::info_span!("client", client))
        .await
    {
        Ok(()) => tracing::debug!(client, "client disconnected"),
        Err(err) if err.kind() == ErrorKind::Disconnected => {
            tracing::debug!(client, %err, "client gone")
        }
        Err(err) => tracing::warn!(client, %err, "dropping client"),
    }
    // What it published before it went still counts (a seal record whose
    // bytes were written), and a query it asked is answered now, not after
    // it is gone (a delete then would remove a later object of that id);
    // then its channel and lent space go.
    while ops.apply_all_writes() > 0 {}
    ops.node.write_channels().close(client);
    ops.node.client_gone(client);
}

/// A request's operation, first object id and how many objects it names.
fn summary(request: &Request) -> (&'static str, Option<shoal_core::ObjectId>, usize) {
    let first = |ids: &[shoal_core::ObjectId]| (ids.first().copied(), ids.len());
    let (op, (id, objects)) = match request {
        Request::Create { objects, .. } | Request::CreateOn { objects, .. } => {
            ("create", (objects.first().map(|o| o.id), objects.len()))
        }
        Request::Seal { ids, .. } => ("seal", first(ids)),
        Request::Abort { id } => ("abort", (Some(*id), 1)),
        Request::Resize { id, .. } => ("resize", (Some(*id), 1)),
        Request::Get { ids, .. } => ("get", first(ids)),
        Request::Release { ids } => ("release", first(ids)),
        Request::Delete { ids } => ("delete", first(ids)),
        Request::Contains { id } => ("contains", (Some(*id), 1)),
        _ => ("other", (None, 0)),
    };
    (op, id, objects)
}

/// A debug-level span per request with its operation and (first) object
/// id, so every line logged while serving it names them; nothing at all
/// unless debug logging is on.
fn request_span(
    op: &'static str,
    id: Option<shoal_core::ObjectId>,
    objects: usize,
) -> tracing::Span {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return tracing::Span::none();
    }
    tracing::debug_span!("request", op, id = id.map(tracing::field::display), objects)
}

struct Connection {
    ops: Rc<Ops>,
    stream: UnixStream,
    client: u32,
    activity: Rc<ClientActivity>,
    welcomed: bool,
}

/// What handling a request asks the connection loop to do next.
enum Next {
    Continue,
    /// Registered before its `Ok` was queued, so no seal after the reply is missed.
    Subscribe(mpsc::Receiver<ObjectEvent>),
}

impl Connection {
    async fn run(&mut self) -> Result<()> {
        let mut input: Vec<u8> = Vec::with_capacity(READ_CHUNK);
        let mut output: Vec<u8> = Vec::with_capacity(READ_CHUNK);
        // The input budget held while a large frame is being buffered.
        let mut large: Option<Reservation> = None;
        loop {
            let mut consumed = 0;
            let mut next = Next::Continue;
            if !input.is_empty() {
                // Write records published before this request are applied
                // before it: its own (a release there before a delete here)
                // and other clients' (their creates show in a listing, and
                // an id one of them is writing is refused to a create here).
                while self.ops.apply_all_writes() > 0 {}
            }
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
                let (op, id, objects) = summary(&request);
                self.activity.count(objects);
                let span = request_span(op, id, objects);
                next = match self.handle(request, &mut output).instrument(span).await {
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
            if consumed > 0 {
                // The large frame it was held for is decoded.
                large = None;
                if input.capacity() > 4 * READ_CHUNK && input.len() <= READ_CHUNK {
                    // Give a large frame's buffer back, not keep it for the
                    // connection's life.
                    input.shrink_to(READ_CHUNK);
                }
            }
            if !output.is_empty() {
                self.stream.write_all(&output).await?;
                output.clear();
            }
            if let Next::Subscribe(notifications) = next {
                self.activity.subscribed();
                return self.stream_notifications(notifications).await;
            }
            if large.is_none() {
                if let Some(header) = FrameHeader::parse(&input)? {
                    let frame = FRAME_HEADER_LEN as u64 + u64::from(header.len);
                    if frame > SMALL_FRAME {
                        large = Some(self.ops.node.input_budget().reserve(frame)?);
                    }
                }
            }
            input.reserve(READ_CHUNK);
            keep_polling();
            let read = tokio::select! {
                read = self.stream.read_buf(&mut input) => read?,
                () = self.activity.kicked() => {
                    return Err(ShoalError::protocol(
                        "closed: this client's write channel broke the protocol",
                    ));
                }
                () = self.activity.shed(), if input.is_empty() => {
                    return Err(ShoalError::new(
                        ErrorKind::Disconnected,
                        "closed: the daemon ran out of file descriptors and this connection \
                         was the one idle the longest, holding nothing",
                    ));
                }
            };
            if read == 0 {
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
            Request::Hello { version, pid } => return self.hello(version, pid, out).await,
            Request::Create {
                timeout_ms,
                objects,
                growing: false,
            } => {
                self.create(self.ops.me(), timeout_ms, &objects, Placement::Packed)
                    .await?
            }
            Request::Create {
                timeout_ms,
                objects,
                growing: true,
            } => {
                self.create(self.ops.me(), timeout_ms, &objects, Placement::Growing)
                    .await?
            }
            Request::CreateOn {
                node,
                timeout_ms,
                objects,
            } if self.ops.pushes_to(node) => self.create_staged(node, timeout_ms, &objects).await?,
            Request::CreateOn {
                node,
                timeout_ms,
                objects,
            } => {
                self.create(node, timeout_ms, &objects, Placement::Packed)
                    .await?
            }
            Request::Seal {
                release,
                durability,
                ids,
            } => ok_or_error(self.ops.seal(self.client, &ids, release, durability).await),
            Request::Abort { id } => ok_or_error(self.ops.abort(self.client, &[id]).await),
            Request::Resize { id, data_size } => self
                .ops
                .resize(self.client, &id, data_size)
                .map_or_else(|e| Reply::error(&e), Reply::Bool),
            Request::Get { timeout_ms, ids } => self.get(timeout_ms, &ids).await?,
            Request::Release { ids } => {
                self.ops.release(self.client, &ids);
                return Ok(Next::Continue);
            }
            Request::Delete { ids } => Reply::Statuses {
                errors: self.ops.delete(&ids, true).await,
            },
            Request::Contains { id } => Reply::Bool(self.ops.contains(&id)),
            Request::List => Reply::List {
                objects: self.ops.list(),
            },
            Request::Stats => Reply::Stats(self.ops.stats()),
            Request::Tiers => Reply::Tiers(self.ops.tier_report()),
            Request::Capacity { trace_since } => {
                Reply::Capacity(self.ops.capacity_report(trace_since))
            }
            Request::WaitDurable {
                level,
                timeout_ms,
                ids,
            } => statuses(self.ops.wait_durable(&ids, level, timeout_ms).await),
            Request::StageIn { ids } => statuses(self.ops.stage_in(&ids).await),
            Request::StageOut { ids } => statuses(self.ops.stage_out(&ids).await),
            Request::Cool { ids } => statuses(self.ops.cool(&ids)),
            Request::Evict { bytes } => Reply::Evicted {
                bytes: self.ops.evict(bytes).await,
            },
            Request::ClusterInfo => cluster_info(&self.ops),
            Request::FastReads => return self.open_fast_reads(out).await,
            Request::FastWrites => return self.open_fast_writes(out).await,
            Request::PeerReads => return self.send_peer_reads(out).await,
            Request::Lend { bytes } => self.lend(bytes),
            Request::Name { id, name } => ok_or_error(self.ops.name(id, name).await),
            Request::Resolve { name } => self
                .ops
                .resolve(&name)
                .await
                .map_or_else(|e| Reply::error(&e), Reply::Named),
            Request::ListNames { prefix } => self
                .ops
                .list_names(&prefix)
                .await
                .map_or_else(|e| Reply::error(&e), |entries| Reply::Names { entries }),
            Request::Rename { from, to } => ok_or_error(self.ops.rename(&from, &to).await),
            Request::Unlink { name } => ok_or_error(self.ops.unlink(&name).await),
            Request::SetMtime { name, mtime_ms } => {
                ok_or_error(self.ops.set_mtime(&name, mtime_ms).await)
            }
            Request::Subscribe => {
                let notifications = self.ops.node.subscribe();
                Reply::Ok.encode(out);
                return Ok(Next::Subscribe(notifications));
            }
        };
        reply.encode(out);
        Ok(Next::Continue)
    }

    /// Gets `ids` (waiting up to `timeout_ms` for the unsealed, restoring
    /// the ones held below).
    async fn get(&self, timeout_ms: i64, ids: &[ObjectId]) -> Result<Reply> {
        let found = self
            .ops
            .get(self.client, ids, timeout_ms, peer_gone(&self.stream))
            .await;
        // A restore that failed (a corrupt copy) is the client's answer; a
        // client that hung up ends the connection.
        Ok(match kept(found)? {
            Ok(objects) => Reply::Objects { objects },
            Err(err) => Reply::error(&err),
        })
    }

    /// Lends `bytes` of free space for the fast path's creates (all zero:
    /// none to lend now).
    fn lend(&self, bytes: u64) -> Reply {
        let (lease, offset, len) = self.ops.lend(self.client, bytes).unwrap_or((0, 0, 0));
        Reply::Lent { lease, offset, len }
    }

    /// Creates on `node` (this one, or another by remote allocation) and
    /// answers with the node's region generation (0 here) and offsets.
    async fn create(
        &self,
        node: u32,
        timeout_ms: u32,
        objects: &[CreateSpec],
        placement: Placement,
    ) -> Result<Reply> {
        let specs: Vec<_> = objects
            .iter()
            .map(|o| (o.id, o.data_size, o.meta_size))
            .collect();
        let created = self
            .ops
            .create_on(
                self.client,
                node,
                &specs,
                placement,
                timeout_ms,
                peer_gone(&self.stream),
            )
            .await;
        Ok(match kept(created)? {
            Ok((generation, locations)) => Reply::Created {
                generation,
                offsets: locations.iter().map(|l| l.offset).collect(),
            },
            Err(err) => Reply::error(&err),
        })
    }

    /// Creates on `node`, reached over the network only, and answers with
    /// the offsets of the staging buffers the client writes (in this
    /// daemon's region).
    async fn create_staged(
        &self,
        node: u32,
        timeout_ms: u32,
        objects: &[CreateSpec],
    ) -> Result<Reply> {
        let specs: Vec<_> = objects
            .iter()
            .map(|o| (o.id, o.data_size, o.meta_size))
            .collect();
        let created = self
            .ops
            .create_staged(
                self.client,
                node,
                &specs,
                timeout_ms,
                peer_gone(&self.stream),
            )
            .await;
        Ok(match kept(created)? {
            Ok(locations) => Reply::Staged {
                offsets: locations.iter().map(|l| l.offset).collect(),
            },
            Err(err) => Reply::error(&err),
        })
    }

    async fn stream_notifications(
        &mut self,
        mut notifications: mpsc::Receiver<ObjectEvent>,
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

/// This daemon's place in its cluster: the nodes, which it maps, which are
/// alive.
fn cluster_info(ops: &Ops) -> Reply {
    let Some(cluster) = &ops.cluster else {
        return Reply::error(&ShoalError::invalid("this daemon is not part of a cluster"));
    };
    let topology = &cluster.topology();
    Reply::ClusterInfo {
        node: cluster.me,
        coherent: topology.coherence == CoherenceMode::Coherent,
        simulated: topology.simulate_caches,
        cluster: topology.identity(),
        encryption: cluster.encryption(),
        nodes: topology
            .nodes
            .iter()
            .map(|n| PeerRegion {
                node: n.id,
                mapped: topology.maps(cluster.me, n.id),
                alive: cluster.is_alive(n.id),
                region_size: n.region_size,
                path: n.region.display().to_string(),
            })
            .collect(),
    }
}

/// One status per id (the kinds; messages are logged here).
fn ok_or_error(result: Result<()>) -> Reply {
    result.map_or_else(|e| Reply::error(&e), |()| Reply::Ok)
}

fn statuses(errors: Vec<Option<ShoalError>>) -> Reply {
    Reply::Statuses {
        errors: errors
            .into_iter()
            .map(|e| {
                e.map(|e| {
                    tracing::debug!(%e, "tier request");
                    e.kind()
                })
            })
            .collect(),
    }
}

thread_local! {
    /// Until when this daemon's thread polls its sockets rather than sleep.
    static POLL_UNTIL: Cell<Instant> = Cell::new(Instant::now());
    /// Whether the polling task runs.
    static POLLING: Cell<bool> = const { Cell::new(false) };
}

/// Keeps the daemon's thread polling its sockets for the busy-poll window
/// after a request (see [`shoal_core::busy_poll`]): a client issuing one
/// call after another then costs no wake-up of the daemon. One task per
/// daemon thread does it by yielding to the runtime in a loop (each yield
/// polls every socket without sleeping, and wakes the connections in the
/// order their requests arrived, as a sleeping poll would); it ends once
/// the window passes without a request. Not at all while no core is free
/// ([`busy_poll::worth_polling`]): then the thread sleeps in the kernel and
/// is woken with priority when the next request comes, where a yield would
/// have queued it behind a neighbour for a whole time slice.
fn keep_polling() {
    let window = busy_poll::window_now();
    if window.is_zero() {
        return;
    }
    POLL_UNTIL.set(Instant::now() + window);
    if POLLING.replace(true) {
        return;
    }
    tokio::task::spawn_local(async {
        // Any thread waiting for this core (a client on it) runs first; a
        // yield that came back late means the cores are taken: stop.
        while Instant::now() < POLL_UNTIL.get() && busy_poll::pause() {
            tokio::task::yield_now().await;
        }
        POLLING.set(false);
    });
}

/// A create or get that failed because the client hung up ends the
/// connection; any other failure is the client's answer.
fn kept<T>(result: Result<T>) -> Result<Result<T>> {
    match result {
        Err(err) if err.kind() == ErrorKind::Disconnected => Err(err),
        other => Ok(other),
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
