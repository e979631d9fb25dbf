//! `Client` and `Subscription` for Python: conversions only.
//!
//! The connection is a `shoal_client::shared::SharedClient`. It decides
//! every call's path (the fast path first, the daemon for the rest), hands
//! out views of objects' bytes with their references, and releases the
//! references when Python frees the buffers, on any thread at any time
//! (queued and sent coalesced, never blocking a drop on the connection).
//! Every call that may wait for the daemon releases the GIL; a get or
//! contains the shared index answers keeps it.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use shoal_client::shared::{Blocking, SharedClient};
use shoal_client::{Client as RustClient, StoreInfo, Subscription as RustSubscription};
use shoal_core::durability::Durability;
use shoal_core::error::{ErrorKind, ShoalError};
use shoal_core::event::ObjectEvent;
use shoal_core::protocol::CreateSpec;
use shoal_core::protocol::PsiAction;
use shoal_core::ObjectId;

use crate::buffer::{bytes_of, Buffer};
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

/// What may wait for the daemon runs with the GIL released; what the shared
/// indexes answer keeps it.
struct Detached<'py>(Python<'py>);

impl Blocking for Detached<'_> {
    fn run<R: Send>(self, call: impl FnOnce() -> R + Send) -> R {
        self.0.detach(call)
    }
}

#[pyclass(module = "shoal._internal", frozen)]
pub struct Client {
    shared: SharedClient,
    info: StoreInfo,
    /// This client's node in a cluster (0 for a single store).
    info_node: u32,
    /// The cluster's identity (`ClusterInfo`), None for a single store.
    cluster_identity: Option<String>,
    /// How the node's peer traffic is protected, None for a single store.
    peer_encryption: Option<String>,
    /// Where the region is mapped in this process.
    region_address: usize,
    socket: String,
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
        let region_address = client.mapping().base() as usize;
        let info = client.info();
        let info_node = client.node();
        let cluster_identity = client.cluster().map(|c| c.identity.clone());
        let peer_encryption = client.cluster().map(|c| c.encryption.clone());
        Ok(Self {
            shared: SharedClient::new(client),
            info,
            info_node,
            cluster_identity,
            peer_encryption,
            region_address,
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

    /// The cluster's identity (its name and a digest of its token), equal
    /// for clients of any two nodes of one cluster; None for a single store.
    #[getter]
    fn cluster_identity(&self) -> Option<&str> {
        self.cluster_identity.as_deref()
    }

    /// How this client's node protects its traffic with other nodes (e.g.
    /// "tls1.3, data channel tls-userspace"); None for a single store.
    #[getter]
    fn peer_encryption(&self) -> Option<&str> {
        self.peer_encryption.as_deref()
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
        self.region_address
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
        let metadata = metadata.unwrap_or_default();
        let view = py
            .detach(|| self.shared.create(id.0, size, metadata, node, timeout_ms))
            .py()?;
        Ok(view.into())
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
        let views = py
            .detach(|| self.shared.create_batch(&specs, timeout_ms))
            .py()?;
        Ok(views.into_iter().map(Buffer::from).collect())
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

    /// Marks objects their readers are done with (they leave memory first);
    /// per id `None` or the error kind.
    fn cool(&self, py: Python<'_>, ids: PyIds) -> PyResult<Vec<Option<&'static str>>> {
        let ids = ids.0;
        let results = py.detach(|| self.shared.with(|c| c.cool(&ids))).py()?;
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
        // The shared client takes the fast path, and releases the GIL only
        // if it has to ask the daemon.
        let views = self.shared.get(&ids.0, timeout_ms, Detached(py)).py()?;
        Ok(views
            .into_iter()
            .map(|view| view.map(Buffer::from))
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
        let data = buffers.iter().map(bytes_of).collect::<PyResult<Vec<_>>>()?;
        let objects: Vec<(ObjectId, &[u8], &[u8])> = ids
            .iter()
            .zip(&data)
            .enumerate()
            .map(|(i, (&id, &data))| {
                let meta = metadata.as_ref().map_or(&[][..], |m| &m[i][..]);
                (id, data, meta)
            })
            .collect();
        py.detach(|| {
            self.shared
                .with(|c| c.put_batch(&objects, durability, timeout_ms))
        })
        .py()
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
        self.shared.contains(id.0, Detached(py)).py()
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

    fn set_mtime(&self, py: Python<'_>, name: &str, mtime_ms: u64) -> PyResult<()> {
        py.detach(|| self.shared.with(|c| c.set_mtime(name, mtime_ms)))
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
