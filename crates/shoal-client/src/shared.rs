//! A [`Client`] shared between threads; [`ObjectRef`]: one store
//! reference, released when dropped; and [`ObjectView`]: an object's bytes
//! in this process with the reference that keeps them.
//!
//! [`SharedClient::get`] is the whole get: objects the shared indexes have
//! are referenced without the connection (no lock, no round trip), and only
//! if one is missing does the call go to the daemon, through the
//! [`Blocking`] the caller passes (a binding lets go of its own lock there).
//! Creates return writable views the same way. A binding converts views; it
//! computes no address and registers no reference itself.
//!
//! The connection sits behind a mutex. References are dropped by whoever
//! holds them last, on any thread at any time (even inside another call on
//! the same client, e.g. a Python buffer freed by the garbage collector), so
//! releases go through a queue: whoever holds the connection next sends
//! them, and a release never blocks waiting for the connection. A burst of
//! drops costs one `Release` message, not one per reference.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shoal_core::error::{Result, ShoalError};
use shoal_core::fast_path::index::Found;
use shoal_core::fast_path::readers::FastReads;
use shoal_core::location::ObjectLocation;
use shoal_core::protocol::{CreateSpec, Located};
use shoal_core::region::Mapping;
use shoal_core::ObjectId;

use crate::peer_reads::{PeerView, PeerViews};
use crate::Client;

/// How long the release thread waits for more dropped references before it
/// sends one `Release` for all of them (freeing a list of 1000 buffers costs
/// one message, not 1000).
pub const RELEASE_COALESCE: Duration = Duration::from_micros(200);
/// A drop this long after the last release message is sent at once (an
/// isolated `del` is seen by the daemon, and other clients, right away); drops
/// that follow closer than this are bursts and go to the release thread.
pub const RELEASE_QUIET: Duration = Duration::from_millis(1);
/// A backlog this long is sent at once by whoever drops the next reference.
pub const RELEASE_BATCH: usize = 4096;
/// How long the release thread, once woken, keeps watching the queue after
/// the client's last call before it sleeps until the next drop wakes it.
pub const RELEASE_IDLE: Duration = Duration::from_millis(4);

/// A client usable from many threads: calls take turns on one connection,
/// and references dropped anywhere are released in coalesced messages.
/// Cloning is cheap (one connection, shared); the connection closes, and the
/// release thread ends, when the last clone and the last [`ObjectRef`] of
/// it are gone.
#[derive(Clone)]
pub struct SharedClient {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Mutex<Client>,
    /// The fast path, used without the connection (gets of published
    /// objects, and their releases).
    fast: Option<Arc<FastReads>>,
    /// The client's mapping of the region, for fast-path gets.
    mapping: Arc<Mapping>,
    /// Other nodes' indexes (a cluster), read without the connection.
    peers: Arc<PeerViews>,
    releases: Arc<ReleaseQueue>,
    /// Releases go through a write channel (a record in shared memory, no
    /// system call): each drop sends its own at once when the connection
    /// is free, rather than waking the release thread to gather them.
    cheap_releases: bool,
    /// The creator references of objects created and not sealed yet, so a
    /// seal with release can disarm them.
    creating: Mutex<HashMap<ObjectId, Weak<ObjectRef>>>,
    /// Joined on drop, so no thread outlives the client.
    release_thread: Mutex<Option<JoinHandle<()>>>,
}

/// References of dropped [`ObjectRef`]s, waiting to be released in one message.
#[derive(Default)]
struct ReleaseQueue {
    ids: Mutex<Vec<ObjectId>>,
    queued: Condvar,
    /// The release thread was woken for the queue and will look at it: more
    /// drops until then need not wake it again (one wake-up per coalescing
    /// window, not one per drop).
    armed: AtomicBool,
    closed: AtomicBool,
    /// When the last release message went out.
    last_sent: Mutex<Option<Instant>>,
    /// Release messages sent so far.
    messages: AtomicU64,
    /// Uses of the connection so far (each takes the queue along).
    calls: AtomicU64,
    /// Times a drop woke the release thread.
    wakeups: AtomicU64,
}

impl ReleaseQueue {
    /// The release thread: wakes on the first queued id, lets more gather,
    /// sends them. Ends with the client. Any request on the connection also
    /// sends the queue first, so the daemon sees a client's releases before
    /// its next request.
    ///
    /// Once woken it watches the queue rather than wait to be woken again:
    /// while the client calls (each call carries the queue: a loop of gets
    /// and drops), it sends nothing and looks once per [`RELEASE_QUIET`];
    /// drops meanwhile wake nobody. It sends what is queued when a window
    /// passes without a call, and sleeps until the next drop once the
    /// queue is empty and the client made no call for [`RELEASE_IDLE`].
    /// (Woken per drop, it cost the client a wake-up of a third thread
    /// every few calls: on a machine whose cores are all busy, now and then
    /// a wait behind a neighbour's time slice.)
    fn run(self: Arc<Self>, shared: Weak<Inner>) {
        loop {
            {
                let mut ids = lock(&self.ids);
                if ids.is_empty() && !self.closed.load(Ordering::Acquire) {
                    // Disarmed before sleeping, under the queue's lock: a drop
                    // after this wakes us. (Left armed — when a flush took the
                    // ids a drop had armed it for — the next drops would wait
                    // for the client's next call.)
                    self.armed.store(false, Ordering::Release);
                    ids = self
                        .queued
                        .wait(ids)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                if ids.is_empty() && self.closed.load(Ordering::Acquire) {
                    return;
                }
                // Woken by a drop (whose id a call may have carried off
                // already: the client is busy) or by nothing: watch.
            }
            let mut window = RELEASE_COALESCE;
            let mut last_call = Instant::now();
            loop {
                let calls = self.calls.load(Ordering::Relaxed);
                std::thread::sleep(window);
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                if self.calls.load(Ordering::Relaxed) != calls {
                    // The client is calling, and its calls carry the queue.
                    last_call = Instant::now();
                    window = RELEASE_QUIET;
                    continue;
                }
                if lock(&self.ids).is_empty() {
                    if last_call.elapsed() >= RELEASE_IDLE {
                        // Quiet, nothing left: sleep until the next drop.
                        break;
                    }
                    window = RELEASE_QUIET;
                    continue;
                }
                // A window without a call: send what is queued. A busy
                // connection is not waited for: its holder sends the queue
                // with its request, or we try again after the next window
                // (never blocking on the lock, which would cost the holder
                // a wake-up of this thread when it lets go).
                if let Ok(mut connection) = shared.connection.try_lock() {
                    shared.flush(&mut connection);
                };
                window = RELEASE_COALESCE;
            }
        }
    }

    /// Ends the release thread (once the queue is empty).
    fn close(&self) {
        // Under the queue's lock: the thread checks `closed` under it, so the
        // wakeup cannot slip in between that check and its wait.
        let _ids = lock(&self.ids);
        self.closed.store(true, Ordering::Release);
        self.queued.notify_one();
    }
}

/// Poisoning only means another thread panicked holding the lock; the data
/// (a connection, a list of ids) stays usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SharedClient {
    /// Shares `client`, starting its release thread.
    pub fn new(client: Client) -> Self {
        let releases = Arc::new(ReleaseQueue::default());
        let inner = Arc::new(Inner {
            fast: client.fast_reads().cloned(),
            mapping: client.mapping().clone(),
            peers: client.peer_views(),
            cheap_releases: client.has_fast_writes(),
            connection: Mutex::new(client),
            releases: releases.clone(),
            creating: Mutex::default(),
            release_thread: Mutex::new(None),
        });
        let weak = Arc::downgrade(&inner);
        let spawned = std::thread::Builder::new()
            .name("shoal-release".into())
            .spawn(move || releases.run(weak));
        match spawned {
            Ok(thread) => *lock(&inner.release_thread) = Some(thread),
            // No thread: every drop sends its release itself.
            Err(_) => inner.releases.close(),
        }
        Self { inner }
    }

    /// Runs `f` on the connection, waiting for its turn; queued releases
    /// go out with its first request (one write) and those queued during it
    /// are sent after it.
    pub fn with<T>(&self, f: impl FnOnce(&mut Client) -> Result<T>) -> Result<T> {
        let mut connection = lock(&self.inner.connection);
        self.inner.take_queue(&mut connection);
        let result = f(&mut connection);
        self.inner.flush(&mut connection);
        result
    }

    /// Queues the release of one reference this client holds: sent at once
    /// if the connection is free and releases cost no system call (a write
    /// channel), or no release went out in the last [`RELEASE_QUIET`] (or
    /// the backlog reached [`RELEASE_BATCH`]); otherwise by the release
    /// thread or the next call, whichever is first. Never waits for the
    /// connection.
    pub fn release_later(&self, id: ObjectId) {
        let releases = &self.inner.releases;
        let backlog = {
            let mut ids = lock(&releases.ids);
            ids.push(id);
            ids.len()
        };
        let quiet = self.inner.cheap_releases
            || lock(&releases.last_sent).is_none_or(|t| t.elapsed() >= RELEASE_QUIET);
        if quiet || backlog >= RELEASE_BATCH || releases.closed.load(Ordering::Acquire) {
            if let Ok(mut connection) = self.inner.connection.try_lock() {
                self.inner.flush(&mut connection);
                return;
            }
        }
        if !releases.armed.swap(true, Ordering::AcqRel) {
            releases.wakeups.fetch_add(1, Ordering::Relaxed);
            // Under the queue's lock, as the thread checks the queue under it.
            let _ids = lock(&releases.ids);
            releases.queued.notify_one();
        }
    }

    /// References queued for release and not sent yet.
    pub fn pending_releases(&self) -> usize {
        lock(&self.inner.releases.ids).len()
    }

    /// How many `Release` messages this client has sent (each for one or
    /// more references): with the number of references dropped, shows how
    /// well releases coalesce.
    pub fn release_messages(&self) -> u64 {
        self.inner.releases.messages.load(Ordering::Relaxed)
    }

    /// How many times a dropped reference woke the release thread (once
    /// awake it watches the queue until the client made no call for
    /// [`RELEASE_IDLE`], so a loop of calls and drops wakes it about once).
    pub fn release_wakeups(&self) -> u64 {
        self.inner.releases.wakeups.load(Ordering::Relaxed)
    }

    /// A reference this client holds to object `id` (taken by a get),
    /// released when the returned `ObjectRef` is dropped. `region` is the
    /// mapping the object's bytes are in when that is not this client's own
    /// region (a peer's region, or a simulated fabric's cache of it): it
    /// stays mapped while the reference lives, even after the client maps
    /// the node anew (the node restarted).
    pub fn reference(&self, id: ObjectId, region: Option<Arc<Mapping>>) -> Arc<ObjectRef> {
        Arc::new(ObjectRef {
            client: self.clone(),
            id,
            released: AtomicBool::new(false),
            region,
            fast_position: None,
            fast_table: None,
        })
    }

    /// A reference to `id` taken through the fast path, without the
    /// connection or a round trip: the object's location in this client's
    /// region and the reference, given back when dropped. `None`: the
    /// index does not have it (ask the daemon through [`with`](Self::with)).
    pub fn fast_reference(&self, id: ObjectId) -> Option<(ObjectLocation, Arc<ObjectRef>)> {
        let found = self
            .inner
            .fast
            .as_ref()?
            .acquire_in(&id, &self.inner.mapping)?;
        Some((found.location, self.counted(id, None, found.position, None)))
    }

    /// [`fast_reference`](Self::fast_reference) for an object of another
    /// node, through that node's index (docs/fast-path.md "Gets of other
    /// nodes' objects"): where it is, and the reference, which keeps the
    /// owner's region mapped. `None`: ask the daemon (a get through
    /// [`with`](Self::with) also fetches the owners' indexes the first time).
    pub fn fast_peer_reference(&self, id: ObjectId) -> Option<(Located, Arc<ObjectRef>)> {
        let (view, found) = self.acquire_at_owner(&id)?;
        let reference = self.counted_at_owner(id, &view, &found);
        Some((view.located(&found), reference))
    }

    /// A reference to `id` through the first owner's index that has it.
    fn acquire_at_owner(&self, id: &ObjectId) -> Option<(Arc<PeerView>, Found)> {
        if self.inner.fast.as_ref().is_none_or(|f| f.is_closed()) {
            return None;
        }
        self.inner.peers.acquire(id)
    }

    /// The [`ObjectRef`] of a reference counted at an owner's index.
    fn counted_at_owner(&self, id: ObjectId, view: &PeerView, found: &Found) -> Arc<ObjectRef> {
        self.counted(
            id,
            Some(view.mapping.clone()),
            found.position,
            Some(view.fast.clone()),
        )
    }

    /// The [`ObjectRef`] of a reference counted at index `position` (in
    /// `table`, or this client's own table).
    #[inline]
    fn counted(
        &self,
        id: ObjectId,
        region: Option<Arc<Mapping>>,
        position: u32,
        table: Option<Arc<FastReads>>,
    ) -> Arc<ObjectRef> {
        Arc::new(ObjectRef {
            client: self.clone(),
            id,
            released: AtomicBool::new(false),
            region,
            fast_position: Some(position),
            fast_table: table,
        })
    }

    /// Gets objects, waiting up to `timeout_ms` (or [`crate::WAIT_FOREVER`])
    /// for the ones not sealed yet: a read-only view of each found one
    /// (`None` for those still missing), holding its reference.
    ///
    /// The fast path first: objects the shared indexes have (this node's,
    /// then other nodes' in a mapped cluster) are referenced without the
    /// connection — no lock, no round trip, and `blocking` is not called.
    /// Only if one is missing does the whole call go to the daemon
    /// ([`Client::get`], which serves what it can from the indexes again),
    /// run through `blocking`.
    pub fn get(
        &self,
        ids: &[ObjectId],
        timeout_ms: i64,
        blocking: impl Blocking,
    ) -> Result<Vec<Option<ObjectView>>> {
        if self.inner.fast.is_some() {
            let mut views = Vec::with_capacity(ids.len());
            for &id in ids {
                match self.fast_view(id) {
                    Some(view) => views.push(Some(view)),
                    None => break,
                }
            }
            if views.len() == ids.len() {
                return Ok(views);
            }
            // (Those taken are dropped here: released with no message.)
        }
        blocking.run(|| self.get_through_connection(ids, timeout_ms))
    }

    /// A read-only view of `id` through this node's index, then the
    /// owners' indexes; `None`: ask the daemon.
    #[inline]
    fn fast_view(&self, id: ObjectId) -> Option<ObjectView> {
        if let Some((location, reference)) = self.fast_reference(id) {
            let address = address_in(&self.inner.mapping, &location);
            return Some(ObjectView::new(reference, address, location, false));
        }
        // Another node's object, through its index (a cluster).
        let (view, found) = self.acquire_at_owner(&id)?;
        let address = address_in(&view.mapping, &found.location);
        let reference = self.counted_at_owner(id, &view, &found);
        Some(ObjectView::new(reference, address, found.location, false))
    }

    /// The get on the connection: [`Client::get`], then a view of each
    /// found object where this process reads it.
    fn get_through_connection(
        &self,
        ids: &[ObjectId],
        timeout_ms: i64,
    ) -> Result<Vec<Option<ObjectView>>> {
        let places = self.with(|c| {
            let found = c.get(ids, timeout_ms)?;
            // Objects on other nodes: in those nodes' regions; objects to
            // invalidate: in the simulated fabric's cache.
            found
                .into_iter()
                .map(|o| {
                    o.map(|l| {
                        let (region, address) = c.read_place(l)?;
                        Ok((l.location, region, address))
                    })
                    .transpose()
                })
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(ids
            .iter()
            .zip(places)
            .map(|(&id, place)| {
                place.map(|(location, region, address)| {
                    ObjectView::new(self.reference(id, region), address, location, false)
                })
            })
            .collect())
    }

    /// Whether `id` is in the store: the shared index first (no lock, no
    /// round trip, `blocking` not called), then the daemon through
    /// `blocking`.
    pub fn contains(&self, id: ObjectId, blocking: impl Blocking) -> Result<bool> {
        // Published in the shared index: present, no round trip.
        if self.fast_contains(&id) {
            return Ok(true);
        }
        blocking.run(|| self.with(|c| c.contains(id)))
    }

    /// Creates one object of `data_size` data bytes followed by `metadata`,
    /// on `node` (remote allocation, as [`Client::create_on`]; `None`: this
    /// client's node), and writes the metadata. Returns a writable view of
    /// the data — where this process writes it: in place, in a staging
    /// buffer, or in the simulated fabric's cache — holding the creator's
    /// reference ([`creator_reference`](Self::creator_reference)). Seal it
    /// once written.
    pub fn create(
        &self,
        id: ObjectId,
        data_size: u64,
        metadata: &[u8],
        node: Option<u32>,
        timeout_ms: u32,
    ) -> Result<ObjectView> {
        let meta_size = u32::try_from(metadata.len())
            .map_err(|_| ShoalError::invalid("metadata larger than 4 GiB"))?;
        let spec = CreateSpec {
            id,
            data_size,
            meta_size,
        };
        let (location, region, address) = self.with(|c| {
            let node = node.unwrap_or_else(|| c.node());
            let located = c.create_on(node, &[spec], timeout_ms)?[0];
            let (region, address) = c.located_region(located, true)?;
            Ok((located.location, region, address))
        })?;
        // SAFETY: the object was just allocated for us with `meta_size`
        // bytes after its data, and `address` is its first byte inside
        // `region` (bounds-checked by `located_region`), held here; nothing
        // else writes an unsealed object.
        unsafe {
            std::ptr::copy_nonoverlapping(
                metadata.as_ptr(),
                address.add(data_size as usize),
                metadata.len(),
            )
        };
        let reference = self.creator_reference(id, Some(region));
        Ok(ObjectView::new(
            reference,
            address.cast_const(),
            location,
            true,
        ))
    }

    /// Creates several objects on this client's node in one round trip,
    /// all or none (as [`Client::create_batch`]): a writable view of each,
    /// holding its creator's reference. Seal them once written.
    pub fn create_batch(&self, objects: &[CreateSpec], timeout_ms: u32) -> Result<Vec<ObjectView>> {
        let created = self.with(|c| {
            let me = c.node();
            c.create_batch(objects, timeout_ms)?
                .into_iter()
                .map(|location| Ok((location, c.located_ptr_mut(Located::local(me, location))?)))
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(objects
            .iter()
            .zip(created)
            .map(|(o, (location, address))| {
                let reference = self.creator_reference(o.id, None);
                ObjectView::new(reference, address.cast_const(), location, true)
            })
            .collect())
    }

    /// Whether this client has the fast path.
    pub fn has_fast_reads(&self) -> bool {
        self.inner.fast.is_some()
    }

    /// Whether the shared index has `id` (sealed, visible, in memory),
    /// without the connection. `false` says nothing: ask the daemon.
    pub fn fast_contains(&self, id: &ObjectId) -> bool {
        self.inner.fast.as_ref().is_some_and(|f| f.published(id))
    }

    /// The creator reference of object `id`, just created by this client and
    /// not sealed: like [`reference`](Self::reference), but [`seal`](Self::seal)
    /// with release and [`abort`](Self::abort) disarm it, since the daemon
    /// drops the creator's reference itself then.
    pub fn creator_reference(&self, id: ObjectId, region: Option<Arc<Mapping>>) -> Arc<ObjectRef> {
        let reference = self.reference(id, region);
        lock(&self.inner.creating).insert(id, Arc::downgrade(&reference));
        reference
    }

    /// Seals objects this client created. With `release` the creator's
    /// reference is dropped now, and their creator [`ObjectRef`]s will not
    /// release it again when dropped.
    pub fn seal(&self, ids: &[ObjectId], release: bool) -> Result<()> {
        self.seal_durable(ids, release, None)
    }

    /// [`seal`](Self::seal), answered once every object reached
    /// `durability` (`None`: the node's default).
    pub fn seal_durable(
        &self,
        ids: &[ObjectId],
        release: bool,
        durability: Option<crate::Durability>,
    ) -> Result<()> {
        // (A seal that reached memory but not the durability fails after
        // sealing; its creators' later releases are then ignored by the
        // daemon, harmlessly.)
        self.with(|c| c.seal_durable(ids, release, durability))?;
        self.forget_creations(ids, release);
        Ok(())
    }

    /// Aborts an object this client created; its creator [`ObjectRef`]s
    /// will not release the reference the daemon dropped with it.
    pub fn abort(&self, id: ObjectId) -> Result<()> {
        self.with(|c| c.abort(id))?;
        self.forget_creations(&[id], true);
        Ok(())
    }

    /// Sealed or aborted: stop tracking the creator references; if the
    /// daemon already dropped their reference, their drop must not release
    /// again.
    fn forget_creations(&self, ids: &[ObjectId], reference_gone: bool) {
        let mut creating = lock(&self.inner.creating);
        for id in ids {
            if let Some(reference) = creating.remove(id).and_then(|weak| weak.upgrade()) {
                if reference_gone {
                    reference.released.store(true, Ordering::Release);
                }
            }
        }
    }
}

impl Inner {
    /// Moves the queued releases onto the connection, to go out with its
    /// next request.
    fn take_queue(&self, connection: &mut Client) {
        self.releases.calls.fetch_add(1, Ordering::Relaxed);
        let ids = std::mem::take(&mut *lock(&self.releases.ids));
        if !ids.is_empty() {
            *lock(&self.releases.last_sent) = Some(Instant::now());
            self.releases.messages.fetch_add(1, Ordering::Relaxed);
            connection.release_deferred(&ids);
        }
    }

    /// Sends the queued releases now.
    fn flush(&self, connection: &mut Client) {
        self.take_queue(connection);
        // A dead connection means the daemon already dropped our references.
        let _ = connection.send_deferred();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The connection closes with us; the daemon drops what is left.
        self.releases.close();
        let thread = lock(&self.release_thread).take();
        // The release thread drops the last handle itself when every other
        // one went while it was sending: it ends on its own right after.
        if let Some(thread) = thread.filter(|t| t.thread().id() != std::thread::current().id()) {
            let _ = thread.join();
        }
    }
}

/// One store reference to an object, released (through its
/// [`SharedClient`]'s queue) when dropped.
pub struct ObjectRef {
    client: SharedClient,
    id: ObjectId,
    /// Set when the reference was already given back (seal with release,
    /// abort): dropping must then not release a reference taken later.
    released: AtomicBool,
    /// The mapping the bytes are in, for objects in another node's region
    /// (see [`SharedClient::reference`]).
    region: Option<Arc<Mapping>>,
    /// Taken through the fast path: counted at this index position, and
    /// given back there (no message).
    fast_position: Option<u32>,
    /// The table it is counted in when that is not the client's own: an
    /// owner's (`fast_peer_reference`).
    fast_table: Option<Arc<FastReads>>,
}

impl ObjectRef {
    /// The object this reference holds.
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// The peer region (or its simulated cache) this reference keeps mapped.
    pub fn region(&self) -> Option<&Arc<Mapping>> {
        self.region.as_ref()
    }

    /// Whether the daemon already dropped this reference (seal with release,
    /// abort), so dropping it sends nothing.
    pub fn released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }
}

impl Drop for ObjectRef {
    fn drop(&mut self) {
        let table = self.fast_table.as_ref().or(self.client.inner.fast.as_ref());
        match (self.fast_position, table) {
            (Some(position), Some(fast)) => fast.release(position),
            _ if !self.released() => self.client.release_later(self.id),
            _ => {}
        }
    }
}

/// Where `location` starts in `mapping`.
#[inline]
fn address_in(mapping: &Mapping, location: &ObjectLocation) -> *const u8 {
    debug_assert!(mapping.holds(location));
    // SAFETY: every location given here was checked against `mapping` by
    // the index lookup that found it (`FastReads::acquire_in`).
    unsafe { mapping.base().add(location.offset as usize) }
}

/// An object's bytes in this process, with the reference that keeps them:
/// read-only for a get, writable for a create until it is sealed. The
/// bytes stay mapped while the view (or a clone of its
/// [`reference`](Self::reference)) lives: the reference holds the mapping
/// they are in, or the client whose region it is.
///
/// A read-only view's bytes are sealed and immutable. A client that hangs
/// up ([`Client::close`]) drops its references at the daemon: its views
/// must not be read afterwards (their memory may be reused).
pub struct ObjectView {
    reference: Arc<ObjectRef>,
    /// The first data byte.
    address: *const u8,
    len: usize,
    /// Metadata bytes stored right after the data.
    meta_len: usize,
    writable: bool,
}

// SAFETY: the view only hands its address out, never reads or writes
// through it itself; the memory it points into is shared memory kept mapped
// by `reference` (Send and Sync), whichever thread holds the view.
unsafe impl Send for ObjectView {}
// SAFETY: as for Send: `&ObjectView` gives out the address and sizes only.
unsafe impl Sync for ObjectView {}

impl ObjectView {
    #[inline]
    fn new(
        reference: Arc<ObjectRef>,
        address: *const u8,
        location: ObjectLocation,
        writable: bool,
    ) -> Self {
        Self {
            reference,
            address,
            len: location.data_size as usize,
            meta_len: location.meta_size as usize,
            writable,
        }
    }

    /// The object viewed.
    #[inline]
    pub fn id(&self) -> ObjectId {
        self.reference.id()
    }

    /// The reference this view holds (released when the last clone goes).
    #[inline]
    pub fn reference(&self) -> &Arc<ObjectRef> {
        &self.reference
    }

    /// The first byte; [`len`](Self::len) bytes are readable from here
    /// while the view lives.
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.address
    }

    /// The first byte, for writing: `None` for a read-only view.
    #[inline]
    pub fn as_mut_ptr(&self) -> Option<*mut u8> {
        self.writable.then_some(self.address.cast_mut())
    }

    /// Bytes of data viewed (the metadata is [`metadata`](Self::metadata)).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the object has no data bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the bytes may be written (an object being created).
    #[inline]
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// A read-only view of the object's metadata (stored right after its
    /// data), sharing this view's reference.
    pub fn metadata(&self) -> ObjectView {
        Self {
            reference: self.reference.clone(),
            // The metadata follows the data inside the same object.
            address: self.address.wrapping_add(self.len),
            len: self.meta_len,
            meta_len: 0,
            writable: false,
        }
    }
}

/// How the part of a call that may wait for the daemon runs. The fast path
/// never calls it. A binding whose callers hold a lock of their own while
/// they call (Python's GIL) lets go of it here, and only here: a call the
/// shared indexes answer keeps it.
pub trait Blocking {
    /// Runs `call`, which may wait for the daemon, and returns its result.
    fn run<R: Send>(self, call: impl FnOnce() -> R + Send) -> R;
}

/// Runs the call on this thread, holding nothing of its own: what a Rust
/// caller passes.
pub struct OnThisThread;

impl Blocking for OnThisThread {
    fn run<R: Send>(self, call: impl FnOnce() -> R + Send) -> R {
        call()
    }
}
