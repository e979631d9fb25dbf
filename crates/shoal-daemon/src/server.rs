//! The daemon's top: builds the node (region + store), the cluster when
//! this daemon is a node of one, and the operations they serve; listens on
//! the Unix socket; stops everything on shutdown. Nothing imports this
//! module: it only wires the layers below it.

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
use shoal_core::region::Region;
use shoal_store::eviction;
use shoal_store::store::Store;
use shoal_tiers::TierIdentity;
use tokio::net::UnixListener;

use crate::accept::AcceptBackoff;
use crate::cluster::membership::Members;
use crate::cluster::{Cluster, ClusterListener};
use crate::config::DaemonConfig;
use crate::connection;
use crate::elastic::Elastic;
use crate::node::Node;
use crate::ops::Ops;
use crate::peer_service;
use crate::principals;
use crate::shutdown::Shutdown;
use crate::supervisor::Supervisor;
use crate::tiers::Tiers;

/// The owner a single store's tiers are marked with (a cluster node's are
/// marked with its cluster's name and its node id).
const SINGLE_NODE_TIERS: &str = "single-node";

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

/// Serves until `shutdown` (or the idle exit), then stops every task and
/// returns once they are all gone.
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
    if let Some(cluster) = &config.cluster {
        cluster.topology.node(cluster.node)?;
    }
    // A region we create is rounded up to whole lines, so a capacity of any
    // byte count (Plasma's `-m 10000`) is usable in full.
    let created_size = config.region_size.next_multiple_of(config.line_size);
    let incarnation = incarnation();
    let region = match (&config.region, &config.cluster) {
        // A cluster node's region keeps its name: peers on this host map it.
        // Its file names the incarnation, so peers' clients that mapped a
        // previous incarnation's region notice the restart.
        (_, Some(c)) => {
            let node = c.topology.node(c.node)?;
            Region::create_shared(
                &node.region,
                node.region_size.next_multiple_of(config.line_size),
                incarnation,
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
    if let Some(cluster) = &config.cluster {
        // Members learned at run time are registered then (`learning.rs`).
        for node in cluster.topology.ids() {
            if node != cluster.node {
                store.register_client(principals::peer(node));
            }
        }
    }
    let coherent = config
        .cluster
        .as_ref()
        .is_none_or(|c| c.topology.coherence == CoherenceMode::Coherent);
    if config.fast_reads && coherent {
        // Without it every get takes the socket: slower, never wrong.
        let slots = shoal_core::fast_path::index::slots_for(region_size);
        if let Err(err) = store.enable_fast_reads(slots) {
            tracing::warn!(%err, "fast path not offered");
        }
    }
    let node = Node::new(store, region, config.prefault);
    let supervisor = Supervisor::new();
    crate::node::fast_reads::spawn_sweeper(&node, &supervisor);
    // Before anything is announced: a SIGTERM sent the moment the daemon says
    // it serves must stop it cleanly, not kill it (the trigger is remembered
    // until serve_clients looks).
    if config.stop_on_signals {
        watch_signals(&supervisor, &shutdown)?;
    }
    let cluster = match &config.cluster {
        Some(c) => {
            // With a membership service, every node of the file until this
            // node joins (after its peer service listens) and adopts the
            // view etcd keeps.
            let view = shoal_cluster::View::new(0, c.topology.ids())?;
            let cluster = Rc::new(Cluster::new(
                c,
                node.clone(),
                supervisor.clone(),
                incarnation,
                view,
            )?);
            node.listen(Rc::new(ClusterListener::new(Rc::downgrade(&cluster))));
            Some(cluster)
        }
        None => None,
    };
    let tiers = match config.tiers.as_ref().filter(|t| !t.is_empty()) {
        Some(tier_config) => {
            let owner = match &config.cluster {
                Some(c) => TierIdentity::new(c.topology.name.clone(), c.node),
                None => TierIdentity::new(SINGLE_NODE_TIERS, 0),
            };
            let mut tier_config = tier_config.clone();
            let adoptable: &[shoal_cluster::Node] = match &config.cluster {
                // Other nodes may adopt this one's backing store, and it theirs
                // (and those of members learned later: `adoption.rs`).
                Some(c) if c.topology.membership.is_some() => {
                    tier_config.shared_backing = true;
                    &c.topology.nodes
                }
                _ => &[],
            };
            match Tiers::start(
                &tier_config,
                &owner,
                adoptable,
                node.clone(),
                supervisor.clone(),
            )
            .await
            {
                Ok(tiers) => Some(tiers),
                Err(err) => {
                    supervisor.shutdown().await;
                    return Err(err);
                }
            }
        }
        None => None,
    };
    if let (Some(cluster), Some(_)) = (&cluster, &tiers) {
        // What the tiers recovered and this node is home for (peers restore the rest).
        cluster.restore_own();
    }
    // After the tiers: a shrink's victims go down a tier from its first step.
    let elastic = match &config.elastic {
        Some(elastic_config) => {
            let started = Elastic::start(
                elastic_config,
                node.clone(),
                cluster.clone(),
                &supervisor,
                config.prefault,
            );
            match started {
                Ok(elastic) => Some(elastic),
                Err(err) => {
                    supervisor.shutdown().await;
                    return Err(err);
                }
            }
        }
        None => None,
    };
    let ops = Ops::new(
        node.clone(),
        cluster,
        tiers,
        elastic.clone(),
        supervisor.clone(),
    );
    if let Some(elastic) = &elastic {
        let restorer: std::rc::Weak<dyn crate::elastic::Restorer> = Rc::downgrade(&ops) as _;
        elastic.attach(restorer);
    }
    crate::write_poller::spawn(&ops);

    let listener = bind_owner_only(&config.socket)?;
    tracing::info!(
        socket = %config.socket.display(),
        region = %node.region().path().display(),
        region_size,
        capacity,
        line_size = config.line_size,
        "shoal daemon serving"
    );

    let started = match crate::observe::start(&ops, config.metrics) {
        Ok(_) if ops.cluster.is_some() => peer_service::start(&ops).await,
        observed => observed.map(drop),
    };
    // A member of a membership service joins once peers can call it, and
    // before its clients may create anything.
    let (started, members) = match (started, &ops.cluster) {
        (Ok(()), Some(cluster)) => match Members::join(cluster).await {
            Ok(members) => (Ok(()), members),
            Err(err) => (Err(err), None),
        },
        (started, _) => (started, None),
    };
    if let (Ok(()), Some(cluster), Some(tiers)) = (&started, &ops.cluster, &ops.tiers) {
        crate::adoption::start(cluster, tiers, &supervisor, &shutdown);
    }
    let prefault_stop = Arc::new(AtomicBool::new(false));
    // An elastic store's controller populates the region itself, up to its
    // target and again after shrinks (elastic/populate.rs).
    let prefault = (config.prefault && elastic.is_none())
        .then(|| spawn_prefault(node.region(), prefault_stop.clone()));
    if started.is_ok() {
        serve_clients(&ops, listener, &config, &shutdown).await;
    }
    if let Some(members) = members {
        // Away, not lost: its backing store is not adopted (adoption.rs).
        if let Some(tiers) = &ops.tiers {
            tiers.mark_stopped().await;
        }
        members.leave().await;
    }
    // Clients stop answering gets from the index: theirs go to the socket,
    // which closes now.
    node.mutate(Store::close_fast_reads);
    supervisor.shutdown().await;
    prefault_stop.store(true, Ordering::Relaxed);
    if let Some(handle) = prefault {
        let _ = handle.join();
    }
    let _ = std::fs::remove_file(&config.socket);
    drop(lock);
    started?;
    tracing::info!("shoal daemon stopped");
    Ok(())
}

/// The incarnation of this daemon (of its node, in a cluster): the start
/// time in nanoseconds, so a restart always has a new one.
fn incarnation() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// Stops the daemon on SIGTERM or SIGINT (`shoal serve`).
fn watch_signals(supervisor: &Supervisor, shutdown: &Shutdown) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    // tokio's handlers only write to a self-pipe: async-signal-safe.
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| ShoalError::io("install SIGTERM handler", e))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| ShoalError::io("install SIGINT handler", e))?;
    let shutdown = shutdown.clone();
    supervisor.spawn_local("signals", async move {
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("signal received; stopping");
        shutdown.trigger();
    });
    Ok(())
}

/// A connection idle this long, holding nothing, may be closed when the
/// daemon runs out of file descriptors.
const SHED_IDLE_AFTER: Duration = Duration::from_secs(2);

/// Accepts local clients until shutdown (or the idle exit).
async fn serve_clients(
    ops: &Rc<Ops>,
    listener: UnixListener,
    config: &DaemonConfig,
    shutdown: &Shutdown,
) {
    let idle_check = config
        .idle_exit
        .map(|grace| grace.max(Duration::from_millis(10)));
    let mut ticker = tokio::time::interval(idle_check.map_or(Duration::from_secs(3600), |g| g / 4));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut backoff = AcceptBackoff::new("client socket");
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff.succeeded();
                    if let Err(err) = shoal_core::local_auth::admit_client(&stream, &config.allowed_uids) {
                        tracing::warn!(%err, "client refused");
                        continue;
                    }
                    ops.supervisor.spawn_local("client", connection::serve(ops.clone(), stream));
                }
                Err(err) => {
                    if matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                        // Make room: the connection idle the longest that
                        // holds nothing closes (the backoff's sleep lets it).
                        if let Some(client) = ops.node.shed_idle_client(SHED_IDLE_AFTER) {
                            tracing::warn!(client, "out of file descriptors: closing the longest-idle client connection");
                        }
                    }
                    backoff.failed(err).await
                }
            },
            _ = shutdown.wait() => return,
            _ = ticker.tick() => {
                if let Some(grace) = idle_check {
                    let node = &ops.node;
                    if node.connected() == 0 && node.idle_since().elapsed() >= grace {
                        tracing::info!("no clients for {grace:?}; exiting");
                        return;
                    }
                }
            }
        }
    }
}

/// Binds the client socket so that it is owner-only from the moment its path
/// exists: the socket grants access to the whole region, and a chmod after
/// bind would leave a window in which another user could connect. It is bound
/// under a private name, restricted, then renamed into place (a rename keeps
/// the socket's inode and its mode). A umask cannot do this: the embedded
/// daemon shares its process, and so its umask, with the user's code.
fn bind_owner_only(socket: &Path) -> Result<UnixListener> {
    let restrict = |path: &Path| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| ShoalError::io("restrict socket permissions", e))
    };
    let bind = |path: &Path| {
        UnixListener::bind(path).map_err(|e| ShoalError::io(&format!("bind {}", path.display()), e))
    };
    // A stale socket file from a daemon that died: we hold the lock, so it is ours to replace.
    let _ = std::fs::remove_file(socket);
    // Unique in this process too: a test harness runs several daemons in one.
    static BINDS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let bind_number = BINDS.fetch_add(1, Ordering::Relaxed);
    let private =
        socket.with_file_name(format!(".shoal-bind-{}-{bind_number}", std::process::id()));
    let _ = std::fs::remove_file(&private);
    match UnixListener::bind(&private) {
        Ok(listener) => {
            let placed = restrict(&private).and_then(|()| {
                std::fs::rename(&private, socket)
                    .map_err(|e| ShoalError::io(&format!("place {}", socket.display()), e))
            });
            if placed.is_err() {
                let _ = std::fs::remove_file(&private);
            }
            placed.map(|()| listener)
        }
        // The private name is longer than the socket's own and may not fit a
        // socket address (108 bytes) where the socket's does: the directory
        // is then the only guard for the instant before the chmod.
        Err(err) if err.kind() == std::io::ErrorKind::InvalidInput => {
            let listener = bind(socket)?;
            restrict(socket)?;
            Ok(listener)
        }
        Err(err) => Err(ShoalError::io(&format!("bind {}", private.display()), err)),
    }
}

/// Faults the region in from a helper thread so the socket is ready at once.
fn spawn_prefault(region: &Arc<Region>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let region = region.clone();
    std::thread::Builder::new()
        .name("shoal-prefault".into())
        .spawn(move || {
            let started = Instant::now();
            let done = region.prefault_in_background(|| !stop.load(Ordering::Relaxed));
            tracing::debug!(bytes = done, elapsed = ?started.elapsed(), "region prefaulted");
        })
        .expect("spawn the prefault thread")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn the_socket_appears_owner_only_and_replaces_a_stale_one() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("d.sock");
        std::fs::write(&socket, b"stale").unwrap();
        let listener = bind_owner_only(&socket).unwrap();
        assert_eq!(mode(&socket), 0o600);
        assert_eq!(
            names(dir.path()),
            ["d.sock"],
            "no private name is left behind"
        );
        let client = tokio::net::UnixStream::connect(&socket);
        let (accepted, connected) = tokio::join!(listener.accept(), client);
        accepted.unwrap();
        connected.unwrap();
    }

    #[tokio::test]
    async fn a_socket_whose_private_name_would_not_fit_is_bound_in_place() {
        let dir = tempfile::tempdir().unwrap();
        // A path of 107 bytes, the most a socket address holds: the private name
        // is longer.
        let room = 106 - dir.path().as_os_str().len() - "/x.sock".len();
        let deep = dir.path().join("d".repeat(room));
        std::fs::create_dir(&deep).unwrap();
        let socket = deep.join("x.sock");
        let _listener = bind_owner_only(&socket).unwrap();
        assert_eq!(mode(&socket), 0o600);
        assert_eq!(names(&deep), ["x.sock"]);
    }
}
