//! The listener, the region, and the state every connection shares.

use std::cell::{Cell, RefCell};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_core::coherence::CoherenceMode;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::eviction;
use shoal_core::protocol::{Located, Notification};
use shoal_core::region::Region;
use shoal_core::store::{Store, StoreEvent};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, Notify};

use crate::cluster::service::{PeerCall, PeerService};
use crate::cluster::{lending, peer_client, Cluster, ClusterRef, PEER_CLIENT_BASE};
use crate::config::DaemonConfig;
use crate::connection;
use crate::shutdown::Shutdown;

/// Notifications a subscriber may fall behind before it is disconnected, so a
/// subscriber that stops reading cannot grow the daemon's heap without bound.
pub(crate) const SUBSCRIBER_QUEUE: usize = 65_536;

/// State shared by the connections of one daemon. Single-threaded: the
/// runtime is current-thread, so `RefCell` suffices and a borrow is never held
/// across an await.
pub(crate) struct Shared {
    pub store: RefCell<Store>,
    /// Shared with the prefault thread.
    pub region: Arc<Region>,
    /// The region is (being) prefaulted, so clients may populate their mappings.
    pub resident: bool,
    /// Woken on every seal: gets waiting for objects re-check.
    pub sealed: Notify,
    /// Woken whenever memory may have become free or evictable: creates
    /// waiting on a full store retry.
    pub space: Notify,
    subscribers: RefCell<Vec<mpsc::Sender<Notification>>>,
    /// This daemon as a node of a cluster (`None`: a single store).
    pub cluster: Option<ClusterRef>,
    next_client: Cell<u32>,
    connected: Cell<usize>,
    idle_since: Cell<Instant>,
}

impl Shared {
    pub fn new_client(&self) -> u32 {
        let id = self.next_client.get();
        // Ids from PEER_CLIENT_BASE on stand for other nodes.
        let next = id.wrapping_add(1);
        self.next_client
            .set(if next == 0 || next >= PEER_CLIENT_BASE {
                1
            } else {
                next
            });
        self.connected.set(self.connected.get() + 1);
        self.store.borrow_mut().register_client(id);
        id
    }

    pub fn client_gone(&self, client: u32) {
        self.store.borrow_mut().disconnect(client);
        if let Some(cluster) = &self.cluster {
            let held = cluster.drop_client(client);
            let cluster = cluster.clone();
            tokio::task::spawn_local(async move {
                // Aborted first: the creator's references go with the objects.
                cluster.abort_creations_of(client).await;
                if !held.is_empty() {
                    cluster.release(held).await;
                }
            });
        }
        self.connected.set(self.connected.get() - 1);
        if self.connected.get() == 0 {
            self.idle_since.set(Instant::now());
        }
        self.publish();
        self.space.notify_waiters();
    }

    /// A local client's get of an object in this node's region: takes the
    /// client's reference and describes the object for it.
    ///
    /// On a non-coherent cluster, an object a client of another node wrote
    /// here (remote allocation: created by that node's `peer_client`, so
    /// sealed through `PeerCall::Seal`) may meet stale lines of its range in
    /// this node's caches, left by whatever this node read or wrote there
    /// before; the reader is told to invalidate it first. Objects written on
    /// this node need nothing: a node's caches see its own writes.
    pub fn get_local(
        &self,
        store: &mut Store,
        client: u32,
        id: &shoal_core::ObjectId,
    ) -> Option<Located> {
        let (location, creator) = store.get_with_creator(client, id)?;
        let Some(cluster) = &self.cluster else {
            return Some(Located::local(0, location));
        };
        let written_by_peer = creator >= PEER_CLIENT_BASE;
        Some(Located {
            invalidate: written_by_peer && cluster.topology.coherence == CoherenceMode::Noncoherent,
            ..Located::local(cluster.me, location)
        })
    }

    /// In a cluster, tells the homes where just-sealed objects live; done
    /// before the seal is answered, so a get on any node afterwards finds them.
    pub async fn announce_sealed(&self, ids: &[shoal_core::ObjectId]) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let (ids, locations): (Vec<_>, Vec<_>) = {
            let store = self.store.borrow();
            ids.iter()
                .filter_map(|id| store.location(id).map(|l| (*id, l)))
                .unzip()
        };
        if let Err(err) = cluster.publish(&ids, &locations).await {
            tracing::warn!(%err, "sealed, but a home node did not hear of it");
        }
    }

    pub fn subscribe(&self) -> mpsc::Receiver<Notification> {
        let (sender, receiver) = mpsc::channel(SUBSCRIBER_QUEUE);
        self.subscribers.borrow_mut().push(sender);
        receiver
    }

    /// Hands the store's events to waiters and subscribers.
    pub fn publish(&self) {
        let events = self.store.borrow_mut().take_events();
        if events.is_empty() {
            return;
        }
        let mut subscribers = self.subscribers.borrow_mut();
        let mut gone = Vec::new();
        let mut unregister = Vec::new();
        for event in events {
            let notification = match event {
                StoreEvent::Sealed {
                    id,
                    data_size,
                    meta_size,
                } => {
                    self.sealed.notify_waiters();
                    Notification::Sealed {
                        id,
                        data_size,
                        meta_size,
                    }
                }
                StoreEvent::Removed { id, deleted } => {
                    self.space.notify_waiters();
                    gone.push(id);
                    if !deleted {
                        unregister.push(id);
                    }
                    Notification::Removed { id }
                }
                StoreEvent::Aborted { id } => {
                    gone.push(id);
                    unregister.push(id);
                    continue;
                }
            };
            subscribers.retain(|s| match s.try_send(notification.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    // Dropping the sender ends the stream once the queued
                    // notifications are out: the subscriber sees EOF.
                    tracing::warn!(
                        queued = SUBSCRIBER_QUEUE,
                        "subscriber too slow, ending its subscription"
                    );
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
        }
        // Ids evicted or aborted here leave the directory (a network-mode copy is
        // not registered: unregistering it is a no-op). Deletes unregister their
        // ids themselves, after revoking loans and before they answer.
        if let Some(cluster) = &self.cluster {
            if !gone.is_empty() {
                cluster.forget_copies(&gone);
            }
            if !unregister.is_empty() {
                let cluster = cluster.clone();
                tokio::task::spawn_local(async move { cluster.unregister(&unregister).await });
            }
        }
    }
}

/// Runs a daemon on the current thread until `shutdown` is triggered (or,
/// with `idle_exit`, until it has had no client for that long).
pub fn serve_blocking(config: DaemonConfig, shutdown: Shutdown) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ShoalError::io("start the runtime", e))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, run(config, shutdown))
}

/// Holds the daemon's exclusive lock beside its socket for its lifetime, so
/// a second daemon on the same socket refuses to start instead of stealing it.
struct SocketLock {
    _file: File,
    path: PathBuf,
}

impl SocketLock {
    fn acquire(socket: &Path) -> Result<Self> {
        let path = PathBuf::from(format!("{}.lock", socket.display()));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| ShoalError::io(&format!("open lock {}", path.display()), e))?;
        // SAFETY: flock on a descriptor we own; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(ShoalError::new(
                ErrorKind::Io,
                format!("another shoal daemon is serving {}", socket.display()),
            ));
        }
        Ok(Self { _file: file, path })
    }
}

impl Drop for SocketLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn default_region_path() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    PathBuf::from(format!("/dev/shm/shoal-{}-{nanos:x}", std::process::id()))
}

pub async fn run(config: DaemonConfig, shutdown: Shutdown) -> Result<()> {
    if !config.line_size.is_power_of_two() || config.line_size < 8 {
        return Err(ShoalError::invalid(format!(
            "line size {} is not a power of two ≥ 8",
            config.line_size
        )));
    }
    let policy = eviction::by_name(&config.policy).ok_or_else(|| {
        ShoalError::invalid(format!("unknown eviction policy {:?}", config.policy))
    })?;
    shoal_core::local_auth::ensure_socket_dir(&config.socket)?;
    let lock = SocketLock::acquire(&config.socket)?;
    // A region we create is rounded up to whole lines, so a capacity of any
    // byte count (Plasma's `-m 10000`) is usable in full.
    let created_size = config.region_size.next_multiple_of(config.line_size);
    let cluster = config.cluster.as_ref().map(Cluster::new).transpose()?;
    let region = match (&config.region, &cluster) {
        // A cluster node's region keeps its name: peers on this host map it.
        // Its file names the incarnation, so peers' clients that mapped a
        // previous incarnation's region notice the restart.
        (_, Some(c)) => {
            let node = c.topology.node(c.me)?;
            Region::create_shared(
                &node.region,
                node.region_size.next_multiple_of(config.line_size),
                c.incarnation,
            )?
        }
        (None, None) => Region::create(&default_region_path(), created_size)?,
        (Some(path), None) if path.exists() => Region::open(path, config.region_size)?,
        (Some(path), None) => Region::create(path, created_size)?,
    };
    let region_size = region.len();
    let capacity = config
        .capacity
        .unwrap_or(config.region_size)
        .min(region_size);
    let mut store = Store::new(region_size, capacity, config.line_size, policy);
    if let Some(cluster) = &cluster {
        for node in 0..cluster.topology.len() as u32 {
            if node != cluster.me {
                store.register_client(peer_client(node));
            }
        }
    }

    // A stale socket file from a daemon that died: we hold the lock, so it is ours to replace.
    let _ = std::fs::remove_file(&config.socket);
    let listener = UnixListener::bind(&config.socket)
        .map_err(|e| ShoalError::io(&format!("bind {}", config.socket.display()), e))?;
    // Owner-only: the socket grants access to the whole region.
    std::fs::set_permissions(&config.socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| ShoalError::io("restrict socket permissions", e))?;

    let shared = Rc::new(Shared {
        store: RefCell::new(store),
        region: Arc::new(region),
        resident: config.prefault,
        sealed: Notify::new(),
        space: Notify::new(),
        subscribers: RefCell::new(Vec::new()),
        cluster: cluster.map(Rc::new),
        next_client: Cell::new(1),
        connected: Cell::new(0),
        idle_since: Cell::new(Instant::now()),
    });
    tracing::info!(
        socket = %config.socket.display(),
        region = %shared.region.path().display(),
        region_size,
        capacity,
        line_size = config.line_size,
        "shoal daemon serving"
    );

    let peer_server = match &shared.cluster {
        Some(cluster) => Some(start_peer_service(&shared, cluster).await?),
        None => None,
    };

    let prefault_stop = Arc::new(AtomicBool::new(false));
    let prefault = config
        .prefault
        .then(|| spawn_prefault(&shared, prefault_stop.clone()));

    let idle_check = config
        .idle_exit
        .map(|grace| grace.max(Duration::from_millis(10)));
    let mut ticker = tokio::time::interval(idle_check.map_or(Duration::from_secs(3600), |g| g / 4));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    if config.stop_on_signals {
        // tokio's handlers only write to a self-pipe: async-signal-safe.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| ShoalError::io("install SIGTERM handler", e))?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|e| ShoalError::io("install SIGINT handler", e))?;
        let shutdown = shutdown.clone();
        tokio::task::spawn_local(async move {
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            tracing::info!("signal received; stopping");
            shutdown.trigger();
        });
    }

    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let allowed = &config.allowed_uids;
                    if let Err(err) = shoal_core::local_auth::admit_client(&stream, allowed) {
                        tracing::warn!(%err, "client refused");
                        continue;
                    }
                    let shared = shared.clone();
                    tokio::task::spawn_local(connection::serve(shared, stream));
                }
                Err(err) => tracing::warn!(%err, "accept failed"),
            },
            _ = shutdown.wait() => break,
            _ = ticker.tick() => {
                if let Some(grace) = idle_check {
                    if shared.connected.get() == 0 && shared.idle_since.get().elapsed() >= grace {
                        tracing::info!("no clients for {grace:?}; exiting");
                        break;
                    }
                }
            }
        }
    }
    if let Some(stop) = peer_server {
        let _ = stop.send(());
    }
    prefault_stop.store(true, Ordering::Relaxed);
    if let Some(handle) = prefault {
        let _ = handle.join();
    }
    let _ = std::fs::remove_file(&config.socket);
    drop(lock);
    tracing::info!("shoal daemon stopped");
    Ok(())
}

/// Faults the region in from a helper thread so the socket is ready at once.
fn spawn_prefault(shared: &Shared, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let region = shared.region.clone();
    std::thread::Builder::new()
        .name("shoal-prefault".into())
        .spawn(move || {
            let started = Instant::now();
            let done = region.prefault(64 << 20, || !stop.load(Ordering::Relaxed));
            tracing::debug!(bytes = done, elapsed = ?started.elapsed(), "region prefaulted");
        })
        .expect("spawn the prefault thread")
}

/// Starts the peer gRPC server (its own tasks, fed to this thread through a
/// channel), the worker that answers peer calls from the store, and the
/// heartbeat/lease ticker. Returns the server's stop switch.
async fn start_peer_service(
    shared: &Rc<Shared>,
    cluster: &ClusterRef,
) -> Result<tokio::sync::oneshot::Sender<()>> {
    use shoal_cluster::auth::TokenCheck;
    use shoal_cluster::proto::peer_server::PeerServer;

    let node = cluster.topology.node(cluster.me)?;
    // Bound here so a busy port fails the start, not a background task.
    let listener = tokio::net::TcpListener::bind(node.rpc)
        .await
        .map_err(|e| ShoalError::io(&format!("bind peer RPC {}", node.rpc), e))?;
    let (calls, mut incoming) = mpsc::channel::<PeerCall>(1024);
    let _ = cluster.local_calls.set(calls.clone());
    let check = TokenCheck::new(&cluster.topology.token, cluster.topology.len() as u32);
    let service = tonic::service::interceptor::InterceptedService::new(
        PeerServer::new(PeerService { calls }).max_decoding_message_size(64 << 20),
        check,
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(service)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                async {
                    let _ = stopped.await;
                },
            )
            .await;
        if let Err(err) = served {
            tracing::error!(%err, "peer RPC server failed");
        }
    });
    crate::cluster::bulk::start(shared, cluster).await?;
    let worker = shared.clone();
    tokio::task::spawn_local(async move {
        while let Some(call) = incoming.recv().await {
            answer_peer(&worker, call);
        }
    });
    let ticking = shared.clone();
    let cluster = cluster.clone();
    tokio::task::spawn_local(async move {
        let mut ticker = tokio::time::interval(cluster.topology.heartbeat);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let peers: Vec<u32> = (0..cluster.topology.len() as u32)
            .filter(|&n| n != cluster.me)
            .collect();
        let in_flight: Rc<RefCell<Vec<bool>>> =
            Rc::new(RefCell::new(vec![false; cluster.topology.len()]));
        loop {
            ticker.tick().await;
            for &node in &peers {
                if std::mem::replace(&mut in_flight.borrow_mut()[node as usize], true) {
                    continue; // the previous heartbeat to it is still waiting
                }
                let (cluster, in_flight) = (cluster.clone(), in_flight.clone());
                tokio::task::spawn_local(async move {
                    cluster.heartbeat(node).await;
                    in_flight.borrow_mut()[node as usize] = false;
                });
            }
            for node in cluster.expired_leases() {
                reclaim_references_of(&ticking, node, "its lease expired");
            }
            cluster.forget_loans_of_silent_owners();
            let expired = cluster.expired_loans();
            if !expired.is_empty() {
                let cluster = cluster.clone();
                tokio::task::spawn_local(async move { cluster.release(expired).await });
            }
            cluster.rebuild_tick();
        }
    });
    tracing::info!(node = node.id, rpc = %node.rpc, nodes = cluster_size(shared), "cluster node up");
    Ok(stop)
}

fn cluster_size(shared: &Shared) -> usize {
    shared.cluster.as_ref().map_or(1, |c| c.topology.len())
}

/// Drops every reference `node` holds here (it died or restarted).
fn reclaim_references_of(shared: &Shared, node: u32, why: &str) {
    let client = peer_client(node);
    let mut store = shared.store.borrow_mut();
    store.disconnect(client);
    store.register_client(client);
    drop(store);
    tracing::warn!(node, "released the references node {node} held: {why}");
    shared.publish();
    shared.space.notify_waiters();
}

/// `from` is alive at `incarnation` (0: unknown, ignored): renews its lease;
/// if the incarnation is new, drops its references here (it restarted) and
/// lets the directory rebuild deal with it (`cluster::rebuild::heard`).
fn heard_incarnation(shared: &Rc<Shared>, from: u32, incarnation: u64) {
    if incarnation == 0 {
        return;
    }
    let cluster = shared.cluster.as_ref().expect("cluster mode");
    if cluster.heard_from(from, incarnation) {
        reclaim_references_of(shared, from, "it restarted");
    }
    crate::cluster::rebuild::heard(shared, from, incarnation);
}

/// Answers one peer call from the store (synchronously: no await while the
/// store is borrowed).
fn answer_peer(shared: &Rc<Shared>, call: PeerCall) {
    use shoal_cluster::proto::{AcquireReply, ListReply, NodeStatus, ObjectRow, Statuses};

    let cluster = shared
        .cluster
        .as_ref()
        .expect("peer calls only in cluster mode");
    match call {
        PeerCall::Heartbeat {
            from,
            incarnation,
            reply,
        } => {
            heard_incarnation(shared, from, incarnation);
            let _ = reply.send(cluster.heartbeat_reply());
        }
        PeerCall::Register {
            ids,
            owner,
            incarnation,
            reply,
        } => {
            // A restart of the owner is dealt with before it claims anything.
            heard_incarnation(shared, owner, incarnation);
            let statuses = if cluster.directory_ready() {
                cluster.directory_register(&ids, owner)
            } else {
                // Ids held elsewhere may not be restored here yet.
                let code = u32::from(ErrorKind::NodeUnavailable.code());
                Statuses {
                    codes: vec![code; ids.len()],
                }
            };
            let _ = reply.send(statuses);
        }
        PeerCall::Restore {
            from,
            incarnation,
            sealed,
            pending,
            copies,
            reply,
        } => {
            heard_incarnation(shared, from, incarnation);
            let _ = reply.send(cluster.directory_restore(from, &sealed, &pending, &copies));
        }
        PeerCall::Restored { from, incarnation } => cluster.restored_by(from, incarnation),
        PeerCall::Unregister { ids, owner } => {
            let stale = cluster.directory_unregister(&ids, owner);
            if !stale.is_empty() {
                let cluster = cluster.clone();
                tokio::task::spawn_local(async move { cluster.send_drops(stale).await });
            }
        }
        PeerCall::Cached {
            ids,
            owner,
            locations,
            from,
            reply,
        } => {
            let accepted = cluster.directory_add_checked_copies(&ids, owner, &locations, from);
            let codes = accepted
                .into_iter()
                .map(|ok| {
                    if ok {
                        0
                    } else {
                        ErrorKind::ObjectNotFound.code() as u32
                    }
                })
                .collect();
            let _ = reply.send(Statuses { codes });
        }
        PeerCall::Drop { ids } => {
            let copies = cluster.forget_copies(&ids);
            let dropped: Vec<_> = {
                let mut store = shared.store.borrow_mut();
                // Deferred while referenced, like any delete.
                copies
                    .into_iter()
                    .filter(|id| store.delete(id).is_ok())
                    .collect()
            };
            // A peer that found a copy here (its home was down) may lend it.
            let holders = lending::holders(shared, &dropped);
            shared.publish();
            let shared = shared.clone();
            tokio::task::spawn_local(async move { lending::revoke(&shared, holders).await });
        }
        PeerCall::Revoke {
            ids,
            number,
            from,
            reply,
        } => {
            let _ = reply.send(cluster.revoked(from, number, &ids));
        }
        PeerCall::GiveBack { from, reply } => {
            let _ = reply.send(cluster.give_back_idle(from));
        }
        PeerCall::Publish {
            ids,
            locations,
            owner,
            reply,
        } => {
            cluster.directory_publish(&ids, &locations, owner);
            let _ = reply.send(());
        }
        PeerCall::Lookup { ids, reply } => {
            let answer = cluster
                .local_lookup(&ids)
                .map_err(|e| tonic::Status::unavailable(e.message()));
            let _ = reply.send(answer);
        }
        PeerCall::Acquire {
            ids,
            from,
            incarnation,
            reply,
        } => {
            // References are taken for an incarnation this node has recorded:
            // a later restart of the caller then drops them.
            heard_incarnation(shared, from, incarnation);
            cluster.touch(from);
            let client = peer_client(from);
            let mut store = shared.store.borrow_mut();
            let mut entries = Vec::with_capacity(ids.len() * shoal_cluster::ids::LOCATION_RECORD);
            for id in &ids {
                shoal_cluster::ids::push_location(&mut entries, store.get(client, id));
            }
            drop(store);
            let _ = reply.send(AcquireReply {
                entries,
                incarnation: cluster.incarnation,
                revokes: cluster.revokes_sent(),
            });
        }
        PeerCall::Release { ids, from } => {
            let client = peer_client(from);
            let mut store = shared.store.borrow_mut();
            for id in &ids {
                if let Err(err) = store.release(client, id) {
                    tracing::debug!(node = from, %err, "peer release ignored");
                }
            }
            drop(store);
            shared.publish();
            shared.space.notify_waiters();
        }
        PeerCall::Delete { ids, reply } => {
            let codes: Vec<u32> = {
                let mut store = shared.store.borrow_mut();
                ids.iter()
                    .map(|id| {
                        store
                            .delete(id)
                            .err()
                            .map_or(0, |e| u32::from(e.kind().code()))
                    })
                    .collect()
            };
            let deleted: Vec<_> = ids
                .iter()
                .zip(&codes)
                .filter(|(_, &c)| c == 0)
                .map(|(id, _)| *id)
                .collect();
            let holders = lending::holders(shared, &deleted);
            shared.publish();
            // Loans revoked, then unregistered, before the answer: no get
            // sees the old object afterwards, and the id is free again at once.
            let (shared, cluster) = (shared.clone(), cluster.clone());
            tokio::task::spawn_local(async move {
                lending::revoke(&shared, holders).await;
                cluster.unregister(&deleted).await;
                let _ = reply.send(Statuses { codes });
            });
        }
        PeerCall::Allocate {
            specs,
            timeout_ms,
            from,
            incarnation,
            reply,
        } => {
            heard_incarnation(shared, from, incarnation);
            cluster.touch(from);
            let shared = shared.clone();
            tokio::task::spawn_local(async move {
                let answer = allocate_for_peer(&shared, from, &specs, timeout_ms).await;
                let _ = reply.send(answer);
            });
        }
        PeerCall::Seal {
            ids,
            release,
            from,
            reply,
        } => {
            let shared = shared.clone();
            tokio::task::spawn_local(async move {
                let result = shared
                    .store
                    .borrow_mut()
                    .seal(peer_client(from), &ids, release);
                shared.publish();
                if result.is_ok() {
                    shared.announce_sealed(&ids).await;
                }
                let _ = reply.send(outcome(result));
            });
        }
        PeerCall::Abort { ids, from, reply } => {
            let mut result = Ok(());
            {
                let mut store = shared.store.borrow_mut();
                for id in &ids {
                    if let Err(err) = store.abort(peer_client(from), id) {
                        result = Err(err);
                    }
                }
            }
            shared.publish();
            shared.space.notify_waiters();
            let _ = reply.send(outcome(result));
        }
        PeerCall::Status { reply } => {
            let stats = shared.store.borrow().stats();
            let _ = reply.send(NodeStatus {
                node: cluster.me,
                capacity: stats.capacity,
                used: stats.used,
                objects: stats.objects,
                clients: shared.connected.get() as u64,
                region_size: stats.region_size,
                rebuilding: !cluster.directory_ready(),
                loans: cluster.loans_held() as u64,
            });
        }
        PeerCall::List { reply } => {
            let objects = shared
                .store
                .borrow()
                .list()
                .into_iter()
                .map(|o| ObjectRow {
                    id: o.id.0.to_vec(),
                    data_size: o.location.data_size,
                    meta_size: o.location.meta_size,
                    sealed: o.sealed,
                    ref_count: o.refs,
                })
                .collect();
            let _ = reply.send(ListReply { objects });
        }
    }
}

fn outcome(result: Result<()>) -> shoal_cluster::proto::Outcome {
    match result {
        Ok(()) => shoal_cluster::proto::Outcome::default(),
        Err(err) => shoal_cluster::proto::Outcome {
            code: u32::from(err.kind().code()),
            message: err.message().to_owned(),
        },
    }
}

/// Remote allocation: node `from` asks this node to create objects in its
/// region for one of its clients (which then writes them through its own
/// mapping of this region). Only this node's allocator runs; the objects are
/// registered with this node as owner and held by `from` until it seals,
/// aborts or releases them (or its lease runs out).
async fn allocate_for_peer(
    shared: &Rc<Shared>,
    from: u32,
    specs: &[(shoal_core::ObjectId, u64, u32)],
    timeout_ms: u32,
) -> shoal_cluster::proto::AllocateReply {
    use shoal_cluster::proto::AllocateReply;
    let fail = |err: ShoalError| AllocateReply {
        code: u32::from(err.kind().code()),
        message: err.message().to_owned(),
        offsets: Vec::new(),
        incarnation: 0,
    };
    let cluster = shared.cluster.clone().expect("cluster mode");
    let ids: Vec<_> = specs.iter().map(|s| s.0).collect();
    if let Err(err) = cluster.register(&ids).await {
        return fail(err);
    }
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    let mut loans_asked = false;
    loop {
        let space = shared.space.notified();
        tokio::pin!(space);
        space.as_mut().enable();
        let result = shared
            .store
            .borrow_mut()
            .create_batch(peer_client(from), specs);
        shared.publish();
        match result {
            Ok(locations) => {
                return AllocateReply {
                    code: 0,
                    message: String::new(),
                    offsets: locations.iter().map(|l| l.offset).collect(),
                    incarnation: cluster.incarnation,
                }
            }
            Err(err) if err.kind() == ErrorKind::StoreFull && !loans_asked => {
                loans_asked = true;
                lending::take_back_idle(shared).await;
            }
            Err(err) if err.kind() == ErrorKind::StoreFull && Instant::now() < deadline => {
                let wait = deadline.saturating_duration_since(Instant::now());
                tokio::select! {
                    _ = space => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            Err(err) => {
                cluster.unregister(&ids).await;
                return fail(err);
            }
        }
    }
}
