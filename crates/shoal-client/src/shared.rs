//! A [`Client`] shared between threads, and [`ObjectRef`]: one store
//! reference, released when dropped.
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

use shoal_core::error::Result;
use shoal_core::fast_path::readers::FastReads;
use shoal_core::location::ObjectLocation;
use shoal_core::protocol::Located;
use shoal_core::region::Mapping;
use shoal_core::ObjectId;

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
    peers: Arc<crate::peer_reads::PeerViews>,
    releases: Arc<ReleaseQueue>,
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
}

impl ReleaseQueue {
    /// The release thread: wakes on the first queued id, lets more gather,
    /// sends them. Ends with the client. Any request on the connection also
    /// sends the queue first, so the daemon sees a client's releases before
    /// its next request.
    fn run(self: Arc<Self>, shared: Weak<Inner>) {
        loop {
            {
                let mut ids = lock(&self.ids);
                while ids.is_empty() && !self.closed.load(Ordering::Acquire) {
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
                if ids.is_empty() {
                    return;
                }
            }
            std::thread::sleep(RELEASE_COALESCE);
            let Some(shared) = shared.upgrade() else {
                return;
            };
            // Drops from now on wake us again; ids queued before are still
            // in the queue, so the loop comes back for them.
            self.armed.store(false, Ordering::Release);
            // A busy connection is not waited for: its holder sends the
            // queue with its request, or we try again after the next
            // window (never blocking on the lock, which would cost the
            // holder a wake-up of this thread when it lets go).
            if let Ok(mut connection) = shared.connection.try_lock() {
                shared.flush(&mut connection);
            };
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
    /// if the connection is free and no release went out in the last
    /// [`RELEASE_QUIET`] (or the backlog reached [`RELEASE_BATCH`]),
    /// otherwise by the release thread or the next call, whichever is first.
    /// Never waits for the connection.
    pub fn release_later(&self, id: ObjectId) {
        let releases = &self.inner.releases;
        let backlog = {
            let mut ids = lock(&releases.ids);
            ids.push(id);
            ids.len()
        };
        let quiet = lock(&releases.last_sent).is_none_or(|t| t.elapsed() >= RELEASE_QUIET);
        if quiet || backlog >= RELEASE_BATCH || releases.closed.load(Ordering::Acquire) {
            if let Ok(mut connection) = self.inner.connection.try_lock() {
                self.inner.flush(&mut connection);
                return;
            }
        }
        if !releases.armed.swap(true, Ordering::AcqRel) {
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
        let reference = Arc::new(ObjectRef {
            client: self.clone(),
            id,
            released: AtomicBool::new(false),
            region: None,
            fast_position: Some(found.position),
            fast_table: None,
        });
        Some((found.location, reference))
    }

    /// [`fast_reference`](Self::fast_reference) for an object of another
    /// node, through that node's index (docs/fast-path.md "Gets of other
    /// nodes' objects"): where it is, and the reference, which keeps the
    /// owner's region mapped. `None`: ask the daemon (a get through
    /// [`with`](Self::with) also fetches the owners' indexes the first time).
    pub fn fast_peer_reference(&self, id: ObjectId) -> Option<(Located, Arc<ObjectRef>)> {
        if self.inner.fast.as_ref().is_none_or(|f| f.is_closed()) {
            return None;
        }
        let (view, found) = self.inner.peers.acquire(&id)?;
        let reference = Arc::new(ObjectRef {
            client: self.clone(),
            id,
            released: AtomicBool::new(false),
            region: Some(view.mapping.clone()),
            fast_position: Some(found.position),
            fast_table: Some(view.fast.clone()),
        });
        Some((view.located(&found), reference))
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
