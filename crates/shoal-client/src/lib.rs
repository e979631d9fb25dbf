//! The Rust client of a local shoal daemon.
//!
//! A client connects to the daemon's Unix socket, receives the region's file
//! descriptor once and maps it. From then on objects are (offset, size) pairs
//! into that mapping: a get is a lookup, never a copy. The client is
//! synchronous (one request in flight); batch calls exist so that many
//! objects cost one round trip.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::fd_passing::recv_with_fd;
use shoal_core::protocol::{
    CreateSpec, FrameHeader, Notification, Reply, Request, FRAME_HEADER_LEN, PROTOCOL_VERSION,
};
pub use shoal_core::protocol::{Located, PeerRegion};
use shoal_core::region::Mapping;
use shoal_core::store::{ObjectInfo, ObjectLocation, StoreStats};
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
    /// Mapped lazily, on the first object found on that node.
    mappings: Vec<Option<Arc<Mapping>>>,
    /// Writable mappings, for objects this client allocates on other nodes.
    writable: Vec<Option<Arc<Mapping>>>,
    /// Simulated non-coherent fabric: this process's private "cache" copy of
    /// each node's region. Writes of new objects go to the copy and reach the
    /// region only when flushed; reads of other nodes' objects come from the
    /// copy, refreshed only by invalidate. A missing flush or invalidate shows
    /// as wrong bytes, as it would on the hardware.
    pub simulated: bool,
    caches: Vec<Option<Arc<Mapping>>>,
}

/// A framed connection: requests out, replies in.
struct Channel {
    stream: UnixStream,
    input: Vec<u8>,
    output: Vec<u8>,
}

impl Channel {
    fn send(&mut self, request: &Request) -> Result<()> {
        self.output.clear();
        request.encode(&mut self.output);
        self.stream.write_all(&self.output)?;
        Ok(())
    }

    fn fill(&mut self, need: usize) -> Result<()> {
        while self.input.len() < need {
            let start = self.input.len();
            self.input.resize(start.max(need).max(start + 64 * 1024), 0);
            let n = self.stream.read(&mut self.input[start..]);
            let n = match n {
                Ok(n) => n,
                Err(err) => {
                    self.input.truncate(start);
                    return Err(err.into());
                }
            };
            self.input.truncate(start + n);
            if n == 0 {
                return Err(ShoalError::new(
                    ErrorKind::Disconnected,
                    "the daemon closed the connection",
                ));
            }
        }
        Ok(())
    }

    fn recv(&mut self) -> Result<Reply> {
        self.fill(FRAME_HEADER_LEN)?;
        let header = FrameHeader::parse(&self.input)?.expect("header bytes present");
        let end = FRAME_HEADER_LEN + header.len as usize;
        self.fill(end)?;
        let reply = Reply::decode(header, &self.input[FRAME_HEADER_LEN..end]);
        self.input.drain(..end);
        reply
    }

    /// Sends a request and returns its reply, turning `Error` replies into `Err`.
    fn call(&mut self, request: &Request) -> Result<Reply> {
        self.send(request)?;
        match self.recv()? {
            Reply::Error { kind, message } => Err(ShoalError::new(kind, message)),
            reply => Ok(reply),
        }
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
        let mut channel = Channel {
            stream,
            input: Vec::with_capacity(64 * 1024),
            output: Vec::new(),
        };
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
        channel.input.extend_from_slice(&first[..n]);
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

pub struct Client {
    channel: Channel,
    mapping: Arc<Mapping>,
    info: StoreInfo,
    cluster: Option<ClusterView>,
    /// Objects created here (node, location) and not sealed yet, flushed at
    /// seal on a non-coherent fabric.
    unsealed: std::collections::HashMap<ObjectId, (u32, ObjectLocation)>,
}

impl Client {
    /// Connects to the daemon at `socket` and maps its region.
    pub fn connect(socket: impl AsRef<Path>) -> Result<Self> {
        let (channel, info, fd) = Channel::handshake(socket.as_ref())?;
        let mapping = Arc::new(Mapping::map(fd.as_fd(), info.region_size, info.resident)?);
        let mut client = Self {
            channel,
            mapping,
            info,
            cluster: None,
            unsealed: std::collections::HashMap::new(),
        };
        if info.clustered {
            match client.channel.call(&Request::ClusterInfo)? {
                Reply::ClusterInfo {
                    node,
                    coherent,
                    simulated,
                    nodes,
                } => {
                    let mappings = vec![None; nodes.len()];
                    client.cluster = Some(ClusterView {
                        node,
                        coherent,
                        simulated,
                        writable: mappings.clone(),
                        caches: mappings.clone(),
                        nodes,
                        mappings,
                    });
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(client)
    }

    /// The cluster, if the daemon is a cluster node.
    pub fn cluster(&self) -> Option<&ClusterView> {
        self.cluster.as_ref()
    }

    /// This client's node id (0 for a single store).
    pub fn node(&self) -> u32 {
        self.cluster.as_ref().map_or(0, |c| c.node)
    }

    /// The mapping that holds objects of `node`: ours, or the peer's region
    /// (mapped read-only by path on first use).
    pub fn mapping_of(&mut self, node: u32) -> Result<Arc<Mapping>> {
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
            return Err(ShoalError::protocol(format!(
                "object on node {node}, whose memory cannot be mapped here"
            )));
        }
        let (path, size) = (peer.path.clone(), peer.region_size);
        lazily(&mut cluster.mappings[index], || {
            Mapping::map_path_readonly(Path::new(&path), size)
        })
    }

    /// A writable mapping of `node`'s region (ours, or a peer's by path).
    fn writable_mapping_of(&mut self, node: u32) -> Result<Arc<Mapping>> {
        let Some(cluster) = self.cluster.as_mut() else {
            return self.mapping_of(node);
        };
        if node == cluster.node {
            return Ok(self.mapping.clone());
        }
        let index = node as usize;
        let Some(peer) = cluster
            .nodes
            .get(index)
            .filter(|p| p.node == node && p.mapped)
        else {
            return Err(ShoalError::invalid(format!(
                "node {node} is not a node whose memory is mapped here"
            )));
        };
        let (path, size) = (peer.path.clone(), peer.region_size);
        lazily(&mut cluster.writable[index], || {
            Mapping::map_path_writable(Path::new(&path), size)
        })
    }

    /// Remote allocation: creates objects in cluster node `node`'s region
    /// (all or none). Write them at [`located_ptr_mut`](Self::located_ptr_mut),
    /// then seal as usual.
    pub fn create_on(
        &mut self,
        node: u32,
        objects: &[CreateSpec],
        timeout_ms: u32,
    ) -> Result<Vec<Located>> {
        if node == self.node() {
            let locations = self.create_batch(objects, timeout_ms)?;
            return Ok(locations
                .into_iter()
                .map(|location| Located { node, location })
                .collect());
        }
        let mapping = self.writable_mapping_of(node)?;
        let request = Request::CreateOn {
            node,
            timeout_ms,
            objects: objects.to_vec(),
        };
        let offsets = match self.channel.call(&request)? {
            Reply::Created { offsets } if offsets.len() == objects.len() => offsets,
            other => return Err(unexpected(other)),
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
            if self.noncoherent() {
                self.unsealed.insert(o.id, (node, location));
            }
            out.push(Located { node, location });
        }
        Ok(out)
    }

    /// Writable address of an object this client allocated (here or remotely).
    pub fn located_ptr_mut(&mut self, located: Located) -> Result<*mut u8> {
        self.address(located, true)
    }

    /// Where `located` is in this process: for writing (the simulated cache
    /// or a writable mapping) or for reading (the cache or the mapping the
    /// descriptor was checked against when it was received).
    fn address(&mut self, located: Located, write: bool) -> Result<*mut u8> {
        let mapping = match self.simulated_cache(located.node, write)? {
            Some(cache) => cache,
            None if write => self.writable_mapping_of(located.node)?,
            None => self.mapping_of(located.node)?,
        };
        if !mapping.holds(&located.location) {
            return Err(ShoalError::invalid(format!(
                "{located:?} lies outside node {}'s region",
                located.node
            )));
        }
        // SAFETY: inside the mapping (checked just above).
        Ok(unsafe { mapping.base().add(located.location.offset as usize) })
    }

    /// Checks a descriptor against the mapping it points into, before
    /// anything reads it; returns the object's address.
    fn check_located(&mut self, located: Located) -> Result<Located> {
        let mapping = self.mapping_of(located.node)?;
        let l = located.location;
        if !mapping.holds(&l) {
            return Err(ShoalError::protocol(format!(
                "daemon sent a descriptor outside node {}'s region: {l:?}",
                located.node
            )));
        }
        if located.node != self.node() {
            if let Some(cache) = self.simulated_cache(located.node, false)? {
                // Simulated invalidate: refill this process's copy of the range.
                Self::copy_range(&mapping, &cache, l.offset, l.size());
                return Ok(located);
            }
        }
        if let Some(cluster) = &self.cluster {
            if !cluster.coherent && located.node != cluster.node {
                // First read after the seal on this node: drop stale lines.
                // SAFETY: bounds checked above; the range is mapped.
                unsafe {
                    shoal_core::coherence::invalidate_range(
                        mapping.base().add(l.offset as usize),
                        l.size() as usize,
                    )
                };
            }
        }
        Ok(located)
    }

    /// Address of a found object's data in this process.
    pub fn located_ptr(&mut self, located: Located) -> Result<*const u8> {
        self.address(located, false).map(<*mut u8>::cast_const)
    }

    /// The simulated cache copy through which this process sees `node`'s
    /// region (`None` unless simulating). Reads of our own node's objects go
    /// to the region itself (`for_write` false): a node reads its own memory
    /// coherently.
    fn simulated_cache(&mut self, node: u32, for_write: bool) -> Result<Option<Arc<Mapping>>> {
        let Some(cluster) = self.cluster.as_mut().filter(|c| c.simulated) else {
            return Ok(None);
        };
        if node == cluster.node && !for_write {
            return Ok(None);
        }
        let index = node as usize;
        let Some(peer) = cluster.nodes.get(index) else {
            return Err(ShoalError::protocol(format!("unknown node {node}")));
        };
        if let Some(cache) = &cluster.caches[index] {
            return Ok(Some(cache.clone()));
        }
        let cache = Arc::new(Mapping::anonymous(
            peer.region_size.max(self.info.region_size),
        )?);
        cluster.caches[index] = Some(cache.clone());
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

    /// Creates several objects in one round trip, all or none.
    pub fn create_batch(
        &mut self,
        objects: &[CreateSpec],
        timeout_ms: u32,
    ) -> Result<Vec<ObjectLocation>> {
        let request = Request::Create {
            timeout_ms,
            objects: objects.to_vec(),
        };
        let locations: Vec<ObjectLocation> = match self.channel.call(&request)? {
            Reply::Created { offsets } if offsets.len() == objects.len() => offsets
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
                self.unsealed.insert(o.id, (me, *l));
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
            if let Some((node, l)) = self.unsealed.remove(id) {
                if cfg!(feature = "broken-skip-flush") {
                    // The deliberately broken build: the seal overtakes the data.
                    continue;
                }
                let Ok(mapping) = self.writable_mapping_of(node) else {
                    continue;
                };
                flushed += l.size();
                if let Ok(Some(cache)) = self.simulated_cache(node, true) {
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
        self.flush_written(ids);
        expect_ok(self.channel.call(&Request::Seal {
            release,
            ids: ids.to_vec(),
        })?)
    }

    pub fn abort(&mut self, id: ObjectId) -> Result<()> {
        self.flush_written(&[id]);
        expect_ok(self.channel.call(&Request::Abort { id })?)
    }

    /// Gets objects, waiting up to `timeout_ms` (or [`WAIT_FOREVER`]) for the
    /// ones not sealed yet. Found objects are referenced until released.
    /// Each found object's descriptor says which node's region holds it
    /// (this daemon's, or a peer's in a cluster).
    pub fn get(&mut self, ids: &[ObjectId], timeout_ms: i64) -> Result<Vec<Option<Located>>> {
        match self.channel.call(&Request::Get {
            timeout_ms,
            ids: ids.to_vec(),
        })? {
            Reply::Objects { objects } if objects.len() == ids.len() => objects
                .into_iter()
                .map(|o| o.map(|l| self.check_located(l)).transpose())
                .collect(),
            other => Err(unexpected(other)),
        }
    }

    /// Drops references taken by get or create. One-way: does not wait.
    pub fn release(&mut self, ids: &[ObjectId]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.channel.send(&Request::Release { ids: ids.to_vec() })
    }

    /// Deletes objects; one result per id.
    pub fn delete(&mut self, ids: &[ObjectId]) -> Result<Vec<Result<()>>> {
        match self.channel.call(&Request::Delete { ids: ids.to_vec() })? {
            Reply::Statuses { errors } if errors.len() == ids.len() => Ok(errors
                .into_iter()
                .zip(ids)
                .map(|(e, id)| match e {
                    None => Ok(()),
                    Some(ErrorKind::ObjectNotFound) => Err(ShoalError::not_found(id)),
                    Some(kind) => Err(ShoalError::new(
                        kind,
                        format!("delete of object {id} refused"),
                    )),
                })
                .collect()),
            other => Err(unexpected(other)),
        }
    }

    pub fn contains(&mut self, id: ObjectId) -> Result<bool> {
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
    }

    /// Copies `data` and `meta` into a created object.
    pub fn write(&mut self, location: ObjectLocation, data: &[u8], meta: &[u8]) -> Result<()> {
        if data.len() as u64 != location.data_size || meta.len() as u64 != location.meta_size as u64
        {
            return Err(ShoalError::invalid(
                "write sizes differ from the created object's",
            ));
        }
        let node = self.node();
        let dst = self.located_ptr_mut(Located { node, location })?;
        // SAFETY: the object's range is inside our mapping (checked on
        // receipt) and belongs to us until sealed; sources are ordinary memory.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
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
    pub fn next(&mut self, timeout: Option<Duration>) -> Result<Option<Notification>> {
        if self.channel.input.len() < FRAME_HEADER_LEN {
            self.channel.stream.set_read_timeout(timeout)?;
            let result = self.channel.fill(FRAME_HEADER_LEN);
            self.channel.stream.set_read_timeout(None)?;
            match result {
                Err(err) if err.kind() == ErrorKind::Io && self.channel.input.is_empty() => {
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

fn expect_ok(reply: Reply) -> Result<()> {
    match reply {
        Reply::Ok => Ok(()),
        other => Err(unexpected(other)),
    }
}

fn unexpected(reply: Reply) -> ShoalError {
    ShoalError::protocol(format!("unexpected reply {reply:?}"))
}
