//! `Client` and `Subscription` for Python.
//!
//! The connection sits behind a mutex and every blocking call releases the
//! GIL. Buffers release their object when Python frees them, which can happen
//! on any thread at any time (even inside another call on this client), so
//! releases go through a queue: whoever holds the connection next sends them,
//! and a release never blocks waiting for the connection.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use shoal_client::{Client as RustClient, StoreInfo, Subscription as RustSubscription};
use shoal_core::error::Result;
use shoal_core::protocol::{CreateSpec, Notification};
use shoal_core::region::Mapping;
use shoal_core::store::ObjectLocation;
use shoal_core::ObjectId;

use crate::buffer::{Buffer, ObjectRef};
use crate::errors::IntoPyResult;

pub struct Shared {
    connection: Mutex<RustClient>,
    pending_releases: Mutex<Vec<ObjectId>>,
    /// The creator references of objects created through `create` and not
    /// sealed yet, so `seal(release=True)` can disarm their buffers.
    creating: Mutex<std::collections::HashMap<ObjectId, std::sync::Weak<ObjectRef>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    /// Queues a release and sends it now if the connection is free.
    pub fn release_later(&self, id: ObjectId) {
        lock(&self.pending_releases).push(id);
        if let Ok(mut connection) = self.connection.try_lock() {
            self.flush(&mut connection);
        }
    }

    fn flush(&self, connection: &mut RustClient) {
        let ids = std::mem::take(&mut *lock(&self.pending_releases));
        if !ids.is_empty() {
            // A dead connection means the daemon already dropped our references.
            let _ = connection.release(&ids);
        }
    }

    /// Runs `f` on the connection (call with the GIL released).
    fn with<T>(&self, f: impl FnOnce(&mut RustClient) -> Result<T>) -> Result<T> {
        let result = {
            let mut connection = lock(&self.connection);
            self.flush(&mut connection);
            let result = f(&mut connection);
            self.flush(&mut connection);
            result
        };
        // A release queued while we held the lock found it busy: send it now.
        if !lock(&self.pending_releases).is_empty() {
            if let Ok(mut connection) = self.connection.try_lock() {
                self.flush(&mut connection);
            }
        }
        result
    }
}

type Id = [u8; 20];
/// One `list()` row: (id, data_size, metadata_size, sealed, refs).
type ListRow<'py> = (Bound<'py, PyBytes>, u64, u32, bool, u32);
/// One notification: (id, kind, data_size, metadata_size).
type NotificationRow<'py> = (Bound<'py, PyBytes>, &'static str, u64, u32);

#[pyclass(module = "shoal._internal", frozen)]
pub struct Client {
    shared: Arc<Shared>,
    mapping: Arc<Mapping>,
    info: StoreInfo,
    socket: String,
}

impl Client {
    /// Sealed or aborted: stop tracking the creator buffers; if the daemon
    /// already dropped their reference, their drop must not release again.
    fn forget_creations(&self, ids: &[ObjectId], reference_gone: bool) {
        let mut creating = lock(&self.shared.creating);
        for id in ids {
            if let Some(reference) = creating.remove(id).and_then(|weak| weak.upgrade()) {
                if reference_gone {
                    reference
                        .released
                        .store(true, std::sync::atomic::Ordering::Release);
                }
            }
        }
    }

    fn buffer(&self, id: ObjectId, location: ObjectLocation, writable: bool) -> Buffer {
        let reference = Arc::new(ObjectRef {
            shared: self.shared.clone(),
            id,
            released: Default::default(),
        });
        if writable {
            lock(&self.shared.creating).insert(id, Arc::downgrade(&reference));
        }
        // SAFETY: locations are bounds-checked against the mapping by the Rust client.
        let address = unsafe { self.mapping.base().add(location.offset as usize) };
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
    fn new(py: Python<'_>, socket: String) -> PyResult<Self> {
        let client = py.detach(|| RustClient::connect(&socket)).py()?;
        let mapping = client.mapping().clone();
        let info = client.info();
        Ok(Self {
            shared: Arc::new(Shared {
                connection: Mutex::new(client),
                pending_releases: Mutex::new(Vec::new()),
                creating: Mutex::default(),
            }),
            mapping,
            info,
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

    #[getter]
    fn client_id(&self) -> u32 {
        self.info.client_id
    }

    /// Where the region is mapped in this process.
    #[getter]
    fn region_address(&self) -> usize {
        self.mapping.base() as usize
    }

    /// Creates an object and returns its writable data buffer. `metadata` is
    /// stored after the data. Seal it when written.
    #[pyo3(signature = (id, size, metadata=None, timeout_ms=0))]
    fn create(
        &self,
        py: Python<'_>,
        id: Id,
        size: u64,
        metadata: Option<&[u8]>,
        timeout_ms: u32,
    ) -> PyResult<Buffer> {
        let meta = metadata.unwrap_or_default();
        let meta_size = u32::try_from(meta.len())
            .map_err(|_| PyValueError::new_err("metadata larger than 4 GiB"))?;
        let id = ObjectId(id);
        let location = py
            .detach(|| {
                self.shared
                    .with(|c| c.create(id, size, meta_size, timeout_ms))
            })
            .py()?;
        // SAFETY: the metadata range follows the data inside the object just created for us.
        unsafe {
            std::ptr::copy_nonoverlapping(
                meta.as_ptr(),
                self.mapping.base().add((location.offset + size) as usize),
                meta.len(),
            )
        };
        Ok(self.buffer(id, location, true))
    }

    /// Creates many objects (no metadata) in one round trip, all or none.
    #[pyo3(signature = (ids, sizes, timeout_ms=0))]
    fn create_batch(
        &self,
        py: Python<'_>,
        ids: Vec<Id>,
        sizes: Vec<u64>,
        timeout_ms: u32,
    ) -> PyResult<Vec<Buffer>> {
        if ids.len() != sizes.len() {
            return Err(PyValueError::new_err("ids and sizes differ in length"));
        }
        let specs: Vec<_> = ids
            .iter()
            .zip(&sizes)
            .map(|(id, &data_size)| CreateSpec {
                id: ObjectId(*id),
                data_size,
                meta_size: 0,
            })
            .collect();
        let locations = py
            .detach(|| self.shared.with(|c| c.create_batch(&specs, timeout_ms)))
            .py()?;
        Ok(specs
            .iter()
            .zip(locations)
            .map(|(s, l)| self.buffer(s.id, l, true))
            .collect())
    }

    /// Seals objects this client created. With `release`, the creator's
    /// reference is dropped now rather than when its buffer is freed.
    #[pyo3(signature = (ids, release=false))]
    fn seal(&self, py: Python<'_>, ids: Vec<Id>, release: bool) -> PyResult<()> {
        let ids: Vec<_> = ids.into_iter().map(ObjectId).collect();
        py.detach(|| self.shared.with(|c| c.seal(&ids, release)))
            .py()?;
        self.forget_creations(&ids, release);
        Ok(())
    }

    fn abort(&self, py: Python<'_>, id: Id) -> PyResult<()> {
        let id = ObjectId(id);
        py.detach(|| self.shared.with(|c| c.abort(id))).py()?;
        self.forget_creations(&[id], true);
        Ok(())
    }

    /// Gets objects, waiting up to `timeout_ms` (-1: forever) for unsealed
    /// ones; `None` for those still missing. Buffers are read-only views of
    /// store memory.
    #[pyo3(signature = (ids, timeout_ms=-1))]
    fn get(&self, py: Python<'_>, ids: Vec<Id>, timeout_ms: i64) -> PyResult<Vec<Option<Buffer>>> {
        let object_ids: Vec<_> = ids.iter().map(|id| ObjectId(*id)).collect();
        let found = py
            .detach(|| self.shared.with(|c| c.get(&object_ids, timeout_ms)))
            .py()?;
        Ok(object_ids
            .iter()
            .zip(found)
            .map(|(id, l)| l.map(|l| self.buffer(*id, l, false)))
            .collect())
    }

    /// create + copy + seal of many objects in two round trips. `buffers`
    /// are byte buffers (bytes, bytearray, memoryview cast to "B").
    #[pyo3(signature = (ids, buffers, metadata=None, timeout_ms=0))]
    fn put_batch(
        &self,
        py: Python<'_>,
        ids: Vec<Id>,
        buffers: Vec<PyBuffer<u8>>,
        metadata: Option<Vec<Vec<u8>>>,
        timeout_ms: u32,
    ) -> PyResult<()> {
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
            .map(|(i, id)| CreateSpec {
                id: ObjectId(*id),
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
                c.seal(&ids, true)
            })
        })
        .py()?;
        drop(buffers);
        Ok(())
    }

    /// Deletes objects; returns, per id, `None` or the error kind's name.
    fn delete(&self, py: Python<'_>, ids: Vec<Id>) -> PyResult<Vec<Option<&'static str>>> {
        let ids: Vec<_> = ids.into_iter().map(ObjectId).collect();
        let results = py.detach(|| self.shared.with(|c| c.delete(&ids))).py()?;
        Ok(results
            .into_iter()
            .map(|r| r.err().map(|e| e.kind().name()))
            .collect())
    }

    fn contains(&self, py: Python<'_>, id: Id) -> PyResult<bool> {
        py.detach(|| self.shared.with(|c| c.contains(ObjectId(id))))
            .py()
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
        Ok(d)
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
    inner: Mutex<RustSubscription>,
}

#[pymethods]
impl Subscription {
    #[new]
    fn new(py: Python<'_>, socket: String) -> PyResult<Self> {
        let inner = py.detach(|| RustSubscription::connect(&socket)).py()?;
        Ok(Self {
            inner: Mutex::new(inner),
        })
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
        let next = py.detach(|| lock(&self.inner).next(timeout)).py()?;
        Ok(next.map(|n| match n {
            Notification::Sealed {
                id,
                data_size,
                meta_size,
            } => (PyBytes::new(py, &id.0), "sealed", data_size, meta_size),
            Notification::Removed { id } => (PyBytes::new(py, &id.0), "removed", 0, 0),
        }))
    }
}
