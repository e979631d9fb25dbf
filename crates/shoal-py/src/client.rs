//! `Client` and `Subscription` for Python.
//!
//! The connection is a `shoal_client::shared::SharedClient` and every
//! blocking call releases the GIL. Buffers release their object when Python
//! frees them, which can happen on any thread at any time (even inside
//! another call on this client); the shared client queues those releases and
//! sends them coalesced, never blocking a drop on the connection.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use shoal_client::shared::{ObjectRef, SharedClient};
use shoal_client::{Client as RustClient, Located, StoreInfo, Subscription as RustSubscription};
use shoal_core::durability::Durability;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::event::ObjectEvent;
use shoal_core::location::ObjectLocation;
use shoal_core::protocol::CreateSpec;
use shoal_core::protocol::PsiAction;
use shoal_core::region::Mapping;
use shoal_core::ObjectId;

use crate::buffer::Buffer;
use crate::errors::IntoPyResult;
use crate::ids::{PyId, PyIds};

/// Poisoning only means another thread panicked holding the lock.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One `list()` row: (id, data_size, metadata_size, sealed, refs).
type ListRow<'py> = (Bound<'py, PyBytes>, u64, u32, bool, u32, bool, u8);
/// A name's row: (name, id, data_size, metadata_size, mtime_ms).
type NameRow<'py> = (String, Bound<'py, PyBytes>, u64, u32, u64);
/// One notification: (id, kind, data_size, metadata_size).
type NotificationRow<'py> = (Bound<'py, PyBytes>, &'static str, u64, u32);

#[pyclass(module = "shoal._internal", frozen)]
pub struct Client {
    shared: SharedClient,
    mapping: Arc<Mapping>,
    info: StoreInfo,
    /// This client's node in a cluster (0 for a single store).
    info_node: u32,
    socket: String,
}

impl Client {
    fn buffer(&self, id: ObjectId, location: ObjectLocation, writable: bool) -> Buffer {
        // SAFETY: locations are bounds-checked against the mapping by the Rust client.
        let address = unsafe { self.mapping.base().add(location.offset as usize) };
        self.buffer_at(id, address, location, writable, None)
    }

    /// A read-only buffer over an object in our region, holding `reference`.
    fn buffer_from(&self, reference: Arc<ObjectRef>, location: ObjectLocation) -> Buffer {
        Self::read_only_buffer(&self.mapping, reference, location)
    }

    /// A read-only buffer over an object in the region `reference` keeps
    /// mapped (another node's), holding `reference`.
    fn buffer_in_region(&self, reference: Arc<ObjectRef>, location: ObjectLocation) -> Buffer {
        let region = reference
            .region()
            .expect("a peer reference keeps its region")
            .clone();
        Self::read_only_buffer(&region, reference, location)
    }

    fn read_only_buffer(
        mapping: &Mapping,
        reference: Arc<ObjectRef>,
        location: ObjectLocation,
    ) -> Buffer {
        // SAFETY: the fast path checked the location against that mapping,
        // which `reference` (or the client) keeps mapped.
        let address = unsafe { mapping.base().add(location.offset as usize) };
        Buffer::new(
            reference,
            address,
            location.data_size as usize,
            location.meta_size as usize,
            false,
        )
    }

    /// A buffer over an object at `address` (in our region, or in `region`:
    /// a peer's region or a simulated cache of it, kept mapped by the buffer).
    fn buffer_at(
        &self,
        id: ObjectId,
        address: *mut u8,
        location: ObjectLocation,
        writable: bool,
        region: Option<Arc<Mapping>>,
    ) -> Buffer {
        let reference = if writable {
            self.shared.creator_reference(id, region)
        } else {
            self.shared.reference(id, region)
        };
        Buffer::new(
            reference,
            address,
            location.data_size as usize,
            location.meta_size as usize,
            writable,
        )
    }
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (socket, fast_path=true))]
    fn new(py: Python<'_>, socket: String, fast_path: bool) -> PyResult<Self> {
        let client = py
            .detach(|| {
                if fast_path {
                    RustClient::connect(&socket)
                } else {
                    RustClient::connect_socket_only(&socket)
                }
            })
            .py()?;
        let mapping = client.mapping().clone();
        let info = client.info();
        let info_node = client.node();
        Ok(Self {
            shared: SharedClient::new(client),
            mapping,
            info,
            info_node,
            socket,
        })
    }

    #[getter]
    fn socket(&self) -> &str {
        &self.socket
    }

    #[getter]
    fn region_size(&self) -> u64 {
        self.info.region_size
    }

    /// Capacity when this client connected (see `stats()` for the current one).
    #[getter]
    fn capacity(&self) -> u64 {
        self.info.capacity
    }

    #[getter]
    fn line_size(&self) -> u64 {
        self.info.line_size
    }

    /// The node this client's daemon is (0 for a single store).
    #[getter]
    fn node(&self) -> u32 {
        self.info_node
    }

    /// Whether the daemon is a node of a cluster.
    #[getter]
    fn clustered(&self) -> bool {
        self.info.clustered
    }

    #[getter]
    fn client_id(&self) -> u32 {
        self.info.client_id
    }

    /// Requests this client has sent through its socket so far (the fast
    /// path's gets, creates, seals and releases send none).
    #[getter]
    fn requests(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.shared.with(|c| Ok(c.requests()))).py()
    }

    /// Where the region is mapped in this process.
    #[getter]
    fn region_address(&self) -> usize {
        self.mapping.base() as usize
    }

    /// Creates an object and returns its writable data buffer. `metadata` is
    /// stored after the data. Seal it when written.
    /// With `node` (a cluster), the object is allocated in that node's
    /// region (remote allocation) and the buffer writes there directly, or,
    /// on a node reached over the network, into a staging buffer in this
    /// node's region whose seal pushes the bytes there.
    #[pyo3(signature = (id, size, metadata=None, timeout_ms=0, node=None))]
    fn create(
        &self,
        py: Python<'_>,
        id: PyId,
        size: u64,
        metadata: Option<&[u8]>,
        timeout_ms: u32,
        node: Option<u32>,
    ) -> PyResult<Buffer> {
        let meta = metadata.unwrap_or_default();
        let meta_size = u32::try_from(meta.len())
            .map_err(|_| PyValueError::new_err("metadata larger than 4 GiB"))?;
        let id = id.0;
        let node = node.unwrap_or(self.info_node);
        let spec = CreateSpec {
            id,
            data_size: size,
            meta_size,
        };
        // Here or on another node (remote allocation, or its staging buffer
        // here); the address is where this process writes (a simulated
        // fabric's cache copy, if any).
        let (located, region, address) = py
            .detach(|| {
                self.shared.with(|c| {
                    let located = c.create_on(node, &[spec], timeout_ms)?[0];
                    let (region, address) = c.located_region(located, true)?;
                    Ok((located, region, address as usize))
                })
            })
            .py()?;
        let address = address as *mut u8;
        // SAFETY: the metadata range follows the data inside the object just
        // allocated for us, bounds-checked against the node's mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(meta.as_ptr(), address.add(size as usize), meta.len())
        };
        Ok(self.buffer_at(id, address, located.location, true, Some(region)))
    }

    /// Creates many objects (no metadata) in one round trip, all or none.
    #[pyo3(signature = (ids, sizes, timeout_ms=0))]
    fn create_batch(
        &self,
        py: Python<'_>,
        ids: PyIds,
        sizes: Vec<u64>,
        timeout_ms: u32,
    ) -> PyResult<Vec<Buffer>> {
        let ids = ids.0;
        if ids.len() != sizes.len() {
            return Err(PyValueError::new_err("ids and sizes differ in length"));
        }
        let specs: Vec<_> = ids
            .iter()
            .zip(&sizes)
            .map(|(&id, &data_size)| CreateSpec {
                id,
                data_size,
                meta_size: 0,
            })
            .collect();
        let me = self.info_node;
        let created = py
            .detach(|| {
                self.shared.with(|c| {
                    let locations = c.create_batch(&specs, timeout_ms)?;
                    locations
                        .into_iter()
                        .map(|location| {
                            let address = c.located_ptr_mut(Located::local(me, location))?;
                            Ok((location, address as usize))
                        })
                        .collect::<Result<Vec<_>>>()
                })
            })
            .py()?;
        Ok(specs
            .iter()
            .zip(created)
            .map(|(s, (l, address))| self.buffer_at(s.id, address as *mut u8, l, true, None))
            .collect())
    }

    /// Seals objects this client created. With `release`, the creator's
    /// reference is dropped now rather than when its buffer is freed.
    #[pyo3(signature = (ids, release=false, durability=None))]
    fn seal(
        &self,
        py: Python<'_>,
        ids: PyIds,
        release: bool,
        durability: Option<&str>,
    ) -> PyResult<()> {
        let ids = ids.0;
        let durability = durability.map(str::parse::<Durability>).transpose().py()?;
        py.detach(|| self.shared.seal_durable(&ids, release, durability))
            .py()
    }

    /// Waits until each object has a durable copy at `level`; per id `None`
    /// or the error kind's name (Timeout, ObjectNotFound, StoreFull, ...).
    #[pyo3(signature = (ids, level, timeout_ms=-1))]
    fn wait_durable(
        &self,
        py: Python<'_>,
        ids: PyIds,
        level: &str,
        timeout_ms: i64,
    ) -> PyResult<Vec<Option<&'static str>>> {
        let ids = ids.0;
        let level = level.parse::<Durability>().py()?;
        let results = py
            .detach(|| {
                self.shared
                    .with(|c| c.wait_durable(&ids, level, timeout_ms))
            })
            .py()?;
        Ok(kinds(results))
    }

    /// Brings objects into memory from the tiers; per id `None` or the error kind.
    fn stage_in(&self, py: Python<'_>, ids: PyIds) -> PyResult<Vec<Option<&'static str>>> {
        let ids = ids.0;
        let results = py.detach(|| self.shared.with(|c| c.stage_in(&ids))).py()?;
        Ok(kinds(results))
    }

    /// Writes objects down to the lowest tier and frees their memory; per id
    /// `None` or the error kind.
    fn stage_out(&self, py: Python<'_>, ids: PyIds) -> PyResult<Vec<Option<&'static str>>> {
        let ids = ids.0;
        let results = py.detach(|| self.shared.with(|c| c.stage_out(&ids))).py()?;
        Ok(kinds(results))
    }

    /// The node's tiers below memory and the drain's progress.
    fn tiers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = py.detach(|| self.shared.with(|c| c.tiers())).py()?;
        let d = PyDict::new(py);
        d.set_item("default_durability", t.default_durability.name())?;
        d.set_item("queue_depth", t.queue_depth)?;
        d.set_item("drained_objects", t.drained_objects)?;
        d.set_item("drained_bytes", t.drained_bytes)?;
        d.set_item("drain_rate", t.drain_rate)?;
        d.set_item("spilled_bytes", t.spilled_bytes)?;
        d.set_item("restores", t.restores)?;
        d.set_item("restored_bytes", t.restored_bytes)?;
        d.set_item("durable_objects", t.durable_objects)?;
        d.set_item("failures", t.failures)?;
        let levels = PyDict::new(py);
        for tier in &t.tiers {
            let row = PyDict::new(py);
            row.set_item("path", &tier.describe)?;
            row.set_item("capacity", tier.capacity)?;
            row.set_item("used", tier.used)?;
            row.set_item("objects", tier.objects)?;
            levels.set_item(tier.level_name(), row)?;
        }
        d.set_item("tiers", levels)?;
        Ok(d)
    }

    /// The elastic capacity controller's state, and its capacity-over-time
    /// trace after `trace_since` seconds of the daemon's life (none when
    /// `None`) as rows (time_s, target, capacity, store_used, node_used,
    /// node_total, ratio).
    #[pyo3(signature = (trace_since=None))]
    fn controller<'py>(
        &self,
        py: Python<'py>,
        trace_since: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let since = trace_since
            .map(|s| {
                std::time::Duration::try_from_secs_f64(s).map_err(|_| {
                    ShoalError::new(
                        ErrorKind::InvalidArgument,
                        format!("trace_since must be seconds >= 0, not {s}"),
                    )
                })
            })
            .transpose()
            .py()?;
        let c = py.detach(|| self.shared.with(|c| c.capacity(since))).py()?;
        let d = PyDict::new(py);
        d.set_item("enabled", c.enabled)?;
        d.set_item("source", &c.source)?;
        d.set_item("interval_s", c.interval.as_secs_f64())?;
        d.set_item("threshold", c.threshold)?;
        d.set_item("gain", c.gain)?;
        d.set_item("min_capacity", c.min_capacity)?;
        d.set_item("max_capacity", c.max_capacity)?;
        d.set_item("target", c.target)?;
        d.set_item("capacity", c.capacity)?;
        d.set_item("used", c.used)?;
        d.set_item("pinned", c.pinned)?;
        d.set_item("resident", c.resident)?;
        d.set_item("over_target", c.over_target)?;
        d.set_item("ratio", c.utilisation)?;
        d.set_item("node_used", c.node_used)?;
        d.set_item("node_total", c.node_total)?;
        d.set_item("last_step", c.last_step)?;
        d.set_item("stall_share", c.stall_share)?;
        d.set_item(
            "psi_action",
            match c.psi_action {
                PsiAction::None => "none",
                PsiAction::HoldGrowth => "hold_growth",
                PsiAction::Boost => "boost",
            },
        )?;
        d.set_item("steps", c.steps)?;
        d.set_item("urgent_steps", c.urgent_steps)?;
        d.set_item("released_bytes", c.released_bytes)?;
        d.set_item("cpu_seconds", c.cpu_seconds)?;
        d.set_item("release_cpu_seconds", c.release_cpu_seconds)?;
        let rows: Vec<(f64, u64, u64, u64, u64, u64, f64)> = c
            .trace
            .iter()
            .map(|p| {
                (
                    p.time.as_secs_f64(),
                    p.target,
                    p.capacity,
                    p.store_used,
                    p.node_used,
                    p.node_total,
                    p.utilisation,
                )
            })
            .collect();
        d.set_item("trace", rows)?;
        Ok(d)
    }

    /// Diagnostic hook (benchmarks): writes back now the cache lines `seal`
    /// would write back for these unsealed objects of this client — the same
    /// routine, on a non-coherent fabric; nothing on a coherent one — and
    /// returns how many bytes it covered. The seal then skips them, so write
    /// nothing to them in between.
    fn flush_unsealed(&self, py: Python<'_>, ids: PyIds) -> PyResult<u64> {
        let ids = ids.0;
        py.detach(|| self.shared.with(|c| Ok(c.flush_unsealed(&ids))))
            .py()
    }

    fn abort(&self, py: Python<'_>, id: PyId) -> PyResult<()> {
        let id = id.0;
        py.detach(|| self.shared.abort(id)).py()
    }

    /// Gets objects, waiting up to `timeout_ms` (-1: forever) for unsealed
    /// ones; `None` for those still missing. Buffers are read-only views of
    /// store memory.
    #[pyo3(signature = (ids, timeout_ms=-1))]
    fn get(&self, py: Python<'_>, ids: PyIds, timeout_ms: i64) -> PyResult<Vec<Option<Buffer>>> {
        let object_ids = ids.0;
        // The fast path first: objects the shared index has are referenced
        // without the connection (no lock, no round trip, the GIL kept).
        // Only if one is missing does the whole call go to the daemon.
        if self.shared.has_fast_reads() {
            let mut buffers = Vec::with_capacity(object_ids.len());
            for id in &object_ids {
                if let Some((location, reference)) = self.shared.fast_reference(*id) {
                    buffers.push(Some(self.buffer_from(reference, location)));
                    continue;
                }
                // Another node's object, through its index (a cluster).
                match self.shared.fast_peer_reference(*id) {
                    Some((located, reference)) => {
                        buffers.push(Some(self.buffer_in_region(reference, located.location)))
                    }
                    None => break,
                }
            }
            if buffers.len() == object_ids.len() {
                return Ok(buffers);
            }
            // (Those taken are dropped here: released with no message.)
        }
        let me = self.info_node;
        let found = py
            .detach(|| {
                self.shared.with(|c| {
                    let found = c.get(&object_ids, timeout_ms)?;
                    // Objects on other nodes: addresses in those nodes' regions;
                    // objects to invalidate: in the simulated fabric's cache.
                    found
                        .into_iter()
                        .map(|o| match o {
                            Some(l) if l.node != me || l.invalidate => {
                                let (region, address) = c.located_region(l, false)?;
                                Ok(Some((l, Some((region, address as usize)))))
                            }
                            Some(l) => Ok(Some((l, None))),
                            None => Ok(None),
                        })
                        .collect::<Result<Vec<_>>>()
                })
            })
            .py()?;
        Ok(object_ids
            .iter()
            .zip(found)
            .map(|(id, found)| {
                found.map(|(l, remote)| match remote {
                    Some((region, address)) => {
                        self.buffer_at(*id, address as *mut u8, l.location, false, Some(region))
                    }
                    None => self.buffer(*id, l.location, false),
                })
            })
            .collect())
    }

    /// create + copy + seal of many objects in two round trips. `buffers`
    /// are byte buffers (bytes, bytearray, memoryview cast to "B").
    #[pyo3(signature = (ids, buffers, metadata=None, timeout_ms=0, durability=None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        ids: PyIds,
        buffers: Vec<PyBuffer<u8>>,
        metadata: Option<Vec<Vec<u8>>>,
        timeout_ms: u32,
        durability: Option<&str>,
    ) -> PyResult<()> {
        let ids = ids.0;
        let durability = durability.map(str::parse::<Durability>).transpose().py()?;
        if ids.len() != buffers.len() || metadata.as_ref().is_some_and(|m| m.len() != ids.len()) {
            return Err(PyValueError::new_err(
                "ids, buffers and metadata differ in length",
            ));
        }
        let mut sources = Vec::with_capacity(buffers.len());
        for buffer in &buffers {
            if !buffer.is_c_contiguous() {
                return Err(PyValueError::new_err("buffers must be C-contiguous"));
            }
            sources.push((buffer.buf_ptr() as usize, buffer.len_bytes()));
        }
        let empty: Vec<u8> = Vec::new();
        let specs: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| CreateSpec {
                id,
                data_size: sources[i].1 as u64,
                meta_size: metadata.as_ref().map_or(0, |m| m[i].len() as u32),
            })
            .collect();
        py.detach(|| {
            self.shared.with(|c| {
                let locations = c.create_batch(&specs, timeout_ms)?;
                for (i, location) in locations.iter().enumerate() {
                    // SAFETY: each source is a contiguous exported buffer held
                    // by `buffers` for the whole call.
                    let data = unsafe {
                        std::slice::from_raw_parts(sources[i].0 as *const u8, sources[i].1)
                    };
                    let meta = metadata.as_ref().map_or(&empty, |m| &m[i]);
                    c.write(*location, data, meta)?;
                }
                let ids: Vec<_> = specs.iter().map(|s| s.id).collect();
                c.seal_durable(&ids, true, durability)
            })
        })
        .py()?;
        drop(buffers);
        Ok(())
    }

    /// Deletes objects; returns, per id, `None` or the error kind's name.
    fn delete(&self, py: Python<'_>, ids: PyIds) -> PyResult<Vec<Option<&'static str>>> {
        let ids = ids.0;
        let results = py.detach(|| self.shared.with(|c| c.delete(&ids))).py()?;
        Ok(results
            .into_iter()
            .map(|r| r.err().map(|e| e.kind().name()))
            .collect())
    }

    fn contains(&self, py: Python<'_>, id: PyId) -> PyResult<bool> {
        // Published in the shared index: present, no round trip.
        if self.shared.fast_contains(&id.0) {
            return Ok(true);
        }
        py.detach(|| self.shared.with(|c| c.contains(id.0))).py()
    }

    /// Names an object: bound at its seal if still being written, at once
    /// if sealed (the name's previous object is deleted).
    fn name(&self, py: Python<'_>, id: PyId, name: &str) -> PyResult<()> {
        py.detach(|| self.shared.with(|c| c.name(id.0, name))).py()
    }

    /// The object bound to `name`: a name row.
    fn resolve<'py>(&self, py: Python<'py>, name: &str) -> PyResult<NameRow<'py>> {
        let e = py.detach(|| self.shared.with(|c| c.resolve(name))).py()?;
        Ok((
            e.name,
            PyBytes::new(py, &e.id.0),
            e.data_size,
            e.meta_size,
            e.mtime_ms,
        ))
    }

    /// Every name under directory `prefix` ("" for all), sorted: name rows.
    fn list_names<'py>(&self, py: Python<'py>, prefix: &str) -> PyResult<Vec<NameRow<'py>>> {
        let entries = py
            .detach(|| self.shared.with(|c| c.list_names(prefix)))
            .py()?;
        Ok(entries
            .into_iter()
            .map(|e| {
                (
                    e.name,
                    PyBytes::new(py, &e.id.0),
                    e.data_size,
                    e.meta_size,
                    e.mtime_ms,
                )
            })
            .collect())
    }

    fn rename(&self, py: Python<'_>, source: &str, target: &str) -> PyResult<()> {
        py.detach(|| self.shared.with(|c| c.rename(source, target)))
            .py()
    }

    fn unlink(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        py.detach(|| self.shared.with(|c| c.unlink(name))).py()
    }

    /// Every object: (id, data_size, metadata_size, sealed, refs).
    fn list<'py>(&self, py: Python<'py>) -> PyResult<Vec<ListRow<'py>>> {
        let objects = py.detach(|| self.shared.with(|c| c.list())).py()?;
        Ok(objects
            .into_iter()
            .map(|o| {
                (
                    PyBytes::new(py, &o.id.0),
                    o.location.data_size,
                    o.location.meta_size,
                    o.sealed,
                    o.refs,
                    o.resident,
                    o.tiers,
                )
            })
            .collect())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = py.detach(|| self.shared.with(|c| c.stats())).py()?;
        let d = PyDict::new(py);
        d.set_item("capacity", s.capacity)?;
        d.set_item("region_size", s.region_size)?;
        d.set_item("used", s.used)?;
        d.set_item("objects", s.objects)?;
        d.set_item("sealed", s.sealed)?;
        d.set_item("referenced", s.referenced)?;
        d.set_item("evictable", s.evictable)?;
        d.set_item("clients", s.clients)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("evicted_bytes", s.evicted_bytes)?;
        d.set_item("line_size", s.line_size)?;
        d.set_item("policy", s.policy)?;
        d.set_item("lent", s.lent)?;
        Ok(d)
    }

    /// The cluster's nodes as this client's daemon sees them now: one dict
    /// per node (node, alive, access, region, region_size); `alive` is
    /// whether the node answers the daemon's heartbeats (always for itself).
    fn cluster_nodes<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let nodes = py.detach(|| self.shared.with(|c| c.cluster_nodes())).py()?;
        nodes
            .into_iter()
            .map(|n| {
                let d = PyDict::new(py);
                d.set_item("node", n.node)?;
                d.set_item("alive", n.alive)?;
                d.set_item("access", if n.mapped { "mapped" } else { "network" })?;
                d.set_item("region", n.path)?;
                d.set_item("region_size", n.region_size)?;
                Ok(d)
            })
            .collect()
    }

    /// Evicts unreferenced objects until `nbytes` are freed; returns bytes freed.
    fn evict(&self, py: Python<'_>, nbytes: u64) -> PyResult<u64> {
        py.detach(|| self.shared.with(|c| c.evict(nbytes))).py()
    }

    /// Sends queued releases now (they are otherwise sent with the next call).
    fn flush_releases(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.shared.with(|_| Ok(()))).py()
    }

    /// Hangs up: the daemon releases this client's references and aborts its
    /// unsealed objects. Buffers from this client must not be used afterwards.
    fn close(&self, py: Python<'_>) {
        let _ = py.detach(|| {
            self.shared.with(|c| {
                c.close();
                Ok(())
            })
        });
    }
}

#[pyclass(module = "shoal._internal", frozen)]
pub struct Subscription {
    /// `None` once closed.
    inner: Mutex<Option<RustSubscription>>,
    /// Shut down by `close` so a `next` blocked in another thread returns.
    closer: std::os::unix::net::UnixStream,
}

#[pymethods]
impl Subscription {
    #[new]
    fn new(py: Python<'_>, socket: String) -> PyResult<Self> {
        let inner = py.detach(|| RustSubscription::connect(&socket)).py()?;
        let closer = inner.closer().py()?;
        Ok(Self {
            inner: Mutex::new(Some(inner)),
            closer,
        })
    }

    /// Ends the subscription; `next` raises `Disconnected` afterwards.
    fn close(&self, py: Python<'_>) {
        let _ = self.closer.shutdown(std::net::Shutdown::Both);
        py.detach(|| *lock(&self.inner) = None);
    }

    /// Next notification as (id, kind, data_size, metadata_size) where kind
    /// is "sealed" or "removed"; `None` if `timeout` seconds pass first.
    #[pyo3(signature = (timeout=None))]
    fn next<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<NotificationRow<'py>>> {
        let timeout = timeout.map(|t| Duration::from_secs_f64(t.max(0.001)));
        let next = py
            .detach(|| match lock(&self.inner).as_mut() {
                Some(subscription) => subscription.next(timeout),
                None => Err(ShoalError::new(
                    ErrorKind::Disconnected,
                    "the subscription is closed",
                )),
            })
            .py()?;
        Ok(next.map(|n| match n {
            ObjectEvent::Sealed {
                id,
                data_size,
                meta_size,
            } => (PyBytes::new(py, &id.0), "sealed", data_size, meta_size),
            ObjectEvent::Removed { id, .. } => (PyBytes::new(py, &id.0), "removed", 0, 0),
            // Never sent to subscribers (they see sealed objects only).
            ObjectEvent::Aborted { id } => (PyBytes::new(py, &id.0), "aborted", 0, 0),
        }))
    }
}

/// Per id `None` or the error kind's name (the exception class in `shoal.errors`).
fn kinds(results: Vec<shoal_core::error::Result<()>>) -> Vec<Option<&'static str>> {
    results
        .into_iter()
        .map(|r| r.err().map(|e| e.kind().name()))
        .collect()
}
