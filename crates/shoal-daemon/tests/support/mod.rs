//! Real daemons on loopback for the cluster tests: a topology on free
//! ports, one daemon thread per node, every node serving before `start`
//! returns, all shut down on drop. A test file takes it with `mod support;`.

// Each test file compiles its own copy and uses a part of it.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shoal_client::Client;
use shoal_cluster::{Access, Node, Topology};
use shoal_core::coherence::CoherenceMode;
use shoal_core::error::Result;
use shoal_daemon::{ClusterConfig, DaemonConfig, Shutdown};

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
    let ports: Vec<u16> = {
        // Held together so no two nodes are given the same free port.
        let held: Vec<_> = (0..2 * nodes)
            .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap())
            .collect();
        held.iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect()
    };
    let tag = format!("{}-{}", std::process::id(), ports[0]);
    Topology {
        name: name.into(),
        token: format!("{name}-token"),
        coherence: CoherenceMode::Coherent,
        simulate_caches: false,
        heartbeat: Duration::from_millis(100),
        lease: Duration::from_secs(5),
        linger,
        nodes: (0..nodes)
            .map(|i| Node {
                id: i,
                rpc: SocketAddr::from((Ipv4Addr::LOCALHOST, ports[2 * i as usize])),
                data: SocketAddr::from((Ipv4Addr::LOCALHOST, ports[2 * i as usize + 1])),
                socket: dir.join(format!("n{i}.sock")),
                region: PathBuf::from(format!("/dev/shm/shoal-{name}-{tag}-{i}")),
                region_size,
                access: Access::Mapped,
                elastic: None,
                tiers: Default::default(),
                metrics: None,
            })
            .collect(),
    }
}

/// Waits until a daemon answers on `socket`; fails the test at `deadline`.
pub fn wait_serving(socket: &Path, deadline: Instant) {
    while Client::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(5));
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
        let dir = tempfile::tempdir().unwrap();
        let topology = loopback_topology(name, nodes, region_size, linger, dir.path());
        let shutdown = Shutdown::new();
        let threads = (0..nodes)
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
        let deadline = Instant::now() + Duration::from_secs(20);
        for socket in &sockets {
            wait_serving(socket, deadline);
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
