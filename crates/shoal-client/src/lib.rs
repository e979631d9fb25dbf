//! The Rust client of a local shoal daemon.
//!
//! A client connects to the daemon's Unix socket, receives the region's file
//! descriptor once and maps it. From then on objects are (offset, size) pairs
//! into that mapping: a get is a lookup, never a copy. The client is
//! synchronous (one request in flight); batch calls exist so that many
//! objects cost one round trip. [`shared::SharedClient`] shares one
//! connection between threads, with references released when dropped.

mod lent;
mod peer_reads;
pub mod shared;

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_core::busy_poll;
pub use shoal_core::durability::Durability;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::event::ObjectEvent;
use shoal_core::fast_path::readers::FastReads;
use shoal_core::fd_passing::{recv_with_fd, recv_with_fds};
use shoal_core::location::ObjectLocation;
use shoal_core::protocol::{
    CreateSpec, FrameHeader, Reply, Request, FRAME_HEADER_LEN, PROTOCOL_VERSION,
};
pub use shoal_core::protocol::{Located, NameEntry, PeerRegion, TierInfo, TierReport};
use shoal_core::protocol::{ObjectInfo, StoreStats};
use shoal_core::region::Mapping;
use shoal_core::ObjectId;

pub use shoal_core::protocol::WAIT_FOREVER;

/// What the daemon told us at connect.
#[derive(Debug, Clone, Copy)]
pub struct StoreInfo {
    pub client_id: u32,
    pub region_size: u64,
    pub capacity: u64,
    pub line_size: u64,
    /// The daemon keeps the region resident; the mapping was populated.
    pub resident: bool,
    /// The daemon is a node of a cluster (objects may live in peers' regions).
    pub clustered: bool,
}

/// The cluster as this client sees it: which node its daemon is, and the
/// peers' regions it maps (read-only) when a get returns objects there.
pub struct ClusterView {
    pub node: u32,
    pub coherent: bool,
    pub nodes: Vec<PeerRegion>,
    /// Simulated non-coherent fabric: this process's private "cache" copy of
    /// each node's region. Writes of new objects go to the copy and reach the
    /// region only when flushed; reads of objects that need an invalidate
    /// (see [`Client::needs_invalidate`]) come from the copy, refreshed only
    /// by that invalidate. A missing flush or invalidate shows as wrong
    /// bytes, as it would on the hardware.
    ///
    /// Our own node's copy stands for that node's caches, shared by all its
    /// processes in reality: it holds what this process wrote there (a
    /// flush keeps the lines, as CLWB does) and what it read of objects other
    /// nodes wrote there. Objects our node wrote are read from the region
    /// itself: a node's caches see its own writes, so those reads cost
    /// nothing extra and need no invalidate.
    pub simulated: bool,
    /// Per node, what this process maps of its region.
    peers: Vec<PeerMaps>,
}

/// One node's region as this process maps it, all of one generation (the
/// incarnation of the node's daemon that made the region file). A node that
/// restarts makes a new file: descriptors then name the new generation and
/// everything mapped of the old one is replaced (buffers still pointing into
/// it keep their `Arc`).
#[derive(Default)]
struct PeerMaps {
    /// 0 until something is mapped.
    generation: u64,
    /// Read-only, mapped on the first object found on the node.
    readonly: Option<Arc<Mapping>>,
    /// Writable, for objects this client allocates on the node.
    writable: Option<Arc<Mapping>>,
    /// The simulated fabric's cache copy of the region.
    cache: Option<Arc<Mapping>>,
}

impl PeerMaps {
    /// The mapping (read-only, or writable with `write`) of node `node`'s
    /// region at `path` in generation `generation`; see `Client::peer_mapping`.
    fn resolve(
        &mut self,
        node: u32,
        path: &Path,
        size: u64,
        generation: u64,
        write: bool,
    ) -> Result<Arc<Mapping>> {
        let slot = if write {
            &self.writable
        } else {
            &self.readonly
        };
        if let Some(mapping) = slot.as_ref().filter(|m| m.generation() == generation) {
            return Ok(mapping.clone());
        }
        if self.generation != 0 && self.generation != generation {
            // Unchanged file (the node has not restarted since we mapped
            // it): the descriptor is the stale one. No file: the region is
            // gone with its node. Either way, never read it.
            let now = shoal_core::region::file_generation(path, size).unwrap_or(0);
            if now == self.generation || now == 0 {
                return Err(stale_descriptor(node, generation));
            }
        }
        let fresh = Arc::new(if write {
            Mapping::map_path_writable(path, size)?
        } else {
            Mapping::map_path_readonly(path, size)?
        });
        if fresh.generation() != self.generation {
            // A new region (the node restarted, or a first mapping): drop
            // every mapping and cache of the previous one.
            *self = Self {
                generation: fresh.generation(),
                ..Self::default()
            };
        }
        if write {
            self.writable = Some(fresh.clone());
        } else {
            self.readonly = Some(fresh.clone());
        }
        if fresh.generation() != generation {
            return Err(stale_descriptor(node, generation));
        }
        Ok(fresh)
    }
}

/// Bytes read ahead of the replies decoded so far, in a buffer zeroed once
/// and reused: a call costs no allocation or clearing of read space.
const READ_CHUNK: usize = 64 * 1024;

/// A framed connection: requests out, replies in.
struct Channel {
    stream: UnixStream,
    /// Received bytes not decoded yet are `input[start..end]`.
    input: Vec<u8>,
    start: usize,
    end: usize,
    /// Frames queued for the next write (one-way requests such as releases
    /// ride along with the next request: one system call, one wake-up of
    /// the daemon), then the request being sent.
    output: Vec<u8>,
    /// The fast path, closed when the connection turns out dead.
    fast: Option<Arc<FastReads>>,
    /// Requests queued or sent so far.
    requests: u64,
}

impl Channel {
    fn new(stream: UnixStream) -> Self {
        Self {
            stream,
            input: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            output: Vec::new(),
            fast: None,
            requests: 0,
        }
    }

    /// Received bytes not decoded yet.
    fn pending(&self) -> &[u8] {
        &self.input[self.start..self.end]
    }

    /// Queues a one-way request, sent with the next [`send`](Self::send)
    /// or [`flush`](Self::flush).
    fn queue(&mut self, request: &Request) {
        request.encode(&mut self.output);
        self.requests += 1;
    }

    /// Writes the queued requests, if any.
    fn flush(&mut self) -> Result<()> {
        if self.output.is_empty() {
            return Ok(());
        }
        let written = self.stream.write_all(&self.output);
        self.output.clear();
        Ok(written?)
    }

    /// Sends the queued requests and `request` in one write.
    fn send(&mut self, request: &Request) -> Result<()> {
        self.queue(request);
        self.flush()
    }

    fn fill(&mut self, need: usize) -> Result<()> {
        while self.end - self.start < need {
            if self.start + need > self.input.len() {
                // Move what is pending to the front, growing only for a
                // frame larger than the buffer.
                self.input.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
                if need > self.input.len() {
                    self.input.resize(need.next_multiple_of(READ_CHUNK), 0);
                }
            }
            let n = self.read_some()?;
            if n == 0 {
                return Err(ShoalError::new(
                    ErrorKind::Disconnected,
                    "the daemon closed the connection",
                ));
            }
            self.end += n;
        }
        Ok(())
    }

    /// Reads what has arrived, polling for the busy-poll window before it
    /// sleeps (see [`shoal_core::busy_poll`]): a reply that comes within it
    /// costs no wake-up of this thread.
    fn read_some(&mut self) -> std::io::Result<usize> {
        let window = busy_poll::window();
        if !window.is_zero() {
            let deadline = Instant::now() + window;
            let fd = self.stream.as_raw_fd();
            loop {
                let space = &mut self.input[self.end..];
                // SAFETY: recv writes at most `space.len()` bytes into our own
                // buffer; MSG_DONTWAIT only makes it return instead of sleeping.
                let n = unsafe {
                    libc::recv(
                        fd,
                        space.as_mut_ptr().cast(),
                        space.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n >= 0 {
                    return Ok(n as usize);
                }
                let err = std::io::Error::last_os_error();
                match err.kind() {
                    std::io::ErrorKind::WouldBlock => {}
                    std::io::ErrorKind::Interrupted => continue,
                    _ => return Err(err),
                }
                if Instant::now() >= deadline {
                    break;
                }
                busy_poll::pause();
            }
        }
        self.stream.read(&mut self.input[self.end..])
    }

    fn recv(&mut self) -> Result<Reply> {
        self.fill(FRAME_HEADER_LEN)?;
        let header = FrameHeader::parse(self.pending())?.expect("header bytes present");
        let len = FRAME_HEADER_LEN + header.len as usize;
        self.fill(len)?;
        let reply = Reply::decode(
            header,
            &self.input[self.start + FRAME_HEADER_LEN..self.start + len],
        );
        self.start += len;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        reply
    }

    /// Sends a request and returns its reply, turning `Error` replies into `Err`.
    fn call(&mut self, request: &Request) -> Result<Reply> {
        let reply = self.send(request).and_then(|()| self.recv());
        if let (Err(err), Some(fast)) = (&reply, &self.fast) {
            if err.kind() == ErrorKind::Disconnected {
                // The daemon is gone: the index answers no more gets.
                fast.close();
            }
        }
        match reply? {
            Reply::Error { kind, message } => Err(ShoalError::new(kind, message)),
            reply => Ok(reply),
        }
    }

    /// A request whose reply comes with fds attached (nothing else may be
    /// in flight): the reply and its fds, in order.
    fn call_with_fds(&mut self, request: &Request) -> Result<(Reply, Vec<std::os::fd::OwnedFd>)> {
        self.send(request)?;
        debug_assert!(self.pending().is_empty(), "no reply may be pending");
        let (n, fds) = recv_with_fds(self.stream.as_fd(), &mut self.input[self.end..])?;
        if n == 0 {
            return Err(ShoalError::new(
                ErrorKind::Disconnected,
                "the daemon closed the connection",
            ));
        }
        self.end += n;
        Ok((self.recv()?, fds))
    }

    /// Hello → Welcome, receiving the region's fd on the way.
    fn handshake(path: &Path) -> Result<(Self, StoreInfo, std::os::fd::OwnedFd)> {
        let stream = UnixStream::connect(path).map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::NotFound
                || e.kind() == std::io::ErrorKind::ConnectionRefused
            {
                ErrorKind::Disconnected
            } else {
                ErrorKind::Io
            };
            ShoalError::new(kind, format!("connect to {}: {e}", path.display()))
        })?;
        // Before a single byte goes out: a daemon of another user (one
        // squatting the socket's name) must not receive our data.
        shoal_core::local_auth::check_daemon(stream.as_fd(), path)?;
        let mut channel = Channel::new(stream);
        channel.send(&Request::Hello {
            version: PROTOCOL_VERSION,
            pid: std::process::id(),
        })?;
        let mut first = [0u8; 256];
        let (n, fd) = recv_with_fd(channel.stream.as_fd(), &mut first)?;
        if n == 0 {
            return Err(ShoalError::new(
                ErrorKind::Disconnected,
                "the daemon closed the connection during the handshake",
            ));
        }
        channel.input[..n].copy_from_slice(&first[..n]);
        channel.end = n;
        let reply = channel.recv()?;
        let info = match reply {
            Reply::Welcome {
                version: _,
                client_id,
                region_size,
                capacity,
                line_size,
                resident,
                clustered,
            } => StoreInfo {
                client_id,
                region_size,
                capacity,
                line_size,
                resident,
                clustered,
            },
            Reply::Error { kind, message } => return Err(ShoalError::new(kind, message)),
            other => {
                return Err(ShoalError::protocol(format!(
                    "expected Welcome, got {other:?}"
                )))
            }
        };
        let fd = fd.ok_or_else(|| {
            ShoalError::protocol("Welcome arrived without the region's file descriptor")
        })?;
        Ok((channel, info, fd))
    }
}

/// A reference taken without a round trip: counted at an index position in
/// this client's table at its own node (`table` `None`) or at an owner.
struct FastHeld {
    table: Option<Arc<FastReads>>,
    position: u32,
}

pub struct Client {
    channel: Channel,
    mapping: Arc<Mapping>,
    info: StoreInfo,
    cluster: Option<ClusterView>,
    /// Objects created here (where, in which generation of that node's
    /// region) and not sealed yet, flushed at seal on a non-coherent fabric.
    unsealed: std::collections::HashMap<ObjectId, Located>,
    /// The fast path (docs/fast-path.md): gets of published objects without
    /// a round trip. `None` if the daemon does not offer it, or
    /// `SHOAL_FAST_READS=0`.
    fast: Option<Arc<FastReads>>,
    /// References taken through the fast path, by id: where each is
    /// counted (one per reference).
    fast_held: std::collections::HashMap<ObjectId, Vec<FastHeld>>,
    /// In a cluster: other nodes' indexes and this client's tables there
    /// (docs/fast-path.md "Gets of other nodes' objects"), asked for at
    /// the first get that misses the local index.
    peer_views: Arc<peer_reads::PeerViews>,
    /// Creates in lent space, sealed and released through the write
    /// channel (docs/fast-path.md). `None` without the fast path, in a
    /// cluster, or with `SHOAL_FAST_WRITES=0`.
    writes: Option<lent::FastWrites>,
}

/// Whether clients ask for the fast path (`SHOAL_FAST_READS=0`: every get
/// takes the socket, e.g. to measure the difference).
fn fast_reads_wanted() -> bool {
    std::env::var_os("SHOAL_FAST_READS").is_none_or(|v| v != "0")
}

/// Whether clients create small objects in lent space (`SHOAL_FAST_WRITES=0`:
/// every create and seal takes the socket).
fn fast_writes_wanted() -> bool {
    std::env::var_os("SHOAL_FAST_WRITES").is_none_or(|v| v != "0")
}

/// The daemon's end of a connection, for a client waiting on shared memory.
struct Connected<'a>(&'a UnixStream);

impl lent::Daemon for Connected<'_> {
    fn alive(&self) -> bool {
        lent::daemon_alive(self.0.as_fd())
    }
}

impl Client {
    /// Connects to the daemon at `socket` and maps its region; gets of
    /// sealed objects in memory take the fast path (no round trip) unless
    /// `SHOAL_FAST_READS=0`.
    pub fn connect(socket: impl AsRef<Path>) -> Result<Self> {
        Self::connect_with(socket, fast_reads_wanted())
    }

    /// [`connect`](Self::connect), every get and release through the daemon
    /// (as before the fast path; e.g. to watch references in `list`).
    pub fn connect_socket_only(socket: impl AsRef<Path>) -> Result<Self> {
        Self::connect_with(socket, false)
    }

    fn connect_with(socket: impl AsRef<Path>, fast_reads: bool) -> Result<Self> {
        let (channel, info, fd) = Channel::handshake(socket.as_ref())?;
        let mapping = Arc::new(Mapping::map(fd.as_fd(), info.region_size, info.resident)?);
        let mut client = Self {
            channel,
            mapping,
            info,
            cluster: None,
            unsealed: std::collections::HashMap::new(),
            fast: None,
            fast_held: std::collections::HashMap::new(),
            peer_views: Arc::default(),
            writes: None,
        };
        if info.clustered {
            match client.channel.call(&Request::ClusterInfo)? {
                Reply::ClusterInfo {
                    node,
                    coherent,
                    simulated,
                    nodes,
                } => {
                    client.cluster = Some(ClusterView {
                        node,
                        coherent,
                        simulated,
                        peers: nodes.iter().map(|_| PeerMaps::default()).collect(),
                        nodes,
                    });
                }
                other => return Err(unexpected(other)),
            }
        }
        if fast_reads {
            client.fast = client.ask_fast_reads()?;
            client.channel.fast = client.fast.clone();
            if let (Some(cluster), Some(_)) = (&client.cluster, &client.fast) {
                let possible = cluster
                    .nodes
                    .iter()
                    .filter(|n| n.node != cluster.node && n.mapped)
                    .count();
                client.peer_views = Arc::new(peer_reads::PeerViews::new(possible));
            }
        }
        if client.fast.is_some() && !info.clustered && fast_writes_wanted() {
            client.writes = client.ask_fast_writes()?;
        }
        Ok(client)
    }

    /// Asks for a write channel. `None` when the daemon does not offer one
    /// or this process cannot map it: creates and seals take the socket.
    fn ask_fast_writes(&mut self) -> Result<Option<lent::FastWrites>> {
        let fast = self.fast.clone().expect("asked with the fast path only");
        match self.channel.call_with_fds(&Request::FastWrites)? {
            (Reply::FastWrites { .. }, mut fds) if fds.len() == 2 => {
                let doorbell = fds.pop().expect("two fds");
                let socket = OwnedFd::from(self.channel.stream.try_clone()?);
                let line = self.info.line_size;
                match lent::FastWrites::attach(fds[0].as_fd(), doorbell, socket, fast, line) {
                    Ok(writes) => Ok(Some(writes)),
                    Err(err) if err.kind() == ErrorKind::Io => Ok(None),
                    Err(err) => Err(err),
                }
            }
            (Reply::Error { .. } | Reply::FastWrites { .. }, _) => Ok(None),
            (other, _) => Err(ShoalError::protocol(format!(
                "expected FastWrites, got {other:?}"
            ))),
        }
    }

    /// Creates one object in lent space, asking for a lease if needed:
    /// `None` when it goes through the socket instead.
    fn create_lent(&mut self, spec: &CreateSpec) -> Result<Option<ObjectLocation>> {
        if self.fast.as_ref().is_some_and(|f| f.is_closed()) {
            // The connection failed: the socket says so.
            self.writes = None;
        }
        let Some(writes) = self.writes.as_mut() else {
            return Ok(None);
        };
        if !writes.wants(spec.data_size, spec.meta_size) || writes.maybe_taken(&spec.id) {
            return Ok(None);
        }
        if let Some(location) = writes.carve(spec.id, spec.data_size, spec.meta_size)? {
            return Ok(Some(location));
        }
        let block = match self.channel.call(&Request::Lend { bytes: lent::LEASE })? {
            Reply::Lent { len: 0, .. } => None,
            Reply::Lent { lease, offset, len } => {
                let inside = offset
                    .checked_add(len)
                    .is_some_and(|end| end <= self.info.region_size);
                if !inside || !offset.is_multiple_of(self.info.line_size) {
                    return Err(ShoalError::protocol(format!(
                        "the daemon lent [{offset}, +{len}) outside its region"
                    )));
                }
                Some((lease, shoal_core::location::Block { offset, len }))
            }
            other => return Err(unexpected(other)),
        };
        let writes = self.writes.as_mut().expect("checked above");
        let lent = block.is_some();
        writes.take_lease(block)?;
        if !lent {
            return Ok(None);
        }
        writes.carve(spec.id, spec.data_size, spec.meta_size)
    }

    /// Asks for the fast path's shared state. `None` when the daemon does
    /// not offer it or could not make a table (an error reply, e.g. it is
    /// out of file descriptors), or this process cannot map it: gets then
    /// take the socket.
    fn ask_fast_reads(&mut self) -> Result<Option<Arc<FastReads>>> {
        match self.channel.call_with_fds(&Request::FastReads)? {
            (Reply::FastReads { .. }, fds) if fds.len() == 2 => {
                match FastReads::attach(fds[0].as_fd(), fds[1].as_fd()) {
                    Ok(fast) => Ok(Some(Arc::new(fast))),
                    Err(err) if err.kind() == ErrorKind::Io => Ok(None),
                    Err(err) => Err(err),
                }
            }
            // An error reply, or descriptors this process had no room for
            // (the kernel drops them): no fast path.
            (Reply::Error { .. } | Reply::FastReads { .. }, _) => Ok(None),
            (other, _) => Err(ShoalError::protocol(format!(
                "expected FastReads, got {other:?}"
            ))),
        }
    }

    /// The fast path's shared state, if this client has it (a
    /// [`shared::SharedClient`] takes references through it without the
    /// connection).
    pub fn fast_reads(&self) -> Option<&Arc<FastReads>> {
        self.fast.as_ref()
    }

    /// A reference to `id` through the shared index, without a round trip:
    /// its location in our region (checked and populated for reading), and
    /// the index position the reference is counted at, to give to
    /// [`FastReads::release`]. `None`: ask the daemon.
    pub fn fast_get(&self, id: &ObjectId) -> Option<(ObjectLocation, u32)> {
        let found = self.fast.as_ref()?.acquire_in(id, &self.mapping)?;
        Some((found.location, found.position))
    }

    /// Asks the daemon for other nodes' indexes and tables there, when it
    /// is time to (`PeerViews::should_ask`). A view that cannot be mapped
    /// is left out: gets of that owner's objects ask the daemon.
    fn refresh_peer_views(&mut self) -> Result<()> {
        if !self.peer_views.should_ask() {
            return Ok(());
        }
        let (owners, fds) = match self.channel.call_with_fds(&Request::PeerReads)? {
            (Reply::PeerReads { owners }, fds) if fds.len() == 2 * owners.len() => (owners, fds),
            (Reply::PeerReads { .. } | Reply::Error { .. }, _) => (Vec::new(), Vec::new()),
            (other, _) => return Err(unexpected(other)),
        };
        let mut views = Vec::with_capacity(owners.len());
        for ((owner, generation), pair) in owners.into_iter().zip(fds.chunks_exact(2)) {
            let Ok(mapping) = self.peer_mapping(owner, generation, false) else {
                continue;
            };
            if let Ok(fast) = FastReads::attach(pair[0].as_fd(), pair[1].as_fd()) {
                views.push(peer_reads::PeerView {
                    owner,
                    generation,
                    fast: Arc::new(fast),
                    mapping,
                });
            }
        }
        self.peer_views.replace(views);
        Ok(())
    }

    /// Other nodes' indexes, for a [`shared::SharedClient`] to read.
    pub(crate) fn peer_views(&self) -> Arc<peer_reads::PeerViews> {
        self.peer_views.clone()
    }

    /// The cluster, if the daemon is a cluster node.
    pub fn cluster(&self) -> Option<&ClusterView> {
        self.cluster.as_ref()
    }

    /// The cluster's nodes as the daemon sees them now; `alive` means the
    /// node answers its heartbeats (a partition or a dead node shows as
    /// `false` once a heartbeat has gone unanswered).
    pub fn cluster_nodes(&mut self) -> Result<Vec<PeerRegion>> {
        match self.channel.call(&Request::ClusterInfo)? {
            Reply::ClusterInfo { nodes, .. } => Ok(nodes),
            other => Err(unexpected(other)),
        }
    }

    /// This client's node id (0 for a single store).
    pub fn node(&self) -> u32 {
        self.cluster.as_ref().map_or(0, |c| c.node)
    }

    /// The mapping that holds objects of `node` in generation `generation`
    /// of its region: ours, or the peer's region mapped by path (read-only,
    /// or writable for objects this client allocated there) on first use.
    ///
    /// A descriptor of another generation than the one mapped means the
    /// node restarted: the file now at the path is mapped instead, if it is
    /// that generation. A descriptor of a generation the file no longer
    /// carries (the node restarted since it was made) fails with
    /// `ObjectNotFound`: its object went with the old incarnation, and the
    /// new region's bytes at that offset are someone else's.
    fn peer_mapping(&mut self, node: u32, generation: u64, write: bool) -> Result<Arc<Mapping>> {
        let Some(cluster) = self.cluster.as_mut() else {
            return if node == 0 {
                Ok(self.mapping.clone())
            } else {
                Err(ShoalError::protocol(format!(
                    "daemon sent an object on node {node}, but it is not a cluster node"
                )))
            };
        };
        if node == cluster.node {
            return Ok(self.mapping.clone());
        }
        let index = node as usize;
        let Some(peer) = cluster.nodes.get(index).filter(|p| p.node == node) else {
            return Err(ShoalError::protocol(format!(
                "object on unknown node {node}"
            )));
        };
        if !peer.mapped {
            return Err(if write {
                ShoalError::invalid(format!(
                    "node {node} is not a node whose memory is mapped here"
                ))
            } else {
                ShoalError::protocol(format!(
                    "object on node {node}, whose memory cannot be mapped here"
                ))
            });
        }
        let (path, size) = (Path::new(&peer.path), peer.region_size);
        cluster.peers[index].resolve(node, path, size, generation, write)
    }

    /// Remote allocation: creates objects in cluster node `node`'s memory
    /// (all or none). Write them at [`located_ptr_mut`](Self::located_ptr_mut),
    /// then seal as usual. Where `node`'s region is mapped here they are
    /// written in place; a node reached over the network only has them
    /// written into staging buffers in our own node's region (the
    /// `Located`s say so), whose seal pushes the bytes to `node`.
    pub fn create_on(
        &mut self,
        node: u32,
        objects: &[CreateSpec],
        timeout_ms: u32,
    ) -> Result<Vec<Located>> {
        let me = self.node();
        if node == me {
            let locations = self.create_batch(objects, timeout_ms)?;
            return Ok(locations
                .into_iter()
                .map(|location| Located::local(node, location))
                .collect());
        }
        let request = Request::CreateOn {
            node,
            timeout_ms,
            objects: objects.to_vec(),
        };
        let (generation, offsets) = match self.channel.call(&request)? {
            Reply::Created {
                generation,
                offsets,
            } if offsets.len() == objects.len() => (generation, offsets),
            Reply::Staged { offsets } if offsets.len() == objects.len() => {
                return self.staged(objects, &offsets);
            }
            other => return Err(unexpected(other)),
        };
        let mapping = match self.peer_mapping(node, generation, true) {
            Ok(mapping) => mapping,
            Err(err) => {
                // Allocated in a region we cannot write (the node restarted
                // meanwhile): give the objects back.
                for o in objects {
                    let _ = self.channel.call(&Request::Abort { id: o.id });
                }
                return Err(err);
            }
        };
        let mut out = Vec::with_capacity(objects.len());
        for (&offset, o) in offsets.iter().zip(objects) {
            let location = ObjectLocation {
                offset,
                data_size: o.data_size,
                meta_size: o.meta_size,
            };
            if !mapping.holds(&location) {
                return Err(ShoalError::protocol(format!(
                    "daemon sent a location outside node {node}'s region: {location:?}"
                )));
            }
            let located = Located {
                node,
                generation,
                location,
                invalidate: false,
            };
            if self.noncoherent() {
                self.unsealed.insert(o.id, located);
            }
            out.push(located);
        }
        Ok(out)
    }

    /// The staging buffers (in our own node's region) of objects allocated
    /// on a node reached over the network.
    fn staged(&mut self, objects: &[CreateSpec], offsets: &[u64]) -> Result<Vec<Located>> {
        let me = self.node();
        let mut out = Vec::with_capacity(objects.len());
        for (&offset, o) in offsets.iter().zip(objects) {
            let location = self.check(ObjectLocation {
                offset,
                data_size: o.data_size,
                meta_size: o.meta_size,
            })?;
            let located = Located::local(me, location);
            if self.noncoherent() {
                // Flushed at the seal like any object written here: the
                // daemon sends the bytes from the region.
                self.unsealed.insert(o.id, located);
            }
            out.push(located);
        }
        Ok(out)
    }

    /// Writable address of an object this client allocated (here or remotely).
    pub fn located_ptr_mut(&mut self, located: Located) -> Result<*mut u8> {
        self.address(located, true).map(|(_, address)| address)
    }

    /// Where `located` is in this process, and the mapping that holds it:
    /// for writing (`write`: the simulated cache or a writable mapping) or
    /// for reading (the cache or the mapping the descriptor was checked
    /// against when it was received). The address stays valid while the
    /// `Arc` is held, even after the node restarts and is mapped anew.
    pub fn located_region(
        &mut self,
        located: Located,
        write: bool,
    ) -> Result<(Arc<Mapping>, *mut u8)> {
        self.address(located, write)
    }

    fn address(&mut self, located: Located, write: bool) -> Result<(Arc<Mapping>, *mut u8)> {
        let region = self.peer_mapping(located.node, located.generation, write)?;
        let mapping = match self.simulated_cache(&located, write)? {
            Some(cache) => cache,
            None => region,
        };
        if !mapping.holds(&located.location) {
            return Err(ShoalError::invalid(format!(
                "{located:?} lies outside node {}'s region",
                located.node
            )));
        }
        // SAFETY: inside the mapping (checked just above).
        let address = unsafe { mapping.base().add(located.location.offset as usize) };
        Ok((mapping, address))
    }

    /// Checks a descriptor against the mapping it points into, before
    /// anything reads it, and drops this node's stale lines of the object
    /// when it [needs an invalidate](Self::needs_invalidate).
    fn check_located(&mut self, located: Located) -> Result<Located> {
        let mapping = self.peer_mapping(located.node, located.generation, false)?;
        let l = located.location;
        if !mapping.holds(&l) {
            return Err(ShoalError::protocol(format!(
                "daemon sent a descriptor outside node {}'s region: {l:?}",
                located.node
            )));
        }
        // About to be read: no page faults while the caller does (peers'
        // regions were populated whole when mapped).
        mapping.populate_on_use(l.offset, l.size(), false);
        if !self.needs_invalidate(&located) {
            return Ok(located);
        }
        if cfg!(feature = "broken-skip-owner-invalidate") && located.node == self.node() {
            // The deliberately broken build: the owner node reads a peer's
            // object through whatever its caches held of the range.
            return Ok(located);
        }
        if let Some(cache) = self.simulated_cache(&located, false)? {
            // Simulated invalidate: refill this process's copy of the range.
            Self::copy_range(&mapping, &cache, l.offset, l.size());
            return Ok(located);
        }
        // First read after the seal on this node: drop stale lines.
        // SAFETY: bounds checked above; the range is mapped.
        unsafe {
            shoal_core::coherence::invalidate_range(
                mapping.base().add(l.offset as usize),
                l.size() as usize,
            )
        };
        Ok(located)
    }

    /// Whether this node's caches may hold stale lines of a found object, so
    /// that it must be invalidated before its first read here: only on a
    /// non-coherent fabric, for every object on another node, and for an
    /// object on our own node that a client of another node wrote (the
    /// owner's daemon flags those, [`Located::invalidate`]).
    pub fn needs_invalidate(&self, located: &Located) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| !c.coherent && (located.node != c.node || located.invalidate))
    }

    /// Address of a found object's data in this process, valid while the
    /// object is referenced and its node's region stays mapped (hold
    /// [`located_region`](Self::located_region)'s `Arc` to be sure).
    pub fn located_ptr(&mut self, located: Located) -> Result<*const u8> {
        self.address(located, false)
            .map(|(_, address)| address.cast_const())
    }

    /// The simulated cache copy through which this process writes
    /// (`for_write`) or reads `located` (`None` unless simulating). Reads of
    /// objects that need no invalidate, i.e. objects our own node wrote, go
    /// to the region itself: a node's caches see its own writes.
    fn simulated_cache(
        &mut self,
        located: &Located,
        for_write: bool,
    ) -> Result<Option<Arc<Mapping>>> {
        if !for_write && !self.needs_invalidate(located) {
            return Ok(None);
        }
        let Some(cluster) = self.cluster.as_mut().filter(|c| c.simulated) else {
            return Ok(None);
        };
        let node = located.node;
        let index = node as usize;
        let Some(peer) = cluster.nodes.get(index) else {
            return Err(ShoalError::protocol(format!("unknown node {node}")));
        };
        let size = peer.region_size.max(self.info.region_size);
        let cache = lazily(&mut cluster.peers[index].cache, || Mapping::anonymous(size))?;
        Ok(Some(cache))
    }

    /// Copies `len` bytes at `offset` between two mappings of the same size class.
    fn copy_range(from: &Mapping, to: &Mapping, offset: u64, len: u64) {
        if len == 0 || !from.contains(offset, len) || !to.contains(offset, len) {
            return;
        }
        // SAFETY: both ranges are inside their mappings (checked above); the
        // mappings are distinct, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                from.base().add(offset as usize),
                to.base().add(offset as usize),
                len as usize,
            )
        }
    }

    pub fn info(&self) -> StoreInfo {
        self.info
    }

    /// The client's mapping of the region; buffers point into it.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.mapping
    }

    fn check(&self, location: ObjectLocation) -> Result<ObjectLocation> {
        if self.mapping.holds(&location) {
            // About to be written by us: no page faults while we do.
            self.mapping
                .populate_on_use(location.offset, location.size(), true);
            Ok(location)
        } else {
            Err(ShoalError::protocol(format!(
                "daemon sent a location outside the region: {location:?}"
            )))
        }
    }

    /// Address of an object's data in this process.
    pub fn data_ptr(&self, location: ObjectLocation) -> *mut u8 {
        debug_assert!(self.mapping.holds(&location));
        // SAFETY: locations are bounds-checked against the mapping when received.
        unsafe { self.mapping.base().add(location.offset as usize) }
    }

    /// How many requests this client has sent the daemon through its
    /// socket (what the fast path saves shows here).
    pub fn requests(&self) -> u64 {
        self.channel.requests
    }

    /// Whether this client creates small objects in lent space and seals
    /// them through its write channel.
    pub fn has_fast_writes(&self) -> bool {
        self.writes.is_some()
    }

    /// Creates one object; write its bytes at [`data_ptr`](Self::data_ptr), then seal.
    pub fn create(
        &mut self,
        id: ObjectId,
        data_size: u64,
        meta_size: u32,
        timeout_ms: u32,
    ) -> Result<ObjectLocation> {
        Ok(self.create_batch(
            &[CreateSpec {
                id,
                data_size,
                meta_size,
            }],
            timeout_ms,
        )?[0])
    }

    /// Creates one object that will grow through [`resize`](Self::resize)
    /// (a file being written): the daemon places it with free room after
    /// it where it has some, so several written at once each grow in place.
    /// Always through the socket (an object in lent space cannot be
    /// resized).
    pub fn create_growing(
        &mut self,
        id: ObjectId,
        data_size: u64,
        timeout_ms: u32,
    ) -> Result<ObjectLocation> {
        let spec = CreateSpec {
            id,
            data_size,
            meta_size: 0,
        };
        Ok(self.create_on_socket(&[spec], timeout_ms, true)?[0])
    }

    /// Creates several objects in one round trip, all or none.
    pub fn create_batch(
        &mut self,
        objects: &[CreateSpec],
        timeout_ms: u32,
    ) -> Result<Vec<ObjectLocation>> {
        if let [spec] = objects {
            if let Some(location) = self.create_lent(spec)? {
                return Ok(vec![location]);
            }
        }
        self.create_on_socket(objects, timeout_ms, false)
    }

    /// A `Create` round trip (`growing`: see the protocol's `Create`).
    fn create_on_socket(
        &mut self,
        objects: &[CreateSpec],
        timeout_ms: u32,
        growing: bool,
    ) -> Result<Vec<ObjectLocation>> {
        let request = Request::Create {
            timeout_ms,
            objects: objects.to_vec(),
            growing,
        };
        let reply = match self.channel.call(&request) {
            // Space lent to this client and unused must not be what fills
            // the store: give it back (applied before the next request) and
            // try once more.
            Err(err) if err.kind() == ErrorKind::StoreFull => {
                let gave_back = match self.writes.as_mut() {
                    Some(writes) => writes.give_back_idle()?,
                    None => false,
                };
                if !gave_back {
                    return Err(err);
                }
                self.channel.call(&request)?
            }
            reply => reply?,
        };
        let locations: Vec<ObjectLocation> = match reply {
            Reply::Created { offsets, .. } if offsets.len() == objects.len() => offsets
                .iter()
                .zip(objects)
                .map(|(&offset, o)| {
                    self.check(ObjectLocation {
                        offset,
                        data_size: o.data_size,
                        meta_size: o.meta_size,
                    })
                })
                .collect::<Result<_>>()?,
            other => return Err(unexpected(other)),
        };
        if self.noncoherent() {
            let me = self.node();
            for (o, l) in objects.iter().zip(&locations) {
                self.unsealed.insert(o.id, Located::local(me, *l));
            }
        }
        Ok(locations)
    }

    fn noncoherent(&self) -> bool {
        self.cluster.as_ref().is_some_and(|c| !c.coherent)
    }

    /// Writes back now what [`seal`](Self::seal) would write back for these
    /// objects (every line of each one this client created and has not
    /// sealed, on a non-coherent fabric; nothing on a coherent one) and
    /// returns how many bytes that covered.
    ///
    /// A diagnostic hook: it lets a benchmark time the cache write-back apart
    /// from the seal message. The seal then does not flush these objects
    /// again, so nothing may be written to them in between (such writes could
    /// stay in this CPU's cache past the seal).
    pub fn flush_unsealed(&mut self, ids: &[ObjectId]) -> u64 {
        self.flush_written(ids)
    }

    /// On a non-coherent fabric the writer's dirty lines must reach memory
    /// before the seal (or the free of an aborted object) is announced.
    /// Returns the bytes flushed.
    fn flush_written(&mut self, ids: &[ObjectId]) -> u64 {
        let mut flushed = 0;
        if !self.noncoherent() {
            return flushed;
        }
        for id in ids {
            if let Some(located) = self.unsealed.remove(id) {
                if cfg!(feature = "broken-skip-flush") {
                    // The deliberately broken build: the seal overtakes the data.
                    continue;
                }
                let (node, l) = (located.node, located.location);
                // Not if the node restarted since: the object went with its
                // old region, and the new one must not get these bytes.
                let Ok(mapping) = self.peer_mapping(node, located.generation, true) else {
                    continue;
                };
                flushed += l.size();
                if let Ok(Some(cache)) = self.simulated_cache(&located, true) {
                    // Simulated flush: the written lines reach the region.
                    Self::copy_range(&cache, &mapping, l.offset, l.size());
                    continue;
                }
                // SAFETY: the location was bounds-checked against this mapping at create.
                unsafe {
                    shoal_core::coherence::flush_range(
                        mapping.base().add(l.offset as usize),
                        l.size() as usize,
                    )
                };
            }
        }
        flushed
    }

    /// Seals objects this client created; with `release` also drops the
    /// creator's reference (nothing left to release afterwards).
    pub fn seal(&mut self, ids: &[ObjectId], release: bool) -> Result<()> {
        self.seal_durable(ids, release, None)
    }

    /// [`seal`](Self::seal), answered only once every object reached
    /// `durability` on the tiers below memory (`None`: the node's default).
    pub fn seal_durable(
        &mut self,
        ids: &[ObjectId],
        release: bool,
        durability: Option<Durability>,
    ) -> Result<()> {
        let (lent, rest): (Vec<ObjectId>, Vec<ObjectId>) = match &self.writes {
            Some(writes) => ids.iter().partition(|id| writes.writing(id)),
            None => (Vec::new(), ids.to_vec()),
        };
        if lent.is_empty() {
            self.flush_written(&rest);
            return expect_ok(self.channel.call(&Request::Seal {
                release,
                durability,
                ids: rest,
            })?);
        }
        // As on the socket: an id twice, or one that cannot be sealed, and
        // nothing is (the daemon's part first; the lent part is refused
        // only for a durability the node lacks, checked there too).
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        if let Some(twice) = ids.iter().find(|id| !seen.insert(**id)) {
            return Err(ShoalError::invalid(format!(
                "object {twice} appears twice in one seal"
            )));
        }
        if !rest.is_empty() {
            self.flush_written(&rest);
            expect_ok(self.channel.call(&Request::Seal {
                release,
                durability,
                ids: rest,
            })?)?;
        }
        let writes = self.writes.as_mut().expect("lent ids come from it");
        let outcomes = writes.seal(&lent, release, durability, &Connected(&self.channel.stream))?;
        outcomes
            .into_iter()
            .find_map(Result::err)
            .map_or(Ok(()), Err)
    }

    /// Waits until each object has a durable copy at `level` (objects
    /// sealed at a lower one), up to `timeout_ms` ([`WAIT_FOREVER`]: no
    /// limit). One result per id: `Timeout`, `ObjectNotFound`, or why the
    /// tiers cannot get it there.
    pub fn wait_durable(
        &mut self,
        ids: &[ObjectId],
        level: Durability,
        timeout_ms: i64,
    ) -> Result<Vec<Result<()>>> {
        let reply = self.channel.call(&Request::WaitDurable {
            level,
            timeout_ms,
            ids: ids.to_vec(),
        })?;
        per_id(reply, ids, &format!("durability {level} for object"))
    }

    /// Brings objects into memory from the tiers below (IME's stage-in).
    pub fn stage_in(&mut self, ids: &[ObjectId]) -> Result<Vec<Result<()>>> {
        let reply = self.channel.call(&Request::StageIn { ids: ids.to_vec() })?;
        per_id(reply, ids, "stage-in of object")
    }

    /// Writes objects down to the lowest tier and frees their memory unless
    /// referenced (IME's stage-out).
    pub fn stage_out(&mut self, ids: &[ObjectId]) -> Result<Vec<Result<()>>> {
        let reply = self
            .channel
            .call(&Request::StageOut { ids: ids.to_vec() })?;
        per_id(reply, ids, "stage-out of object")
    }

    /// The node's tiers below memory, their use and the drain's progress.
    pub fn tiers(&mut self) -> Result<TierReport> {
        match self.channel.call(&Request::Tiers)? {
            Reply::Tiers(report) => Ok(report),
            other => Err(unexpected(other)),
        }
    }

    /// The elastic capacity controller's state; with `trace_since`, also
    /// its trace points later than that (time since the daemon started).
    pub fn capacity(
        &mut self,
        trace_since: Option<Duration>,
    ) -> Result<shoal_core::protocol::CapacityReport> {
        match self.channel.call(&Request::Capacity { trace_since })? {
            Reply::Capacity(report) => Ok(report),
            other => Err(unexpected(other)),
        }
    }

    pub fn abort(&mut self, id: ObjectId) -> Result<()> {
        if let Some(writes) = self.writes.as_mut() {
            if writes.abort(&id)? {
                return Ok(());
            }
        }
        self.flush_written(&[id]);
        expect_ok(self.channel.call(&Request::Abort { id })?)
    }

    /// Resizes an unsealed object this client created to `data_size` data
    /// bytes, in place: a shrink frees the tail at once (true); a growth
    /// takes the free space right after the object if the store has it
    /// (true) and otherwise changes nothing (false: create a larger object
    /// and copy). Objects with metadata, created in lent space (small
    /// ones) or on another node are refused (`InvalidArgument`).
    pub fn resize(&mut self, id: ObjectId, data_size: u64) -> Result<bool> {
        if self.writes.as_ref().is_some_and(|w| w.writing(&id)) {
            return Err(ShoalError::invalid(format!(
                "object {id} was created in lent space and cannot be resized"
            )));
        }
        // On a non-coherent fabric a shrink gives the tail to the next
        // create: this cache's dirty lines there must reach memory first.
        let flushed = self
            .unsealed
            .get(&id)
            .copied()
            .filter(|l| self.noncoherent() && data_size < l.location.data_size);
        if flushed.is_some() {
            self.flush_written(&[id]);
        }
        let reply = self.channel.call(&Request::Resize { id, data_size });
        if let Some(located) = flushed {
            self.unsealed.insert(id, located);
        }
        match reply? {
            Reply::Bool(resized) => {
                if resized {
                    // What the flush before the seal covers.
                    if let Some(located) = self.unsealed.get_mut(&id) {
                        located.location.data_size = data_size;
                    }
                }
                Ok(resized)
            }
            other => Err(unexpected(other)),
        }
    }

    /// Gets objects, waiting up to `timeout_ms` (or [`WAIT_FOREVER`]) for the
    /// ones not sealed yet. Found objects are referenced until released.
    /// Each found object's descriptor says which node's region holds it
    /// (this daemon's, or a peer's in a cluster).
    ///
    /// An object whose descriptor names a region its node no longer has
    /// (the node restarted after answering) is not found: it went with the
    /// node's previous incarnation. Its reference is given back.
    pub fn get(&mut self, ids: &[ObjectId], timeout_ms: i64) -> Result<Vec<Option<Located>>> {
        if self.fast.is_none() {
            return self.get_from_daemon(ids, timeout_ms);
        }
        // Published objects without a round trip; the daemon for the rest.
        let me = self.node();
        let mut found = Vec::with_capacity(ids.len());
        let mut missed = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            match self.fast_get(id) {
                Some((location, position)) => {
                    self.fast_held.entry(*id).or_default().push(FastHeld {
                        table: None,
                        position,
                    });
                    found.push(Some(Located::local(me, location)));
                }
                None => {
                    missed.push(i);
                    found.push(None);
                }
            }
        }
        if missed.is_empty() {
            return Ok(found);
        }
        // Other nodes' objects through their indexes (a cluster).
        if self.fast.as_ref().is_some_and(|f| !f.is_closed()) {
            self.refresh_peer_views()?;
            missed.retain(|&i| {
                let Some((view, hit)) = self.peer_views.acquire(&ids[i]) else {
                    return true;
                };
                self.fast_held.entry(ids[i]).or_default().push(FastHeld {
                    table: Some(Arc::clone(&view.fast)),
                    position: hit.position,
                });
                found[i] = Some(view.located(&hit));
                false
            });
            if missed.is_empty() {
                return Ok(found);
            }
        }
        let asked: Vec<ObjectId> = missed.iter().map(|&i| ids[i]).collect();
        let answers = self.get_from_daemon(&asked, timeout_ms)?;
        let mut noted = u32::MAX;
        for (i, answer) in missed.into_iter().zip(answers) {
            if let Some(l) = answer.filter(|l| l.node != me && l.node != noted) {
                noted = l.node;
                self.peer_views.found_at(l.node);
            }
            found[i] = answer;
        }
        Ok(found)
    }

    fn get_from_daemon(
        &mut self,
        ids: &[ObjectId],
        timeout_ms: i64,
    ) -> Result<Vec<Option<Located>>> {
        let objects = match self.channel.call(&Request::Get {
            timeout_ms,
            ids: ids.to_vec(),
        })? {
            Reply::Objects { objects } if objects.len() == ids.len() => objects,
            other => return Err(unexpected(other)),
        };
        let mut gone = Vec::new();
        let found = objects
            .into_iter()
            .zip(ids)
            .map(
                |(o, id)| match o.map(|l| self.check_located(l)).transpose() {
                    Err(err) if err.kind() == ErrorKind::ObjectNotFound => {
                        gone.push(*id);
                        Ok(None)
                    }
                    other => other,
                },
            )
            .collect();
        self.release(&gone)?;
        found
    }

    /// Drops references taken by get or create. One-way: does not wait.
    pub fn release(&mut self, ids: &[ObjectId]) -> Result<()> {
        self.release_deferred(ids);
        self.send_deferred()
    }

    /// Queues the release of references: sent with the next request (one
    /// write, one wake-up of the daemon for both) or by
    /// [`send_deferred`](Self::send_deferred), whichever comes first. The
    /// daemon sees them before that next request.
    pub fn release_deferred(&mut self, ids: &[ObjectId]) {
        if ids.is_empty() {
            return;
        }
        let mut to_daemon = Vec::new();
        for id in ids {
            // A reference taken through the fast path is given back there.
            let held = self.fast_held.get_mut(id).and_then(|held| held.pop());
            let table = match &held {
                Some(FastHeld { table: Some(t), .. }) => Some(t),
                Some(FastHeld { table: None, .. }) => self.fast.as_ref(),
                None => None,
            };
            match (held.as_ref(), table) {
                (Some(held), Some(table)) => {
                    table.release(held.position);
                    if self.fast_held.get(id).is_some_and(Vec::is_empty) {
                        self.fast_held.remove(id);
                    }
                }
                _ => to_daemon.push(*id),
            }
        }
        if to_daemon.is_empty() {
            return;
        }
        // Through the write channel when there is one: no system call, and
        // the daemon applies it before this client's next request.
        let sent = self
            .writes
            .as_mut()
            .is_some_and(|w| w.release(&to_daemon).is_ok());
        if !sent {
            self.channel.queue(&Request::Release { ids: to_daemon });
        }
    }

    /// Sends what [`release_deferred`](Self::release_deferred) queued, now.
    pub fn send_deferred(&mut self) -> Result<()> {
        self.channel.flush()
    }

    /// Deletes objects; one result per id.
    pub fn delete(&mut self, ids: &[ObjectId]) -> Result<Vec<Result<()>>> {
        let reply = self.channel.call(&Request::Delete { ids: ids.to_vec() })?;
        per_id(reply, ids, "delete of object")
    }

    pub fn contains(&mut self, id: ObjectId) -> Result<bool> {
        if self.fast.as_ref().is_some_and(|f| f.published(&id)) {
            return Ok(true);
        }
        match self.channel.call(&Request::Contains { id })? {
            Reply::Bool(b) => Ok(b),
            other => Err(unexpected(other)),
        }
    }

    pub fn list(&mut self) -> Result<Vec<ObjectInfo>> {
        match self.channel.call(&Request::List)? {
            Reply::List { objects } => Ok(objects),
            other => Err(unexpected(other)),
        }
    }

    pub fn stats(&mut self) -> Result<StoreStats> {
        match self.channel.call(&Request::Stats)? {
            Reply::Stats(stats) => Ok(stats),
            other => Err(unexpected(other)),
        }
    }

    /// Evicts unreferenced objects until `bytes` are freed; returns bytes freed.
    pub fn evict(&mut self, bytes: u64) -> Result<u64> {
        match self.channel.call(&Request::Evict { bytes })? {
            Reply::Evicted { bytes } => Ok(bytes),
            other => Err(unexpected(other)),
        }
    }

    /// Hangs up; the daemon releases every reference this client held.
    pub fn close(&mut self) {
        let _ = self.channel.stream.shutdown(std::net::Shutdown::Both);
        // Nothing more without the daemon: no creates in lent space, no
        // answers from the index.
        self.writes = None;
        if let Some(fast) = &self.fast {
            fast.close();
        }
        self.peer_views.close();
    }

    /// Copies `data` and `meta` into a created object.
    pub fn write(&mut self, location: ObjectLocation, data: &[u8], meta: &[u8]) -> Result<()> {
        if data.len() as u64 != location.data_size || meta.len() as u64 != location.meta_size as u64
        {
            return Err(ShoalError::invalid(
                "write sizes differ from the created object's",
            ));
        }
        let dst = self.located_ptr_mut(Located::local(self.node(), location))?;
        // SAFETY: the object's range is inside our mapping (checked on
        // receipt) and belongs to us until sealed; sources are ordinary memory.
        unsafe {
            shoal_core::copy::copy_to_shared(dst, data);
            std::ptr::copy_nonoverlapping(meta.as_ptr(), dst.add(data.len()), meta.len());
        }
        Ok(())
    }

    /// create + write + seal of many objects in two round trips; no
    /// references are left behind.
    pub fn put_batch(
        &mut self,
        objects: &[(ObjectId, &[u8], &[u8])],
        timeout_ms: u32,
    ) -> Result<()> {
        let specs: Vec<_> = objects
            .iter()
            .map(|(id, data, meta)| CreateSpec {
                id: *id,
                data_size: data.len() as u64,
                meta_size: meta.len() as u32,
            })
            .collect();
        let locations = self.create_batch(&specs, timeout_ms)?;
        for ((_, data, meta), location) in objects.iter().zip(&locations) {
            self.write(*location, data, meta)?;
        }
        let ids: Vec<_> = objects.iter().map(|(id, _, _)| *id).collect();
        self.seal(&ids, true)
    }

    pub fn put(&mut self, id: ObjectId, data: &[u8], meta: &[u8]) -> Result<()> {
        self.put_batch(&[(id, data, meta)], 0)
    }

    /// Gives object `id` a name (the POSIX view): bound when the object is
    /// sealed if it is still being written, at once otherwise. A name bound
    /// before moves to it and its old object is deleted.
    pub fn name(&mut self, id: ObjectId, name: &str) -> Result<()> {
        shoal_core::names::check(name)?;
        expect_ok(self.channel.call(&Request::Name {
            id,
            name: name.to_owned(),
        })?)
    }

    /// The object bound to `name`, its sizes and time.
    pub fn resolve(&mut self, name: &str) -> Result<NameEntry> {
        match self.channel.call(&Request::Resolve {
            name: name.to_owned(),
        })? {
            Reply::Named(entry) => Ok(entry),
            other => Err(unexpected(other)),
        }
    }

    /// Every name under directory `prefix` (`""`: all), sorted.
    pub fn list_names(&mut self, prefix: &str) -> Result<Vec<NameEntry>> {
        match self.channel.call(&Request::ListNames {
            prefix: prefix.to_owned(),
        })? {
            Reply::Names { entries } => Ok(entries),
            other => Err(unexpected(other)),
        }
    }

    /// Moves a name, or a whole directory of names.
    pub fn rename(&mut self, from: &str, to: &str) -> Result<()> {
        expect_ok(self.channel.call(&Request::Rename {
            from: from.to_owned(),
            to: to.to_owned(),
        })?)
    }

    /// Removes a name and deletes its object.
    pub fn unlink(&mut self, name: &str) -> Result<()> {
        expect_ok(self.channel.call(&Request::Unlink {
            name: name.to_owned(),
        })?)
    }

    /// Creates an object under a new random id; an id whose home node
    /// cannot be reached (`HomeUnavailable`) is swapped for another, so the
    /// create never waits on a node that will hold nothing of the object.
    pub fn create_fresh(
        &mut self,
        data_size: u64,
        meta_size: u32,
        timeout_ms: u32,
    ) -> Result<(ObjectId, ObjectLocation)> {
        let mut tries = FRESH_ID_TRIES;
        loop {
            let id = ObjectId::random();
            match self.create(id, data_size, meta_size, timeout_ms) {
                Err(err) if err.kind() == ErrorKind::HomeUnavailable && tries > 1 => tries -= 1,
                created => return created.map(|location| (id, location)),
            }
        }
    }

    /// Sets the modification time `name` shows (ms since the epoch), as
    /// utimens does on the mount; the next binding of the name (a rewrite)
    /// sets it to that seal's time.
    pub fn set_mtime(&mut self, name: &str, mtime_ms: u64) -> Result<()> {
        expect_ok(self.channel.call(&Request::SetMtime {
            name: name.to_owned(),
            mtime_ms,
        })?)
    }

    /// Puts `data` + `meta` as a new object under `name` (a fresh id);
    /// `durability`: as for [`seal_durable`](Self::seal_durable). The name
    /// switches to the new object at its seal.
    pub fn put_named(
        &mut self,
        name: &str,
        data: &[u8],
        meta: &[u8],
        durability: Option<Durability>,
        timeout_ms: u32,
    ) -> Result<ObjectId> {
        shoal_core::names::check(name)?;
        let (id, location) = self.create_fresh(data.len() as u64, meta.len() as u32, timeout_ms)?;
        let written = self
            .write(location, data, meta)
            .and_then(|()| self.name(id, name));
        if let Err(err) = written {
            let _ = self.abort(id);
            return Err(err);
        }
        self.seal_durable(&[id], true, durability)?;
        Ok(id)
    }

    /// Gets the object bound to `name` (referenced until released). A name
    /// rebound between the lookup and the get is looked up again.
    pub fn get_named(&mut self, name: &str, timeout_ms: i64) -> Result<(NameEntry, Located)> {
        for _ in 0..GET_NAMED_TRIES {
            let entry = self.resolve(name)?;
            if let Some(located) = self.get(&[entry.id], timeout_ms)?[0] {
                return Ok((entry, located));
            }
        }
        Err(ShoalError::new(
            ErrorKind::ObjectNotFound,
            format!("name {name:?} kept moving to new objects"),
        ))
    }

    /// Reads an object's bytes (a view into shared memory valid while referenced).
    ///
    /// # Safety
    /// The caller must hold a reference to the object for the slice's lifetime.
    pub unsafe fn data(&self, location: ObjectLocation) -> &[u8] {
        // SAFETY: see the function's contract; range checked on receipt.
        unsafe { std::slice::from_raw_parts(self.data_ptr(location), location.data_size as usize) }
    }
}

/// A stream of seal and removal notifications from a daemon.
pub struct Subscription {
    channel: Channel,
}

impl Subscription {
    pub fn connect(socket: impl AsRef<Path>) -> Result<Self> {
        let (mut channel, _, _fd) = Channel::handshake(socket.as_ref())?;
        expect_ok(channel.call(&Request::Subscribe)?)?;
        Ok(Self { channel })
    }

    /// A second handle on the subscription's socket: shutting it down ends a
    /// `next` blocked in another thread (it returns `Disconnected`).
    pub fn closer(&self) -> Result<UnixStream> {
        Ok(self.channel.stream.try_clone()?)
    }

    /// The next notification, waiting at most `timeout` (`None`: forever).
    /// `Ok(None)` on timeout.
    pub fn next(&mut self, timeout: Option<Duration>) -> Result<Option<ObjectEvent>> {
        if self.channel.pending().len() < FRAME_HEADER_LEN {
            self.channel.stream.set_read_timeout(timeout)?;
            let result = self.channel.fill(FRAME_HEADER_LEN);
            self.channel.stream.set_read_timeout(None)?;
            match result {
                Err(err) if err.kind() == ErrorKind::Io && self.channel.pending().is_empty() => {
                    return Ok(None)
                }
                other => other?,
            }
        }
        match self.channel.recv()? {
            Reply::Notification(n) => Ok(Some(n)),
            other => Err(unexpected(other)),
        }
    }
}

/// A descriptor of a region generation the node's file no longer carries.
fn stale_descriptor(node: u32, generation: u64) -> ShoalError {
    ShoalError::new(
        ErrorKind::ObjectNotFound,
        format!(
            "object on node {node}'s region of generation {generation}, which is gone \
             (the node restarted)"
        ),
    )
}

/// The mapping in `slot`, made by `map` on first use.
fn lazily(
    slot: &mut Option<Arc<Mapping>>,
    map: impl FnOnce() -> Result<Mapping>,
) -> Result<Arc<Mapping>> {
    if let Some(mapping) = slot {
        return Ok(mapping.clone());
    }
    let mapping = Arc::new(map()?);
    *slot = Some(mapping.clone());
    Ok(mapping)
}

/// How often `get_named` looks a name up again when its object went
/// between the lookup and the get (a concurrent rewrite).
const GET_NAMED_TRIES: usize = 8;

/// Random ids a create that chooses its own id tries before giving up: with
/// one node of n unreachable each try fails with probability 1/n (3^-32 for
/// all 32 at n = 3).
const FRESH_ID_TRIES: usize = 32;

fn expect_ok(reply: Reply) -> Result<()> {
    match reply {
        Reply::Ok => Ok(()),
        other => Err(unexpected(other)),
    }
}

fn unexpected(reply: Reply) -> ShoalError {
    ShoalError::protocol(format!("unexpected reply {reply:?}"))
}

/// One result per id from a `Statuses` reply.
fn per_id(reply: Reply, ids: &[ObjectId], what: &str) -> Result<Vec<Result<()>>> {
    match reply {
        Reply::Statuses { errors } if errors.len() == ids.len() => Ok(errors
            .into_iter()
            .zip(ids)
            .map(|(e, id)| match e {
                None => Ok(()),
                Some(ErrorKind::ObjectNotFound) => Err(ShoalError::not_found(id)),
                Some(kind) => Err(ShoalError::new(kind, format!("{what} {id}: {kind:?}"))),
            })
            .collect()),
        other => Err(unexpected(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_core::region::Region;

    const LEN: u64 = 1 << 16;

    fn byte(mapping: &Mapping) -> u8 {
        // SAFETY: offset 100 is inside every 64 KiB mapping of these tests.
        unsafe { *mapping.base().add(100) }
    }

    #[test]
    fn a_restarted_peer_is_mapped_anew_and_stale_descriptors_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n1");
        let first = Region::create_shared(&path, LEN, 7).unwrap();
        // SAFETY: inside the region.
        unsafe { *first.base().add(100) = 1 };
        let mut maps = PeerMaps::default();
        let old = maps.resolve(1, &path, LEN, 7, false).unwrap();
        assert_eq!((old.generation(), byte(&old)), (7, 1));
        let old_writable = maps.resolve(1, &path, LEN, 7, true).unwrap();
        maps.cache = Some(Arc::new(Mapping::anonymous(LEN).unwrap()));
        assert!(Arc::ptr_eq(
            &maps.resolve(1, &path, LEN, 7, false).unwrap(),
            &old
        ));
        // A descriptor of a generation the file never had is refused, and
        // nothing is remapped for it.
        let err = maps.resolve(1, &path, LEN, 8, false).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
        assert!(Arc::ptr_eq(
            &maps.resolve(1, &path, LEN, 7, false).unwrap(),
            &old
        ));

        // The node dies (its region is not dropped) and restarts: new file.
        std::mem::forget(first);
        let second = Region::create_shared(&path, LEN, 9).unwrap();
        // SAFETY: inside the region.
        unsafe { *second.base().add(100) = 2 };
        // A descriptor the old incarnation made reads the old file only.
        assert!(Arc::ptr_eq(
            &maps.resolve(1, &path, LEN, 7, false).unwrap(),
            &old
        ));
        // The new generation's descriptor remaps; everything of the old
        // region is dropped here (buffers keep their own Arc).
        let new = maps.resolve(1, &path, LEN, 9, false).unwrap();
        assert_eq!((new.generation(), byte(&new)), (9, 2));
        assert_eq!(maps.generation, 9);
        assert!(maps.writable.is_none() && maps.cache.is_none());
        assert_eq!(byte(&old), 1, "the old mapping stays valid while held");
        // From now on the old generation's descriptors are refused.
        let err = maps.resolve(1, &path, LEN, 7, false).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
        let err = maps.resolve(1, &path, LEN, 7, true).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
        assert_eq!(
            maps.resolve(1, &path, LEN, 9, true).unwrap().generation(),
            9
        );
        drop(old_writable);

        // A descriptor newer than the file we see (made after yet another
        // restart we have not seen the file of) is refused, never guessed.
        drop(second);
        let err = maps.resolve(1, &path, LEN, 11, false).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::ObjectNotFound);
    }
}
