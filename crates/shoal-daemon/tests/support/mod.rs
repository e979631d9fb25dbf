//! Real daemons on loopback for the cluster tests: a topology on free
//! ports, one daemon thread per node, every node serving before `start`
//! returns, all shut down on drop. A test file takes it with `mod support;`.

// Each test file compiles its own copy and uses a part of it.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shoal_client::Client;
use shoal_cluster::auth::Credentials;
use shoal_cluster::node_keys::NodeKey;
use shoal_cluster::proto::peer_client::PeerClient;
use shoal_cluster::{Access, Node, NodeIdentity, Topology};
use shoal_core::coherence::CoherenceMode;
use shoal_core::error::Result;
use shoal_daemon::{ClusterConfig, DaemonConfig, Shutdown};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Daemon logs in the test's output, at warn (`SHOAL_LOG=debug` shows what
/// the daemons do). Once per process; later calls change nothing.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// `count` free loopback ports, none handed out before in this process.
///
/// The kernel may give a port released by one test to the next `bind(0)`
/// before the first test's daemon has bound it; tests run in parallel, so
/// two daemons could be handed one port. Remembering every port given out
/// closes that window within the test binary.
pub fn free_ports(count: usize) -> Vec<u16> {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap();
    // Held until all are taken, so the kernel offers a new port each time.
    let mut held = Vec::with_capacity(count);
    while held.len() < count {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        if given.insert(listener.local_addr().unwrap().port()) {
            held.push(listener);
        }
    }
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// A topology of `nodes` coherent mapped nodes of `region_size` bytes on
/// free loopback ports, sockets in `dir`, regions in /dev/shm named after
/// the cluster's `name`; heartbeats every 100 ms, leases of 5 s, loans
/// lingering for `linger`.
pub fn loopback_topology(
    name: &str,
    nodes: u32,
    region_size: u64,
    linger: Duration,
    dir: &Path,
) -> Topology {
    let ports = free_ports(2 * nodes as usize);
    let tag = format!("{}-{}", std::process::id(), ports[0]);
    Topology {
        name: name.into(),
        token: format!("{name}-token"),
        coherence: CoherenceMode::Coherent,
        simulate_caches: false,
        heartbeat: Duration::from_millis(100),
        lease: Duration::from_secs(5),
        linger,
        quarantine: None,
        nodes: (0..nodes)
            .map(|i| Node {
                id: i,
                rpc: SocketAddr::from((Ipv4Addr::LOCALHOST, ports[2 * i as usize])).into(),
                data: SocketAddr::from((Ipv4Addr::LOCALHOST, ports[2 * i as usize + 1])).into(),
                host: None,
                listen: None,
                data_listen: None,
                socket: dir.join(format!("n{i}.sock")),
                region: PathBuf::from(format!("/dev/shm/shoal-{name}-{tag}-{i}")),
                region_size,
                access: Access::Mapped,
                elastic: None,
                tiers: Default::default(),
                metrics: None,
                identity: None,
            })
            .collect(),
    }
}

/// Gives every node of `topology` a key pair of its own (per-node
/// identities), private keys in `dir/nK.key`; returns them by node.
pub fn with_node_keys(topology: &mut Topology, dir: &Path) -> Vec<NodeKey> {
    topology
        .nodes
        .iter_mut()
        .map(|node| {
            let key = NodeKey::generate().unwrap();
            let key_file = dir.join(format!("n{}.key", node.id));
            key.save(&key_file).unwrap();
            node.identity = Some(NodeIdentity {
                public_key: key.public(),
                key_file,
            });
            key
        })
        .collect()
}

/// A peer RPC client as a test playing another node holds it.
pub type PeerRpc = PeerClient<InterceptedService<Channel, Credentials>>;

/// Runs `calls` against the peer RPC at `rpc` with `credentials`, on a
/// current-thread runtime of its own (a test playing another node).
pub fn with_peer<T, F: std::future::Future<Output = T>>(
    rpc: impl std::fmt::Display,
    credentials: Credentials,
    calls: impl FnOnce(PeerRpc) -> F,
) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{rpc}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            calls(PeerClient::with_interceptor(channel, credentials)).await
        })
}

/// Waits up to 10 s for `done`; fails the test naming `what` otherwise.
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long a test waits for its daemons to serve: generous, since a
/// daemon that fails to start ends its thread and fails the test at once,
/// and CI's two cores may be busy with other test binaries' daemons.
const START_WAIT: Duration = Duration::from_secs(30);

/// Waits until the daemon of one of `threads` answers on `socket`; fails
/// the test at `deadline`, or at once with the daemon's error if one of
/// `threads` ended (a port taken, a region that would not map).
pub fn wait_started(socket: &Path, threads: &mut Vec<JoinHandle<Result<()>>>, deadline: Instant) {
    while Client::connect(socket).is_err() {
        if let Some(ended) = threads.iter().position(|t| t.is_finished()) {
            let outcome = threads.remove(ended).join();
            panic!("a daemon stopped before serving: {outcome:?}");
        }
        assert!(
            Instant::now() < deadline,
            "daemon at {} did not start",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Node 0 of a `nodes`-node cluster, started alone: the other nodes'
/// addresses have no one behind them, and a test plays them over the peer
/// RPC. Heartbeats every 100 ms, leases of `lease`; with `node_keys`, every
/// node has a key pair (`with_node_keys`).
pub struct LoneNode {
    pub topology: Topology,
    pub socket: PathBuf,
    /// Its metrics endpoint (`/metrics`).
    pub metrics: SocketAddr,
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<()>>>,
    _dir: tempfile::TempDir,
}

impl LoneNode {
    pub fn start(
        name: &str,
        nodes: u32,
        region_size: u64,
        node_keys: bool,
        lease: Duration,
    ) -> Self {
        init_logs();
        let dir = tempfile::tempdir().unwrap();
        let mut topology = loopback_topology(
            name,
            nodes,
            region_size,
            Duration::from_millis(1000),
            dir.path(),
        );
        topology.lease = lease;
        if node_keys {
            with_node_keys(&mut topology, dir.path());
        }
        let socket = topology.nodes[0].socket.clone();
        let mut config = DaemonConfig::new(&socket, region_size);
        config.prefault = false;
        let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, free_ports(1)[0]));
        config.metrics = Some(metrics);
        config.cluster = Some(ClusterConfig {
            topology: topology.clone(),
            node: 0,
        });
        let shutdown = Shutdown::new();
        let mut threads = vec![{
            let shutdown = shutdown.clone();
            std::thread::spawn(move || shoal_daemon::serve_blocking(config, shutdown))
        }];
        wait_started(&socket, &mut threads, Instant::now() + START_WAIT);
        Self {
            topology,
            socket,
            metrics,
            shutdown,
            thread: threads.pop(),
            _dir: dir,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// The value of metric `name` for `peer` (a `peer` label), as scraped
    /// from the node's `/metrics` now.
    pub fn peer_metric(&self, name: &str, peer: u32) -> Option<f64> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(self.metrics).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let peer = peer.to_string();
        shoal_daemon::metrics::exposition::parse(body)
            .into_iter()
            .find(|s| s.name == name && s.label("peer") == Some(peer.as_str()))
            .map(|s| s.value)
    }

    /// The node's references on `id` (its own clients' and its peers').
    pub fn refs(&self, id: shoal_core::ObjectId) -> Option<u32> {
        let objects = self.client().list().unwrap();
        objects.iter().find(|o| o.id == id).map(|o| o.refs)
    }
}

impl Drop for LoneNode {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap().unwrap();
        }
    }
}

pub struct TestCluster {
    pub sockets: Vec<PathBuf>,
    shutdown: Shutdown,
    threads: Vec<JoinHandle<Result<()>>>,
    /// The sockets' directory, and whatever a test's `configure` puts there.
    pub dir: tempfile::TempDir,
}

impl TestCluster {
    /// `nodes` coherent mapped nodes of `region_size` bytes each, in a
    /// cluster called `name` (it names the /dev/shm regions too), loans
    /// lingering for `linger`. `configure(node, config, dir)` adds what a
    /// test needs to a node before it starts (tiers, an elastic controller).
    pub fn start(
        name: &str,
        nodes: u32,
        region_size: u64,
        linger: Duration,
        configure: impl Fn(u32, &mut DaemonConfig, &Path),
    ) -> Self {
        Self::start_with(name, nodes, region_size, linger, |_| {}, configure)
    }

    /// [`start`](Self::start), `change` applied to the topology first (a
    /// node's `access`, say).
    pub fn start_with(
        name: &str,
        nodes: u32,
        region_size: u64,
        linger: Duration,
        change: impl FnOnce(&mut Topology),
        configure: impl Fn(u32, &mut DaemonConfig, &Path),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut topology = loopback_topology(name, nodes, region_size, linger, dir.path());
        change(&mut topology);
        let shutdown = Shutdown::new();
        let mut threads = (0..nodes)
            .map(|node| {
                let mut config =
                    DaemonConfig::new(&topology.nodes[node as usize].socket, region_size);
                config.prefault = false;
                configure(node, &mut config, dir.path());
                config.cluster = Some(ClusterConfig {
                    topology: topology.clone(),
                    node,
                });
                let shutdown = shutdown.clone();
                std::thread::spawn(move || shoal_daemon::serve_blocking(config, shutdown))
            })
            .collect();
        let sockets: Vec<PathBuf> = topology.nodes.iter().map(|n| n.socket.clone()).collect();
        let deadline = Instant::now() + START_WAIT;
        for socket in &sockets {
            wait_started(socket, &mut threads, deadline);
        }
        Self {
            sockets,
            shutdown,
            threads,
            dir,
        }
    }

    pub fn client(&self, node: usize) -> Client {
        Client::connect(&self.sockets[node]).unwrap()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.shutdown.trigger();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
