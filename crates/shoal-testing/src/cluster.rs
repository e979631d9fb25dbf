//! Clusters of daemons on loopback: a topology on free ports, one daemon
//! thread per node, every node serving before `start` returns, all shut
//! down on drop; and a lone node whose peers a test plays over the RPC.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shoal_client::Client;
use shoal_cluster::auth::Credentials;
use shoal_cluster::node_keys::NodeKey;
use shoal_cluster::proto::peer_client::PeerClient;
use shoal_cluster::{Access, Node, NodeIdentity, NodeTls, TlsTrust, Topology};
use shoal_core::coherence::CoherenceMode;
use shoal_core::error::Result;
use shoal_daemon::{ClusterConfig, DaemonConfig, Shutdown};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::logs::init_logs;
use crate::ports::free_ports;
use crate::wait::{wait_started, START_WAIT};

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
        membership: None,
        tls: None,
        insecure_cleartext: false,
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
                tls: None,
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
    /// Starts node 0 of `name`'s `nodes` nodes (see the type).
    pub fn start(
        name: &str,
        nodes: u32,
        region_size: u64,
        node_keys: bool,
        lease: Duration,
    ) -> Self {
        Self::start_with(name, nodes, region_size, node_keys, lease, |_, _| {})
    }

    /// [`start`](Self::start), `change(topology, dir)` applied to the
    /// topology first (TLS material in `dir`, say).
    pub fn start_with(
        name: &str,
        nodes: u32,
        region_size: u64,
        node_keys: bool,
        lease: Duration,
        change: impl FnOnce(&mut Topology, &Path),
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
        change(&mut topology, dir.path());
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

    /// A new client of node 0.
    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// The value of metric `name` for `peer` (a `peer` label), as scraped
    /// from the node's `/metrics` now.
    pub fn peer_metric(&self, name: &str, peer: u32) -> Option<f64> {
        crate::http::metric(self.metrics, name, &[("peer", &peer.to_string())])
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
            let outcome = thread.join();
            // A test already failing says why; a second panic would abort.
            if !std::thread::panicking() {
                outcome.unwrap().unwrap();
            }
        }
    }
}

/// One node of a cluster on a thread of the test, started and stopped on
/// its own (a node that joins or leaves a running cluster); stopped
/// cleanly when dropped.
pub struct ClusterNode {
    pub socket: PathBuf,
    /// Its metrics endpoint (`/metrics` and the status page).
    pub metrics: SocketAddr,
    shutdown: Shutdown,
    thread: Option<JoinHandle<Result<()>>>,
}

impl ClusterNode {
    /// Node `node` of `topology`, serving before this returns.
    pub fn start(topology: &Topology, node: u32) -> Self {
        init_logs();
        let spec = topology.node(node).unwrap();
        let mut config = DaemonConfig::new(&spec.socket, spec.region_size);
        config.prefault = false;
        let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, free_ports(1)[0]));
        config.metrics = Some(metrics);
        config.cluster = Some(ClusterConfig {
            topology: topology.clone(),
            node,
        });
        let shutdown = Shutdown::new();
        let stop = shutdown.clone();
        let mut threads = vec![std::thread::spawn(move || {
            shoal_daemon::serve_blocking(config, stop)
        })];
        wait_started(&spec.socket, &mut threads, Instant::now() + START_WAIT);
        Self {
            socket: spec.socket.clone(),
            metrics,
            shutdown,
            thread: threads.pop(),
        }
    }

    /// A new client of this node.
    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap()
    }

    /// A metric without labels from the node's `/metrics` now.
    pub fn metric(&self, name: &str) -> Option<f64> {
        crate::http::metric(self.metrics, name, &[])
    }

    /// Stops the node cleanly and returns how its daemon ended.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown.trigger();
        self.thread.take().expect("running").join().unwrap()
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        self.shutdown.trigger();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `nodes` daemons of one cluster on loopback, each on a thread of the
/// test; all stopped when dropped.
pub struct TestCluster {
    pub sockets: Vec<PathBuf>,
    /// The cluster file the nodes run.
    pub topology: Topology,
    shutdown: Shutdown,
    threads: Vec<JoinHandle<Result<()>>>,
    /// Whether a node ending with an error fails the test (see
    /// [`checked`](Self::checked)).
    strict: bool,
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
        init_logs();
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
            topology,
            shutdown,
            threads,
            strict: false,
            dir,
        }
    }

    /// A new client of node `node`.
    pub fn client(&self, node: usize) -> Client {
        Client::connect(&self.sockets[node]).unwrap()
    }

    /// Makes a node that ends with an error at the cluster's stop fail the
    /// test (unchecked by default: fault tests leave nodes that cannot
    /// reach their peers at the end).
    pub fn checked(mut self) -> Self {
        self.strict = true;
        self
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.shutdown.trigger();
        for thread in self.threads.drain(..) {
            let outcome = thread.join();
            // A test already failing says why; a second panic would abort.
            if self.strict && !std::thread::panicking() {
                outcome.unwrap().unwrap();
            }
        }
    }
}

/// The cluster CA of a test (`with_tls`): issues node certificates, valid
/// or not, and revocation lists.
pub struct TestCa {
    /// `ca.crt`, `ca.key` and what the test issues.
    pub dir: PathBuf,
    key_pem: String,
}

fn write_private(path: &Path, contents: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut file, contents.as_bytes()).unwrap();
}

impl TestCa {
    /// A new CA in `dir` (`ca.crt`, `ca.key`).
    pub fn new(dir: &Path) -> Self {
        let pem = shoal_cluster::tls::issue::new_ca(Duration::from_secs(86_400)).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("ca.crt"), &pem.cert).unwrap();
        write_private(&dir.join("ca.key"), &pem.key);
        Self {
            dir: dir.to_owned(),
            key_pem: pem.key,
        }
    }

    /// A certificate for node `id` with `public_key`, valid over
    /// `[now + from, now + to]` (seconds), written as `<name>.crt` and
    /// `<name>.tls` in the CA's directory.
    pub fn issue(
        &self,
        name: &str,
        id: u32,
        public_key: Option<&[u8; 32]>,
        from: i64,
        to: i64,
    ) -> NodeTls {
        let at = |secs: i64| {
            let now = std::time::SystemTime::now();
            if secs >= 0 {
                now + Duration::from_secs(secs as u64)
            } else {
                now - Duration::from_secs(secs.unsigned_abs())
            }
        };
        let pem =
            shoal_cluster::tls::issue::node_cert(&self.key_pem, id, public_key, at(from), at(to))
                .unwrap();
        let tls = NodeTls {
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.tls")),
        };
        std::fs::write(&tls.cert, &pem.cert).unwrap();
        write_private(&tls.key, &pem.key);
        tls
    }

    /// Writes a revocation list revoking the certificates at `certs` to
    /// `crl` (renamed into place, as `shoal cluster revoke` does).
    pub fn revoke(&self, certs: &[&Path], crl: &Path) {
        let serials: Vec<Vec<u8>> = certs
            .iter()
            .map(|c| {
                shoal_cluster::tls::issue::serial_of(&std::fs::read_to_string(c).unwrap()).unwrap()
            })
            .collect();
        let text = shoal_cluster::tls::issue::revocation_list(
            &self.key_pem,
            &serials,
            1,
            Duration::from_secs(86_400),
        )
        .unwrap();
        let fresh = crl.with_extension("new");
        std::fs::write(&fresh, text).unwrap();
        std::fs::rename(fresh, crl).unwrap();
    }
}

/// Gives `topology` TLS: a CA in `dir/tls` and each node a certificate for
/// its id (and its key, after [`with_node_keys`]), valid for a day.
pub fn with_tls(topology: &mut Topology, dir: &Path) -> TestCa {
    let ca = TestCa::new(&dir.join("tls"));
    topology.tls = Some(TlsTrust {
        ca: ca.dir.join("ca.crt"),
        crl: None,
    });
    for node in &mut topology.nodes {
        let key = node.identity.as_ref().map(|i| i.public_key);
        node.tls = Some(ca.issue(&format!("n{}", node.id), node.id, key.as_ref(), -60, 86_400));
    }
    ca
}
